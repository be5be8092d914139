"""A cluster's life: a scheduler's warning passed on to the workers, a worker killed by the OOM
killer named as such, a worker that cannot be reaped given up on, and a failure that repeats on
every attempt ending the job early. The cgroup cases make real (v1 or v2) cgroups and need
root."""
import os
import shutil
import signal
import subprocess
import sys
import time
import unittest

import dltest

# Saves on SIGUSR1 (as a Lightning or submitit job does before a preemption) and exits 0; a
# second run finds the checkpoint and resumes from it, as a requeued job would.
SAVER = r'''
import os, signal, sys, time
ckpt = f"ckpt_{os.environ['RANK']}"
start = int(open(ckpt).read()) if os.path.exists(ckpt) else 0
print(f"rank {os.environ['RANK']} starts at step {start}", flush=True)
step = start
def save(sig, frame):
    open(ckpt, "w").write(str(step))
    print(f"rank {os.environ['RANK']} saved step {step} on {signal.Signals(sig).name}", flush=True)
    sys.exit(0)
signal.signal(signal.SIGUSR1, save)
open(f"ready_{os.environ['RANK']}", "w").close()
while step < 10**9:
    step += 1
    time.sleep(0.01)
    if start > 0 and step >= start + 5:
        sys.exit(0)
'''


def cgroup_root(controller):
    """Where this machine mounts a v1 controller (or the v2 tree), or None."""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, right = line.split(" - ", 1)
            fstype, _, opts = right.split()[:3]
            mount = left.split()[4]
            if fstype == "cgroup" and controller in opts.split(","):
                return mount, 1
            if fstype == "cgroup2":
                v2 = mount
    return (v2, 2) if "v2" in dir() else (None, 0)


class Cgroup:
    """A cgroup of the test's own, removed afterwards (its processes killed first)."""

    def __init__(self, controller, name):
        self.mount, self.version = cgroup_root(controller)
        if self.mount is None:
            raise unittest.SkipTest(f"no {controller} cgroup here")
        self.path = os.path.join(self.mount, name)
        os.makedirs(self.path, exist_ok=True)

    def write(self, name, value):
        with open(os.path.join(self.path, name), "w") as f:
            f.write(str(value))

    def run_inside(self):
        """A preexec_fn that moves the child into this cgroup before it runs dlaunch."""
        procs = os.path.join(self.path, "cgroup.procs")
        return lambda: open(procs, "w").write(str(os.getpid()))

    def remove(self):
        for _ in range(50):
            try:
                with open(os.path.join(self.path, "cgroup.procs")) as f:
                    pids = [int(x) for x in f.read().split()]
            except FileNotFoundError:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                os.rmdir(self.path)
                return
            except OSError:
                time.sleep(0.1)


