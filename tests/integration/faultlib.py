"""Faults made for real, for the fault tests and bench/faults: a job of the bundled trainer on two
agents (on loopback, or each in a network namespace of its own on one bridge), a clock on every
line and event each agent writes, and the injections: signals to workers and agents, link cuts
and silent drops (nftables in a node's namespace), a stopped host. Everything a run makes
(processes, namespaces, links, folders) goes when it closes, whatever happened."""
import gzip
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import tempfile
import time

import dltest

DLAUNCH = os.environ.get("DLAUNCH") or os.path.join(
    os.environ.get("BUILD_ROOT", "build"), "cmd", "dlaunch")
DLAUNCHD = os.path.join(os.path.dirname(DLAUNCH), "..", "daemon", "dlaunchd")
FASHION = "/usr/share/datasets/fashion-mnist"


def have_fashion():
    return os.path.exists(os.path.join(FASHION, "train-images-idx3-ubyte.gz"))


def can_netns():
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("nft") is None:
        return False
    name = f"dlfprobe{os.getpid()}"
    ok = subprocess.run(["ip", "netns", "add", name], capture_output=True).returncode == 0
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return ok


def write_subset(dst, n_train=4096, n_test=1000):
    """A slice of Fashion-MNIST as plain IDX files: real images, quick to load per rank."""
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        for kind, ndims, item in (("images", 3, 784), ("labels", 1, 1)):
            name = f"{prefix}-{kind}-idx{ndims}-ubyte"
            with gzip.open(os.path.join(FASHION, name + ".gz"), "rb") as f:
                head = f.read(4 + 4 * ndims)
                payload = f.read(n * item)
            dims = list(struct.unpack(f">{ndims}I", head[4:]))
            dims[0] = n
            with open(os.path.join(dst, name), "wb") as f:
                f.write(head[:4] + struct.pack(f">{ndims}I", *dims) + payload)


class Net:
    """Namespaces dlf<tag>0, dlf<tag>1 ... on a bridge of their own, at 10.79.<net>.1, .2 ..."""

    def __init__(self, n, net=None):
        self.tag = f"{os.getpid() % 100000}"
        self.net = net if net is not None else 100 + os.getpid() % 150
        self.bridge = f"dlfb{self.tag}"
        self.names = [f"dlf{self.tag}n{i}" for i in range(n)]
        self.addrs = [f"10.79.{self.net}.{i + 1}" for i in range(n)]
        self.made = []
        try:
            self._sh("ip", "link", "add", self.bridge, "type", "bridge")
            self.made.append(("link", self.bridge))
            self._sh("ip", "link", "set", self.bridge, "up")
            for i, ns in enumerate(self.names):
                self._sh("ip", "netns", "add", ns)
                self.made.append(("netns", ns))
                host, peer = f"dlfv{self.tag}{i}", f"dlfp{self.tag}{i}"
                self._sh("ip", "link", "add", host, "type", "veth", "peer", "name", peer)
                self.made.append(("link", host))
                self._sh("ip", "link", "set", host, "master", self.bridge, "up")
                self._sh("ip", "link", "set", peer, "netns", ns)
                self.ns(i, "ip", "link", "set", "lo", "up")
                self.ns(i, "ip", "link", "set", peer, "name", "eth0")
                self.ns(i, "ip", "addr", "add", f"{self.addrs[i]}/24", "dev", "eth0")
                self.ns(i, "ip", "link", "set", "eth0", "up")
        except Exception:
            self.close()
            raise

    def _sh(self, *cmd):
        subprocess.run(cmd, check=True, capture_output=True)

    def ns(self, i, *cmd):
        subprocess.run(["ip", "netns", "exec", self.names[i], *cmd], check=True,
                       capture_output=True)

    def prefix(self, i):
        return ["ip", "netns", "exec", self.names[i]]

    def drop(self, i):
        """Every packet in or out of node i vanishes: no FIN, no RST, as a host that lost power
        or a switch that died."""
        # One block on one line needs ';' between the chains, or nft refuses it.
        script = ("table inet dlfault { chain in { type filter hook input priority 0; "
                  "iifname \"eth0\" drop; }; chain out { type filter hook output priority 0; "
                  "oifname \"eth0\" drop; }; }")
        self.ns(i, "nft", script)

    def drop_incoming(self, i):
        """Every packet that reaches node i vanishes before its stack sees it. On every node at
        once, a silent partition both ways: the senders' stacks get no error either (a drop in
        the output hook answers the sender's own send with EPERM), ARP still resolves, and
        nothing is refused or reset; undrop() lets everything through again."""
        script = ("table inet dlfault { chain in { type filter hook input priority 0; "
                  "iifname \"eth0\" drop; }; }")
        self.ns(i, "nft", script)

    def undrop(self, i):
        subprocess.run(self.prefix(i) + ["nft", "delete", "table", "inet", "dlfault"],
                       capture_output=True)

    def close(self):
        for kind, name in reversed(self.made):
            if kind == "netns":
                # Whatever still runs in it goes first, or the namespace outlives us.
                r = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True)
                for pid in r.stdout.split():
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except (ProcessLookupError, ValueError):
                        pass
                subprocess.run(["ip", "netns", "del", name], capture_output=True)
            else:
                subprocess.run(["ip", "link", "del", name], capture_output=True)
        self.made = []


