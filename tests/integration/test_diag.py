"""Seeing inside a running job (docs/diagnostics.md), with the real dlaunch and dlaunch-train: a
rank stopped in the middle of a step is named as the one that never entered the collective the
others wait in, with the operation and its sequence number, on one node and on two; a rank slowed
for real (it sleeps in each step's compute: slow_ms_per_step) is named a straggler, and nobody is while
the ranks run evenly; with --straggler-action exclude the slow node leaves and the job finishes;
SIGUSR1 and `dlaunch status --ranks` show every rank. Skipped without dataset-fashion-mnist."""
import json
import os
import re
import signal
import struct
import subprocess
import time
import unittest

import dltest
from dltest import free_port
import test_train

TRAINER = test_train.TRAINER

# The documented layout of a flight recorder file (docs/diagnostics.md), read independently of
# the C reader.
REC_MAGIC = 0x3130434552464C44
OPS = {1: "all-reduce", 2: "broadcast", 3: "all-gather", 4: "reduce-scatter", 5: "barrier",
       6: "mem-alloc", 7: "send", 8: "recv"}
STATES = {1: "queued", 2: "running", 3: "done", 4: "failed"}


def read_recorder(path):
    """The entries of a recorder file, oldest first, as (seq, op, state, bytes)."""
    with open(path, "rb") as f:
        b = f.read()
    magic, version, hbytes, ebytes, cap = struct.unpack_from("<QIIII", b, 0)
    assert magic == REC_MAGIC and version == 1 and hbytes == 256 and ebytes == 64, path
    entries = []
    for i in range(cap):
        ver, op, state, algo, dtype, seq, nbytes = struct.unpack_from("<IBBBBQQ", b, 256 + 64 * i)
        if ver and ver % 2 == 0 and seq:
            entries.append((seq, OPS.get(op, "?"), STATES.get(state, "?"), nbytes))
    return sorted(entries)


def setUpModule():
    test_train.setUpModule()


def tearDownModule():
    test_train.tearDownModule()


def trainer_cmd(data, *sets):
    args = [TRAINER, "--set", f"dataset_dir={data}", "--set", "overlap=off"]
    for s in sets:
        args += ["--set", s]
    return args


