"""The etcd rendezvous (--rdzv-backend etcd) on a real 3-member etcd cluster on loopback
(etcdlib.py, one cluster per test): jobs of two and three agents, a dead agent and its return,
the agent that serves the workers' store killed, etcd members killed (one: nothing happens; two:
lost quorum, and the job goes on once they return), user/password and TLS, clear errors, the
job's keys gone at its end, the control commands. Skipped where etcd-server is missing."""
import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import time
import unittest
import urllib.request

import dltest
import etcdlib
import test_diag
import test_torch_store
import test_train

ROOT = os.environ.get("SOURCE_ROOT") or os.path.join(os.path.dirname(__file__), "..", "..")


def rounds(evs):
    return [e for e in evs if e["event"] == "rendezvous"]


@unittest.skipUnless(etcdlib.have_etcd(), "etcd-server is not installed (scripts/deps.sh test)")
class Fixture(dltest.Case):
    def test_three_members_survive_one_and_come_back(self):
        with etcdlib.Cluster() as c:
            members = c.ctl("member", "list").stdout.splitlines()
            self.assertEqual(len(members), 3, members)
            c.ctl("put", "/dl-fixture/k", "v")
            c.kill(1)
            # Two of three still make a quorum (once they have a leader): writes go on.
            c.wait_healthy(members=[0, 2])
            c.ctl("put", "/dl-fixture/k", "w",
                  endpoints=f"http://{c.endpoint(0)},http://{c.endpoint(2)}")
            c.restart(1)
            self.assertEqual(c.get_prefix("/dl-fixture/"), {"/dl-fixture/k": "w"})
            folder = c.folder
        self.assertFalse(os.path.exists(folder))
        self.assertTrue(all(p.poll() is not None for p in c.procs))


