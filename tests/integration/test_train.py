"""The bundled trainer (dlaunch-train) run data parallel by the real dlaunch on Fashion-MNIST:
4 ranks train the same model as 1 rank with 4x the batch, replicas stay bitwise equal, a run
killed after a checkpoint and restarted ends bitwise where an uninterrupted one does, the
shipped example learns, and bad input is one clear line. Skipped where Debian's
dataset-fashion-mnist is not installed."""
import array
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
import unittest
import zlib

import dltest

FASHION = "/usr/share/datasets/fashion-mnist"
TRAINER = os.environ.get("DLAUNCH_TRAIN") or os.path.join(
    os.environ.get("BUILD_ROOT", "build"), "trainer", "dlaunch-train")
SOURCE_ROOT = os.environ.get("SOURCE_ROOT") or os.path.join(os.path.dirname(__file__), "..", "..")
# The default model, 784-256-128-10.
N_PARAMS = 256 * 784 + 256 + 128 * 256 + 128 + 10 * 128 + 10

# A slice of the real data as plain (uncompressed) IDX files, made once for the module: the
# tests that compare parameters need real images but not 60,000 of them decompressed per rank.
SUBSET = None
SUBSET_TRAIN = 4096
SUBSET_TEST = 1000


def have_fashion():
    return all(os.path.exists(os.path.join(FASHION, f"{p}-{k}-idx{d}-ubyte.gz"))
               for p in ("train", "t10k") for k, d in (("images", 3), ("labels", 1)))


def write_subset(dst):
    for prefix, n in (("train", SUBSET_TRAIN), ("t10k", SUBSET_TEST)):
        for kind, ndims, item in (("images", 3, 784), ("labels", 1, 1)):
            name = f"{prefix}-{kind}-idx{ndims}-ubyte"
            with gzip.open(os.path.join(FASHION, name + ".gz"), "rb") as f:
                head = f.read(4 + 4 * ndims)
                payload = f.read(n * item)
            dims = list(struct.unpack(f">{ndims}I", head[4:]))
            dims[0] = n
            with open(os.path.join(dst, name), "wb") as f:
                f.write(head[:4] + struct.pack(f">{ndims}I", *dims) + payload)


def setUpModule():
    global SUBSET
    if have_fashion():
        SUBSET = tempfile.mkdtemp(prefix="dl-train-data-")
        write_subset(SUBSET)


def tearDownModule():
    if SUBSET:
        shutil.rmtree(SUBSET, ignore_errors=True)


def read_checkpoint(path):
    """(header fields, parameters as floats, the parameters' bytes) of a .dlck file; the layout
    is in docs/trainer.md."""
    with open(path, "rb") as f:
        b = f.read()
    assert b[:8] == b"DLTRCKPT", path
    hlen, = struct.unpack_from("<I", b, 16)
    world, = struct.unpack_from("<I", b, 28)
    n, step = struct.unpack_from("<QQ", b, 32)
    assert n == N_PARAMS and len(b) == hlen + 8 * n + 4, path
    raw = b[hlen:hlen + 4 * n]
    params = array.array("f")
    params.frombytes(raw)
    return {"step": step, "world_size": world}, params, raw


def crc_lines(text):
    """{step: crc} from the 'step S params_crc32 X' lines a rank reports (in rank_N.checksums
    under dlaunch, on stdout with --verbose)."""
    return {int(m.group(1)): m.group(2)
            for m in re.finditer(r"step (\d+) params_crc32 ([0-9a-f]{8})", text)}


