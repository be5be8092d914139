"""Shared helpers for the integration tests: run the real dlaunch binary, read what it leaves."""
import json
import os
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import eventdoc

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
        # A cleanup, not tearDown's: cleanups run after tearDown, last registered first, so a
        # Cluster's (registered later) kills its agents before their folder goes.
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)

    def tearDown(self):
        # Whatever event stream a test made is held to docs/events.md's fields too.
        bad = []
        if os.path.exists(self.events_path):
            with open(self.events_path) as f:
                for line in f:
                    try:
                        why = eventdoc.mismatch(json.loads(line))
                    except ValueError:
                        continue  # the test's own business (a stream cut short on purpose)
                    if why:
                        bad.append(why)
        self.assertEqual(bad, [], "events unlike docs/events.md's table of fields")

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
        return read_events(self.events_path)

    def evs(self, name):
        """The events of the agent whose --events file is DIR/name.events."""
        return read_events(os.path.join(self.dir, f"{name}.events"))

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


def agent_env(env=None, unset=()):
    """The test's environment without DLAUNCH_* (a setting left in it would change every agent)
    and without unset's names, then env's."""
    full = {k: v for k, v in os.environ.items()
            if not k.startswith("DLAUNCH_") and k not in unset}
    full.update(env or {})
    return full


def tail(text, lines=60):
    return "\n".join(text.splitlines()[-lines:])


class Stream(threading.Thread):
    """Reads a pipe line by line and keeps (monotonic time, line) for each; with log, a file's
    path, appends each line there too as it comes."""

    def __init__(self, pipe, log=None):
        super().__init__(daemon=True)
        self.pipe, self.log, self.lines, self.lock = pipe, log, [], threading.Lock()
        self.start()

    def run(self):
        sink = open(self.log, "a", buffering=1) if self.log else None
        try:
            for line in iter(self.pipe.readline, ""):
                with self.lock:
                    self.lines.append((time.monotonic(), line.rstrip("\n")))
                if sink:
                    sink.write(line)
        finally:
            if sink:
                sink.close()

    def snapshot(self):
        with self.lock:
            return list(self.lines)


