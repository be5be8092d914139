#!/usr/bin/env bash
# Installs the Debian packages dlaunch needs to build, test and run, if any are missing.
# Usage: scripts/deps.sh [build|test|all]   (default all)
set -euo pipefail

build_pkgs=(gcc pkg-config meson ninja-build libuv1-dev libyaml-dev libjansson-dev check libmicrohttpd-dev scdoc
            zlib1g-dev libssl-dev libopenblas-dev dataset-fashion-mnist python3 libcurl4-openssl-dev)
test_pkgs=(openmpi-bin libopenmpi-dev mpich python3-torch procps iproute2 clang libclang-rt-14-dev
           clang-format prometheus chromium fonts-dejavu-core man-db systemd bash-completion
           nftables slurm-wlm slurm-client munge etcd-server etcd-client openssl strace)

want=("${build_pkgs[@]}")
case "${1:-all}" in
build) ;;
test | all) want+=("${test_pkgs[@]}") ;;
*) echo "usage: $0 [build|test|all]" >&2; exit 2 ;;
esac

missing=()
for p in "${want[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "deps: installing ${missing[*]}" >&2
sudo=()
[ "$(id -u)" -eq 0 ] || sudo=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get -o DPkg::Lock::Timeout=600 update -qq
"${sudo[@]}" apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
