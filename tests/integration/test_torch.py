"""An unmodified PyTorch DDP script runs under dlaunch as under torchrun (Debian's
python3-torch; skipped where it is not installed)."""
import subprocess
import unittest

import dltest

TORCH_PYTHON = "/usr/bin/python3"

DDP_SCRIPT = """
import os
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")  # env:// from RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
rank, world = dist.get_rank(), dist.get_world_size()
assert rank == int(os.environ["RANK"]) and world == int(os.environ["WORLD_SIZE"])
torch.manual_seed(0)
model = DDP(torch.nn.Linear(4, 1))
x = torch.full((8, 4), float(rank + 1))
model(x).sum().backward()
t = torch.tensor([float(rank)])
dist.all_reduce(t)
grad = model.module.weight.grad[0, 0].item()
print(f"rank={rank} world={world} sum={t.item():g} grad={grad:g} "
      f"local={os.environ['LOCAL_RANK']} restart={os.environ['TORCHELASTIC_RESTART_COUNT']}")
dist.destroy_process_group()
"""


def have_torch():
    try:
        return subprocess.run([TORCH_PYTHON, "-c", "import torch.distributed"],
                              capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@unittest.skipUnless(have_torch(), "python3-torch is not installed")
class Torch(dltest.Case):
    def test_ddp_gloo_script_runs_unchanged(self):
        script = self.write("ddp.py", DDP_SCRIPT)
        p = self.dlaunch("--nproc-per-node", "3", "--", TORCH_PYTHON, script, timeout=240,
                         check_code=0)
        # DDP averages gradients: d/dw of sum over 8 rows of x = 8 * (rank + 1), mean over
        # ranks 1, 2, 3 -> 16. The all-reduced ranks 0 + 1 + 2 = 3.
        for rank in range(3):
            self.assertIn(f"[rank {rank}] rank={rank} world=3 sum=3 grad=16 local={rank} "
                          f"restart=0", p.stdout)


if __name__ == "__main__":
    dltest.main()