class EtcdCase(dltest.Case):
    """A fresh cluster per test, agents as in test_rdzv, everything gone afterwards."""
    tls = False

    def setUp(self):
        super().setUp()
        self.cluster = etcdlib.Cluster(tls=self.tls, folder=os.path.join(self.dir, "etcd"))
        # Cleanups run last registered first: every agent (its Cluster's, registered later)
        # is killed before the etcd cluster stops; registered before start, so that members
        # started before a failed start go too.
        self.addCleanup(self.cluster.stop)
        self.cluster.start()
        self.procs = []  # what is not an agent: followers
        self.agents = dltest.Cluster(self, endpoint=self.cluster.endpoints,
                                     args=["--rdzv-backend", "etcd"])

    def tearDown(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        super().tearDown()

    def etcd_args(self):
        return ["--rdzv-backend", "etcd", "--rdzv-endpoint", self.cluster.endpoints]

    def agent(self, *args, name="a", nodes="2", slots="2", env=None, heartbeat="0.2",
              run_id="job"):
        return self.agents.agent("--gpus-per-node", slots, "--heartbeat", heartbeat,
                                 "--join-timeout", "30", *args, name=name, nodes=nodes, env=env,
                                 run_id=run_id)

    def log(self, name):
        return self.agents.log(name)

    def logs(self, names):
        return "\n".join(f"--- {n}\n{self.log(n)}" for n in names)

    def wait_all(self, procs, timeout=60):
        return self.agents.wait_all(procs, timeout=timeout)

    def wait_for(self, pred, timeout=30, what=""):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pred():
                return time.monotonic()
            time.sleep(0.05)
        self.fail(f"timed out waiting for {what}")

    def world(self, name):
        r = rounds(self.evs(name))
        return r[-1]["world_size"] if r else None

    def ranks_from_logs(self, attempt=0):
        ranks = {}
        base = os.path.join(self.dir, "dlaunch_logs", "job", f"attempt_{attempt}")
        for f in sorted(os.listdir(base)):
            if f.endswith(".out"):
                with open(os.path.join(base, f)) as fh:
                    text = fh.read().split()
                if text:
                    ranks[int(f[5:-4])] = text
        return ranks


@unittest.skipUnless(etcdlib.have_etcd(), "etcd-server is not installed (scripts/deps.sh test)")
class Diagnosis(EtcdCase):
    """test_diag's accounts across two nodes, over etcd: what our server makes of every node's
    heartbeats, the agents make of every node's report (n/NODE_ID)."""
    HANG_STEP = test_diag.Diag.HANG_STEP
    # test_diag's straggler figures and checks: an even run names nobody, then rank 1 is.
    STRAGGLER_THRESHOLD = test_diag.Diag.STRAGGLER_THRESHOLD
    STRAGGLER_OPTS = test_diag.Diag.STRAGGLER_OPTS
    STRAGGLER_TRAIN = test_diag.Diag.STRAGGLER_TRAIN
    EVEN_S = test_diag.Diag.EVEN_S
    NAMED_WITHIN = test_diag.Diag.NAMED_WITHIN
    stragglers = test_diag.Diag.stragglers
    slowed_from = test_diag.Diag.slowed_from
    even_then_slow = test_diag.Diag.even_then_slow

    def two_agents(self, extra, *sets, nodes="2"):
        data = os.path.join(self.dir, "data")
        os.mkdir(data)
        test_train.write_subset(data)
        trainer = test_diag.trainer_cmd(data, *sets)
        return [self.agent("--node-rank", str(i), "--heartbeat", "0.3", *extra, "--", *trainer,
                           name=f"n{i}", slots="1", nodes=nodes,
                           env={"DLAUNCH_COLL_HOST_ID": f"node{i}"})  # TCP between the "nodes"
                for i in range(2)]

    @unittest.skipUnless(test_train.have_fashion(), "Fashion-MNIST is not installed")
    def test_a_rank_stopped_mid_step_is_named_on_two_nodes(self):
        """Rank 1 (node 1) stops in step 20: every node's restart says, as with our server,
        that rank 1 on node 1 never entered the reduce-scatter and that rank 0, on node 0 (its
        report, not the failing node's), has waited in it."""
        procs = self.two_agents(
            ["--health-timeout", "6", "--max-restarts", "1", "--recovery", "restart"],
            "steps=60", "log_every=1000", f"hang_at_step={self.HANG_STEP}", "fail_rank=1")
        self.assertEqual(self.wait_all(procs, timeout=180), [0, 0], self.logs(["n0", "n1"]))
        for name in ("n0", "n1"):
            restart = [e for e in self.evs(name) if e["event"] == "restart"]
            self.assertEqual(len(restart), 1, self.evs(name))
            test_diag.Diag.check_hang_account(self, restart[0]["diagnosis"], on_node=1)
            reason = restart[0]["reason"]
            # Rank 1, whichever node's failure reaches etcd first: rank 0 giving up on the
            # stopped rank 1 is its victim (the first-failure rule, docs/rendezvous.md).
            self.assertEqual((reason["rank"], reason["node_rank"], reason.get("hung"),
                              reason["cause"]), (1, 1, True, "worker_failed"),
                             (restart, self.logs(["n0", "n1"])))

    @unittest.skipUnless(test_train.have_fashion(), "Fashion-MNIST is not installed")
    def test_a_slowed_rank_is_named_on_two_nodes_and_nobody_before(self):
        """The job-wide straggler rule over etcd: node 0's agent runs it over every node's
        report and puts its verdict, which every agent reads with its own report's put; rank 1
        (node 1), slowed, is named on both nodes and by `dlaunch status`, nobody before."""
        procs = self.two_agents(list(self.STRAGGLER_OPTS), *self.STRAGGLER_TRAIN)
        self.even_then_slow(["n0", "n1"])
        p = subprocess.run([dltest.DLAUNCH, "status", "--rdzv-backend", "etcd", "--endpoint",
                            self.cluster.endpoints, "job"],
                           capture_output=True, text=True, timeout=30)
        self.assertRegex(p.stdout, r"straggler: rank 1 on node 1 \(.*\): [0-9.]+ ms a step")
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(timeout=60)

    @unittest.skipUnless(test_train.have_fashion(), "Fashion-MNIST is not installed")
    def test_exclude_drops_the_slow_node_and_the_job_finishes(self):
        """test_diag's, over etcd: the slow node, named by node 0's rule, steps out (a new
        round without it, no restart spent) and node 0 finishes alone."""
        ckpt = os.path.join(self.dir, "ckpt")
        procs = self.two_agents(
            ["--straggler-action", "exclude", "--max-restarts", "1", "--last-call", "1",
             "--recovery", "restart", *self.STRAGGLER_OPTS],
            "steps=1500", "layers=784-128-10", "log_every=500", "eval_every=1000000",
            f"checkpoint_dir={ckpt}", "checkpoint_every=50", "slow_rank=1",
            f"slow_ms_per_step={test_diag.Diag.SLOW_MS}", nodes="1:2")
        for p in procs:
            self.assertEqual(p.wait(timeout=180), 0, self.logs(["n0", "n1"]))
        s = self.stragglers("n1")
        self.assertEqual([(e["rank"], e["node_rank"], e["action"]) for e in s],
                         [(1, 1, "exclude")])
        rdzv = [(e["round"], e["nodes"]) for e in self.evs("n0") if e["event"] == "rendezvous"]
        self.assertEqual(rdzv, [(0, 2), (1, 1)])
        end0 = [e for e in self.evs("n0") if e["event"] == "job_end"]
        self.assertEqual(end0[0]["status"], "succeeded")
        self.assertIn("straggler: rank 1 on node 1", self.log("n0"))
        self.assertIn("sat out as a straggler", self.log("n1"))
        self.assertRegex(self.read("dlaunch_logs", "job", "attempt_1", "rank_0.out"),
                         r"done after 1500 steps")


@unittest.skipUnless(etcdlib.have_etcd(), "etcd-server is not installed (scripts/deps.sh test)")
class Jobs(EtcdCase):
    def test_two_and_three_agents_form_one_job(self):
        for n in (2, 3):
            run = f"job{n}"
            cmd = ["--", "sh", "-c", "echo $RANK $WORLD_SIZE $GROUP_RANK $LOCAL_RANK"]
            names = [f"n{n}a{i}" for i in range(n)]
            procs = [self.agent(*cmd, name=x, nodes=str(n), run_id=run) for x in names]
            self.assertEqual(self.wait_all(procs), [0] * n, self.logs(names))
            ranks = {}
            base = os.path.join(self.dir, "dlaunch_logs", run, "attempt_0")
            for f in os.listdir(base):
                if f.endswith(".out"):
                    ranks[int(f[5:-4])] = self.read(os.path.join(base, f)).split()
            self.assertEqual(sorted(ranks), list(range(2 * n)))
            for rank, (r, world, group, local) in ranks.items():
                self.assertEqual(int(r), rank)
                self.assertEqual(int(world), 2 * n)
                self.assertEqual(int(group) * 2 + int(local), rank)
            rdzv = [e for x in names for e in rounds(self.evs(x))]
            self.assertEqual(sorted(e["node_rank"] for e in rdzv), list(range(n)))
            self.assertEqual({e["world_size"] for e in rdzv}, {2 * n})
            self.assertEqual(len({(e["master_addr"], e["master_port"]) for e in rdzv}), 1)

    def test_watch_messages_grow_with_the_nodes_not_their_square(self):
        """What etcd sends to watchers for a whole job of N agents (join, run, done, end) is
        O(N): each agent follows the state key and one other member's key, never every join.
        Following the whole prefix, 12 agents made etcd send about 600 events (4 N^2)."""
        def sent():
            total = 0.0
            for i in range(3):
                with urllib.request.urlopen(f"http://{self.cluster.endpoint(i)}/metrics",
                                            timeout=10) as r:
                    m = re.search(r"^etcd_debugging_mvcc_events_total (\S+)$",
                                  r.read().decode(), re.M)
                self.assertIsNotNone(m, "etcd's /metrics has no events_total")
                total += float(m.group(1))
            return total
        n = 12
        before = sent()
        names = [f"w{i}" for i in range(n)]
        procs = [self.agent("--", "true", name=x, nodes=str(n), slots="1") for x in names]
        self.assertEqual(self.wait_all(procs, timeout=120), [0] * n, self.logs(names))
        time.sleep(0.5)
        events = sent() - before
        self.assertLessEqual(events, 6 * n, f"{events} watch events for {n} agents")

    def test_the_state_every_agent_watches_does_not_grow_with_the_nodes(self):
        """The state document that closes a round, which every agent's watch brings, is the
        round's summary however many nodes run; each node's assignment is a key of its own
        that only it reads. A round of N agents is O(N) bytes, not N copies of a list of N
        nodes (issue #27: 160 MB of JSON for 1,024 agents)."""
        n = 12
        names = [f"s{i}" for i in range(n)]
        procs = [self.agent("--", "sleep", "60", name=x, nodes=str(n), slots="1")
                 for x in names]
        self.wait_for(lambda: all(rounds(self.evs(x)) for x in names), timeout=90,
                      what=f"{n} assignments\n" + self.logs(names))
        keys = self.cluster.get_prefix("/dlaunch/job/")
        state = json.loads(keys["/dlaunch/job/state"])
        self.assertEqual(state["state"], "running")
        self.assertLess(len(keys["/dlaunch/job/state"]), 1024, keys["/dlaunch/job/state"])
        self.assertNotIn("nodes", state)
        mine = {k: json.loads(v) for k, v in keys.items()
                if k.startswith(f"/dlaunch/job/a/0/{state['assignment']}/")}
        self.assertEqual(sorted(a["node_rank"] for a in mine.values()), list(range(n)))
        # Every agent took the rank its key names, and they all agree on the rest.
        rdzv = [rounds(self.evs(x))[0] for x in names]
        self.assertEqual(sorted(e["node_rank"] for e in rdzv), list(range(n)))
        self.assertEqual({e["world_size"] for e in rdzv}, {n})
        for p in procs:
            p.kill()

    def test_job_spec_and_environment(self):
        """rdzv_backend and rdzv_endpoint in the YAML job spec, DLAUNCH_* in the environment:
        like every option."""
        spec = self.write("job.yaml", f"""nodes: 2
gpus_per_node: 1
run_id: yamljob
rdzv_backend: etcd
rdzv_endpoint: "{self.cluster.endpoints}"
heartbeat: 0.2
command: [sh, -c, 'echo $RANK of $WORLD_SIZE']
""")
        bare = dltest.Cluster(self, endpoint=False, run_id=None)  # no flag but --events
        bare.agent(spec, name="yaml")
        bare.agent("--", "sh", "-c", "echo $RANK of $WORLD_SIZE", name="env", env=dict(
            DLAUNCH_RDZV_BACKEND="etcd", DLAUNCH_RDZV_ENDPOINT=self.cluster.endpoints,
            DLAUNCH_NODES="2", DLAUNCH_RUN_ID="yamljob", DLAUNCH_GPUS_PER_NODE="1"))
        codes = bare.wait_all(["yaml", "env"], timeout=60)
        out = [bare.log("yaml"), bare.log("env")]
        self.assertEqual(codes, [0, 0], "\n".join(out))
        self.assertEqual(sorted(re.findall(r"\] (\d) of 2", "".join(out))), ["0", "1"])

    def test_node_rank_hints_and_deterministic_order(self):
        # --node-rank is honoured, as by our own rendezvous.
        cmd = ["--", "sh", "-c", "echo $GROUP_RANK"]
        procs = [self.agent("--node-rank", "1", *cmd, name="one"),
                 self.agent("--node-rank", "0", *cmd, name="zero")]
        self.assertEqual(self.wait_all(procs), [0, 0], self.logs(["one", "zero"]))
        self.assertEqual(rounds(self.evs("one"))[0]["node_rank"], 1)
        self.assertEqual(rounds(self.evs("zero"))[0]["node_rank"], 0)

    def test_a_failed_worker_restarts_every_node(self):
        script = ('if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && [ "$RANK" = 3 ]; then exit 4; fi;'
                  'sleep 0.3; echo $RANK restart $TORCHELASTIC_RESTART_COUNT')
        procs = [self.agent("--max-restarts", "1", "--", "sh", "-c", script, name=n)
                 for n in ("a", "b")]
        self.assertEqual(self.wait_all(procs), [0, 0], self.logs("ab"))
        ranks = self.ranks_from_logs(attempt=1)
        self.assertEqual(sorted(ranks), [0, 1, 2, 3])
        for rank, words in ranks.items():
            self.assertEqual(words, [str(rank), "restart", "1"])
        # Every agent's restart event names the culprit, as with our own rendezvous.
        for n in "ab":
            restart = [e for e in self.evs(n) if e["event"] == "restart"]
            self.assertEqual(len(restart), 1, self.evs(n))
            why = restart[0]["reason"]
            self.assertEqual(tuple(why.get(k) for k in ("cause", "rank", "exit_code", "node_rank")),
                             ("worker_failed", 3, 4, 1), (n, why, self.logs("ab")))

    @unittest.skipUnless(test_train.have_fashion(), "Fashion-MNIST is not installed")
    def test_the_bundled_trainer_recovers_in_job(self):
        """In-job recovery, the bundled trainer's default, over etcd as over our own rendezvous:
        rank 3 (node 1) SIGKILLed in a step; node 0 keeps its workers, node 1 replaces rank 3,
        nothing restarts and the job finishes on both nodes."""
        data = os.path.join(self.dir, "data")
        os.mkdir(data)
        test_train.write_subset(data)
        spec = self.write("job.yaml", f"""max_restarts: 2
train:
  dataset_dir: {data}
  steps: 400
  batch_size: 32
  log_every: 100
  fail_at_step: 150
  fail_rank: 3
""")
        procs = [self.agent("--node-rank", str(i), spec, name=n) for i, n in enumerate("ab")]
        self.assertEqual(self.wait_all(procs, timeout=180), [0, 0], self.logs("ab"))
        for n in "ab":
            self.assertEqual([e for e in self.evs(n) if e["event"] == "restart"], [],
                             self.logs("ab"))
        started = {n: [e["rank"] for e in self.evs(n) if e["event"] == "worker_start"]
                   for n in "ab"}
        self.assertEqual(started, {"a": [0, 1], "b": [2, 3, 3]}, self.logs("ab"))
        rec = [e for e in self.evs("b") if e["event"] == "recovery"]
        self.assertEqual([e["status"] for e in rec], ["started", "done"], rec)
        self.assertEqual(rec[-1]["replaced"], [3], rec)
        self.assertNotIn("resuming from", self.logs("ab"))

    def test_restarts_exhausted_fail_every_node(self):
        procs = [self.agent("--max-restarts", "1", "--", "sh", "-c",
                            '[ "$RANK" = 0 ] && exit 6; sleep 5', name=n) for n in ("a", "b")]
        self.assertEqual(self.wait_all(procs), [1, 1], self.logs("ab"))
        both = self.log("a") + self.log("b")
        self.assertIn("rank 0", both)
        self.assertIn("exited with code 6", both)

    def test_join_timeout_exits_3(self):
        p = self.agent("--join-timeout", "1", "--", "true", name="alone")
        # The agent's own --join-timeout 30 comes first in its command line; the later wins.
        self.assertEqual(p.wait(timeout=30), 3, self.log("alone"))
        self.assertIn("timed out", self.log("alone"))

    def test_sigterm_to_one_agent_is_a_departure_not_a_lost_node(self):
        """docs/rendezvous.md, docs/etcd.md: a stop signal to one agent is a departure, as with
        our rendezvous: with MIN nodes left (1:2) the other goes on alone at once, no restart
        spent (--max-restarts 0 still finishes) and its restart event says node_left; with
        fewer (2:2) the other stops with exit 0. Before, its lease's end read to the others as
        a lost node: a restart spent, and a 2:2 job waited --join-timeout for a round that
        could not close."""
        for nodes in ("1:2", "2:2"):
            with self.subTest(nodes=nodes):
                tag = nodes.replace(":", "")
                stop = os.path.join(self.dir, f"stop{tag}")
                common = ["--last-call", "0.5", "--max-restarts", "0", "--stop-timeout", "2",
                          "--", "sh", "-c", f"while [ ! -e {stop} ]; do sleep 0.05; done"]
                names = [f"a{tag}", f"b{tag}"]
                procs = [self.agent(*common, name=n, nodes=nodes, slots="1", run_id=f"j{tag}")
                         for n in names]
                self.wait_for(lambda: all(self.world(n) == 2 for n in names), what="2 nodes")
                procs[1].send_signal(signal.SIGTERM)
                self.assertEqual(procs[1].wait(timeout=30), 128 + signal.SIGTERM,
                                 self.logs(names))
                if nodes == "2:2":
                    self.assertEqual(procs[0].wait(timeout=15), 0, self.logs(names))
                    end = [e for e in self.evs(names[0]) if e["event"] == "job_end"]
                    self.assertEqual(end[-1]["status"], "stopped", end)
                else:
                    self.wait_for(lambda: self.world(names[0]) == 1, what="1 node")
                    open(stop, "w").close()
                    self.assertEqual(procs[0].wait(timeout=30), 0, self.logs(names))
                    restarts = [e for e in self.evs(names[0]) if e["event"] == "restart"]
                    self.assertEqual([e["reason"]["cause"] for e in restarts], ["node_left"],
                                     restarts)
                self.assertNotIn("was lost", self.log(names[0]))

    def test_dead_agent_new_round_then_grows_back(self):
        """--nodes 1:3, one agent SIGKILLed mid-job: the others go on in a new round within
        dead-after plus one heartbeat; a new agent brings the job back to three nodes."""
        stop = os.path.join(self.dir, "stop")
        common = ["--last-call", "0.5", "--dead-after", "1", "--max-restarts", "5",
                  "--stop-timeout", "2", "--", "sh", "-c",
                  f'while [ ! -e {stop} ]; do sleep 0.05; done']
        names = ["a", "b", "c"]
        procs = [self.agent(*common, name=n, nodes="1:3", slots="1") for n in names]
        self.wait_for(lambda: all(self.world(n) == 3 for n in names), what="3 nodes",
                      timeout=30)
        victim = procs[2]
        killed_at = time.time()
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        t0 = time.monotonic()
        t1 = self.wait_for(lambda: all(self.world(n) == 2 for n in "ab"), what="2 nodes")
        # The round changed (the event the agent that saw it first wrote to etcd) within
        # dead-after plus one heartbeat, and the half second etcd's lessor may take to revoke
        # an expired lease; a little more for a loaded machine.
        changed = [json.loads(v) for k, v in self.cluster.get_prefix("/dlaunch/job/ev/").items()
                   if json.loads(v)["event"] == "round_changed"]
        self.assertEqual(len(changed), 1, changed)
        self.assertLess(changed[0]["time"] - killed_at, 1 + 0.2 + 0.5 + 1.0, changed)
        print(f"\nround change {changed[0]['time'] - killed_at:.2f} s after the kill, "
              f"the new round running {t1 - t0:.2f} s after it", file=sys.stderr)
        # dead-after (1 s, whole seconds of an etcd lease) plus a heartbeat, the lessor's
        # half-second revocation, the last call (0.5 s) and the workers' stop: generous margin
        # for a loaded machine.
        self.assertLess(t1 - t0, 1 + 0.2 + 6, self.logs("ab"))
        self.assertIn("was lost", self.log("a") + self.log("b"))
        procs.append(self.agent(*common, name="d", nodes="1:3", slots="1"))
        self.wait_for(lambda: all(self.world(n) == 3 for n in "abd"), what="3 nodes again")
        open(stop, "w").close()
        self.assertEqual(self.wait_all([procs[0], procs[1], procs[3]]), [0, 0, 0],
                         self.logs("abd"))

    def test_store_server_killed_the_others_go_on(self):
        """The node 0 agent (which serves its workers' store) SIGKILLed: a new round with
        another node 0 and a fresh store, well before the join timeout."""
        stop = os.path.join(self.dir, "stop")
        # Every worker writes and reads its key through the round's store.
        script = (f'"{dltest.DLAUNCH}" kv set k$RANK v$TORCHELASTIC_RESTART_COUNT || exit 9; '
                  f'"{dltest.DLAUNCH}" kv get k$RANK >> {self.dir}/kv.$RANK || exit 9; '
                  f'echo $DLAUNCH_STORE >> {self.dir}/store.$RANK; '
                  f'while [ ! -e {stop} ]; do sleep 0.05; done')
        common = ["--last-call", "0.5", "--dead-after", "1", "--max-restarts", "3",
                  "--stop-timeout", "2", "--", "sh", "-c", script]
        names = ["a", "b", "c"]
        procs = {n: self.agent(*common, name=n, nodes="2:3", slots="1") for n in names}

        def lines(path):
            return self.read(path).split() if os.path.exists(os.path.join(self.dir, path)) else []

        self.wait_for(lambda: all(self.world(n) == 3 for n in names), what="3 nodes")
        self.wait_for(lambda: all(len(lines(f"store.{r}")) >= 1 for r in (0, 1, 2)),
                      what="the first round's workers to use the store")
        zero = next(n for n in names if rounds(self.evs(n))[-1]["node_rank"] == 0)
        first_round = rounds(self.evs(zero))[-1]["round"]
        procs[zero].send_signal(signal.SIGKILL)
        procs[zero].wait()
        t0 = time.monotonic()
        rest = [n for n in names if n != zero]
        t1 = self.wait_for(lambda: all(self.world(n) == 2 for n in rest), what="2 nodes")
        self.assertLess(t1 - t0, 10, self.logs(rest))
        new = [rounds(self.evs(n))[-1] for n in rest]
        self.assertEqual(sorted(e["node_rank"] for e in new), [0, 1])
        self.assertGreater(new[0]["round"], first_round)
        # The new round's store answers (every worker got its key back) and is another one.
        self.wait_for(lambda: all(len(lines(f"store.{r}")) >= 2 for r in (0, 1)),
                      what="the second round's workers to use the store")
        for r in (0, 1):
            self.assertEqual(lines(f"kv.{r}")[-1], f"v{new[0]['round']}")
            stores = lines(f"store.{r}")
            self.assertNotEqual(stores[0], stores[-1])
        open(stop, "w").close()
        self.assertEqual(self.wait_all([procs[n] for n in rest]), [0, 0], self.logs(rest))

    def test_store_on_a_non_loopback_address_without_a_token(self):
        """No --token-file: the store of node 0, on an address other nodes can reach, is
        guarded by the key the job keeps in etcd; the workers get its worker key."""
        addr = subprocess.run(["hostname", "-I"], capture_output=True,
                              text=True).stdout.split()
        addr = [a for a in addr if "." in a and not a.startswith("127.")]
        if not addr:
            self.skipTest("no non-loopback IPv4 address here")
        script = (f'"{dltest.DLAUNCH}" kv set k$RANK v && "{dltest.DLAUNCH}" kv get k$RANK && '
                  f'echo $DLAUNCH_STORE && test -n "$DLAUNCH_TOKEN_FILE" && '
                  f'{{ env -u DLAUNCH_TOKEN_FILE "{dltest.DLAUNCH}" kv get k$RANK; test $? = 4; }}')
        procs = [self.agent("--local-addr", addr[0], "--", "sh", "-c", script, name=n)
                 for n in "ab"]
        self.assertEqual(self.wait_all(procs), [0, 0], self.logs("ab"))
        out = self.read("dlaunch_logs/job/attempt_0/rank_0.out").split()
        self.assertEqual(out[0], "v")
        self.assertTrue(out[1].startswith(addr[0] + ":"), out)


@unittest.skipUnless(etcdlib.have_etcd(), "etcd-server is not installed (scripts/deps.sh test)")
class Members(EtcdCase):
    def job(self, names, seconds, dead_after="3"):
        script = f'sleep {seconds}; echo done $RANK'
        return [self.agent("--max-restarts", "0", "--dead-after", dead_after, "--", "sh", "-c",
                           script, name=n, heartbeat="0.3") for n in names]

    def test_one_member_killed_the_job_does_not_notice(self):
        procs = self.job("ab", 6)
        self.wait_for(lambda: all(self.world(n) == 4 for n in "ab"), what="the job")
        self.cluster.kill(0)
        time.sleep(1)
        self.cluster.kill(0)  # no-op: already gone
        self.assertEqual(self.wait_all(procs), [0, 0], self.logs("ab"))
        for n in "ab":
            self.assertEqual(len(rounds(self.evs(n))), 1, self.log(n))
            self.assertNotIn("round 1", self.log(n))

    def test_two_members_killed_lost_quorum_then_back(self):
        # Every member restarts from its disk: the leases (--dead-after long) must outlast the
        # first keepalive after the new leader, which a sanitizer build's agent sent 3 s late.
        procs = self.job("ab", 12, dead_after="8")
        self.wait_for(lambda: all(self.world(n) == 4 for n in "ab"), what="the job")
        self.cluster.kill(1)
        self.cluster.kill(2)
        self.wait_for(lambda: all("lost quorum" in self.log(n) for n in "ab"), timeout=30,
                      what="the agents to say they lost the quorum")
        # Then no member at all: the cause changes, and each agent says so again, once.
        self.cluster.kill(0)
        self.wait_for(lambda: all("(unreachable)" in self.log(n) for n in "ab"), timeout=30,
                      what="the agents to say etcd is unreachable")
        for i in range(3):
            self.cluster.restart(i, wait=False)
        self.assertEqual(self.wait_all(procs, timeout=60), [0, 0], self.logs("ab"))
        both = self.log("a") + self.log("b")
        self.assertIn("lost quorum", both)
        self.assertIn("etcd answers again", both)
        for n in "ab":
            self.assertEqual(len(rounds(self.evs(n))), 1, self.log(n))
            said = re.findall(r"etcd at \S+: .* \((lost quorum|unreachable)\); the job goes on",
                              self.log(n))
            self.assertEqual(said, ["lost quorum", "unreachable"], self.log(n))
        # docs/etcd.md says what the agents do: once, and again when the cause changes.
        with open(os.path.join(ROOT, "docs", "etcd.md")) as f:
            row = next(l for l in f if l.startswith("| etcd loses its quorum"))
        self.assertIn("again when the cause changes", row)

    def held_job(self, names, stop, *extra):
        """Agents of a 2-node job whose workers run until the file stop exists."""
        script = f'echo "worker rank=$RANK"; while [ ! -e {stop} ]; do sleep 0.05; done'
        return [self.agent("--max-restarts", "3", "--dead-after", "3", *extra, "--", "sh", "-c",
                           script, name=n, heartbeat="0.3") for n in names]

    def test_a_node_made_again_waits_for_the_lost_ones_place(self):
        # As a pod made again with the same index: it comes while the job still has its two
        # nodes (the lost one's lease has not run out), waits, and takes the place once it has
        # (our rendezvous's job_full, test_kubernetes).
        stop = os.path.join(self.dir, "stop")
        a, b = self.held_job("ab", stop)
        self.wait_for(lambda: all(self.world(n) == 4 for n in "ab"), what="the job")
        b.kill()
        b.wait()
        c = self.held_job("c", stop)[0]
        self.wait_for(lambda: self.world("c") == 4, timeout=60, what="c's place in the job")
        self.assertRegex(self.log("c"), r"runs round \d+ with the maximum of 2 nodes: waiting "
                                        r"for a place")
        open(stop, "w").close()
        self.assertEqual(self.wait_all([a, c]), [0, 0], self.logs("ac"))

    def test_a_newcomer_to_a_full_job_is_refused_at_the_join_timeout(self):
        stop = os.path.join(self.dir, "stop")
        procs = self.held_job("ab", stop)
        self.wait_for(lambda: all(self.world(n) == 4 for n in "ab"), what="the job")
        c = self.held_job("c", stop, "--join-timeout", "2")[0]
        self.assertEqual(c.wait(timeout=60), 4, self.log("c"))
        self.assertRegex(self.log("c"), r"with the maximum of 2 nodes, not one free within "
                                        r"--join-timeout 2 s")
        open(stop, "w").close()
        self.assertEqual(self.wait_all(procs), [0, 0], self.logs("ab"))


@unittest.skipUnless(etcdlib.have_etcd(), "etcd-server is not installed (scripts/deps.sh test)")
class Control(EtcdCase):
    def ctl(self, *args, check_code=None, conf=None):
        extra = ["--rdzv-conf", conf] if conf else []
        return self.dlaunch(args[0], "--rdzv-backend", "etcd", "--endpoint",
                            self.cluster.endpoints, *extra, *args[1:], check_code=check_code,
                            timeout=60)

    def test_status_restart_events_stop(self):
        script = 'echo restart=$TORCHELASTIC_RESTART_COUNT; exec sleep 60'
        # No restart budget: an operator's restart is no failure and spends none.
        procs = [self.agent("--max-restarts", "0", "--", "sh", "-c", script, name=n)
                 for n in ("a", "b")]
        self.wait_for(lambda: all(any(e["event"] == "worker_start" for e in self.evs(n))
                                  for n in "ab"), what="the workers")
        st = json.loads(self.ctl("status", "--json", "job", check_code=0).stdout)
        self.assertEqual(st["state"], "running")
        self.assertEqual(st["round"], 0)
        self.assertEqual(st["world_size"], 4)
        self.assertEqual(sorted(n["node_rank"] for n in st["nodes"]), [0, 1])
        text = self.ctl("status", "job", check_code=0).stdout
        self.assertIn("job: running, round 0, restarts 0 of 0, nodes 2..2, world size 4", text)
        everything = json.loads(self.ctl("status", "--json", check_code=0).stdout)
        self.assertEqual([j["run_id"] for j in everything["jobs"]], ["job"])

        r = self.ctl("restart", "--json", "job", check_code=0)
        self.assertEqual(json.loads(r.stdout), {"round": 1})
        self.wait_for(lambda: all(len(rounds(self.evs(n))) == 2 for n in "ab"),
                      what="round 1")
        self.assertIn("restart requested with dlaunch", self.log("a"))
        st = json.loads(self.ctl("status", "--json", "job", check_code=0).stdout)
        self.assertEqual((st["round"], st["restarts"]), (1, 0))

        follower = self.start("events", "--rdzv-backend", "etcd", "--endpoint",
                              self.cluster.endpoints, "job")
        self.procs.append(follower)
        time.sleep(0.5)
        self.assertEqual(self.ctl("stop", "job", check_code=0).stdout.strip(), "job: stopping")
        self.assertEqual(self.wait_all(procs), [0, 0], self.logs("ab"))
        out, err = follower.communicate(timeout=30)
        self.assertEqual(follower.returncode, 0, err)
        evs = [json.loads(l) for l in out.splitlines()]
        self.assertEqual([e["event"] for e in evs if e["event"] != "log"],
                         ["rendezvous", "round_changed", "rendezvous", "job_end"])
        self.assertEqual(evs[-1]["status"], "stopped")
        # Our rendezvous' log lines with them, each with a seq of its own, in order.
        self.assertEqual([e["text"].split(":")[0] for e in evs if e["event"] == "log"],
                         ["job created", "round 0 closed", "round 0 -> 1 (no failure",
                          "round 1 closed"], evs)
        self.assertEqual([e["seq"] for e in evs], sorted({e["seq"] for e in evs}), evs)
        for n in "ab":
            self.assertIn("was stopped on request", self.log(n))
        # Gone, or going: a stopped job answers for a while, then its keys are deleted.
        self.ctl("stop", "job", check_code=1)

    def test_unknown_job_and_gathering_restart(self):
        r = self.ctl("status", "nosuch", check_code=1)
        self.assertIn("no job 'nosuch'", r.stderr)
        p = self.agent("--", "true", name="lonely")
        self.wait_for(lambda: "gathering" in self.ctl("status", "job").stdout, what="gathering")
        r = self.ctl("restart", "job", check_code=1)
        self.assertIn("still gathering", r.stderr)
        p.kill()


@unittest.skipUnless(etcdlib.have_etcd(), "etcd-server is not installed (scripts/deps.sh test)")
class Errors(EtcdCase):
    def test_unreachable_cluster_one_line_exit_3(self):
        self.cluster.stop()
        p = self.agent("--join-timeout", "2", "--", "true", name="x")
        self.assertEqual(p.wait(timeout=60), 3, self.log("x"))
        lines = [l for l in self.log("x").splitlines() if l.startswith("dlaunch: ")
                 and "warning" not in l and "run job" not in l]
        self.assertEqual(len(lines), 1, self.log("x"))
        self.assertRegex(lines[0], r"etcd at 127\.0\.0\.1:\d+: .*\(unreachable\)")

    def test_lost_quorum_past_join_timeout_exit_3(self):
        p = self.agent("--join-timeout", "3", "--dead-after", "2", "--", "sleep", "60",
                       name="x", nodes="1")
        self.wait_for(lambda: self.world("x") == 2, what="the job")
        self.cluster.kill(1)
        self.cluster.kill(2)
        self.assertEqual(p.wait(timeout=60), 3, self.log("x"))
        self.assertIn("lost quorum", self.log("x"))
        self.assertRegex(self.log("x"), r"dlaunch: etcd at .*\(lost quorum\) for \d+ s, past "
                                        r"--join-timeout: giving up")

    def test_bad_endpoint_and_conf_exit_2(self):
        r = self.dlaunch("--rdzv-backend", "etcd", "--rdzv-endpoint", "nohost", "--run-id",
                         "j", "--", "true", check_code=2)
        self.assertIn("'nohost' is not HOST:PORT", r.stderr)
        r = self.dlaunch("--rdzv-backend", "etcd", "--run-id", "j", "--", "true", check_code=2)
        self.assertIn("needs --rdzv-endpoint", r.stderr)
        r = self.dlaunch("--rdzv-backend", "etcd", "--rdzv-endpoint", self.cluster.endpoints,
                         "--rdzv-conf", "protocol=gopher", "--run-id", "j", "--", "true",
                         check_code=2)
        self.assertIn("gopher", r.stderr)

    def test_keys_under_the_prefix_deleted_at_job_end(self):
        procs = [self.agent("--rdzv-conf", "prefix=/site/jobs/j1", "--", "true", name=n)
                 for n in "ab"]
        self.assertEqual(self.wait_all(procs), [0, 0], self.logs("ab"))
        self.assertEqual(self.cluster.get_prefix("/dlaunch/"), {})
        left = self.cluster.get_prefix("/site/jobs/j1/")
        # Right after the end only the settings, the state and the events stay, on a lease
        # that ends them shortly (dlaunch status answers meanwhile); members and marks are gone.
        self.assertTrue(set(left) <= {"/site/jobs/j1/job", "/site/jobs/j1/state"} |
                        {k for k in left if k.startswith("/site/jobs/j1/ev/")}, left)
        self.assertEqual(json.loads(left["/site/jobs/j1/state"])["state"], "succeeded")
        # Meanwhile the run id is the finished job's, as with our own rendezvous.
        again = self.agent("--rdzv-conf", "prefix=/site/jobs/j1", "--", "true", name="again")
        self.assertEqual(again.wait(timeout=30), 4, self.log("again"))
        self.assertIn("join: job 'job' is over (succeeded)", self.log("again"))
        self.wait_for(lambda: self.cluster.get_prefix("/site/jobs/j1/") == {}, timeout=20,
                      what="the job's keys to go")
        # Then it is free again.
        fresh = self.agent("--rdzv-conf", "prefix=/site/jobs/j1", "--", "true", name="fresh",
                           nodes="1")
        self.assertEqual(fresh.wait(timeout=30), 0, self.log("fresh"))


@unittest.skipUnless(etcdlib.have_etcd(), "etcd-server is not installed (scripts/deps.sh test)")
class Auth(EtcdCase):
    def setUp(self):
        super().setUp()
        self.cluster.enable_auth("dl", "s3cret")
        self.good = self.write("good.pw", "s3cret\n")
        self.bad = self.write("bad.pw", "guess\n")
        os.chmod(self.good, 0o600)
        os.chmod(self.bad, 0o600)

    def test_user_password_and_a_wrong_one(self):
        conf = f"user=dl,password_file={self.good}"
        procs = [self.agent("--rdzv-conf", conf, "--", "sh", "-c", "echo $RANK", name=n)
                 for n in "ab"]
        self.assertEqual(self.wait_all(procs), [0, 0], self.logs("ab"))
        p = self.agent("--rdzv-conf", f"user=dl,password_file={self.bad}", "--", "true",
                       name="intruder", run_id="other")
        self.assertEqual(p.wait(timeout=60), 4, self.log("intruder"))
        self.assertRegex(self.log("intruder"),
                         r"dlaunch: etcd at 127\.0\.0\.1:\d+: .*authentication failed.*\(refused\)")
        # No credentials at all: refused too.
        p = self.agent("--", "true", name="anon", run_id="other2")
        self.assertEqual(p.wait(timeout=60), 4, self.log("anon"))
        # The control commands take the same --rdzv-conf.
        r = self.dlaunch("status", "--rdzv-backend", "etcd", "--endpoint",
                         self.cluster.endpoints, "--rdzv-conf", f"user=dl,password_file={self.bad}",
                         "job", check_code=4)
        self.assertIn("authentication failed", r.stderr)

    def test_password_file_readable_by_others_is_refused(self):
        os.chmod(self.good, 0o644)
        r = self.dlaunch("--rdzv-backend", "etcd", "--rdzv-endpoint", self.cluster.endpoints,
                         "--rdzv-conf", f"user=dl,password_file={self.good}", "--run-id", "j",
                         "--", "true", check_code=2)
        self.assertIn("chmod 600", r.stderr)


@unittest.skipUnless(etcdlib.have_etcd(), "etcd-server is not installed (scripts/deps.sh test)")
class Tls(EtcdCase):
    tls = True

    def conf(self, ca=None):
        c = self.cluster.certs
        return (f"protocol=https,cacert={ca or c['ca']},cert={c['client_cert']},"
                f"key={c['client_key']}")

    def test_tls_with_certificates_made_here(self):
        procs = [self.agent("--rdzv-conf", self.conf(), "--", "sh", "-c", "echo $RANK", name=n)
                 for n in "ab"]
        self.assertEqual(self.wait_all(procs), [0, 0], self.logs("ab"))
        st = self.dlaunch("status", "--rdzv-backend", "etcd", "--endpoint",
                          self.cluster.endpoints, "--rdzv-conf", self.conf(), "--json", "job",
                          check_code=0)
        self.assertEqual(json.loads(st.stdout)["state"], "succeeded")
        # A CA that signed nothing of this cluster: refused, exit 4, one line naming TLS.
        p = self.agent("--rdzv-conf", self.conf(ca=self.cluster.certs["other_ca"]), "--",
                       "true", name="wrongca", run_id="other")
        self.assertEqual(p.wait(timeout=60), 4, self.log("wrongca"))
        self.assertRegex(self.log("wrongca"), r"dlaunch: etcd at 127\.0\.0\.1:\d+: TLS: ")
        # Plain http to an https cluster: no answer etcd would give.
        p = self.agent("--join-timeout", "2", "--", "true", name="plain", run_id="other2")
        self.assertIn(p.wait(timeout=60), (3, 4), self.log("plain"))


@unittest.skipUnless(etcdlib.have_etcd(), "etcd-server is not installed (scripts/deps.sh test)")
class Writers(EtcdCase):
    """Another client with write access to the job's prefix (issue #32, 6) can disturb the job,
    never run code in it."""

    def test_an_assignment_written_by_another_client_is_validated(self):
        seen = os.path.join(self.dir, "seen")
        p = self.agent("--", "sh", "-c", f'printf %s "$MASTER_ADDR" > {seen}-$RANK', name="a")
        members = {}

        def joined():
            members.update({k: v for k, v in self.cluster.get_prefix("/dlaunch/job/m/").items()})
            return members

        self.wait_for(joined, what="the agent's member key")
        node_id, doc = next(iter(members.items()))
        node_id = node_id[len("/dlaunch/job/m/"):]
        store = json.loads(doc)["store"]
        state = {"state": "running", "round": 0, "restarts": 0, "max_restarts": 0,
                 "min_nodes": 2, "max_nodes": 2, "world_size": 4, "master_port": 29500,
                 "master_addr": "127.0.0.1\nLD_PRELOAD=/tmp/evil.so", "store_addr": store,
                 "assignment": 1, "node_count": 2, "node0": node_id}
        self.cluster.ctl("put", f"/dlaunch/job/a/0/1/{node_id}",
                         json.dumps({"node_id": node_id, "node_rank": 0, "first_rank": 0,
                                     "slots": 2, "next": "ghost"}))
        self.cluster.ctl("put", "/dlaunch/job/state", json.dumps(state))
        try:
            rc = p.wait(timeout=40)
        except subprocess.TimeoutExpired:
            rc = None
        ran = [f for f in os.listdir(self.dir) if f.startswith("seen-")]
        self.assertEqual(ran, [], "workers ran with MASTER_ADDR " +
                         repr([self.read(f) for f in ran]))
        self.assertEqual(rc, 4, self.log("a"))
        self.assertIn("an assignment this node cannot take", self.log("a"))
        self.assertIn("master_addr", self.log("a"))

    def test_a_value_of_another_shape_is_one_line_naming_its_key_and_field(self):
        # The job's values are read by their tables (etcd/job-records.h): a state whose round is
        # a string is refused where it is read, by the agent that watches it and by status,
        # never taken for round 0.
        p = self.agent("--", "true", name="a")
        self.wait_for(lambda: self.cluster.get_prefix("/dlaunch/job/m/"),
                      what="the agent's member key")
        self.cluster.ctl("put", "/dlaunch/job/state",
                         json.dumps({"state": "gathering", "round": "1", "restarts": 0}))
        want = "etcd key /dlaunch/job/state: field 'round' must be an integer, got a string"
        self.assertEqual(p.wait(timeout=40), 4, self.log("a"))
        self.assertIn(want, self.log("a"))
        r = self.dlaunch("status", "--rdzv-backend", "etcd", "--endpoint",
                         self.cluster.endpoints, "job", check_code=4, timeout=60)
        lines = r.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, r.stderr)
        self.assertTrue(lines[0].startswith("dlaunch: etcd at ") and lines[0].endswith(want),
                        r.stderr)


