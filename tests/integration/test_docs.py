"""Every shell example the docs mark as runnable on one machine (a ```sh runnable block in
README.md or docs/*.md) runs here as written, with the built programs on PATH under their
installed names, in a fresh folder that holds the repository's examples/. A doc example that
stops working turns the suite red.

Then the docs' claims a newcomer meets first (issue #19), each tried as a user would: one test a
claim, named after it."""
import glob
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import unittest

import dltest
from eventdoc import table_cells

ROOT = os.environ.get("SOURCE_ROOT") or os.path.join(os.path.dirname(__file__), "..", "..")
BUILD = os.environ.get("BUILD_ROOT", os.path.join(ROOT, "build"))
PROGRAMS = {"dlaunch": "cmd/dlaunch", "dlaunchd": "daemon/dlaunchd",
            "dlaunch-train": "trainer/dlaunch-train"}
BLOCK = re.compile(r"^```sh runnable[^\n]*\n(.*?)^```", re.S | re.M)


def blocks():
    """(file, line, text) of every runnable block."""
    for path in [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs",
                                                                                  "*.md"))):
        with open(path) as f:
            text = f.read()
        for m in BLOCK.finditer(text):
            yield os.path.relpath(path, ROOT), text.count("\n", 0, m.start()) + 1, m.group(1)


class Docs(dltest.Case):
    def setUp(self):
        super().setUp()
        self.bin = os.path.join(self.dir, "bin")
        os.mkdir(self.bin)
        for name, rel in PROGRAMS.items():
            os.symlink(os.path.join(BUILD, rel), os.path.join(self.bin, name))
        os.symlink(os.path.join(os.path.abspath(ROOT), "examples"),
                   os.path.join(self.dir, "examples"))

    def test_runnable_blocks_run(self):
        found = list(blocks())
        self.assertGreaterEqual(len(found), 5, "the docs mark their runnable examples")
        for path, line, text in found:
            with self.subTest(f"{path}:{line}"):
                work = tempfile.mkdtemp(dir=self.dir)
                os.symlink(os.path.join(self.dir, "examples"), os.path.join(work, "examples"))
                env = {k: v for k, v in os.environ.items() if not k.startswith("DLAUNCH_")}
                env["PATH"] = self.bin + os.pathsep + env.get("PATH", "")
                p = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", text], cwd=work,
                                   env=env, capture_output=True, text=True, timeout=600)
                self.assertEqual(p.returncode, 0,
                                 f"{path}:{line}: exit {p.returncode}\n{text}\nstdout:\n"
                                 f"{p.stdout[-2000:]}\nstderr:\n{p.stderr[-2000:]}")
                shutil.rmtree(work, ignore_errors=True)


def tables():
    """(file, line, rows) of every Markdown table in README.md and docs/*.md: each run of lines
    that start with '|' outside code fences."""
    for path in [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs",
                                                                                  "*.md"))):
        with open(path) as f:
            lines = f.read().split("\n")
        fence, rows = False, []
        for n, line in enumerate(lines + [""], 1):
            if line.startswith("```"):
                fence = not fence
            if not fence and line.startswith("|"):
                rows.append((n, line))
                continue
            if rows:
                yield os.path.relpath(path, ROOT), rows[0][0], rows
                rows = []


def documented_variables():
    """Every DLAUNCH_* variable README.md and docs/*.md name, but the misspellings they show."""
    names = set()
    for path in [os.path.join(ROOT, "README.md")] + glob.glob(os.path.join(ROOT, "docs", "*.md")):
        with open(path) as f:
            names |= set(re.findall(r"\bDLAUNCH_[A-Z0-9_]*[A-Z0-9]\b", f.read()))
    return sorted(names - {"DLAUNCH_GPUS", "DLAUNCH_TRAIN_BACH_SIZE"})


