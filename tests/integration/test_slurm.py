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

    def agent_pid(self, job_id, node_id):
        """The pid of the dlaunch agent that srun started on node `node_id` of a job."""
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/comm") as f:
                    if f.read().strip() != "dlaunch":
                        continue
                with open(f"/proc/{pid}/environ", "rb") as f:
                    env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
            except OSError:
                continue
            if (env.get(b"SLURM_JOB_ID") == job_id.encode() and
                    env.get(b"SLURM_NODEID") == str(node_id).encode() and
                    b"SLURM_STEP_ID" in env):
                return int(pid)
        return None

    def test_the_host_agent_killed_a_node_of_the_allocation_hosts_and_the_job_goes_on(self):
        """Failover under Slurm (docs/rendezvous.md): node 0 of the allocation hosts the
        rendezvous; its agent SIGKILLed, the agent on node 1 hosts it at its own address (a host
        of the allocation, from the last round's successors) and, with --nodes 1:2, finishes the
        job alone, with no flag but the node range and the timings."""
        logs = os.path.join(self.dir, "logs")
        stop = os.path.join(self.dir, "stop")
        job = self.write("wait.yaml", f"""gpus_per_node: 2
command: [sh, -c, 'while [ ! -e {stop} ]; do sleep 0.05; done']
""")
        script = self.write("failover.sbatch", f"""#!/bin/bash
cd {self.dir}
exec {dltest.DLAUNCH} --nodes 1:2 --gpus-per-node 2 --heartbeat 0.2 --dead-after 1 \\
    --last-call 0.5 --max-restarts 2 --join-timeout 60 --log-dir {logs} {job}
""")
        p = subprocess.run(["sbatch", "-N2", "--parsable", "-o",
                            os.path.join(self.dir, "failover.txt"), script],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        job_id = p.stdout.strip().split(";")[0]
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and \
                    len(glob.glob(os.path.join(logs, "*", "attempt_0", "rank_*.out"))) < 4:
                time.sleep(0.1)
            self.assertEqual(len(glob.glob(os.path.join(logs, "*", "attempt_0", "rank_*.out"))),
                             4, self.read_or_empty("failover.txt"))
            second = self.node_addr(job_id, 1)
            host = self.agent_pid(job_id, 0)
            self.assertIsNotNone(host, "no agent of node 0 found in /proc")
            os.kill(host, 9)
            # The next round: node 1 alone, as node rank 0, ranks 0..1 in a new attempt folder.
            deadline = time.monotonic() + 30
            later = []
            while time.monotonic() < deadline and not later:
                later = [d for d in glob.glob(os.path.join(logs, "*", "attempt_*", "rank_1.out"))
                         if not d.endswith(os.path.join("attempt_0", "rank_1.out"))]
                time.sleep(0.1)
            self.assertTrue(later, self.read_or_empty("failover.txt"))
            open(stop, "w").close()
            deadline = time.monotonic() + 60
            state = ""
            while time.monotonic() < deadline:
                state = subprocess.run(["scontrol", "show", "job", job_id],
                                       capture_output=True, text=True).stdout
                if re.search(r"JobState=(COMPLETED|FAILED)", state) or not state:
                    break
                time.sleep(0.2)
        finally:
            subprocess.run(["scancel", job_id], timeout=30)
        out = self.read_or_empty("failover.txt")
        # Node 1's agent hosts the rendezvous at node 1's own address, not node 0's.
        hosting = re.findall(r"hosting the rendezvous on (\S+?):\d+: its host was lost", out)
        self.assertEqual(len(hosting), 1, out)
        self.assertEqual(hosting[0], second, out)
        self.assertRegex(out, r"job succeeded in round \d+, 1 restart", out)

    def node_addr(self, job_id, index):
        """The address of node `index` of a job's allocation."""
        job = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True,
                             timeout=20).stdout
        names = subprocess.run(["scontrol", "show", "hostnames",
                                re.search(r" NodeList=(\S+)", job).group(1)],
                               capture_output=True, text=True, timeout=20).stdout.split()
        node = subprocess.run(["scontrol", "show", "node", names[index]], capture_output=True,
                              text=True, timeout=20).stdout
        return re.search(r"NodeAddr=(\S+)", node).group(1)

    def read_or_empty(self, name):
        try:
            return self.read(name)
        except OSError:
            return ""

    @unittest.skipUnless(trainer_distributed(), "the trainer runs on one worker only here")
    def test_a_time_limit_warning_reaches_the_workers_and_the_requeued_job_resumes(self):
        # sbatch --signal=USR1@30: Slurm warns the step 30 s (give or take its event loop's
        # minute) before the time limit; the agents pass it on by default under Slurm, each
        # worker saves its step and exits 0, the script requeues the job, and the second run
        # resumes every rank from its checkpoint.
        worker = self.write("saver.py", f"""import os, signal, sys, time
rank = os.environ["RANK"]
ckpt = os.path.join({self.dir!r}, "ckpt_" + rank)
step = int(open(ckpt).read()) if os.path.exists(ckpt) else 0
resumed = step > 0
def save(sig, frame):
    open(ckpt, "w").write(str(step))
    open(os.path.join({self.dir!r}, "preempted"), "w").close()
    print(f"rank {{rank}} saved step {{step}} on SIGUSR1", flush=True)
    sys.exit(0)
signal.signal(signal.SIGUSR1, save)
print(f"rank {{rank}} starts at step {{step}}", flush=True)
for _ in range(5 if resumed else 10**6):
    step += 1
    time.sleep(0.01)
""")
        script = self.write("warned.sbatch", f"""#!/bin/bash
cd {self.dir}
rm -f preempted
{dltest.DLAUNCH} --nodes 2 --gpus-per-node 1 --log-dir {self.dir}/logs -- python3 {worker}
code=$?
echo "dlaunch exit $code"
if [ -e preempted ]; then scontrol requeue "$SLURM_JOB_ID"; fi
exit $code
""")
        p = subprocess.run(["sbatch", "-N2", "--requeue", "--time=1", "--signal=USR1@30",
                            "--parsable", "-o", os.path.join(self.dir, "warned-%j.txt"),
                            "--open-mode=append", script],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        job_id = p.stdout.strip().split(";")[0]
        deadline = time.monotonic() + 400
        state = ""
        while time.monotonic() < deadline:
            state = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True,
                                   text=True).stdout
            if "Restarts=1" in state and ("JobState=COMPLETED" in state or
                                           "JobState=FAILED" in state):
                break
            time.sleep(0.5)
        out = self.read(f"warned-{job_id}.txt")
        self.assertIn("JobState=COMPLETED", state, out)
        # The first run: Slurm signalled every process of the step, workers included; each
        # agent went on (the warning is no stop), both ranks saved and exited 0, and nothing
        # else of dlaunch's died of it.
        self.assertEqual(len(re.findall(r"got SIGUSR1 from Slurm, which signals the workers "
                                        r"too \(1 here\); the job goes on", out)), 2, out)
        self.assertNotIn("orphan guard exited", out)
        saved = {int(r): int(s) for r, s in re.findall(r"rank (\d) saved step (\d+)", out)}
        self.assertEqual(sorted(saved), [0, 1], out)
        self.assertIn("dlaunch exit 0", out)
        # The requeued run: each rank starts where it saved.
        for r, s in saved.items():
            self.assertGreater(s, 0)
            self.assertIn(f"rank {r} starts at step {s}", out)

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
