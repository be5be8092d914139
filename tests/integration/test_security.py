"""The control plane tried as an attacker would, on loopback only, against real servers: each test
is one finding of issue #13, bounded in count and time, and asserts what the victim job or the
server still does. Another user is `nobody` when the tests run as root.

1. a stalled server fails healthy jobs (events_follow floods)
2. one token opens every job (a worker stops another job)
3. without a token any local user owns the job
4. agents trust any server
5. memory and CPU without bounds after auth
6. smaller ones: reconnect storms, raw control characters, a reused run id, id overflow, the
   unknown run id, error codes, --run-id ..
"""
import hashlib
import hmac
import json
import os
import random
import re
import resource
import shutil
import socket
import stat
import struct
import subprocess
import tempfile
import threading
import time
import unittest
import urllib.error
import urllib.request

import dltest
from dltest import frame, read_frame
from dltest import free_port

NOBODY = "nobody"



def send_in_pieces(sock, data):
    """sendall without its bound on the whole: Python's sendall must finish within the socket's
    timeout (10 s after a read), which tens of MiB to a sanitized daemon on a loaded machine
    do not; each piece here gets the whole timeout."""
    view = memoryview(data)
    while view:
        view = view[sock.send(view[:1 << 16]):]


def key_bytes(text):
    """The HMAC key of a credential: a job or worker key's 32 bytes, else the token's own."""
    m = re.fullmatch(r"dlaunch-(?:job|worker)-v2:.+:\d+:\d+:([0-9a-f]{64})", text)
    return bytes.fromhex(m.group(1)) if m else text.encode()


def key_span(text):
    """What auth says of a job or worker key: its issued and expires times; {} for a token."""
    m = re.fullmatch(r"dlaunch-(?:job|worker)-v2:.+:(\d+):(\d+):[0-9a-f]{64}", text)
    return {"key_issued": int(m.group(1)), "key_expires": int(m.group(2))} if m else {}


