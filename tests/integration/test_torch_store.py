"""The workers' torch store lives in the agent (TORCHELASTIC_USE_AGENT_STORE=True, as torchrun
since 2.4): real PyTorch clients (Debian's python3-torch) against the agent that hosts the
rendezvous, speaking torch's own TCPStore protocol (docs/store.md)."""
import functools
import json
import os
import re
import socket
import struct
import subprocess
import time
import unittest
import urllib.request

import dltest

TORCH_PYTHON = "/usr/bin/python3"

# An unmodified DDP script whose rank 0 is done right after the first barrier, while the other
# ranks go on using the job's store for seconds. With the store inside rank 0 they lose it.
EARLY_EXIT = """
import os, sys, time
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
model = DDP(torch.nn.Linear(4, 1))
model(torch.ones(2, 4)).sum().backward()
dist.barrier()
if rank == 0:
    print("rank 0 returns", flush=True)
    sys.exit(0)
store = dist.distributed_c10d._get_default_store()
n, deadline = 0, time.monotonic() + 3
while time.monotonic() < deadline:
    store.set(f"step{rank}", str(n))
    store.add("steps", 1)
    assert store.get(f"step{rank}") == str(n).encode()
    n += 1
    time.sleep(0.02)
store.add("done", 1)
others = dist.get_world_size() - 1
while int(store.add("done", 0)) < others:
    time.sleep(0.02)
print(f"rank {rank} used the store after rank 0 left: {n} steps, agent store "
      f"{os.environ['TORCHELASTIC_USE_AGENT_STORE']}", flush=True)
"""

# Attempt 0 leaves keys (through torch's /worker/attempt_0 prefix and raw ones), then a worker
# is killed; attempt 1 looks for them.
RESTART = """
import os, signal, time
from datetime import timedelta
import torch.distributed as dist

attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
dist.init_process_group("gloo")
rank = dist.get_rank()
store = dist.distributed_c10d._get_default_store()
raw = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), None, False,
                    timedelta(seconds=30), wait_for_workers=False)
if attempt == 0:
    store.set(f"secret{rank}", "old")
    raw.set(f"raw{rank}", "old")
    assert store.get(f"secret{rank}") == b"old"
    dist.barrier()
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(120)
old = dist.PrefixStore("/worker/attempt_0", raw)
seen = [old.delete_key(f"secret{r}") or raw.delete_key(f"raw{r}") for r in range(3)]
store.set(f"secret{rank}", "new")
dist.barrier()
print(f"attempt {attempt} rank {rank} sees old keys: {any(seen)}; "
      f"new: {store.get(f'secret{rank}').decode()}", flush=True)
"""

