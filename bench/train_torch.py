"""The PyTorch side of bench/train: the trainer's model and data under DistributedDataParallel.

Run by bench/train as `dlaunch --gpus-per-node N -- /usr/bin/python3 train_torch.py ...`, which
sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT as torchrun does. One thread a rank
(torch.set_num_threads(1)), gloo on the CPU, the same 784-256-128-10 ReLU MLP, SGD settings,
per-rank batch, data files and pixel / 255 inputs as dlaunch-train, and the same sharding
(rank r takes r, r + W, ... of each epoch's permutation). Rank 0 prints one JSON line with the
samples a second (all ranks) over the steps after the warm-up.

    train_torch.py [--steps N] [--warmup N] [--batch N] [--dataset DIR]
"""
import argparse
import ctypes
import gzip
import json
import os
import struct
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def read_idx(path, ndims):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic = data[:4]
    if magic[:3] != b"\0\0\x08" or magic[3] != ndims:
        raise SystemExit(f"{path}: not an IDX file of {ndims} dimensions of unsigned bytes")
    dims = struct.unpack(f">{ndims}I", data[4:4 + 4 * ndims])
    return torch.frombuffer(bytearray(data[4 + 4 * ndims:]), dtype=torch.uint8).view(*dims)


def blas_kernels():
    """The kernels OpenBLAS picked (torch calls the system BLAS, OpenBLAS on Debian)."""
    for name in ("libopenblas.so.0", "libblas.so.3"):
        try:
            lib = ctypes.CDLL(name)
            lib.openblas_get_corename.restype = ctypes.c_char_p
            return lib.openblas_get_corename().decode()
        except (OSError, AttributeError):
            continue
    return "unknown"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--dataset", default="/usr/share/datasets/fashion-mnist")
    a = ap.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    images = read_idx(os.path.join(a.dataset, "train-images-idx3-ubyte.gz"), 3)
    images = images.reshape(images.shape[0], -1)
    labels = read_idx(os.path.join(a.dataset, "train-labels-idx1-ubyte.gz"), 1).long()

    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
                          nn.Linear(128, 10))
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    loss_fn = nn.CrossEntropyLoss()

    def shard(epoch):
        g = torch.Generator()
        g.manual_seed(1000 + epoch)
        return torch.randperm(images.shape[0], generator=g)[rank::world]

    epoch, order, pos = 0, shard(0), 0
    t0 = None
    for step in range(a.steps):
        if step == a.warmup:
            dist.barrier()
            t0 = time.perf_counter()
        if pos + a.batch > len(order):
            epoch, pos = epoch + 1, 0
            order = shard(epoch)
        idx = order[pos:pos + a.batch]
        pos += a.batch
        x = images[idx].float().div_(255.0)
        y = labels[idx]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(ddp(x), y)
        loss.backward()
        opt.step()
    dist.barrier()
    elapsed = time.perf_counter() - t0
    if rank == 0:
        measured = a.steps - a.warmup
        print(json.dumps({"impl": "pytorch", "workers": world,
                          "samples_per_s": measured * a.batch * world / elapsed,
                          "steps": measured, "seconds": elapsed, "loss": loss.item(),
                          "torch": torch.__version__, "blas_kernels": blas_kernels()}),
              flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