class Client:
    """A raw protocol client: what an attacker writes by hand."""

    def __init__(self, port, source=None):
        self.sock = socket.socket()
        if source:
            self.sock.bind((source, 0))
        self.sock.connect(("127.0.0.1", port))
        self.next_id = 1

    def close(self):
        self.sock.close()

    def send(self, obj):
        self.sock.sendall(frame(obj))

    def recv(self, timeout=10):
        return read_frame(self.sock, timeout)

    def hello(self, role, run_id, token=None):
        """The handshake; returns the server's last answer (auth_ok or an error)."""
        self.send({"v": 1, "type": "hello", "id": 0, "role": role, "run_id": run_id, "proto": 1})
        reply = self.recv()
        if reply is None or reply["type"] != "challenge":
            return reply
        proof = hmac.new(key_bytes(token), (reply["nonce"] + run_id + role).encode(),
                         hashlib.sha256).hexdigest()
        self.send({"v": 1, "type": "auth", "id": 1, "proof": proof, **key_span(token)})
        return self.recv()

    def call(self, obj, timeout=10):
        obj = dict(obj, v=1, id=self.next_id)
        self.next_id += 1
        self.send(obj)
        while True:
            m = self.recv(timeout)
            if m is None or m.get("id") == obj["id"]:
                return m


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def sanitized(pid):
    """Whether the process runs under AddressSanitizer, whose quarantine and shadow memory make
    its resident size say nothing about what the program holds."""
    with open(f"/proc/{pid}/maps") as f:
        return "libasan" in f.read()


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Base(dltest.Case):
    def setUp(self):
        super().setUp()
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4096)), hard))
        self.procs = []  # what is not an agent: dlaunchd, squatters
        self.clients = []
        # The agents name their endpoints and run ids themselves.
        self.cluster = dltest.Cluster(self, endpoint=False, run_id=None)

    def tearDown(self):
        for c in self.clients:
            c.close()
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        super().tearDown()

    def daemon(self, *args):
        d, port = dltest.start_dlaunchd(os.path.join(self.dir, "d.log"), *args)
        self.procs.append(d)
        return d, port

    def client(self, port, source=None):
        c = Client(port, source)
        self.clients.append(c)
        return c

    def token(self, name, text):
        path = self.write(name, text + "\n")
        os.chmod(path, 0o600)
        return path

    def agent(self, name, *args, env=None):
        return self.cluster.agent(*args, name=name, env=env)

    def wait_started(self, names, timeout=60):
        for n in names:
            self.cluster.wait_for(n, "worker_start", timeout=timeout)

    def run_cmd(self, *args, env=None, user=None, timeout=60):
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("DLAUNCH_")}
        full_env.update(env or {})
        cmd = [dltest.DLAUNCH, *args]
        cwd = self.dir
        if user is not None:
            cmd = ["runuser", "-u", user, "--", *cmd]
            cwd = "/"
        return subprocess.run(cmd, cwd=cwd, env=full_env, timeout=timeout,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


class Stall(Base):
    """1. Follow floods replay a job's journal a slice at a time, one follow per connection: a
    healthy job of another run keeps its heartbeats and finishes."""

    def test_follow_flood_does_not_stall_the_loop(self):
        d, port = self.daemon()
        endpoint = f"127.0.0.1:{port}"
        # A journal of about 1,000 events: agents that join a two-node job and go.
        for i in range(1000):
            c = Client(port)
            self.assertEqual(c.hello("agent", "noisy")["type"], "auth_ok")
            c.send({"v": 1, "type": "join", "id": 2, "node_id": f"n{i}", "host": "h",
                    "slots": 1, "min_nodes": 2, "max_nodes": 2})
            c.close()
        victims = [self.agent(n, "-q", "--nodes", "2", "--gpus-per-node", "1", "--rdzv-endpoint",
                              endpoint, "--run-id", "victim", "--heartbeat", "0.2",
                              "--dead-after", "1.5", "--max-restarts", "0", "--", "sleep", "6")
                   for n in ("a", "b")]
        self.wait_started(["a", "b"])
        attackers = []
        for _ in range(8):
            c = self.client(port)
            self.assertEqual(c.hello("control", "noisy")["type"], "auth_ok")
            attackers.append(c)
        # All at once: 2,400 follows of a 1,000-event journal.
        burst = b"".join(frame({"v": 1, "type": "events_follow", "id": 10 + k, "since": 0})
                         for k in range(300))
        for c in attackers:
            c.sock.sendall(burst)
        for p, n in zip(victims, "ab"):
            self.assertEqual(p.wait(timeout=120), 0, self.read(f"{n}.log") + self.read("d.log"))
        st = self.run_cmd("status", "--json", "--endpoint", endpoint, "victim")
        self.assertEqual(st.returncode, 0, st.stderr)
        self.assertEqual(json.loads(st.stdout)["restarts"], 0)
        # One follow per connection; the others are refused, and the one replays the journal.
        answers, events = {}, 0
        deadline = time.monotonic() + 60
        while (len(answers) < 300 or events < 900) and time.monotonic() < deadline:
            m = attackers[0].recv(timeout=30)
            self.assertIsNotNone(m)
            if m["type"] == "event":
                events += 1
            elif "id" in m:
                answers[m["id"]] = m.get("error", {}).get("code", "ok")
        self.assertEqual(sorted(answers.values()).count("ok"), 1, answers)
        self.assertEqual(sorted(answers.values()).count("limit_exceeded"), 299)
        self.assertGreaterEqual(events, 900)
        self.assertIsNone(d.poll())


class Authority(Base):
    """2. Credentials per job and role: a worker's key reaches its own job's store only; a job's
    key controls that job only."""

    def test_a_worker_reaches_its_own_store_only(self):
        master = self.token("site.token", "site-secret")
        d, port = self.daemon("--token-file", master)
        endpoint = f"127.0.0.1:{port}"
        b = self.agent("b", "-q", "--rdzv-endpoint", endpoint, "--run-id", "jobB",
                       "--gpus-per-node", "1", "--token-file", master, "--", "sleep", "8")
        self.wait_started(["b"])
        out = os.path.join(self.dir, "worker.out")
        script = (
            f'D={dltest.DLAUNCH}; E={endpoint}; O={out};'
            'echo "key=$(head -c 17 $DLAUNCH_TOKEN_FILE) env=${DLAUNCH_TOKEN:-none}" >> $O;'
            '$D stop --endpoint $E jobB; echo "stop_other=$?" >> $O;'
            '$D status --endpoint $E jobB; echo "status_other=$?" >> $O;'
            '$D restart --endpoint $E jobA; echo "restart_own=$?" >> $O;'
            'TORCHELASTIC_RUN_ID=jobB $D kv set x 1; echo "kv_other=$?" >> $O;'
            '$D kv set x 1; echo "kv_own=$?" >> $O')
        a = self.agent("a", "-q", "--rdzv-endpoint", endpoint, "--run-id", "jobA",
                       "--gpus-per-node", "1", "--token-file", master, "--", "sh", "-c", script,
                       env={"DLAUNCH_TOKEN": "site-secret"})
        self.assertEqual(a.wait(timeout=60), 0, self.read("a.log"))
        got = dict(w.split("=", 1) for line in self.read("worker.out").split("\n") if line
                   for w in line.split(" "))
        self.assertEqual(got["key"], "dlaunch-worker-v2")
        self.assertEqual(got["env"], "none")
        for k in ("stop_other", "status_other", "restart_own", "kv_other"):
            self.assertEqual(got[k], "4", f"{k}: {got}")
        self.assertEqual(got["kv_own"], "0")
        # Job B never heard of it and ends on its own.
        self.assertIsNone(b.poll(), self.read("b.log"))
        self.assertEqual(b.wait(timeout=60), 0, self.read("b.log"))
        self.assertNotIn("stopped", self.read("b.log"))

    def test_a_jobs_key_controls_that_job_only(self):
        master = self.token("site.token", "site-secret")
        d, port = self.daemon("--token-file", master)
        endpoint = f"127.0.0.1:{port}"
        keys = {}
        for job in ("jobA", "jobB"):
            p = self.run_cmd("token", "--token-file", master, job)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertTrue(p.stdout.startswith(f"dlaunch-job-v2:{job}:"))
            keys[job] = self.token(f"{job}.key", p.stdout.strip())
        b = self.agent("b", "-q", "--rdzv-endpoint", endpoint, "--run-id", "jobB",
                       "--gpus-per-node", "1", "--token-file", keys["jobB"], "--", "sleep", "30")
        a = self.agent("a", "-q", "--rdzv-endpoint", endpoint, "--run-id", "jobA",
                       "--gpus-per-node", "1", "--token-file", keys["jobA"], "--", "sleep", "30")
        self.wait_started(["a", "b"])
        ka = ["--endpoint", endpoint, "--token-file", keys["jobA"]]
        self.assertEqual(self.run_cmd("stop", *ka, "jobB").returncode, 4)
        self.assertEqual(self.run_cmd("status", *ka, "jobB").returncode, 4)
        self.assertEqual(self.run_cmd("status", *ka).returncode, 4)  # every job: the site's
        self.assertEqual(self.run_cmd("status", *ka, "jobA").returncode, 0)
        # A's key cannot run an agent of B either.
        p = self.run_cmd("--rdzv-endpoint", endpoint, "--run-id", "jobB", "--token-file",
                         keys["jobA"], "--", "true")
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIsNone(b.poll())
        self.assertEqual(self.run_cmd("stop", *ka, "jobA").returncode, 0)
        self.assertEqual(a.wait(timeout=60), 0, self.read("a.log"))
        p = self.run_cmd("status", "--json", "--endpoint", endpoint, "--token-file", master)
        self.assertEqual(p.returncode, 0, p.stderr)
        states = {j["run_id"]: j["state"] for j in json.loads(p.stdout)["jobs"]}
        self.assertEqual(states, {"jobA": "stopped", "jobB": "running"})
        self.assertEqual(self.run_cmd("stop", "--endpoint", endpoint, "--token-file",
                                      keys["jobB"], "jobB").returncode, 0)
        self.assertEqual(b.wait(timeout=60), 0)


@unittest.skipUnless(os.geteuid() == 0, "needs root to run the other user as nobody")
class OtherUser(Base):
    """3. Without a token, only the job's own user reaches it; with one, its one-node store
    wants it too."""

    def test_another_user_cannot_reach_a_job_without_a_token(self):
        port = free_port()
        endpoint = f"127.0.0.1:{port}"
        common = ["-q", "--nodes", "2", "--gpus-per-node", "1", "--rdzv-endpoint", endpoint,
                  "--run-id", "job", "--", "sleep", "5"]
        a = self.agent("a", "--node-rank", "0", *common)
        b = self.agent("b", *common)
        self.wait_started(["a", "b"])
        for args, env in ((["stop", "--endpoint", endpoint, "job"], None),
                          (["restart", "--endpoint", endpoint, "job"], None),
                          (["status", "--endpoint", endpoint, "job"], None),
                          (["kv", "set", "x", "1"],
                           {"DLAUNCH_STORE": endpoint, "TORCHELASTIC_RUN_ID": "job"})):
            p = self.run_cmd(*args, env=env, user=NOBODY)
            self.assertEqual(p.returncode, 4, f"{args}: {p.stdout} {p.stderr}")
        self.assertEqual([a.wait(timeout=60), b.wait(timeout=60)], [0, 0],
                         self.read("a.log") + self.read("b.log"))
        self.assertNotIn("stopped", self.read("a.log"))

    def test_a_one_node_store_wants_the_jobs_token(self):
        tok = self.token("job.token", "s3cret")
        store_file = os.path.join(self.dir, "store")
        open(store_file, "w").close()
        wait = f'echo $DLAUNCH_STORE > {store_file}.new; mv {store_file}.new {store_file}; sleep 4'
        with_token = self.agent("t", "-q", "--run-id", "one", "--token-file", tok, "--", "sh",
                                "-c", wait)
        self.wait_started(["t"])
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not os.path.getsize(store_file):
            time.sleep(0.05)
        env = {"DLAUNCH_STORE": self.read("store").strip(), "TORCHELASTIC_RUN_ID": "one"}
        p = self.run_cmd("kv", "set", "x", "1", env=env)
        self.assertEqual(p.returncode, 4, p.stdout + p.stderr)
        self.assertIn("token", p.stderr)
        p = self.run_cmd("kv", "set", "x", "1", env=env, user=NOBODY)
        self.assertEqual(p.returncode, 4, p.stderr)
        self.assertEqual(with_token.wait(timeout=60), 0, self.read("t.log"))
        open(store_file, "w").close()
        without = self.agent("n", "-q", "--run-id", "two", "--", "sh", "-c", wait)
        self.wait_started(["n"])
        while time.monotonic() < deadline + 20 and not os.path.getsize(store_file):
            time.sleep(0.05)
        env = {"DLAUNCH_STORE": self.read("store").strip(), "TORCHELASTIC_RUN_ID": "two"}
        p = self.run_cmd("kv", "set", "x", "1", env=env, user=NOBODY)
        self.assertEqual(p.returncode, 4, p.stderr)
        self.assertEqual(self.run_cmd("kv", "set", "x", "1", env=env).returncode, 0)
        self.assertEqual(without.wait(timeout=60), 0, self.read("n.log"))


class FakeServer:
    """Listens where an agent expects its rendezvous and says what an attacker wants."""

    def __init__(self, port, on_join):
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen(64)
        self.sock.settimeout(0.2)
        self.on_join = on_join
        self.connections = 0
        self.stop = False
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self):
        while not self.stop:
            try:
                c, _ = self.sock.accept()
            except socket.timeout:
                continue
            self.connections += 1
            try:
                hello = read_frame(c, 5)
                c.sendall(frame({"v": 1, "type": "auth_ok", "id": hello["id"]}))
                while not self.stop:
                    m = read_frame(c, 5)
                    if m is None:
                        break
                    if m["type"] == "join":
                        c.sendall(self.on_join(self.connections, m))
            except (OSError, TypeError, ValueError):
                pass
            c.close()

    def close(self):
        self.stop = True
        self.thread.join()
        self.sock.close()


