"""What dlaunch.torch.watch costs a small DDP model in instructions, which the machine's load does
not move (bench/torch_watch.py measures CPU time, which a shared machine moves by several per
cent a round). One process, one rank (gloo, world 1), under valgrind's callgrind: the same
256-256-256-10 MLP as torch_watch.py, batch 64, one thread, as plain DDP, with DDP's builtin C++
ALLREDUCE hook, with PyTorch's own Python allreduce_hook, watched (the default: beats, recorder,
the bucket hook) and watched with buckets=False; each model's steps are counted alone (callgrind's
client requests zero and dump the counts around each block), every thread of the process, in
rotating rounds. Prints each model's instructions a step and its difference from plain and from
the C++ hook, each round's, and their median. Needs valgrind (its callgrind.h) and a C compiler
for a four-line helper; run it from the source tree, one benchmark at a time:

    flock /tmp/bench.lock /usr/bin/python3 bench/torch_watch_ir.py [--cache] [ROUNDS] [STEPS] [HIDDEN]

(about a minute a model-round of 10 steps on a 2-core machine). --cache simulates the caches too
(callgrind's --cache-sim) and counts each step in estimated cycles, instructions plus 10 a
first-level miss and 100 a last-level one (KCachegrind's estimate): code that runs once a step
runs from cold caches, and Python's share of a step costs more cycles an instruction than the
kernels'. Measures and prints; asserts nothing."""
import ctypes
import os
import random
import statistics
import subprocess
import sys
import tempfile

HELPER = """#include <valgrind/callgrind.h>
void cg_start(void) { CALLGRIND_START_INSTRUMENTATION; }
void cg_zero(void) { CALLGRIND_ZERO_STATS; }
void cg_dump(const char *name) { CALLGRIND_DUMP_STATS_AT(name); }
"""
MODELS = ("plain", "DDP's C++ hook", "torch's Python hook", "watched", "watched, buckets=False")


def child(tmp, rounds, steps, hidden):
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    import dlaunch.torch as dt

    cg = ctypes.CDLL(os.path.join(tmp, "cg.so"))
    os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=os.environ.get("BENCH_PORT", "29471"))
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    os.environ["DLAUNCH_ATTEMPT_DIR"] = tmp
    _, wr = os.pipe()  # beats nobody reads: a full pipe drops lines, as with a slow agent
    os.environ["DLAUNCH_HEALTH_FD"] = str(wr)
    models = {}
    for name in MODELS:
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(256, hidden), torch.nn.ReLU(),
                                  torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
                                  torch.nn.Linear(hidden, 10))
        m = torch.nn.parallel.DistributedDataParallel(net)
        if name == "DDP's C++ hook":
            m._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)
        elif name == "torch's Python hook":
            m.register_comm_hook(None, default_hooks.allreduce_hook)
        elif name.startswith("watched"):
            # A Watch a model (watch() makes one a process); each its own recorder file.
            os.environ["DLAUNCH_COLL_RECORDER"] = os.path.join(tmp, f"{len(models)}.rec")
            dt.Watch(m, None, None, buckets=name == "watched")
        models[name] = (m, torch.optim.SGD(m.parameters(), lr=0.01))
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))

    def run(m, opt, n):
        for _ in range(n):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(m(x), y).backward()
            opt.step()

    for m in models.values():
        run(*m, 3)  # DDP rebuilds its buckets after the first step
    cg.cg_start()
    for m in models.values():
        run(*m, 2)  # warm once instrumented
    names = list(models)
    for i in range(rounds):
        order = names[:]
        random.Random(i).shuffle(order)  # as torch_watch.py: no model always after the same one
        for k in order:
            cg.cg_zero()
            run(*models[k], steps)
            cg.cg_dump(f"{names.index(k)} {i}".encode())
    dist.destroy_process_group()


def estimated_cycles(v):
    """KCachegrind's estimate from callgrind's cache simulation."""
    l1 = v["I1mr"] + v["D1mr"] + v["D1mw"]
    ll = v["ILmr"] + v["DLmr"] + v["DLmw"]
    return v["Ir"] + 10 * l1 + 100 * ll


def main():
    cache = "--cache" in sys.argv
    if cache:
        sys.argv.remove("--cache")
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    hidden = int(sys.argv[3]) if len(sys.argv) > 3 else 256
    if os.environ.get("BENCH_CHILD"):
        child(os.environ["BENCH_CHILD"], rounds, steps, hidden)
        return
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "cg.c"), "w") as f:
            f.write(HELPER)
        subprocess.run(["cc", "-O1", "-shared", "-fPIC", "-o", os.path.join(tmp, "cg.so"),
                        os.path.join(tmp, "cg.c")], check=True)
        subprocess.run(["valgrind", "--tool=callgrind", "--instr-atstart=no",
                        f"--cache-sim={'yes' if cache else 'no'}",
                        f"--callgrind-out-file={tmp}/out.%p", sys.executable,
                        os.path.abspath(__file__), str(rounds), str(steps), str(hidden)],
                       env={**os.environ, "BENCH_CHILD": tmp}, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        ir = {k: [0.0] * rounds for k in MODELS}
        for fn in os.listdir(tmp):
            if not fn.startswith("out.") or fn.count(".") != 2:
                continue
            desc = total = None
            with open(os.path.join(tmp, fn)) as f:
                for line in f:
                    if line.startswith("desc: Trigger: Client Request: "):
                        desc = line.split(": ", 3)[3].split()
                    elif line.startswith("events:"):
                        events = line.split()[1:]
                    elif line.startswith("totals:"):
                        v = dict(zip(events, map(int, line.split()[1:])))
                        total = estimated_cycles(v) if cache else v["Ir"]
            if desc is not None and total is not None:
                ir[MODELS[int(desc[0])]][int(desc[1])] = total / steps
    unit = "estimated cycles" if cache else "instructions"
    print(f"hidden {hidden}, {rounds} rounds of {steps}-step blocks, 1 rank, gloo, callgrind; "
          f"{unit} a step (all threads), each round's difference, median:")
    for k in MODELS:
        line = f"  {k:>24} {statistics.median(ir[k]) / 1e6:7.3f} M"
        for base in ("plain", "DDP's C++ hook"):
            if k != base:
                d = [a - b for a, b in zip(ir[k], ir[base])]
                rel = statistics.median(a / b for a, b in zip(ir[k], ir[base]))
                line += (f"; - {base}: {statistics.median(d) / 1e3:+6.1f} k ({(rel - 1) * 100:+.2f}%,"
                         f" rounds {min(d) / 1e3:+.1f}..{max(d) / 1e3:+.1f} k)")
        print(line, flush=True)


if __name__ == "__main__":
    main()
