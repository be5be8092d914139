"""In-job recovery of a PyTorch DDP job (docs/recovery.md, "PyTorch"), with Debian's python3-torch
(CPU, gloo), the real dlaunch and dlaunch.torch.Recoverable around a small MLP (fixed seeds, one
thread a worker, torchrun/recover_mlp.py): one node, three workers, `--recovery in-job`. A rank
SIGKILLed in a step's backward pass, and a rank hung before it (killed by the agent after
--health-timeout): the other ranks keep their processes, a replacement takes the state from a
living replica, nobody reads the checkpoint the job writes, the job exits 0 and the final
parameters are bitwise those of an uninterrupted run. Skipped where python3-torch is not
installed.

Over two nodes (two agents on 127.0.0.1, two workers each): a rank SIGKILLed and a rank hung, the
same bits; a node's agent SIGKILLed with --nodes 1:2, the other node's ranks go on alone (world
4 -> 2) with their own processes and no checkpoint read, also when the lost node's agent hosted
the rendezvous (the other takes it over)."""
import os
import re
import signal
import subprocess
import time
import unittest

import dltest
from dltest import free_port
from test_python import PACKAGE, TORCH_PYTHON, have_torch

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "torchrun", "recover_mlp.py")
WORLD = 3
EPOCHS = "2"  # 64 steps of 16 samples a rank


