"""What dlaunch.torch.watch costs a small DDP model, side by side in one job: every rank holds
five identical DDP models over the same data, one plain, one watched (beats, recorder, the
wrapped calls; with `buckets` also the gradient hooks that record the buckets) and, for
reference, one with
DDP's builtin C++ ALLREDUCE communication hook (the floor of any hook: DDP's default done as a
hook) and one with PyTorch's own Python communication hook (default_hooks.allreduce_hook, the
same in Python, with its `fut.then` callback), and a fifth, plain again (its twin: what two
identical models differ by in this job, where their memory lies and whom they follow, the bench's
own floor of error), and trains them in turn in blocks of steps, in a new random order each
round, so load on the machine falls on all alike. The models are also built in a random order
each run (the same on every rank), so no role keeps the same place in memory from run to run.
Rank 0 prints the plain model's steps a second (the median block) and each model's ratio to
plain and to DDP's C++ hook: each round's ratio, their median and quartiles over the rounds, for
steps a second, for the job's CPU time a step (both ranks' processes, every thread) and for the
training threads' (each rank's main thread, where the watch's Python runs), with the median
differences in microseconds. Run it under dlaunch (the watched model's beats and recorder
need the agent), one benchmark at a time (defaults: 60 rounds of 20-step blocks, hidden 256):

    flock /tmp/bench.lock build/cmd/dlaunch --nproc-per-node 2 -- \\
        /usr/bin/python3 bench/torch_watch.py buckets|nobuckets [BLOCKS] [STEPS] [HIDDEN]

Measures and prints; asserts nothing."""
import os
import random
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
    t0, c0, m0 = time.perf_counter(), time.process_time(), time.thread_time()
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    main = (time.thread_time() - m0) / steps
    return steps / (time.perf_counter() - t0), (time.process_time() - c0) / steps, main


def spread(xs):
    """Median and quartiles of xs, as 'median (q1..q3)'."""
    q1, q2, q3 = statistics.quantiles(xs, n=4)
    return f"{q2:.3f} ({q1:.3f}..{q3:.3f})"


def main():
    buckets = sys.argv[1] == "buckets" if len(sys.argv) > 1 else True
    blocks = int(sys.argv[2]) if len(sys.argv) > 2 else 60
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 20
    hidden = int(sys.argv[4]) if len(sys.argv) > 4 else 256
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    hooks = {"plain": None, "watched": None, "DDP's C++ hook": "builtin",
             "torch's Python hook": "python", "plain twin": None}
    seed = [random.SystemRandom().randrange(1 << 30)]
    dist.broadcast_object_list(seed, src=0)
    built = list(hooks)
    random.Random(seed[0]).shuffle(built)
    models = {k: make(hidden, hooks[k]) for k in built}  # DDP's construction is collective
    models = {k: models[k] for k in hooks}
    w = dlaunch.torch.watch(*models["watched"], buckets=buckets)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
    for m in models.values():
        block(*m, x, y, steps)  # warm up (DDP rebuilds its buckets after the first step)
    names = list(models)
    rates = {k: [] for k in models}
    cpu = {k: [] for k in models}
    main_cpu = {k: [] for k in models}
    load = [os.getloadavg()[0]]
    for i in range(blocks):
        # A fresh order each round, the same on every rank (their blocks are collective): in a
        # fixed rotation each model follows the same one every round and inherits what it leaves
        # (its garbage for the collector, the last callbacks of a `fut.then` hook).
        order = names[:]
        random.Random(i).shuffle(order)
        for name in order:
            rate, cpu_a_step, main_a_step = block(*models[name], x, y, steps)
            rates[name].append(rate)
            cpu[name].append(cpu_a_step)
            main_cpu[name].append(main_a_step)
    load.append(os.getloadavg()[0])
    # The job's CPU a step: every rank's process, block by block (the ranks run each block
    # together, so block i of one rank is block i of the other).
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, (cpu, main_cpu))
    job = {k: [sum(r[0][k][i] for r in every) for i in range(blocks)] for k in models}
    job_main = {k: [sum(r[1][k][i] for r in every) for i in range(blocks)] for k in models}
    if dist.get_rank() == 0:
        print(f"hidden {hidden}, {blocks} rounds of {steps}-step blocks, "
              f"{dist.get_world_size()} ranks, gloo, buckets {'on' if buckets else 'off'}, "
              f"load average {load[0]:.1f} -> {load[1]:.1f}; plain "
              f"{statistics.median(rates['plain']):.1f} steps/s (median block), job CPU "
              f"{statistics.median(job['plain']) * 1e3:.3f} ms a step (training threads "
              f"{statistics.median(job_main['plain']) * 1e3:.3f}); recorder "
              f"{'on' if w is not None and w.recorder is not None else 'off'}, beats counted "
              f"{w.beats.step if w is not None and w.beats is not None else 0} steps; built in "
              f"the order {', '.join(built)}")
        print("each round's ratio, median (quartiles) over the rounds:")
        for base in ("plain", "DDP's C++ hook"):
            for k in names:
                if k == base or (base != "plain" and k == "plain twin"):
                    continue
                r = [a / b for a, b in zip(rates[k], rates[base])]
                c = [a / b for a, b in zip(job[k], job[base])]
                us = statistics.median((a - b) * 1e6 for a, b in zip(job[k], job[base]))
                m = [a / b for a, b in zip(job_main[k], job_main[base])]
                mus = statistics.median((a - b) * 1e6
                                        for a, b in zip(job_main[k], job_main[base]))
                print(f"  {k:>20} / {base:<15} steps/s {spread(r)}; job CPU a step "
                      f"{spread(c)}, {us:+.1f} us; training threads' {spread(m)}, "
                      f"{mus:+.1f} us", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
