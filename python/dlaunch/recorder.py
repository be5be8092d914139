"""The flight recorder: a rank's latest collectives in a shared memory page (a file the agent
maps), in the layout of collective/recorder.h (docs/diagnostics.md, "The flight recorder"), so
that the agent reads a PyTorch rank as it reads the bundled trainer, even while the rank is
stopped or stuck inside C++.

The writer keeps each entry under a sequence lock (its version odd while it changes), as the C
writer does; the agent retries an entry it catches half-written."""
from __future__ import annotations

import fcntl
import mmap
import os
import struct
import time

MAGIC = 0x3130434552464C44  # "DLFREC01" read as little-endian bytes
VERSION = 1
CAPACITY = 64
HEADER_BYTES = 256
ENTRY_BYTES = 64
FILE_BYTES = HEADER_BYTES + CAPACITY * ENTRY_BYTES
TICK_NS = 2  # entries count nanoseconds of CLOCK_MONOTONIC
ISSUED_AT = 128

# Operations and states, as dl_coll_rec_op_t and dl_coll_rec_state_t number them.
ALL_REDUCE, BROADCAST, ALL_GATHER, REDUCE_SCATTER, BARRIER = 1, 2, 3, 4, 5
SEND, RECV = 7, 8
RUNNING, DONE, FAILED = 2, 3, 4

_HEAD = struct.Struct("<IBBBB")           # ver, op, state, algo, dtype
_BODY = struct.Struct("<QQQQii")          # seq, bytes, t_start, t_end, error, root
_HEADER = struct.Struct("<IIIIiiiIQQQ16s")  # after the magic
_VERSION = struct.Struct("<I")
_ISSUED = struct.Struct("<Q")


class Recorder:
    """Writes operations as they start and end. One thread at a time: the training loop starts
    them and PyTorch's completion threads may end them, so a caller on several threads holds a
    lock around each call (dlaunch.torch's Watch does)."""

    def __init__(self, path: str, rank: int, world_size: int, transport: str) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            # One writer a file, as the C writer: a second one would make both unreadable.
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.ftruncate(fd, FILE_BYTES)
            self._map = mmap.mmap(fd, FILE_BYTES, mmap.MAP_SHARED,
                                  mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError:
            os.close(fd)
            raise
        self._fd = fd  # kept open: the lock lives as long as the rank
        m = self._map
        struct.pack_into("<Q", m, 0, 0)  # unreadable until whole again
        m[8:FILE_BYTES] = bytes(FILE_BYTES - 8)
        now = time.monotonic_ns()
        _HEADER.pack_into(m, 8, VERSION, HEADER_BYTES, ENTRY_BYTES, CAPACITY, rank, world_size,
                          os.getpid(), TICK_NS, now, now, time.time_ns(),
                          transport.encode()[:15])
        struct.pack_into("<Q", m, 0, MAGIC)
        self.seq = 0
        self.path = path
        # What this writer last wrote in each slot (the file is ours alone: flock), so that
        # writing an entry reads nothing back from the page.
        self._versions = [0] * CAPACITY
        self._open: list[tuple[int, int, int, int, int]] = [(0, 0, 0, 0, 0)] * CAPACITY

    def start(self, op: int, nbytes: int, root: int = -1) -> int:
        """Records operation op as entered now; returns its sequence number."""
        self.seq += 1
        seq = self.seq
        t_start = time.monotonic_ns()
        self._open[seq % CAPACITY] = (seq, op, nbytes, t_start, root)
        self._write(seq, op, RUNNING, nbytes, t_start, 0, 0, root)
        _ISSUED.pack_into(self._map, ISSUED_AT, seq)
        return seq

    def end(self, seq: int, ok: bool = True) -> None:
        """Records operation seq as done (or failed) now, unless the ring has moved past it."""
        got, op, nbytes, t_start, root = self._open[seq % CAPACITY]
        if got != seq:
            return
        self._write(seq, op, DONE if ok else FAILED, nbytes, t_start, time.monotonic_ns(),
                    0 if ok else -5, root)

    def _write(self, seq: int, op: int, state: int, nbytes: int, t_start: int, t_end: int,
               error: int, root: int) -> None:
        m = self._map
        slot = seq % CAPACITY
        off = HEADER_BYTES + slot * ENTRY_BYTES
        ver = self._versions[slot] + 2
        self._versions[slot] = ver
        _VERSION.pack_into(m, off, ver - 1)  # odd: being changed
        _BODY.pack_into(m, off + 8, seq, nbytes, t_start, t_end, error, root)
        _HEAD.pack_into(m, off, ver, op, state, 0, 0)  # even again, with what changed

    @classmethod
    def from_env(cls, rank: int, world_size: int, transport: str) -> Recorder | None:
        """The recorder where the agent looks for it (DLAUNCH_COLL_RECORDER: auto, the default;
        off; or a file), or None outside dlaunch. Raises OSError when the file cannot be had."""
        want = os.environ.get("DLAUNCH_COLL_RECORDER", "auto")
        if want == "off":
            return None
        if want == "auto":
            d = os.environ.get("DLAUNCH_ATTEMPT_DIR")
            if not d:
                return None
            want = os.path.join(d, f"rank_{rank}.rec")
        return cls(want, rank, world_size, transport)