@unittest.skipUnless(have_torch(), "python3-torch is not installed")
class TorchRecovery(dltest.Case):
    reference: bytes = b""

    def run_job(self, name, *script_args, opts=(), mode="in-job"):
        out = os.path.join(self.dir, name)
        os.mkdir(out)
        p = self.dlaunch("--run-id", name, "--events", self.events_path, "--nproc-per-node",
                         str(WORLD), "--recovery", mode, "--max-restarts", "3", *opts, "--",
                         TORCH_PYTHON, SCRIPT, out, EPOCHS, *script_args, timeout=600,
                         env={"PYTHONPATH": PACKAGE})
        return p, out

    def params(self, out, rank=0):
        with open(os.path.join(out, f"params-{rank}.bin"), "rb") as f:
            return f.read()

    def uninterrupted(self):
        """The parameters of the same job with no fault (computed once for the class)."""
        if not TorchRecovery.reference:
            p, out = self.run_job("reference")
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
            TorchRecovery.reference = self.params(out)
            os.remove(self.events_path)
        return TorchRecovery.reference

    def starts(self, out):
        """rank -> the pids that started as it."""
        got = {}
        for name in os.listdir(out):
            m = re.fullmatch(r"start-(\d+)-(\d+)", name)
            if m:
                got.setdefault(int(m.group(1)), []).append(int(m.group(2)))
        return got

    def assert_recovered(self, p, out, failed_rank, source=0):
        text = p.stdout + p.stderr
        self.assertEqual(p.returncode, 0, text)
        # The living ranks are the processes that started the job; the failed one started twice.
        starts = self.starts(out)
        self.assertEqual(sorted(starts), list(range(WORLD)), starts)
        for rank, pids in starts.items():
            self.assertEqual(len(pids), 2 if rank == failed_rank else 1, starts)
            if rank != failed_rank:
                self.assertIn(f"rank {rank} pid {pids[0]} done 64 steps, 1 recoveries", text)
        # The job writes checkpoints; a recovery in-job never reads one.
        self.assertTrue(os.path.exists(os.path.join(out, "checkpoint.pt")))
        self.assertNotIn("loaded checkpoint", text)
        self.assertRegex(text, rf"in-job recovery to generation 1: going on at step 20 in a "
                               rf"group of 3 with rank {source}'s state .*no checkpoint read")
        rec = [e for e in self.events() if e["event"] == "recovery"]
        self.assertEqual([e["status"] for e in rec], ["started", "done"], rec)
        self.assertEqual((rec[1]["step"], rec[1]["source"], rec[1]["source_rank"],
                          rec[1]["replaced"]), (20, "replica", source, [failed_rank]), rec)
        # Every rank ends with the bits of the run that nothing interrupted.
        for rank in range(WORLD):
            self.assertEqual(self.params(out, rank), self.uninterrupted(), f"rank {rank}")

    def test_a_rank_killed_in_its_backward_pass_is_replaced_in_job(self):
        reference = self.uninterrupted()
        self.assertTrue(reference)
        p, out = self.run_job("kill", "kill_rank=1", "at_step=20", "ckpt_every=10")
        self.assertIn("rank 1 (pid", p.stderr)
        self.assertRegex(p.stderr, r"rank 1 \(pid \d+\) was killed by SIGKILL")
        self.assert_recovered(p, out, 1)

    def test_a_hung_rank_is_killed_and_replaced_in_job(self):
        self.uninterrupted()
        p, out = self.run_job("hang", "hang_rank=2", "at_step=20", "ckpt_every=10",
                              opts=("--health-timeout", "4"))
        self.assertIn("rank 2: hanging before step 20's backward", p.stdout + p.stderr)
        hung = [e for e in self.events() if e["event"] == "worker_hung"]
        self.assertEqual([e["rank"] for e in hung], [2], hung)
        self.assert_recovered(p, out, 2)

    def assert_spare_took(self, p, out, rank):
        """rank's replacement is the process of the spare started before the fault, and
        another spare started behind it."""
        text = p.stdout + p.stderr
        pids = [int(x) for x in re.findall(r"spare 0 started \(pid (\d+)\)", text)]
        self.assertGreaterEqual(len(pids), 2, text)
        self.assertRegex(text, rf"rank {rank}'s place goes to spare 0 \(pid {pids[0]}, waiting")
        self.assertIn(pids[0], self.starts(out)[rank])
        took = [e for e in self.events() if e["event"] == "worker_start" and e.get("spare")]
        self.assertEqual([(e["rank"], e["pid"]) for e in took], [(rank, pids[0])], took)

    def test_a_killed_rank_s_place_goes_to_a_waiting_spare(self):
        self.uninterrupted()
        p, out = self.run_job("spare-kill", "kill_rank=1", "at_step=20", "ckpt_every=10",
                              "wait_spare=1", opts=("--spares", "1"))
        self.assert_recovered(p, out, 1)
        self.assert_spare_took(p, out, 1)

    def test_a_hung_rank_s_place_goes_to_a_spare(self):
        self.uninterrupted()
        p, out = self.run_job("spare-hang", "hang_rank=2", "at_step=20", "ckpt_every=10",
                              opts=("--health-timeout", "4", "--spares", "1"))
        self.assert_recovered(p, out, 2)
        self.assert_spare_took(p, out, 2)

    def test_an_error_of_the_step_s_own_goes_up_and_its_rank_is_replaced(self):
        # Not the group's breakage: Recoverable lets it through (the traceback, exit 1), and the
        # agent replaces the rank as it would a killed one.
        self.uninterrupted()
        p, out = self.run_job("raise", "raise_rank=0", "at_step=20", "ckpt_every=10")
        self.assertRegex(p.stdout + p.stderr, r"RuntimeError: rank 0: a bug of the script's own "
                                              r"in step 20")
        self.assertRegex(p.stderr, r"rank 0 \(pid \d+\) exited with code 1")
        self.assert_recovered(p, out, 0, source=1)

    def test_the_same_loop_under_restart_mode_restarts_and_reads_its_checkpoint(self):
        p, out = self.run_job("restart", "kill_rank=1", "at_step=20", "ckpt_every=10",
                              mode="restart")
        text = p.stdout + p.stderr
        self.assertEqual(p.returncode, 0, text)
        self.assertEqual({r: len(p) for r, p in self.starts(out).items()}, {0: 2, 1: 2, 2: 2})
        for rank in range(WORLD):
            self.assertIn(f"rank {rank}: loaded checkpoint at step 20", text)
        self.assertNotIn("in-job recovery", text)

    def test_a_replacement_dying_while_it_joins_falls_back_to_a_restart(self):
        # A failure during the recovery itself: the survivors wait to form generation 1 with a
        # replacement that exits first. The agent gives the recovery up, says so in one line
        # and in the events, and restarts the job from its checkpoint, which every rank reads.
        reference = self.uninterrupted()  # first: it runs a job of its own
        p, out = self.run_job("die-joining", "kill_rank=1", "at_step=20", "ckpt_every=10",
                              "die_joining=1")
        text = p.stdout + p.stderr
        self.assertEqual(p.returncode, 0, text)
        self.assertIn("rank 1: dying while it joins generation 1", text)
        self.assertRegex(p.stderr, r"in-job recovery 1 failed: rank 1 exited during it; falling "
                                   r"back to a restart of the job from its last checkpoint")
        rec = [e for e in self.events() if e["event"] == "recovery"]
        self.assertEqual([(e["status"], e.get("fallback")) for e in rec],
                         [("started", None), ("failed", "restart")], rec)
        self.assertEqual(len([e for e in self.events() if e["event"] == "restart"]), 1)
        for rank in range(WORLD):
            self.assertIn(f"rank {rank}: loaded checkpoint at step 20", text)
            self.assertRegex(text, rf"rank {rank} pid \d+ done 64 steps, 0 recoveries")
            # The checkpoint holds the whole state: the restarted job ends as no fault had been.
            self.assertEqual(self.params(out, rank), reference, f"rank {rank}")
        self.assertEqual([e["status"] for e in self.events() if e["event"] == "job_end"],
                         ["succeeded"])



