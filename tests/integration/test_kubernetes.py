"""Fake pods: each pod a network namespace with a host name of its own (UTS namespace) and an
/etc/hosts of its own (a mount namespace binds the test's file over it), joined by a veth pair,
and given the exact variables an operator sets. Node 0's name is added to the hosts files only a
moment after the pods start, as a headless-service name appears once the pod is up. dlaunch
runs in every pod with no flag. Needs root (skipped otherwise)."""
import os
import shutil
import signal
import subprocess
import threading
import time
import unittest

import dltest
import test_netns

ADDR = {0: "10.78.0.1", 1: "10.78.0.2"}
WORK = ["sh", "-c", 'echo "pod-worker rank=$RANK world=$WORLD_SIZE group=$GROUP_RANK"']


class Flags(dltest.Case):
    """What the flags say, the pod's variables need not: no namespaces needed."""
    VOLCANO_TWO_TASKS = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "VC_TASK_INDEX": "0",
                         "VC_MASTER_HOSTS": "vj-master-0.vj", "VC_MASTER_NUM": "1",
                         "VC_WORKER_HOSTS": "vj-worker-0.vj", "VC_WORKER_NUM": "1",
                         "DLAUNCH_TOKEN": "pod-secret-1"}

    def test_a_volcano_job_of_two_tasks_runs_with_the_flags_it_asks_for(self):
        p = self.dlaunch("--dry-run", "--nproc-per-node", "1", "--", "true",
                         env=self.VOLCANO_TWO_TASKS, check_code=2)
        line = p.stderr.strip()
        self.assertEqual(len(line.splitlines()), 1, p.stderr)
        self.assertIn("--nodes, --node-rank and --rdzv-endpoint", line)
        self.dlaunch("--dry-run", "--nproc-per-node", "1", "--nodes", "2", "--node-rank", "1",
                     "--rdzv-endpoint", "127.0.0.1:29400", "--run-id", "vj", "--", "true",
                     env=self.VOLCANO_TWO_TASKS, check_code=0)