@unittest.skipUnless(os.geteuid() == 0, "cgroups need root")
class Lifecycle(dltest.Case):
    def cgroup(self, controller):
        cg = Cgroup(controller, f"dltest-{controller}-{os.getpid()}")
        self.addCleanup(cg.remove)
        return cg

    def test_usr1_reaches_every_worker_the_job_goes_on_and_resumes_when_run_again(self):
        script = self.write("saver.py", SAVER)
        p = self.start("--nproc-per-node", "2", "--forward-signals", "SIGUSR1", "--events",
                       self.events_path, "--", sys.executable, script)
        deadline = time.monotonic() + 30
        while not all(os.path.exists(os.path.join(self.dir, f"ready_{r}")) for r in (0, 1)):
            self.assertLess(time.monotonic(), deadline, "the workers did not start")
            time.sleep(0.05)
        time.sleep(0.3)
        p.send_signal(signal.SIGUSR1)
        out, err = p.communicate(timeout=30)
        # Each worker saved and exited 0: a success, not a stop (exit 138).
        self.assertEqual(p.returncode, 0, err)
        for r in (0, 1):
            self.assertIn(f"rank {r} saved step", out)
            self.assertGreater(int(self.read(f"ckpt_{r}")), 0)
        self.assertIn("got SIGUSR1: passed on to 2 workers; the job goes on", err)
        self.assertNotIn("where this node's ranks are", err)
        sig = [e for e in self.events() if e["event"] == "signal"]
        self.assertEqual(sig, [{**sig[0], "signal": "SIGUSR1", "forwarded": True,
                                "workers": 2}])
        self.assertEqual(self.events()[-1]["status"], "succeeded")
        # The requeued job: the same command resumes each rank from its checkpoint.
        saved = [int(self.read(f"ckpt_{r}")) for r in (0, 1)]
        p = self.dlaunch("--nproc-per-node", "2", "--", sys.executable, script, check_code=0)
        for r in (0, 1):
            self.assertIn(f"rank {r} starts at step {saved[r]}", p.stdout)

    def test_without_forwarding_usr1_still_reports_and_never_stops(self):
        p = self.start("--nproc-per-node", "1", "--", "sleep", "2")
        time.sleep(0.8)
        p.send_signal(signal.SIGUSR1)
        out, err = p.communicate(timeout=20)
        self.assertEqual(p.returncode, 0, err)
        self.assertIn("SIGUSR1: where this node's ranks are", err)

    def test_a_worker_killed_by_the_oom_killer_is_named_with_figures(self):
        cg = self.cgroup("memory")
        limit = 160 << 20
        cg.write("memory.limit_in_bytes" if cg.version == 1 else "memory.max", limit)
        if cg.version == 1 and os.path.exists(os.path.join(cg.path,
                                                           "memory.memsw.limit_in_bytes")):
            cg.write("memory.memsw.limit_in_bytes", limit)
        hog = self.write("hog.py", "a = []\n"
                                   "while True:\n"
                                   "    a.append(bytearray(b'x' * (8 << 20)))\n")
        env = dict(os.environ)
        p = subprocess.run([dltest.DLAUNCH, "--nproc-per-node", "1", "--events",
                            self.events_path, "--", sys.executable, hog], cwd=self.dir,
                           env=env, capture_output=True, text=True, timeout=120,
                           preexec_fn=cg.run_inside())
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertRegex(p.stderr, r"rank 0 \(pid \d+\) was killed by the OOM killer \(its "
                                   r"memory peak \d+ MiB, the limit 160 MiB\)")
        self.assertRegex(p.stderr, r"attempt 0: rank 0 was killed by the OOM killer")
        exit_ev = [e for e in self.events() if e["event"] == "worker_exit"][0]
        self.assertEqual((exit_ev["signal"], exit_ev["oom"], exit_ev["mem_limit_mib"]),
                         ("SIGKILL", True, 160))
        self.assertGreater(exit_ev["mem_peak_mib"], 100)
        # Its resident set counts file pages (the interpreter's) the cgroup may not charge.
        self.assertLess(exit_ev["mem_peak_mib"], 200)

    def test_a_sigkill_from_elsewhere_is_not_called_an_oom_kill(self):
        p = self.dlaunch("--nproc-per-node", "1", "--events", self.events_path, "--", "sh",
                         "-c", "kill -KILL $$")
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("was killed by SIGKILL", p.stderr)
        self.assertNotIn("OOM", p.stderr)
        exit_ev = [e for e in self.events() if e["event"] == "worker_exit"][0]
        self.assertNotIn("oom", exit_ev)

    def test_a_worker_that_cannot_be_reaped_is_named_and_the_node_is_unhealthy(self):
        cg = self.cgroup("freezer")
        if cg.version != 1:
            self.skipTest("the v1 freezer is what this test freezes with")
        # Rank 1 moves itself into the freezer cgroup; rank 0 fails once rank 1 is frozen.
        procs = os.path.join(cg.path, "cgroup.procs")
        work = (f'if [ "$RANK" = 1 ]; then echo $$ > {procs}; touch frozen_ok; sleep 300; '
                'else while [ ! -e go ]; do sleep 0.05; done; exit 3; fi')
        p = self.start("--nproc-per-node", "2", "--max-restarts", "3", "--stop-timeout", "1",
                       "--events", self.events_path, "--", "sh", "-c", work)
        deadline = time.monotonic() + 20
        while not os.path.exists(os.path.join(self.dir, "frozen_ok")):
            self.assertLess(time.monotonic(), deadline)
            time.sleep(0.05)
        cg.write("freezer.state", "FROZEN")
        self.addCleanup(lambda: cg.write("freezer.state", "THAWED"))
        t0 = time.monotonic()
        open(os.path.join(self.dir, "go"), "w").close()
        out, err = p.communicate(timeout=30)
        took = time.monotonic() - t0
        self.assertEqual(p.returncode, 6, err)
        # Stop grace 1 s, SIGKILL, 1 s more: named, and the agent did not wait for it.
        self.assertLess(took, 15, err)
        self.assertRegex(err, r"rank 1 \(pid \d+\) cannot be reaped: [\d.]+s after SIGKILL it "
                              r"is still in uninterruptible sleep \(state D, waiting in \S+\)")
        self.assertIn("this node is unhealthy", err)
        ev = [e for e in self.events() if e["event"] == "worker_unreapable"]
        self.assertEqual((ev[0]["rank"], ev[0]["state"]), (1, "D"))
        self.assertNotEqual(ev[0]["wchan"], "")
        # No restart on this node, although three were left.
        self.assertEqual([e for e in self.events() if e["event"] == "restart"], [])
        self.assertEqual(self.events()[-1]["exit_code"], 6)

    def test_the_same_failure_on_every_attempt_ends_early_with_5(self):
        p = self.dlaunch("--nproc-per-node", "2", "--max-restarts", "10", "--events",
                         self.events_path, "--", "sh", "-c",
                         '[ "$RANK" = 1 ] && exit 7; sleep 30')
        self.assertEqual(p.returncode, 5, p.stderr)
        starts = [e for e in self.events() if e["event"] == "worker_start" and e["rank"] == 1]
        self.assertEqual(len(starts), 3)
        self.assertIn("failed the same way on every attempt (exit 5: do not requeue)", p.stderr)
        self.assertEqual(self.events()[-1]["exit_code"], 5)
        # Turned off, every restart is spent.
        os.unlink(self.events_path)
        p = self.dlaunch("--nproc-per-node", "1", "--max-restarts", "4", "--max-same-failures",
                         "0", "--events", self.events_path, "--", "sh", "-c", "exit 7")
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertEqual(len([e for e in self.events() if e["event"] == "worker_start"]), 5)



class RunFolder(dltest.Case):
    def test_a_run_id_used_before_loses_its_old_recorder_and_stacks(self):
        # What a rank left in an attempt folder of the same run id is never shown as this
        # run's (docs/diagnostics.md); a folder made for this run has none to remove.
        old = os.path.join(self.dir, "dlaunch_logs", "again", "attempt_0")
        os.makedirs(old, mode=0o750)
        for name in ["rank_0.rec", "rank_0.stacks", "rank_1.rec", "rank_1.stacks"]:
            with open(os.path.join(old, name), "w") as f:
                f.write("from the run before\n")
        self.dlaunch("--run-id", "again", "--nproc-per-node", "2", "--", "true", check_code=0)
        self.assertEqual(sorted(os.listdir(old)), ["rank_0.err", "rank_0.out", "rank_1.err",
                                                   "rank_1.out"])
        self.dlaunch("--run-id", "fresh", "--nproc-per-node", "2", "--", "true", check_code=0)
        new = os.path.join(self.dir, "dlaunch_logs", "fresh", "attempt_0")
        self.assertEqual(sorted(os.listdir(new)), ["rank_0.err", "rank_0.out", "rank_1.err",
                                                   "rank_1.out"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
