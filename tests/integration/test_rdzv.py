"""Jobs over several agents on 127.0.0.1: one rendezvous, unique ranks, restarts across nodes,
dead nodes, dlaunchd and its control commands, tokens."""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time

import dltest
from dltest import free_port


class Rendezvous(dltest.Case):
    def setUp(self):
        super().setUp()
        self.cluster = dltest.Cluster(self, args=["--heartbeat", "0.2", "--join-timeout", "30"])
        self.at(free_port())
        self.procs = []  # what is not an agent: dlaunchd, followers

    def tearDown(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        super().tearDown()

    def at(self, port):
        """The rendezvous endpoint of the agents started from now on: 127.0.0.1:port."""
        self.port = port
        self.endpoint = self.cluster.endpoint = f"127.0.0.1:{port}"

    def agent(self, *args, name="a", nodes="2", slots="2", env=None):
        return self.cluster.agent("--gpus-per-node", slots, *args, name=name, nodes=nodes,
                                  env=env)

    def log(self, name):
        return self.cluster.log(name)

    def wait_all(self, procs, timeout=60):
        return self.cluster.wait_all(procs, timeout=timeout)

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

    def test_two_and_three_agents_form_one_job(self):
        for n in (2, 3):
            cmd = ["--", "sh", "-c", "echo $RANK $WORLD_SIZE $GROUP_RANK $LOCAL_RANK"]
            procs = [self.agent(*cmd, name=f"n{n}a{i}", nodes=str(n)) for i in range(n)]
            self.assertEqual(self.wait_all(procs), [0] * n,
                             "\n".join(self.log(f"n{n}a{i}") for i in range(n)))
            ranks = self.ranks_from_logs()
            self.assertEqual(sorted(ranks), list(range(2 * n)))
            for rank, (r, world, group, local) in ranks.items():
                self.assertEqual(int(r), rank)
                self.assertEqual(int(world), 2 * n)
                self.assertEqual(int(group) * 2 + int(local), rank)
            rdzv = [e for i in range(n) for e in self.evs(f"n{n}a{i}")
                    if e["event"] == "rendezvous"]
            self.assertEqual(sorted(e["node_rank"] for e in rdzv), list(range(n)))
            self.assertEqual({e["world_size"] for e in rdzv}, {2 * n})
            self.assertEqual(len({(e["master_addr"], e["master_port"]) for e in rdzv}), 1)
            # job_start says what is known before the rendezvous: the node range, not a world
            # size of this node alone.
            starts = [e for i in range(n) for e in self.evs(f"n{n}a{i}")
                      if e["event"] == "job_start"]
            self.assertEqual({(e["nodes"], e["min_nodes"], e["world_size"]) for e in starts},
                             {(n, n, None)})
            subprocess.run(["rm", "-rf", os.path.join(self.dir, "dlaunch_logs")], check=True)
            self.at(free_port())

    def test_a_failed_worker_restarts_every_node(self):
        script = ('if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && [ "$RANK" = 3 ]; then exit 4; fi;'
                  'sleep 0.3; echo $RANK restart $TORCHELASTIC_RESTART_COUNT')
        procs = [self.agent("--max-restarts", "1", "--", "sh", "-c", script, name=n)
                 for n in ("a", "b")]
        self.assertEqual(self.wait_all(procs), [0, 0], self.log("a") + self.log("b"))
        ranks = self.ranks_from_logs(attempt=1)
        self.assertEqual(sorted(ranks), [0, 1, 2, 3])
        for rank, words in ranks.items():
            self.assertEqual(words, [str(rank), "restart", "1"])

    def test_sigterm_to_one_agent_stops_the_job_on_every_node(self):
        """An operator's SIGTERM to one agent of a 2-node job: that node stops (exit 143) and so
        does the other, at once and with exit 0 as by `dlaunch stop`; no restart is spent.
        Before, the other node took it for a lost node, restarted, and waited --join-timeout
        for a round that could not close."""
        for victim in ("b", "a"):  # b: a node of the job; a: the one hosting the rendezvous
            with self.subTest(victim=victim):
                stop = os.path.join(self.dir, f"never-{victim}")
                work = ["--max-restarts", "2", "--", "sh", "-c",
                        f"while [ ! -e {stop} ]; do sleep 0.05; done"]
                procs = {n: self.agent(*work, name=f"{n}{victim}") for n in "ab"}
                # The job runs on both nodes before the signal (else it would test a join
                # cut short); when it does not, the failure shows both agents' logs.
                for n in "ab":
                    self.cluster.wait_for(f"{n}{victim}", "worker_start", timeout=60)
                procs[victim].send_signal(signal.SIGTERM)
                t0 = time.monotonic()
                other = "a" if victim == "b" else "b"
                self.assertEqual(procs[victim].wait(timeout=30), 128 + signal.SIGTERM,
                                 self.log(f"{victim}{victim}"))
                self.assertEqual(procs[other].wait(timeout=10), 0, self.log(f"{other}{victim}"))
                took = time.monotonic() - t0
                for n in "ab":
                    evs = self.evs(f"{n}{victim}")
                    self.assertEqual([e for e in evs if e["event"] == "restart"], [], evs)
                self.assertIn("stopped", [e for e in self.evs(f"{other}{victim}")
                                          if e["event"] == "job_end"][-1]["status"])
                print(f"SIGTERM to agent {victim}: the other stopped {took:.2f} s later")

    def test_a_job_forms_when_the_port_its_host_found_free_is_taken(self):
        """The hosting agent serves its workers' torch store on a port of its own. Found free
        at the start and bound later, that port may be taken in between by another program
        (seen under load in CI); the host then took the failure for "someone serves the
        rendezvous already" and joined as a client, and both agents waited out --join-timeout
        for a server nobody ran. Now the store's port is the kernel's pick at its bind."""
        thief = os.path.join(os.environ.get("BUILD_ROOT", "build"), "tests", "integration",
                             "libportthief.so")
        self.assertTrue(os.path.exists(thief), thief)
        env = {"LD_PRELOAD": thief,
               "ASAN_OPTIONS": os.environ.get("ASAN_OPTIONS", "") + ":verify_asan_link_order=0"}
        t0 = time.monotonic()
        procs = [self.agent("--", "sh", "-c", 'echo "master $MASTER_PORT"', name=n, env=env)
                 for n in "ab"]
        self.assertEqual(self.wait_all(procs), [0, 0], self.log("a") + self.log("b"))
        took = time.monotonic() - t0
        self.assertLess(took, 25, "the job waited out --join-timeout")
        # Every worker was handed the port the round named as its master.
        logs = self.log("a") + self.log("b")
        named = re.findall(r"round 0 closed: .* master 127\.0\.0\.1:(\d+)", logs)
        handed = re.findall(r"rank \d+\] master (\d+)", logs)
        self.assertEqual(len(named), 1, logs)
        self.assertEqual(handed, named * 4, logs)

    def test_restart_events_and_the_journal_over_several_nodes(self):
        # docs/events.md: on several nodes every agent's restart event has the round, the
        # culprit as its reason and the round change's text as its diagnosis; docs/control.md: the journal's log events cover the
        # job's story but no plain join, and each round's rendezvous event counts its nodes.
        d, port = dltest.start_dlaunchd(os.path.join(self.dir, "d.log"))
        self.procs.append(d)
        self.at(port)
        script = 'if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && [ "$RANK" = 3 ]; then exit 4; fi'
        procs = [self.agent("--max-restarts", "1", "--", "sh", "-c", script, name=n)
                 for n in ("a", "b")]
        self.assertEqual(self.wait_all(procs), [0, 0], self.log("a") + self.log("b"))
        for n in "ab":
            restarts = [e for e in self.evs(n) if e["event"] == "restart"]
            self.assertEqual(len(restarts), 1, self.evs(n))
            self.assertEqual((restarts[0]["attempt"], restarts[0]["round"]), (1, 1))
            self.assertRegex(restarts[0]["diagnosis"],
                             r"in round 0: rank 3 on \S+ exited with code 4")
            reason = restarts[0]["reason"]
            self.assertEqual((reason["cause"], reason["rank"], reason["exit_code"],
                              reason["node_rank"]), ("worker_failed", 3, 4, 1), reason)
            self.assertEqual(self.evs(n)[-1]["status"], "succeeded")
        p = self.dlaunch("events", "--timeout", "5", "--endpoint", self.endpoint, "job",
                         check_code=0)
        journal = [json.loads(l) for l in p.stdout.splitlines()]
        logs = [e["text"] for e in journal if e["event"] == "log"]
        self.assertTrue(any(t.startswith("job created") for t in logs), logs)
        self.assertFalse([t for t in logs if " joined " in t], "plain joins are not journaled")
        self.assertEqual([(e["round"], e["nodes"]) for e in journal if e["event"] == "rendezvous"],
                         [(0, 2), (1, 2)])
        changed = [e for e in journal if e["event"] == "round_changed"]
        self.assertEqual([(e["round"], e["cause"]) for e in changed], [(1, "worker_failed")])
        self.assertEqual(journal[-1]["event"], "job_end")
        self.assertEqual(journal[-1]["status"], "succeeded")

    def test_restarts_exhausted_fail_every_node(self):
        procs = [self.agent("--max-restarts", "1", "--", "sh", "-c",
                            '[ "$RANK" = 0 ] && exit 6; sleep 5', name=n) for n in ("a", "b")]
        codes = self.wait_all(procs)
        self.assertEqual(codes, [1, 1], self.log("a") + self.log("b"))
        self.assertIn("rank 0", self.log("a") + self.log("b"))
        self.assertIn("exited with code 6", self.log("a") + self.log("b"))

    # A worker of node 1 that fails on every attempt: rank 1 alone on its node (one slot a
    # node, node ranks pinned), rank 0 waiting to be stopped.
    SAME = ["--max-restarts", "10", "--stop-timeout", "2"]

    def test_the_same_failure_on_every_round_ends_every_node_with_5(self):
        """docs/exit-codes.md, 5: over several nodes the rendezvous decides restarts; the same
        rank failing with the same code three rounds in a row (--max-same-failures 3, the
        default) ends the job on every node with exit 5, 7 of the 10 restarts unspent, and
        dlaunchd's journal ends the job with 5 too."""
        d, port = dltest.start_dlaunchd(os.path.join(self.dir, "d.log"))
        self.procs.append(d)
        self.at(port)
        script = '[ "$RANK" = 1 ] && exit 7; sleep 30'
        procs = [self.agent("--node-rank", str(i), *self.SAME, "--", "sh", "-c", script,
                            name=n, slots="1") for i, n in enumerate("ab")]
        self.assertEqual(self.wait_all(procs), [5, 5], self.log("a") + self.log("b"))
        starts = [e for e in self.evs("b") if e["event"] == "worker_start"]
        self.assertEqual([e["rank"] for e in starts], [1, 1, 1], starts)
        for n in "ab":
            self.assertEqual(len([e for e in self.evs(n) if e["event"] == "restart"]), 2)
            end = self.evs(n)[-1]
            self.assertEqual((end["event"], end["status"], end["exit_code"]),
                             ("job_end", "failed", 5), end)
            self.assertRegex(self.log(n), r"the rendezvous ended the job: failed: the same "
                                          r"failure ended 3 rounds in a row .*rank 1 on \S+ "
                                          r"exited with code 7")
            self.assertIn("failed the same way on every attempt (exit 5: do not requeue)",
                          self.log(n))
        p = self.dlaunch("events", "--timeout", "5", "--endpoint", self.endpoint, "job",
                         check_code=0)
        journal = [json.loads(l) for l in p.stdout.splitlines()]
        self.assertEqual((journal[-1]["event"], journal[-1]["status"], journal[-1]["exit_code"]),
                         ("job_end", "failed", 5), journal[-1])
        self.assertIn("the same failure ended 3 rounds in a row", journal[-1]["failure"])

    def test_a_failure_that_changes_spends_every_restart(self):
        """Another rank failing each round, or the same rank after getting further (its health
        beats say its step): no same failure; every restart is spent and the nodes exit 1."""
        scripts = {
            "rank": '[ "$RANK" = $((TORCHELASTIC_RESTART_COUNT % 2)) ] && exit 7; sleep 30',
            "progress": ('[ "$RANK" = 1 ] || exec sleep 30; '
                         'echo "step=$((10 * TORCHELASTIC_RESTART_COUNT + 10))" >&3; '
                         'sleep 1; exit 7'),
        }
        for what, script in scripts.items():
            with self.subTest(what=what):
                self.at(free_port())
                flags = ["--max-restarts", "3", *self.SAME[2:]]
                procs = [self.agent("--node-rank", str(i), *flags, "--", "sh", "-c", script,
                                    name=f"{n}{what}", slots="1") for i, n in enumerate("ab")]
                logs = self.log(f"a{what}") + self.log(f"b{what}")
                self.assertEqual(self.wait_all(procs), [1, 1], logs)
                for n in "ab":
                    evs = self.evs(f"{n}{what}")
                    self.assertEqual(len([e for e in evs if e["event"] == "restart"]), 3, evs)
                    self.assertEqual(evs[-1]["exit_code"], 1)
                    self.assertNotIn("same failure", self.log(f"{n}{what}"))

    def test_join_timeout_exits_3(self):
        p = self.agent("--join-timeout", "1", "--", "true", name="alone")
        self.assertEqual(p.wait(timeout=30), 3, self.log("alone"))
        # docs/events.md: job_end says timed_out, exit 3.
        end = self.evs("alone")[-1]
        self.assertEqual((end["event"], end["status"], end["exit_code"]),
                         ("job_end", "timed_out", 3))

    def test_stopped_node_is_dropped_and_rejoins(self):
        stop = os.path.join(self.dir, "stop")
        script = f'while [ ! -e {stop} ]; do sleep 0.05; done'
        common = ["--nodes", "1:3", "--last-call", "0.5", "--dead-after", "1", "--max-restarts",
                  "5", "--stop-timeout", "2", "--", "sh", "-c", script]
        # Agent a hosts the rendezvous (node rank 0); c, the one stopped, must not, or stopping
        # it would stop the rendezvous too.
        procs = [self.agent("--node-rank", "0", *common[2:], name="a", nodes="1:3", slots="1")]
        self.wait_listening()
        procs += [self.agent(*common[2:], name=n, nodes="1:3", slots="1") for n in "bc"]

        def rounds(name):
            return [e for e in self.evs(name) if e["event"] == "rendezvous"]

        self.cluster.wait_until(lambda: all(rounds(n) and rounds(n)[-1]["world_size"] == 3
                                            for n in "abc"), "a round of 3 nodes on a, b, c", 30)
        victim = procs[2]
        victim.send_signal(signal.SIGSTOP)
        t0 = time.monotonic()
        self.cluster.wait_until(lambda: all(rounds(n)[-1]["world_size"] == 2 for n in "ab"),
                                "a round of 2 nodes on a and b, c stopped", 30)
        took = time.monotonic() - t0
        # dead-after plus the restart; generous, as sanitizer builds on a busy machine are slow
        self.assertLess(took, 1 + 10)
        victim.send_signal(signal.SIGCONT)
        self.cluster.wait_until(lambda: all(rounds(n)[-1]["world_size"] == 3 for n in "abc"),
                                "a round of 3 nodes again, c continued", 30)
        open(stop, "w").close()
        self.assertEqual(self.wait_all(procs), [0, 0, 0],
                         self.log("a") + self.log("b") + self.log("c"))

    def test_a_node_cut_off_when_the_job_failed_ends_with_the_jobs_outcome(self):
        """An agent stopped (SIGSTOP) past --dead-after with no restart left: dlaunchd fails the
        job for its loss and the other node exits 1; continued, the cut-off agent finds its
        connection gone, joins again and is told how the job ended: exit 1 and job_end failed
        like the other node, not 4 (a refused newcomer with a finished job's run id)."""
        d, port = dltest.start_dlaunchd(os.path.join(self.dir, "d.log"))
        self.procs.append(d)
        self.at(port)
        flags = ["--max-restarts", "0", "--dead-after", "1", "--stop-timeout", "2", "--",
                 "sh", "-c", "exec sleep 60"]
        procs = [self.agent("--node-rank", str(i), *flags, name=n, slots="1")
                 for i, n in enumerate("ab")]

        def rounds(name):
            return [e for e in self.evs(name) if e["event"] == "rendezvous"]
        self.cluster.wait_until(lambda: rounds("a") and rounds("b"), "round 0 on a and b", 30)
        procs[1].send_signal(signal.SIGSTOP)
        try:
            self.assertEqual(procs[0].wait(timeout=60), 1, self.log("a"))
        finally:
            procs[1].send_signal(signal.SIGCONT)
        self.assertEqual(procs[1].wait(timeout=60), 1, self.log("b"))
        for n in "ab":
            end = self.evs(n)[-1]
            self.assertEqual((end["event"], end["status"], end["exit_code"]),
                             ("job_end", "failed", 1), end)
        self.assertIn("dlaunch: the job failed", self.log("b"))
        self.assertNotIn("is over", self.log("b"))

    def test_the_host_agent_killed_a_successor_hosts_and_the_job_goes_on(self):
        """The agent hosting the rendezvous SIGKILLed: the other agent hosts it again at its
        own address (here the same 127.0.0.1:port) and, with --nodes 1:2, goes on alone from
        the next round; before, it retried the dead host for --join-timeout and exited 3."""
        stop = os.path.join(self.dir, "stop")
        script = f'while [ ! -e {stop} ]; do sleep 0.05; done'
        flags = ["--last-call", "0.5", "--dead-after", "1", "--max-restarts", "2",
                 "--join-timeout", "60", "--", "sh", "-c", script]
        host = self.agent("--node-rank", "0", *flags, name="a", nodes="1:2")
        self.wait_listening()
        other = self.agent(*flags, name="b", nodes="1:2")

        def rounds(name):
            return [e for e in self.evs(name) if e["event"] == "rendezvous"]
        self.cluster.wait_until(lambda: rounds("a") and rounds("b") and
                                rounds("b")[-1]["world_size"] == 4, "a round of both nodes", 30)
        host.kill()
        host.wait()
        t0 = time.monotonic()
        self.cluster.wait_until(lambda: rounds("b")[-1]["world_size"] == 2,
                                "b's round alone after the host's loss", 30)
        took = time.monotonic() - t0
        self.assertGreater(rounds("b")[-1]["round"], rounds("b")[0]["round"])
        failover = [e for e in self.evs("b") if e["event"] == "failover"]
        self.assertEqual(len(failover), 1, self.evs("b"))
        self.assertTrue(failover[0]["hosting"], failover)
        restart = [e for e in self.evs("b") if e["event"] == "restart"]
        # The lost host is named as any lost node: node rank 0 of the last round.
        self.assertEqual((restart[-1]["reason"]["cause"], restart[-1]["reason"]["node_rank"]),
                         ("node_lost", 0), restart)
        self.assertIn("hosting the rendezvous on 127.0.0.1", self.log("b"))
        open(stop, "w").close()
        self.assertEqual(other.wait(timeout=60), 0, self.log("b"))
        # The host's loss spent a restart, as any node's does.
        self.assertIn("job succeeded in round 1, 1 restart", self.log("b"))
        print(f"a successor hosts and the job runs again {took:.2f} s after the host died")
    def wait_listening(self, timeout=30):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.02)
        self.fail(f"nobody serves {self.endpoint}\n{self.cluster.logs()}")

    def test_who_hosts_the_rendezvous(self):
        # docs/job-spec.md: the first agent that can bind the endpoint, among those not given a
        # --node-rank above 0, hosts it; one given --node-rank 0 that finds it served joins it
        # as a client, says so, and is node rank 0 all the same.
        cmd = ["--", "sh", "-c", "sleep 0.5"]
        first = self.agent("--node-rank", "1", *cmd, name="r1")
        time.sleep(1)
        self.assertIsNone(first.poll(), self.log("r1"))
        with self.assertRaises(OSError):
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
        second = self.agent("--node-rank", "0", *cmd, name="r0")
        self.assertEqual(self.wait_all([first, second]), [0, 0], self.log("r1") + self.log("r0"))
        self.assertIn("[rdzv job] round 0 closed", self.log("r0"))
        self.assertNotIn("[rdzv job]", self.log("r1"))

        self.at(free_port())
        shutil.rmtree(os.path.join(self.dir, "dlaunch_logs"))
        host = self.agent(*cmd, name="any")
        self.wait_listening()
        zero = self.agent("--node-rank", "0", *cmd, name="zero")
        self.assertEqual(self.wait_all([host, zero]), [0, 0], self.log("any") + self.log("zero"))
        self.assertIn(f"{self.endpoint} is already served: joining it as node rank 0",
                      self.log("zero"))
        self.assertIn("[rdzv job] round 0 closed", self.log("any"))
        self.assertEqual([e["node_rank"] for e in self.evs("zero") if e["event"] == "rendezvous"],
                         [0])
        self.assertEqual([e["node_rank"] for e in self.evs("any") if e["event"] == "rendezvous"],
                         [1])

    def test_one_prefix_for_the_life_of_an_elastic_job(self):
        # docs/job-spec.md: "[nodeK rank N] " for a job of several nodes, for its whole life,
        # also when an elastic job shrinks to one node.
        stop = os.path.join(self.dir, "stop")
        script = (f'echo "attempt $TORCHELASTIC_RESTART_COUNT world $WORLD_SIZE"; '
                  f'while [ ! -e {stop} ]; do sleep 0.05; done; echo "done $WORLD_SIZE"')
        common = ["--last-call", "0.5", "--max-restarts", "3", "--stop-timeout", "2", "--",
                  "sh", "-c", script]
        a = self.agent("--node-rank", "0", *common, name="a", nodes="1:2", slots="1")
        self.wait_listening()
        b = self.agent(*common, name="b", nodes="1:2", slots="1")

        def world(name):
            r = [e for e in self.evs(name) if e["event"] == "rendezvous"]
            return r[-1]["world_size"] if r else None

        self.cluster.wait_until(lambda: world("a") == 2 and world("b") == 2,
                                "a round of both nodes", 30)
        b.send_signal(signal.SIGTERM)
        self.assertEqual(b.wait(timeout=30), 128 + signal.SIGTERM, self.log("b"))
        self.cluster.wait_until(lambda: world("a") == 1, "a's round alone after b left", 30)
        open(stop, "w").close()
        self.assertEqual(a.wait(timeout=30), 0, self.log("a"))
        said = [l for l in self.log("a").splitlines() if "attempt " in l or "done " in l]
        self.assertIn("[node0 rank 0] done 1", said)
        self.assertTrue(all(l.startswith("[node0 rank 0] ") for l in said), said)

    def test_sigterm_to_one_agent_of_an_elastic_job_is_a_departure(self):
        """docs/rendezvous.md: an operator's SIGTERM to one agent of a 1:2 job leaves MIN nodes:
        it departs, the other goes on alone at once and no restart is spent, so a job with
        --max-restarts 0 still finishes; its restart event names the departure (node_left). The
        agent hosting the rendezvous departs alike: the other hosts it and spends nothing for
        it. Before, the departed node was a lost one: the job failed, its budget spent."""
        for victim in ("b", "a"):  # a hosts the rendezvous
            with self.subTest(victim=victim):
                self.at(free_port())
                stop = os.path.join(self.dir, f"stop-{victim}")
                script = f"while [ ! -e {stop} ]; do sleep 0.05; done; echo done $WORLD_SIZE"
                # A last call longer than the departing host takes to stop its workers and exit:
                # a round closed on its server before it goes would change again when it does.
                common = ["--last-call", "2", "--max-restarts", "0", "--stop-timeout", "2",
                          "--", "sh", "-c", script]
                names = {n: f"{n}{victim}" for n in "ab"}
                procs = {"a": self.agent("--node-rank", "0", *common, name=names["a"],
                                         nodes="1:2", slots="1")}
                self.wait_listening()
                procs["b"] = self.agent(*common, name=names["b"], nodes="1:2", slots="1")
                other = "a" if victim == "b" else "b"

                def rounds(n):
                    return [e for e in self.evs(names[n]) if e["event"] == "rendezvous"]

                deadline = time.monotonic() + 30
                while time.monotonic() < deadline and not all(
                        rounds(n) and rounds(n)[-1]["world_size"] == 2 for n in "ab"):
                    time.sleep(0.05)
                self.assertTrue(all(rounds(n) for n in "ab"), self.cluster.logs())
                procs[victim].send_signal(signal.SIGTERM)
                self.assertEqual(procs[victim].wait(timeout=30), 128 + signal.SIGTERM,
                                 self.log(names[victim]))
                self.cluster.wait_until(lambda: rounds(other)[-1]["world_size"] == 1,
                                        f"{names[other]}'s round alone", 30)
                open(stop, "w").close()
                self.assertEqual(procs[other].wait(timeout=30), 0, self.log(names[other]))
                evs = self.evs(names[other])
                restarts = [e for e in evs if e["event"] == "restart"]
                self.assertEqual(len(restarts), 1, evs)
                self.assertEqual(restarts[0]["reason"]["cause"], "node_left", restarts)
                self.assertNotIn("node_lost", self.log(names[other]))
                self.assertIn("done 1", self.log(names[other]))

    def test_the_restart_count_counts_failures_not_rounds(self):
        """docs/torchrun.md: TORCHELASTIC_RESTART_COUNT counts the restarts the job spent on
        failures, as torchrun's does: a node joining an elastic job opens a round (an attempt
        folder of its own) but no restart, a worker failure one. Before, it was the round."""
        stop = os.path.join(self.dir, "stop")
        mark = os.path.join(self.dir, "failed-once")
        said = os.path.join(self.dir, "rank0-said")
        # Rank 1 fails once in the first round of two nodes, after rank 0 has said its words.
        script = ('echo restart=$TORCHELASTIC_RESTART_COUNT world=$WORLD_SIZE; '
                  f'if [ "$WORLD_SIZE" = 2 ] && [ "$RANK" = 0 ]; then touch {said}; fi; '
                  f'if [ "$WORLD_SIZE" = 2 ] && [ "$RANK" = 1 ] && [ ! -e {mark} ]; then '
                  f'while [ ! -e {said} ]; do sleep 0.05; done; touch {mark}; exit 4; fi; '
                  f'while [ ! -e {stop} ]; do sleep 0.05; done')
        common = ["--last-call", "0.5", "--max-restarts", "1", "--stop-timeout", "2", "--",
                  "sh", "-c", script]
        a = self.agent("--node-rank", "0", *common, name="a", nodes="1:2", slots="1")

        def started(name, attempt):
            return any(e["event"] == "worker_start" and e["attempt"] == attempt
                       for e in self.evs(name))
        self.cluster.wait_until(lambda: started("a", 0), "a's workers of attempt 0", 30)
        b = self.agent(*common, name="b", nodes="1:2", slots="1")
        self.cluster.wait_until(lambda: started("a", 2) and started("b", 2),
                                "a's and b's workers of attempt 2", 60)
        # The workers of attempt 2 said their words before the stop: wait for them.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(self.ranks_from_logs(attempt=2)) < 2:
            time.sleep(0.05)
        open(stop, "w").close()
        self.assertEqual(self.wait_all([a, b]), [0, 0], self.log("a") + self.log("b"))
        said = {attempt: self.ranks_from_logs(attempt=attempt) for attempt in (0, 1, 2)}
        self.assertEqual(said[0], {0: ["restart=0", "world=1"]})
        self.assertEqual(said[1], {0: ["restart=0", "world=2"], 1: ["restart=0", "world=2"]})
        self.assertEqual(said[2], {0: ["restart=1", "world=2"], 1: ["restart=1", "world=2"]})

    def test_wrong_token_is_refused(self):
        good = self.write("good.token", "s3cret\n")
        bad = self.write("bad.token", "guess\n")
        os.chmod(good, 0o600)
        os.chmod(bad, 0o600)
        host = self.agent("--token-file", good, "--", "sleep", "5", name="host")
        time.sleep(0.5)
        intruder = self.agent("--token-file", bad, "--", "true", name="intruder")
        self.assertEqual(intruder.wait(timeout=30), 4, self.log("intruder"))
        self.assertIn("wrong job token", self.log("intruder"))
        host.kill()

    def test_a_restarted_dlaunchd_goes_on_counting(self):
        """dlaunchd SIGKILLed and started again on its port after a failure: the job goes on
        from the next round, with no attempt folder written twice, TORCHELASTIC_RESTART_COUNT
        still counting, and the restart spent still spent."""
        d, port = dltest.start_dlaunchd(os.path.join(self.dir, "d.log"))
        self.procs.append(d)
        self.at(port)
        stop = os.path.join(self.dir, "stop")
        script = ('echo restart=$TORCHELASTIC_RESTART_COUNT;'
                  'if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && [ "$RANK" = 3 ]; then exit 4; fi;'
                  f'while [ ! -e {stop} ]; do sleep 0.05; done')
        procs = [self.agent("--max-restarts", "2", "--", "sh", "-c", script, name=n)
                 for n in ("a", "b")]

        def started(attempt):
            return all(sum(e["event"] == "worker_start" and e["attempt"] == attempt
                           for e in self.evs(n)) == 2 for n in "ab")
        self.cluster.wait_until(lambda: started(1), "both agents' workers of attempt 1", 30)
        d.kill()
        d.wait()
        # Started again where the agents look for it.
        with open(os.path.join(self.dir, "d3.log"), "w") as log:
            d = subprocess.Popen([dltest.DLAUNCHD, "--listen", self.endpoint],
                                 stdout=subprocess.DEVNULL, stderr=log)
        self.procs.append(d)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not started(2):
            time.sleep(0.05)
        self.assertTrue(started(2), self.cluster.logs() + "\n--- d3.log:\n" + self.read("d3.log"))
        st = self.dlaunch("status", "--json", "--endpoint", self.endpoint, "job", check_code=0)
        self.assertEqual((json.loads(st.stdout)["round"], json.loads(st.stdout)["restarts"]),
                         (2, 1), st.stdout)
        open(stop, "w").close()
        self.assertEqual(self.wait_all(procs), [0, 0], self.log("a") + self.log("b"))
        # Each attempt's folder holds its own attempt's words only (a worker stopped early may
        # have said nothing); the last attempt ran to the end on every rank. The restart count
        # is the restarts spent on failures: dlaunchd's own restart spent none.
        for attempt, count in ((0, 0), (1, 1), (2, 1)):
            ranks = self.ranks_from_logs(attempt=attempt)
            if attempt == 0:
                self.assertIn(3, ranks)  # it said its word, then failed
            for words in ranks.values():
                self.assertEqual(words, [f"restart={count}"], attempt)
        self.assertEqual(sorted(self.ranks_from_logs(attempt=2)), [0, 1, 2, 3])

    def test_dlaunchd_status_restart_stop(self):
        d, port = dltest.start_dlaunchd(os.path.join(self.dir, "d.log"))
        self.procs.append(d)
        self.at(port)
        script = 'echo restart=$TORCHELASTIC_RESTART_COUNT; exec sleep 60'
        # No restart budget: an operator's restart is no failure and must spend none.
        procs = [self.agent("--max-restarts", "0", "--", "sh", "-c", script, name=n)
                 for n in ("a", "b")]
        for n in "ab":
            self.cluster.wait_for(n, "worker_start", timeout=30)
        st = self.dlaunch("status", "--json", "--endpoint", self.endpoint, "job", check_code=0)
        status = json.loads(st.stdout)
        self.assertEqual(status["state"], "running")
        self.assertEqual(status["world_size"], 4)
        self.assertEqual(sorted(n["node_rank"] for n in status["nodes"]), [0, 1])
        self.dlaunch("restart", "--endpoint", self.endpoint, "job", check_code=0)
        for n in "ab":
            self.cluster.wait_for(n, lambda e: e["event"] == "worker_start" and
                                  e["attempt"] == 1, timeout=30, desc="attempt 1 worker_start")
        st = self.dlaunch("status", "--json", "--endpoint", self.endpoint, "job", check_code=0)
        self.assertEqual((json.loads(st.stdout)["state"], json.loads(st.stdout)["restarts"]),
                         ("running", 0))
        # A long timeout: sanitizer builds on a loaded machine are slow to connect.
        follower = self.start("events", "--timeout", "60", "--endpoint", self.endpoint, "job")
        self.procs.append(follower)
        self.dlaunch("stop", "--endpoint", self.endpoint, "job", check_code=0)
        self.assertEqual(self.wait_all(procs, timeout=30), [0, 0], self.log("a") + self.log("b"))
        self.assertIn("stopped", self.log("a"))
        # Every agent says of its job what the rendezvous says: stopped, not succeeded.
        for n in "ab":
            self.assertEqual(self.evs(n)[-1]["event"], "job_end")
            self.assertEqual(self.evs(n)[-1]["status"], "stopped", self.evs(n)[-1])
        # The followed stream replays the job's story and ends with it.
        out, err = follower.communicate(timeout=30)
        self.assertEqual(follower.returncode, 0, err)
        evs = [json.loads(l) for l in out.splitlines()]
        rounds = [e for e in evs if e["event"] == "rendezvous"]
        self.assertEqual([(e["round"], e["world_size"]) for e in rounds], [(0, 4), (1, 4)])
        self.assertIn("round_changed", [e["event"] for e in evs])
        self.assertEqual(evs[-1]["event"], "job_end")
        self.assertEqual(evs[-1]["status"], "stopped")
        self.assertEqual([e["seq"] for e in evs], sorted(e["seq"] for e in evs))
        p = self.dlaunch("status", "--endpoint", self.endpoint, "nosuchjob")
        self.assertEqual(p.returncode, 1, p.stderr + self.log("d"))
        d.send_signal(signal.SIGTERM)
        self.assertEqual(d.wait(timeout=10), 0)


if __name__ == "__main__":
    dltest.main()