# The stamped reader of a pipe (test_conformance reads `dlaunch events` with it).
Stream = dltest.Stream


class Agent:
    """Node index's agent, started on the job's cluster (dltest.Cluster) in a session of its
    own, its stdout and stderr read apart with the time of each line (out, err). name: its
    name on the cluster, NAME.events and NAME.log in the job's folder."""

    def __init__(self, job, index, args, prefix=(), name=None):
        self.job, self.index = job, index
        self.name = name or f"node{index}"
        env = dict(job.env)
        if job.agent_env and index < len(job.agent_env):
            env.update(job.agent_env[index])
        self.proc = job.cluster.agent(*args, name=self.name, env=env, prefix=prefix,
                                      session=True, stamped=True)
        self.events_path = job.cluster.path(self.name, "events")
        self.out, self.err = job.cluster.streams[self.name]

    def events(self):
        """Events with their monotonic time (the stream's Unix times, shifted)."""
        shift = time.time() - time.monotonic()
        out = dltest.read_events(self.events_path)
        for e in out:
            e["mono"] = e["time"] - shift
        return out

    def worker_pid(self, rank):
        starts = [e for e in self.events() if e["event"] == "worker_start" and e["rank"] == rank]
        return starts[-1]["pid"] if starts else None

    def kill(self, sig):
        try:
            os.kill(self.proc.pid, sig)
        except ProcessLookupError:
            pass


