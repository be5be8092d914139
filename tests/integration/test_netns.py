"""Two hosts as network namespaces, each with two interfaces: eth0 carries the default route and
the address the host name resolves to, but leads nowhere; eth1 joins the two hosts. An
unmodified PyTorch DDP script (gloo) started with torchrun's variables alone picks eth0 and
fails, as on such machines in the field; under dlaunch the same script, and the bundled
trainer, run across them with no variable set by hand, because the agent tells the workers
which interface reaches MASTER_ADDR. Needs root (skipped otherwise); each test builds its own
namespaces and removes them, their links and every process in them, whatever happens; host
names and /etc/hosts are private to each process (UTS and mount namespaces)."""
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import unittest

import dltest
import faultlib
import test_torch
import test_train

# Only inside the namespaces these tests make: the joining link, and one dead-end network per
# host for its default route.
RIGHT = {"a": "10.77.0.1", "b": "10.77.0.2"}
WRONG = {"a": "10.77.1.1", "b": "10.77.2.1"}
RDZV_PORT = 29400  # the namespaces are new: nothing else listens in them


def can_make_namespaces():
    if os.geteuid() != 0:
        return False, "needs root for network namespaces"
    for tool in ("ip", "unshare", "hostname", "mount"):
        if shutil.which(tool) is None:
            return False, f"'{tool}' is not installed"
    return True, ""


OK, WHY = can_make_namespaces()