class Diag(dltest.Case):
    def setUp(self):
        super().setUp()
        if test_train.SUBSET is None:
            self.skipTest("dataset-fashion-mnist is not installed")
        # The agents name their endpoints and run ids themselves.
        self.cluster = dltest.Cluster(self, endpoint=False, run_id=None)

    def spawn(self, args, name, env=None):
        return self.cluster.agent(*args, name=name, env=env)

    def log(self, name):
        return self.cluster.log(name)

    def wait_for(self, pred, timeout, what):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = pred()
            if got:
                return got
            time.sleep(0.05)
        self.fail(f"timed out waiting for {what}")

    def pid_of(self, name, rank):
        return self.cluster.wait_for(
            name, lambda e: e["event"] == "worker_start" and e["rank"] == rank, 60,
            desc=f"worker_start of rank {rank}")["pid"]

    def first_beat(self, rank, attempt=0, run="job"):
        """Waits until rank trains: its flight recorder, set up, shows the three broadcasts of
        the start and a step's collective (training, not loading data, is what is measured)."""
        path = os.path.join(self.dir, "dlaunch_logs", run, f"attempt_{attempt}",
                            f"rank_{rank}.rec")

        def training():
            try:
                return len(read_recorder(path)) >= 4
            except (OSError, AssertionError, struct.error):
                return False
        self.wait_for(training, 60, f"rank {rank}'s flight recorder")

    # ---- hangs -------------------------------------------------------------------------------

    HANG_STEP = 20

    def hang_seq(self):
        """The number of step HANG_STEP's reduce-scatter (check_hang_account)."""
        return 2 * self.HANG_STEP + 2

    def check_hang_account(self, text, on_node=None):
        """The account names rank 1 as the one that never entered the reduce-scatter of step
        HANG_STEP: three broadcasts before the first step (the overlap agreed, the start state,
        the parameters), then a reduce-scatter and an all-gather a step, so its number is
        3 + 2 (S - 1) + 1."""
        seq = Diag.hang_seq(self)  # test_etcd passes its own case as self
        where = f" on node {on_node} \\([^)]*\\)" if on_node is not None else ""
        m = re.search(f"rank 1{where} never entered reduce-scatter #(\\d+) \\(its last: "
                      f"all-gather #(\\d+), done[^)]*\\); rank 0 has waited in it for ", text)
        self.assertIsNotNone(m, text)
        self.assertEqual(int(m.group(1)), seq, text)
        self.assertEqual(int(m.group(2)), seq - 1, text)

    def test_a_rank_stopped_mid_step_is_named_on_one_node(self):
        data = test_train.SUBSET
        p = self.spawn(["--gpus-per-node", "2", "--health-timeout", "3", "--max-restarts", "1",
                        "--recovery", "restart", "--run-id", "job", "--",
                        *trainer_cmd(data, "steps=60", "log_every=1000",
                                     f"hang_at_step={self.HANG_STEP}", "fail_rank=1")], "a")
        self.assertEqual(p.wait(timeout=120), 0, self.log("a"))
        evs = self.evs("a")
        ranks = [e for e in evs if e["event"] == "ranks"]
        self.assertEqual(len(ranks), 1, evs)
        self.assertEqual(ranks[0]["reason"], "hang")
        self.check_hang_account(ranks[0]["diagnosis"])
        self.assertIn("its process is stopped", ranks[0]["diagnosis"])
        by_rank = {r["rank"]: r for r in ranks[0]["ranks"]}
        self.assertEqual(by_rank[1]["proc"], "T")
        self.assertEqual(by_rank[0]["ops"][-1]["op"], "reduce-scatter")
        self.assertEqual(by_rank[0]["ops"][-1]["state"], "running")
        # The restart says why, and the hung workers' events carry the account too.
        restart = [e for e in evs if e["event"] == "restart"]
        self.assertEqual(len(restart), 1)
        self.check_hang_account(restart[0]["diagnosis"])
        hung = [e for e in evs if e["event"] == "worker_hung"]
        self.assertTrue(hung and all("never entered" in e["diagnosis"] for e in hung), hung)
        # Only the stopped rank is named hung: rank 0 waited for it in a collective.
        self.assertEqual([e["rank"] for e in hung], [1], hung)
        self.assertTrue(restart[0]["reason"]["hung"], restart)
        self.assertEqual(restart[0]["reason"]["rank"], 1, restart)
        self.check_hang_account(self.log("a"))
        # The recorder files stay with the attempt's logs, and say the same thing.
        base = os.path.join(self.dir, "dlaunch_logs", "job", "attempt_0")
        r0 = read_recorder(os.path.join(base, "rank_0.rec"))
        r1 = read_recorder(os.path.join(base, "rank_1.rec"))
        seq = self.hang_seq()
        # Rank 0 was inside the reduce-scatter when the hang was found; only rank 1 was
        # stopped, so the collective may have failed under rank 0 as rank 1's socket closed.
        self.assertEqual(r0[-1][:2], (seq, "reduce-scatter"), r0[-3:])
        self.assertIn(r0[-1][2], ("running", "failed"), r0[-3:])
        self.assertEqual(r1[-1][:3], (seq - 1, "all-gather", "done"), r1[-3:])
        self.assertEqual(r0[0][1:3], ("broadcast", "done"))

    def two_agents(self, extra, trainer, env=(None, None), nodes="2"):
        port = free_port()
        self.endpoint = f"127.0.0.1:{port}"
        procs = []
        for i in range(2):
            node_env = {"DLAUNCH_COLL_HOST_ID": f"node{i}"}  # TCP between the "nodes"
            node_env.update(env[i] or {})
            procs.append(self.spawn(
                ["--nodes", nodes, "--gpus-per-node", "1", "--rdzv-endpoint", self.endpoint,
                 "--run-id", "job", "--heartbeat", "0.3", "--join-timeout", "60",
                 "--node-rank", str(i), *extra, "--", *trainer], f"n{i}", env=node_env))
        return procs

    def test_a_rank_stopped_mid_step_is_named_on_two_nodes(self):
        data = test_train.SUBSET
        procs = self.two_agents(
            ["--health-timeout", "6", "--max-restarts", "1", "--recovery", "restart"],
            trainer_cmd(data, "steps=60", "log_every=1000", f"hang_at_step={self.HANG_STEP}",
                        "fail_rank=1"))
        # While the job hangs, `dlaunch status --ranks` shows where.
        seq = self.hang_seq()

        def where():
            p = subprocess.run([dltest.DLAUNCH, "status", "--ranks", "--endpoint", self.endpoint,
                                "job"], capture_output=True, text=True, timeout=30)
            return p.stdout if f"never entered reduce-scatter #{seq}" in p.stdout else None
        text = self.wait_for(where, 60, "status --ranks to show the hang")
        self.check_hang_account(text, on_node=1)
        self.assertRegex(text, rf"rank 1 +node 1 .* process T \| all-gather #{seq - 1} done")
        self.assertRegex(text, rf"rank 0 +node 0 .* \| reduce-scatter #{seq} running")
        for p in procs:
            self.assertEqual(p.wait(timeout=120), 0, self.log("n0") + self.log("n1"))
        for name in ("n0", "n1"):
            restart = [e for e in self.evs(name) if e["event"] == "restart"]
            self.assertEqual(len(restart), 1, self.evs(name))
            self.check_hang_account(restart[0]["diagnosis"], on_node=1)
            # Every node's restart names the culprit alike: rank 1 on node 1, hung.
            reason = restart[0]["reason"]
            self.assertEqual((reason["rank"], reason["node_rank"], reason.get("hung"),
                              reason["cause"]), (1, 1, True, "worker_failed"), restart)
        # Rank 1's own node names it; rank 0, waiting for it on node 0, is nobody's culprit.
        hung = {n: [e["rank"] for e in self.evs(n) if e["event"] == "worker_hung"]
                for n in ("n0", "n1")}
        self.assertEqual(hung, {"n0": [], "n1": [1]},
                         "\n".join(json.dumps(e) for n in ("n0", "n1") for e in self.evs(n)
                                   if e["event"] == "worker_hung") + "\n" + self.log("n0"))

    def test_a_killed_node_is_blamed_not_the_failures_it_caused(self):
        """Node 1's agent SIGKILLed mid-training: node 0's rank fails too (its collective
        broke), but the round change, node 0's restart event and its log name node 1."""
        procs = self.two_agents(
            ["--nodes", "1:2", "--last-call", "0.5", "--dead-after", "2", "--max-restarts", "2",
             "--recovery", "restart"],
            trainer_cmd(test_train.SUBSET, "steps=300", "log_every=1000"), nodes="1:2")
        self.first_beat(1)
        procs[1].kill()
        procs[1].wait()
        self.assertEqual(procs[0].wait(timeout=120), 0, self.log("n0"))
        restart = [e for e in self.evs("n0") if e["event"] == "restart"]
        self.assertEqual(len(restart), 1, self.evs("n0"))
        reason = restart[0]["reason"]
        self.assertEqual((reason["cause"], reason["node_rank"]), ("node_lost", 1), restart)
        self.assertNotIn("rank", reason, restart)
        self.assertRegex(self.log("n0"), r"round 1: agent '[^']*' \([^)]*\) (lost its "
                                         r"connection|sent no heartbeat)")

    # ---- stragglers --------------------------------------------------------------------------

    def stragglers(self, name):
        return [e for e in self.evs(name) if e["event"] == "straggler"]

    def slowed_from(self, rank=1, run="job", attempt=0):
        """Waits for the trainer's line saying its slowdown starts (slow_after_s); the time it
        was seen, on the clock of the agents' events."""
        path = os.path.join(self.dir, "dlaunch_logs", run, f"attempt_{attempt}",
                            f"rank_{rank}.out")

        def said():
            try:
                with open(path) as f:
                    return "slow_ms_per_step: sleeping" in f.read()
            except OSError:
                return False
        self.wait_for(said, self.EVEN_S + 120, f"rank {rank}'s slowdown to start")
        return time.time()

    def even_then_slow(self, names):
        """The ranks run evenly for EVEN_S (nobody may be named), then rank 1 sleeps
        SLOW_MS in each step's compute until it is named (within NAMED_WITHIN seconds: the rule
        needs two windows of 100 steps and three reports each)."""
        slowed_at = self.slowed_from()
        for n in names:
            early = [e for e in self.stragglers(n) if e["time"] < slowed_at]
            self.assertEqual(early, [], f"named in an even run: {self.log(n)}")
        self.wait_for(lambda: all(self.stragglers(n) for n in names), self.NAMED_WITHIN,
                      f"rank 1 to be named within {self.NAMED_WITHIN} s of its slowdown")
        firsts = []
        for n in names:
            s = self.stragglers(n)
            self.assertEqual([e["rank"] for e in s], [1], s)
            self.assertGreaterEqual(s[0]["steps"], 100)  # two windows
            self.assertGreater(s[0]["compute_ms"], s[0]["median_ms"])
            print(f"{n}: rank 1 named at +{s[0]['slower_pct']:.0f}%, "
                  f"{s[0]['time'] - slowed_at:.1f} s after its slowdown")
            self.assertGreater(s[0]["cost_samples_per_s"], 0)
            self.assertEqual(s[0]["action"], "warn")
            firsts.append(s[0])
        # The rule named it past the threshold; an agent that hears of it a report later gives
        # the figures of its latest window, which may have dipped since.
        first = min(firsts, key=lambda e: e["time"])
        self.assertGreater(first["slower_pct"], self.STRAGGLER_THRESHOLD * 100, firsts)
        self.assertGreater(first["compute_ms"],
                           first["median_ms"] * (1 + self.STRAGGLER_THRESHOLD))

    # Two ranks on a shared 2-core machine: a neighbour's load can hold one back by +50% over
    # seconds (+54% over 129 steps was seen with two busy loops beside: a true straggler, for the
    # rule), by +200% over one window at the start, and by +306% over 237 steps (2.63 against
    # 0.65 ms, 2026-12-08: two busy loops and the suite's plain and sanitizer passes beside), so
    # the tests name ranks only past +600%. The slowed rank sleeps 30 ms in each step's compute
    # (slow_ms_per_step), some fifty times an even step's compute on a quiet machine, and a
    # sleep is not slowed by load: with every rank's compute at 2.5 ms it is still +1100%. At
    # 30 ms a step two windows of 100 steps take 7 s or more.
    STRAGGLER_THRESHOLD = 6.0
    STRAGGLER_OPTS = ("--straggler-threshold", str(STRAGGLER_THRESHOLD))
    EVEN_S = 8
    SLOW_MS = 30
    NAMED_WITHIN = 60
    STRAGGLER_TRAIN = ("steps=1000000", "layers=784-128-10", "log_every=200",
                       "eval_every=1000000", "slow_rank=1", f"slow_ms_per_step={SLOW_MS}",
                       f"slow_after_s={EVEN_S}")

    def test_a_slowed_rank_is_named_on_one_node_and_nobody_before(self):
        data = test_train.SUBSET
        p = self.spawn(["--gpus-per-node", "2", "--run-id", "job", *self.STRAGGLER_OPTS, "--",
                        *trainer_cmd(data, *self.STRAGGLER_TRAIN)], "a")
        self.pid_of("a", 0)
        self.first_beat(1)
        # SIGUSR1: the agent prints where every rank is, and says so in its events.
        p.send_signal(signal.SIGUSR1)
        self.wait_for(lambda: [e for e in self.evs("a") if e["event"] == "ranks"], 20,
                      "the SIGUSR1 report")
        self.even_then_slow(["a"])
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=60)
        log = self.log("a")
        self.assertIn("SIGUSR1: where this node's ranks are", log)
        self.assertRegex(log, r"\[agent node=0\]   rank 1: .*process \w, .* #\d+ (done|running)")
        self.assertRegex(log, r"\[agent node=0\] straggler: rank 1 on node 0 \(.*\) computes "
                              r"[0-9.]+ ms a step against the median [0-9.]+ ms \(\+\d+%\) for "
                              r"\d+ steps; it costs the job about \d+ samples/s")
        ev = [e for e in self.evs("a") if e["event"] == "ranks"][0]
        self.assertEqual(ev["reason"], "request")
        self.assertEqual(sorted(r["rank"] for r in ev["ranks"]), [0, 1])
        # The trainer's progress lines carry the job-wide figures.
        out = self.read("dlaunch_logs", "job", "attempt_0", "rank_0.out")
        self.assertRegex(out, r"compute a step: median [0-9.]+ ms, slowest rank \d [0-9.]+ ms")

    def test_a_slowed_rank_is_named_on_two_nodes_and_nobody_before(self):
        data = test_train.SUBSET
        procs = self.two_agents(list(self.STRAGGLER_OPTS), trainer_cmd(data, *self.STRAGGLER_TRAIN))
        self.even_then_slow(["n0", "n1"])
        # dlaunch status names it too.
        p = subprocess.run([dltest.DLAUNCH, "status", "--endpoint", self.endpoint, "job"],
                           capture_output=True, text=True, timeout=30)
        self.assertRegex(p.stdout, r"straggler: rank 1 on node 1 \(.*\): [0-9.]+ ms a step")
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(timeout=60)

    def test_exclude_drops_the_slow_node_and_the_job_finishes(self):
        data = test_train.SUBSET
        ckpt = os.path.join(self.dir, "ckpt")
        procs = self.two_agents(
            ["--straggler-action", "exclude", "--max-restarts", "1", "--last-call", "1",
             "--recovery", "restart",
             *self.STRAGGLER_OPTS],
            trainer_cmd(data, "steps=1500", "layers=784-128-10", "log_every=500",
                        "eval_every=1000000", f"checkpoint_dir={ckpt}", "checkpoint_every=50",
                        "slow_rank=1", f"slow_ms_per_step={self.SLOW_MS}"),
            nodes="1:2")
        for p in procs:
            self.assertEqual(p.wait(timeout=180), 0, self.log("n0") + self.log("n1"))
        s = self.stragglers("n1")
        self.assertEqual([(e["rank"], e["node_rank"], e["action"]) for e in s], [(1, 1, "exclude")])
        # Node 0 went on alone in the next round, and finished.
        rdzv = [(e["round"], e["nodes"]) for e in self.evs("n0") if e["event"] == "rendezvous"]
        self.assertEqual(rdzv, [(0, 2), (1, 1)])
        end0 = [e for e in self.evs("n0") if e["event"] == "job_end"]
        self.assertEqual(end0[0]["status"], "succeeded")
        self.assertIn("straggler: rank 1 on node 1", self.log("n0"))
        self.assertIn("sat out as a straggler", self.log("n1"))
        self.assertRegex(self.read("dlaunch_logs", "job", "attempt_1", "rank_0.out"),
                         r"done after 1500 steps")


if __name__ == "__main__":
    dltest.main()