class Claims(dltest.Case):
    """docs/job-spec.md, docs/control.md, docs/events.md, docs/exit-codes.md: what they say."""

    def test_every_table_is_whole(self):
        # A row cut off by a blank line, or with a cell too many or too few, renders garbled
        # (docs/job-spec.md's --token-file row once did).
        found = list(tables())
        self.assertGreater(len(found), 20)
        for path, line, rows in found:
            with self.subTest(f"{path}:{line}"):
                self.assertGreaterEqual(len(rows), 3, f"{path}:{line}: a header, a rule, rows")
                self.assertRegex(rows[1][1].strip(), r"^\|( *:?-+:? *\|)+$",
                                 f"{path}:{rows[1][0]}: the rule under the header")
                width = len(table_cells(rows[0][1]))
                for n, row in rows:
                    self.assertEqual(len(table_cells(row)), width, f"{path}:{n}: {row[:80]}")

    def test_every_documented_variable_is_known_and_a_typo_gets_the_closest(self):
        # job-spec.md: "A DLAUNCH_* variable that is no setting (DLAUNCH_GPUS=4) is named in a
        # warning with the closest one". Empty values count as unset, so only the names matter.
        known = documented_variables()
        self.assertIn("DLAUNCH_ENDPOINT", known)
        p = self.dlaunch("--dry-run", "--", "true", env={k: "" for k in known}, check_code=0)
        self.assertNotIn("warning", p.stderr)
        p = self.dlaunch("--dry-run", "--", "true", check_code=0,
                         env={"DLAUNCH_GPUS": "4", "DLAUNCH_MAX_RESTART": "3",
                              "DLAUNCH_XYZZY": "1"})
        self.assertIn("dlaunch: warning: DLAUNCH_GPUS is no dlaunch setting (did you mean "
                      "DLAUNCH_GPUS_PER_NODE?); it is ignored\n", p.stderr)
        self.assertIn("dlaunch: warning: DLAUNCH_MAX_RESTART is no dlaunch setting (did you mean "
                      "DLAUNCH_MAX_RESTARTS?); it is ignored\n", p.stderr)
        self.assertIn("dlaunch: warning: DLAUNCH_XYZZY is no dlaunch setting; it is ignored\n",
                      p.stderr)
        self.assertIn("max restarts 0", p.stdout)

    def run_trainer(self, *args):
        env = {k: v for k, v in os.environ.items() if not k.startswith("DLAUNCH_")}
        return subprocess.run([os.path.join(BUILD, PROGRAMS["dlaunch-train"]), *args], env=env,
                              cwd=self.dir, capture_output=True, text=True, timeout=60)

    def test_numbers_in_messages_print_as_written(self):
        # Never 1e+06, 1e+15 or 0.10000000000000001: whole numbers in full, others as typed.
        cases = [(["--max-restarts", "2000000"], "(0 to 1000000)"),
                 (["--straggler-threshold", "0.001"], "(0.01 to 100)"),
                 (["--straggler-cooldown", "-1"], "(0 to 10000000)")]
        for args, want in cases:
            p = self.dlaunch(*args, "--", "true", check_code=2)
            self.assertIn(want, p.stderr)
            self.assertNotRegex(p.stderr, r"e[+-]\d|\.\d{7}")
        p = self.run_trainer("--set", "steps=-1")
        self.assertEqual(p.stderr, "dlaunch-train: --set: steps: '-1' is out of range "
                                   "(0 to 1000000000000000)\n")
        path = self.write("lr.yaml", "train:\n  lr: 500000\n  lr_min: 1000000\n")
        p = self.dlaunch(path, check_code=2)
        self.assertEqual(p.stderr, f"dlaunch: {path}: train: lr_min 1000000 is above lr "
                                   f"500000\n")

    def test_argument_errors_point_at_the_right_thing(self):
        # A flag missing its value is named as such, not taken for an unknown argument or a
        # job spec; an empty value is quoted as what it is.
        p = self.run_trainer("--set")
        self.assertEqual((p.returncode, p.stderr),
                         (2, "dlaunch-train: option '--set' needs a value (KEY=VALUE)\n"))
        p = self.dlaunch("--max-restarts", "--", "true", check_code=2)
        self.assertEqual(p.stderr, "dlaunch: option '--max-restarts' needs a value (N)\n")
        p = self.dlaunch("--nodes=", "--", "true", check_code=2)
        self.assertEqual(p.stderr, "dlaunch: --nodes: '' is not N or MIN:MAX\n")
        # An unknown train: key is pointed at where the key is, a bad value where the value is.
        path = self.write("key.yaml", "train:\n  steps: lots\n")
        p = self.dlaunch(path, check_code=2)
        self.assertEqual(p.stderr,
                         f"dlaunch: {path}:2:10: train: steps: 'lots' is not a whole number\n")
        path = self.write("key.yaml", "train:\n  steps: 5\n  bach_size:   8\n")
        p = self.dlaunch(path, check_code=2)
        self.assertEqual(p.stderr, f"dlaunch: {path}:3:3: train: unknown trainer setting "
                                   f"'bach_size' (did you mean 'batch_size'?)\n")

    def test_dry_run_shows_the_whole_environment_a_worker_gets(self):
        # job-spec.md: --dry-run prints "each rank's whole environment as dlaunch sets it:
        # torchrun's variables, ours, the spec's env:". A real run of the same job, with a
        # token, gets exactly those (and what it inherits) - no more.
        token = self.write("job.token", "s3cret\n")
        os.chmod(token, 0o600)
        spec = self.write("job.yaml", "gpus_per_node: 2\nenv:\n  GREETING: hello\n"
                                      "command: [env]\n")
        args = ["--run-id", "envs", "--token-file", token, spec]
        p = self.dlaunch("--dry-run", *args, check_code=0)
        planned = {}
        for line in p.stdout.splitlines():
            if line.startswith("rank "):
                rank, rest = line.split(":", 1)
                planned[int(rank.split()[1])] = dict(w.split("=", 1) for w in shlex.split(rest))
        self.assertEqual(sorted(planned), [0, 1])
        for want in ("GREETING", "DLAUNCH_STORE", "OMP_NUM_THREADS", "DLAUNCH_TOKEN_FILE",
                     "MASTER_PORT", "TORCHELASTIC_RUN_ID", "DLAUNCH_ATTEMPT_DIR"):
            self.assertIn(want, planned[0], p.stdout)
        self.assertEqual(planned[0]["GREETING"], "hello")
        self.assertEqual(planned[0]["OMP_NUM_THREADS"], "1")
        self.assertFalse(os.path.exists(os.path.join(self.dir, "dlaunch_logs")))

        parent = {k: v for k, v in os.environ.items() if not k.startswith("DLAUNCH_")}
        self.dlaunch("-q", *args, check_code=0)
        for rank in (0, 1):
            got = dict(l.split("=", 1) for l in
                       self.read("dlaunch_logs", "envs", "attempt_0", f"rank_{rank}.out")
                       .splitlines() if "=" in l)
            set_by_dlaunch = {k for k, v in got.items() if parent.get(k) != v}
            self.assertEqual(set_by_dlaunch - set(planned[rank]), set(),
                             "set for the worker but not shown by --dry-run")
            self.assertEqual(set(planned[rank]) - set(got), set(),
                             "shown by --dry-run but not set for the worker")

    def test_gpu_warning_once_only_when_gpus_are_asked_for_in_the_right_number(self):
        # job-spec.md: a GPU count above the GPUs found warns once; --nproc-per-node N is a
        # count of processes and warns of nothing; the default auto is one worker, quietly.
        # CUDA_VISIBLE_DEVICES="" hides any GPU, so this machine has none.
        none = {"CUDA_VISIBLE_DEVICES": ""}

        def warnings(*args):
            p = self.dlaunch(*args, env=none, check_code=0)
            return [l for l in p.stderr.splitlines() if "warning" in l], p.stderr

        self.assertEqual(warnings("--gpus-per-node", "1", "--", "true")[0],
                         ["dlaunch: warning: --gpus-per-node 1: 0 GPUs found; starting 1 worker "
                          "on the CPU"])
        # Once for the run, not once an attempt: two failures, three attempts.
        flaky = 'n=$(ls -d $PWD/dlaunch_logs/f/attempt_* | wc -l); [ "$n" -ge 3 ]'
        got, err = warnings("--gpus-per-node", "2", "--max-restarts", "2", "--run-id", "f",
                            "--", "sh", "-c", flaky)
        self.assertEqual(got, ["dlaunch: warning: --gpus-per-node 2: 0 GPUs found; starting 2 "
                               "workers on the CPU"])
        self.assertIn("dlaunch: run f succeeded after 3 attempts in ", err)
        self.assertEqual(warnings("--gpus-per-node", "auto", "--", "true")[0],
                         ["dlaunch: warning: --gpus-per-node auto: no GPU found; starting 1 "
                          "worker on the CPU"])
        self.assertEqual(warnings("--", "true")[0], [])
        self.assertEqual(warnings("--nproc-per-node", "2", "--", "true")[0], [])
        self.assertEqual(warnings("-q", "--gpus-per-node", "2", "--", "true")[0], [])

    def test_a_one_node_job_that_succeeds_says_only_that(self):
        # Its rendezvous is the agent's own: the job's creation is in the journal, not on stderr.
        p = self.dlaunch("--run-id", "one", "--nproc-per-node", "2", "--", "true",
                         env={"CUDA_VISIBLE_DEVICES": ""}, check_code=0)
        self.assertEqual(p.stdout, "")
        self.assertRegex(p.stderr, r"\Adlaunch: run one succeeded after 1 attempt in [0-9.]+ s; "
                                   r"logs in dlaunch_logs/one/\n\Z")

    def test_one_is_singular_everywhere(self):
        none = {"CUDA_VISIBLE_DEVICES": ""}
        said = []

        def run(*args, code):
            p = self.dlaunch(*args, env=none, check_code=code)
            said.append(p.stdout + p.stderr)
            return p

        p = run("-q", "--run-id", "one", "--", "true", code=0)
        self.assertIn("dlaunch: run one succeeded after 1 attempt in ", p.stderr)
        p = run("-q", "--run-id", "bad", "--", "false", code=1)
        self.assertIn("dlaunch: the job failed after 1 attempt; first failure of each:", p.stderr)
        p = run("--dry-run", "--", "true", code=0)
        self.assertIn(": 1 node, 1 worker per node, world size 1,", p.stdout)
        p = run("--dry-run", "--rdzv-endpoint", "127.0.0.1:9", "--run-id", "x", "--", "true",
                code=0)
        self.assertIn("run x: 1 node through the rendezvous at 127.0.0.1:9, 1 worker on this "
                      "node,", p.stdout)
        p = run("--node-rank", "1", "--", "true", code=2)
        self.assertEqual(p.stderr, "dlaunch: --node-rank 1: a job of 1 node has ranks 0 to 0\n")
        for out in said:
            self.assertNotRegex(out, r"\b1 (nodes|workers|attempts|restarts|ranks)\b")
    def test_a_bad_train_variable_stops_dlaunch_before_anything_starts(self):
        # job-spec.md: in a job that runs the trainer (a train: section, or dlaunch-train as
        # the command) a bad DLAUNCH_TRAIN_* is exit 2 and one line, nothing started; an
        # unknown one is named with the closest setting, even with --quiet.
        spec = self.write("job.yaml", "gpus_per_node: 2\nmax_restarts: 3\ntrain:\n  steps: 5\n")
        trainer = os.path.join(BUILD, PROGRAMS["dlaunch-train"])
        for job in ([spec], ["--gpus-per-node", "2", "--max-restarts", "3", "--", trainer]):
            p = self.dlaunch(*job, env={"DLAUNCH_TRAIN_LR": "fast"}, check_code=2)
            self.assertEqual(p.stderr, "dlaunch: DLAUNCH_TRAIN_LR: 'fast' is not a number\n")
            self.assertFalse(os.path.exists(os.path.join(self.dir, "dlaunch_logs")))
            p = self.dlaunch("-q", "--dry-run", *job, check_code=0,
                             env={"DLAUNCH_TRAIN_STEP": "5", "DLAUNCH_TRAIN_BOGUS": "1"})
            self.assertEqual(sorted(p.stderr.splitlines()), [
                "dlaunch: warning: DLAUNCH_TRAIN_BOGUS is no trainer setting; it is ignored",
                "dlaunch: warning: DLAUNCH_TRAIN_STEP is no trainer setting (did you mean "
                "DLAUNCH_TRAIN_STEPS?); it is ignored"])
        # Another command is not the trainer: its DLAUNCH_TRAIN_* are none of dlaunch's business.
        self.dlaunch("-q", "--", "true", env={"DLAUNCH_TRAIN_LR": "fast"}, check_code=0)

    def test_run_ids_are_what_the_docs_say(self):
        # job-spec.md: 1 to 128 letters, digits, '.', '_', ':', '-' (not '.' or '..').
        for good in ("a.b_c:d-9", "x" * 128):
            p = self.dlaunch("-q", "--run-id", good, "--", "true", check_code=0)
            self.assertIn(f"dlaunch: run {good} succeeded", p.stderr)
        why = "is not a run id (1 to 128 letters, digits, '.', '_', ':', '-'; not '.' or '..')"
        for bad in ("x" * 129, "a/b", "a b", "..", ".", "caf\u00e9"):
            p = self.dlaunch("--run-id", bad, "--", "true", check_code=2)
            self.assertEqual(p.stderr, f"dlaunch: --run-id: '{bad}' {why}\n")
        p = self.dlaunch("--run-id", "", "--", "true", check_code=2)
        self.assertEqual(p.stderr, "dlaunch: --run-id: must not be empty\n")

    def test_booleans_take_every_documented_spelling(self):
        # job-spec.md: true/false, yes/no, on/off or 1/0, in any case (True too), in YAML and
        # in variables; an error lists every spelling.
        spellings = "true/false, yes/no, on/off or 1/0"
        for word, quiet in (("True", True), ("TRUE", True), ("yes", True), ("On", True),
                            ("1", True), ("False", False), ("no", False), ("OFF", False),
                            ("0", False)):
            spec = self.write("b.yaml", f"quiet: {word}\ncommand: [echo, said]\n")
            p = self.dlaunch(spec, check_code=0)
            self.assertEqual("said" not in p.stdout, quiet, f"quiet: {word}")
            p = self.dlaunch("--", "echo", "said", env={"DLAUNCH_QUIET": word}, check_code=0)
            self.assertEqual("said" not in p.stdout, quiet, f"DLAUNCH_QUIET={word}")
        spec = self.write("b.yaml", "quiet: maybe\ncommand: [true]\n")
        p = self.dlaunch(spec, check_code=2)
        self.assertEqual(p.stderr,
                         f"dlaunch: {spec}:1:8: quiet: 'maybe' is not a boolean ({spellings})\n")
        spec = self.write("b.yaml", "quiet: 'true'\ncommand: [true]\n")
        p = self.dlaunch(spec, check_code=2)
        self.assertIn(f"expected a boolean ({spellings}), got a quoted string", p.stderr)
        p = self.dlaunch("--", "true", env={"DLAUNCH_DRY_RUN": "maybe"}, check_code=2)
        self.assertEqual(p.stderr,
                         f"dlaunch: DLAUNCH_DRY_RUN: 'maybe' is not a boolean ({spellings})\n")
        spec = self.write("t.yaml", "train:\n  drop_last: sure\n")
        p = self.dlaunch(spec, check_code=2)
        self.assertEqual(p.stderr, f"dlaunch: {spec}:2:14: train: drop_last: 'sure' is not a "
                                   f"boolean ({spellings})\n")
        p = self.dlaunch("--rdzv-conf", "is_host=maybe", "--", "true", check_code=2)
        self.assertIn(spellings, p.stderr)
        # An empty variable counts as unset.
        p = self.dlaunch("--", "echo", "said", env={"DLAUNCH_QUIET": ""}, check_code=0)
        self.assertIn("said", p.stdout)

    def test_a_one_node_job_with_a_token_gives_its_workers_the_worker_key(self):
        # job-spec.md: DLAUNCH_TOKEN_FILE "when the job has a token (several nodes or one)":
        # a 0600 file with the job's worker key, which reaches the store; the agent's own token
        # never reaches a worker; the file goes when the agent ends.
        token = self.write("job.token", "s3cret\n")
        os.chmod(token, 0o600)
        script = ('f=$DLAUNCH_TOKEN_FILE; echo "file=$f"; stat -c "mode=%a" "$f"; '
                  'echo "key=$(cut -d: -f1 "$f")"; echo "token=${DLAUNCH_TOKEN:-none}"; '
                  'dlaunch kv set k v && echo "kv=$(dlaunch kv get k)"')
        p = self.dlaunch("-q", "--run-id", "one", "--token-file", token, "--", "sh", "-c",
                         script, env={"PATH": os.path.dirname(dltest.DLAUNCH) + os.pathsep +
                                      os.environ["PATH"]}, check_code=0)
        got = dict(l.split("=", 1) for l in
                   self.read("dlaunch_logs", "one", "attempt_0", "rank_0.out").splitlines())
        self.assertEqual((got["mode"], got["key"], got["token"], got["kv"]),
                         ("600", "dlaunch-worker-v2", "none", "v"), got)
        self.assertNotEqual(got["file"], token)
        self.assertFalse(os.path.exists(got["file"]), "removed when the agent ended")
        # Without a token there is none, and the store serves the job's user.
        p = self.dlaunch("-q", "--run-id", "two", "--", "sh", "-c",
                         'echo "file=${DLAUNCH_TOKEN_FILE:-none}"', check_code=0)
        self.assertEqual(self.read("dlaunch_logs", "two", "attempt_0", "rank_0.out"),
                         "file=none\n")

    @unittest.skipUnless(os.path.exists("/usr/share/datasets/fashion-mnist/train-labels-idx1-"
                                        "ubyte.gz"), "dataset-fashion-mnist is not installed")
    def test_rerunning_the_example_says_it_resumes_on_its_first_line(self):
        # README's example, run twice as a newcomer would: the second run picks up the first
        # one's checkpoint, and its first line from the workers says so, and how not to.
        os.symlink(os.path.join(os.path.abspath(ROOT), "examples"),
                   os.path.join(self.dir, "examples"))
        env = {"DLAUNCH_TRAIN_STEPS": "20", "CUDA_VISIBLE_DEVICES": ""}
        p = self.dlaunch("examples/train.yaml", env=env, timeout=300, check_code=0)
        self.assertNotIn("resuming", p.stdout)
        env["DLAUNCH_TRAIN_STEPS"] = "40"
        p = self.dlaunch("examples/train.yaml", env=env, timeout=300, check_code=0)
        first = p.stdout.splitlines()[0]
        self.assertEqual(first, "[rank 0] resuming from dlaunch_checkpoints/fashion-mnist/"
                                "ckpt-000000000020.dlck: step 20, epoch 1, 2560 samples into it "
                                "(written by 2 ranks); to start afresh, remove "
                                "dlaunch_checkpoints/fashion-mnist or set resume: false")
        # One worker: "written by 1 rank".
        for steps in (10, 20):
            spec = self.write("one.yaml", f"gpus_per_node: 1\ntrain:\n  steps: {steps}\n"
                                          f"  checkpoint_dir: ck1\n")
            self.dlaunch("-q", "--run-id", f"one{steps}", spec, timeout=300, check_code=0)
        first = self.read("dlaunch_logs", "one20", "attempt_0", "rank_0.out").splitlines()[0]
        self.assertIn("(written by 1 rank); to start afresh, remove ck1", first)


