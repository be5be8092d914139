"""dlaunch under a real Slurm cluster (tests/slurm/cluster-start.sh, started by scripts/test.sh):
the one-liner in an sbatch script, srun -N2 dlaunch, and scancel in the middle of a job.
Skipped where no cluster answers."""
import glob
import json
import os
import re
import subprocess
import time
import unittest

import dltest


def cluster_up():
    if not os.environ.get("SLURM_CONF"):
        return False
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%D %t"], capture_output=True, text=True,
                             timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return any(line.split()[1] == "idle" and int(line.split()[0]) >= 2
               for line in out.splitlines() if len(line.split()) == 2)


JOB = """gpus_per_node: 2
train:
  steps: 20
  layers: [784, 32, 10]
  batch_size: 32
"""

# Used until the trainer runs distributed in this build: a worker that reports where it runs.
SHELL_JOB = """gpus_per_node: 2
command: [sh, -c, 'echo "rank $RANK of $WORLD_SIZE on $(hostname)"']
"""


def trainer_distributed():
    """The bundled trainer runs on several workers where the collective library is built."""
    return os.path.exists(os.path.join(os.path.dirname(dltest.DLAUNCH), "..", "collective"))


@unittest.skipUnless(cluster_up(), "no Slurm cluster (tests/slurm/cluster-start.sh)")
class Slurm(dltest.Case):
    def job_file(self):
        return self.write("job.yaml", JOB if trainer_distributed() else SHELL_JOB)

    def check_job(self, logs, out):
        """4 ranks in the log folder, over two nodes with two host names."""
        outs = sorted(glob.glob(os.path.join(logs, "*", "attempt_0", "rank_*.out")))
        self.assertEqual([int(re.search(r"rank_(\d+)\.out$", o).group(1)) for o in outs],
                         [0, 1, 2, 3], out)
        nodes = re.findall(r"node rank (\d) of 2 on (\S+), ranks (\d)\.\.(\d) of 4", out)
        self.assertEqual(sorted((int(n), int(a), int(b)) for n, _, a, b in nodes),
                         [(0, 0, 1), (1, 2, 3)], out)
        self.assertEqual(len({host for _, host, _, _ in nodes}), 2, out)
        if trainer_distributed():
            self.assertIn("world size 4", self.read_any(outs[0]))

    def read_any(self, path):
        with open(path) as f:
            return f.read()

    def test_sbatch_one_liner(self):
        job = self.job_file()
        logs = os.path.join(self.dir, "logs")
        script = self.write("run.sbatch", f"""#!/bin/bash
cd {self.dir}
export DLAUNCH_LOG_DIR={logs}
{dltest.DLAUNCH} --nodes 2 --gpus-per-node 2 {job}
""")
        p = subprocess.run(["sbatch", "-N2", "--wait", "-o", os.path.join(self.dir, "out.txt"),
                            script], capture_output=True, text=True, timeout=300)
        out = self.read("out.txt")
        self.assertEqual(p.returncode, 0, p.stderr + out)
        self.check_job(logs, out)
        self.assertIn("job succeeded", out)

    def test_srun_two_nodes(self):
        job = self.job_file()
        logs = os.path.join(self.dir, "logs")
        p = subprocess.run(["srun", "-N2", dltest.DLAUNCH, "--nodes", "2", "--gpus-per-node", "2",
                            "--log-dir", logs, job], capture_output=True, text=True,
                           timeout=300, cwd=self.dir)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.check_job(logs, p.stdout + p.stderr)

    def test_dry_run_in_an_allocation_prints_the_srun_line(self):
        # docs/slurm.md: in an allocation (an sbatch script, no step yet) --dry-run prints the
        # srun line it would run and starts nothing; not a one-node local plan.
        script = self.write("dry.sbatch", f"""#!/bin/bash
cd {self.dir}
{dltest.DLAUNCH} --dry-run --gpus-per-node 2 -- touch started
""")
        p = subprocess.run(["sbatch", "-N2", "--wait", "-o", os.path.join(self.dir, "dry.txt"),
                            script], capture_output=True, text=True, timeout=300)
        out = self.read("dry.txt")
        self.assertEqual(p.returncode, 0, p.stderr + out)
        self.assertRegex(out, r"in Slurm allocation \d+ \(2 nodes\): would run\n")
        self.assertRegex(out, r"srun --nodes=2 --ntasks=2 --ntasks-per-node=1 --cpus-per-task=\d+ "
                              r"--kill-on-bad-exit=0 --export=ALL \S*dlaunch --dry-run "
                              r"--gpus-per-node 2 -- touch started\n")
        self.assertNotIn("world size", out)
        self.assertNotIn("rank 0:", out)
        self.assertFalse(os.path.exists(os.path.join(self.dir, "started")))

    def test_scancel_ends_every_worker(self):
        logs = os.path.join(self.dir, "logs")
        pids_dir = os.path.join(self.dir, "pids")
        os.mkdir(pids_dir)
        job = self.write("long.yaml", f"""gpus_per_node: 2
stop_timeout: 3
command: [sh, -c, 'echo $$ > {pids_dir}/$RANK.pid; sleep 300 & echo $! > {pids_dir}/$RANK.child; wait']
""")
        script = self.write("long.sbatch", f"""#!/bin/bash
cd {self.dir}
exec {dltest.DLAUNCH} --nodes 2 --gpus-per-node 2 --log-dir {logs} {job}
""")
        p = subprocess.run(["sbatch", "-N2", "--parsable", "-o",
                            os.path.join(self.dir, "long.txt"), script],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        job_id = p.stdout.strip().split(";")[0]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(glob.glob(pids_dir + "/*.child")) < 4:
            time.sleep(0.1)
        files = glob.glob(pids_dir + "/*")
        self.assertEqual(len(files), 8, files)
        time.sleep(0.3)
        pids = [int(self.read_any(f)) for f in files]
        for pid in pids:
            self.assertTrue(dltest.pid_alive(pid), pid)
        subprocess.run(["scancel", job_id], check=True, timeout=30)
        self.assert_gone(pids, timeout=20)
        deadline = time.monotonic() + 30
        state = ""
        while time.monotonic() < deadline:
            state = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True,
                                   text=True).stdout
            if "JobState=CANCELLED" in state or not state:
                break
            time.sleep(0.2)
        self.assertIn("JobState=CANCELLED", state)
        out = self.read("long.txt")
        self.assertIn("stopping the workers", out)

    @unittest.skipUnless(trainer_distributed(), "the trainer runs on one worker only here")
    def test_requeue_resumes_from_the_checkpoint(self):
        ckpt = os.path.join(self.dir, "ckpt")
        job = self.write("requeue.yaml", f"""gpus_per_node: 1
train:
  steps: 20000
  layers: [784, 32, 10]
  checkpoint_dir: {ckpt}
  checkpoint_every: 200
  summary_file: {self.dir}/summary.json
""")
        script = self.write("requeue.sbatch", f"""#!/bin/bash
cd {self.dir}
{dltest.DLAUNCH} --nodes 2 --gpus-per-node 1 --log-dir {self.dir}/logs {job}
""")
        p = subprocess.run(["sbatch", "-N2", "--requeue", "--parsable", "-o",
                            os.path.join(self.dir, "requeue-%j.txt"), script],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        job_id = p.stdout.strip().split(";")[0]
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not glob.glob(os.path.join(ckpt, "ckpt-*.dlck")):
            time.sleep(0.1)
        self.assertTrue(glob.glob(os.path.join(ckpt, "ckpt-*.dlck")), os.listdir(self.dir))
        subprocess.run(["scontrol", "requeue", job_id], check=True, timeout=30)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            state = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True,
                                   text=True).stdout
            if "JobState=COMPLETED" in state or "JobState=FAILED" in state:
                break
            time.sleep(0.5)
        self.assertIn("JobState=COMPLETED", state)
        with open(os.path.join(self.dir, "summary.json")) as f:
            summary = json.load(f)
        self.assertGreater(summary["resumed_from"], 0)
        self.assertEqual(summary["steps"], 20000)


if __name__ == "__main__":
    dltest.main()
