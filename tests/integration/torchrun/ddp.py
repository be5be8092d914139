"""An unmodified DDP-style worker: joins the gloo group by the init method given (env:// or
tcp://MASTER_ADDR:MASTER_PORT), sums its rank over all ranks, and rank 0 writes the sum."""
import os
import sys

import torch
import torch.distributed as dist

method = sys.argv[1]
out = sys.argv[2]
if method == "tcp":
    dist.init_process_group("gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:"
                            f"{os.environ['MASTER_PORT']}", rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]))
else:
    dist.init_process_group("gloo", init_method="env://")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
if dist.get_rank() == 0:
    with open(out, "w") as f:
        f.write(f"{int(t.item())}\n")
dist.destroy_process_group()
