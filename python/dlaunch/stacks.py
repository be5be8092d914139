"""Python stacks on request: faulthandler, registered for one signal, writes every thread's
stack into DLAUNCH_ATTEMPT_DIR/rank_R.stacks from inside the signal handler, in C, so it works
while the rank sleeps, waits in C++ or holds the GIL. The file's first line tells the agent
which signal to send and to which process:

    dlaunch-stacks 1 signal=40 pid=12345

and each dump follows it, as faulthandler writes them ("Thread 0x... (most recent call first):"
then one `  File "x.py", line N in f` line a frame, innermost first)."""
from __future__ import annotations

import faulthandler
import os
import signal

# A real-time signal that nothing else in a PyTorch job uses (SIGUSR1 and SIGUSR2 are often
# taken); its default action would end the process, so the agent sends it only to a process
# whose file names it.
STACK_SIGNAL = signal.SIGRTMIN + 6


class Stacks:
    def __init__(self, path: str) -> None:
        self.path = path
        self.file = open(path, "w", encoding="ascii")  # kept open for the handler
        self.file.write(f"dlaunch-stacks 1 signal={int(STACK_SIGNAL)} pid={os.getpid()}\n")
        self.file.flush()
        faulthandler.register(STACK_SIGNAL, file=self.file, all_threads=True, chain=False)

    @classmethod
    def from_env(cls, rank: int) -> Stacks | None:
        d = os.environ.get("DLAUNCH_ATTEMPT_DIR")
        if not d:
            return None
        return cls(os.path.join(d, f"rank_{rank}.stacks"))
