"""Workers get torchrun's environment; output is prefixed, whole-line, and filed."""
import os
import re

import dltest


class Workers(dltest.Case):
    def test_eight_ranks_print_rank_over_world_size(self):
        p = self.dlaunch("--gpus-per-node", "8", "--", "sh", "-c", "echo $RANK/$WORLD_SIZE",
                         check_code=0)
        lines = sorted(p.stdout.splitlines(), key=lambda l: int(re.search(r"\d+", l).group()))
        self.assertEqual(lines, [f"[rank {n}] {n}/8" for n in range(8)])

    def test_environment_of_four_workers(self):
        names = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                 "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
                 "TORCHELASTIC_RUN_ID", "OMP_NUM_THREADS", "FROM_SPEC", "RANK_FROM_OUTSIDE"]
        script = "; ".join(f'echo {n}=${n}' for n in names)
        spec = self.write("job.yaml", f"""
gpus_per_node: 4
run_id: envtest
max_restarts: 2
env:
  FROM_SPEC: hello
command: [sh, -c, '{script}']
""")
        self.dlaunch(spec, env={"RANK": "77", "RANK_FROM_OUTSIDE": "kept"}, check_code=0)
        ports = set()
        for rank in range(4):
            out = self.read("dlaunch_logs", "envtest", "attempt_0", f"rank_{rank}.out")
            env = dict(line.split("=", 1) for line in out.splitlines())
            self.assertEqual(env["RANK"], str(rank))
            self.assertEqual(env["LOCAL_RANK"], str(rank))
            self.assertEqual(env["WORLD_SIZE"], "4")
            self.assertEqual(env["LOCAL_WORLD_SIZE"], "4")
            self.assertEqual(env["GROUP_RANK"], "0")
            self.assertEqual(env["GROUP_WORLD_SIZE"], "1")
            self.assertEqual(env["ROLE_RANK"], str(rank))
            self.assertEqual(env["ROLE_NAME"], "default")
            self.assertEqual(env["ROLE_WORLD_SIZE"], "4")
            self.assertEqual(env["MASTER_ADDR"], "127.0.0.1")
            self.assertEqual(env["TORCHELASTIC_RESTART_COUNT"], "0")
            self.assertEqual(env["TORCHELASTIC_MAX_RESTARTS"], "2")
            self.assertEqual(env["TORCHELASTIC_RUN_ID"], "envtest")
            self.assertEqual(env["OMP_NUM_THREADS"], "1")
            self.assertEqual(env["FROM_SPEC"], "hello")
            self.assertEqual(env["RANK_FROM_OUTSIDE"], "kept")
            ports.add(int(env["MASTER_PORT"]))
        self.assertEqual(len(ports), 1)
        self.assertTrue(1024 <= ports.pop() <= 65535)

    def test_store_worker_leaves_rank_0_a_free_master_port(self):
        # Without the agent's torch store, MASTER_PORT is one that rank 0 itself can bind.
        script = ("import os, socket; s = socket.socket(); "
                  "s.bind(('127.0.0.1', int(os.environ['MASTER_PORT']))); "
                  "print(os.environ['MASTER_PORT'], os.environ['TORCHELASTIC_USE_AGENT_STORE'])")
        p = self.dlaunch("--nproc-per-node", "1", "--rdzv-conf", "store=worker", "--",
                         "python3", "-c", script, check_code=0)
        m = re.search(r"\[rank 0\] (\d+) False$", p.stdout, re.M)
        self.assertIsNotNone(m, p.stdout + p.stderr)
        self.assertTrue(1024 <= int(m.group(1)) <= 65535)

    def test_prefixes_files_and_partial_lines(self):
        script = ('echo out-$RANK; echo err-$RANK >&2; printf "tail-$RANK"; '
                  'printf "no-newline-err-$RANK" >&2')
        p = self.dlaunch("--gpus-per-node", "2", "--run-id", "logs", "--", "sh", "-c", script,
                         check_code=0)
        for rank in range(2):
            self.assertIn(f"[rank {rank}] out-{rank}\n", p.stdout)
            self.assertIn(f"[rank {rank}] tail-{rank}\n", p.stdout)
            self.assertIn(f"[rank {rank}] err-{rank}\n", p.stderr)
            self.assertIn(f"[rank {rank}] no-newline-err-{rank}\n", p.stderr)
            self.assertEqual(self.read("dlaunch_logs", "logs", "attempt_0", f"rank_{rank}.out"),
                             f"out-{rank}\ntail-{rank}")
            self.assertEqual(self.read("dlaunch_logs", "logs", "attempt_0", f"rank_{rank}.err"),
                             f"err-{rank}\nno-newline-err-{rank}")

    def test_lines_never_mix_under_load(self):
        # Two workers write long lines in small pieces at once; every echoed line must be whole.
        script = ('i=0; while [ $i -lt 300 ]; do printf "%s" "r$RANK-"; '
                  'printf "%0200d" 0; echo " end$i"; i=$((i+1)); done')
        p = self.dlaunch("--gpus-per-node", "2", "--log-dir", "L", "--", "sh", "-c", script,
                         check_code=0)
        lines = p.stdout.splitlines()
        self.assertEqual(len(lines), 600)
        pat = re.compile(r"^\[rank (\d)\] r\1-0{200} end\d+$")
        for line in lines:
            self.assertRegex(line, pat)

    def test_quiet_keeps_files(self):
        p = self.dlaunch("-q", "--gpus-per-node", "2", "--run-id", "q", "--", "echo", "hi",
                         check_code=0)
        self.assertEqual(p.stdout, "")
        self.assertEqual(self.read("dlaunch_logs", "q", "attempt_0", "rank_1.out"), "hi\n")

    def test_dry_run_prints_plan_and_starts_nothing(self):
        p = self.dlaunch("--dry-run", "--gpus-per-node", "3", "--run-id", "plan", "--",
                         "touch", "started", check_code=0)
        self.assertIn("world size 3", p.stdout)
        self.assertIn("command: touch started", p.stdout)
        for rank in range(3):
            self.assertRegex(p.stdout, rf"rank {rank}: RANK={rank} LOCAL_RANK={rank} WORLD_SIZE=3")
        self.assertFalse(os.path.exists(os.path.join(self.dir, "started")))
        self.assertFalse(os.path.exists(os.path.join(self.dir, "dlaunch_logs")))

    def test_dry_run_names_the_interface_workers_bind(self):
        # One node: MASTER_ADDR is 127.0.0.1, reached over lo; the user's own choice stays.
        p = self.dlaunch("--dry-run", "--gpus-per-node", "1", "--", "true", check_code=0,
                         env={"GLOO_SOCKET_IFNAME": "ib0"})
        self.assertIn("network: workers bind lo (127.0.0.1), the interface that reaches "
                      "MASTER_ADDR 127.0.0.1", p.stdout)
        self.assertIn(" NCCL_SOCKET_IFNAME==lo TP_SOCKET_IFNAME=lo DLAUNCH_SOCKET_IFNAME=lo",
                      p.stdout)
        self.assertNotIn("GLOO_SOCKET_IFNAME=lo", p.stdout)
        # --local-addr: the interface that holds it; an address not on this machine leaves the
        # choice to the route, and says so.
        several = ["--dry-run", "--nodes", "2", "--rdzv-endpoint", "127.0.0.1:29400", "--run-id",
                   "x"]
        p = self.dlaunch(*several, "--local-addr", "localhost", "--", "true", check_code=0)
        self.assertIn("network: workers bind lo (127.0.0.1), the interface of --local-addr "
                      "localhost", p.stdout)
        p = self.dlaunch(*several, "--local-addr", "192.0.2.77", "--", "true", check_code=0)
        self.assertIn("the interface that reaches the rendezvous 127.0.0.1 (--local-addr is not "
                      "an address here)", p.stdout)
        p = self.dlaunch("--dry-run", "--nodes", "2", "--rdzv-endpoint", "no-such-host.invalid:1",
                         "--run-id", "x", "--", "true", check_code=0)
        self.assertIn("network: cannot tell which interface reaches the rendezvous "
                      "no-such-host.invalid: the name does not resolve; GLOO_SOCKET_IFNAME and "
                      "NCCL_SOCKET_IFNAME stay unset", p.stdout)
        self.assertNotIn("SOCKET_IFNAME=", p.stdout)

    def test_help_and_version(self):
        p = self.dlaunch("--help", check_code=0)
        for flag in ["--nodes", "--gpus-per-node", "--nproc-per-node", "--max-restarts",
                     "--run-id", "--log-dir", "--events", "--stop-timeout", "--dry-run",
                     "--quiet", "--verbose", "--help", "--version", "DLAUNCH_MAX_RESTARTS",
                     "--local-addr ADDR", "DLAUNCH_LOCAL_ADDR"]:
            self.assertIn(flag, p.stdout)
        p = self.dlaunch("--version", check_code=0)
        self.assertRegex(p.stdout, r"^dlaunch \d+\.\d+\.\d+\n$")


    def test_dry_run_in_a_slurm_allocation_prints_the_srun_line(self):
        # An sbatch script's environment (an allocation, no step): the plan is srun's line, and
        # nothing starts (no srun is even looked for).
        env = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NUM_NODES": "2", "SLURM_NNODES": "2",
               "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_NODELIST": "n[1-2]",
               "SLURM_CPUS_ON_NODE": "8"}
        p = self.dlaunch("--dry-run", "--gpus-per-node", "2", "--", "touch", "started",
                         env=env, check_code=0)
        self.assertIn("in Slurm allocation 4242 (2 nodes): would run", p.stdout)
        self.assertRegex(p.stdout, r"srun --nodes=2 --ntasks=2 --ntasks-per-node=1 "
                                   r"--cpus-per-task=8 --kill-on-bad-exit=0 --export=ALL "
                                   r"\S*dlaunch --dry-run --gpus-per-node 2 -- touch started")
        self.assertFalse(os.path.exists(os.path.join(self.dir, "started")))


if __name__ == "__main__":
    dltest.main()