class Job:
    """Two (or more) agents of one trainer job. Arguments as dlaunch takes them."""

    def __init__(self, nodes=2, workers=2, net=None, steps=1500, checkpoint_every=100,
                 heartbeat=0.2, dead_after=1.0, extra=(), train=None, dlaunchd=False,
                 root=None, subset=None, agent_env=None, dlaunchd_args=()):
        self.dir = tempfile.mkdtemp(prefix="dl-fault-", dir=root)
        self.net, self.nodes, self.agents, self.gone = net, nodes, [], []
        # Every agent's flags are in common: the cluster adds none but --events.
        self.cluster = dltest.Cluster(None, endpoint=False, run_id=None, dir=self.dir)
        self.env = {}
        # Per agent, by index: variables for that agent alone (DLAUNCH_COLL_HOST_ID, say).
        self.agent_env = agent_env
        self.subset = subset or os.path.join(self.dir, "data")
        if subset is None:
            os.mkdir(self.subset)
            write_subset(self.subset)
        settings = {"dataset_dir": self.subset, "steps": steps, "batch_size": 32,
                    "checkpoint_dir": "ck", "checkpoint_every": checkpoint_every,
                    "log_every": 10, "summary_file": "summary.json", "seed": 7}
        settings.update(train or {})
        self.spec = os.path.join(self.dir, "job.yaml")
        with open(self.spec, "w") as f:
            f.write("train:\n" + "".join(f"  {k}: {v}\n" for k, v in settings.items()))
        token = os.path.join(self.dir, "token")
        with open(token, "w") as f:
            f.write("f" * 32)
        os.chmod(token, 0o600)
        self.daemon = None
        host = net.addrs[0] if net else "127.0.0.1"
        if dlaunchd:
            self.port = self._start_dlaunchd(host, token, dlaunchd_args)
        else:
            self.port = free_port()
        self.common = ["--nodes", str(nodes), "--gpus-per-node", str(workers),
                       "--rdzv-endpoint", f"{host}:{self.port}", "--run-id", "fault",
                       "--token-file", token, "--heartbeat", str(heartbeat), "--dead-after",
                       str(dead_after), "--max-restarts", "3", "--stop-timeout", "2",
                       "--last-call", "0.5", *extra]
        self.t0 = time.monotonic()

    def _start_dlaunchd(self, host, token, extra=()):
        log = os.path.join(self.dir, "dlaunchd.log")
        prefix = self.net.prefix(0) if self.net else []
        self.daemon_args = [*prefix, DLAUNCHD, "--listen", f"{host}:0", "--token-file", token,
                            *extra]
        self.daemon_log = log
        with open(log, "w") as f:
            self.daemon = subprocess.Popen(self.daemon_args, stdout=subprocess.DEVNULL,
                                           stderr=f, start_new_session=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with open(log) as f:
                m = re.search(r"serving [^\s]*:(\d+)", f.read())
            if m:
                return int(m.group(1))
            time.sleep(0.02)
        raise RuntimeError("dlaunchd did not start")

    def restart_dlaunchd(self):
        """The same daemon again on the same port, as systemd would restart it."""
        args = list(self.daemon_args)
        at = args.index("--listen") + 1
        args[at] = args[at][:-2] + f":{self.port}"
        with open(self.daemon_log, "a") as f:
            self.daemon = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=f,
                                           start_new_session=True)

    def start(self):
        for i in range(self.nodes):
            prefix = self.net.prefix(i) if self.net else ()
            rank = ["--node-rank", str(i)] if i == 0 else []
            self.agents.append(Agent(self, i, [*self.common, *rank, self.spec], prefix))
            if i == 0:
                time.sleep(0.2)  # the host binds first, so it is the one that hosts

    def restart_agent(self, i):
        """Node i's agent again (after it was killed): it joins the running job as a new member.
        Its events go to a file of their own; the Agent object replaces the old one."""
        prefix = self.net.prefix(i) if self.net else ()
        old = self.agents[i]
        again = sum(a.index == i for a in self.gone)
        name = f"node{i}-again" + (f"{again + 1}" if again else "")
        a = Agent(self, i, [*self.common, self.spec], prefix, name=name)
        self.agents[i] = a
        self.gone.append(old)
        return a

    def lines(self):
        """Every agent's stdout lines, (time, agent, line), in time order."""
        agents = self.agents + self.gone
        out = [(t, a.index, l) for a in agents for t, l in a.out.snapshot()]
        return sorted(out)

    def progress(self):
        """(time, step) of every progress line rank 0 printed, on whichever node it ran."""
        out = []
        for t, _, line in self.lines():
            m = re.search(r"\] epoch \d+ step (\d+)/", line)
            if m:
                out.append((t, int(m.group(1))))
        return out

    def wait_step(self, step, timeout=120):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            p = self.progress()
            if p and p[-1][1] >= step:
                return p[-1]
            if all(a.proc.poll() is not None for a in self.agents):
                break
            time.sleep(0.01)
        raise TimeoutError(f"step {step} not reached: {self.progress()[-3:]}\n{self.tails()}")

    def tails(self):
        """The last lines each agent wrote, for a failed check's message."""
        return "".join(f"[{a.index}] {l}\n" for a in self.agents
                       for _, l in a.out.snapshot()[-15:] + a.err.snapshot()[-30:])

    def wait(self, timeout=300):
        deadline = time.monotonic() + timeout
        for a in self.agents:
            left = max(0.1, deadline - time.monotonic())
            try:
                a.proc.wait(timeout=left)
            except subprocess.TimeoutExpired:
                pass
        return [a.proc.returncode for a in self.agents]

    def summary(self):
        path = os.path.join(self.dir, "summary.json")
        if not os.path.exists(path):
            return None
        with open(path) as f:
            return json.load(f)

    def close(self):
        self.cluster.close()
        if self.daemon is not None and self.daemon.poll() is None:
            self.daemon.kill()
            self.daemon.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


# One free-port rule for every test (dltest's: below the ephemeral range); bench/faults imports
# it from here.
free_port = dltest.free_port