def assignment(id_, local, master="10.0.0.1"):
    return frame({"v": 1, "type": "assignment", "id": id_, "round": 0, "node_rank": 0,
                  "nodes": 1, "world_size": local, "first_rank": 0, "local_world_size": local,
                  "master_addr": master, "master_port": 29500, "store_addr": "127.0.0.1:1"})


class FakeRendezvous(Base):
    """4. An agent believes only a server that proves the token (or, without one, a server of
    its own user), and even then no assignment it did not ask for."""

    def test_a_squatter_with_no_token_gets_no_workers(self):
        port = free_port()
        fake = FakeServer(port, lambda n, m: assignment(m["id"], 40, "10.0.0.1\nLD_PRELOAD=/x"))
        try:
            tok = self.token("job.token", "s3cret")
            # Node rank 0 finds its port taken and joins whatever listens there.
            p = self.agent("a", "--nodes", "2", "--node-rank", "0", "--gpus-per-node", "1",
                           "--rdzv-endpoint", f"127.0.0.1:{port}", "--run-id", "job",
                           "--join-timeout", "5", "--token-file", tok, "--", "true")
            self.assertEqual(p.wait(timeout=60), 4, self.read("a.log"))
        finally:
            fake.close()
        self.assertIn("did not ask for the job token", self.read("a.log"))
        self.assertFalse([e for e in self.evs("a") if e["event"] == "worker_start"])

    def test_assignments_are_checked(self):
        port = free_port()
        # Without a token the fake is trusted as far as its uid goes (it is ours); what it
        # assigns is not: 40 workers for a node of 1, then a master address with a new line,
        # then a job of 1 node for a job of 2.
        fake = FakeServer(port, lambda n, m: [assignment(m["id"], 1),
                                              assignment(m["id"], 40),
                                              assignment(m["id"], 1, "10.0.0.1\nLD_PRELOAD=/x")]
                          [n % 3])
        try:
            p = self.agent("a", "--nodes", "2", "--node-rank", "1", "--gpus-per-node", "1",
                           "--rdzv-endpoint", f"127.0.0.1:{port}", "--run-id", "job",
                           "--join-timeout", "3", "--", "true")
            self.assertEqual(p.wait(timeout=60), 4, self.read("a.log"))
        finally:
            fake.close()
        log = self.read("a.log")
        self.assertIn("40 workers on this node, which offered 1", log)
        self.assertIn("1 node, where the job has 2 to 2", log)
        self.assertIn("master_addr", log)
        self.assertFalse([e for e in self.evs("a") if e["event"] == "worker_start"], log)
        self.assertLessEqual(fake.connections, 12, log)


