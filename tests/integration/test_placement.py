"""Where workers run: --nproc-per-node cpu under a real cgroup CPU quota, and --numa-binding on a
fake machine (DLAUNCH_SYSFS_ROOT) and on this one, read back from each worker's own
/proc/self/status."""
import errno
import os
import re
import shutil
import subprocess
import time
import unittest

import dltest

# Each worker says where it may run and which memory policy it has, from its own /proc files.
WHERE = ("grep Cpus_allowed_list /proc/$$/status; "
         "grep -o -m1 'prefer:[0-9]*' /proc/$$/numa_maps || echo policy=default")

CPU_CGROUP = "/sys/fs/cgroup/cpu"


def affinity():
    return sorted(os.sched_getaffinity(0))


def v1_cpu_controller():
    """The v1 hierarchy with the cpu controller at CPU_CGROUP, which root can add to."""
    if os.geteuid() != 0 or not os.path.exists(os.path.join(CPU_CGROUP, "cpu.cfs_quota_us")):
        return False
    with open("/proc/self/mountinfo") as f:
        return any(f" {CPU_CGROUP} " in l and " - cgroup " in l for l in f)


class Quota(dltest.Case):
    """--nproc-per-node cpu counts the CPUs a cgroup's quota allows, rounding down."""

    def setUp(self):
        super().setUp()
        if not v1_cpu_controller():
            self.skipTest(f"needs root and cgroup v1's cpu controller at {CPU_CGROUP}")
        if len(affinity()) < 2:
            self.skipTest("needs 2 CPUs to tell a quota from the affinity mask")
        # One cgroup a test: a cgroup one test could not remove fails no other.
        self.cg = os.path.join(CPU_CGROUP,
                               f"dl-test-quota-{os.getpid()}-{self._testMethodName[5:25]}")
        os.mkdir(self.cg)
        self.addCleanup(self.remove_cgroup, self.cg)

    def remove_cgroup(self, cg):
        # dlaunch's orphan guard, which has no group left to kill, exits on its own once dlaunch
        # has (spawn.h: waiting for it would add its teardown to every launch), so on a busy
        # machine it can still be in the cgroup a moment after dlaunch returned; rmdir fails
        # (EBUSY) while any process is. A cgroup nested in it goes first (cleanups run last
        # added first), the same way.
        deadline = time.monotonic() + 30
        while True:
            try:
                os.rmdir(cg)
                return
            except OSError as e:
                if e.errno != errno.EBUSY or time.monotonic() > deadline:
                    with open(os.path.join(cg, "cgroup.procs")) as f:
                        raise AssertionError(f"{cg}: {e}; still in it: {f.read().split()}")
            time.sleep(0.05)

    def set_quota(self, quota_us, period_us=100000):
        with open(os.path.join(self.cg, "cpu.cfs_period_us"), "w") as f:
            f.write(str(period_us))
        with open(os.path.join(self.cg, "cpu.cfs_quota_us"), "w") as f:
            f.write(str(quota_us))

    def ranks_in_cgroup(self, run_id):
        """Runs dlaunch --nproc-per-node cpu from a shell that has joined the cgroup."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("DLAUNCH_")}
        return subprocess.run(
            ["sh", "-c", f'echo $$ > {self.cg}/cgroup.procs && exec "$0" "$@"', dltest.DLAUNCH,
             "--nproc-per-node", "cpu", "--run-id", run_id, "-v", "--", "sh", "-c",
             "cat /proc/self/cgroup"],
            cwd=self.dir, env=env, timeout=60, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)

    def ranks_run(self, run_id):
        logs = os.path.join(self.dir, "dlaunch_logs", run_id, "attempt_0")
        return sorted(int(re.match(r"rank_(\d+)\.out", n).group(1))
                      for n in os.listdir(logs) if n.endswith(".out"))

    def test_one_cpu_quota_starts_one_worker(self):
        self.set_quota(100000)
        p = self.ranks_in_cgroup("one")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(self.ranks_run("one"), [0], p.stderr)
        self.assertIn(f"1 of {len(affinity())} CPUs: {self.cg}/cpu.cfs_quota_us allows 100000 us "
                      "every 100000 us", p.stderr)
        # The worker really ran in the quota's cgroup.
        self.assertIn(os.path.basename(self.cg), self.read("dlaunch_logs", "one", "attempt_0",
                                                           "rank_0.out"))

    def test_one_and_a_half_cpus_round_down_to_one(self):
        self.set_quota(75000, 50000)
        p = self.ranks_in_cgroup("half")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(self.ranks_run("half"), [0], p.stderr)

    def test_no_quota_counts_the_affinity_mask(self):
        self.set_quota(-1)
        p = self.ranks_in_cgroup("all")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(self.ranks_run("all"), list(range(len(affinity()))), p.stderr)

    def test_a_parent_cgroups_quota_counts_too(self):
        self.set_quota(100000)
        child = os.path.join(self.cg, "step")
        os.mkdir(child)
        self.addCleanup(self.remove_cgroup, child)
        self.cg = child
        p = self.ranks_in_cgroup("nested")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(self.ranks_run("nested"), [0], p.stderr)


def fake_machine(root, gpus):
    """Two NUMA nodes in one socket, CPU 0 on node 0 and CPU 1 on node 1 (this machine's two
    CPUs, so that a real affinity can be set and read back), each CPU a core and an L3 of its
    own; gpus: (PCI address, NUMA node as sysfs says it)."""
    def put(rel, text):
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text + "\n")
    for cpu in (0, 1):
        put(f"sys/devices/system/node/node{cpu}/cpulist", str(cpu))
        top = f"sys/devices/system/cpu/cpu{cpu}"
        put(f"{top}/topology/thread_siblings_list", str(cpu))
        put(f"{top}/topology/physical_package_id", "0")
        put(f"{top}/cache/index0/level", "1")
        put(f"{top}/cache/index0/type", "Data")
        put(f"{top}/cache/index0/shared_cpu_list", str(cpu))
        put(f"{top}/cache/index3/level", "3")
        put(f"{top}/cache/index3/type", "Unified")
        put(f"{top}/cache/index3/shared_cpu_list", str(cpu))
    for addr, node in gpus:
        put(f"proc/driver/nvidia/gpus/{addr}/information", f"GPU UUID: GPU-{addr}")
        put(f"sys/bus/pci/devices/{addr}/numa_node", str(node))


@unittest.skipUnless(affinity() == [0, 1], "needs CPUs 0 and 1, as the fake machine has")
class FakeMachine(dltest.Case):
    """--numa-binding on two NUMA nodes with a GPU on each."""

    def setUp(self):
        super().setUp()
        self.root = os.path.join(self.dir, "machine")
        fake_machine(self.root, [("0000:3b:00.0", 0), ("0000:86:00.0", 1)])

    def run_job(self, *args, code=0, run_id="job", env=None):
        p = self.dlaunch("--run-id", run_id, *args, "--", "sh", "-c", WHERE,
                         env={"DLAUNCH_SYSFS_ROOT": self.root, **(env or {})})
        self.assertEqual(p.returncode, code, f"stdout:\n{p.stdout}\nstderr:\n{p.stderr}")
        return p

    def placed(self, run_id="job"):
        """Each rank's own Cpus_allowed_list and memory policy."""
        logs = os.path.join(self.dir, "dlaunch_logs", run_id, "attempt_0")
        got = {}
        for name in sorted(os.listdir(logs)):
            m = re.match(r"rank_(\d+)\.out", name)
            if m:
                with open(os.path.join(logs, name)) as f:
                    text = f.read()
                cpus = re.search(r"Cpus_allowed_list:\s*(\S+)", text).group(1)
                policy = re.search(r"(prefer:\d+|policy=default)", text).group(1)
                got[int(m.group(1))] = (cpus, policy)
        return got

    def test_node_binds_each_worker_to_its_gpus_node(self):
        p = self.run_job("--nproc-per-node", "2", "--numa-binding", "node")
        got = self.placed()
        self.assertEqual(got[0], ("0", "prefer:0"))
        # Node 1 exists in the fake tree only: the kernel refuses the memory policy, the worker
        # says so and runs, bound to CPU 1 all the same.
        self.assertEqual(got[1][0], "1")
        self.assertIn("warning: memory is not preferred on the worker's NUMA node", p.stderr)

    def test_default_binds_by_node_when_workers_are_as_many_as_gpus(self):
        self.run_job()  # auto: one worker per GPU, so 2, and torchrun's default binding
        got = self.placed()
        self.assertEqual([got[r][0] for r in (0, 1)], ["0", "1"])
        p = self.dlaunch("--dry-run", "--", "true", env={"DLAUNCH_SYSFS_ROOT": self.root})
        self.assertIn("placement: --numa-binding node (torchrun's default: as many workers as "
                      "GPUs)", p.stdout)
        self.assertIn("placement: local rank 1 (GPU 1 at 0000:86:00.0, NUMA node 1): CPUs 1, "
                      "memory preferred on its node", p.stdout)

    def test_default_does_not_bind_other_counts_and_none_never_binds(self):
        self.run_job("--nproc-per-node", "1", run_id="one")
        self.assertEqual(self.placed("one")[0], ("0-1", "policy=default"))
        self.run_job("--numa-binding", "none", run_id="none")
        self.assertEqual([c for c, _ in self.placed("none").values()], ["0-1", "0-1"])
        p = self.dlaunch("--dry-run", "--nproc-per-node", "1", "--", "true",
                         env={"DLAUNCH_SYSFS_ROOT": self.root})
        self.assertIn("placement: workers are not bound (1 worker for 2 GPUs, and no "
                      "--numa-binding)", p.stdout)

    def test_socket_takes_both_nodes_of_the_socket(self):
        self.run_job("--nproc-per-node", "2", "--numa-binding", "socket")
        got = self.placed()
        self.assertEqual([got[r][0] for r in (0, 1)], ["0-1", "0-1"])
        self.assertEqual(got[0][1], "prefer:0")

    def test_exclusive_and_core_complex(self):
        for mode in ("exclusive", "core-complex"):
            self.run_job("--nproc-per-node", "2", "--numa-binding", mode, run_id=mode)
            got = self.placed(mode)
            self.assertEqual([got[r][0] for r in (0, 1)], ["0", "1"], mode)

    def test_cuda_visible_devices_picks_the_gpu(self):
        self.run_job("--nproc-per-node", "1", "--numa-binding", "node",
                     env={"CUDA_VISIBLE_DEVICES": "1"})
        self.assertEqual(self.placed()[0][0], "1")

    def test_what_cannot_be_bound_is_one_line_and_exit_2(self):
        cases = [(["--nproc-per-node", "3", "--numa-binding", "node"],
                  "--numa-binding node: local rank 2 has no GPU to be placed near (2 found)"),
                 (["--numa-binding", "sometimes"],
                  "--numa-binding: 'sometimes' is not one of auto, none, node, socket")]
        for args, want in cases:
            p = self.run_job(*args, code=2)
            self.assertEqual(p.stderr.count("\n"), 1, p.stderr)
            self.assertIn(want, p.stderr)
        # Two GPUs on node 0, whose one core cannot be split.
        shutil.rmtree(self.root)
        fake_machine(self.root, [("0000:3b:00.0", 0), ("0000:3c:00.0", -1)])
        p = self.run_job("--numa-binding", "exclusive", code=2)
        self.assertIn("NUMA node 0 has 1 physical core this agent may use, fewer than its 2 GPUs",
                      p.stderr)
        self.assertEqual(p.stderr.count("\n"), 1, p.stderr)

    def test_a_node_outside_the_agents_cpus(self):
        # Run under an affinity of CPU 1 only (as a cpuset would): node 0 has nothing allowed.
        env = {k: v for k, v in os.environ.items() if not k.startswith("DLAUNCH_")}
        env["DLAUNCH_SYSFS_ROOT"] = self.root

        def under_cpu1(*args):
            return subprocess.run(["taskset", "-c", "1", dltest.DLAUNCH, *args], cwd=self.dir,
                                  env=env, timeout=60, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        p = under_cpu1("--numa-binding", "node", "--", "true")
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("--numa-binding node: NUMA node 0 of GPU 0 (0000:3b:00.0) has no CPU this "
                      "agent may use (allowed: 1)", p.stderr)
        # Unasked, the same is a warning and the workers run unbound.
        p = under_cpu1("--run-id", "warned", "--", "sh", "-c", WHERE)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("warning: workers are not bound near their GPUs", p.stderr)
        self.assertEqual([c for c, _ in self.placed("warned").values()], ["1", "1"])


    def test_a_cpuset_cgroup_is_honoured(self):
        cpuset = "/sys/fs/cgroup/cpuset"
        if os.geteuid() != 0 or not os.path.exists(os.path.join(cpuset, "cpuset.cpus")):
            self.skipTest(f"needs root and cgroup v1's cpuset controller at {cpuset}")
        cg = os.path.join(cpuset, f"dl-test-cpuset-{os.getpid()}")
        os.mkdir(cg)
        self.addCleanup(os.rmdir, cg)
        for name, value in (("cpuset.cpus", "1"), ("cpuset.mems", "0")):
            with open(os.path.join(cg, name), "w") as f:
                f.write(value)
        env = {k: v for k, v in os.environ.items() if not k.startswith("DLAUNCH_")}
        env["DLAUNCH_SYSFS_ROOT"] = self.root

        def in_cpuset(*args):
            return subprocess.run(["sh", "-c", f'echo $$ > {cg}/cgroup.procs && exec "$0" "$@"',
                                   dltest.DLAUNCH, *args], cwd=self.dir, env=env, timeout=60,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # GPU 1's node keeps its CPU; GPU 0's node has none left to it.
        p = in_cpuset("--run-id", "gpu1", "--nproc-per-node", "1", "--numa-binding", "socket",
                      "--", "sh", "-c", WHERE)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("--numa-binding socket: NUMA node 0 of GPU 0 (0000:3b:00.0) has no CPU "
                      "this agent may use (allowed: 1)", p.stderr)
        env["CUDA_VISIBLE_DEVICES"] = "1"
        p = in_cpuset("--run-id", "gpu1", "--numa-binding", "socket", "--", "sh", "-c", WHERE)
        self.assertEqual(p.returncode, 0, p.stderr)
        # The socket has CPUs 0 and 1; the cpuset leaves 1.
        self.assertEqual(self.placed("gpu1")[0][0], "1")


class ThisMachine(dltest.Case):
    """This machine as it is: no GPU, so torchrun would not bind by default, and refuses to
    bind when asked (it needs a CUDA device per local rank)."""

    def setUp(self):
        super().setUp()
        if os.path.isdir("/proc/driver/nvidia/gpus") and os.listdir("/proc/driver/nvidia/gpus"):
            self.skipTest("this machine has GPUs")

    def test_no_gpu_no_default_binding(self):
        p = self.dlaunch("--nproc-per-node", "2", "--run-id", "real", "--", "sh", "-c", WHERE,
                         check_code=0)
        with open("/proc/self/status") as f:
            mine = re.search(r"Cpus_allowed_list:\s*(\S+)", f.read()).group(1)
        for rank in (0, 1):
            out = self.read("dlaunch_logs", "real", "attempt_0", f"rank_{rank}.out")
            self.assertEqual(re.search(r"Cpus_allowed_list:\s*(\S+)", out).group(1), mine)
        p = self.dlaunch("--dry-run", "--", "true", check_code=0)
        self.assertIn("placement: workers are not bound (no GPU found)", p.stdout)

    def test_asked_without_a_gpu_is_an_error(self):
        for mode in ("node", "socket", "exclusive", "core-complex"):
            p = self.dlaunch("--numa-binding", mode, "--", "true", check_code=2)
            self.assertEqual(p.stderr.count("\n"), 1, p.stderr)
            self.assertIn(f"--numa-binding {mode}: no GPU found", p.stderr)


if __name__ == "__main__":
    dltest.main()