# Every query type torch 1.13's client sends, through torch.distributed.TCPStore with
# is_master=False, and the newer clients' framing (validation first, the queries numbered one
# higher, and those 1.13 lacks) written out byte by byte, as torch >= 2.1 sends it.
QUERIES = r"""
import os, socket, struct, threading, time
from datetime import timedelta
import torch.distributed as dist

addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
assert os.environ["TORCHELASTIC_USE_AGENT_STORE"] == "True"
s = dist.TCPStore(addr, port, None, False, timedelta(seconds=10), wait_for_workers=False)
s.set("a", "1")
assert s.get("a") == b"1"
assert s.add("n", 5) == 5 and s.add("n", -2) == 3
assert s.compare_set("a", "1", "2") == b"2"
assert s.compare_set("a", "9", "3") == b"2"
assert s.compare_set("fresh", "", "x") == b"x"
assert s.compare_set("absent", "e", "x") == b"e"
before = s.num_keys()
s.set("b", "")
assert s.num_keys() == before + 1, (before, s.num_keys())
assert s.delete_key("b") is True and s.delete_key("b") is False
assert s.num_keys() == before
s.wait(["a", "n"])
def later():
    time.sleep(0.5)
    dist.TCPStore(addr, port, None, False, timedelta(seconds=10),
                  wait_for_workers=False).set("late", "y")
threading.Thread(target=later).start()
t0 = time.monotonic()
s.wait(["late"])
assert time.monotonic() - t0 >= 0.3
s.set_timeout(timedelta(seconds=1))
try:
    s.wait(["never"])
    raise SystemExit("wait on a missing key returned")
except RuntimeError:
    pass
print("v1 client: set get add compare_set num_keys delete_key wait ok", flush=True)

def conn():
    c = socket.create_connection((addr, port), timeout=60)  # a missing answer fails, not hangs
    c.sendall(b"\x00" + struct.pack("<I", 0x3C85F7CE))
    return c
def recv(c, n):
    b = b""
    while len(b) < n:
        d = c.recv(n - len(b))
        if not d:
            raise EOFError(f"closed after {len(b)} of {n} bytes")
        b += d
    return b
def s8(x): return struct.pack("<Q", len(x)) + x
def vec(c): return recv(c, struct.unpack("<Q", recv(c, 8))[0])
def i64(c): return struct.unpack("<q", recv(c, 8))[0]
SET, CAS, GET, ADD, CHECK, WAIT, NUMKEYS, DELETE, APPEND, MGET, MSET, CANCEL, PING = range(1, 14)
c = conn()
c.sendall(bytes([SET]) + s8(b"k") + s8(b"v1"))
c.sendall(bytes([GET]) + s8(b"k")); assert vec(c) == b"v1"
c.sendall(bytes([ADD]) + s8(b"cnt") + struct.pack("<q", 7)); assert i64(c) == 7
c.sendall(bytes([CAS]) + s8(b"k") + s8(b"v1") + s8(b"v2")); assert vec(c) == b"v2"
c.sendall(bytes([APPEND]) + s8(b"k") + s8(b"+x"))
c.sendall(bytes([GET]) + s8(b"k")); assert vec(c) == b"v2+x"
c.sendall(bytes([CHECK]) + struct.pack("<Q", 2) + s8(b"k") + s8(b"cnt")); assert recv(c, 1) == b"\0"
c.sendall(bytes([CHECK]) + struct.pack("<Q", 1) + s8(b"nope")); assert recv(c, 1) == b"\1"
c.sendall(bytes([MSET]) + struct.pack("<Q", 2) + s8(b"m1") + s8(b"x") + s8(b"m2") + s8(b"yy"))
c.sendall(bytes([MGET]) + struct.pack("<Q", 2) + s8(b"m2") + s8(b"m1"))
assert vec(c) == b"yy" and vec(c) == b"x"
c.sendall(bytes([NUMKEYS])); n = i64(c); assert n >= 4, n
c.sendall(bytes([DELETE]) + s8(b"m1")); assert i64(c) == 1
c.sendall(bytes([NUMKEYS])); assert i64(c) == n - 1
c.sendall(bytes([PING]) + struct.pack("<I", 0xC0FFEE)); assert recv(c, 4) == struct.pack("<I", 0xC0FFEE)
c.sendall(bytes([WAIT]) + struct.pack("<Q", 1) + s8(b"w"))
d = conn(); d.sendall(bytes([SET]) + s8(b"w") + s8(b"1"))
assert recv(c, 1) == b"\0"                      # STOP_WAITING once another client set it
c.sendall(bytes([WAIT]) + struct.pack("<Q", 1) + s8(b"w2"))
time.sleep(0.2)
c.sendall(bytes([CANCEL])); assert recv(c, 1) == b"\1"  # WAIT_CANCELED
d.sendall(bytes([SET]) + s8(b"w2") + s8(b"1"))
c.sendall(bytes([PING]) + struct.pack("<I", 5)); assert recv(c, 4) == struct.pack("<I", 5)
print("v2 client: validate set get add compare_set append check multi_set multi_get num_keys "
      "delete_key ping wait cancel_wait ok", flush=True)

# The queues of torch's newest (libuv) server. Debian's torch 1.13 has no client for them, so
# the frames are written here as TCPStore.cpp sends them: QUEUE_PUSH key value (no answer),
# QUEUE_POP key (the length before the pop, then the item when there was one), QUEUE_LEN key.
QPUSH, QPOP, QLEN = 14, 15, 16
def readable(x, t):
    import select
    return bool(select.select([x], [], [], t)[0])
c.sendall(bytes([QLEN]) + s8(b"q")); assert i64(c) == 0
c.sendall(bytes([QPUSH]) + s8(b"q") + s8(b"first") + bytes([QPUSH]) + s8(b"q") + s8(b""))
c.sendall(bytes([QLEN]) + s8(b"q")); assert i64(c) == 2
c.sendall(bytes([CHECK]) + struct.pack("<Q", 1) + s8(b"q")); assert recv(c, 1) == b"\0"
c.sendall(bytes([WAIT]) + struct.pack("<Q", 1) + s8(b"q")); assert recv(c, 1) == b"\0"
c.sendall(bytes([QPOP]) + s8(b"q")); assert i64(c) == 2 and vec(c) == b"first"
c.sendall(bytes([QPOP]) + s8(b"q")); assert i64(c) == 1 and vec(c) == b""
c.sendall(bytes([QPOP]) + s8(b"q")); assert i64(c) == 0     # empty: no item follows
c.sendall(bytes([GET]) + s8(b"k")); assert vec(c) == b"v2+x"
# A blocking pop is a WAIT on the queue's name, then a pop; one push wakes one waiter.
e = conn()
c.sendall(bytes([WAIT]) + struct.pack("<Q", 1) + s8(b"jobs"))
e.sendall(bytes([WAIT]) + struct.pack("<Q", 1) + s8(b"jobs"))
time.sleep(0.3)
assert not readable(c, 0) and not readable(e, 0)
# Which of the two the server saw first depends on how its loop read the two sockets: either
# may be woken, but only one.
d.sendall(bytes([QPUSH]) + s8(b"jobs") + s8(b"j1"))
import select
woken = select.select([c, e], [], [], 60)[0]
assert len(woken) == 1, woken
first = woken[0]
other = e if first is c else c
assert recv(first, 1) == b"\0"
assert not readable(other, 0.5)
first.sendall(bytes([QPOP]) + s8(b"jobs")); assert i64(first) == 1 and vec(first) == b"j1"
d.sendall(bytes([QPUSH]) + s8(b"jobs") + s8(b"j2"))
assert recv(other, 1) == b"\0"
other.sendall(bytes([QPOP]) + s8(b"jobs")); assert i64(other) == 1 and vec(other) == b"j2"
other.sendall(bytes([QLEN]) + s8(b"jobs")); assert i64(other) == 0
print("v2 client: queue_push queue_pop queue_len, a push waking one waiter ok", flush=True)

# torch 1.13's WATCH_KEY (its C++ watchKey; its Python API lacks it): a connection in the old
# numbering registers, and then hears of every change the real 1.13 client makes to the key.
w = socket.create_connection((addr, port), timeout=60)
w.sendall(bytes([7]) + s8(b"/wk")); assert recv(w, 1) == b"\3"  # KEY_CALLBACK_REGISTERED
def change(x):
    kind = recv(x, 1)[0]
    return kind, vec(x), vec(x), vec(x)
s.set("wk", "v1"); assert change(w) == (1, b"/wk", b"", b"v1")        # KEY_CREATED
s.set("wk", "v2"); assert change(w) == (0, b"/wk", b"v1", b"v2")      # KEY_UPDATED
assert s.compare_set("wk", "v2", "v3") == b"v3"
assert change(w) == (0, b"/wk", b"v2", b"v3")
assert s.delete_key("wk"); assert change(w) == (2, b"/wk", b"v3", b"")  # KEY_DELETED
assert s.add("wk", 4) == 4; assert change(w) == (1, b"/wk", b"", b"4")
s.set("other", "x"); assert not readable(w, 0.3)
print("v1 client: watch_key hears set compare_set delete_key add ok", flush=True)

# Bad input closes that connection alone.
bad = conn(); bad.sendall(bytes([99]))
assert bad.recv(1) == b""
big = conn(); big.sendall(bytes([SET]) + struct.pack("<Q", 1 << 40))
assert big.recv(1) == b""
c.sendall(bytes([GET]) + s8(b"k")); assert vec(c) == b"v2+x"
print("bad queries closed their own connections only", flush=True)
"""


