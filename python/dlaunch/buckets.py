"""DDP's gradient buckets in the flight recorder, through a communication hook that costs about
what DDP's own C++ all-reduce does (docs/python.md, "Gradient buckets").

PyTorch 1.13's reducer takes only a future whose value is a Python object from a Python hook,
and the usual way to make one, `work.get_future().then(callback)`, runs the callback on gloo's
thread: it takes the GIL there, hands it back, and the reducer takes it again to unwrap the value;
that costs a small model more than the recording does. Instead each bucket's hook starts the
all-reduce and returns a future of our own, still pending; the hook of the step's last bucket
waits for every all-reduce of the step on the training thread (where the reducer would wait for
them a moment later anyway) and completes the futures there. No Python ever runs on gloo's
threads for a bucket, and the overlap of the all-reduces with the rest of the backward pass is
kept: only the last bucket, whose all-reduce nothing can overlap, is waited for in the hook."""
from __future__ import annotations

from typing import Any, Callable

import torch as _torch
import torch.distributed as _dist

from . import recorder as _rec

# The C future itself (torch.futures.Future is a Python subclass whose constructor and
# set_result add a Python call each, about half the cost of a future here); DDP takes either.
_Future = _torch._C.Future
_ALL_REDUCE = _rec.ALL_REDUCE

# A bucket still pending: its sequence number in the recorder, the process group's Work, our
# future and the bucket's tensor (a plain tuple: cheaper to make than a NamedTuple).
_Pending = tuple[int, Any, Any, _torch.Tensor]


class Buckets:
    """The hook's state: the DDP model's process group and the step's buckets still pending.
    op_start and op_end are the watch's (recorder and wait time)."""

    def __init__(self, group: Any, op_start: Callable[[int, int], int],
                 op_end: Callable[[int, bool], None]) -> None:
        self.group = group  # the ProcessGroup object itself (DDP's process_group)
        # Bound once: each attribute lookup and method binding is paid every bucket otherwise.
        self.allreduce = group.allreduce
        # DDP's default multiplies each gradient by 1/world as it copies it into the bucket; the
        # same product here keeps the result bitwise DDP's own.
        self.scale = 1.0 / _dist.get_world_size(group)
        self.op_start = op_start
        self.op_end = op_end
        self.pending: list[_Pending] = []

    def finish(self, p: _Pending) -> None:
        """Waits for one bucket's all-reduce and completes its future, recorded done or
        failed."""
        seq, work, fut, t = p
        try:
            work.wait()
        except Exception as e:  # the group failed under it: so does the bucket
            self.op_end(seq, False)
            fut.set_exception(e)
            return
        self.op_end(seq, True)
        fut.set_result(t)

    def collect(self, done_only: bool) -> None:
        """Completes the pending buckets' futures: those already done, or every one, waiting
        for each in turn."""
        keep: list[_Pending] = []
        for p in self.pending:
            if done_only and not p[1].is_completed():
                keep.append(p)
            else:
                self.finish(p)
        self.pending = keep

    def abandon(self) -> None:
        """The pending buckets of a backward pass that ended before its last bucket (it
        raised): nobody waits for their futures now; recorded as failed."""
        for p in self.pending:
            self.op_end(p[0], False)
        self.pending = []


def hook(state, bucket):  # type: ignore[no-untyped-def]
    """DDP's default (the bucket averaged over the ranks), recorded from the moment this rank
    enters each all-reduce to the moment it sees the result. Without annotations: DDP refuses
    a hook whose annotations are not its own classes, and this module's are strings.
    Every call here is paid once a bucket, a few microseconds in all (docs/performance.md): a
    bucket's index is asked only when buckets are pending, which at a step's first bucket
    means that the last backward pass raised before its end."""
    b: Buckets = state
    if b.pending and bucket.index() == 0:
        b.abandon()
    t = bucket.buffer()
    t.mul_(b.scale)
    seq = b.op_start(_ALL_REDUCE, t.numel() * t.element_size())
    # The group's own allreduce (a sum, as DDP's), without torch.distributed's checks in Python:
    # they cost more than the rest of the hook, and DDP has made them when it took the group.
    try:
        work = b.allreduce([t])
    except Exception:
        b.op_end(seq, False)
        raise
    fut = _Future([])
    p = (seq, work, fut, t)
    # Every bucket's all-reduce is started before the last one's hook, and the reducer waits
    # for their futures only after it: waiting here loses no overlap and completes them all.
    if bucket.is_last():
        if b.pending:
            b.pending.append(p)
            b.collect(done_only=False)
        else:  # the step's only bucket, or every earlier one already complete
            b.finish(p)
    else:
        b.pending.append(p)
        b.collect(done_only=True)
    return fut