class Bounds(Base):
    """5. Every resource a client can make the server hold has a bound."""

    def test_memory_of_all_stores_is_capped(self):
        d, port = self.daemon("--max-memory", "24")
        before = rss_kib(d.pid)
        value = "v" * (1 << 19)
        stored = 0
        codes = set()
        for j in range(4):
            agent = self.client(port)
            self.assertEqual(agent.hello("agent", f"big{j}")["type"], "auth_ok")
            agent.send({"v": 1, "type": "join", "id": 99, "node_id": "n", "host": "h",
                        "slots": 1, "min_nodes": 2, "max_nodes": 2})
            for i in range(40):
                r = agent.call({"type": "kv_set", "key": f"k{i}", "value": value})
                if r["type"] == "reply":
                    stored += 1
                else:
                    codes.add(r["error"]["code"])
                    break
        self.assertEqual(codes, {"limit_exceeded"})
        self.assertLessEqual(stored * len(value), 24 << 20)
        self.assertGreaterEqual(stored, 30)
        if not sanitized(d.pid):
            self.assertLess(rss_kib(d.pid) - before, 80 * 1024)
        self.assertIsNone(d.poll())

    def test_waits_are_counted(self):
        d, port = self.daemon()
        agent = self.client(port)
        self.assertEqual(agent.hello("agent", "w")["type"], "auth_ok")
        # Its job waits for a second node, and its member sends no heartbeat: neither the
        # join timeout nor dead-after (30 s each by default) may end it while the test runs,
        # which takes longer than that on a sanitized daemon on a loaded machine.
        agent.send({"v": 1, "type": "join", "id": 99, "node_id": "n", "host": "h", "slots": 1,
                    "min_nodes": 2, "max_nodes": 2, "join_timeout_ms": 600000,
                    "dead_after_ms": 600000})
        before = rss_kib(d.pid)
        keys = [f"key-{i:06d}" for i in range(1024)]
        n = 2000
        blob = b"".join(frame({"v": 1, "type": "kv_wait", "id": 1000 + i,
                               "keys": [f"{i}-{k}" for k in keys], "timeout_ms": 60000})
                        for i in range(n))
        sender = threading.Thread(target=send_in_pieces, args=(agent.sock, blob))
        sender.start()
        refused = 0
        deadline = time.monotonic() + 120
        while refused < n - 256 and time.monotonic() < deadline:
            # The bound is the whole deadline, not a gap between replies: a sanitized daemon
            # on a loaded machine went 20 s without one, twice.
            m = agent.recv(timeout=max(1.0, deadline - time.monotonic()))
            self.assertIsNotNone(m, f"no reply within 120 s; {refused} of {n - 256} refused")
            if m.get("error", {}).get("code") == "limit_exceeded":
                refused += 1
        sender.join()
        self.assertEqual(refused, n - 256)
        if not sanitized(d.pid):
            self.assertLess(rss_kib(d.pid) - before, 100 * 1024)

    def test_frames_streamed_back_to_back_outlast_the_frame_timeout(self):
        # Every read ends inside the next frame, for longer than --frame-timeout: the frames
        # keep arriving whole, so this is no slow sender (it was closed after 2 s).
        d, port = self.daemon("--frame-timeout", "2")
        c = self.client(port)
        self.assertEqual(c.hello("control", "j")["type"], "auth_ok")
        # A step of three frames and a byte ends a read on a boundary once in len(one) reads.
        one = frame({"v": 1, "type": "no_such_type", "id": 7, "pad": "x" * 2000})
        stream = one * 2500
        step = len(one) * 3 + 1
        pos = 0
        end = time.monotonic() + 5
        while time.monotonic() < end:
            c.sock.sendall(stream[pos:pos + step])
            pos += step
            time.sleep(0.01)
        whole = -(-pos // len(one)) * len(one)
        c.sock.sendall(stream[pos:whole])  # the last frame made whole
        replies = 0
        while replies < whole // len(one):
            m = c.recv(timeout=10)
            self.assertIsNotNone(m, f"the connection ended after {replies} replies")
            self.assertNotIn("took longer", json.dumps(m))
            replies += 1

    def test_idle_and_unfinished_frames_are_bounded(self):
        d, port = self.daemon("--idle-timeout", "2", "--frame-timeout", "2")
        grown = []
        for wave in range(2):
            before = rss_kib(d.pid)
            holders = []
            for i in range(100):
                c = Client(port)
                # Five jobs of 20 MiB each: under a job's share of the pool (64 MiB), so the
                # frame timeout is what ends them (test_one_jobs_unfinished_frames_... checks
                # the share).
                self.assertEqual(c.hello("control", f"x{i % 5}")["type"], "auth_ok")
                # A 1 MiB frame announced, all of it but the last byte sent, then silence.
                c.sock.sendall(struct.pack(">I", 1 << 20) + b"{" + b" " * ((1 << 20) - 2))
                holders.append(c)
            idle = Client(port)
            self.assertEqual(idle.hello("control", "x")["type"], "auth_ok")
            t0 = time.monotonic()
            for c in holders + [idle]:
                m = c.recv(timeout=30)
                self.assertEqual(m["error"]["code"], "limit_exceeded", m)
                self.assertIsNone(c.recv(timeout=30))
                c.close()
            self.assertLess(time.monotonic() - t0, 60)
            # The last frees run just after the last connection closes: give them a moment.
            deadline = time.monotonic() + 10
            while rss_kib(d.pid) - before >= 50 * 1024 and time.monotonic() < deadline:
                time.sleep(0.1)
            grown.append(rss_kib(d.pid) - before)
        # What each wave held (100 MiB of frames) was given back once its connections ended:
        # had it been kept, the second wave would add about as much again.
        if not sanitized(d.pid):
            self.assertLess(max(grown), 50 * 1024, grown)
        self.assertIsNone(d.poll())

    def test_one_jobs_unfinished_frames_leave_room_for_another(self):
        """Issue #32, 7: every job shared one 256 MiB pool of unfinished frames, so one job's
        clients holding it made another job's 200 KB kv set fail."""
        d, port = self.daemon("--frame-timeout", "60", "--idle-timeout", "120")
        holders, refused = [], 0
        for _ in range(270):
            c = self.client(port)
            try:
                if (c.hello("control", "hog") or {}).get("type") != "auth_ok":
                    refused += 1
                    continue
                c.sock.sendall(struct.pack(">I", 1 << 20) + b"{" + b" " * ((1 << 20) - 2))
            except OSError:
                refused += 1
            holders.append(c)
        other = self.client(port)
        self.assertEqual(other.hello("agent", "other")["type"], "auth_ok")
        r = other.call({"type": "join", "node_id": "n0", "host": "h", "slots": 1,
                        "min_nodes": 1, "max_nodes": 1, "max_restarts": 0})
        self.assertEqual(r["type"], "assignment", r)
        r = other.call({"type": "kv_set", "key": "k", "value": "v" * 200_000}, timeout=30)
        self.assertIsNotNone(r)
        self.assertNotIn("error", r, r)
        self.assertIsNone(d.poll())

    def test_replies_nobody_reads_are_counted_in_max_memory(self):
        """Issue #32, 2: replies a client never read were capped per connection (64 MiB) but
        not server-wide, and --max-memory did not count them."""
        d, port = self.daemon("--max-memory", "64")
        agent = self.client(port)
        self.assertEqual(agent.hello("agent", "big")["type"], "auth_ok")
        r = agent.call({"type": "join", "node_id": "n0", "host": "h", "slots": 1,
                        "min_nodes": 1, "max_nodes": 1, "max_restarts": 0})
        self.assertEqual(r["type"], "assignment", r)
        w = self.client(port)
        self.assertEqual(w.hello("worker", "big")["type"], "auth_ok")
        r = w.call({"type": "kv_set", "key": "k", "value": "x" * 1_000_000}, timeout=30)
        self.assertNotIn("error", r or {"error": "none"}, r)
        before = rss_kib(d.pid)
        readers = []
        for _ in range(8):
            c = Client(port)
            c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            self.assertEqual(c.hello("worker", "big")["type"], "auth_ok")
            c.sock.sendall(b"".join(frame({"v": 1, "type": "kv_get", "id": 10 + i, "key": "k"})
                                    for i in range(60)))
            readers.append(c)
            self.clients.append(c)
        time.sleep(3)
        grown = rss_kib(d.pid) - before
        # 8 connections x 60 MiB was 480 MiB held; the budget is 64 MiB with the store's 1 MB.
        if not sanitized(d.pid):
            self.assertLess(grown, 150 * 1024, f"{grown} KiB")
        # Those over the budget were cut off; the server serves on.
        probe = self.client(port)
        self.assertEqual(probe.hello("worker", "big")["type"], "auth_ok")
        self.assertIsNone(d.poll())

    def test_journals_of_unknown_jobs_are_not_kept(self):
        d, port = self.daemon()
        c = self.client(port)
        for i in range(200):
            c = Client(port)
            self.assertEqual(c.hello("control", f"ghost{i}")["type"], "auth_ok")
            r = c.call({"type": "events_follow"})
            self.assertEqual(r["error"]["code"], "not_found")
            c.close()

    def test_squatting_joins_and_long_timeouts(self):
        d, port = self.daemon("--max-jobs-per-peer", "8", "--max-timeout", "60")
        codes = []
        for i in range(10):
            c = self.client(port, source="127.0.0.2")
            self.assertEqual(c.hello("agent", f"squat{i}")["type"], "auth_ok")
            # The join waits for a second node; the kv_get after it answers at once, so
            # whatever the join got came before.
            c.send({"v": 1, "type": "join", "id": 1, "node_id": "n", "host": "h", "slots": 1,
                    "min_nodes": 2, "max_nodes": 2, "join_timeout_ms": 50000})
            c.send({"v": 1, "type": "kv_get", "id": 2, "key": "k"})
            code = "waiting"
            while True:
                m = c.recv()
                if m["id"] == 1:
                    code = m["error"]["code"]
                if m["id"] == 2:
                    break
            codes.append(code)
        self.assertEqual(codes, ["waiting"] * 8 + ["limit_exceeded"] * 2)
        c = self.client(port)
        self.assertEqual(c.hello("agent", "forever")["type"], "auth_ok")
        r = c.call({"type": "join", "node_id": "n", "host": "h", "slots": 1, "min_nodes": 2,
                    "max_nodes": 2, "join_timeout_ms": 10 ** 12})
        self.assertEqual(r["error"]["code"], "bad_field")
        # A real job from another address still starts and runs.
        endpoint = f"127.0.0.1:{port}"
        procs = [self.agent(n, "-q", "--nodes", "2", "--gpus-per-node", "1", "--rdzv-endpoint",
                            endpoint, "--run-id", "real", "--join-timeout", "30", "--", "true")
                 for n in "ab"]
        self.assertEqual([p.wait(timeout=60) for p in procs], [0, 0],
                         self.read("a.log") + self.read("b.log"))

    def test_colliding_keys_cost_what_other_keys_cost(self):
        keygen = os.path.join(os.environ.get("BUILD_ROOT", "build"), "tests", "rendezvous",
                              "collide-keys")
        n = 40000
        colliding = subprocess.run([keygen, str(n)], check=True, stdout=subprocess.PIPE,
                                   text=True, timeout=300).stdout.split()
        rng = random.Random(7)
        plain = ["".join(rng.choice("abcdefghijklmnop") for _ in range(8)) for _ in range(n)]
        d, port = self.daemon()

        def cost(run_id, keys):
            c = self.client(port)
            self.assertEqual(c.hello("agent", run_id)["type"], "auth_ok")
            c.send({"v": 1, "type": "join", "id": 99, "node_id": "n", "host": "h", "slots": 1,
                    "min_nodes": 2, "max_nodes": 2})
            t0 = cpu_seconds(d.pid)
            blob = b"".join(frame({"v": 1, "type": "kv_set", "id": i, "key": k, "value": "1"})
                            for i, k in enumerate(keys))
            sender = threading.Thread(target=c.sock.sendall, args=(blob,))
            sender.start()
            got = 0
            while got < len(keys):
                m = c.recv(timeout=120)
                self.assertIsNotNone(m)
                self.assertEqual(m["type"], "reply", m)
                got += 1
            sender.join()
            return cpu_seconds(d.pid) - t0

        base = cost("plain", plain)
        attacked = cost("colliding", colliding)
        self.assertLess(attacked, 2 * base + 0.5, f"plain {base:.2f} s, colliding {attacked:.2f} s")


class Smaller(Base):
    """6. The smaller findings."""

    def test_a_misbehaving_server_gets_backoff_not_a_storm(self):
        port = free_port()
        fake = FakeServer(port, lambda n, m: frame({"v": 1, "type": "bogus"}))
        try:
            t0 = time.monotonic()
            p = self.agent("a", "--nodes", "2", "--node-rank", "1", "--gpus-per-node", "1",
                           "--rdzv-endpoint", f"127.0.0.1:{port}", "--run-id", "job",
                           "--join-timeout", "3", "--", "true")
            code = p.wait(timeout=60)
            took = time.monotonic() - t0
        finally:
            fake.close()
        self.assertNotEqual(code, 0)
        self.assertLessEqual(fake.connections, 12, self.read("a.log"))
        self.assertLess(took, 30)

    def test_names_and_reasons_reach_no_terminal_raw(self):
        d, port = self.daemon()
        endpoint = f"127.0.0.1:{port}"
        c = self.client(port)
        self.assertEqual(c.hello("agent", "esc")["type"], "auth_ok")
        r = c.call({"type": "join", "node_id": "evil\x1b[2J\nFAKE", "host": "h\x1b", "slots": 1})
        self.assertEqual(r["error"]["code"], "bad_field")
        r = c.call({"type": "join", "node_id": "n0", "host": "h", "slots": 1, "min_nodes": 1,
                    "max_nodes": 1, "max_restarts": 0})
        self.assertEqual(r["type"], "assignment")
        r = c.call({"type": "worker_failed", "round": 0, "rank": 0, "exit_code": 1,
                    "reason": "evil\x1b[31m\nFAKE LOG LINE"})
        self.assertEqual(r["type"], "reply")
        p = self.run_cmd("status", "--endpoint", endpoint, "esc")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("evil", p.stdout)
        self.assertNotIn("\x1b", p.stdout)
        self.assertFalse([l for l in p.stdout.split("\n") if l.startswith("FAKE")])
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and "evil" not in self.read("d.log"):
            time.sleep(0.05)
        log = self.read("d.log")
        self.assertIn("evil", log)
        self.assertNotIn("\x1b", log)
        self.assertFalse([l for l in log.split("\n") if l.startswith("FAKE")], log)

    def test_a_reused_run_id_starts_a_new_story(self):
        d, port = self.daemon("--linger", "0.5")
        endpoint = f"127.0.0.1:{port}"
        p = self.run_cmd("-q", "--rdzv-endpoint", endpoint, "--run-id", "again",
                         "--gpus-per-node", "1", "--", "true")
        self.assertEqual(p.returncode, 0, p.stderr)
        time.sleep(1.5)
        started = time.time()
        second = self.agent("b", "-q", "--rdzv-endpoint", endpoint, "--run-id", "again",
                            "--gpus-per-node", "1", "--", "sleep", "2")
        self.wait_started(["b"])
        ev = self.run_cmd("events", "--timeout", "30", "--endpoint", endpoint, "again")
        self.assertEqual(ev.returncode, 0, ev.stderr)
        self.assertEqual(second.wait(timeout=60), 0)
        evs = [json.loads(l) for l in ev.stdout.split("\n") if l]
        self.assertTrue(evs)
        self.assertFalse([e for e in evs if e["time"] < started - 0.5], evs)
        self.assertEqual([e["event"] for e in evs].count("job_end"), 1)

    def test_a_follow_from_the_largest_since_replays_nothing(self):
        """Issue #32, 7: since + 1 overflowed at 2^63 - 1 and replayed the whole journal."""
        d, port = self.daemon()
        c = self.client(port)
        self.assertEqual(c.hello("agent", "big")["type"], "auth_ok")
        r = c.call({"type": "join", "node_id": "n0", "host": "h", "slots": 1, "min_nodes": 1,
                    "max_nodes": 1, "max_restarts": 0})
        self.assertEqual(r["type"], "assignment")
        got = {}
        for since in (0, 2 ** 63 - 1):
            f = self.client(port)
            self.assertEqual(f.hello("control", "big")["type"], "auth_ok")
            r = f.call({"type": "events_follow", "since": since})
            self.assertNotIn("error", r)
            events = []
            while True:
                try:
                    m = f.recv(timeout=1)
                except socket.timeout:
                    break
                if m is None:
                    break
                events.append(m)
            got[since] = events
        self.assertTrue(got[0])
        self.assertEqual(got[2 ** 63 - 1], [])

    def test_the_largest_id_is_echoed(self):
        d, port = self.daemon()
        c = self.client(port)
        self.assertEqual(c.hello("agent", "ids")["type"], "auth_ok")
        big = 2 ** 63 - 1
        c.send({"v": 1, "type": "join", "id": big, "node_id": "n", "host": "h", "slots": 1,
                "min_nodes": 3, "max_nodes": 2})
        r = c.recv()
        self.assertEqual((r["type"], r["id"], r["error"]["code"]), ("error", big, "bad_field"))
        c.send({"v": 1, "type": "join", "id": big, "node_id": "n", "host": "h", "slots": 1,
                "min_nodes": 1, "max_nodes": 1})
        r = c.recv()
        self.assertEqual((r["type"], r["id"]), ("assignment", big))
        c.send({"v": 1, "type": "kv_get", "id": big, "key": "nope"})
        r = c.recv()
        self.assertEqual((r["id"], r["error"]["code"]), (big, "not_found"))
        self.assertNotIn("runtime error", self.read("d.log"))

    def test_a_valid_token_for_another_job_is_refused(self):
        tok = self.token("job.token", "s3cret")
        port = free_port()
        host = self.agent("h", "-q", "--nodes", "2", "--node-rank", "0", "--gpus-per-node", "1",
                          "--rdzv-endpoint", f"127.0.0.1:{port}", "--run-id", "mine",
                          "--token-file", tok, "--join-timeout", "30", "--", "true")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        c = self.client(port)
        r = c.hello("control", "other", "s3cret")
        self.assertEqual(r["error"]["code"], "auth_failed")
        c = self.client(port)
        self.assertEqual(c.hello("control", "mine", "s3cret")["type"], "auth_ok")
        host.kill()

    def test_run_id_dot_dot_is_refused(self):
        sub = os.path.join(self.dir, "sub")
        os.mkdir(sub)
        p = subprocess.run([dltest.DLAUNCH, "--run-id", "..", "--", "true"], cwd=sub,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.dir, "attempt_0")))
        self.assertFalse(os.path.exists(os.path.join(sub, "attempt_0")))


