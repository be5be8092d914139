#!/usr/bin/env bash
# The install as a user gets it: `meson install` into a temporary DESTDIR, then what is there,
# that man renders every page, that a C program outside the tree builds against the installed
# pkg-config file and runs an all-reduce under the installed dlaunch, that systemd accepts the
# unit, and that the completion completes. Usage: check.sh BUILD_DIR [SANITIZE]
set -uo pipefail
build=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
if [ "${2:-none}" != none ]; then
    echo "install check: skipped in a -Db_sanitize=$2 build (the installed library would need its runtime)"
    exit 77
fi
root=$(mktemp -d /tmp/dl-install-XXXXXX)
trap 'rm -rf "$root"' EXIT
fails=0
ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }

if ! DESTDIR="$root" meson install -C "$build" --no-rebuild --quiet >"$root.log" 2>&1; then
    cat "$root.log"; rm -f "$root.log"
    echo "FAIL: meson install"; exit 1
fi
rm -f "$root.log"
prefix=$(meson introspect "$build" --buildoptions |
    python3 -c 'import json,sys; o={x["name"]:x["value"] for x in json.load(sys.stdin)}; print(o["prefix"], o["bindir"], o["libdir"], o["mandir"], o["datadir"], o["includedir"], o["sysconfdir"])')