# Two ranks hold torch store connections, two keys and one pending wait until told to go.
HOLD = """
import os, time
from datetime import timedelta
import torch.distributed as dist

s = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), None, False,
                  timedelta(seconds=120), wait_for_workers=False)
s.set(f"held{os.environ['RANK']}", "0123456789")
if os.environ["RANK"] == "0":
    s.wait(["go"])
else:
    while not os.path.exists("go"):
        time.sleep(0.05)
    s.set("go", "1")
"""


# Tells the test where the store is, then holds the job until told to go.
PORT_THEN_WAIT = """
import os, time
with open("port.tmp", "w") as f:
    f.write(os.environ["MASTER_PORT"])
os.rename("port.tmp", "port")
while not os.path.exists("go"):
    time.sleep(0.05)
"""


def local_non_loopback_ipv4():
    """An address of this machine outside 127/8 (the default route's source), or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))
            addr = s.getsockname()[0]
        except OSError:
            return None
    return None if addr.startswith("127.") else addr


# Once a process: each look imports torch (about 2 s of CPU), and every class asks.
@functools.cache
def have_torch():
    try:
        return subprocess.run([TORCH_PYTHON, "-c", "import torch.distributed"],
                              capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@unittest.skipUnless(have_torch(), "python3-torch is not installed")
class TorchStore(dltest.Case):
    def test_rank0_returning_first_leaves_the_store_to_the_others(self):
        script = self.write("early.py", EARLY_EXIT)
        p = self.dlaunch("--nproc-per-node", "3", "--max-restarts", "0", "--", TORCH_PYTHON,
                         script, timeout=300, check_code=0)
        self.assertIn("rank 0 returns", p.stdout)
        for rank in (1, 2):
            self.assertRegex(p.stdout, rf"rank {rank} used the store after rank 0 left: "
                                       rf"[1-9]\d* steps, agent store True")
        # The old way, rank 0 hosting the store, is still there when asked for, and this is
        # what it does to such a script.
        old = self.dlaunch("--nproc-per-node", "3", "--max-restarts", "0", "--rdzv-conf",
                           "store=worker", "--", TORCH_PYTHON, script, timeout=300)
        self.assertNotEqual(old.returncode, 0, old.stdout + old.stderr)
        self.assertNotIn("used the store after rank 0 left", old.stdout)

    def test_a_restarted_attempt_sees_none_of_the_old_keys(self):
        script = self.write("restart.py", RESTART)
        p = self.dlaunch("--nproc-per-node", "3", "--max-restarts", "1", "--", TORCH_PYTHON,
                         script, timeout=300, check_code=0)
        for rank in range(3):
            self.assertIn(f"attempt 1 rank {rank} sees old keys: False; new: new", p.stdout)

    def test_every_query_type_round_trips(self):
        script = self.write("queries.py", QUERIES)
        p = self.dlaunch("--nproc-per-node", "1", "--", TORCH_PYTHON, script, timeout=240,
                         check_code=0)
        self.assertIn("v1 client: set get add compare_set num_keys delete_key wait ok",
                      p.stdout)
        self.assertIn("cancel_wait ok", p.stdout)
        self.assertIn("a push waking one waiter ok", p.stdout)
        self.assertIn("watch_key hears set compare_set delete_key add ok", p.stdout)
        self.assertIn("bad queries closed their own connections only", p.stdout)
        # One line each in the agent's log, naming why.
        self.assertRegex(p.stderr, r"torch store: closing the connection from 127\.0\.0\.1:"
                                   r"\d+: unknown query type 99")
        self.assertRegex(p.stderr, r"torch store: closing the connection from 127\.0\.0\.1:"
                                   r"\d+: key of 1099511627776 bytes is outside 1\.\.4096")

    def test_status_shows_the_store_and_its_torch_clients(self):
        endpoint = f"127.0.0.1:{dltest.free_port()}"
        script = self.write("hold.py", HOLD)
        job = self.start("-q", "--nproc-per-node", "2", "--rdzv-endpoint", endpoint, "--run-id",
                         "held", "--", TORCH_PYTHON, script)
        try:
            deadline, st = time.monotonic() + 120, {}
            while time.monotonic() < deadline:
                p = self.dlaunch("status", "--json", "--endpoint", endpoint, "held")
                st = json.loads(p.stdout) if p.returncode == 0 else {}
                if st.get("store_waits") == 1 and st.get("keys") == 3:
                    break
                time.sleep(0.2)
            # Keys as torch 1.13's client names them: "/held0", "/held1" with 10 bytes each,
            # and "/go", held for its wait (counted, as every key a wait holds). Each of torch
            # 1.13's clients opens two connections (the second for its callbacks).
            self.assertEqual((st.get("keys"), st.get("store_bytes"), st.get("store_waits"),
                              st.get("store_clients")), (3, 2 * (6 + 10) + 3, 1, 4), st)
            p = self.dlaunch("status", "--endpoint", endpoint, "held", check_code=0)
            self.assertIn("  store: 3 keys, 35 bytes, 1 wait, 4 torch clients\n", p.stdout)
            self.write("go", "")
            job.communicate(timeout=120)
        finally:
            if job.poll() is None:
                job.kill()
                job.communicate()
        self.assertEqual(job.returncode, 0)

    def test_only_loopback_and_the_jobs_nodes_may_connect(self):
        source = local_non_loopback_ipv4()
        if source is None:
            self.skipTest("this machine has no address outside 127/8")
        script = self.write("hold.py", PORT_THEN_WAIT)
        job = self.start("--nproc-per-node", "1", "--run-id", "fenced", "--", TORCH_PYTHON,
                         script)
        try:
            deadline = time.monotonic() + 120
            while not os.path.exists(os.path.join(self.dir, "port")):
                self.assertLess(time.monotonic(), deadline, "the worker never started")
                time.sleep(0.05)
            port = int(self.read("port"))
            hello = b"\x00" + struct.pack("<I", 0x3C85F7CE) + b"\x0d" + struct.pack("<I", 77)
            with socket.create_connection(("127.0.0.1", port), timeout=30) as ok:
                ok.sendall(hello)
                self.assertEqual(ok.recv(4), struct.pack("<I", 77))
            # The same store, reached from an address of this machine that is neither
            # loopback nor a node of the job: closed before a byte is read.
            with socket.socket() as out:
                out.settimeout(30)
                out.bind((source, 0))
                out.connect(("127.0.0.1", port))
                try:
                    out.sendall(hello)
                    self.assertEqual(out.recv(4), b"")
                except ConnectionResetError:
                    pass
            self.write("go", "")
            _, err = job.communicate(timeout=120)
        finally:
            if job.poll() is None:
                job.kill()
                job.communicate()
        self.assertEqual(job.returncode, 0, err)
        self.assertRegex(err, rf"torch store: closing the connection from {source}:\d+: not "
                              r"loopback and not a node of job 'fenced'")

    def test_two_nodes_reach_the_hosting_agents_store(self):
        port = dltest.free_port()
        script = self.write("early.py", EARLY_EXIT)
        common = ["--nnodes", "2", "--nproc-per-node", "2", "--rdzv-endpoint",
                  f"127.0.0.1:{port}", "--run-id", "two", "--max-restarts", "0",
                  "--join-timeout", "120", "--", TORCH_PYTHON, script]
        cluster = dltest.Cluster(self, endpoint=False, run_id=None)  # common names them
        for i in range(2):
            cluster.agent("--node-rank", str(i), *common, name=f"node{i}")
        codes = cluster.wait_all(timeout=300)
        out = cluster.log("node0") + cluster.log("node1")
        self.assertEqual(codes, [0, 0], out)
        # Ranks 2 and 3 run on node 1 and use node 0's agent store after rank 0 is gone.
        for rank in (1, 2, 3):
            self.assertRegex(out, rf"rank {rank} used the store after rank 0 left")


# Says what the agent told the workers about torch's store, and where it is.
SAY_STORE = """
import os
print("store", os.environ["TORCHELASTIC_USE_AGENT_STORE"], os.environ["MASTER_ADDR"],
      os.environ["MASTER_PORT"], flush=True)
