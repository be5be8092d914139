"""Signals reach every worker; after --stop-timeout SIGKILL; no orphan even if dlaunch is
killed with SIGKILL."""
import os
import signal
import subprocess
import time

import dltest

# Each worker records its pid, a background child's pid, and a marker when SIGTERM arrives.
TRAPPING = ('trap "echo term > $PWD/term_$RANK; exit 0" TERM; '
            'sleep 300 & echo $! > $PWD/child_$RANK; echo $$ > $PWD/pid_$RANK; '
            'wait')


class Signals(dltest.Case):
    def written(self, name):
        """The shell creates the file before echo writes the line: wait for the whole line."""
        path = os.path.join(self.dir, name)
        if not os.path.exists(path):
            return False
        with open(path) as f:
            return f.read().endswith("\n")

    def started(self, n):
        return self.wait_events(
            lambda evs: sum(e["event"] == "worker_start" for e in evs) == n and all(
                self.written(f"{what}_{r}") for r in range(n) for what in ("child", "pid")))

    def pids(self, n):
        out = []
        for r in range(n):
            out.append(int(self.read(f"pid_{r}")))
            out.append(int(self.read(f"child_{r}")))
        return out

    def test_workers_start_with_no_signal_ignored(self):
        # dlaunch ignores SIGPIPE, and under nohup (or a shell's trap '' HUP) starts with SIGHUP
        # ignored too; exec would pass both on, and a worker then ignores a hangup or writes on
        # to a closed pipe for ever.
        def ignore():
            signal.signal(signal.SIGHUP, signal.SIG_IGN)
            signal.signal(signal.SIGUSR2, signal.SIG_IGN)

        p = subprocess.run([dltest.DLAUNCH, "--gpus-per-node", "3", "--", "sh", "-c",
                            "grep SigIgn /proc/self/status > ign_$RANK"],
                           cwd=self.dir, preexec_fn=ignore, capture_output=True, text=True,
                           timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        for r in range(3):
            # sh's own grep child: what the worker had is what its child inherits.
            self.assertEqual(self.read(f"ign_{r}").split(), ["SigIgn:", "0" * 16])

    def test_sigterm_reaches_all_workers(self):
        p = self.start("--gpus-per-node", "3", "--events", self.events_path, "--", "sh", "-c",
                       TRAPPING)
        self.started(3)
        pids = self.pids(3)
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=20)
        self.assertEqual(p.returncode, 128 + signal.SIGTERM, err)
        for r in range(3):
            self.assertEqual(self.read(f"term_{r}"), "term\n")
        self.assert_gone(pids)
        end = self.events()[-1]
        self.assertEqual((end["event"], end["status"], end["exit_code"]),
                         ("job_end", "stopped", 143))

    def test_sigint_and_sighup_exit_128_plus_n(self):
        for sig in (signal.SIGINT, signal.SIGHUP):
            if os.path.exists(self.events_path):
                os.unlink(self.events_path)
            for f in os.listdir(self.dir):
                if f.startswith(("child_", "pid_", "term_")):
                    os.unlink(os.path.join(self.dir, f))
            p = self.start("--gpus-per-node", "2", "--events", self.events_path, "--", "sh",
                           "-c", "sleep 300 & echo $! > child_$RANK; echo $$ > pid_$RANK; wait")
            self.started(2)
            pids = self.pids(2)
            p.send_signal(sig)
            p.communicate(timeout=20)
            self.assertEqual(p.returncode, 128 + sig)
            self.assert_gone(pids)

    def test_stop_timeout_escalates_to_sigkill(self):
        stubborn = ('trap "" TERM; echo $$ > pid_$RANK; sleep 300 & echo $! > child_$RANK; '
                    'while :; do wait; done')
        p = self.start("--gpus-per-node", "2", "--stop-timeout", "0.5", "--events",
                       self.events_path, "--", "sh", "-c", stubborn)
        self.started(2)
        pids = self.pids(2)
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=20)
        took = time.monotonic() - t0
        self.assertEqual(p.returncode, 143)
        self.assertIn("sending SIGKILL", err)
        self.assertLess(took, 5)
        self.assertGreater(took, 0.4)
        self.assert_gone(pids)

    def test_a_second_ctrl_c_kills_at_once_and_says_so(self):
        # docs/job-spec.md: "A second one while stopping kills the workers at once, and says
        # so" - a worker that ignores SIGINT does not hold dlaunch for --stop-timeout.
        stubborn = ('trap "" INT TERM; echo $$ > pid_$RANK; sleep 300 & echo $! > child_$RANK; '
                    'while :; do wait; done')
        p = self.start("--gpus-per-node", "2", "--stop-timeout", "60", "--events",
                       self.events_path, "--", "sh", "-c", stubborn)
        self.started(2)
        pids = self.pids(2)
        p.send_signal(signal.SIGINT)
        self.wait_events(lambda evs: any(e["event"] == "signal" for e in evs))
        t0 = time.monotonic()
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=20)
        self.assertLess(time.monotonic() - t0, 5)
        self.assertEqual(p.returncode, 130, err)
        self.assertIn("got SIGINT: stopping the workers (again to kill them at once)", err)
        self.assertIn("got SIGINT again: killing the workers now (SIGKILL)", err)
        self.assert_gone(pids)
        self.assertEqual([e["signal"] for e in self.events() if e["event"] == "signal"],
                         ["SIGINT", "SIGINT"])

    def test_a_stop_signal_after_the_job_ended_leaves_its_exit_code(self):
        """A SIGTERM that comes once the job has ended (its job_end written), while the agent
        drains the workers' output (held open here for the drain's second by a process the
        worker left in a session of its own), changes nothing: exit 0 with the closing line,
        not killed by the signal before its summary and clean-up."""
        # The worker exits once the holder is in its own session (the agent kills the worker's
        # process group with it).
        script = ('setsid sh -c \'echo $$ > held.new; mv held.new held; exec sleep 5\' & '
                  'while [ ! -e held ]; do sleep 0.01; done; exit 0')
        for _ in range(5):
            for name in ("held", os.path.basename(self.events_path)):
                if os.path.exists(os.path.join(self.dir, name)):
                    os.unlink(os.path.join(self.dir, name))
            p = self.start("--events", self.events_path, "--", "sh", "-c", script)
            self.wait_events(lambda evs: evs and evs[-1]["event"] == "job_end", timeout=60)
            alive = p.poll() is None
            if alive:
                p.send_signal(signal.SIGTERM)
            _, err = p.communicate(timeout=30)
            held = int(self.read("held"))
            try:
                os.kill(held, signal.SIGKILL)
            except ProcessLookupError:
                pass
            if alive:
                break
        else:
            self.fail("the agent never outlived its job_end long enough to be signalled")
        self.assertEqual(p.returncode, 0, err)
        self.assertIn("dlaunch: run ", err)
        self.assertIn(" succeeded after 1 attempt", err)

    def test_sigkill_of_dlaunch_leaves_no_orphan(self):
        p = self.start("--gpus-per-node", "4", "--events", self.events_path, "--", "sh", "-c",
                       TRAPPING)
        self.started(4)
        pids = self.pids(4)
        for pid in pids:
            self.assertTrue(dltest.pid_alive(pid))
        p.kill()
        p.wait(timeout=10)
        self.assertEqual(p.returncode, -signal.SIGKILL)
        self.assert_gone(pids, timeout=5)
        # The guard is gone too: nothing is left with dlaunch's name under our test folder.
        out = subprocess.run(["pgrep", "-f", self.dir], capture_output=True, text=True).stdout
        self.assertEqual(out.strip(), "")


if __name__ == "__main__":
    dltest.main()
