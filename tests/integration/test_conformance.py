"""The conformance suite (issue #30): one set of scenarios, written once and run on each of the
three rendezvous backends, each by a class of its own that only says which: the embedded one
(node 0's agent hosts it), dlaunchd, and etcd (a real 3-member cluster on loopback, etcdlib.py).
Two agents of two workers each on 127.0.0.1, started as bench/faults starts its jobs
(faultlib.Job): a clean run, a worker SIGKILLed once, a worker that always fails, the same
failure three times (exit 5), a hung worker, a stopped worker whose victims fail first, an agent
SIGKILLed, an agent's departure and an agent's stop signal, `dlaunch restart`, and the control
commands, the journal and the status page while a job runs. Each backend must do what the docs promise, and the last class holds the
backends against each other: the same exit codes, event kinds with the same fields, culprits
and journals.

Where a backend documents a difference (GAPS), its check is skipped with the doc's words; where
it differs and no doc says why (BUGS), the check is skipped as a known bug, and fails once the
backend behaves, so that the list is kept true. Neither is bent to pass."""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import unittest
import urllib.error
import urllib.request

import dltest
import etcdlib
import eventdoc
import faultlib

# What every scenario saw, by scenario and backend, for the comparison at the end.
SEEN = {}

# Where a backend differs and its doc says so: the check is skipped on it, with the doc's words.
GAPS = {}

# Where a backend differs and no doc says why: bugs, reported on issue #30 and left to the
# engineers who own that backend. A check that meets one is skipped with these words; once the
# backend behaves, the check fails instead ("now behaves"), so that this list stays true.
BUGS = {}

# Every worker says who it is, then waits for the test's word (a file) on the job's first
# attempt; on a later attempt it ends at once, unless WAIT_ALWAYS is set. It beats on its
# health pipe (descriptor 3, there unless --straggler-action off) while it waits, as a trainer
# would, and leaves a mark once it did.
WORKER = ('echo "rank=$RANK restart=$TORCHELASTIC_RESTART_COUNT world=$WORLD_SIZE"; '
          'if [ "$TORCHELASTIC_RESTART_COUNT" != 0 ] && [ -z "$WAIT_ALWAYS" ]; then exit 0; fi; '
          'while [ ! -e "$STOP" ]; do printf . >&3; : > "$STOP.beat.$RANK"; sleep 0.1; done')


def log_lines(journal):
    """The journal's log lines, "LEVEL: TEXT", the agents' names left out ("agent finished:")."""
    return [f'{e["level"]}: ' + re.sub(r"^agent '[^']*' \([^)]*\) ", "agent ", e["text"])
            for e in journal if e["event"] == "log"]


def expected_lines(story, changes):
    """How the log lines (log_lines) our rendezvous journals for the story begin: the job
    created, each round's close and change, and each node's end of a job that succeeded (the
    journal ends at job_end, before the lines that follow it)."""
    lines, nodes = ["info: job created: "], 0
    for e in story:
        if e["event"] == "rendezvous":
            lines.append(f'info: round {e["round"]} closed: ')
            nodes = e["nodes"]
        elif e["event"] == "round_changed":
            r = e["round"]
            lines.append(f"warning: round {r - 1} -> {r} (restart "
                         if e["cause"] in ("worker_failed", "node_lost") else
                         f"info: round {r - 1} -> {r} (no failure: ")
        elif e["event"] == "job_end" and e["status"] == "succeeded":
            lines += ["info: agent finished: "] * nodes
    return lines


def begin_alike(lines, starts):
    """lines, each cut to the length of the start it should have (for an assertEqual)."""
    return [line[:len(start)] for line, start in zip(lines, starts)] + lines[len(starts):]