@unittest.skipUnless(have_fashion(), "dataset-fashion-mnist is not installed")
class Train(dltest.Case):
    def job(self, name, workers, settings, extra=""):
        """Writes a job spec whose train: section holds settings; returns its path."""
        lines = [f"gpus_per_node: {workers}", extra, "train:"]
        lines += [f"  {k}: {v}" for k, v in settings.items()]
        return self.write(name, "\n".join(lines) + "\n")

    def rank_log(self, run_id, attempt, rank, kind="out"):
        return self.read("dlaunch_logs", run_id, f"attempt_{attempt}", f"rank_{rank}.{kind}")

    def summary(self, path):
        with open(os.path.join(self.dir, path)) as f:
            return json.load(f)

    def test_four_ranks_train_the_model_of_one_rank_with_four_times_the_batch(self):
        # Default optimizer settings (lr 0.05, momentum 0.9, warmup, cosine). Summing the batch
        # in another order changes the last bits, and training amplifies them by an amount that
        # depends on OpenBLAS's kernels: measured after 30 steps, 3e-8 with its AVX-512 kernels
        # and 2.6e-4 with the generic (Prescott) ones it falls back to on CPUs it does not know.
        # A wrong average (a missing 1/world, a rank's batch lost) is off by 1e-2 and more.
        common = {"dataset_dir": SUBSET, "steps": 30, "seed": 5, "checkpoint_every": 10,
                  "bucket_bytes": 65536}
        one = self.job("one.yaml", 1, {**common, "batch_size": 64, "checkpoint_dir": "ck1"})
        self.dlaunch("-q", "--run-id", "one", one, timeout=120, check_code=0)
        # Both ways of summing gradients: in one piece after backward (what "auto" picks with
        # fewer CPUs than 2 per worker) and in 64 KiB buckets during backward.
        for overlap in ("off", "on"):
            four = self.job(f"four-{overlap}.yaml", 4, {**common, "batch_size": 16,
                                                        "overlap": overlap,
                                                        "checkpoint_dir": f"ck4-{overlap}"})
            self.dlaunch("-q", "--run-id", f"four-{overlap}", four, timeout=180, check_code=0)
            crcs = [crc_lines(self.rank_log(f"four-{overlap}", 0, r, "checksums")) for r in range(4)]
            for step in (10, 20, 30):
                name = f"ckpt-{step:012d}.dlck"
                head4, p4, raw4 = read_checkpoint(os.path.join(self.dir, f"ck4-{overlap}", name))
                head1, p1, _ = read_checkpoint(os.path.join(self.dir, "ck1", name))
                self.assertEqual((head4["step"], head4["world_size"]), (step, 4))
                self.assertEqual((head1["step"], head1["world_size"]), (step, 1))
                # Every rank holds exactly the parameters rank 0 saved.
                saved = f"{zlib.crc32(raw4):08x}"
                self.assertEqual([c.get(step) for c in crcs], [saved] * 4, f"step {step}")
                worst = max(abs(a - b) for a, b in zip(p4, p1))
                self.assertLess(worst, 1e-3, f"overlap {overlap}, step {step}")
            # Not trivially equal: training moved the parameters far beyond that.
            _, p10, _ = read_checkpoint(os.path.join(self.dir, "ck1", f"ckpt-{10:012d}.dlck"))
            self.assertGreater(max(abs(a - b) for a, b in zip(p1, p10)), 50 * worst)

    def test_ranks_meet_through_the_store_and_leave_master_port_to_the_worker(self):
        # Rank 0 takes MASTER_PORT for itself first, as a script's own torch TCPStore would
        # with store=worker (else the agent serves torch's store there); the trainer's ranks
        # still find each other, through DLAUNCH_STORE.
        hold = ('import os, socket, time; s = socket.socket(); '
                's.bind((os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))); '
                's.listen(); open("held", "w").close(); time.sleep(30)')
        script = (f'if [ "$RANK" = 0 ]; then python3 -c \'{hold}\' & '
                  'while [ ! -e held ]; do sleep 0.05; done; fi; '
                  f'exec {TRAINER} --set dataset_dir={SUBSET} --set steps=20')
        p = self.dlaunch("--gpus-per-node", "2", "--run-id", "store", "--rdzv-conf",
                         "store=worker", "--", "sh", "-c", script, timeout=120)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("done after 20 steps", p.stdout)
        self.assertIn("world size 2", p.stdout)

    def test_a_rank_that_never_joins_fails_the_others_at_the_bootstrap_timeout(self):
        script = (f'[ "$RANK" = 1 ] && exit 0; '
                  f'exec {TRAINER} --set dataset_dir={SUBSET} --set steps=20')
        t0 = time.monotonic()
        p = self.dlaunch("--gpus-per-node", "2", "--run-id", "lonely", "--", "sh", "-c", script,
                         env={"DLAUNCH_COLL_TIMEOUT": "2"}, timeout=120)
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
        self.assertLess(time.monotonic() - t0, 30)
        self.assertIn("did not get this far in time", p.stdout + p.stderr)

    # ---- Resume -----------------------------------------------------------------------------

    # 600: a kill at step 100 or 300 still has checkpoints after it to agree on and hundreds of
    # steps for the kill to land before the end (1000 took 25 s more under the sanitizers).
    STEPS = 600
    RESUME = {"steps": STEPS, "seed": 3, "checkpoint_every": 100, "eval_every": 500}

    # The straight run is the same for both resume tests: whichever runs first trains it.
    straight_run = None

    def uninterrupted(self):
        """The final checkpoint of a straight run of the resume tests' job (2 workers)."""
        if Train.straight_run is None:
            spec = self.job("straight.yaml", 2, {**self.RESUME, "dataset_dir": SUBSET,
                                                 "checkpoint_dir": "straight",
                                                 "summary_file": "straight.json"})
            self.dlaunch("-q", "--run-id", "straight", spec, timeout=180, check_code=0)
            path = os.path.join(self.dir, "straight", f"ckpt-{self.STEPS:012d}.dlck")
            with open(path, "rb") as f:
                Train.straight_run = f.read(), self.summary("straight.json")
        return Train.straight_run

    def assert_ends_like(self, ckpt_dir, summary_file, straight):
        final, summary = straight
        with open(os.path.join(self.dir, ckpt_dir, f"ckpt-{self.STEPS:012d}.dlck"), "rb") as f:
            got = f.read()
        # The whole file: parameters, momentum, step, data position and RNG state.
        if got != final:
            self.fail(f"the final checkpoint differs from the uninterrupted run's: CRC-32 "
                      f"{zlib.crc32(got):08x} against {zlib.crc32(final):08x}")
        resumed = self.summary(summary_file)
        self.assertEqual(resumed["params_crc32"], summary["params_crc32"])
        self.assertEqual(resumed["test_accuracy"], summary["test_accuracy"])
        self.assertEqual(resumed["steps"], self.STEPS)
        return resumed

    def test_worker_killed_after_a_checkpoint_restarts_and_ends_bitwise_equal(self):
        straight = self.uninterrupted()
        # Rank 1 SIGKILLs itself after step 300 (a checkpoint step) on the first attempt.
        spec = self.job("flaky.yaml", 2, {**self.RESUME, "dataset_dir": SUBSET,
                                          "checkpoint_dir": "ck", "summary_file": "flaky.json",
                                          "fail_at_step": 300, "fail_rank": 1})
        self.dlaunch("-q", "--run-id", "flaky", "--max-restarts", "1", "--recovery", "restart",
                     "--events",
                     self.events_path, spec, timeout=180, check_code=0)
        evs = self.events()
        died = [e for e in evs if e["event"] == "worker_exit" and e.get("signal") == "SIGKILL"]
        self.assertEqual([(e["rank"], e["attempt"]) for e in died], [(1, 0)])
        self.assertEqual(evs[-1]["attempts"], 2)
        resumed = self.assert_ends_like("ck", "flaky.json", straight)
        self.assertEqual(resumed["resumed_from"], 300)
        # The peer's death is one line naming it, on rank 0.
        err = self.rank_log("flaky", 0, 0, "err")
        self.assertRegex(err, r"^dlaunch-train: step 301: summing gradients: .*rank 1 .*\n$")
        # After the restart both ranks still agree at every checkpoint.
        for step in range(400, self.STEPS + 1, 100):
            crcs = {crc_lines(self.rank_log("flaky", 1, r, "checksums")).get(step) for r in range(2)}
            self.assertEqual(len(crcs), 1, f"step {step}: {crcs}")

    def test_rerun_after_a_kill_resumes_and_ends_bitwise_equal(self):
        straight = self.uninterrupted()
        spec = self.job("job.yaml", 2, {**self.RESUME, "dataset_dir": SUBSET,
                                        "checkpoint_dir": "ck", "summary_file": "job.json"})
        # Kill rank 0 from outside once it reports its first checkpoint, as an OOM killer or
        # an operator would; the 500 steps left take far longer than this reaction.
        p = self.start("--verbose", "--run-id", "first", "--events", self.events_path, spec)
        try:
            for line in p.stdout:
                if re.search(r"\[rank 0\] .*step 100 params_crc32 .* checkpoint", line):
                    break
            pid = [e["pid"] for e in self.events()
                   if e["event"] == "worker_start" and e["rank"] == 0][0]
            os.kill(pid, signal.SIGKILL)
            p.communicate(timeout=120)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        self.assertEqual(p.returncode, 1)
        self.assertFalse(os.path.exists(os.path.join(self.dir, "job.json")))
        killed = [e for e in self.events() if e["event"] == "worker_exit" and e["rank"] == 0]
        self.assertEqual(killed[0].get("signal"), "SIGKILL")

        # The same job again: it picks up the newest checkpoint.
        self.dlaunch("-q", "--run-id", "second", spec, timeout=180, check_code=0)
        resumed = self.assert_ends_like("ck", "job.json", straight)
        self.assertGreaterEqual(resumed["resumed_from"], 100)
        self.assertLess(resumed["resumed_from"], self.STEPS)
        # The rerun says so on its first line, and how to start afresh instead.
        first = self.rank_log("second", 0, 0).splitlines()[0]
        self.assertTrue(first.startswith(f"resuming from ck/ckpt-"
                                         f"{resumed['resumed_from']:012d}.dlck"), first)
        self.assertTrue(first.endswith("; to start afresh, remove ck or set resume: false"),
                        first)

    # ---- Accuracy and errors ----------------------------------------------------------------

    def test_shipped_example_learns(self):
        # examples/train.yaml as shipped (2 workers, full data set from the .gz files), cut to
        # 400 steps through the environment; measured 84.8% there (88.7% after its 10 epochs).
        example = os.path.join(SOURCE_ROOT, "examples", "train.yaml")
        self.dlaunch("-q", "--run-id", "example", example, timeout=300, check_code=0,
                     env={"DLAUNCH_TRAIN_STEPS": "400"})
        s = self.summary(os.path.join("dlaunch_checkpoints", "fashion-mnist", "summary.json"))
        self.assertEqual((s["world_size"], s["global_batch"], s["steps"]), (2, 128, 400))
        self.assertGreater(s["test_accuracy"], 0.80)
        self.assertGreater(s["samples_per_sec"], 0)
        out = [self.rank_log("example", 0, r, "checksums") for r in range(2)]
        self.assertEqual(crc_lines(out[0])[400], s["params_crc32"])
        self.assertEqual(crc_lines(out[1])[400], s["params_crc32"])

    def test_missing_and_corrupt_data_is_one_line_and_fails_the_job(self):
        bad = os.path.join(self.dir, "bad")
        os.mkdir(bad)
        spec = self.job("bad.yaml", 2, {"dataset_dir": bad, "steps": 5})
        self.dlaunch("-q", "--run-id", "missing", spec, timeout=120, check_code=1)
        # The first rank to fail stops the job: the other may be stopped before it says anything,
        # so every rank that spoke said exactly the line, and at least one spoke.
        said = 0
        for r in range(2):
            err = self.rank_log("missing", 0, r, "err")
            if err:
                said += 1
                self.assertEqual(err, f"dlaunch-train: {bad}/train-images-idx3-ubyte.gz: no "
                                      f"such file (nor train-images-idx3-ubyte)\n")
        self.assertGreater(said, 0)

        # The files, then the images cut short (plain) and the labels' gzip stream cut.
        for name in os.listdir(SUBSET):
            shutil.copy(os.path.join(SUBSET, name), bad)
        images = os.path.join(bad, "train-images-idx3-ubyte")
        os.truncate(images, os.path.getsize(images) - 100)
        self.dlaunch("-q", "--run-id", "short", spec, timeout=120, check_code=1)
        err = "".join(self.rank_log("short", 0, r, "err") for r in range(2))
        self.assertIn(err.count("\n"), (1, 2), err)
        self.assertIn(f"{images}: truncated", err)

        shutil.copy(os.path.join(SUBSET, "train-images-idx3-ubyte"), bad)
        labels = os.path.join(bad, "train-labels-idx1-ubyte")
        with open(labels, "rb") as f:
            packed = gzip.compress(f.read())
        os.unlink(labels)
        with open(labels + ".gz", "wb") as f:
            f.write(packed[:len(packed) // 2])
        self.dlaunch("-q", "--run-id", "gz", spec, timeout=120, check_code=1)
        err = "".join(self.rank_log("gz", 0, r, "err") for r in range(2))
        self.assertIn(err.count("\n"), (1, 2), err)
        self.assertIn(f"{labels}.gz: bad gzip stream", err)

    def test_bad_settings_are_one_line(self):
        # In a job spec: refused before any worker starts, with the place in the file.
        spec = self.job("typo.yaml", 2, {"batch_size": 0})
        p = self.dlaunch("--run-id", "typo", spec, timeout=60, check_code=2)
        self.assertRegex(p.stderr, r"typo\.yaml:\d+:\d+: train: batch_size: '0' is out of range")
        self.assertFalse(os.path.exists(os.path.join(self.dir, "dlaunch_logs", "typo")))

        # An unknown key is pointed at where the key is, with the closest known one.
        path = self.write("key.yaml", "gpus_per_node: 2\ntrain:\n  steps: 5\n  bach_size: 8\n")
        p = self.dlaunch("--run-id", "key", path, timeout=60, check_code=2)
        self.assertEqual(p.stderr, f"dlaunch: {path}:4:3: train: unknown trainer setting "
                                   f"'bach_size' (did you mean 'batch_size'?)\n")

        # DLAUNCH_TRAIN_* are checked by dlaunch before any worker starts: a bad one is exit 2
        # and one line; an unknown one is named, with the closest setting, and ignored.
        spec = self.job("env.yaml", 2, {"steps": 5, "dataset_dir": SUBSET})
        p = self.dlaunch("--run-id", "env", spec, timeout=60, check_code=2,
                         env={"DLAUNCH_TRAIN_LR": "fast"})
        self.assertEqual(p.stderr, "dlaunch: DLAUNCH_TRAIN_LR: 'fast' is not a number\n")
        self.assertFalse(os.path.exists(os.path.join(self.dir, "dlaunch_logs", "env")))
        p = self.dlaunch("-q", "--run-id", "env", spec, timeout=120, check_code=0,
                         env={"DLAUNCH_TRAIN_BACH_SIZE": "8", "DLAUNCH_GPUS": "4"})
        self.assertIn("dlaunch: warning: DLAUNCH_TRAIN_BACH_SIZE is no trainer setting (did you "
                      "mean DLAUNCH_TRAIN_BATCH_SIZE?); it is ignored\n", p.stderr)
        self.assertIn("dlaunch: warning: DLAUNCH_GPUS is no dlaunch setting (did you mean "
                      "DLAUNCH_GPUS_PER_NODE?); it is ignored\n", p.stderr)

        # The program itself: exit 2 and one line naming where the bad value came from.
        env = {k: v for k, v in os.environ.items() if not k.startswith("DLAUNCH_")}
        cases = [(["--set", "lr=fast"], {}, "dlaunch-train: --set: lr: 'fast' is not a number"),
                 (["--set", "no_such_key=1"], {},
                  "dlaunch-train: --set: unknown trainer setting 'no_such_key'"),
                 ([], {"DLAUNCH_TRAIN_MOMENTUM": "2"},
                  "dlaunch-train: DLAUNCH_TRAIN_MOMENTUM: '2' is out of range (0 to 0.999999)"),
                 ([], {"WORLD_SIZE": "2", "RANK": "2"},
                  "dlaunch-train: RANK 2 is not below WORLD_SIZE 2"),
                 (["--bogus"], {}, "dlaunch-train: unknown option '--bogus'"),
                 (["--sett", "lr=1"], {}, "dlaunch-train: unknown option '--sett' (did you "
                                          "mean --set?"),
                 (["--set"], {}, "dlaunch-train: option '--set' needs a value (KEY=VALUE)"),
                 (["steps=5"], {}, "dlaunch-train: unknown argument 'steps=5' (dlaunch-train "
                                   "takes options only")]
        for args, extra, want in cases:
            p = subprocess.run([TRAINER, *args], env={**env, **extra}, cwd=self.dir,
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(p.returncode, 2, f"{args} {extra}: {p.stderr}")
            self.assertTrue(p.stderr.startswith(want), f"{args} {extra}: {p.stderr!r}")
            self.assertEqual(p.stderr.count("\n"), 1, p.stderr)
            self.assertEqual(p.stdout, "")

    def test_a_huge_learning_rate_is_caught_as_divergence(self):
        # A learning rate far too high must never end "successfully" at chance accuracy: every
        # rank stops at the same step with exit 3 and one line, and no checkpoint is written of
        # the diverged state.
        spec = self.job("huge.yaml", 2, {"dataset_dir": SUBSET, "steps": 200, "lr": 50,
                                         "warmup_steps": 0, "checkpoint_dir": "ck",
                                         "checkpoint_every": 100, "summary_file": "s.json"})
        p = self.dlaunch("-q", "--run-id", "huge", "--events", self.events_path, spec,
                         timeout=120, check_code=1)
        self.assertRegex(p.stderr, r"\| dlaunch-train: training diverged at step \d+: ")
        self.assertIn("learning rate", p.stderr)
        self.assertIn("try a lower lr", p.stderr)
        exits = [e for e in self.events() if e["event"] == "worker_exit"]
        self.assertEqual(sorted(e["rank"] for e in exits), [0, 1])
        self.assertTrue(all(e.get("exit_code") == 3 for e in exits), exits)
        step = {int(re.search(r"diverged at step (\d+)", self.rank_log("huge", 0, r, "err"))
                    .group(1)) for r in range(2)}
        self.assertEqual(len(step), 1, "both ranks stop at the same step")
        summary = self.summary("s.json")
        self.assertTrue(summary["diverged"])
        self.assertIsNone(summary["test_accuracy"])
        self.assertLess(summary["steps"], 200)
        ckpts = os.listdir(os.path.join(self.dir, "ck")) if os.path.isdir(
            os.path.join(self.dir, "ck")) else []
        self.assertTrue(all(int(n[5:17]) < step.pop() for n in ckpts if n.startswith("ckpt-")))

    def test_divergence_rolls_back_with_half_the_learning_rate(self):
        # The whole training set: the model first learns (the healthy median falls well below
        # chance), then the warmup's rate blows it up, measured at about step 45.
        spec = self.job("roll.yaml", 2, {"steps": 300, "lr": 1.0,
                                         "warmup_steps": 100, "checkpoint_dir": "ck",
                                         "checkpoint_every": 20, "on_divergence": "rollback",
                                         "summary_file": "s.json"})
        p = self.dlaunch("-q", "--run-id", "roll", spec, timeout=180, check_code=0)
        out = self.rank_log("roll", 0, 0)
        m = re.search(r"diverged at step (\d+) \(.*\): rolling back to the newest checkpoint "
                      r"with the peak learning rate halved to 0\.5 \(rollback 1 of 3\)", out)
        self.assertIsNotNone(m, out)
        back = re.search(r"resuming from ck/ckpt-0*(\d+)\.dlck", out[m.end():])
        self.assertLess(int(back.group(1)), int(m.group(1)))
        summary = self.summary("s.json")
        self.assertFalse(summary["diverged"])
        self.assertGreaterEqual(summary["rollbacks"], 1)
        self.assertEqual(summary["steps"], 300)
        # Learning again after the rollback: well above chance (0.1 for ten classes). How far
        # 300 steps get depends on the BLAS kernels' rounding (0.4476 with this VM's
        # OPENBLAS_CORETYPE=Haswell, above 0.5 with others): the bar is learning, not a figure.
        self.assertGreater(summary["test_accuracy"], 0.3)


if __name__ == "__main__":
    dltest.main()