def as_nobody(*cmd, cwd="/"):
    """Runs cmd as the other user; returns the CompletedProcess (checked)."""
    return subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                           "--", *cmd], cwd=cwd, check=True, capture_output=True, text=True,
                          timeout=30)


class SharedStorage(Base):
    """Issue #32, 5: the log folder on storage other users can write. Its files are never opened
    through a link, a FIFO never blocks the agent, another user's folder is refused, and what a
    worker wrote reaches the summary without control characters."""

    def run_job(self, *args, timeout=40):
        """dlaunch with one worker, no restart; (exit code or None if it had to be killed,
        stderr)."""
        p = self.agent("job", "--gpus-per-node", "1", "--max-restarts", "0", "--run-id", "job",
                       *args)
        try:
            code = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            code = None
        return code, self.read("job.log")

    @unittest.skipUnless(os.geteuid() == 0, "needs root to run the other user as nobody")
    def test_another_users_log_folder_is_refused(self):
        os.chmod(self.dir, 0o755)
        shared = os.path.join(self.dir, "shared")
        os.mkdir(shared)
        os.chmod(shared, 0o1777)
        victim = self.write("victim", "root's own file\n")
        before = self.read("victim")
        # The other user lays out the folder the job will use before it starts.
        attempt = os.path.join(shared, "logs", "job", "attempt_0")
        as_nobody("mkdir", "-p", attempt)
        as_nobody("ln", "-s", victim, os.path.join(attempt, "rank_0.out"))
        as_nobody("mkfifo", os.path.join(attempt, "rank_0.err"))
        as_nobody("mkfifo", os.path.join(attempt, "rank_0.error.json"))
        code, log = self.run_job("--log-dir", os.path.join(shared, "logs"), "--",
                                 "sh", "-c", "echo SECRET; exit 1")
        self.assertEqual(self.read("victim"), before)
        self.assertEqual(code, 2, log)
        self.assertIn("not safe to write: it belongs to another user", log)

    def test_a_fifo_and_a_link_in_the_log_folder_do_not_block_or_redirect(self):
        victim = self.write("victim", "the user's own file\n")
        before = self.read("victim")
        # The worker (or anyone as its user) leaves a FIFO as its error file and a link in place
        # of its stderr log: the agent must neither block on the one nor show what the other
        # points to (a file only the agent's user may read).
        os.chmod(victim, 0o600)
        cmd = ('mkfifo "$TORCHELASTIC_ERROR_FILE"; rm "$DLAUNCH_ATTEMPT_DIR/rank_0.err"; '
               f'ln -s {victim} "$DLAUNCH_ATTEMPT_DIR/rank_0.err"; exit 3')
        code, log = self.run_job("--", "sh", "-c", cmd)
        self.assertEqual(code, 1, log)
        self.assertIn("exited with code 3", log)
        self.assertNotIn("the user's own file", log)
        self.assertIn("cannot read it: it is a symbolic link", log)
        self.assertEqual(self.read("victim"), before)

    def test_what_a_worker_wrote_reaches_the_summary_without_control_characters(self):
        err = {"message": {"message": "boom\x1b]0;title\x07\x1b[2J\nFAKE: line",
                           "extraInfo": {"py_callstack": "Traceback\n  \x1b[31mred\x1b[0m\n"}}}
        errfile = self.write("err.json", json.dumps(err))
        for cmd in (f'cp {errfile} "$TORCHELASTIC_ERROR_FILE"; exit 1',
                    "printf 'tail \\033[2J\\033]0;x\\007 end\\n' >&2; exit 1"):
            code, log = self.run_job("-q", "--", "sh", "-c", cmd)
            self.assertEqual(code, 1, log)
            summary = log[log.index("the job failed"):]
            self.assertNotIn("\x1b", summary)
            self.assertNotIn("\x07", summary)
            self.assertFalse([l for l in summary.split("\n") if l.startswith("FAKE")], summary)
            self.assertTrue("boom" in summary or "tail" in summary, summary)

    def test_the_trainers_checksums_file_is_never_a_link_or_a_fifo(self):
        import test_train
        victim = self.write("victim", "keep\n")
        for kind in ("link", "fifo"):
            folder = os.path.join(self.dir, kind)
            os.mkdir(folder)
            path = os.path.join(folder, "rank_0.checksums")
            if kind == "link":
                os.symlink(victim, path)
            else:
                os.mkfifo(path)
            env = {k: v for k, v in os.environ.items() if not k.startswith("DLAUNCH_")}
            env.update(RANK="0", WORLD_SIZE="1", DLAUNCH_ATTEMPT_DIR=folder)
            try:
                p = subprocess.run([test_train.TRAINER], env=env, capture_output=True, text=True,
                                   timeout=20)
            except subprocess.TimeoutExpired:
                self.fail(f"the trainer blocked on a {kind} in place of its checksums file")
            self.assertNotEqual(p.returncode, 0)
            self.assertIn("rank_0.checksums", p.stderr)
            self.assertEqual(self.read("victim"), "keep\n")