class Job(faultlib.Job):
    """faultlib's job of two agents (bench/faults' jobs), on the backend of the test that made it,
    running a shell command instead of the bundled trainer unless train is given."""

    def __init__(self, case, command=None, nodes="2", extra=(), train=None, env=None,
                 http=False):
        # The status page: node 0's agent serves it (embedded: beside the rendezvous; etcd: the
        # job as etcd holds it, docs/etcd.md), else dlaunchd.
        self.case, self.http = case, http and case.backend in ("embedded", "etcd")
        # --dead-after 3, not bench/faults' 1: a rendezvous whose process a busy machine stalls
        # for longer than --dead-after is lost to the other agents, as a dead one would be.
        super().__init__(nodes=2, workers=2, heartbeat=0.2, dead_after=3, extra=extra,
                         train=train, dlaunchd=case.backend == "dlaunchd", root=case.dir,
                         subset=case.data if train is not None else case.dir,
                         dlaunchd_args=("--http", "127.0.0.1:0") if http else ())
        self.run_id = f"{case._testMethodName[5:]}-{case.backend}".replace("_", "-")
        self.stop_file = os.path.join(self.dir, "stop")
        self.env = {"STOP": self.stop_file, "CUDA_VISIBLE_DEVICES": "", **(env or {})}
        common = self.common
        common[common.index("--run-id") + 1] = self.run_id
        common[common.index("--nodes") + 1] = nodes
        if case.backend == "etcd":
            common[common.index("--rdzv-endpoint") + 1] = case.cluster.endpoints
            common[0:0] = ["--rdzv-backend", "etcd"]
        self.endpoint = (case.cluster.endpoints if case.backend == "etcd"
                         else common[common.index("--rdzv-endpoint") + 1])
        if command is not None:
            self.spec = os.path.join(self.dir, "command.yaml")
            with open(self.spec, "w") as f:
                f.write("command: " + json.dumps(["sh", "-c", command]) + "\n")

    def start(self):
        """Node 0's agent first; with the embedded rendezvous the others only once it serves, so
        that it is the host (Job.start's fixed pause is no promise on a loaded machine)."""
        http = ["--http", "127.0.0.1:0"] if self.http else []
        self.agents.append(faultlib.Agent(self, 0, [*self.common, "--node-rank", "0", *http,
                                                    self.spec]))
        if self.case.backend == "embedded":
            host, port = self.endpoint.split(":")
            self.case.wait_for(lambda: _serves(host, int(port)), self, "node 0 to host")
        for i in range(1, self.nodes):
            self.agents.append(faultlib.Agent(self, i, [*self.common, self.spec]))
        return self

    def token(self):
        return os.path.join(self.dir, "token")

    def secret(self):
        with open(self.token()) as f:
            return f.read().strip()

    def where(self):
        """The control commands' options for this job's backend, but --endpoint."""
        if self.case.backend == "etcd":
            return ["--rdzv-backend", "etcd"]
        return ["--token-file", self.token()]

    def http_get(self, path):
        """GET path from the status server (node 0's agent, or dlaunchd, with --http);
        (status, body)."""
        if self.daemon is not None:
            with open(self.daemon_log) as f:
                text = f.read()
        else:
            text = "\n".join(l for _, l in self.agents[0].err.snapshot())
        m = re.search(r"http://127\.0\.0\.1:(\d+)/", text)
        if m is None:
            return None, ""
        req = urllib.request.Request(f"http://127.0.0.1:{m.group(1)}{path}",
                                     headers={"Authorization": "Bearer " + self.secret()})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, ""
        except OSError:
            return None, ""


def _serves(host, port):
    try:
        socket.create_connection((host, port), timeout=1).close()
        return True
    except OSError:
        return False


def events(agent):
    """An agent's events as it wrote them (faultlib adds a clock of its own)."""
    return [{k: v for k, v in e.items() if k != "mono"} for e in agent.events()]


def of(evs, kind):
    return [e for e in evs if e["event"] == kind]


def shape(evs):
    """The kinds of an event stream with their fields, and how many of each: what a reader of the
    stream sees, without the values that differ from run to run."""
    seen = {}
    for e in evs:
        key = (e["event"], tuple(sorted(set(e) - {"time"})))
        seen[key] = seen.get(key, 0) + 1
    return sorted(seen.items())


def culprit(reason):
    """A restart's reason without the agent's id (its pid differs from run to run)."""
    return {k: ("<id>" if k == "node" else v) for k, v in reason.items()}


