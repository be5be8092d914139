"""A worker of the file-timer tests: each rank takes a timer through torch's FileTimerClient on
TORCHELASTIC_TIMER_FILE; rank 1 (with argv[1] == "overrun") sleeps past its expiry and must be
killed by the agent; the others release theirs and finish."""
import os
import signal
import sys
import time

from torch.distributed.elastic.timer import FileTimerClient

rank = int(os.environ["RANK"])
client = FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"], signal=signal.SIGKILL)
if rank == 1 and sys.argv[1:] == ["overrun"]:
    client.acquire("slow_step", time.time() + 1.0)
    print(f"rank {rank} sleeping", flush=True)
    time.sleep(60)
    print(f"rank {rank} was never killed", flush=True)
    sys.exit(0)
client.acquire("fast_step", time.time() + 30.0)
client.release("fast_step")
print(f"rank {rank} done", flush=True)
