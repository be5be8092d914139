"""The event stream against docs/events.md (issue #34). Cheap scenarios, each run once and side
by side (a plain run, a failure with an @record error file and a restart, a hang, a stop signal,
in-job recoveries on one node and over two, a failure in-job cannot take), with
tests/integration/protoworker.py as the worker; then every object the agents wrote is held
against the doc's table of fields at a glance, field by field, both ways, and what the doc says
of single fields is checked on the same runs."""
import glob
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time
import unittest

import dltest
from eventdoc import events_md, mismatch

ROOT = os.environ.get("SOURCE_ROOT") or os.path.join(os.path.dirname(__file__), "..", "..")
WORKER = [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                       "protoworker.py")]
# Not brought about here, being costly: a full disk (test_failures makes one), a straggler among
# trainers (test_diag), a rendezvous failing over (test_rdzv), a worker overrunning torch's file
# timer (test_torchrun: it needs torch). Their rows are held to the docs' example lines
# (diagnostics.md has a straggler's) and, by dltest's check of every event a test sees, to the
# runs of those tests.
NOT_RUN_HERE = {"log_write_failed", "straggler", "failover", "worker_unreapable",
                "worker_timer_expired"}


class Scenario:
    """One job: its agents (one, or two over a rendezvous, on a dltest.Cluster of its own), a
    folder, and when it is done."""

    def __init__(self, root, name, args, env=None, nodes=1, finish_when=None, signals=()):
        self.name, self.dir = name, os.path.join(root, name)
        self.proto = os.path.join(self.dir, "proto")
        os.makedirs(self.proto)
        # signals: (when, signal) in turn, for the first agent.
        self.finish_when, self.signals = finish_when, list(signals)
        env = {"PROTO_DIR": self.proto, "CUDA_VISIBLE_DEVICES": "", **(env or {})}
        unset = [k for k in os.environ if k.startswith("PROTO_")]
        common = ["--stop-timeout", "2", *args]
        if nodes > 1:
            common += ["--heartbeat", "0.2", "--dead-after", "1", "--last-call", "0.5"]
        self.cluster = dltest.Cluster(None, endpoint=None if nodes > 1 else False, run_id=name,
                                      args=common, dir=self.dir)
        self.names = [str(i) for i in range(nodes)]
        for i in range(nodes):
            rank = ["--node-rank", "0"] if nodes > 1 and i == 0 else []
            self.cluster.agent(*rank, "--", *WORKER, name=self.names[i],
                               nodes=nodes if nodes > 1 else None, env=env, unset=unset)
            if i == 0 and nodes > 1:
                time.sleep(0.3)  # the host binds first
        self.procs = [self.cluster[n] for n in self.names]
        self.finished = False
        self.out, self.codes = [], None

    def events(self):
        return [self.cluster.events(n) for n in self.names]

    def step(self):
        """Moves the scenario on; True once every agent has exited."""
        evs = self.events()
        if self.signals and self.signals[0][0](evs):
            self.procs[0].send_signal(self.signals.pop(0)[1])
        if not self.finished and (self.finish_when is None or self.finish_when(evs)):
            self.finished = True
            open(os.path.join(self.proto, "finish"), "w").close()
        return all(p.poll() is not None for p in self.procs)

    def close(self):
        """Kills what still runs; keeps each agent's output and exit code."""
        self.cluster.close()
        self.out = [self.cluster.log(n) for n in self.names]
        self.codes = [p.returncode for p in self.procs]


def started(evs, attempt, n):
    return sum(e["event"] == "worker_start" and e["attempt"] == attempt for e in evs) >= n


def recovered(evs):
    return any(e["event"] == "recovery" and e["status"] == "done" for e in evs)


RUNS = {}


def setUpModule():
    root = tempfile.mkdtemp(prefix="dl-events-")
    RUNS["root"] = root
    two = ["--gpus-per-node", "2"]
    scenarios = [
        Scenario(root, "plain", two),
        Scenario(root, "restart", [*two, "--max-restarts", "1"],
                 env={"PROTO_FAIL_RANK": "1", "PROTO_ERROR": "1"},
                 finish_when=lambda e: started(e[0], 1, 2)),
        Scenario(root, "failed", [*two, "--max-restarts", "0"],
                 env={"PROTO_FAIL_RANK": "0", "PROTO_ERROR": "1"},
                 finish_when=lambda e: any(x["event"] == "job_end" for x in e[0])),
        Scenario(root, "hang", [*two, "--max-restarts", "1", "--health-timeout", "1"],
                 env={"PROTO_HANG_RANK": "1"}, finish_when=lambda e: started(e[0], 1, 2)),
        Scenario(root, "stop", two, finish_when=lambda e: False,
                 signals=[(lambda e: started(e[0], 0, 2), signal.SIGUSR1),
                          (lambda e: any(x["event"] == "ranks" for x in e[0]), signal.SIGTERM)]),
        Scenario(root, "in_job", [*two, "--recovery", "in-job", "--max-restarts", "1"],
                 env={"PROTO_FAIL_RANK": "1"}, finish_when=lambda e: recovered(e[0])),
        Scenario(root, "unspoken", [*two, "--recovery", "in-job", "--max-restarts", "1"],
                 env={"PROTO_FAIL_RANK": "1", "PROTO_SILENT": "1"},
                 finish_when=lambda e: started(e[0], 1, 2)),
        Scenario(root, "two_nodes", ["--gpus-per-node", "1", "--recovery", "in-job",
                                     "--max-restarts", "2"], nodes=2,
                 env={"PROTO_FAIL_RANK": "1"},
                 finish_when=lambda e: recovered(e[0]) and recovered(e[1])),
    ]
    deadline = time.monotonic() + 240
    try:
        pending = list(scenarios)
        while pending and time.monotonic() < deadline:
            pending = [s for s in pending if not s.step()]
            time.sleep(0.05)
    finally:
        for s in scenarios:
            s.close()
            RUNS[s.name] = s


