"""A log folder that cannot take more bytes (docs/agent.md, Output): the job trains on, every file
that could not be written is named once on the console, in the events and in the failure summary,
and nothing dies of SIGBUS (the flight recorder of each rank is a mapped file in that folder).
The folder is a small tmpfs mounted by the test: full from the start, or filled by the job itself.
Skipped when mounting is not allowed (the suite runs as root)."""
import os
import re
import subprocess
import sys
import unittest

import dltest
import test_train

TRAINER = test_train.TRAINER
ENOSPC = os.strerror(28)


def setUpModule():
    test_train.setUpModule()


def tearDownModule():
    test_train.tearDownModule()


class FullDisk(dltest.Case):
    def setUp(self):
        super().setUp()
        self.mnt = os.path.join(self.dir, "small")
        os.mkdir(self.mnt)
        p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", self.mnt],
                           capture_output=True, text=True)
        if p.returncode != 0:
            self.skipTest(f"cannot mount a tmpfs: {p.stderr.strip()}")
        self.logs = os.path.join(self.mnt, "logs")

    def tearDown(self):
        subprocess.run(["umount", "-l", self.mnt], capture_output=True)
        super().tearDown()

    def fill(self):
        """Fills the tmpfs to the last byte."""
        fd = os.open(os.path.join(self.mnt, "filler"), os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            while os.write(fd, b"x" * 512) > 0:
                pass
        except OSError:
            pass
        finally:
            os.close(fd)
        self.assertEqual(os.statvfs(self.mnt).f_bavail, 0)

    def run_job(self, *args, timeout=120):
        return self.dlaunch("--log-dir", self.logs, "--run-id", "disk", "--events",
                            self.events_path, *args, timeout=timeout)

    def assert_no_signal(self, p):
        self.assertGreaterEqual(p.returncode, 0, p.stderr)
        self.assertLess(p.returncode, 128, f"killed by a signal\n{p.stderr}")

    def unwritten(self):
        return sorted(os.path.basename(e["path"]) for e in self.events()
                      if e["event"] == "log_write_failed" and e["error"] == ENOSPC)

    def trainer(self, *sets):
        if test_train.SUBSET is None:
            self.skipTest("dataset-fashion-mnist is not installed")
        args = [TRAINER, "--set", f"dataset_dir={test_train.SUBSET}", "--set", "overlap=off"]
        for s in sets:
            args += ["--set", s]
        return args

    def test_full_from_the_start_trains_on(self):
        self.fill()
        # Long enough for the agent to look at the ranks' recorders (each heartbeat) before the
        # workers are gone: a recorder kept in memory is found in the living process. 500 steps
        # are seconds even on a quiet machine, dozens of 0.1 s heartbeats.
        p = self.run_job("--nproc-per-node", "2", "--max-restarts", "0", "--heartbeat", "0.1",
                         "--", *self.trainer("steps=500", "log_every=250"))
        self.assert_no_signal(p)
        self.assertEqual(p.returncode, 0, p.stderr)
        # The terminal still shows what the files could not keep.
        self.assertRegex(p.stdout, r"\[rank 0\] .*step 500")
        # Said once on the console, for the first file; the events name every file.
        self.assertEqual(len(re.findall(r"cannot write the log file '[^']+': " + ENOSPC,
                                        p.stderr)), 1, p.stderr)
        self.assertEqual(len(re.findall(r"cannot write the flight recorder '[^']+rank_\d\.rec': "
                                        + ENOSPC, p.stderr)), 1, p.stderr)
        self.assertIn("rank_0.rec", self.unwritten())
        self.assertIn("rank_1.rec", self.unwritten())
        self.assertIn("rank_0.out", self.unwritten())

    def test_a_rank_that_fails_on_a_full_disk_is_summarized(self):
        """The summary says that the failed rank's stderr could not be written, and why, instead
        of calling it empty; the terminal had the line."""
        self.fill()
        p = self.run_job("--nproc-per-node", "1", "--max-restarts", "0", "--",
                         "sh", "-c", "echo 'fatal: out of luck' >&2; exit 3")
        self.assert_no_signal(p)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("[rank 0] fatal: out of luck", p.stderr)
        self.assertRegex(p.stderr, r"its stderr: \S+/attempt_0/rank_0\.err\n"
                         r"  \(it could not be written: " + ENOSPC)
        self.assertNotIn("(it is empty)", p.stderr)
        self.assertIn("rank_0.err", self.unwritten())

    def test_filled_by_the_job_then_restarted(self):
        """The first attempt fills the folder through its stderr and fails; the second one sets
        up its flight recorders on the full disk and trains to the end."""
        script = ('if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then '
                  'yes "filling the log folder with this line" | head -c 200000 >&2; exit 1; fi; '
                  'exec "$@"')
        p = self.run_job("--nproc-per-node", "2", "--max-restarts", "1", "--heartbeat", "0.1",
                         "--", "sh", "-c", script, "sh",
                         *self.trainer("steps=500", "log_every=250"))
        self.assert_no_signal(p)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertRegex(p.stdout, r"\[rank 0\] .*step 500")
        unwritten = self.unwritten()
        self.assertTrue({"rank_0.err", "rank_1.err"} & set(unwritten), unwritten)
        self.assertIn("rank_0.rec", unwritten)

    def test_an_event_stream_on_a_full_disk_is_said_lost_once(self):
        self.fill()
        events = os.path.join(self.mnt, "events.jsonl")
        p = self.dlaunch("--log-dir", self.logs, "--run-id", "disk", "--events", events,
                         "--nproc-per-node", "2", "--", "sh", "-c", "echo trained", timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("[rank 1] trained", p.stdout)
        self.assertEqual(len(re.findall(rf"cannot write the event stream '{re.escape(events)}': "
                                        + ENOSPC, p.stderr)), 1, p.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