class SameFailure(EtcdCase):
    """docs/exit-codes.md, 5, with --rdzv-backend etcd: the job's state counts the same failure
    round after round and ends the job with 5 on every node, restarts left unspent; a failure
    that changes spends them all as before."""

    def run_job(self, script, tag, max_restarts):
        procs = [self.agent("--node-rank", str(i), "--max-restarts", str(max_restarts),
                            "--stop-timeout", "2", "--", "sh", "-c",
                            script, name=f"{n}{tag}", slots="1", run_id=f"job{tag}")
                 for i, n in enumerate("ab")]
        return self.wait_all(procs), self.logs([f"a{tag}", f"b{tag}"])

    def test_the_same_failure_on_every_round_ends_with_5(self):
        # The failing rank fails 1 s into each round, not at once: a node that has not read its
        # assignment when a round ends skips that round (docs/etcd.md), and this is about the
        # rule, each node seeing every round.
        codes, logs = self.run_job('[ "$RANK" = 1 ] && { sleep 1; exit 7; }; sleep 30', "same", 10)
        self.assertEqual(codes, [5, 5], logs)
        for n in "ab":
            evs = self.evs(f"{n}same")
            self.assertEqual(len([e for e in evs if e["event"] == "restart"]), 2, evs)
            self.assertEqual((evs[-1]["status"], evs[-1]["exit_code"]), ("failed", 5))
            self.assertRegex(self.log(f"{n}same"), r"the rendezvous ended the job: the same "
                                                   r"failure ended 3 rounds in a row")
        ends = [json.loads(v) for v in self.cluster.get_prefix("/dlaunch/jobsame/ev/").values()
                if json.loads(v)["event"] == "job_end"]
        self.assertEqual([(e["status"], e["exit_code"]) for e in ends], [("failed", 5)], ends)
        # Another rank each round: every restart is spent, exit 1 as before.
        codes, logs = self.run_job(
            '[ "$RANK" = $((TORCHELASTIC_RESTART_COUNT % 2)) ] && { sleep 1; exit 7; }; sleep 30',
            "other", 3)
        self.assertEqual(codes, [1, 1], logs)
        self.assertEqual(len([e for e in self.evs("aother") if e["event"] == "restart"]), 3)


