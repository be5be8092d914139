#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds twice (plain, and ASan+UBSan with
# warnings as errors), runs unit and integration tests in both, and ends with one line
# "N passed, N failed".
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

scripts/deps.sh all

setup() { # dir, extra meson options...
    local dir=$1; shift
    if [ -f "$dir/build.ninja" ]; then
        meson setup --reconfigure "$dir" "$@" >/dev/null
    else
        meson setup "$dir" "$@" >/dev/null
    fi
    ninja -C "$dir"
}

setup build-test -Dbuildtype=debugoptimized -Dtests=true
setup build-asan -Dbuildtype=debug -Db_sanitize=address,undefined -Dwerror=true -Dtests=true -Dbench=false

export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0

status=0
meson test -C build-test --suite unit --suite integration --print-errorlogs || status=1
meson test -C build-asan --suite unit --suite integration --print-errorlogs || status=1

# One closing line over both builds, read from meson's own records.
python3 - "$root/build-test/meson-logs/testlog.json" "$root/build-asan/meson-logs/testlog.json" <<'PY'
import json, sys
ok = bad = skipped = 0
for path in sys.argv[1:]:
    for line in open(path):
        r = json.loads(line)["result"]
        if r in ("OK", "EXPECTEDFAIL"):
            ok += 1
        elif r == "SKIP":
            skipped += 1
        else:
            bad += 1
print(f"{ok} passed, {bad} failed, {skipped} skipped")
PY
exit $status
