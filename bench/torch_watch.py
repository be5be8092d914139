"""What dlaunch.torch.watch costs a small DDP model, side by side in one job: every rank holds
two identical DDP models over the same data, one plain and one watched (its beats, recorder and
bucket hook on), and trains them in alternating blocks of steps, so load on the machine falls on
both alike. Rank 0 prints each model's steps a second (the median block) and the ratio. Run it
under dlaunch (the watched model's beats and recorder need the agent), one benchmark at a time:

    flock /tmp/dlaunch-bench.lock build/cmd/dlaunch --nproc-per-node 2 -- \\
        /usr/bin/python3 bench/torch_watch.py [BLOCKS] [STEPS_A_BLOCK] [HIDDEN]

Measures and prints; asserts nothing."""
import statistics
import sys
import time

import torch
import torch.distributed as dist

import dlaunch.torch


def make(hidden):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(256, hidden), torch.nn.ReLU(),
                              torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
                              torch.nn.Linear(hidden, 10))
    model = torch.nn.parallel.DistributedDataParallel(net)
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def block(model, opt, x, y, steps):
    t0 = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return steps / (time.perf_counter() - t0)


def main():
    blocks = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 50
    hidden = int(sys.argv[3]) if len(sys.argv) > 3 else 256
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    plain, plain_opt = make(hidden)
    watched, watched_opt = make(hidden)
    w = dlaunch.torch.watch(watched, watched_opt)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
    block(plain, plain_opt, x, y, steps)  # warm up both
    block(watched, watched_opt, x, y, steps)
    rates = {"plain": [], "watched": []}
    for i in range(blocks):
        order = [("plain", plain, plain_opt), ("watched", watched, watched_opt)]
        for name, model, opt in (order if i % 2 == 0 else order[::-1]):
            rates[name].append(block(model, opt, x, y, steps))
    if dist.get_rank() == 0:
        p, q = statistics.median(rates["plain"]), statistics.median(rates["watched"])
        beats = w.beats.step if w is not None and w.beats is not None else 0
        print(f"hidden {hidden}, {blocks} blocks of {steps} steps each, 2 ranks, gloo: plain "
              f"{p:.1f} steps/s, watched {q:.1f} steps/s (median block); watched / plain "
              f"{q / p:.3f} ({(1 - q / p) * 100:+.1f}% cost); beats counted {beats} steps; "
              f"recorder {'on' if w is not None and w.recorder is not None else 'off'}",
              flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