@unittest.skipUnless(have_torch(), "python3-torch is not installed")
class TorchRecoveryTwoNodes(dltest.Case):
    reference: bytes = b""

    def setUp(self):
        super().setUp()
        self.cluster = dltest.Cluster(self, args=["--nproc-per-node", "2", "--recovery",
                                                  "in-job", "--max-restarts", "3"])

    def start_job(self, name, nodes, epochs, *script_args, opts=()):
        out = os.path.join(self.dir, name)
        os.mkdir(out)
        self.endpoint = self.cluster.endpoint = f"127.0.0.1:{free_port()}"
        procs = [self.start_agent(name, i, nodes, out, epochs, *script_args, opts=opts)
                 for i in range(2)]
        return procs, out

    def start_agent(self, name, i, nodes, out, epochs, *script_args, opts=(), agent=None):
        """Node i's agent of job name; its output in AGENT.log (name.nodeI.log by default)."""
        return self.cluster.agent("--node-rank", str(i), *opts, "--", TORCH_PYTHON, SCRIPT, out,
                                  epochs, *script_args, name=agent or f"{name}.node{i}",
                                  nodes=nodes, run_id=name, env={"PYTHONPATH": PACKAGE})

    def finish(self, name, procs):
        codes = [p.wait(timeout=600) for p in procs]
        text = "".join(self.read(f"{name}.node{i}.log") for i in range(2))
        return codes, text

    def params(self, out, rank=0):
        with open(os.path.join(out, f"params-{rank}.bin"), "rb") as f:
            return f.read()

    def starts(self, out):
        return TorchRecovery.starts(self, out)  # type: ignore[arg-type]

    def reference_params(self):
        if not TorchRecoveryTwoNodes.reference:
            procs, ref = self.start_job("reference", "2", EPOCHS)
            codes, text = self.finish("reference", procs)
            self.assertEqual(codes, [0, 0], text)
            TorchRecoveryTwoNodes.reference = self.params(ref)
        return TorchRecoveryTwoNodes.reference

    def assert_replaced(self, out, text, failed_rank):
        starts = self.starts(out)
        self.assertEqual({r: len(p) for r, p in starts.items()},
                         {r: 2 if r == failed_rank else 1 for r in range(4)})
        for rank in range(4):
            if rank != failed_rank:
                self.assertIn(f"rank {rank} pid {starts[rank][0]} done 48 steps, 1 recoveries",
                              text)
        self.assertNotIn("loaded checkpoint", text)
        self.assertRegex(text, r"in-job recovery to generation 1: going on at step 20 in a "
                               r"group of 4")
        for rank in range(4):
            self.assertEqual(self.params(out, rank), self.reference_params(), f"rank {rank}")

    def test_a_killed_rank_is_replaced_across_nodes_with_the_same_bits(self):
        self.reference_params()
        procs, out = self.start_job("kill", "2", EPOCHS, "kill_rank=3", "at_step=20",
                                    "ckpt_every=10")
        codes, text = self.finish("kill", procs)
        self.assertEqual(codes, [0, 0], text)
        self.assert_replaced(out, text, 3)

    def test_a_killed_rank_s_place_goes_to_its_node_s_spare_across_nodes(self):
        self.reference_params()
        procs, out = self.start_job("spare", "2", EPOCHS, "kill_rank=3", "at_step=20",
                                    "ckpt_every=10", "wait_spare=1", opts=("--spares", "1"))
        codes, text = self.finish("spare", procs)
        self.assertEqual(codes, [0, 0], text)
        self.assert_replaced(out, text, 3)
        pids = [int(x) for x in re.findall(r"\[agent node=1\] spare 0 started \(pid (\d+)\)",
                                           text)]
        self.assertGreaterEqual(len(pids), 2, text)
        self.assertIn(pids[0], self.starts(out)[3])
        self.assertRegex(text, rf"rank 3's place goes to spare 0 \(pid {pids[0]}, waiting")

    def test_a_hung_rank_is_killed_and_replaced_across_nodes_with_the_same_bits(self):
        self.reference_params()
        procs, out = self.start_job("hang", "2", EPOCHS, "hang_rank=1", "at_step=20",
                                    "ckpt_every=10", opts=("--health-timeout", "4"))
        codes, text = self.finish("hang", procs)
        self.assertEqual(codes, [0, 0], text)
        self.assertIn("rank 1: hanging before step 20's backward", text)
        self.assertRegex(text, r"rank 1 \(pid \d+\) sent no health beat for [0-9.]+s: it is "
                               r"hung; killing it")
        self.assert_replaced(out, text, 1)

    def test_a_hung_rank_s_place_goes_to_its_node_s_spare_across_nodes(self):
        self.reference_params()
        procs, out = self.start_job("spare-hang", "2", EPOCHS, "hang_rank=3", "at_step=20",
                                    "ckpt_every=10",
                                    opts=("--health-timeout", "4", "--spares", "1"))
        codes, text = self.finish("spare-hang", procs)
        self.assertEqual(codes, [0, 0], text)
        self.assertRegex(text, r"rank 3 \(pid \d+\) sent no health beat for [0-9.]+s: it is "
                               r"hung; killing it")
        self.assert_replaced(out, text, 3)
        pids = [int(x) for x in re.findall(r"\[agent node=1\] spare 0 started \(pid (\d+)\)",
                                           text)]
        self.assertGreaterEqual(len(pids), 2, text)
        self.assertIn(pids[0], self.starts(out)[3])
        self.assertRegex(text, rf"rank 3's place goes to spare 0 \(pid {pids[0]}, waiting")

    def kill_node_after_step_10(self, procs, out, node, said=None):
        """SIGKILLs node's agent once rank 0 wrote its step-10 checkpoint (and, with said, a log
        file's name, once that log holds a progress line of step 10 or later: rank 0's line
        passes through its agent, which a kill at the checkpoint can stop short of writing it);
        its workers die with it (their orphan guard). Every agent must be alive until then."""
        def reached():
            if not os.path.exists(os.path.join(out, "checkpoint.pt")):
                return False
            if said is None:
                return True
            steps = re.findall(r"progress step=(\d+)", self.read(said))
            return bool(steps) and int(steps[-1]) >= 10
        try:
            deadline = time.monotonic() + 300
            while not reached():
                self.assertLess(time.monotonic(), deadline, "no step 10 in 300 s")
                self.assertEqual([p.poll() for p in procs], [None] * len(procs))
                time.sleep(0.1)
            procs[node].send_signal(signal.SIGKILL)
            procs[node].wait(timeout=60)
        except BaseException:
            for p in procs:
                p.kill()
            raise

    def test_a_lost_node_shrinks_the_world_and_the_others_go_on(self):
        # With a spare on each node: node 0's waits through it all and goes at the end.
        procs, out = self.start_job("lost", "1:2", "6", "ckpt_every=10", opts=("--spares", "1"))
        self.kill_node_after_step_10(procs, out, 1)
        code = procs[0].wait(timeout=600)
        text = self.read("lost.node0.log")
        self.assertEqual(code, 0, text)
        starts = self.starts(out)
        self.assertEqual({r: len(p) for r, p in starts.items()}, {0: 1, 1: 1, 2: 1, 3: 1})
        self.assertRegex(text, r"in-job recovery to generation 1: going on at step \d+ in a "
                               r"group of 2 with rank [01]'s state")
        for rank in range(2):
            self.assertRegex(text, rf"rank {rank} pid {starts[rank][0]} done \d+ steps, "
                                   rf"1 recoveries")
        self.assertNotIn("loaded checkpoint", text)

    def test_the_rendezvous_host_lost_the_other_node_goes_on_with_its_workers(self):
        # Node 0's agent hosts the embedded rendezvous: node 1's agent takes it over as the
        # successor, and its round is an in-job recovery like any lost node's (docs/recovery.md,
        # "Several nodes"). Ranks 2 and 3 keep their processes and their state.
        procs, out = self.start_job("host", "1:2", "6", "ckpt_every=10", "progress=1")
        self.kill_node_after_step_10(procs, out, 0, said="host.node0.log")
        code = procs[1].wait(timeout=600)
        text = self.read("host.node1.log")
        self.assertEqual(code, 0, text)
        starts = self.starts(out)
        self.assertEqual({r: len(p) for r, p in starts.items()}, {0: 1, 1: 1, 2: 1, 3: 1})
        self.assertNotIn("loaded checkpoint", text)
        # On from the last step lost rank 0 said it had done (or the one after it): only the
        # step in progress is done again.
        last = [int(s) for s in re.findall(r"progress step=(\d+)", self.read("host.node0.log"))]
        self.assertGreaterEqual(last[-1], 10, last)
        m = re.search(r"in-job recovery to generation 1: going on at step (\d+) in a group of 2 "
                      r"with rank \d+'s state", text)
        self.assertIsNotNone(m, text)
        went_on = int(m.group(1))
        self.assertGreaterEqual(went_on, last[-1], text)
        # And no sample skipped or seen twice: the epoch's rest in batches of the world of 2
        # (24 steps an epoch in 4 ranks, 48 in 2), then the other epochs.
        epoch, batch = divmod(went_on, 24)
        steps = went_on + (48 - 2 * batch) + (5 - epoch) * 48
        for rank in (2, 3):
            self.assertIn(f"rank {rank} pid {starts[rank][0]} done {steps} steps, 1 recoveries",
                          text)
        self.assertRegex(text, r"\[agent node=1\] hosting the rendezvous on [^ ]+: its host was "
                               r"lost")
        self.assertIn("in-job recovery 1: 2 of this node's 2 workers stay", text)
        self.assertEqual(self.params(out, 2), self.params(out, 3))

    def test_a_lost_node_back_grows_the_world_again(self):
        procs, out = self.start_job("regrow", "1:2", "12", "ckpt_every=10", "step_ms=20")
        self.kill_node_after_step_10(procs, out, 1)
        try:
            deadline = time.monotonic() + 300
            while "group of 2" not in self.read("regrow.node0.log"):
                self.assertLess(time.monotonic(), deadline, self.read("regrow.node0.log"))
                time.sleep(0.1)
            back = self.start_agent("regrow", 1, "1:2", out, "12", "ckpt_every=10", "step_ms=20",
                                    agent="regrow.back")
            procs.append(back)
            codes = [procs[0].wait(timeout=600), back.wait(timeout=600)]
        except BaseException:
            for p in procs:
                p.kill()
            raise
        text = self.read("regrow.node0.log") + self.read("regrow.back.log")
        self.assertEqual(codes, [0, 0], text)
        starts = self.starts(out)
        # Ranks 0 and 1 lived through it all; 2 and 3 started again on the node that came back.
        self.assertEqual({r: len(p) for r, p in starts.items()}, {0: 1, 1: 1, 2: 2, 3: 2})
        self.assertRegex(text, r"in-job recovery to generation 2: going on at step \d+ in a "
                               r"group of 4 with rank [01]'s state")
        for rank in range(2):
            self.assertRegex(text, rf"rank {rank} pid {starts[rank][0]} done \d+ steps, "
                                   rf"2 recoveries")
        self.assertNotIn("loaded checkpoint", text)
        for rank in range(1, 4):
            self.assertEqual(self.params(out, rank), self.params(out, 0), f"rank {rank}")



class SparesNeedInJob(dltest.Case):
    """--spares where no spare could wait: refused before anything starts."""

    def test_spares_without_in_job_recovery_are_refused_in_one_line(self):
        p = self.dlaunch("--spares", "1", "--nproc-per-node", "2", "--", "true")
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertEqual(p.stderr.strip().splitlines(),
                         ["dlaunch: --spares 1 needs --recovery in-job: a spare only takes the "
                          "place of a rank that failed in a job that goes on"])

    def test_spares_for_the_bundled_trainer_are_refused_in_one_line(self):
        trainer = os.path.join(os.path.dirname(dltest.DLAUNCH), "..", "trainer", "dlaunch-train")
        p = self.dlaunch("--spares", "1", "--nproc-per-node", "2", "--", trainer)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertEqual(p.stderr.strip().splitlines(),
                         ["dlaunch: --spares 1: the bundled trainer does not wait as a spare "
                          "(only PyTorch programs with dlaunch.torch do; docs/recovery.md)"])


if __name__ == "__main__":
    dltest.main()