@unittest.skipUnless(OK, WHY)
class TwoHosts(dltest.Case):
    def setUp(self):
        super().setUp()
        self.tag = f"dl{os.getpid() % 100000}"
        self.ns = {h: f"{self.tag}{h}" for h in ("a", "b")}
        self.procs = []
        # Cleanups run last in, first out: processes go before their namespaces.
        for h in ("a", "b"):
            self.make_host(h)
        run = subprocess.run(["ip", "-n", self.ns["a"], "link", "add", "eth1", "type", "veth",
                              "peer", "name", "eth1", "netns", self.ns["b"]],
                             capture_output=True, text=True)
        if run.returncode != 0:
            self.skipTest(f"cannot make a veth pair: {run.stderr.strip()}")
        for h in ("a", "b"):
            self.ip(h, "addr", "add", f"{RIGHT[h]}/24", "dev", "eth1")
            self.ip(h, "link", "set", "eth1", "up")
        # A host name and /etc/hosts of a process's own need UTS and mount namespaces too.
        run = subprocess.run(["ip", "netns", "exec", self.ns["a"], "unshare", "--uts", "--mount",
                              "true"], capture_output=True, text=True)
        if run.returncode != 0:
            self.skipTest(f"cannot make UTS and mount namespaces: {run.stderr.strip()}")
        self.token = self.write("token", "netns-test-secret\n")
        os.chmod(self.token, 0o600)
        # Made after the namespaces: its agents are killed before they go (cleanups run last
        # registered first).
        self.cluster = dltest.Cluster(self, endpoint=f"{RIGHT['a']}:{RDZV_PORT}")

    def make_host(self, h):
        name = self.ns[h]
        run = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
        if run.returncode != 0:
            self.skipTest(f"cannot make a network namespace: {run.stderr.strip()}")
        self.addCleanup(self.remove_namespace, name)
        # The host name resolves to the wrong interface's address, as a stale /etc/hosts (or
        # Debian's 127.0.1.1 line) makes it on real machines; on_host mounts this file over
        # /etc/hosts in a mount namespace of the process's own.
        self.write(f"hosts-{h}", f"127.0.0.1 localhost\n{WRONG[h]} host{h}\n")
        self.ip(h, "link", "set", "lo", "up")
        # eth0 leads to a veth end that nothing answers behind: a network that goes nowhere.
        self.ip(h, "link", "add", "eth0", "type", "veth", "peer", "name", "sink0")
        self.ip(h, "link", "set", "sink0", "up")
        self.ip(h, "link", "set", "eth0", "up")
        self.ip(h, "addr", "add", f"{WRONG[h]}/24", "dev", "eth0")
        self.ip(h, "route", "add", "default", "dev", "eth0")

    def ip(self, h, *args):
        subprocess.run(["ip", "-n", self.ns[h], *args], check=True, capture_output=True)

    def remove_namespace(self, name):
        # Whatever still runs in it goes first: a namespace with processes outlives `del`.
        for _ in range(50):
            pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True,
                                  text=True).stdout.split()
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            time.sleep(0.1)
        subprocess.run(["ip", "netns", "del", name], capture_output=True)

    def tearDown(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
        super().tearDown()

    def host(self, h):
        """The command line prefix that runs a command on host h, with its own host name."""
        return ["ip", "netns", "exec", self.ns[h], "unshare", "--uts", "--mount", "sh", "-c",
                f'mount --bind hosts-{h} /etc/hosts && hostname host{h} && exec "$@"', "sh"]

    # Each host finds its interface itself: none named by the test's environment.
    IFNAMES = [k for k in os.environ if k.endswith("_SOCKET_IFNAME")]

    def on_host(self, h, argv, log, env=None):
        """Starts argv (a program of the test's, not an agent) on host h, output to log."""
        full_env = dltest.agent_env(env, self.IFNAMES)
        out = open(os.path.join(self.dir, log), "w")
        p = subprocess.Popen([*self.host(h), *argv], cwd=self.dir, env=full_env, stdout=out,
                             stderr=subprocess.STDOUT, start_new_session=True)
        out.close()
        self.procs.append(p)
        return p

    def agent(self, h, node_rank, run_id, command, *flags):
        """Node node_rank's agent of job run_id on host h: run_id-h.log, run_id-h.events."""
        return self.cluster.agent("--nproc-per-node", "1", "--node-rank", str(node_rank),
                                  "--token-file", self.token, "--join-timeout", "60", *flags,
                                  "--", *command, name=f"{run_id}-{h}", nodes=2, run_id=run_id,
                                  prefix=self.host(h), session=True, unset=self.IFNAMES)

    def wait_ok(self, procs, names, timeout=240):
        for p, name in zip(procs, names):
            try:
                code = p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                code = "timeout"
            self.assertEqual(code, 0, "\n".join(f"--- {n}:\n{self.read(n)}" for n in names))

    def rendezvous_event(self, events_file):
        evs = dltest.read_events(os.path.join(self.dir, events_file))
        return [e for e in evs if e["event"] == "rendezvous"][0]

    def test_dry_run_names_the_interface_that_reaches_the_rendezvous(self):
        p = self.cluster.agent("--dry-run", "--", "true", name="dry", nodes=2, run_id="dry",
                               prefix=self.host("b"), session=True, unset=self.IFNAMES)
        self.assertEqual(p.wait(timeout=60), 0, self.read("dry.log"))
        out = self.read("dry.log")
        self.assertIn(f"network: workers bind eth1 ({RIGHT['b']}), the interface that reaches "
                      f"the rendezvous {RIGHT['a']}", out)
        self.assertIn(" GLOO_SOCKET_IFNAME=eth1 NCCL_SOCKET_IFNAME==eth1 ", out)

    @unittest.skipUnless(test_torch.have_torch(), "python3-torch is not installed")
    def test_unmodified_ddp_script_runs_across_hosts_with_no_variable_set(self):
        script = self.write("ddp.py", test_torch.DDP_SCRIPT)
        python = test_torch.TORCH_PYTHON
        # Without dlaunch: torchrun's variables only. Gloo binds the address the host name
        # resolves to (eth0's), tells the other rank to connect there, and that fails.
        common = {"WORLD_SIZE": "2", "MASTER_ADDR": RIGHT["a"], "MASTER_PORT": "29500",
                  "LOCAL_RANK": "0", "TORCHELASTIC_RESTART_COUNT": "0"}
        bare = [self.on_host(h, [python, script], f"bare-{h}.log", {**common, "RANK": str(r)})
                for r, h in enumerate("ab")]
        deadline = time.monotonic() + 180
        while all(p.poll() is None for p in bare) and time.monotonic() < deadline:
            time.sleep(0.1)
        codes = [p.poll() for p in bare]
        logs = self.read("bare-a.log") + self.read("bare-b.log")
        self.assertTrue(any(c not in (None, 0) for c in codes), f"{codes}\n{logs}")
        # Gloo bound a wrong interface's address: the peer connects there, or finds the
        # connection it was handed not connected.
        self.assertRegex(logs, r"connect \[10\.77\.[12]\.1\]:\d+|getpeername: Transport endpoint "
                               r"is not connected")
        for p in bare:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()

        # The same script under dlaunch on both hosts: nothing set by hand.
        procs = [self.agent(h, r, "ddp", [python, script]) for r, h in enumerate("ab")]
        self.wait_ok(procs, ["ddp-a.log", "ddp-b.log"])
        for r, h in enumerate("ab"):
            self.assertIn(f"rank={r} world=2 sum=1 grad=12 local=0 restart=0",
                          self.read(f"ddp-{h}.log"))
            ev = self.rendezvous_event(f"ddp-{h}.events")
            self.assertEqual((ev["interface"], ev["master_addr"]), ("eth1", RIGHT["a"]))

    @unittest.skipUnless(test_train.have_fashion(), "dataset-fashion-mnist is not installed")
    def test_bundled_trainer_runs_across_hosts_and_local_addr_is_advertised(self):
        data = tempfile.mkdtemp(prefix="dl-netns-data-")
        self.addCleanup(shutil.rmtree, data, True)
        test_train.write_subset(data)
        # Node 0 advertises a second address of its eth1: MASTER_ADDR becomes that, and every
        # node still binds eth1.
        self.ip("a", "addr", "add", "10.77.0.11/24", "dev", "eth1")
        trainer = [test_train.TRAINER, "--set", f"dataset_dir={data}", "--set", "steps=20"]
        procs = [self.agent("a", 0, "train", trainer, "--local-addr", "10.77.0.11"),
                 self.agent("b", 1, "train", trainer)]
        self.wait_ok(procs, ["train-a.log", "train-b.log"])
        self.assertIn("done after 20 steps", self.read("train-a.log"))
        self.assertIn("world size 2", self.read("train-a.log"))
        for h in "ab":
            ev = self.rendezvous_event(f"train-{h}.events")
            self.assertEqual((ev["interface"], ev["master_addr"]), ("eth1", "10.77.0.11"))

    def events(self, events_file):
        return dltest.read_events(os.path.join(self.dir, events_file))

    def wait_for(self, what, cond, timeout, logs):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if cond():
                return
            time.sleep(0.05)
        self.fail(f"timed out waiting for {what}\n" +
                  "\n".join(f"--- {n}:\n{self.read(n)}" for n in logs))

    @unittest.skipUnless(shutil.which("nft"), "nftables is not installed")
    def test_a_rendezvous_gone_silent_is_noticed_within_dead_after(self):
        """Every packet to and from host b dropped, with no FIN or RST, as when the host of the
        rendezvous loses power: b's agent notices within --dead-after (plus a heartbeat), stops
        its workers, and the job goes on when the link comes back."""
        stop = os.path.join(self.dir, "stop")
        work = ["sh", "-c", f"while [ ! -e {stop} ]; do sleep 0.05; done"]
        flags = ("--heartbeat", "0.2", "--dead-after", "1", "--max-restarts", "3")
        procs = [self.agent(h, r, "silent", work, *flags) for r, h in enumerate("ab")]
        logs = ["silent-a.log", "silent-b.log"]

        def started(h, attempt):
            return any(e["event"] == "worker_start" and e["attempt"] == attempt
                       for e in self.events(f"silent-{h}.events"))
        self.wait_for("both workers", lambda: started("a", 0) and started("b", 0), 60, logs)
        # The link only, as a cable pulled: b still reaches itself.
        drop = ("table inet cut {\n"
                "  chain i { type filter hook input priority 0; iifname \"eth1\" drop; }\n"
                "  chain o { type filter hook output priority 0; oifname \"eth1\" drop; }\n"
                "}\n")
        subprocess.run(["ip", "netns", "exec", self.ns["b"], "nft", "-f", "-"], input=drop,
                       text=True, check=True)
        t0 = time.monotonic()
        # Its worker stopped while the link is still cut: before, b went on for as long as
        # the cut lasted.
        self.wait_for("b to stop its worker",
                      lambda: any(e["event"] == "worker_exit"
                                  for e in self.events("silent-b.events")), 15, logs)
        took = time.monotonic() - t0
        self.assertRegex(self.read("silent-b.log"), r"lost the rendezvous at .*no answer for "
                                                    r"[0-9.]+ s, over --dead-after 1 s")
        # The cut lasts 10 s: b, hosting meanwhile, asks a again at each heartbeat, and must hear
        # it within moments once the link heals. Before, its first ask's SYNs backed off (1, 2,
        # 4, 8 s...) and a was heard of only when the next came.
        time.sleep(max(0.0, 10.0 - (time.monotonic() - t0)))
        subprocess.run(["ip", "netns", "exec", self.ns["b"], "nft", "delete", "table", "inet",
                        "cut"], check=True)
        healed = time.monotonic()
        self.wait_for("b to hand the job back to a",
                      lambda: "answers again: handing the job over" in self.read("silent-b.log"),
                      30, logs)
        handed = time.monotonic() - healed
        self.assertLess(handed, 3.0, self.read("silent-b.log"))
        self.wait_for("both in the next attempt",
                      lambda: started("a", 1) and started("b", 1), 90, logs)
        # Both nodes name the cut-off node b (node rank 1) as the culprit: b heard no round
        # change, only that it lost the rendezvous; its assignment says who ended the round.
        for h in "ab":
            restart = [e for e in self.events(f"silent-{h}.events") if e["event"] == "restart"]
            self.assertEqual([(e["reason"]["cause"], e["reason"].get("node_rank"))
                              for e in restart], [("node_lost", 1)], restart)
        # Cut off, b hosted the rendezvous itself (a was silent); once a answered again, b
        # handed the job back to it, the first in line, and both went on in one job.
        self.assertIn(f"hosting the rendezvous on {RIGHT['b']}", self.read("silent-b.log"))
        self.assertIn(f"the rendezvous at {RIGHT['a']}:{RDZV_PORT} answers again: handing the "
                      f"job over to it", self.read("silent-b.log"))
        open(stop, "w").close()
        self.wait_ok(procs, logs)
        print(f"silent loss noticed in {took:.2f} s (dead-after 1 s, heartbeat 0.2 s); the "
              f"job handed back {handed:.2f} s after the link healed")

    @unittest.skipUnless(shutil.which("nft"), "nftables is not installed")
    def test_the_host_gone_silent_a_successor_hosts_at_its_own_address(self):
        """Host a (node rank 0, hosting the rendezvous) loses power: its packets stop, then it
        dies without a word. b notices within --dead-after, finds nobody at a's address, hosts
        the rendezvous at its own address and, with --nodes 1:2, goes on alone."""
        stop = os.path.join(self.dir, "stop")
        work = ["sh", "-c", f"while [ ! -e {stop} ]; do sleep 0.05; done"]
        flags = ("--nodes", "1:2", "--last-call", "0.5", "--heartbeat", "0.2", "--dead-after",
                 "1", "--max-restarts", "3")
        procs = [self.agent(h, r, "gone", work, *flags) for r, h in enumerate("ab")]
        logs = ["gone-a.log", "gone-b.log"]

        def rounds(h):
            return [e for e in self.events(f"gone-{h}.events") if e["event"] == "rendezvous"]
        self.wait_for("both nodes in one round",
                      lambda: rounds("b") and rounds("b")[-1]["world_size"] == 2, 60, logs)
        cut = ("table inet cut {\n"
               "  chain i { type filter hook input priority 0; policy drop; }\n"
               "  chain o { type filter hook output priority 0; policy drop; }\n"
               "}\n")
        subprocess.run(["ip", "netns", "exec", self.ns["a"], "nft", "-f", "-"], input=cut,
                       text=True, check=True)
        os.killpg(procs[0].pid, signal.SIGKILL)
        procs[0].wait()
        t0 = time.monotonic()
        self.wait_for("b alone in a new round",
                      lambda: rounds("b")[-1]["world_size"] == 1, 60, logs)
        took = time.monotonic() - t0
        failover = [e for e in self.events("gone-b.events") if e["event"] == "failover"]
        self.assertEqual([(e["host"], e["hosting"]) for e in failover], [(RIGHT["b"], True)],
                         self.read("gone-b.log"))
        self.assertIn(f"hosting the rendezvous on {RIGHT['b']}:{RDZV_PORT}",
                      self.read("gone-b.log"))
        open(stop, "w").close()
        self.wait_ok(procs[1:], logs[1:])
        print(f"the host gone silent: b trains again {took:.2f} s later (dead-after 1 s)")


@unittest.skipUnless(faultlib.can_netns() and faultlib.have_fashion(),
                     "needs root, nftables and dataset-fashion-mnist")
class SilentPartition(unittest.TestCase):
    """2 agents x 2 workers of the bundled trainer, each agent in a namespace of its own and its
    workers on a host of their own (so that the ranks of the two nodes meet over TCP); every
    packet between the nodes vanishes for a few seconds, both ways, then goes through again.
    Node 1 is declared dead after 1 s; the job recovers once and finishes, in both recovery
    modes, and every agent exits."""
    STEPS = 500
    FAULT_STEP = 200

    @classmethod
    def setUpClass(cls):
        cls.root = tempfile.mkdtemp(prefix="dl-silent-")
        cls.subset = os.path.join(cls.root, "data")
        os.mkdir(cls.subset)
        faultlib.write_subset(cls.subset)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.root, ignore_errors=True)

    def partition(self, seconds, recovery):
        net = faultlib.Net(2)
        self.addCleanup(net.close)
        job = faultlib.Job(net=net, steps=self.STEPS, extra=("--recovery", recovery),
                           subset=self.subset, root=self.root,
                           agent_env=[{"DLAUNCH_COLL_HOST_ID": "node0"},
                                      {"DLAUNCH_COLL_HOST_ID": "node1"}])
        self.addCleanup(job.close)  # runs before net.close: processes first
        job.start()
        job.wait_step(self.FAULT_STEP)
        for i in (0, 1):
            net.drop_incoming(i)
        time.sleep(seconds)
        for i in (0, 1):
            net.undrop(i)
        codes = job.wait(timeout=240)
        text = "".join(f"[{a.index}] {l}\n" for a in job.agents
                       for _, l in a.out.snapshot()[-20:] + a.err.snapshot())
        self.assertEqual(codes, [0, 0], text[-6000:])
        # One fault, one recovery: the rendezvous moved one round on, and no agent spent more.
        m = re.search(r"job succeeded in round (\d+), (\d+) restart", text)
        self.assertIsNotNone(m, text[-6000:])
        self.assertEqual((m.group(1), m.group(2)), ("1", "1"), text[-6000:])
        for a in job.agents:
            end = [e for e in a.events() if e["event"] == "job_end"]
            self.assertEqual(len(end), 1, a.index)
            spent = end[0]["attempts"] - 1 + end[0].get("recoveries", 0)
            self.assertEqual(spent, 1, (a.index, end[0]))
        self.assertEqual(job.summary()["steps"], self.STEPS)
        return job

    def test_3s_in_job(self):
        self.partition(3, "in-job")

    def test_3s_restart(self):
        self.partition(3, "restart")

    def test_8s_in_job(self):
        self.partition(8, "in-job")

    def test_8s_restart(self):
        self.partition(8, "restart")

    def test_a_job_that_fails_of_it_ends_every_agent_at_once(self):
        """With no restart to spend, the host fails the job when node 1 goes silent; node 1,
        cut off, hosts the rendezvous itself, hears from its own join that the budget is gone
        and ends too. Each agent exits within a second of being told (in-job: its workers drop
        their group at once instead of waiting for the stop timeout's SIGKILL)."""
        net = faultlib.Net(2)
        self.addCleanup(net.close)
        job = faultlib.Job(net=net, steps=self.STEPS, subset=self.subset, root=self.root,
                           extra=("--recovery", "in-job", "--max-restarts", "0"),
                           agent_env=[{"DLAUNCH_COLL_HOST_ID": "node0"},
                                      {"DLAUNCH_COLL_HOST_ID": "node1"}])
        self.addCleanup(job.close)
        job.start()
        job.wait_step(self.FAULT_STEP)
        for i in (0, 1):
            net.drop_incoming(i)
        exited = {}
        deadline = time.monotonic() + 60
        while len(exited) < 2 and time.monotonic() < deadline:
            for a in job.agents:
                if a.index not in exited and a.proc.poll() is not None:
                    exited[a.index] = time.monotonic()
            time.sleep(0.01)
        for i in (0, 1):
            net.undrop(i)
        text = "".join(f"[{a.index}] {l}\n" for a in job.agents for _, l in a.err.snapshot())
        self.assertEqual(sorted(exited), [0, 1], text[-4000:])
        self.assertEqual([a.proc.returncode for a in job.agents], [1, 1], text[-4000:])
        for a in job.agents:
            told = [t for t, l in a.err.snapshot() if "the rendezvous ended the job: failed" in l]
            self.assertTrue(told, (a.index, text[-4000:]))
            self.assertLess(exited[a.index] - told[0], 1.0, (a.index, text[-4000:]))


if __name__ == "__main__":
    dltest.main()
