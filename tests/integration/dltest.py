"""Shared helpers for the integration tests: run the real dlaunch binary, read what it leaves."""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

DLAUNCH = os.environ.get("DLAUNCH") or os.path.join(
    os.environ.get("BUILD_ROOT", "build"), "cmd", "dlaunch")


def pid_alive(pid):
    """True if pid exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


class Case(unittest.TestCase):
    """Each test runs in a fresh folder, so log folders never mix."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="dl-integ-")
        self.events_path = os.path.join(self.dir, "events.jsonl")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def dlaunch(self, *args, timeout=60, env=None, check_code=None):
        full_env = dict(os.environ)
        for k in list(full_env):
            if k.startswith("DLAUNCH_"):
                del full_env[k]
        if env:
            full_env.update(env)
        p = subprocess.run([DLAUNCH, *args], cwd=self.dir, env=full_env, timeout=timeout,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if check_code is not None:
            self.assertEqual(p.returncode, check_code,
                             f"exit {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")
        return p

    def start(self, *args, env=None):
        full_env = dict(os.environ)
        if env:
            full_env.update(env)
        return subprocess.Popen([DLAUNCH, *args], cwd=self.dir, env=full_env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def events(self):
        if not os.path.exists(self.events_path):
            return []
        with open(self.events_path) as f:
            return [json.loads(line) for line in f]

    def wait_events(self, pred, timeout=20):
        """Waits until pred(events) is true; returns the events."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            evs = self.events()
            if pred(evs):
                return evs
            time.sleep(0.02)
        self.fail(f"timed out waiting for events; have {self.events()}")

    def write(self, name, text):
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def read(self, *parts):
        with open(os.path.join(self.dir, *parts)) as f:
            return f.read()

    def assert_gone(self, pids, timeout=5):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            alive = [p for p in pids if pid_alive(p)]
            if not alive:
                return
            time.sleep(0.05)
        self.fail(f"processes still alive: {alive}")


def main():
    """unittest.main with a closing line the CI log reader understands."""
    prog = unittest.main(exit=False, verbosity=2)
    r = prog.result
    failed = len(r.failures) + len(r.errors)
    print(f"{r.testsRun - failed - len(r.skipped)} passed, {failed} failed, "
          f"{len(r.skipped)} skipped")
    sys.exit(0 if r.wasSuccessful() else 1)