"""

# Writes MASTER_PORT to a file named by its argument, then holds the job until that file's
# name with ".go" appears.
NAMED_PORT_THEN_WAIT = """
import os, sys, time
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(os.environ["MASTER_ADDR"] + " " + os.environ["MASTER_PORT"])
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
while not os.path.exists(sys.argv[1] + ".go"):
    time.sleep(0.05)
"""


@unittest.skipUnless(have_torch(), "python3-torch is not installed")
class TorchStoreInDlaunchd(dltest.Case):
    """No agent hosts the rendezvous: dlaunchd serves each job's torch store on a port of its
    own (docs/store.md, "Where it is")."""

    def setUp(self):
        super().setUp()
        self.daemon, self.port = dltest.start_dlaunchd(os.path.join(self.dir, "d.log"),
                                                       "--http", "127.0.0.1:0")
        self.endpoint = f"127.0.0.1:{self.port}"

    def tearDown(self):
        self.daemon.terminate()
        self.daemon.wait(timeout=60)
        super().tearDown()

    def served_port(self, run_id):
        m = re.search(rf"\[dlaunchd {run_id}\] serving the job's torch store on \S+:(\d+)",
                      self.read("d.log"))
        return int(m.group(1)) if m else None

    def test_rank0_returning_first_leaves_the_store_to_the_others(self):
        script = self.write("early.py", EARLY_EXIT)
        p = self.dlaunch("--nproc-per-node", "3", "--max-restarts", "0", "--rdzv-endpoint",
                         self.endpoint, "--run-id", "early", "--", TORCH_PYTHON, script,
                         timeout=300, check_code=0)
        self.assertIn("rank 0 returns", p.stdout)
        for rank in (1, 2):
            self.assertRegex(p.stdout, rf"rank {rank} used the store after rank 0 left: "
                                       rf"[1-9]\d* steps, agent store True")
        port = self.served_port("early")
        self.assertIsNotNone(port, self.read("d.log"))
        self.assertNotEqual(port, self.port)

    def test_workers_are_pointed_at_it_and_store_worker_keeps_the_old_way(self):
        script = self.write("say.py", SAY_STORE)
        p = self.dlaunch("--nproc-per-node", "1", "--rdzv-endpoint", self.endpoint, "--run-id",
                         "ours", "--", TORCH_PYTHON, script, timeout=120, check_code=0)
        self.assertIn(f"store True 127.0.0.1 {self.served_port('ours')}", p.stdout)
        # The job's journal names it as the round's MASTER too.
        evs = self.dlaunch("events", "--endpoint", self.endpoint, "ours", timeout=60,
                           check_code=0)
        rdzv = [json.loads(l) for l in evs.stdout.splitlines() if '"rendezvous"' in l]
        self.assertEqual([(e["master_addr"], e["master_port"]) for e in rdzv],
                         [("127.0.0.1", self.served_port("ours"))], evs.stdout)
        old = self.dlaunch("--nproc-per-node", "1", "--rdzv-endpoint", self.endpoint,
                           "--run-id", "old", "--rdzv-conf", "store=worker", "--", TORCH_PYTHON,
                           script, timeout=120, check_code=0)
        m = re.search(r"store False 127\.0\.0\.1 (\d+)", old.stdout)
        self.assertIsNotNone(m, old.stdout)
        self.assertIsNone(self.served_port("old"), self.read("d.log"))
        self.assertNotIn("serves no torch store", old.stderr)

    def test_a_restarted_attempt_sees_none_of_the_old_keys(self):
        script = self.write("restart.py", RESTART)
        p = self.dlaunch("--nproc-per-node", "3", "--max-restarts", "1", "--rdzv-endpoint",
                         self.endpoint, "--run-id", "again", "--", TORCH_PYTHON, script,
                         timeout=300, check_code=0)
        for rank in range(3):
            self.assertIn(f"attempt 1 rank {rank} sees old keys: False; new: new", p.stdout)

    def test_two_nodes_and_status_through_dlaunchd(self):
        script = self.write("hold.py", HOLD)
        common = ["-q", "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-endpoint",
                  self.endpoint, "--run-id", "held", "--", TORCH_PYTHON, script]
        jobs = [self.start(*common) for _ in range(2)]
        try:
            deadline, st = time.monotonic() + 120, {}
            while time.monotonic() < deadline:
                p = self.dlaunch("status", "--json", "--endpoint", self.endpoint, "held")
                st = json.loads(p.stdout) if p.returncode == 0 else {}
                if st.get("store_waits") == 1 and st.get("keys") == 3:
                    break
                time.sleep(0.2)
            # One store: the keys torch's clients set are the job's keys dlaunchd counts, and
            # its torch clients are those of ranks 0 and 1, on two nodes.
            self.assertEqual((st.get("keys"), st.get("store_bytes"), st.get("store_waits"),
                              st.get("store_clients")), (3, 2 * (6 + 10) + 3, 1, 4), st)
            p = self.dlaunch("status", "--endpoint", self.endpoint, "held", check_code=0)
            self.assertIn("  store: 3 keys, 35 bytes, 1 wait, 4 torch clients\n", p.stdout)
            page = re.search(r"http://(\S+)/", self.read("d.log")).group(1)
            with urllib.request.urlopen(f"http://{page}/", timeout=60) as r:
                self.assertIn("store: 3 keys, 35 bytes, 1 waits, 4 torch clients",
                              r.read().decode())
            self.write("go", "")
            outs = [j.communicate(timeout=120) for j in jobs]
        finally:
            for j in jobs:
                if j.poll() is None:
                    j.kill()
                    j.communicate()
        self.assertEqual([j.returncode for j in jobs], [0, 0], outs)
        # The job is over: its port is closed.
        with self.assertRaises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", self.served_port("held")), timeout=30).close()

    def test_only_loopback_and_the_jobs_own_agents_may_connect(self):
        source = local_non_loopback_ipv4()
        if source is None:
            self.skipTest("this machine has no address outside 127/8")
        # A dlaunchd others can reach needs a token; job "near" joins through loopback, job
        # "far" through the machine's other address.
        self.daemon.terminate()
        self.daemon.wait(timeout=60)
        token = self.write("token", "s3cret\n")
        os.chmod(token, 0o600)
        with open(os.path.join(self.dir, "d.log"), "w") as log:
            self.daemon = subprocess.Popen([dltest.DLAUNCHD, "--listen", "0.0.0.0:0",
                                            "--token-file", token],
                                           stdout=subprocess.DEVNULL, stderr=log)
        deadline = time.monotonic() + 30
        while not re.search(r"serving \S+:(\d+)", self.read("d.log")):
            self.assertLess(time.monotonic(), deadline, self.read("d.log"))
            time.sleep(0.05)
        self.port = int(re.search(r"serving \S+:(\d+)", self.read("d.log")).group(1))
        script = self.write("hold.py", NAMED_PORT_THEN_WAIT)
        jobs = [self.start("--nproc-per-node", "1", "--token-file", token, "--rdzv-endpoint",
                           f"{host}:{self.port}", "--run-id", name, "--", TORCH_PYTHON, script,
                           name) for name, host in (("near", "127.0.0.1"), ("far", source))]
        try:
            at = {}
            for name in ("near", "far"):
                deadline = time.monotonic() + 120
                while not os.path.exists(os.path.join(self.dir, name)):
                    self.assertLess(time.monotonic(), deadline, f"job {name} never started")
                    time.sleep(0.05)
                addr, port = self.read(name).split()
                at[name] = (addr, int(port))
            # Each job's MASTER_ADDR is the address its agent reached dlaunchd at.
            self.assertEqual((at["near"][0], at["far"][0]), ("127.0.0.1", source))
            hello = b"\x00" + struct.pack("<I", 0x3C85F7CE) + b"\x0d" + struct.pack("<I", 77)

            def ping(port):
                with socket.socket() as c:
                    c.settimeout(30)
                    c.bind((source, 0))
                    c.connect((source, port))
                    try:
                        c.sendall(hello)
                        return c.recv(4)
                    except ConnectionResetError:
                        return b""
            # From the address of job "far"'s agent: its own store answers, the other job's
            # closes before a byte is read.
            self.assertEqual(ping(at["far"][1]), struct.pack("<I", 77))
            self.assertEqual(ping(at["near"][1]), b"")
            for name in ("near", "far"):
                self.write(name + ".go", "")
            outs = [j.communicate(timeout=120) for j in jobs]
        finally:
            for j in jobs:
                if j.poll() is None:
                    j.kill()
                    j.communicate()
        self.assertEqual([j.returncode for j in jobs], [0, 0], outs)
        self.assertRegex(self.read("d.log"), rf"torch store: closing the connection from "
                                             rf"{source}:\d+: not loopback and not a node of "
                                             r"job 'near'")


if __name__ == "__main__":
    dltest.main()