class Credentials(Base):
    """Issue #32, 7: the token file and the folders the agent keeps keys in."""

    def shared(self):
        """A folder every user may write, as /tmp is."""
        os.chmod(self.dir, 0o755)
        path = os.path.join(self.dir, "shared")
        os.makedirs(path, exist_ok=True)
        os.chmod(path, 0o1777)
        return path

    def test_a_fifo_token_file_is_refused_without_blocking(self):
        fifo = os.path.join(self.dir, "token")
        os.mkfifo(fifo, 0o600)
        p = self.run_cmd("--gpus-per-node", "1", "--token-file", fifo, "--", "true", timeout=20)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("not a regular file", p.stderr)

    @unittest.skipUnless(os.geteuid() == 0, "needs root to run the other user as nobody")
    def test_another_users_token_file_is_refused(self):
        path = os.path.join(self.shared(), "token")
        as_nobody("sh", "-c", f"umask 077; echo chosen-by-nobody > {path}")
        p = self.run_cmd("--gpus-per-node", "1", "--token-file", path, "--", "true", timeout=20)
        self.assertNotEqual(p.returncode, 0, p.stderr)
        self.assertIn("belongs to uid", p.stderr)

    @unittest.skipUnless(os.geteuid() == 0, "needs root to run the other user as nobody")
    def test_another_users_slurm_token_folder_is_refused(self):
        submit = self.shared()
        # The other user lays out the submit folder's .dlaunch with a token it knows.
        as_nobody("sh", "-c", f"umask 077; mkdir {submit}/.dlaunch && "
                              f"echo known > {submit}/.dlaunch/job-4343.token")
        env = {"SLURM_JOB_ID": "4343", "SLURM_STEP_ID": "0", "SLURM_JOB_NUM_NODES": "1",
               "SLURM_NNODES": "1", "SLURM_JOB_NODELIST": "localhost",
               "SLURM_NODELIST": "localhost", "SLURM_NODEID": "0", "SLURM_PROCID": "0",
               "SLURM_LOCALID": "0", "SLURM_SUBMIT_DIR": submit}
        p = self.run_cmd("--gpus-per-node", "1", "--", "true", env=env, timeout=30)
        self.assertNotEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn(".dlaunch' is not a folder of this user closed to others", p.stderr)

    @unittest.skipUnless(os.geteuid() == 0, "needs root to run the other user as nobody")
    def test_a_key_folder_made_by_another_user_gets_a_fresh_one(self):
        tmp = self.shared()
        as_nobody("mkdir", "-m", "700", os.path.join(tmp, f"dlaunch-{os.geteuid()}"))
        token = self.token("tok", "s3cret-master")
        out = os.path.join(self.dir, "keyfile")
        p = self.run_cmd("--gpus-per-node", "1", "--token-file", token, "--",
                         "sh", "-c", f'echo "$DLAUNCH_TOKEN_FILE" > {out}',
                         env={"TMPDIR": tmp, "XDG_RUNTIME_DIR": ""}, timeout=30)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("is not a folder of ours closed to others", p.stderr)
        used = self.read("keyfile").strip()
        self.assertTrue(used.startswith(os.path.join(tmp, f"dlaunch-{os.geteuid()}.")), used)
        # The agent's own folder of a random name goes with the job.
        self.assertFalse(os.path.exists(os.path.dirname(used)))

    @unittest.skipUnless(os.geteuid() == 0, "needs root to run the agent as nobody")
    def test_a_worker_cannot_read_its_agents_token(self):
        home = os.path.join(self.shared(), "home")
        as_nobody("mkdir", home)
        out = os.path.join(home, "seen")
        env = {k: v for k, v in os.environ.items() if not k.startswith("DLAUNCH_")}
        env.update(DLAUNCH_TOKEN="the-master-token-123", TMPDIR=home, XDG_RUNTIME_DIR="")
        cmd = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--",
               dltest.DLAUNCH, "-q", "--gpus-per-node", "1", "--", "sh", "-c",
               f"cat /proc/$PPID/environ > {out} 2>&1; grep -a -c . /proc/$PPID/mem >> {out} "
               f"2>&1; true"]
        p = subprocess.run(cmd, cwd=home, env=env, capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        with open(out, "rb") as f:
            seen = f.read()
        self.assertNotIn(b"the-master-token-123", seen)
        self.assertIn(b"Permission denied", seen)


class Modes(Base):
    """Issue #32, 7: under the default umask (022) logs, events and checkpoints were readable by
    every local user."""

    def test_logs_and_checkpoints_are_not_world_readable(self):
        import test_train
        old = os.umask(0o022)
        try:
            # The bundled trainer with its checkpoints where the data set is installed.
            cmd = ([test_train.TRAINER, "--set", "steps=2", "--set", "checkpoint_every=1",
                    "--set", "checkpoint_dir=ck", "--set", "batch_size=8"]
                   if test_train.have_fashion() else ["sh", "-c", "echo trained"])
            p = self.run_cmd("-q", "--gpus-per-node", "1", "--run-id", "m", "--events",
                             "ev.jsonl", "--", *cmd, timeout=120)
        finally:
            os.umask(old)
        self.assertEqual(p.returncode, 0, p.stderr)
        paths = [os.path.join(self.dir, "dlaunch_logs", "m"),
                 os.path.join(self.dir, "dlaunch_logs", "m", "attempt_0"),
                 os.path.join(self.dir, "dlaunch_logs", "m", "attempt_0", "rank_0.out"),
                 os.path.join(self.dir, "dlaunch_logs", "m", "attempt_0", "rank_0.err"),
                 os.path.join(self.dir, "ev.jsonl")]
        ck = os.path.join(self.dir, "ck")
        if os.path.isdir(ck):
            paths += [ck] + [os.path.join(ck, f) for f in os.listdir(ck)]
            self.assertTrue(os.listdir(ck))
        for path in paths:
            mode = stat.S_IMODE(os.stat(path).st_mode)
            self.assertEqual(mode & 0o007, 0, f"{path}: {mode:04o}")


class HttpSide(Base):
    """Issue #32, 1: without a token, the HTTP side is its user's alone, as the rendezvous
    port is, and a page rebinding its name to 127.0.0.1 cannot read it."""

    def http_daemon(self):
        import test_http
        log = os.path.join(self.dir, "dh.log")
        d, _ = dltest.start_dlaunchd(log, "--http", "127.0.0.1:0")
        self.procs.append(d)
        return test_http.http_port(log)

    def test_no_token_in_clear_off_loopback(self):
        """Issue #32, 4: the bearer token went in clear to --http 0.0.0.0 with every scrape."""
        token = self.token("tok", "s3cret-master")
        p = subprocess.run([dltest.DLAUNCHD, "--listen", "127.0.0.1:0", "--token-file", token,
                            "--http", "0.0.0.0:0"], capture_output=True, text=True, timeout=30)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("only loopback is served", p.stderr)
        self.assertIn("TLS reverse proxy", p.stderr)

    @unittest.skipUnless(os.geteuid() == 0, "needs root to run the other user as nobody")
    def test_another_user_cannot_read_http_without_a_token(self):
        port = self.http_daemon()
        code = ("import sys, urllib.request, urllib.error\n"
                "try:\n"
                f"    r = urllib.request.urlopen('http://127.0.0.1:{port}/api/jobs', timeout=10)\n"
                "    print(r.status)\n"
                "except urllib.error.HTTPError as e:\n"
                "    print(e.code)\n")
        p = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                            "--", "/usr/bin/python3", "-c", code], capture_output=True, text=True,
                           timeout=30, cwd="/")
        self.assertEqual(p.stdout.strip(), "403", p.stderr)
        import test_http
        self.assertEqual(test_http.get(f"http://127.0.0.1:{port}/api/jobs")[0], 200)

    @unittest.skipUnless(os.geteuid() == 0, "needs root to run the other user as nobody")
    def test_trickling_connections_of_another_user_leave_metrics_up(self):
        """Issue #32, 7: 70 connections trickling a request took all of libmicrohttpd's 64."""
        import test_http
        port = self.http_daemon()
        code = ("import socket, sys, time\n"
                "socks = []\n"
                "for _ in range(70):\n"
                "    try:\n"
                "        s = socket.create_connection(('127.0.0.1', %d))\n"
                "        s.sendall(b'GET /metrics HTTP/1.1\\r\\n')\n"
                "        socks.append(s)\n"
                "    except OSError:\n"
                "        pass\n"
                "print('held', flush=True)\n"
                "time.sleep(30)\n" % port)
        hog = subprocess.Popen(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                                "--", "/usr/bin/python3", "-c", code], stdout=subprocess.PIPE,
                               text=True, cwd="/")
        self.procs.append(hog)
        self.assertEqual(hog.stdout.readline().strip(), "held")
        try:
            status = test_http.get(f"http://127.0.0.1:{port}/metrics", timeout=5)[0]
        except OSError as e:
            status = repr(e)
        self.assertEqual(status, 200)

    def test_a_rebound_host_name_is_refused(self):
        import test_http
        port = self.http_daemon()
        url = f"http://127.0.0.1:{port}/api/jobs"
        self.assertEqual(test_http.get(url, {"Host": "attacker.example"})[0], 403)
        self.assertEqual(test_http.get(url, {"Host": f"attacker.example:{port}"})[0], 403)
        for host in (f"localhost:{port}", f"127.0.0.1:{port}", "127.0.0.1", f"[::1]:{port}"):
            self.assertEqual(test_http.get(url, {"Host": host})[0], 200, host)