# Rank 0 says where torch's store is; every rank holds the job until told to go.
WHERE_THEN_WAIT = """
import os, time
if os.environ["RANK"] == "0":
    with open("at.tmp", "w") as f:
        f.write(os.environ["TORCHELASTIC_USE_AGENT_STORE"] + " " + os.environ["MASTER_ADDR"] +
                " " + os.environ["MASTER_PORT"])
    os.rename("at.tmp", "at")
while not os.path.exists("go"):
    time.sleep(0.05)
"""


@unittest.skipUnless(etcdlib.have_etcd(), "etcd-server is not installed (scripts/deps.sh test)")
@unittest.skipUnless(test_torch_store.have_torch(), "python3-torch is not installed")
class TorchStore(EtcdCase):
    """docs/etcd.md, "The workers' store": node 0's agent serves torch's store too, at
    MASTER_ADDR:MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True), empty each round."""
    PY = test_torch_store.TORCH_PYTHON

    def test_rank0_returning_first_leaves_the_store_to_the_others(self):
        # Two nodes: the ranks of the node that is not node 0 use node 0's agent's store
        # after rank 0 returned.
        script = self.write("early.py", test_torch_store.EARLY_EXIT)
        procs = [self.agent("--max-restarts", "0", "--", self.PY, script, name=n)
                 for n in ("a", "b")]
        self.assertEqual(self.wait_all(procs, timeout=300), [0, 0], self.logs("ab"))
        out = self.log("a") + self.log("b")
        self.assertIn("rank 0 returns", out)
        for rank in (1, 2, 3):
            self.assertRegex(out, rf"rank {rank} used the store after rank 0 left: [1-9]\d* "
                                  r"steps, agent store True")

    def test_a_restarted_attempt_sees_none_of_the_old_keys(self):
        script = self.write("restart.py", test_torch_store.RESTART)
        p = self.agent("--max-restarts", "1", "--", self.PY, script, nodes="1", slots="3")
        self.assertEqual(self.wait_all([p], timeout=300), [0], self.log("a"))
        for rank in range(3):
            self.assertIn(f"attempt 1 rank {rank} sees old keys: False; new: new", self.log("a"))

    def test_store_worker_keeps_the_old_way(self):
        script = self.write("say.py", test_torch_store.SAY_STORE)
        p = self.agent("--rdzv-conf", "store=worker", "--", self.PY, script, nodes="1",
                       slots="1")
        self.assertEqual(self.wait_all([p], timeout=120), [0], self.log("a"))
        self.assertRegex(self.log("a"), r"store False 127\.0\.0\.1 \d+")

    def ping_from(self, source, addr, port):
        hello = b"\x00" + struct.pack("<I", 0x3C85F7CE) + b"\x0d" + struct.pack("<I", 77)
        with socket.socket() as c:
            c.settimeout(30)
            c.bind((source, 0))
            c.connect((addr, port))
            try:
                c.sendall(hello)
                return c.recv(4)
            except ConnectionResetError:
                return b""

    def where(self):
        self.wait_for(lambda: os.path.exists(os.path.join(self.dir, "at")), timeout=120,
                      what="rank 0 to start")
        agent_store, addr, port = self.read("at").split()
        os.unlink(os.path.join(self.dir, "at"))
        self.assertEqual(agent_store, "True")
        return addr, int(port)

    def test_only_loopback_and_the_jobs_nodes_may_connect(self):
        source = test_torch_store.local_non_loopback_ipv4()
        if source is None:
            self.skipTest("this machine has no address outside 127/8")
        script = self.write("where.py", WHERE_THEN_WAIT)
        # One node, on loopback: another address of this machine is no node of the job.
        alone = self.agent("--", self.PY, script, nodes="1", slots="1", name="alone",
                           run_id="alone")
        addr, port = self.where()
        self.assertEqual(self.ping_from("127.0.0.1", addr, port), struct.pack("<I", 77))
        self.assertEqual(self.ping_from(source, addr, port), b"")
        self.write("go", "")
        self.assertEqual(self.wait_all([alone], timeout=120), [0], self.log("alone"))
        self.assertRegex(self.log("alone"), rf"torch store: closing the connection from "
                                            rf"{source}:\d+: not loopback and not a node of "
                                            r"job 'alone'")
        os.unlink(os.path.join(self.dir, "go"))
        # Two nodes, one offering that address: now it is a node of the job, let in wherever
        # node 0 is.
        procs = [self.agent("--", self.PY, script, nodes="2", slots="1", name="near",
                            run_id="pair"),
                 self.agent("--local-addr", source, "--", self.PY, script, nodes="2",
                            slots="1", name="far", run_id="pair")]
        addr, port = self.where()
        self.assertEqual(self.ping_from(source, addr, port), struct.pack("<I", 77))
        self.write("go", "")
        self.assertEqual(self.wait_all(procs, timeout=120), [0, 0], self.logs(["near", "far"]))


if __name__ == "__main__":
    dltest.main()