class Cluster:
    """The agents a test starts, as one job's nodes (or several jobs' on one endpoint): each
    named, its output in NAME.log and its events in NAME.events in the case's folder, all killed
    at the test's end, whatever happened. Waits are bounded and, when what they wait for does
    not come, fail with every agent's log tail: the cause is often on another node.

    endpoint: None, a free port on 127.0.0.1; False, no --rdzv-endpoint (the agents name
    their own, or none). run_id: None, no --run-id. args: flags every agent gets, before its
    own. case None: no test case (bench/faults, a module's setUp): the agents go in dir,
    failures raise AssertionError, and the caller calls close() itself."""

    _UNSET = object()

    def __init__(self, case, endpoint=None, run_id="job", args=(), dir=None):
        self.case = case
        self.dir = dir if dir is not None else case.dir
        self.endpoint = f"127.0.0.1:{free_port()}" if endpoint is None else endpoint
        self.run_id = run_id
        self.args = list(args)
        self.procs = {}
        self.groups = set()  # names started in a session of their own: killed as a group
        self.streams = {}  # name: (stdout's Stream, stderr's Stream), for stamped agents
        if case is not None:
            case.addCleanup(self.close)

    def fail(self, msg):
        if self.case is not None:
            self.case.fail(msg)
        raise AssertionError(msg)

    def path(self, name, ext):
        return os.path.join(self.dir, f"{name}.{ext}")

    def agent(self, *args, name="a", nodes=None, env=None, endpoint=_UNSET, run_id=_UNSET,
              prefix=(), session=False, unset=(), stamped=False):
        """Starts an agent; returns its Popen. endpoint and run_id replace the cluster's for
        this agent (False or None: left out); prefix runs it under another command (ip netns
        exec ...); session: in a session of its own, killed with its group at the end; unset:
        names of the test's environment the agent does not get; stamped: its stdout and stderr
        read apart, each line with the time it came (lines()), NAME.log getting both."""
        old = self.procs.get(name)
        if old is not None and old.poll() is None:
            raise RuntimeError(f"agent {name} is still running")
        endpoint = self.endpoint if endpoint is self._UNSET else endpoint
        run_id = self.run_id if run_id is self._UNSET else run_id
        cmd = [*prefix, DLAUNCH, "--events", self.path(name, "events")]
        if endpoint:
            cmd += ["--rdzv-endpoint", endpoint]
        if run_id:
            cmd += ["--run-id", run_id]
        if nodes is not None:
            cmd += ["--nodes", str(nodes)]
        with open(self.path(name, "log"), "w") as out:
            pipe = subprocess.PIPE if stamped else None
            p = subprocess.Popen([*cmd, *self.args, *args], cwd=self.dir,
                                 env=agent_env(env, unset), stdout=pipe or out,
                                 stderr=pipe or subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 start_new_session=session, text=stamped)
        self.procs[name] = p
        self.streams.pop(name, None)
        if stamped:
            log = self.path(name, "log")
            self.streams[name] = (Stream(p.stdout, log), Stream(p.stderr, log))
        if session:
            self.groups.add(name)
        else:
            self.groups.discard(name)
        return p

    def __getitem__(self, name):
        return self.procs[name]

    def events(self, name):
        return read_events(self.path(name, "events"))

    def lines(self, name, which="out"):
        """A stamped agent's lines of its stdout (which "out") or stderr ("err") so far, as
        (monotonic time, line)."""
        return self.streams[name][which == "err"].snapshot()

    def log(self, name):
        try:
            with open(self.path(name, "log")) as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def logs(self, first=None):
        """Every agent's state and log tail, first's first, for a failure's message."""
        names = sorted(self.procs, key=lambda n: (n != first, n))
        parts = []
        for n in names:
            code = self.procs[n].poll()
            state = "running" if code is None else f"exited {code}"
            parts.append(f"--- agent {n} ({state}), {n}.log:\n{tail(self.log(n))}")
        return "\n".join(parts)

    def wait_for(self, name, what, timeout=60, desc=None):
        """The first of name's events that is what (an event's name, or a predicate on an
        event), once it comes; fails with every agent's log tail when it does not within
        timeout seconds, or name's agent exits without it. desc names a predicate's event in
        the failure."""
        match = (lambda e: e.get("event") == what) if isinstance(what, str) else what
        desc = desc or (what if isinstance(what, str) else "awaited")
        deadline = time.monotonic() + timeout
        while True:
            exited = self.procs[name].poll() is not None  # before reading: no event after it
            for e in self.events(name):
                if match(e):
                    return e
            if exited:
                why = "exited without it"
                break
            if time.monotonic() >= deadline:
                why = f"not within {timeout} s"
                break
            time.sleep(0.05)
        self.fail(f"agent {name}: no {desc} event ({why}); its events: "
                       f"{[e.get('event') for e in self.events(name)]}\n{self.logs(name)}")

    def wait_until(self, cond, what, timeout=60):
        """cond()'s value once true (a condition on the agents' events); fails with every
        agent's log tail when it is not within timeout seconds."""
        deadline = time.monotonic() + timeout
        while True:
            got = cond()
            if got:
                return got
            if time.monotonic() >= deadline:
                self.fail(f"not within {timeout} s: {what}\n{self.logs()}")
            time.sleep(0.05)

    def wait_all(self, names=None, timeout=60):
        """The exit codes of names (every agent, in start order, by default; a name or a
        Popen each), once they exit; fails with every agent's log tail when one does not
        within timeout seconds (each)."""
        if names is None:
            names = list(self.procs)
        codes = []
        for n in names:
            p = self.procs[n] if isinstance(n, str) else n
            if not isinstance(n, str):  # a Popen: its name, for the message
                n = next((k for k, q in self.procs.items() if q is p), p.args[-1])
            try:
                codes.append(p.wait(timeout=timeout))
            except subprocess.TimeoutExpired:
                self.fail(f"agent {n} still running after {timeout} s\n{self.logs(n)}")
        return codes

    def close(self):
        """Kills what is still running (its whole group when it has a session of its own, woken
        first: a test may have stopped it), and reads a stamped agent's pipes to their end."""
        for name, p in self.procs.items():
            if p.poll() is None:
                try:
                    if name in self.groups:
                        os.killpg(p.pid, signal.SIGCONT)
                        os.killpg(p.pid, signal.SIGKILL)
                    else:
                        p.kill()
                except ProcessLookupError:
                    pass
            p.wait()
        for name, streams in self.streams.items():
            for s in streams:
                s.join(timeout=10)  # the pipe ends once every process that holds it is gone
                if not s.is_alive():
                    s.pipe.close()
        self.procs.clear()
        self.streams.clear()


def free_port():
    """A free port below the kernel's ephemeral range (32768 and up by default): no socket that
    another test binds to port 0, or connects from, can take it before we use it. Tests running
    side by side collide only by chance."""
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    for _ in range(200):
        port = rng.randrange(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    raise RuntimeError("no free port in 20000-32000")


def read_events(path):
    """An --events file's events so far: every complete line (the agent may be writing the
    next one), none when it does not exist yet."""
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.endswith("\n") and line.strip()]
    except FileNotFoundError:
        return []