class ReadOnlyScrape(Base):
    """Issue #32, 4: Prometheus needed the master token to scrape (a job key got 401); a
    read-only credential reads the HTTP side and acts nowhere."""

    def test_a_read_only_credential_reads_and_never_acts(self):
        import test_http
        master = self.token("site.token", "site-secret")
        p = self.run_cmd("token", "--read-only", "--token-file", master)
        self.assertEqual(p.returncode, 0, p.stderr)
        scrape = p.stdout.strip()
        self.assertRegex(scrape, r"^dlaunch-scrape-v1:[0-9a-f]{64}$")
        self.assertNotIn("site-secret", scrape)
        log = os.path.join(self.dir, "dh.log")
        d, port = dltest.start_dlaunchd(log, "--token-file", master, "--http", "127.0.0.1:0")
        self.procs.append(d)
        hport = test_http.http_port(log)
        job = self.agent("a", "-q", "--rdzv-endpoint", f"127.0.0.1:{port}", "--run-id", "jobA",
                         "--gpus-per-node", "1", "--token-file", master, "--", "sleep", "30")
        self.wait_started(["a"])
        bearer = {"Authorization": f"Bearer {scrape}"}
        base = f"http://127.0.0.1:{hport}"
        status, _, body = test_http.get(f"{base}/metrics", bearer)
        self.assertEqual(status, 200, body)
        self.assertIn("dlaunch_", body)
        self.assertEqual(test_http.get(f"{base}/api/jobs/jobA", bearer)[0], 200)
        self.assertEqual(test_http.get(f"{base}/", bearer)[0], 200)
        # Acting over HTTP: refused, and said why.
        for method in ("POST", "PUT", "DELETE"):
            req = urllib.request.Request(f"{base}/api/jobs/jobA/stop", data=b"{}",
                                         headers=bearer, method=method)
            try:
                code = urllib.request.urlopen(req, timeout=10).status
            except urllib.error.HTTPError as e:
                code = e.code
            self.assertEqual(code, 403, method)
        # A forged or another master's credential reads nothing.
        forged = "dlaunch-scrape-v1:" + "0" * 64
        self.assertEqual(test_http.get(f"{base}/metrics",
                                       {"Authorization": f"Bearer {forged}"})[0], 401)
        # Over the rendezvous port it cannot act either: not as control through dlaunch ...
        ep = ["--endpoint", f"127.0.0.1:{port}"]
        for cmd in (["stop", *ep, "jobA"], ["restart", *ep, "jobA"], ["status", *ep, "jobA"]):
            p = self.run_cmd(*cmd, env={"DLAUNCH_TOKEN": scrape})
            self.assertEqual(p.returncode, 4, (cmd, p.stderr))
        p = self.run_cmd("kv", "set", "k", "v", env={
            "DLAUNCH_TOKEN": scrape, "DLAUNCH_STORE": f"127.0.0.1:{port}",
            "TORCHELASTIC_RUN_ID": "jobA"})
        self.assertNotIn(p.returncode, (0, 2), p.stderr)
        # ... nor by hand, proving the credential's bytes in any role.
        for role in ("control", "agent", "worker"):
            c = self.client(port)
            key = bytes.fromhex(scrape.split(":")[1])
            c.send({"v": 1, "type": "hello", "id": 0, "role": role, "run_id": "jobA",
                    "proto": 1})
            reply = c.recv()
            self.assertEqual(reply["type"], "challenge")
            proof = hmac.new(key, (reply["nonce"] + "jobA" + role).encode(),
                             hashlib.sha256).hexdigest()
            c.send({"v": 1, "type": "auth", "id": 1, "proof": proof})
            reply = c.recv()
            self.assertEqual(reply["type"], "error", role)
            self.assertEqual(reply["error"]["code"], "auth_failed", role)
        self.assertIsNone(job.poll(), self.read("a.log"))
        p = self.run_cmd("stop", *ep, "--token-file", master, "jobA")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(job.wait(timeout=60), 0, self.read("a.log"))


if __name__ == "__main__":
    dltest.main()
