"""A small DDP job (gloo, CPU, one thread, fixed seeds) in dlaunch.torch.Recoverable's loop, for
test_torch_recovery.py.

    recover_mlp.py OUT_DIR EPOCHS [kill_rank=R] [hang_rank=R] [raise_rank=R] [at_step=K]
                   [ckpt_every=N] [progress=1] [wait_spare=1] [step_ms=M] [die_joining=1]

kill_rank=R: rank R SIGKILLs itself in step K's backward pass (before its gradients reach the
all-reduce), once in the job (a marker file in OUT_DIR); with wait_spare=1, only once its node's
spare 0 says in its log that it waits. hang_rank=R: rank R sleeps forever before step K's backward,
once. raise_rank=R: rank R raises a RuntimeError of its own in step K's forward pass, once (the
process exits 1 with its traceback). ckpt_every=N: rank 0 (of the group as it is then) writes a checkpoint every N steps, and a
rank that starts with no state (job.steps == 0) reads it when there is one, saying so: in-job
recovery must never get there (the checkpoint holds the step and the sampler's position too, as a
real job's would). progress=1: rank 0 (the same) says "progress step=S mono=T" after each step (T: its
CLOCK_MONOTONIC, for bench/faults.py). step_ms=M: every rank sleeps M ms in each step, a longer
job. die_joining=1: the first replacement (DLAUNCH_GROUP_GEN above 0) exits 3 before it joins,
while the survivors wait to form the group with it. Each process leaves OUT_DIR/start-RANK-PID as it starts; at the end each rank writes its
parameters' bytes to OUT_DIR/params-RANK.bin and says "rank R pid P done S steps"."""
import os
import signal
import sys
import time

import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import dlaunch.torch


def wait_for_spare() -> None:
    """Until this node's spare says it waits (its imports loaded), in its log."""
    path = os.path.join(os.environ["DLAUNCH_ATTEMPT_DIR"], "spare_0.err")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if os.path.exists(path) and "spare waiting" in open(path).read():
            return
        time.sleep(0.05)
    raise RuntimeError(f"no spare waiting in {path}")


def main() -> None:
    out, epochs = sys.argv[1], int(sys.argv[2])
    opts = dict(a.split("=", 1) for a in sys.argv[3:])
    kill_rank = int(opts.get("kill_rank", -1))
    hang_rank = int(opts.get("hang_rank", -1))
    raise_rank = int(opts.get("raise_rank", -1))
    at_step = int(opts.get("at_step", 10))
    ckpt_every = int(opts.get("ckpt_every", 0))
    progress = opts.get("progress") == "1"
    step_s = float(opts.get("step_ms", 0)) / 1e3
    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    open(os.path.join(out, f"start-{rank}-{os.getpid()}"), "w").close()
    data = torch.Generator().manual_seed(1)
    x = torch.randn(1536, 32, generator=data)
    y = torch.randint(0, 10, (1536,), generator=data)
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=7)
    loader = DataLoader(dataset, batch_size=16, sampler=sampler)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    if opts.get("die_joining") == "1" and int(os.environ.get("DLAUNCH_GROUP_GEN", "0")) > 0:
        # A replacement that dies while the survivors wait for it to form the new group: the
        # first time only (a marker file in OUT_DIR).
        marker = os.path.join(out, "joining-died")
        if not os.path.exists(marker):
            open(marker, "w").close()
            print(f"rank {rank}: dying while it joins generation "
                  f"{os.environ['DLAUNCH_GROUP_GEN']}", flush=True)
            os._exit(3)
    job = dlaunch.torch.Recoverable(net, opt, sampler=sampler)
    ckpt = os.path.join(out, "checkpoint.pt")
    if job.steps == 0 and os.path.exists(ckpt):
        saved = torch.load(ckpt)
        net.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
        # Its batches are the saving world's, one per rank: the same samples in this one.
        job.steps, job.epoch = saved["steps"], saved["epoch"]
        job.batch = saved["batch"] * saved["world"] // world
        print(f"rank {rank}: loaded checkpoint at step {saved['steps']}", flush=True)
    for xb, yb in job.batches(loader, epochs=epochs):
        with job.step():
            once = os.path.join(out, "fault-done")
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(job.model(xb), yb)
            if job.steps == at_step and not os.path.exists(once):
                if rank == kill_rank:
                    open(once, "w").close()
                    if opts.get("wait_spare") == "1":
                        wait_for_spare()
                    loss.register_hook(lambda g: os.kill(os.getpid(), signal.SIGKILL))
                elif rank == hang_rank:
                    open(once, "w").close()
                    print(f"rank {rank}: hanging before step {at_step}'s backward", flush=True)
                    while True:
                        time.sleep(3600)
                elif rank == raise_rank:
                    open(once, "w").close()
                    raise RuntimeError(f"rank {rank}: a bug of the script's own in step {at_step}")
            if step_s > 0:
                time.sleep(step_s)
            loss.backward()
            opt.step()
        # Rank 0 of the group as it is now: after the loss of node 0, a rank of node 1.
        if job.rank == 0 and progress:
            print(f"progress step={job.steps} mono={time.monotonic():.6f}", flush=True)
        if job.rank == 0 and ckpt_every > 0 and job.steps % ckpt_every == 0:
            torch.save({"model": net.state_dict(), "optimizer": opt.state_dict(),
                        "steps": job.steps, "epoch": job.epoch, "batch": job.batch,
                        "world": job.world},
                       ckpt + ".tmp")
            os.replace(ckpt + ".tmp", ckpt)
    with open(os.path.join(out, f"params-{rank}.bin"), "wb") as f:
        for p in net.parameters():
            f.write(p.detach().numpy().tobytes())
    print(f"rank {rank} pid {os.getpid()} done {job.steps} steps, {job.recoveries} recoveries",
          flush=True)


if __name__ == "__main__":
    main()