def tearDownModule():
    shutil.rmtree(RUNS.get("root", ""), ignore_errors=True)


class Events(unittest.TestCase):
    def run_of(self, name, codes):
        s = RUNS[name]
        self.assertEqual(s.codes, codes, f"{name}:\n" + "\n".join(o[-3000:] for o in s.out))
        return s

    def test_the_scenarios_ended_as_a_user_expects(self):
        for name, codes in (("plain", [0]), ("restart", [0]), ("failed", [1]), ("hang", [0]),
                            ("stop", [128 + signal.SIGTERM]), ("in_job", [0]), ("unspoken", [0]),
                            ("two_nodes", [0, 0])):
            with self.subTest(name):
                self.run_of(name, codes)

    def test_every_event_has_the_fields_the_doc_lists_and_no_other(self):
        rows, table = events_md()
        self.assertEqual(set(table), set(rows), "the glance table names every event, no more")
        for event, (always, maybe) in table.items():
            # The glance table and the main one agree: every field it lists is described.
            for field in always | maybe:
                self.assertRegex(rows[event], rf"`{field}\b", f"{event}: {field} is not described")
        seen = set()
        for name, s in RUNS.items():
            if name == "root":
                continue
            for i, evs in enumerate(s.events()):
                for e in evs:
                    self.assertEqual(mismatch(e), "", f"{name}, agent {i}")
                    seen.add(e["event"])
        self.assertEqual(set(table) - seen, NOT_RUN_HERE, "events no scenario brought about")

    def test_the_docs_examples_have_the_documented_fields(self):
        # The example lines of docs/events.md (and the other docs) are events as a reader
        # copies them: they carry what the table says, no more, no less.
        found = 0
        for path in sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))):
            with open(path) as f:
                for n, line in enumerate(f, 1):
                    if not line.startswith('{"event":'):
                        continue
                    try:
                        e = json.loads(line)
                    except ValueError:
                        continue  # cut short with "..."
                    found += 1
                    self.assertEqual(mismatch(e), "", f"{os.path.basename(path)}:{n}")
        self.assertGreater(found, 5)

    def test_an_error_file_reaches_worker_exit_with_its_traceback(self):
        # docs/torchrun.md: the @record error's message and traceback go into the failure
        # summary and the worker_exit event.
        for name in ("restart", "failed"):
            s = RUNS[name]
            exits = [e for e in s.events()[0] if e["event"] == "worker_exit" and "error" in e]
            self.assertEqual(len(exits), 1, s.events()[0])
            rank = int(s.name == "restart")
            self.assertEqual(exits[0]["error"], f"ValueError: rank {rank} fails on purpose")
            self.assertTrue(exits[0]["traceback"].startswith("Traceback (most recent call last)"))
            self.assertTrue(exits[0]["traceback"].endswith(
                f"ValueError: rank {rank} fails on purpose\n"))
        self.assertIn("traceback, last lines:", RUNS["failed"].out[0])

    def test_a_recovery_round_has_every_field_of_a_round(self):
        # docs/events.md: the rendezvous event's interface ("or null") in every round, the
        # rounds agent/recovery.c writes for in-job recovery included.
        s = self.run_of("two_nodes", [0, 0])
        for i, evs in enumerate(s.events()):
            rounds = [e for e in evs if e["event"] == "rendezvous"]
            self.assertEqual([e["round"] for e in rounds], [0, 1], (i, rounds))
            for e in rounds:
                self.assertIn("interface", e, (i, e))
                self.assertEqual(e["interface"], rounds[0]["interface"])

    def test_kept_says_whether_any_worker_of_the_node_stays(self):
        # Node 1's only worker failed: "0 of this node's 1 workers stay", so kept is false;
        # node 0 kept its worker.
        s = self.run_of("two_nodes", [0, 0])
        kept = [[e.get("kept") for e in evs if e["event"] == "rendezvous"] for evs in s.events()]
        self.assertEqual(kept, [[None, True], [None, False]])
        self.assertIn("0 of this node's 1 workers stay", s.out[1])

    def test_workers_that_do_not_speak_the_protocol_fall_back_and_say_so(self):
        # docs/recovery.md: they fall back to a restart "and say so (the log, and a recovery
        # event with "status": "failed")".
        s = self.run_of("unspoken", [0])
        evs = s.events()[0]
        rec = [e for e in evs if e["event"] == "recovery"]
        self.assertEqual(len(rec), 1, evs)
        self.assertEqual((rec[0]["status"], rec[0]["fallback"], rec[0]["recovery"],
                          rec[0]["replaced"]), ("failed", "restart", 0, []))
        self.assertRegex(rec[0]["error"], r"^rank [01] never said hello")
        self.assertEqual(rec[0]["reason"], {"rank": 1, "attempt": 0, "exit_code": 1})
        self.assertEqual(len([e for e in evs if e["event"] == "restart"]), 1)
        self.assertRegex(s.out[0], r"in-job recovery impossible: rank [01] never said hello on "
                                   r"its control channel \(it does not speak the recovery "
                                   r"protocol\); falling back to a restart")
        # Where every worker speaks it, nothing of the kind is said.
        self.assertNotIn("in-job recovery impossible", RUNS["in_job"].out[0])


if __name__ == "__main__":
    dltest.main()