def frame(obj):
    """One frame of our protocol (docs/protocol.md): a 4-byte big-endian length, then JSON."""
    body = json.dumps(obj).encode()
    return struct.pack(">I", len(body)) + body


def read_frame(sock, timeout=10):
    """The next frame's JSON from sock, or None once the peer closed the connection; a frame
    that does not come within timeout (seconds, per read) raises socket.timeout."""
    sock.settimeout(timeout)
    head = b""
    while len(head) < 4:
        chunk = sock.recv(4 - len(head))
        if not chunk:
            return None
        head += chunk
    (n,) = struct.unpack(">I", head)
    body = b""
    while len(body) < n:
        chunk = sock.recv(min(n - len(body), 1 << 20))
        if not chunk:
            return None
        body += chunk
    return json.loads(body)


DLAUNCHD = os.path.join(os.path.dirname(DLAUNCH), "..", "daemon", "dlaunchd")


def start_dlaunchd(log_path, *args, timeout=30):
    """Starts dlaunchd on a port of the kernel's choosing and returns (process, port) once it
    serves, so nothing can be on that port first, and callers never race its start."""
    log = open(log_path, "w")
    d = subprocess.Popen([DLAUNCHD, "--listen", "127.0.0.1:0", *args],
                         stdout=subprocess.DEVNULL, stderr=log)
    log.close()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(log_path) as f:
            m = re.search(r"serving [^\s]*:(\d+)", f.read())
        if m:
            return d, int(m.group(1))
        if d.poll() is not None:
            break
        time.sleep(0.02)
    d.kill()
    d.wait()
    with open(log_path) as f:
        raise RuntimeError(f"dlaunchd did not start:\n{f.read()}")


class TimedResult(unittest.TextTestResult):
    """Each case's wall time after its verdict ("    12.3 s test_name"), and the slowest five at
    the end, so that a suite's log says where its minutes go."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.times = {}
        self.started = 0.0

    def startTest(self, test):
        self.started = time.monotonic()
        super().startTest(test)

    def stopTest(self, test):
        elapsed = time.monotonic() - self.started
        self.times[test.id()] = elapsed
        if self.showAll:
            self.stream.writeln(f"    {elapsed:.1f} s {test.id().rsplit('.', 1)[-1]}")
        super().stopTest(test)

    def stopTestRun(self):
        super().stopTestRun()
        slowest = sorted(self.times.items(), key=lambda kv: -kv[1])[:5]
        if self.showAll and slowest:
            self.stream.writeln("slowest: " + ", ".join(
                f"{'.'.join(name.rsplit('.', 2)[-2:])} {t:.1f} s" for name, t in slowest))


# Every suite that imports this module times its cases, whether it ends with main() below or
# with unittest.main() of its own.
unittest.TextTestRunner.resultclass = TimedResult


class _AllBut(unittest.TestLoader):
    """The module's tests less those of the classes named: the other half of a suite split in
    two meson tests (tests/integration/meson.build), so that a class added later runs too."""

    def __init__(self, classes):
        super().__init__()
        self.classes = classes

    def loadTestsFromModule(self, module, *args, **kwargs):
        def flat(suite):
            for t in suite:
                yield from flat(t) if isinstance(t, unittest.TestSuite) else [t]
        tests = flat(super().loadTestsFromModule(module, *args, **kwargs))
        return self.suiteClass(t for t in tests if type(t).__name__ not in self.classes)


def main():
    """unittest.main with a closing line the CI log reader understands. `--all-but A,B` first
    on the command line: every test of the module but those of classes A and B."""
    argv, loader = sys.argv, unittest.defaultTestLoader
    if argv[1:2] == ["--all-but"]:
        loader = _AllBut(set(argv[2].split(",")))
        argv = argv[:1] + argv[3:]
    prog = unittest.main(argv=argv, testLoader=loader, exit=False, verbosity=2)
    r = prog.result
    # Counted by test: a subtest's failure is its test's, and a skipped subtest (one check of
    # a test skipped) leaves the test passed, counted apart, so that the line never goes
    # negative.
    failed = {getattr(t, "test_case", t).id() for t, _ in r.failures + r.errors}
    skipped = {t.id() for t, _ in r.skipped if not hasattr(t, "test_case")} - failed
    checks = len([t for t, _ in r.skipped if hasattr(t, "test_case")])
    print(f"{r.testsRun - len(failed) - len(skipped)} passed, {len(failed)} failed, "
          f"{len(skipped)} skipped" + (f" ({checks} checks skipped)" if checks else ""))
    sys.exit(0 if r.wasSuccessful() else 1)
