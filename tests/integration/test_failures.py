"""A failed worker restarts the whole job, up to --max-restarts; then a summary and exit 1."""
import os
import subprocess
import time
import unittest

import dltest

# Rank 1 fails on the first attempt only.
FLAKY = ('if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && [ "$RANK" = 1 ]; then '
         'echo "boom on attempt $TORCHELASTIC_RESTART_COUNT" >&2; exit 3; fi; '
         'echo "ok $RANK attempt $TORCHELASTIC_RESTART_COUNT"')


class Failures(dltest.Case):
    def test_exit_codes_of_success_and_failure(self):
        self.dlaunch("--gpus-per-node", "2", "--", "true", check_code=0)
        p = self.dlaunch("--gpus-per-node", "2", "--", "sh", "-c", "exit 5", check_code=1)
        self.assertIn("exited with code 5", p.stderr)

    def test_fail_on_attempt_0_succeed_on_attempt_1(self):
        p = self.dlaunch("--gpus-per-node", "3", "--max-restarts", "1", "--run-id", "flaky",
                         "--events", self.events_path, "--", "sh", "-c", FLAKY, check_code=0)
        for rank in range(3):
            self.assertIn(f"[rank {rank}] ok {rank} attempt 1", p.stdout)
        self.assertIn("[rank 1] boom on attempt 0", p.stderr)
        evs = self.events()
        kinds = [e["event"] for e in evs]
        self.assertEqual(kinds[0], "job_start")
        self.assertEqual(kinds[-1], "job_end")
        self.assertEqual(evs[-1]["status"], "succeeded")
        self.assertEqual(evs[-1]["exit_code"], 0)
        self.assertEqual(evs[-1]["attempts"], 2)
        restarts = [e for e in evs if e["event"] == "restart"]
        self.assertEqual(len(restarts), 1)
        self.assertEqual(restarts[0]["attempt"], 1)
        self.assertEqual(restarts[0]["reason"], {"rank": 1, "attempt": 0, "exit_code": 3})
        starts = [e for e in evs if e["event"] == "worker_start"]
        self.assertEqual(sorted((e["attempt"], e["rank"]) for e in starts),
                         [(a, r) for a in range(2) for r in range(3)])
        exits = [e for e in evs if e["event"] == "worker_exit" and e["attempt"] == 1]
        self.assertEqual(sorted(e["rank"] for e in exits), [0, 1, 2])
        self.assertTrue(all(e["exit_code"] == 0 for e in exits))
        rdzv = [e for e in evs if e["event"] == "rendezvous"]
        self.assertEqual([e["world_size"] for e in rdzv], [3, 3])
        self.assertEqual(rdzv[0]["ranks"], [0, 1, 2])
        times = [e["time"] for e in evs]
        self.assertEqual(times, sorted(times))
        # Both attempts keep their own logs.
        self.assertEqual(self.read("dlaunch_logs", "flaky", "attempt_0", "rank_1.err"),
                         "boom on attempt 0\n")
        self.assertEqual(self.read("dlaunch_logs", "flaky", "attempt_1", "rank_1.out"),
                         "ok 1 attempt 1\n")

    def test_restarts_exhausted_gives_summary_and_exit_1(self):
        script = 'echo "line A of $RANK" >&2; echo "fatal: rank $RANK gave up" >&2; exit 7'
        # Every attempt fails alike: --max-same-failures 0 spends the restarts all the same.
        p = self.dlaunch("--gpus-per-node", "2", "--max-restarts", "2", "--max-same-failures",
                         "0", "--run-id", "bad", "--events", self.events_path, "--", "sh", "-c",
                         script, check_code=1)
        self.assertIn("the job failed after 3 attempts", p.stderr)
        self.assertRegex(p.stderr, r"attempt 2: rank [01] exited with code 7 at \d{4}-\d\d-\d\d")
        self.assertRegex(p.stderr, r"its stderr: dlaunch_logs/bad/attempt_2/rank_[01]\.err")
        self.assertRegex(p.stderr, r"\| fatal: rank [01] gave up")
        for attempt in range(3):
            self.assertTrue(os.path.isdir(os.path.join(self.dir, "dlaunch_logs", "bad",
                                                       f"attempt_{attempt}")))
        self.assertFalse(os.path.exists(os.path.join(self.dir, "dlaunch_logs", "bad",
                                                     "attempt_3")))
        end = self.events()[-1]
        self.assertEqual(end["event"], "job_end")
        self.assertEqual(end["status"], "failed")
        self.assertEqual(end["exit_code"], 1)
        self.assertEqual(end["attempts"], 3)

    def test_signal_death_is_named(self):
        p = self.dlaunch("--gpus-per-node", "1", "--", "sh", "-c", "kill -SEGV $$",
                         check_code=1)
        self.assertIn("was killed by SIGSEGV", p.stderr)

    def test_other_ranks_are_stopped_when_one_fails(self):
        # Rank 0 would sleep for a minute; rank 1's failure must end it promptly.
        script = 'if [ $RANK = 1 ]; then exit 2; fi; exec sleep 60'
        p = self.dlaunch("--gpus-per-node", "2", "--events", self.events_path, "--", "sh",
                         "-c", script, timeout=20, check_code=1)
        exits = {e["rank"]: e for e in self.events() if e["event"] == "worker_exit"}
        self.assertEqual(exits[1]["exit_code"], 2)
        self.assertEqual(exits[0]["signal"], "SIGTERM")
        self.assertIn("rank 1 exited with code 2", p.stderr)

    def test_hung_worker_is_killed_and_the_job_restarts(self):
        # Rank 1 beats once, then goes silent on attempt 0; on attempt 1 every rank is fine.
        script = ('[ -n "$DLAUNCH_HEALTH_FD" ] || exit 9; echo beat >&$DLAUNCH_HEALTH_FD; '
                  'if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && [ "$RANK" = 1 ]; then '
                  'exec sleep 60; fi; echo done $RANK')
        t0 = time.monotonic()
        p = self.dlaunch("--gpus-per-node", "2", "--max-restarts", "1", "--health-timeout", "1",
                         "--stop-timeout", "1", "--events", self.events_path, "--", "sh", "-c",
                         script, timeout=60, check_code=0)
        self.assertLess(time.monotonic() - t0, 20)
        self.assertIn("rank 1", p.stderr)
        self.assertIn("is hung", p.stderr)
        evs = self.events()
        hung = [e for e in evs if e["event"] == "worker_hung"]
        self.assertEqual([e["rank"] for e in hung], [1])
        restart = [e for e in evs if e["event"] == "restart"][0]
        self.assertEqual(restart["reason"]["rank"], 1)
        self.assertTrue(restart["reason"]["hung"])
        self.assertIn("[rank 1] done 1", p.stdout)

    def test_silent_workers_are_left_alone(self):
        # No beat at all: the watchdog never arms (a script that knows nothing of it).
        self.dlaunch("--gpus-per-node", "2", "--health-timeout", "0.3", "--", "sleep", "1",
                     timeout=30, check_code=0)

    def test_summary_waits_for_the_failed_workers_last_words(self):
        # The worker exits at once, but its last stderr line is written 0.4 s later by a process
        # that left its group (as a logging thread or a child could): the summary must quote it.
        script = ('setsid sh -c \'touch left; sleep 0.4; echo "fatal: the real cause" >&2\' & '
                  'while [ ! -e left ]; do sleep 0.01; done; exit 3')
        p = self.dlaunch("--gpus-per-node", "1", "--run-id", "late", "--", "sh", "-c", script,
                         check_code=1)
        self.assertNotIn("(it is empty)", p.stderr)
        summary = p.stderr[p.stderr.index("the job failed"):]
        self.assertIn("| fatal: the real cause", summary)
        # Nothing of the worker's arrives after the summary, which only dlaunch's closing line
        # follows.
        lines = p.stderr.rstrip().splitlines()
        self.assertEqual(lines[-2].strip(), "| fatal: the real cause")
        self.assertRegex(lines[-1], r"^dlaunch: run late failed after 1 attempt in [\d.]+ s; "
                                    r"logs in dlaunch_logs/late/$")

    @unittest.skipUnless(os.geteuid() == 0, "mounting a small tmpfs needs root")
    def test_a_full_disk_is_said_once_and_the_worker_runs_on(self):
        logs = os.path.join(self.dir, "logs")
        os.mkdir(logs)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", logs], check=True)
        try:
            # 200 KB of output into 64 KB of disk, then a line on the console and exit 0.
            script = ('head -c 200000 /dev/zero | tr "\\0" x | fold -w 100; '
                      'echo "still here" >&2')
            p = self.dlaunch("--gpus-per-node", "1", "--log-dir", logs, "--run-id", "full",
                             "--events", self.events_path, "--", "sh", "-c", script,
                             check_code=0)
            self.assertIn("still here", p.stderr)
            # Said once on the console, for the first file (stdout's filled the disk); stderr's
            # cannot take its line either, and the events name both.
            said = [l for l in p.stderr.splitlines() if "cannot write the log file" in l]
            self.assertEqual(len(said), 1, p.stderr)
            self.assertIn("rank_0.out': No space left on device", said[0])
            failed = [e for e in self.events() if e["event"] == "log_write_failed"]
            self.assertEqual([(e["rank"], os.path.basename(e["path"]), e["error"]) for e in failed],
                             [(0, "rank_0.out", "No space left on device"),
                              (0, "rank_0.err", "No space left on device")])
        finally:
            subprocess.run(["umount", "-l", logs], check=False)


if __name__ == "__main__":
    dltest.main()
