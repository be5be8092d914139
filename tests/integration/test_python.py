"""The dlaunch Python package (docs/python.md) with Debian's python3-torch (CPU, gloo), a real DDP
job and the real dlaunch: a rank asleep before a backward pass is named, with --health-timeout,
as the rank that never entered its gradient bucket's all-reduce (the right number), with its
Python stack line; a rank slowed for real is named a straggler and an even run names nobody; the
beats drive `dlaunch status --ranks`; the recorder file reads back in the documented layout; the
package imports without an install, and without dlaunch watch() changes nothing. Skipped where
python3-torch is not installed."""
import functools
import json
import os
import re
import subprocess
import time
import unittest

import dltest
import test_diag

TORCH_PYTHON = "/usr/bin/python3"
HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "torchrun", "ddp_watch.py")
PACKAGE = os.path.join(os.path.dirname(os.path.dirname(HERE)), "python")


# Once a process: each look imports torch (about 2 s of CPU), and every class asks.
@functools.cache
def have_torch():
    try:
        return subprocess.run([TORCH_PYTHON, "-c", "import torch.distributed"],
                              capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def line_of(text):
    """The line number of the script's line that holds text."""
    with open(SCRIPT) as f:
        for i, line in enumerate(f, 1):
            if text in line:
                return i
    raise AssertionError(f"{text!r} not in {SCRIPT}")


class Formats(dltest.Case):
    """The package's writers against the documented formats, read independently."""

    def test_the_recorder_reads_back_in_the_documented_layout(self):
        import sys
        sys.path.insert(0, PACKAGE)
        from dlaunch.recorder import Recorder, ALL_REDUCE, BROADCAST, SEND
        path = os.path.join(self.dir, "rank_3.rec")
        r = Recorder(path, 3, 4, "gloo")
        for i in range(70):  # past the ring's 64 entries
            seq = r.start(ALL_REDUCE, 4096)
            r.end(seq, ok=i != 68)
        b = r.start(BROADCAST, 8, root=2)
        s = r.start(SEND, 16)
        r.end(b)
        entries = test_diag.read_recorder(path)
        self.assertEqual(len(entries), 64)
        self.assertEqual(entries[-3:], [(70, "all-reduce", "done", 4096),
                                        (71, "broadcast", "done", 8), (72, "send", "running", 16)])
        self.assertEqual(entries[-4], (69, "all-reduce", "failed", 4096))
        self.assertEqual(s, 72)
        with self.assertRaises(OSError):  # one writer a file
            Recorder(path, 3, 4, "gloo")

    def test_beats_are_lines_the_agent_reads(self):
        import sys
        sys.path.insert(0, PACKAGE)
        from dlaunch.beat import Beats
        rd, wr = os.pipe()
        b = Beats(wr)
        b.add(0.003, 0.001, 32, now=100.0)         # the first line goes at once
        b.add(0.005, 0.001, 32, now=100.05)        # within 0.1 s: summed into the next
        b.add(0.007, 0.003, 32, now=100.2)
        os.close(wr)
        with os.fdopen(rd) as f:
            lines = f.read().splitlines()
        self.assertEqual(lines, ["step=1 steps=1 compute_ms=3.0000 wait_ms=1.0000 samples=32",
                                 "step=3 steps=2 compute_ms=6.0000 wait_ms=2.0000 samples=32"])


# A rank that beats for half a second, then takes three to exit, as torch's teardown can on a
# loaded machine: the atexit hook registered before the import runs after the package's own.
SLOW_EXIT = """
import atexit, sys, time
atexit.register(time.sleep, 3)
sys.path.insert(0, sys.argv[1])
from dlaunch.beat import Beats
b = Beats.from_env()
for _ in range(10):
    b.add(0.05, 0.0, 1, force=True)
    time.sleep(0.05)
print("done", flush=True)
"""


class SlowExit(dltest.Case):
    """A rank that has said it will beat no more (its pipe closed) is not hung while it exits,
    however long that takes; until then its silence counts (docs/diagnostics.md)."""

    def run_slow_exit(self, *worker):
        return self.dlaunch("--run-id", "job", "--events", self.events_path, "--nproc-per-node",
                            "1", "--health-timeout", "1", "--max-restarts", "0", "--", *worker,
                            timeout=60)

    def test_a_python_rank_slow_to_exit_after_its_last_beat_is_not_killed(self):
        p = self.run_slow_exit(TORCH_PYTHON, "-c", SLOW_EXIT, PACKAGE)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertNotIn("worker_hung", [e["event"] for e in self.events()])

    def test_a_rank_that_closed_its_pipe_is_not_watched_but_one_silent_is(self):
        beat_then = 'for i in 1 2 3 4 5; do printf "step=$i\\n" >&3; sleep 0.1; done; '
        p = self.run_slow_exit("sh", "-c", beat_then + "exec 3>&-; sleep 3")
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        p = self.run_slow_exit("sh", "-c", beat_then + "sleep 3")
        self.assertNotEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("worker_hung", [e["event"] for e in self.events()])


@unittest.skipUnless(have_torch(), "python3-torch is not installed")
class Python(dltest.Case):
    def run_job(self, *args, timeout=240):
        return self.dlaunch("--run-id", "job", "--events", self.events_path, *args, "--",
                            TORCH_PYTHON, SCRIPT, *self.script_args, timeout=timeout)

    def recorded(self, rank):
        """Rank rank's flight recorder, read back with the documented layout (test_diag's
        reader)."""
        return test_diag.read_recorder(os.path.join(self.dir, "dlaunch_logs", "job", "attempt_0",
                                                    f"rank_{rank}.rec"))

    def test_a_rank_asleep_before_backward_is_named_with_its_bucket_and_stack(self):
        hang_at = 12
        self.script_args = ["100000", f"hang_at={hang_at}"]
        p = self.run_job("--nproc-per-node", "2", "--health-timeout", "5", "--max-restarts", "0")
        out = p.stdout + p.stderr
        self.assertEqual(p.returncode, 1, out)
        # The all_reduce before the loop is #1, step k's one bucket #k+1.
        n = hang_at + 1
        self.assertRegex(out, rf"rank 1 never entered all-reduce #{n} \(its last: all-reduce "
                              rf"#{n - 1}, done [0-9.]+ s ago.*\); rank 0 has waited in it for "
                              r"[0-9.]+ s")
        sleep_line = line_of("time.sleep(3600)")
        self.assertIn(f"rank 1's Python stack, innermost first: ddp_watch.py:{sleep_line} main",
                      out)
        # The summary quotes it too, and the event carries it.
        self.assertRegex(out, rf"where the ranks were: rank 1 never entered all-reduce #{n}"
                              rf".*; rank 1 is at ddp_watch.py:{sleep_line} main")
        hung = [e for e in self.events() if e["event"] == "worker_hung"]
        self.assertEqual([e["rank"] for e in hung], [1], hung)
        self.assertIn(f"ddp_watch.py:{sleep_line} main", hung[0]["diagnosis"])
        rec = self.recorded(0)
        self.assertEqual(rec[0][:3], (1, "all-reduce", "done"))
        # Running when the account was made; failed once rank 1 was killed under it.
        self.assertIn(rec[-1][:3], [(n, "all-reduce", "running"), (n, "all-reduce", "failed")])
        self.assertTrue(all(r[2] == "done" for r in rec[:-1]), rec)

    def test_several_buckets_a_step_are_recorded_done_with_ddps_own_bits(self):
        # 2 KB buckets: the 38 KB model makes several a step once DDP rebuilds them (step 2);
        # the hook's futures of all but the last bucket are completed by the last one's hook.
        steps = 20
        self.script_args = [str(steps), "bucket_kb=2"]
        p = self.run_job("--nproc-per-node", "2")
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("same bits as DDP's own all-reduce: True", p.stdout)
        recs = [self.recorded(r) for r in (0, 1)]
        self.assertEqual([e[:3] for e in recs[0]], [e[:3] for e in recs[1]])
        first = int(re.search(r"buckets at first: (\d+)", p.stdout).group(1))
        then = int(re.search(r"buckets a step: (\d+)", p.stdout).group(1))
        self.assertGreaterEqual(then, 2)
        # #1 is the all_reduce before the loop; then step 1's buckets (DDP's first layout) and
        # each later step's (the layout DDP makes in step 2), each recorded once.
        self.assertEqual(recs[0][-1][0], 1 + first + then * (steps - 1), recs[0])
        # Every bucket is recorded done once its step is over, not left running.
        self.assertTrue(all(e[1:3] == ("all-reduce", "done") for e in recs[0]), recs[0])

    def test_a_users_own_comm_hook_stays_and_the_buckets_are_still_recorded(self):
        # The user's fp16 compression hook, registered before watch(), does the all-reduce;
        # the recorder still has every step's bucket, done, the same on both ranks.
        steps = 8
        self.script_args = [str(steps), "comm_hook=fp16"]
        p = self.run_job("--nproc-per-node", "2")
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertNotIn("not recorded", p.stderr)
        recs = [self.recorded(r) for r in (0, 1)]
        self.assertEqual(recs[0], recs[1])
        self.assertEqual([e[:3] for e in recs[0]],
                         [(n, "all-reduce", "done") for n in range(1, steps + 2)])
        grads = 4 * (64 * 128 + 128 + 128 * 10 + 10)  # the model's gradients, in bytes
        self.assertEqual([e[3] for e in recs[0]], [16] + [grads] * steps)

    def test_a_parameter_unused_in_some_steps_leaves_no_bucket_unrecorded(self):
        # A second head unused every third step (find_unused_parameters=True): its bucket
        # starts without a gradient hook run those steps, which sends the watch from hooking
        # one parameter a bucket back to counting every parameter; every step's buckets are
        # still recorded once, done, the same on both ranks.
        steps = 12
        self.script_args = [str(steps), "unused_every=3"]
        p = self.run_job("--nproc-per-node", "2")
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        buckets = int(re.search(r"buckets at first: (\d+)", p.stdout).group(1))
        self.assertGreaterEqual(buckets, 2)
        recs = [self.recorded(r) for r in (0, 1)]
        self.assertEqual(recs[0], recs[1])
        self.assertEqual([e[:3] for e in recs[0]][-10:],
                         [(n, "all-reduce", "done") for n in
                          range(1 + buckets * steps - 9, 2 + buckets * steps)])

    def test_steps_under_no_sync_record_no_bucket(self):
        # Gradients accumulated over 3 steps under DDP's no_sync(): only steps 3, 6 and 9
        # all-reduce, so the recorder holds #1 (the loop's own all_reduce) and three buckets.
        self.script_args = ["9", "accumulate=3"]
        p = self.run_job("--nproc-per-node", "2")
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        for r in (0, 1):
            self.assertEqual([e[:3] for e in self.recorded(r)],
                             [(n, "all-reduce", "done") for n in range(1, 5)])

    def stragglers(self):
        return [e for e in self.events() if e["event"] == "straggler"]

    # Both runs must exit: a watched rank whose run ended could hang in gloo's process-group
    # destructor (docs/python.md, "Exit"), and these runs hit it often.
    # 1500 steps: 600 (six windows of the rule, --straggler-window 100, two in a row name a
    # rank) named the slowed rank at step ~260 on a quiet machine but nobody in a whole run
    # of CI's three passes side by side.
    STRAGGLER_STEPS = "1500"

    def test_a_slowed_rank_is_named_and_an_even_run_names_nobody(self):
        # +100%: two ranks on a shared 2-core machine (docs/diagnostics.md); the slow rank does
        # 40 extra forward passes of 256 samples a step, many times a step's work.
        opts = ("--nproc-per-node", "2", "--straggler-threshold", "1.0")
        self.script_args = [self.STRAGGLER_STEPS]
        p = self.run_job(*opts)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn(f"done {self.STRAGGLER_STEPS} steps", p.stdout)
        self.assertEqual(self.stragglers(), [], p.stderr)
        os.remove(self.events_path)
        self.script_args = [self.STRAGGLER_STEPS, "slow_rank=1"]
        p = self.run_job(*opts)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        s = self.stragglers()
        self.assertEqual([e["rank"] for e in s], [1], p.stderr)
        self.assertGreater(s[0]["slower_pct"], 100)
        self.assertRegex(p.stderr, r"straggler: rank 1 on node 0 \(.*\) computes [0-9.]+ ms a "
                                   r"step against the median [0-9.]+ ms")

    def test_beats_drive_status_ranks(self):
        cluster = dltest.Cluster(self)
        endpoint = cluster.endpoint
        procs = [cluster.agent("--nproc-per-node", "1", "--heartbeat", "0.3", "--node-rank",
                               str(i), "--", TORCH_PYTHON, SCRIPT, "100000", name=f"n{i}",
                               nodes=2) for i in range(2)]
        try:
            deadline = time.monotonic() + 120
            text = ""
            while time.monotonic() < deadline:
                text = subprocess.run([dltest.DLAUNCH, "status", "--ranks", "--endpoint",
                                       endpoint, "job"], capture_output=True, text=True,
                                      timeout=30).stdout
                steps = re.findall(r"rank (\d)\s.*step (\d+) compute ([0-9.]+) ms", text)
                if len(steps) == 2 and all(int(s) > 50 for _, s, _ in steps):
                    break
                time.sleep(0.5)
            self.assertEqual(sorted(r for r, _, _ in steps), ["0", "1"],
                             text + "\n" + cluster.logs())
            self.assertTrue(all(int(s) > 50 and float(c) > 0 for _, s, c in steps), text)
        finally:
            for p in procs:
                p.terminate()
            cluster.wait_all(timeout=60)

    def test_the_package_imports_without_an_install_and_does_nothing_outside_dlaunch(self):
        env = {k: v for k, v in os.environ.items() if not k.startswith("DLAUNCH_")}
        env["PYTHONPATH"] = PACKAGE
        p = subprocess.run([TORCH_PYTHON, "-c",
                            "import torch.distributed as d, dlaunch.torch as t; "
                            "f = d.all_reduce; print(t.watch(), d.all_reduce is f)"],
                           env=env, capture_output=True, text=True, timeout=120)
        self.assertEqual(p.stdout.strip(), "None True", p.stderr)


if __name__ == "__main__":
    dltest.main()