# ---- Figures: one source each (issue #34) ------------------------------------------------------

# Where measured figures live, each with its command and date: others refer to them.
SOURCES = ("docs/performance.md", "docs/reliability.md")
NUMBER = r"\d[\d,]*(?:\.\d+)?"
# A number of milliseconds, GB/s, MB/s or samples/s (with the numbers of a range or list before
# it: "10.4-11.6 GB/s", "22.7, 31.1 ms"), a ratio written 1.77x, or seconds with a decimal point
# ("0.65-0.69 s"; whole seconds are settings: "--dead-after 1 s").
FIGURE = re.compile(rf"(?<![\w.^/])({NUMBER}(?:\s?(?:-|to|and|/|,)\s?{NUMBER})*)\s?"
                    rf"(ms|GB/s|GiB/s|MB/s|samples/s)(?![\w/])|(?<![\w.^/])(\d+\.\d+)x\b|"
                    rf"(?<![\w.^/])(\d+\.\d+(?:\s?(?:-|to)\s?\d+\.\d+)?)\s?s(?![\w/])")
# Quantities that are settings, limits or arithmetic, not measurements: a figure any test or run
# would give again. Name one here only with the reason.
NOT_FIGURES = {
    "README.md": {"3.2 s"},              # an example of the hang line, not a measurement
    "docs/agent.md": {"300 ms"},         # how long a stop-signal death waits for the agent's own
    "docs/collective.md": {"1.5x", "1.14x",  # H/(H-1) for 3 and 8 hosts: arithmetic
                           "20 ms"},     # how often a wait looks at the abort flag
    "docs/diagnostics.md": {"50 ms",     # the test's SIGSTOP/SIGCONT duty cycle
                            "0.1 s"},    # how often the trainer writes a progress beat
    "docs/etcd.md": {"50 ms", "500 ms"},  # the test cluster's heartbeat and election settings
    "docs/job-spec.md": {"0.1 s"},       # the trainer's beat, the client's first back-off
    "docs/operations.md": {"250 ms",     # the test's Prometheus scrape interval
                           "0.5 s"},     # the age that makes a status snapshot stale
    "docs/protocol.md": {"0.1 s"},       # the client's first back-off
    "docs/recovery.md": {"150 ms"},      # the agent's wait before it reports a broken group
    "docs/rendezvous.md": {"250 ms"},    # how often a successor tries a held address again
}


