"""A small PyTorch DDP job (gloo, CPU) watched by dlaunch.torch.watch, for test_python.py.

    ddp_watch.py STEPS [hang_at=K] [slow_rank=R] [bucket_kb=KB] [comm_hook=fp16]
                       [accumulate=K] [unused_every=K]

Step k (1, 2, ...) is one forward, backward and optimizer step; the model's gradients make one
DDP bucket. Before the training loop every rank makes one all_reduce of its own (the recorder's
#1), so step k's bucket is the recorder's #k+1. hang_at=K: rank 1 sleeps forever before step K's
backward. slow_rank=R: rank R computes three times what the others do (more forward passes,
real work, not sleep). bucket_kb=KB: DDP buckets of KB kilobytes, the first one too (several
a step from step 2, when DDP rebuilds its buckets; rank 0 prints how many), and a twin of the
model with DDP's own C++ all-reduce trained beside it on the same data; rank 0 prints whether
the two end with the same bits. comm_hook=fp16: DDP's fp16 compression hook registered on the
model before watch() (the user's own hook). accumulate=K: gradients accumulated over K steps
under DDP's no_sync() before each step that reduces them (only steps K, 2K, ... all-reduce).
unused_every=K: a second head whose parameters get no gradient in steps K, 2K, ... (DDP with
find_unused_parameters=True); rank 0 prints how many buckets DDP has at the start.
Rank 0 prints "done N steps" at the end."""
import contextlib
import copy
import sys
import time

import torch
import torch.distributed as dist

import dlaunch.torch


class TwoHeads(torch.nn.Module):
    """The trunk, and a second head added to its output only when asked."""

    def __init__(self, trunk):
        super().__init__()
        self.trunk = trunk
        self.extra = torch.nn.Linear(10, 10)

    def forward(self, x, use_extra=True):
        out = self.trunk(x)
        return out + self.extra(out) if use_extra else out


def main():
    steps = int(sys.argv[1])
    opts = dict(a.split("=", 1) for a in sys.argv[2:])
    hang_at = int(opts.get("hang_at", 0))
    slow_rank = int(opts.get("slow_rank", -1))
    bucket_kb = float(opts.get("bucket_kb", 0))
    accumulate = int(opts.get("accumulate", 1))
    unused_every = int(opts.get("unused_every", 0))
    dist.init_process_group("gloo", init_method="env://")
    rank = dist.get_rank()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    ddp = torch.nn.parallel.DistributedDataParallel
    twin = None
    if bucket_kb:
        twin_net = copy.deepcopy(net)
        dist._DEFAULT_FIRST_BUCKET_BYTES = int(bucket_kb * 1024)  # 1 MB: the model's all
        model = ddp(net, bucket_cap_mb=bucket_kb / 1024)
        twin = ddp(twin_net, bucket_cap_mb=bucket_kb / 1024)
        twin_opt = torch.optim.SGD(twin.parameters(), lr=0.01)
    elif unused_every:
        net = TwoHeads(net)
        # 256-byte buckets: the second head's two tensors (440 bytes) make the first alone.
        dist._DEFAULT_FIRST_BUCKET_BYTES = 256
        model = ddp(net, bucket_cap_mb=256 / 2**20, find_unused_parameters=True)
    else:
        model = ddp(net)
    if opts.get("comm_hook") == "fp16":
        # DDP's own C++ fp16 compression: PyTorch's Python fp16_compress_hook runs a future
        # callback on gloo's thread, which PyTorch 1.13 can hang or abort on at exit
        # (docs/python.md, "Exit"), with or without dlaunch.
        model._register_builtin_comm_hook(dist.BuiltinCommHookType.FP16_COMPRESS)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    if rank == 0 and (unused_every or bucket_kb):
        print(f"buckets at first: {len(model.reducer._get_zeros_like_grad_buckets())}",
              flush=True)
    watched = dlaunch.torch.watch(model, opt)
    print(f"rank {rank}: watched={watched is not None}", flush=True)
    t = torch.ones(4)
    dist.all_reduce(t)  # through the wrapped torch.distributed: the recorder's #1
    x = torch.randn(32, 64)
    y = torch.randint(0, 10, (32,))
    for k in range(1, steps + 1):
        reduce = k % accumulate == 0
        if k % accumulate == 1 or accumulate == 1:
            opt.zero_grad()
        def sync():
            return contextlib.nullcontext() if reduce else model.no_sync()
        with sync():
            if unused_every:
                out = model(x, k % unused_every != 0)
            else:
                out = model(x)
            loss = torch.nn.functional.cross_entropy(out, y)
        if rank == slow_rank:
            with torch.no_grad():
                for _ in range(40):
                    net(torch.randn(256, 64))
        if rank == 1 and k == hang_at:
            print(f"rank 1: sleeping before step {k}'s backward", flush=True)
            while True:
                time.sleep(3600)
        with sync():
            loss.backward()
        if reduce:
            opt.step()
        if twin is not None:
            twin_opt.zero_grad()
            torch.nn.functional.cross_entropy(twin(x), y).backward()
            twin_opt.step()
    if twin is not None and rank == 0:
        same = all(torch.equal(a, b) for a, b in zip(model.parameters(), twin.parameters()))
        print(f"same bits as DDP's own all-reduce: {same}", flush=True)
        print(f"buckets a step: {len(model.reducer._get_zeros_like_grad_buckets())}", flush=True)
    dist.destroy_process_group()
    if rank == 0:
        print(f"done {steps} steps", flush=True)


if __name__ == "__main__":
    main()
