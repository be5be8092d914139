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

# An entry's words: the head (ver, op, state, algo, dtype: one word, as the C writer stores
# it), seq, bytes, t_start, t_end, error and root (32 bits each), two reserved.
_HEADER = struct.Struct("<IIIIiiiIQQQ16s")  # after the magic
# Public, with what follows, for a writer that inlines start() or end() of one all-reduce
# (gradready.py's learned hook, where every Python call in the backward pass costs
# microseconds): it keeps the recorder's words, versions and open operations (_words,
# _versions, _open) as those do.
ENTRY_WORD = HEADER_BYTES // 8
ENTRY_WORDS = ENTRY_BYTES // 8
ISSUED_WORD = ISSUED_AT // 8
ALL_REDUCE_HEAD = ALL_REDUCE << 32
NO_ROOT = 0xFFFFFFFF << 32  # root -1 in its half word, error 0
ALL_REDUCE_RUNNING = ALL_REDUCE_HEAD | RUNNING << 40
ALL_REDUCE_DONE = ALL_REDUCE_HEAD | DONE << 40


class Recorder:
    """Writes operations as they start and end. The training loop starts them and PyTorch's
    completion threads may end them: dlaunch.torch's Watch holds a lock around each start() and
    end(). DDP's buckets (dlaunch.gradready) are written on the training thread without
    it, which is safe beside the locked calls: each operation has its slot to itself
    (64 operations apart), and a sequence number is taken in one read-add-store with no call
    between, where the interpreter does not switch threads."""

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
        # The page as 64-bit words in native order, the C writer's: every field of an entry is
        # a word (or two 32-bit halves of one), so writing one is a single store, far cheaper
        # from Python than a struct.pack_into. Kept for the recorder's life (the map cannot be
        # closed while it is exported).
        self._words = memoryview(m).cast("Q")
        # What this writer last wrote in each slot (the file is ours alone: flock), so that
        # writing an entry reads nothing back from the page: its version, and of the operation
        # in it the sequence number, the op's bits of the head word and the root's half word.
        self._versions = [0] * CAPACITY
        self._open: list[tuple[int, int, int]] = [(0, 0, 0)] * CAPACITY

    def start(self, op: int, nbytes: int, root: int = -1, now_ns: int = 0) -> int:
        """Records operation op as entered at now_ns (CLOCK_MONOTONIC; 0: now); returns its
        sequence number."""
        self.seq = seq = self.seq + 1
        slot = seq % CAPACITY
        w = self._words
        i = ENTRY_WORD + slot * ENTRY_WORDS
        ver = self._versions[slot] + 2
        self._versions[slot] = ver
        head = op << 32
        root_bits = (root & 0xFFFFFFFF) << 32
        self._open[slot] = (seq, head, root_bits)
        head |= RUNNING << 40
        w[i] = head | (ver - 1)  # odd: being changed
        w[i + 1] = seq
        w[i + 2] = nbytes
        w[i + 3] = now_ns or time.monotonic_ns()
        w[i + 4] = 0
        w[i + 5] = root_bits  # error 0
        w[i] = head | ver  # even again, with what changed
        w[ISSUED_WORD] = seq
        return seq

    def end(self, seq: int, ok: bool = True, now_ns: int = 0) -> None:
        """Records operation seq as done (or failed) at now_ns (0: now), unless the ring has
        moved past it."""
        slot = seq % CAPACITY
        got, head, root_bits = self._open[slot]
        if got != seq:
            return
        w = self._words
        i = ENTRY_WORD + slot * ENTRY_WORDS
        ver = self._versions[slot] + 2
        self._versions[slot] = ver
        head |= (DONE if ok else FAILED) << 40
        w[i] = head | (ver - 1)
        w[i + 4] = now_ns or time.monotonic_ns()
        if not ok:
            w[i + 5] = root_bits | (-5 & 0xFFFFFFFF)  # -EIO
        w[i] = head | ver

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
