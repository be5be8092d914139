#!/usr/bin/env bash
# The main job: installs what is missing, builds, and runs the bundled trainer on Fashion-MNIST with 2 workers on
# this machine (embedded rendezvous, nothing else to start).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh build
[ -f build/build.ninja ] || meson setup build -Dbuildtype=release >/dev/null
ninja -C build >/dev/null
exec build/cmd/dlaunch "${@:-examples/train.yaml}"