class Scenarios:
    """The scenarios, run by one subclass per backend. A subclass says which backend it is and
    starts what the backend needs for all its tests (setUpClass)."""
    backend = None
    data = None

    @classmethod
    def setUpClass(cls):
        cls.data_dir = tempfile.mkdtemp(prefix="dl-conform-data-")
        if faultlib.have_fashion():
            cls.data = cls.data_dir
            faultlib.write_subset(cls.data, n_train=2048, n_test=256)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.data_dir, ignore_errors=True)

    def setUp(self):
        super().setUp()
        self.jobs = []

    def tearDown(self):
        for job in self.jobs:
            job.close()
            for a in job.agents + getattr(job, "gone", []):
                for pipe, reader in ((a.proc.stdout, a.out), (a.proc.stderr, a.err)):
                    reader.join(timeout=10)
                    pipe.close()
        super().tearDown()

    # ---- helpers ----------------------------------------------------------------------------

    def job(self, *args, **kw):
        job = Job(self, *args, **kw)
        self.jobs.append(job)
        return job

    def tails(self, job):
        out = []
        for a in job.agents + getattr(job, "gone", []):
            out += [f"[agent {a.index} out] {l}" for _, l in a.out.snapshot()[-20:]]
            out += [f"[agent {a.index} err] {l}" for _, l in a.err.snapshot()[-30:]]
            out += [f"[agent {a.index} event] {json.dumps(e)}" for e in events(a)]
        return "\n".join(out)

    def wait_for(self, pred, job, what, timeout=60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pred():
                return
            time.sleep(0.05)
        self.fail(f"{self.backend}: timed out waiting for {what}\n{self.tails(job)}")

    def wait_codes(self, job, timeout=90):
        """Every agent's exit code, once what it wrote is read to the end."""
        deadline = time.monotonic() + timeout
        return [self.exit_code(a, max(1, deadline - time.monotonic())) for a in job.agents]

    def exit_code(self, agent, timeout=60):
        """The agent's exit code (None if it runs on past timeout), once the test's readers of
        its stdout and stderr got all it wrote: its exit comes before they reach the end."""
        try:
            code = agent.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        agent.out.join(timeout=30)
        agent.err.join(timeout=30)
        return code

    def started(self, job, i, attempt, n=2):
        return len([e for e in of(events(job.agents[i]), "worker_start")
                    if e["attempt"] == attempt]) >= n

    def rounds(self, agent):
        return of(events(agent), "rendezvous")

    def world(self, agent):
        r = self.rounds(agent)
        return r[-1]["world_size"] if r else None

    def said(self, job, attempt):
        """{rank: its first line} from the attempt's log folder."""
        base = os.path.join(job.dir, "dlaunch_logs", job.run_id, f"attempt_{attempt}")
        out = {}
        for f in sorted(os.listdir(base)) if os.path.isdir(base) else []:
            m = re.fullmatch(r"rank_(\d+)\.out", f)
            if m:
                with open(os.path.join(base, f)) as fh:
                    lines = fh.read().splitlines()
                if lines:
                    out[int(m.group(1))] = lines[0]
        return out

    def worker_pid(self, job, i, rank):
        pid = job.agents[i].worker_pid(rank)
        self.assertIsNotNone(pid, self.tails(job))
        return pid

    def assert_documented(self, job):
        """Every event every agent wrote has docs/events.md's fields, no more, no less."""
        bad = [eventdoc.mismatch(e) for a in job.agents + getattr(job, "gone", [])
               for e in events(a)]
        self.assertEqual([b for b in bad if b], [], self.tails(job))

    def record(self, scenario, **what):
        SEEN.setdefault(scenario, {})[self.backend] = what

    def check(self, name, fn):
        """fn(), a check named name, as a subtest: skipped where this backend documents a gap
        (GAPS), an expected failure where it has a known bug (BUGS)."""
        with self.subTest(check=name):
            if (self.backend, name) in GAPS:
                self.skipTest(GAPS[self.backend, name])
            bug = BUGS.get((self.backend, name))
            if bug is None:
                fn()
                return
            try:
                fn()
            except AssertionError as e:
                self.skipTest(f"known bug: {bug} [{str(e).splitlines()[0][:200]}]")
            self.fail(f"{self.backend} now behaves for '{name}': take it out of BUGS ({bug})")

    def ctl(self, job, cmd, *args, timeout=60):
        """A control command for the job, pointed at its backend."""
        return self.dlaunch(cmd, *job.where(), "--endpoint", job.endpoint, *args,
                            timeout=timeout)

    def follow(self, job):
        """`dlaunch events` following the job's journal until its end, once it printed the
        first round (so that it is there before the job can end, with its rendezvous)."""
        # The job exists once a round was assigned (else `dlaunch events` says there is none).
        self.wait_for(lambda: self.rounds(job.agents[0]), job, "round 0")
        p = subprocess.Popen([dltest.DLAUNCH, "events", *job.where(), "--endpoint",
                              job.endpoint, "--timeout", "60", job.run_id], cwd=job.dir,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.addCleanup(lambda: p.poll() is None and (p.kill(), p.wait()))
        out, err = faultlib.Stream(p.stdout), faultlib.Stream(p.stderr)
        self.wait_for(lambda: '"rendezvous"' in "".join(l for _, l in out.snapshot()), job,
                      "dlaunch events to print the first round")
        return p, out, err

    def journal(self, follower):
        p, out, err = follower
        p.wait(timeout=90)
        out.join(timeout=10)
        err.join(timeout=10)
        self.assertEqual(p.returncode, 0, "\n".join(l for _, l in err.snapshot()))
        return [json.loads(l) for _, l in out.snapshot()]

    def check_journal(self, job, journal, changes, end):
        """The journal `dlaunch events` followed: each round's rendezvous with the workers'
        MASTER, the round changes (round, cause) and the job's end (status, exit code), with
        docs/control.md's fields; returns its shape without the log events, for the
        comparison."""
        story = [e for e in journal if e["event"] != "log"]
        self.check("journal log events", lambda: self.assertTrue(
            [e for e in journal if e["event"] == "log"], journal))
        rounds = of(story, "rendezvous")
        want = expected_lines(story, changes)
        self.check("journal log lines", lambda: self.assertEqual(
            begin_alike(log_lines(journal), want), want, journal))
        self.assertEqual([e["round"] for e in rounds], list(range(len(changes) + 1)), journal)
        masters = {(e["master_addr"], e["master_port"]) for a in job.agents
                   for e in of(events(a), "rendezvous")}
        self.assertEqual({(e["master_addr"], e["master_port"]) for e in rounds}, masters,
                         "the journal's MASTER is not the workers'")
        self.assertEqual([(e["round"], e["cause"]) for e in of(story, "round_changed")],
                         changes, journal)
        self.assertEqual((story[-1]["event"], story[-1]["status"], story[-1]["exit_code"]),
                         ("job_end", *end), journal)
        seqs = [e.get("seq") for e in journal]
        self.check("journal seq", lambda: self.assertTrue(
            all(isinstance(q, int) for q in seqs) and seqs == sorted(set(seqs)), seqs))
        self.check("journal round_changed fields", lambda: self.assertEqual(
            [sorted(set(e) - {"time", "seq"}) for e in of(story, "round_changed")],
            [["cause", "event", "reason", "round"]] * len(changes), journal))
        return shape(story)

    def assert_one_restart(self, job, agents, want):
        """Each of the agents wrote one restart event, naming the same culprit, with want's
        values; returns the reasons."""
        reasons = []
        for i in agents:
            restarts = of(events(job.agents[i]), "restart")
            self.assertEqual(len(restarts), 1, self.tails(job))
            self.assertEqual((restarts[0]["attempt"], restarts[0].get("round")), (1, 1),
                             restarts)
            reason = restarts[0]["reason"]
            self.assertEqual({k: reason.get(k) for k in want}, want,
                             f"{self.backend}: agent {i}: {reason}\n{self.tails(job)}")
            reasons.append(culprit(reason))
        self.assertEqual([r == reasons[0] for r in reasons], [True] * len(reasons),
                         f"{self.backend}: the agents name different culprits: {reasons}")
        return reasons

    # ---- scenarios ------------------------------------------------------------------------

    def test_clean_run(self):
        """Exit 0 everywhere; job_start, one rendezvous, the workers' starts and exits and a
        job_end succeeded with docs/events.md's fields; ranks 0..3 once each, restart count 0."""
        job = self.job(WORKER, env={"STOP": "/"}).start()
        codes = self.wait_codes(job)
        self.assertEqual(codes, [0, 0], self.tails(job))
        self.assert_documented(job)
        evs = [events(a) for a in job.agents]
        for i, e in enumerate(evs):
            self.assertEqual([x["event"] for x in e][:2], ["job_start", "rendezvous"], e)
            self.assertEqual(e[-1]["event"], "job_end", e)
            start = e[0]
            self.assertEqual((start["run_id"], start["nodes"], start["min_nodes"],
                              start["workers_per_node"], start["world_size"],
                              start["max_restarts"]), (job.run_id, 2, 2, 2, None, 3), start)
            rdzv = of(e, "rendezvous")
            self.assertEqual(len(rdzv), 1, e)
            self.assertEqual((rdzv[0]["round"], rdzv[0]["world_size"], rdzv[0]["nodes"],
                              rdzv[0]["node_rank"], rdzv[0]["ranks"]),
                             (0, 4, 2, i, [2 * i, 2 * i + 1]), rdzv)
            self.assertEqual(sorted((x["rank"], x["attempt"]) for x in of(e, "worker_start")),
                             [(2 * i, 0), (2 * i + 1, 0)], e)
            self.assertEqual(sorted((x["rank"], x.get("exit_code")) for x in
                                    of(e, "worker_exit")), [(2 * i, 0), (2 * i + 1, 0)], e)
            self.assertEqual(of(e, "restart"), [], e)
            self.assertEqual((e[-1]["status"], e[-1]["exit_code"], e[-1]["attempts"]),
                             ("succeeded", 0, 1), e[-1])
        masters = {(of(e, "rendezvous")[0]["master_addr"], of(e, "rendezvous")[0]["master_port"])
                   for e in evs}
        self.assertEqual(len(masters), 1, masters)
        self.assertEqual(self.said(job, 0),
                         {r: f"rank={r} restart=0 world=4" for r in range(4)})
        self.record("clean_run", codes=codes, shapes=[shape(e) for e in evs])

    def test_worker_killed_once(self):
        """Rank 3 (node 1) SIGKILLed with --max-restarts 2: one restart on every node naming it
        (rank, node, signal), in the events, the round change's words, `dlaunch status` and the
        journal; then exit 0, and the workers of attempt 1 have TORCHELASTIC_RESTART_COUNT 1."""
        job = self.job(WORKER, extra=("--max-restarts", "2"), env={"WAIT_ALWAYS": "1"}).start()
        self.wait_for(lambda: all(self.started(job, i, 0) for i in (0, 1)), job,
                      "attempt 0's workers")
        follower = self.follow(job)
        os.kill(self.worker_pid(job, 1, 3), signal.SIGKILL)
        self.wait_for(lambda: all(self.started(job, i, 1) for i in (0, 1)), job,
                      "attempt 1's workers")
        st = self.ctl(job, "status", "--json", job.run_id)
        self.assertEqual(st.returncode, 0, st.stderr)
        status = json.loads(st.stdout)
        self.assertEqual((status["state"], status["round"], status["restarts"]),
                         ("running", 1, 1), status)
        self.assertRegex(status.get("failure", ""), r"rank 3 on \S+ was killed by SIGKILL",
                         status)
        open(job.stop_file, "w").close()
        codes = self.wait_codes(job)
        journal = self.check_journal(job, self.journal(follower), [(1, "worker_failed")],
                                     ("succeeded", 0))
        self.assertEqual(codes, [0, 0], self.tails(job))
        self.assert_documented(job)
        reasons = self.assert_one_restart(job, (0, 1), {
            "cause": "worker_failed", "rank": 3, "node_rank": 1, "attempt": 0,
            "signal": "SIGKILL"})
        said = [of(events(a), "restart")[0]["diagnosis"] for a in job.agents]
        for text in said:
            self.assertRegex(text, r"in round 0: rank 3 on \S+ was killed by SIGKILL")
        self.check("restart diagnosis says where the ranks were", lambda: [
            self.assertRegex(text, r"was killed by SIGKILL; .*flight recorder") for text in said])
        for a in job.agents:
            self.assertEqual((events(a)[-1]["status"], events(a)[-1]["attempts"]),
                             ("succeeded", 2), events(a)[-1])
            # What the operator reads: the round change, naming the culprit alike.
            self.assertRegex("\n".join(l for _, l in a.err.snapshot()),
                             r"round 1: .*in round 0: rank 3 on \S+ was killed by SIGKILL")
        exits = of(events(job.agents[1]), "worker_exit")
        self.assertIn((3, 0, "SIGKILL"), [(e["rank"], e["attempt"], e.get("signal"))
                                          for e in exits])
        self.assertEqual(self.said(job, 1),
                         {r: f"rank={r} restart=1 world=4" for r in range(4)})
        self.record("worker_killed_once", codes=codes, culprit=reasons[0],
                    shapes=[shape(events(a)) for a in job.agents], journal=journal)

    def test_always_fails(self):
        """Rank 2 (node 1) exits 7 on every attempt, --max-restarts 1: exit 1 on every agent
        (docs/exit-codes.md), the same culprit in every restart event and every failure summary,
        job_end failed."""
        # The first attempt's rank 2 fails once the test follows the journal; a later one once
        # every other rank of its attempt started: on etcd a node reads its assignment after
        # the round closed, and a round that ends before it did is one it skips (docs/etcd.md),
        # where this test wants every node in both attempts.
        script = ('A=$TORCHELASTIC_RESTART_COUNT; '
                  'if [ "$RANK" = 2 ]; then if [ "$A" = 0 ]; then '
                  'while [ ! -e "$STOP" ]; do sleep 0.05; done; else n=0; '
                  'while [ $n -lt 1200 ] && ! { [ -e "$STOP.up.0.$A" ] && [ -e "$STOP.up.1.$A" ] '
                  '&& [ -e "$STOP.up.3.$A" ]; }; do sleep 0.05; n=$((n+1)); done; fi; '
                  'echo "rank 2 fails on every attempt" >&2; exit 7; fi; '
                  ': > "$STOP.up.$RANK.$A"; exec sleep 60')
        job = self.job(script, extra=("--max-restarts", "1")).start()
        follower = self.follow(job)
        open(job.stop_file, "w").close()
        codes = self.wait_codes(job)
        self.assertEqual(codes, [1, 1], self.tails(job))
        story = self.journal(follower)
        journal = self.check_journal(job, story, [(1, "worker_failed")], ("failed", 1))
        self.assertRegex(story[-1].get("failure", ""), r"rank 2 on \S+ exited with code 7",
                         story[-1])
        self.assert_documented(job)
        reasons = self.assert_one_restart(job, (0, 1), {
            "cause": "worker_failed", "rank": 2, "node_rank": 1, "attempt": 0, "exit_code": 7})
        for a in job.agents:
            end = events(a)[-1]
            self.assertEqual((end["event"], end["status"], end["exit_code"], end["attempts"]),
                             ("job_end", "failed", 1, 2), end)
            err = "\n".join(l for _, l in a.err.snapshot())
            self.assertIn("dlaunch: the job failed", err, self.tails(job))
            self.assertRegex(err, r"rank 2 on \S+ exited with code 7", self.tails(job))
        self.record("always_fails", codes=codes, culprit=reasons[0],
                    shapes=[shape(events(a)) for a in job.agents], journal=journal)

    def test_hung_worker(self):
        """Rank 3 (node 1) stopped (SIGSTOP) with --health-timeout 3: its agent names it hung
        (worker_hung) and kills it, every node's restart event names it hung, then exit 0."""
        job = self.job(WORKER, extra=("--max-restarts", "2", "--health-timeout", "3")).start()
        self.wait_for(lambda: all(self.started(job, i, 0) for i in (0, 1)), job,
                      "attempt 0's workers")
        # Once it beat (a worker that never beat is left alone: docs/job-spec.md).
        self.wait_for(lambda: os.path.exists(job.stop_file + ".beat.3"), job, "rank 3's beat")
        os.kill(self.worker_pid(job, 1, 3), signal.SIGSTOP)
        codes = self.wait_codes(job)
        self.assertEqual(codes, [0, 0], self.tails(job))
        self.assert_documented(job)
        hung = of(events(job.agents[1]), "worker_hung")
        self.assertEqual([e["rank"] for e in hung], [3], self.tails(job))
        self.assertEqual(of(events(job.agents[0]), "worker_hung"), [])
        reasons = self.assert_one_restart(job, (0, 1), {
            "cause": "worker_failed", "rank": 3, "node_rank": 1, "hung": True})
        self.assertEqual(self.said(job, 1),
                         {r: f"rank={r} restart=1 world=4" for r in range(4)})
        self.record("hung_worker", codes=codes, culprit=reasons[0],
                    shapes=[shape(events(a)) for a in job.agents])

    def test_victims_fail_first(self):
        """Rank 3 (node 1, the bundled trainer) stops itself in step 5 and the others give up
        waiting for it in the gradient sum (DLAUNCH_COLL_TIMEOUT 3) long before a watchdog
        could name it (--health-timeout 60): every failure reported is a victim's, whichever
        node's comes first. Every node's restart names rank 3 on node 1, the rank they waited
        for (the first-failure rule, docs/rendezvous.md), hung; then exit 0."""
        if self.data is None:
            self.skipTest("Fashion-MNIST is not installed")
        job = self.job(train={"steps": 30, "log_every": 10, "hang_at_step": 5, "fail_rank": 3},
                       env={"DLAUNCH_COLL_TIMEOUT": "3"},
                       extra=("--max-restarts", "1", "--health-timeout", "60", "--recovery",
                              "restart")).start()
        codes = self.wait_codes(job, timeout=180)
        self.assertEqual(codes, [0, 0], self.tails(job))
        self.assert_documented(job)
        self.assertEqual([of(events(a), "worker_hung") for a in job.agents], [[], []])
        reasons = self.assert_one_restart(job, (0, 1), {
            "cause": "worker_failed", "rank": 3, "node_rank": 1, "hung": True})
        self.record("victims_fail_first", codes=codes,
                    culprit={k: v for k, v in reasons[0].items() if k != "step"})

    def elastic_job(self, extra):
        """--nodes 1:2, both nodes running (world size 4) before the test goes on. The last
        call is long enough for node 1 to be in round 0 on a busy machine, so that every backend
        tells the same story; it delays only rounds of one node."""
        job = self.job(WORKER, nodes="1:2", env={"WAIT_ALWAYS": "1"},
                       extra=("--last-call", "2", *extra)).start()
        self.wait_for(lambda: all(self.world(a) == 4 for a in job.agents) and
                      all(self.started(job, i, self.rounds(job.agents[i])[-1]["round"])
                          for i in (0, 1)), job, "both nodes' workers")
        return job

    def test_agent_killed(self):
        """The agent of node 1 (not the rendezvous' host) SIGKILLed in a 1:2 job: node 0 names
        node 1 lost (no rank), goes on alone in the next round with one restart spent (its
        workers' TORCHELASTIC_RESTART_COUNT 1), and ends with exit 0."""
        job = self.elastic_job(("--max-restarts", "2"))
        first = self.rounds(job.agents[0])[-1]["round"]
        job.agents[1].kill(signal.SIGKILL)
        self.wait_for(lambda: self.world(job.agents[0]) == 2 and
                      self.started(job, 0, self.rounds(job.agents[0])[-1]["round"]), job,
                      "node 0 alone")
        second = self.rounds(job.agents[0])[-1]
        self.assertGreater(second["round"], first)
        self.assertEqual((second["node_rank"], second["nodes"], second["ranks"]),
                         (0, 1, [0, 1]), second)
        open(job.stop_file, "w").close()
        self.assertEqual(self.exit_code(job.agents[0]), 0, self.tails(job))
        self.assertEqual(self.exit_code(job.agents[1]), -signal.SIGKILL)
        self.assert_documented(job)
        restarts = [e for e in of(events(job.agents[0]), "restart") if e["round"] > first]
        self.assertEqual(len(restarts), 1, self.tails(job))
        reason = restarts[0]["reason"]
        self.assertEqual((reason["cause"], reason["node_rank"], "rank" in reason),
                         ("node_lost", 1, False), self.tails(job))
        self.assertEqual(self.said(job, second["round"]),
                         {r: f"rank={r} restart=1 world=2" for r in range(2)})
        end = events(job.agents[0])[-1]
        self.assertEqual((end["event"], end["status"], end["exit_code"]),
                         ("job_end", "succeeded", 0), end)
        self.record("agent_killed", code=0, culprit=culprit(reason),
                    shape=shape(events(job.agents[0])))

    def test_departure(self):
        """SIGTERM to the agent of node 1 in a 1:2 job with --max-restarts 0: it departs (exit
        143), node 0's restart event says node_left naming node 1, no restart is spent (its
        workers' TORCHELASTIC_RESTART_COUNT stays 0, and the job still succeeds with none
        left)."""
        job = self.elastic_job(("--max-restarts", "0"))
        first = self.rounds(job.agents[0])[-1]["round"]
        job.agents[1].kill(signal.SIGTERM)
        self.assertEqual(self.exit_code(job.agents[1]), 128 + signal.SIGTERM,
                         self.tails(job))
        self.wait_for(lambda: self.world(job.agents[0]) == 2 and
                      self.started(job, 0, self.rounds(job.agents[0])[-1]["round"]), job,
                      "node 0 alone")
        second = self.rounds(job.agents[0])[-1]["round"]
        open(job.stop_file, "w").close()
        self.assertEqual(self.exit_code(job.agents[0]), 0, self.tails(job))
        self.assert_documented(job)
        restarts = [e for e in of(events(job.agents[0]), "restart") if e["round"] > first]
        self.assertEqual(len(restarts), 1, self.tails(job))
        reason = restarts[0]["reason"]
        self.assertEqual((reason["cause"], reason["node_rank"]), ("node_left", 1), self.tails(job))
        self.assertEqual(self.said(job, second),
                         {r: f"rank={r} restart=0 world=2" for r in range(2)})
        gone = events(job.agents[1])
        self.assertEqual([(e["signal"], e["forwarded"]) for e in of(gone, "signal")],
                         [("SIGTERM", False)], gone)
        self.assertEqual((gone[-1]["event"], gone[-1]["status"], gone[-1]["exit_code"]),
                         ("job_end", "stopped", 128 + signal.SIGTERM), gone[-1])
        self.assertEqual(events(job.agents[0])[-1]["status"], "succeeded")
        self.assertNotIn("was lost", "\n".join(l for _, l in job.agents[0].err.snapshot()))
        self.record("departure", code=0, culprit=culprit(reason),
                    shapes=[shape(events(a)) for a in job.agents])

    def test_operator_restart(self):
        """`dlaunch restart` with --max-restarts 0: every node's restart event says requested,
        the next attempt runs with TORCHELASTIC_RESTART_COUNT still 0, no restart is spent and
        the job succeeds."""
        job = self.job(WORKER, extra=("--max-restarts", "0"), env={"WAIT_ALWAYS": "1"}).start()
        self.wait_for(lambda: all(self.started(job, i, 0) for i in (0, 1)), job,
                      "attempt 0's workers")
        r = self.ctl(job, "restart", job.run_id)
        self.assertEqual((r.returncode, r.stdout), (0, f"{job.run_id}: restarting\n"), r.stderr)
        self.wait_for(lambda: all(self.started(job, i, 1) for i in (0, 1)), job,
                      "attempt 1's workers")
        st = json.loads(self.ctl(job, "status", "--json", job.run_id).stdout)
        self.assertEqual((st["state"], st["round"], st["restarts"]), ("running", 1, 0), st)
        open(job.stop_file, "w").close()
        codes = self.wait_codes(job)
        self.assertEqual(codes, [0, 0], self.tails(job))
        self.assert_documented(job)
        reasons = self.assert_one_restart(job, (0, 1), {"cause": "requested"})
        self.assertEqual(self.said(job, 1),
                         {r: f"rank={r} restart=0 world=4" for r in range(4)})
        for a in job.agents:
            self.assertEqual(events(a)[-1]["status"], "succeeded", events(a)[-1])
        self.record("operator_restart", codes=codes, culprit=reasons[0],
                    shapes=[shape(events(a)) for a in job.agents])

    def test_the_same_failure_ends_with_5(self):
        """Rank 1 (node 1, one worker a node) exits 7 on every attempt with --max-restarts 10:
        the third time in a row the job fails with exit 5 on every agent (docs/exit-codes.md),
        after two restarts, the culprit named alike."""
        # Rank 1 fails 2 s into each round, not at once: on etcd a node reads its assignment
        # after the round closed, and a round that ends before it did is one it skips (its
        # events go from attempt 0 to 2: docs/etcd.md), where this test is about the rule.
        script = '[ "$RANK" = 1 ] && { sleep 2; exit 7; }; exec sleep 60'
        job = self.job(script, extra=("--max-restarts", "10", "--gpus-per-node", "1")).start()
        codes = self.wait_codes(job)
        self.assertEqual(codes, [5, 5], self.tails(job))
        self.assert_documented(job)
        reasons = []
        for a in job.agents:
            evs = events(a)
            restarts = of(evs, "restart")
            self.assertEqual([e["attempt"] for e in restarts], [1, 2], evs)
            reasons += [culprit(e["reason"]) for e in restarts]
            self.assertEqual((evs[-1]["event"], evs[-1]["status"], evs[-1]["exit_code"],
                              evs[-1]["attempts"]), ("job_end", "failed", 5, 3), evs[-1])
            self.assertRegex("\n".join(l for _, l in a.err.snapshot()),
                             r"the same failure ended 3 rounds in a row")
        self.assertEqual({(r["rank"], r["node_rank"], r["exit_code"]) for r in reasons},
                         {(1, 1, 7)}, reasons)
        self.record("same_failure", codes=codes,
                    culprit=[r for r in reasons if r["attempt"] == 0][0],
                    shapes=[shape(events(a)) for a in job.agents])

    def test_stop_signal(self):
        """SIGTERM to the agent of node 1 in a 2:2 job: fewer than MIN nodes would be left, so
        the job stops: that agent exits 143, the other 0, both job_end stopped, no restart."""
        job = self.job(WORKER, extra=("--max-restarts", "2")).start()
        self.wait_for(lambda: all(self.started(job, i, 0) for i in (0, 1)), job,
                      "attempt 0's workers")
        job.agents[1].kill(signal.SIGTERM)
        codes = self.wait_codes(job)
        self.assertEqual(codes, [0, 128 + signal.SIGTERM], self.tails(job))
        self.assert_documented(job)
        for a, code in zip(job.agents, codes):
            evs = events(a)
            self.assertEqual(of(evs, "restart"), [], evs)
            self.assertEqual((evs[-1]["event"], evs[-1]["status"], evs[-1]["exit_code"]),
                             ("job_end", "stopped", code), evs[-1])
        self.record("stop_signal", codes=codes, shapes=[shape(events(a)) for a in job.agents])

    def test_status_while_running(self):
        """The bundled trainer running: `dlaunch status` (and --json) says the job, its round,
        restarts and nodes; `status --ranks` every rank's step from its flight recorder; the
        status page shows the training's progress; `dlaunch stop` ends the job, exit 0 on every
        agent, job_end stopped."""
        if self.data is None:
            self.skipTest("Fashion-MNIST is not installed")
        job = self.job(train={"steps": 100000, "log_every": 10}, http=True).start()
        job.wait_step(20)
        # The in-job recoveries and node 0's store figures come with the agents' heartbeats
        # (every 0.2 s here): on a quiet machine the trainer is at step 20 before the first.
        deadline = time.monotonic() + 30
        while True:
            st = self.ctl(job, "status", "--json", job.run_id)
            self.assertEqual(st.returncode, 0, st.stderr)
            status = json.loads(st.stdout)
            if ({"recovery", "keys"} <= set(status)) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        self.assertEqual({k: status.get(k) for k in ("run_id", "state", "round", "restarts",
                                                     "max_restarts", "min_nodes", "max_nodes",
                                                     "world_size")},
                         {"run_id": job.run_id, "state": "running", "round": 0, "restarts": 0,
                          "max_restarts": 3, "min_nodes": 2, "max_nodes": 2, "world_size": 4},
                         status)
        self.assertEqual(sorted((n["node_rank"], n["slots"], n["connected"], n["left"])
                                for n in status["nodes"]),
                         [(0, 2, True, False), (1, 2, True, False)], status)
        text = self.ctl(job, "status", job.run_id).stdout
        self.assertRegex(text, rf"^{job.run_id}: running, round 0, restarts 0 of 3, nodes 2\.\.2, "
                               r"world size 4\n")
        self.assertEqual(len(re.findall(r"(?m)^  node [01]  \S+ +\S+ +slots 2  heartbeat ", text)),
                         2, text)
        store = ("keys", "store_bytes", "store_waits", "store_clients")
        self.check("store figures", lambda: (
            self.assertLessEqual({"keys", "store_bytes", "store_waits"}, set(status), status),
            self.assertRegex(text, r"(?m)^  store: \d+ keys?, ")))
        self.check("status in-job recoveries", lambda: (
            self.assertEqual(status.get("recovery", {}).get("recoveries"), 0, status),
            self.assertIn("\n  in-job recoveries: 0\n", text)))

        def ranks():
            out = self.ctl(job, "status", "--ranks", job.run_id).stdout
            return sorted(int(r) for r in re.findall(r"(?m)^  rank (\d+)  node [01] .* step \d+ ",
                                                     out)) == [0, 1, 2, 3]
        self.check("status --ranks", lambda: self.wait_for(ranks, job, "every rank's step"))

        def progress():
            code, body = job.http_get(f"/api/jobs/{job.run_id}")
            points = json.loads(body).get("progress", []) if code == 200 else []
            code, page = job.http_get("/")
            return (len(points) >= 2 and points[-1]["step"] > points[0]["step"] and
                    re.search(r'<p class="progress">Training: step <b>\d+</b>', page))
        self.check("status page and progress", lambda: self.wait_for(
            progress, job, "the status page's progress"))

        stop = self.ctl(job, "stop", job.run_id)
        self.assertEqual((stop.returncode, stop.stdout), (0, f"{job.run_id}: stopping\n"),
                         stop.stderr)
        codes = self.wait_codes(job)
        self.assertEqual(codes, [0, 0], self.tails(job))
        self.assert_documented(job)
        for a in job.agents:
            end = events(a)[-1]
            self.assertEqual((end["event"], end["status"], end["exit_code"]),
                             ("job_end", "stopped", 0), end)
        self.record("status", codes=codes,
                    status_fields=sorted(set(status) - set(store)),
                    status_node_fields=sorted({k for n in status["nodes"] for k in n}),
                    shapes=[shape(events(a)) for a in job.agents])


class Embedded(Scenarios, dltest.Case):
    """Node 0's agent hosts the rendezvous (--rdzv-endpoint 127.0.0.1:PORT, nobody serving it)."""
    backend = "embedded"


class Dlaunchd(Scenarios, dltest.Case):
    """A dlaunchd of each job's own (faultlib.Job starts it); no agent hosts anything."""
    backend = "dlaunchd"


@unittest.skipUnless(etcdlib.have_etcd(), "etcd-server is not installed (scripts/deps.sh test)")
class Etcd(Scenarios, dltest.Case):
    """--rdzv-backend etcd on a 3-member cluster on loopback, one for all of this class's jobs
    (each has a run id, so a prefix, of its own)."""
    backend = "etcd"

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.cluster = etcdlib.Cluster().start()

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()
        super().tearDownClass()


class SameOnEveryBackend(unittest.TestCase):
    """What each scenario showed on each backend that ran it, held against the first backend
    that ran it: the same exit codes, the same event kinds with the same fields as many times,
    the same culprit, the same journal. A difference BUGS lists is skipped with its words."""

    def test_every_scenario_alike(self):
        compared = 0
        for scenario, by in sorted(SEEN.items()):
            names = [b for b in ("embedded", "dlaunchd", "etcd") if b in by]
            for other in names[1:]:
                for what in sorted(set(by[names[0]]) | set(by[other])):
                    mine, theirs = by[other].get(what), by[names[0]].get(what)
                    with self.subTest(scenario=scenario, what=what, backends=(names[0], other)):
                        compared += 1
                        bug = BUGS.get((other, what))
                        if bug is not None and mine != theirs:
                            self.skipTest(f"known bug: {bug}")
                        self.assertIsNone(bug, f"{other} now behaves for '{what}': take it out "
                                               f"of BUGS")
                        self.assertEqual(mine, theirs, f"{scenario}: {what} on {other} is not "
                                                       f"as on {names[0]}")
        if compared == 0:
            self.skipTest("fewer than two backends ran any scenario here")


def load_tests(loader, standard_tests, pattern):
    """The backends in turn, then their comparison (which needs what they saw)."""
    suite = unittest.TestSuite()
    for cls in (Embedded, Dlaunchd, Etcd, SameOnEveryBackend):
        suite.addTests(loader.loadTestsFromTestCase(cls))
    return suite


if __name__ == "__main__":
    dltest.main()
