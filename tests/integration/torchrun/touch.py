"""A worker as PyTorch's launcher tests have one: checks the environment a launcher must give,
then touches a file named by its global rank (holding MASTER_ADDR:MASTER_PORT), or fails.

Only --fail imports torch, for @record (whose error file the launcher must read): the import
costs each worker about 2 s of CPU, and torch.distributed.is_torchelastic_launched() is nothing
but TORCHELASTIC_RUN_ID being set, which NEEDED checks in every run."""
import argparse
import os
import sys

NEEDED = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
          "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
          "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--touch-file-dir")
    p.add_argument("--fail", action="store_true")
    args = p.parse_args()
    missing = [v for v in NEEDED if v not in os.environ]
    if missing:
        sys.exit(f"missing {missing}")
    if os.environ.get("TEST_SENTINEL_PARENT") != "FOOBAR":
        sys.exit("the launcher's own environment did not reach the worker")
    if args.fail:
        fail()
    with open(os.path.join(args.touch_file_dir, os.environ["RANK"]), "w") as f:
        f.write(f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}\n")


def fail():
    try:
        import torch.distributed as dist
        from torch.distributed.elastic.multiprocessing.errors import record
    except ImportError:  # where python3-torch is missing, the launcher is tested all the same
        dist = None

        def record(fn):
            return fn

    @record
    def failing():
        if dist is not None and not dist.is_torchelastic_launched():
            sys.exit("torch.distributed.is_torchelastic_launched() is false")
        raise RuntimeError(f"rank {os.environ['RANK']} fails on purpose")
    failing()


if __name__ == "__main__":
    main()
