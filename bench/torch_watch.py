"""What dlaunch.torch.watch costs a small DDP model, side by side in one job: every rank holds
four identical DDP models over the same data, one plain, one watched (beats, recorder, the
wrapped calls; with `buckets` also the recording communication hook) and, for reference, one with
DDP's builtin C++ ALLREDUCE communication hook (the floor of any hook: DDP's default done as a
hook) and one with PyTorch's own Python communication hook (default_hooks.allreduce_hook, the
same in Python, with its `fut.then` callback), and trains them in turn in blocks of steps, so load
on the machine falls on all alike.
Rank 0 prints the plain model's steps a second (the median block) and each model's ratio to
plain, the median over rounds of that round's ratio, for steps a second and for the process's
CPU time a step. Run it under dlaunch (the watched model's beats and recorder need the agent),
one benchmark at a time:

    flock /tmp/dlaunch-bench.lock build/cmd/dlaunch --nproc-per-node 2 -- \\
        /usr/bin/python3 bench/torch_watch.py buckets|nobuckets [BLOCKS] [STEPS] [HIDDEN]

Measures and prints; asserts nothing."""
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

import dlaunch.torch


def make(hidden, hook=None):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(256, hidden), torch.nn.ReLU(),
                              torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
                              torch.nn.Linear(hidden, 10))
    model = torch.nn.parallel.DistributedDataParallel(net)
    if hook == "builtin":
        model._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)
    elif hook == "python":
        model.register_comm_hook(None, default_hooks.allreduce_hook)
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def block(model, opt, x, y, steps):
    """Steps a second, and the process's CPU seconds a step (every thread: Python's, autograd's,
    gloo's). The CPU time is what the watch adds by construction, and a busy neighbour that
    steals a core moves it far less than it moves the wall clock."""
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return steps / (time.perf_counter() - t0), (time.process_time() - c0) / steps


def main():
    buckets = sys.argv[1] == "buckets" if len(sys.argv) > 1 else True
    blocks = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 50
    hidden = int(sys.argv[4]) if len(sys.argv) > 4 else 256
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    models = {"plain": make(hidden), "watched": make(hidden),
              "DDP's C++ hook": make(hidden, "builtin"),
              "torch's Python hook": make(hidden, "python")}
    w = dlaunch.torch.watch(*models["watched"], buckets=buckets)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
    for m in models.values():
        block(*m, x, y, steps)  # warm up
    rates = {k: [] for k in models}
    cpu = {k: [] for k in models}
    for i in range(blocks):
        names = list(models)
        for name in names[i % len(names):] + names[:i % len(names)]:
            rate, cpu_a_step = block(*models[name], x, y, steps)
            rates[name].append(rate)
            cpu[name].append(cpu_a_step)
    if dist.get_rank() == 0:
        p = statistics.median(rates["plain"])
        # Each round's ratio to plain in that round, then their median: the machine's drift
        # between rounds falls on both sides of a ratio alike.
        ratios = ", ".join(
            f"{k} {statistics.median(r / q for r, q in zip(v, rates['plain'])):.3f}"
            for k, v in rates.items())
        cpu_ratios = ", ".join(
            f"{k} {statistics.median(c / q for c, q in zip(v, cpu['plain'])):.3f}"
            for k, v in cpu.items())
        ratios += (f"; rank 0's CPU a step {statistics.median(cpu['plain']) * 1e3:.2f} ms plain, "
                   f"against plain: {cpu_ratios}")
        beats = w.beats.step if w is not None and w.beats is not None else 0
        print(f"hidden {hidden}, {blocks} rounds of {steps}-step blocks, 2 ranks, gloo, "
              f"buckets {'on' if buckets else 'off'}: plain {p:.1f} steps/s (median block); "
              f"against plain: {ratios}; beats counted {beats} steps; recorder "
              f"{'on' if w is not None and w.recorder is not None else 'off'}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