@unittest.skipUnless(test_netns.OK, test_netns.WHY)
class Pods(dltest.Case):
    def setUp(self):
        super().setUp()
        self.tag = f"dk{os.getpid() % 100000}"
        self.ns = {i: f"{self.tag}p{i}" for i in (0, 1)}
        for i in (0, 1):
            run = subprocess.run(["ip", "netns", "add", self.ns[i]], capture_output=True,
                                 text=True)
            if run.returncode != 0:
                self.skipTest(f"cannot make a network namespace: {run.stderr.strip()}")
            self.addCleanup(test_netns.TwoHosts.remove_namespace, self, self.ns[i])
            self.ip(i, "link", "set", "lo", "up")
        subprocess.run(["ip", "-n", self.ns[0], "link", "add", "eth0", "type", "veth", "peer",
                        "name", "eth0", "netns", self.ns[1]], check=True, capture_output=True)
        for i in (0, 1):
            self.ip(i, "addr", "add", f"{ADDR[i]}/24", "dev", "eth0")
            self.ip(i, "link", "set", "eth0", "up")
        self.hosts = self.write("hosts", "127.0.0.1 localhost\n")
        # Made after the namespaces, so that its agents are killed before they go (cleanups run
        # last registered first); the pods find their rendezvous in their environment.
        self.cluster = dltest.Cluster(self, endpoint=False, run_id=None)

    def ip(self, i, *args):
        subprocess.run(["ip", "-n", self.ns[i], *args], check=True, capture_output=True)

    def pod(self, i, hostname, env, log, work=WORK):
        """A pod's agent on host i, configured by its environment alone; output to log."""
        assert log.endswith(".log"), log
        host = ["ip", "netns", "exec", self.ns[i], "unshare", "--uts", "--mount", "sh", "-c",
                f'mount --bind {self.hosts} /etc/hosts && hostname {hostname} && exec "$@"',
                "sh"]
        return self.cluster.agent("--", *work, name=log[:-len(".log")], prefix=host,
                                  session=True, env={
                                      "KUBERNETES_SERVICE_HOST": "10.96.0.1",
                                      "DLAUNCH_TOKEN": "pod-secret-1",
                                      "DLAUNCH_JOIN_TIMEOUT": "60", **env})

    def publish_later(self, lines, delay):
        """Adds lines to the pods' hosts file after delay, in place (the bind mounts keep the
        file, not its name)."""
        def add():
            time.sleep(delay)
            with open(self.hosts, "a") as f:
                f.write(lines)
        t = threading.Thread(target=add)
        t.start()
        self.addCleanup(t.join)

    def wait_ok(self, procs, logs, timeout=120):
        for p in procs:
            try:
                code = p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                code = "timeout"
            self.assertEqual(code, 0, "\n".join(f"--- {n}:\n{self.read(n)}" for n in logs))
        out = "".join(self.read(n) for n in logs)
        for r in range(4):
            self.assertIn(f"pod-worker rank={r} world=4", out)

    def test_pytorchjob_master_and_worker(self):
        common = {"MASTER_ADDR": "pj-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "4",
                  "PET_NNODES": "2", "PET_NPROC_PER_NODE": "2", "PET_MASTER_ADDR": "pj-master-0",
                  "PET_MASTER_PORT": "23456", "PYTHONUNBUFFERED": "0"}
        self.publish_later(f"{ADDR[0]} pj-master-0\n{ADDR[1]} pj-worker-0\n", 1.5)
        procs = [self.pod(0, "pj-master-0", {**common, "RANK": "0", "PET_NODE_RANK": "0"},
                          "master.log"),
                 self.pod(1, "pj-worker-0", {**common, "RANK": "1", "PET_NODE_RANK": "1"},
                          "worker.log")]
        self.wait_ok(procs, ["master.log", "worker.log"])
        self.assertIn("does not resolve yet", self.read("master.log"))

    def test_trainer_jobset_headless_name_resolves_late(self):
        common = {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "2",
                  "PET_MASTER_ADDR": "tj-node-0-0.tj", "PET_MASTER_PORT": "29400"}
        self.publish_later(f"{ADDR[0]} tj-node-0-0.tj\n{ADDR[1]} tj-node-0-1.tj\n", 3)
        procs = [self.pod(i, f"tj-node-0-{i}", {**common, "JOB_COMPLETION_INDEX": str(i),
                                               "PET_NODE_RANK": str(i)}, f"node{i}.log")
                 for i in (0, 1)]
        self.wait_ok(procs, ["node0.log", "node1.log"])

    def test_volcano_one_task(self):
        common = {"VC_WORKER_HOSTS": "vj-worker-0.vj,vj-worker-1.vj", "VC_WORKER_NUM": "2",
                  "PET_NPROC_PER_NODE": "2"}
        self.publish_later(f"{ADDR[0]} vj-worker-0.vj\n{ADDR[1]} vj-worker-1.vj\n", 1)
        procs = [self.pod(i, f"vj-worker-{i}", {**common, "VC_TASK_INDEX": str(i),
                                               "VK_TASK_INDEX": str(i)}, f"vc{i}.log")
                 for i in (0, 1)]
        self.wait_ok(procs, ["vc0.log", "vc1.log"])

    def test_torchx_one_task_a_replica(self):
        # The pod's host name tells TorchX's replicas apart: VC_TASK_INDEX is 0 in each.
        common = {"VC_TRAINER_0_HOSTS": "app-trainer-0-0.app", "VC_TRAINER_0_NUM": "1",
                  "VC_TRAINER_1_HOSTS": "app-trainer-1-0.app", "VC_TRAINER_1_NUM": "1",
                  "VC_TASK_INDEX": "0", "PET_NPROC_PER_NODE": "2"}
        self.publish_later(f"{ADDR[0]} app-trainer-0-0.app\n{ADDR[1]} app-trainer-1-0.app\n", 1)
        procs = [self.pod(i, f"app-trainer-{i}-0",
                          {**common, **({"TORCHX_RANK0_HOST": "localhost"} if i == 0 else {})},
                          f"tx{i}.log") for i in (0, 1)]
        self.wait_ok(procs, ["tx0.log", "tx1.log"])

    # The pod made again joins before node 0's rendezvous has declared the old one dead
    # (--dead-after): the job is full and turns it away; its agent joins again every second
    # until --join-timeout, and gets in once the old pod is declared lost.
    def test_a_pod_recreated_with_the_same_index_rejoins(self):
        stop = os.path.join(self.dir, "stop")
        work = ["sh", "-c", f'echo "pod-worker rank=$RANK attempt=$TORCHELASTIC_RESTART_COUNT"; '
                            f'while [ ! -e {stop} ]; do sleep 0.05; done']
        common = {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "1", "PET_MAX_RESTARTS": "3",
                  "PET_MASTER_ADDR": "tj-node-0-0.tj", "PET_MASTER_PORT": "29400",
                  "DLAUNCH_HEARTBEAT": "0.5", "DLAUNCH_DEAD_AFTER": "3"}
        with open(self.hosts, "a") as f:
            f.write(f"{ADDR[0]} tj-node-0-0.tj\n{ADDR[1]} tj-node-0-1.tj\n")

        def start(i, log):
            return self.pod(i, f"tj-node-0-{i}", {**common, "JOB_COMPLETION_INDEX": str(i)},
                            log, work)
        node0, first = start(0, "n0.log"), start(1, "n1-first.log")
        logs = ["n0.log", "n1-first.log"]
        deadline = time.monotonic() + 60
        while "rank=1 attempt=0" not in self.read("n1-first.log"):
            self.assertLess(time.monotonic(), deadline, "\n".join(self.read(n) for n in logs))
            time.sleep(0.1)
        # The pod is deleted: everything in it dies at once. Kubernetes makes it again, with
        # the same index and variables.
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
        second = start(1, "n1-second.log")
        logs.append("n1-second.log")
        deadline = time.monotonic() + 90
        while "rank=1 attempt=" not in self.read("n1-second.log"):
            self.assertLess(time.monotonic(), deadline, "\n".join(self.read(n) for n in logs))
            time.sleep(0.1)
        open(stop, "w").close()
        for p in (node0, second):
            self.assertEqual(p.wait(timeout=60), 0, "\n".join(self.read(n) for n in logs))
        self.assertRegex(self.read("n0.log"), r"rank=0 attempt=[1-9]")


if __name__ == "__main__":
    dltest.main()
