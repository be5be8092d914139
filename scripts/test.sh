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

export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0

# Three passes run side by side, each with its own log (meson-logs/<logbase>.json) and its lines
# prefixed with its name: the side pass (the Slurm suite, and beside it the lockstep suite,
# test_scale.py's trainings, then the side suite), the plain build's tests and the sanitizer
# build's.
# Most of the suite's time is waiting (Slurm's scheduler, etcd's elections, failure detection,
# workers' start-up), not computing, so one pass's waits are another's CPU time: the plain pass
# runs one test per core, and so does the sanitizer pass (its tests take about twice as long, and
# one at a time it ran alone for ten minutes after the plain pass ended). More at once (1.5 per
# core in the plain pass) failed timing-bound tests on a loaded 2-core machine.
# DLAUNCH_TEST_JOBS and DLAUNCH_TEST_ASAN_JOBS set those two numbers (tests at a time) instead.
cores=$(nproc)
plain_jobs=${DLAUNCH_TEST_JOBS:-$cores}
asan_jobs=${DLAUNCH_TEST_ASAN_JOBS:-$cores}
rm -f build-test/meson-logs/side.json build-test/meson-logs/testlog.json \
    build-asan/meson-logs/testlog.json
pids=()
pass() { # name, meson test arguments...
    local name=$1; shift
    { meson test --no-rebuild --print-errorlogs "$@" 2>&1 | sed -u "s/^/[$name] /"
      exit "${PIPESTATUS[0]}"; } &
    pids+=($!)
}

status=0
# A real Slurm cluster on this machine (slurmctld, munge, slurmd nodes in network namespaces,
# or on loopback where namespaces are not allowed), for the Slurm tests; stopped on the way out.
if [ "$(id -u)" -eq 0 ]; then
    trap 'tests/slurm/cluster-stop.sh >/dev/null 2>&1 || true' EXIT
    if start_out=$(tests/slurm/cluster-start.sh 2>&1); then
        export SLURM_CONF=/run/dlaunch-slurm/slurm.conf
        echo "test: $(printf '%s\n' "$start_out" | grep 'nodes idle' | tail -n 1)"
    else
        printf '%s\n' "$start_out" | tail -n 20 >&2
        echo "test: the Slurm cluster did not start" >&2
        status=1
    fi
else
    echo "test: not root: the Slurm tests will be skipped" >&2
fi
# The lockstep suite's ranks wait for each other far more than they compute on a busy machine
# (test_scale.py: 5 trainings, 6 minutes under load, a fraction of it on the CPU): beside the
# Slurm suite, which waits on its scheduler, it leaves the plain pass's slots to the tests that
# compute. Both start at once (priorities 58 and 50). After it, in the slot the Slurm suite
# leaves free for five more minutes, the side suite: plain-build suites the plain pass, the
# longest of the three, does without (netns, which mostly waits out partitions and failure
# detection, then torchrun_compare and torch_store; tests/integration/meson.build).
pass side -C build-test --suite slurm --suite lockstep --suite side --logbase side \
    --num-processes 2

# The sanitizer build compiles beside the side pass alone: its pass is about as long as the
# plain one, so it starts as soon as it can.
if setup build-asan -Dbuildtype=debug -Db_sanitize=address,undefined -Dwerror=true \
        -Dtests=true -Dbench=false; then
    # Everything but the slow suites, which exercise the same code paths.
    # DLAUNCH_TEST_SANITIZER: tests with a matrix of timing cases (test_recovery.py) run a
    # subset there, each code path once; the plain build runs them all.
    DLAUNCH_TEST_SANITIZER=1 pass asan -C build-asan --suite unit --suite integration \
        --no-suite slow --num-processes "$asan_jobs"
else
    echo "test: the sanitizer build failed" >&2
    status=1
fi
pass test -C build-test --suite unit --suite integration --no-suite slurm --no-suite lockstep \
    --no-suite side --num-processes "$plain_jobs"
for pid in "${pids[@]}"; do
    wait "$pid" || status=1
done

# One closing line over both builds, read from meson's own records.
python3 - "$root/build-test/meson-logs/side.json" "$root/build-test/meson-logs/testlog.json" \
    "$root/build-asan/meson-logs/testlog.json" <<'PY'
import json, sys
ok = bad = skipped = 0
walls = []
failed = []
for name, path in zip(("side", "test", "asan"), sys.argv[1:]):
    try:
        records = [json.loads(line) for line in open(path)]
    except FileNotFoundError:  # a pass that never ran (its build failed): counted above
        continue
    for r in records:
        if r["result"] in ("OK", "EXPECTEDFAIL"):
            ok += 1
        elif r["result"] == "SKIP":
            skipped += 1
        else:
            bad += 1
            failed.append((name, r))
    if records:
        start = min(r["starttime"] for r in records)
        end = max(r["starttime"] + r["duration"] for r in records)
        walls.append(f"{name} {end - start:.0f} s")
# Why each failure failed, once more at the end: a CI log is often read from its tail, and the
# errors meson printed as the tests ended are far above it. Python's unittest failures are the
# blocks from "FAIL:"/"ERROR:" on; anything else shows its last lines.
for name, r in failed:
    text = (r.get("stdout") or "") + (r.get("stderr") or "")
    lines = text.splitlines()
    starts = [i for i, l in enumerate(lines) if l.startswith(("FAIL: ", "ERROR: "))]
    shown = []
    for i in starts[:3]:
        shown += lines[i:i + 30] + ["..."]
    if not shown:
        shown = lines[-40:]
    print(f"test: [{name}] {r['name']} {r['result']}, why:")
    for l in shown[:100]:
        print(f"test:   {l[:300]}")
# Each pass's own wall time, so that a log says which one the suite waited for.
print("test: passes " + ", ".join(walls))
print(f"{ok} passed, {bad} failed, {skipped} skipped")
PY
exit $status