def prose(text):
    """text with fenced blocks and `code spans` (example output, commands) blanked out, its
    lines kept where they were."""
    text = re.sub(r"^```.*?^```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*(?:\n[^`\n]+)*`", lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


def quoted_figures(text):
    """(line, quantity as written, [its numbers], unit) of every figure in text's prose."""
    text = prose(text)
    for m in FIGURE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        if m.group(3):
            yield line, m.group(0), [m.group(3)], "x"
        elif m.group(4):
            yield line, m.group(0), re.findall(NUMBER, m.group(4)), "s"
        else:
            yield line, m.group(0), re.findall(NUMBER, m.group(1)), m.group(2)


def plain(number):
    return number.replace(",", "")


class Figures(unittest.TestCase):
    """Every figure in the docs is written once, in docs/performance.md or docs/reliability.md,
    with the command that measures it and the date, and the other docs refer to it there."""
    maxDiff = None

    def source_numbers(self):
        """Every number the sources hold (their tables and code blocks name the units in
        headers), and every quantity they write with its unit."""
        numbers, quantities = set(), set()
        for rel in SOURCES:
            with open(os.path.join(ROOT, rel)) as f:
                text = f.read()
            numbers |= {plain(n) for n in re.findall(NUMBER, text)}
            for m in FIGURE.finditer(text):
                unit = m.group(2) or ("x" if m.group(3) else "s")
                quantities |= {(plain(n), unit) for n in re.findall(NUMBER, m.group(1) or
                                                                     m.group(3) or m.group(4))}
        return numbers, quantities

    def held(self, number, unit, sources):
        """A round number ("about 100 ms") is a figure rounded, or a setting: the sources must
        write it with its unit. Any other must be among their numbers."""
        numbers, quantities = sources
        n = plain(number)
        if re.fullmatch(r"\d*0", n):
            return (n, unit) in quantities
        return n in numbers

    def test_every_figure_a_doc_quotes_is_in_its_source(self):
        held = self.source_numbers()
        found, misses = 0, []
        for path in [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs",
                                                                                      "*.md"))):
            rel = os.path.relpath(path, ROOT)
            if rel in SOURCES:
                continue
            with open(path) as f:
                text = f.read()
            for line, written, numbers, unit in quoted_figures(text):
                found += 1
                if re.sub(r"\s+", " ", written) in NOT_FIGURES.get(rel, ()):
                    continue
                if not all(self.held(n, unit, held) for n in numbers):
                    misses.append(f"{rel}:{line}: {written}")
        self.assertGreater(found, 5, "the figure pattern finds the docs' quantities")
        self.assertEqual(misses, [], f"figures not in {' or '.join(SOURCES)}: refer to the "
                                     f"figure there, or measure it and write it there")

    def test_the_pattern_finds_what_it_must(self):
        got = [(w, n) for _, w, n, _ in quoted_figures(
            "a 725 ms loss, 10.4-11.6 GB/s, 75,000 and 136,000 samples/s, 0.974x, 0.65-0.69 s;\n"
            "`in 29 ms` and 4 x 5 and 10^9 ms are no figures\n```\n3 ms\n```\n")]
        self.assertEqual(got, [("725 ms", ["725"]), ("10.4-11.6 GB/s", ["10.4", "11.6"]),
                               ("75,000 and 136,000 samples/s", ["75,000", "136,000"]),
                               ("0.974x", ["0.974"]), ("0.65-0.69 s", ["0.65", "0.69"])])

    def test_reliability_names_the_slowest_failure_seen_at_once(self):
        # "training again within 1 s plus the checkpoint load after any single failure that does
        # not take the network away (the most: ...)": the bench/faults table's slowest train_ms
        # among the rows detected within half a second (not by a timeout, a silence or a cut).
        with open(os.path.join(ROOT, "docs", "reliability.md")) as f:
            text = f.read()
        lines = text.splitlines()
        at = next(i for i, l in enumerate(lines) if l.startswith("| scenario | recovery |"))
        cols = [c.strip() for c in table_cells(lines[at])]
        rows = []
        for line in lines[at + 2:]:
            if not line.startswith("|"):
                break
            rows.append([c.strip() for c in table_cells(line)])

        def number(cell):
            return float(cell) if re.fullmatch(r"\d+(\.\d+)?", cell) else None

        seen_at_once = [r for r in rows if number(r[cols.index("detect_ms")]) is not None and
                        number(r[cols.index("detect_ms")]) < 500 and
                        number(r[cols.index("train_ms")]) is not None]
        self.assertGreater(len(seen_at_once), 5)
        slowest = max(seen_at_once, key=lambda r: number(r[cols.index("train_ms")]))
        m = re.search(r"\(the most: ([^)]*)\)", re.sub(r"\s+", " ", text))
        self.assertIsNotNone(m, "reliability.md names the slowest")
        for name in (slowest[cols.index("scenario")], slowest[cols.index("recovery")]):
            self.assertRegex(m.group(1), rf"(?<![\w-]){re.escape(name)}(?![\w-])", slowest)
        self.assertIn(f"{slowest[cols.index('train_ms')]} ms", m.group(1))


if __name__ == "__main__":
    dltest.main()