read -r p bindir libdir mandir datadir includedir sysconfdir <<<"$prefix"
abs() { case $1 in /*) echo "$root$1" ;; *) echo "$root$p/$1" ;; esac; }
bin=$(abs "$bindir"); lib=$(abs "$libdir"); man=$(abs "$mandir"); data=$(abs "$datadir")
inc=$(abs "$includedir"); etc=$(abs "$sysconfdir")

for f in "$bin/dlaunch" "$bin/dlaunchd" "$bin/dlaunch-train" "$inc/dlaunch/collective.h" \
    "$lib/libdlaunch-collective.so" "$lib/pkgconfig/dlaunch-collective.pc" \
    "$man/man1/dlaunch.1" "$man/man1/dlaunch-train.1" "$man/man5/dlaunch-jobspec.5" \
    "$man/man8/dlaunchd.8" "$data/bash-completion/completions/dlaunch" \
    "$data/bash-completion/completions/dlaunchd" "$data/bash-completion/completions/dlaunch-train" \
    "$root$p/lib/systemd/system/dlaunchd.service" "$etc/default/dlaunchd"; do
    [ -e "$f" ] && ok "installed ${f#"$root"}" || bad "missing ${f#"$root"}"
done

# Every page renders without a warning, and its options come from the table.
for page in man1/dlaunch.1:--max-restarts man1/dlaunch-train.1:batch_size \
    man5/dlaunch-jobspec.5:max_restarts man8/dlaunchd.8:--http; do
    file=$man/${page%%:*} want=${page#*:}
    text=$(MANWIDTH=100 man --warnings -l "$file" 2>"$root/man.err")
    if [ $? -eq 0 ] && [ ! -s "$root/man.err" ] && grep -q -- "$want" <<<"$text"; then
        ok "man -l ${page%%:*} renders ($(wc -l <<<"$text") lines, names $want)"
    else
        bad "man -l ${page%%:*}: $(cat "$root/man.err")"
    fi
done
for flag in $("$bin/dlaunch" --help | grep -o -- '--[a-z-]*' | sort -u); do
    man -l "$man/man1/dlaunch.1" 2>/dev/null | grep -q -- "$flag" || bad "dlaunch(1) lacks $flag"
done
for flag in $("$bin/dlaunchd" --help | grep -o -- '--[a-z-]*' | sort -u); do
    man -l "$man/man8/dlaunchd.8" 2>/dev/null | grep -q -- "$flag" || bad "dlaunchd(8) lacks $flag"
done

# A worker outside the tree, built with the installed pkg-config file only.
mkdir -p "$root/user"
cp "$here/worker.c" "$root/user/"
export PKG_CONFIG_PATH="$lib/pkgconfig" PKG_CONFIG_SYSROOT_DIR="$root"
flags=$(pkg-config --cflags --libs dlaunch-collective) || bad "pkg-config dlaunch-collective"
if (cd "$root/user" && cc -o worker worker.c $flags 2>&1); then
    ok "cc worker.c \$(pkg-config --cflags --libs dlaunch-collective): $flags"
    out=$(cd "$root/user" && LD_LIBRARY_PATH="$lib" timeout 120 "$bin/dlaunch" -q \
        --gpus-per-node 2 --log-dir "$root/user/logs" -- ./worker 2>&1)
    if [ $? -eq 0 ] && grep -q "sum 9 (want 9)" "$root"/user/logs/*/attempt_0/rank_1.out; then
        ok "the installed dlaunch ran the worker's all-reduce on 2 ranks"
    else
        bad "all-reduce under the installed dlaunch: $out $(cat "$root"/user/logs/*/attempt_0/rank_*.out 2>/dev/null)"
    fi
    exported=$(nm -D --defined-only "$lib/libdlaunch-collective.so" | awk '{print $3}' | grep -v '^dl_coll_' | grep -v '^DLAUNCH_COLLECTIVE_0$' || true)
    [ -z "$exported" ] && ok "the library exports dl_coll_* only" || bad "exports more than dl_coll_*: $exported"
else
    bad "the worker does not build against the installed library"
fi
unset PKG_CONFIG_PATH PKG_CONFIG_SYSROOT_DIR

# The plugins (docs/operations.md): the installed programs load the installed ones, found from
# their own path under DESTDIR (not the build tree's), and link neither libcurl nor libmicrohttpd.
for plug in dlaunch-etcd dlaunch-http; do
    f="$lib/dlaunch/$plug.so"
    [ -e "$f" ] && ok "installed ${f#"$root"}" || bad "missing ${f#"$root"}"
done
heavy=$(ldd "$bin/dlaunch" "$bin/dlaunchd" | grep -E 'libcurl|libmicrohttpd' || true)
[ -z "$heavy" ] && ok "dlaunch and dlaunchd link neither libcurl nor libmicrohttpd" || bad "$heavy"
env -u DLAUNCH_PLUGIN_DIR "$bin/dlaunchd" --listen 127.0.0.1:0 --http 127.0.0.1:0 \
    2>"$root/d.err" &
dpid=$!
for _ in $(seq 100); do grep -q 'http://' "$root/d.err" && break; sleep 0.1; done
if grep -q 'http://' "$root/d.err" &&
    grep -q "$lib/dlaunch/dlaunch-http.so" "/proc/$dpid/maps"; then
    ok "the installed dlaunchd --http serves with the installed dlaunch-http.so"
else
    bad "the installed dlaunchd --http: $(cat "$root/d.err")"
fi
kill "$dpid" 2>/dev/null; wait "$dpid" 2>/dev/null
out=$(env -u DLAUNCH_PLUGIN_DIR timeout 60 "$bin/dlaunch" status --rdzv-backend etcd \
    --endpoint 127.0.0.1:1 job 2>&1)
if grep -q 'etcd at 127.0.0.1:1' <<<"$out" && ! grep -q 'not available' <<<"$out"; then
    ok "the installed dlaunch loads dlaunch-etcd.so: $out"
else
    bad "the installed dlaunch's etcd client: $out"
fi

# systemd accepts the unit. verify checks that ExecStart's program exists, so the copy it reads
# names the one in DESTDIR; everything else is the installed file as is. Its man page is not in
# the system's man path yet, hence --man=no (man -l checked it above).
if command -v systemd-analyze >/dev/null; then
    unit="$root/verify/dlaunchd.service"
    mkdir -p "$root/verify"
    sed "s|^ExecStart=$p/|ExecStart=$root$p/|" "$root$p/lib/systemd/system/dlaunchd.service" >"$unit"
    if msg=$(systemd-analyze verify --man=no "$unit" 2>&1) && [ -z "$msg" ]; then
        ok "systemd-analyze verify dlaunchd.service"
    else
        bad "systemd-analyze verify: $msg"
    fi
else
    bad "systemd-analyze is not installed (scripts/deps.sh test)"
fi

# The completion completes flags and subcommands.
if [ -r /usr/share/bash-completion/bash_completion ]; then
    words=$(bash -c 'source /usr/share/bash-completion/bash_completion
        source "$1"
        COMP_WORDS=(dlaunch --max-re); COMP_CWORD=1; COMP_LINE="dlaunch --max-re"; COMP_POINT=${#COMP_LINE}
        _dlaunch; echo "${COMPREPLY[*]}"
        COMP_WORDS=(dlaunch sta); COMP_CWORD=1; COMP_LINE="dlaunch sta"; COMP_POINT=${#COMP_LINE}
        _dlaunch; echo "${COMPREPLY[*]}"
        COMP_WORDS=(dlaunchd --ht); COMP_CWORD=1; COMP_LINE="dlaunchd --ht"; COMP_POINT=${#COMP_LINE}
        _dlaunchd; echo "${COMPREPLY[*]}"' _ "$data/bash-completion/completions/dlaunch" 2>&1)
    if [ "$words" = $'--max-restarts\nstatus\n--http' ]; then
        ok "bash completion: --max-re -> --max-restarts, sta -> status, dlaunchd --ht -> --http"
    else
        bad "bash completion gave: $words"
    fi
else
    bad "bash-completion is not installed (scripts/deps.sh test)"
fi

echo "install check: $fails failed"
[ "$fails" -eq 0 ]
