"""Health beats: lines of figures on DLAUNCH_HEALTH_FD, the format of diag/diag.h
(docs/diagnostics.md), which the agent's hang watchdog and straggler rule read."""
from __future__ import annotations

import atexit
import os
import time

# A line at most this often, covering the steps since the one before: a step a millisecond
# would otherwise fill the pipe faster than the agent drains it (trainer/beat.c does the same).
BEAT_EVERY_S = 0.1

# The pipes closed at exit, once each however many Beats share one. Closing tells the agent
# this rank will beat no more: an interpreter that takes longer than --health-timeout to exit
# (torch's teardown on a loaded machine) is then not killed as hung (docs/python.md).
_closing: set[int] = set()
_closed: set[int] = set()


def _close_at_exit(fd: int) -> None:
    _closed.add(fd)
    try:
        os.close(fd)
    except OSError:  # the program closed it itself: the agent has its end of file already
        pass


class Beats:
    """Sums a rank's steps and writes them as one line now and then. Not thread-safe: call
    from the training loop's thread."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.step = 0
        self._steps = 0
        self._compute_s = 0.0
        self._wait_s = 0.0
        self._samples = 0.0
        self._last = 0.0
        self.lines = 0
        os.set_blocking(fd, False)  # a full pipe drops a line (the sums carry over), never blocks
        if fd not in _closing:
            _closing.add(fd)
            atexit.register(_close_at_exit, fd)

    @classmethod
    def from_env(cls) -> Beats | None:
        """The beats of DLAUNCH_HEALTH_FD, or None when dlaunch gave no pipe."""
        v = os.environ.get("DLAUNCH_HEALTH_FD", "")
        if not v.isdigit():
            return None
        fd = int(v)
        try:
            os.fstat(fd)
        except OSError:
            return None
        return cls(fd)

    def add(self, compute_s: float, wait_s: float, samples: float, now: float | None = None,
            force: bool = False) -> None:
        """One step done: compute_s outside collectives, wait_s inside them."""
        self.add_steps(1, compute_s, wait_s, samples, now, force)

    def add_steps(self, steps: int, compute_s: float, wait_s: float, samples: float,
                  now: float | None = None, force: bool = False) -> None:
        """steps steps done, their times and samples summed (a caller that keeps the sums
        itself hands them over every BEAT_EVERY_S, with force: a line now)."""
        self.step += steps
        self._steps += steps
        self._compute_s += max(compute_s, 0.0)
        self._wait_s += max(wait_s, 0.0)
        self._samples += samples
        now = time.monotonic() if now is None else now
        if not force and self.lines > 0 and now - self._last < BEAT_EVERY_S:
            return
        if self.fd in _closed:  # past exit's close: the number may be another file's now
            self.add = self.add_steps = _no_beat  # type: ignore[method-assign]
            return
        k = self._steps
        line = (f"step={self.step} steps={k} compute_ms={self._compute_s * 1e3 / k:.4f} "
                f"wait_ms={self._wait_s * 1e3 / k:.4f} samples={self._samples / k:.6g}\n")
        try:
            os.write(self.fd, line.encode())  # one write: a line never arrives in two pieces
        except BlockingIOError:
            return  # the agent is behind: the next line covers these steps too
        except OSError:
            self.fd = -1
            self.add = self.add_steps = _no_beat  # type: ignore[method-assign]  # no watchdog
            return
        self.lines += 1
        self._last = now
        self._steps = 0
        self._compute_s = self._wait_s = self._samples = 0.0


def _no_beat(*args: object, **kwargs: object) -> None:
    return None
