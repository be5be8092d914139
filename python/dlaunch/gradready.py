"""DDP's gradient buckets in the flight recorder, DDP's own all-reduce left as it is: a gradient
hook on each parameter sees it become ready, and so the moment DDP starts each bucket's
all-reduce; a callback queued behind DDP's own at the end of the backward pass sees every bucket
done (docs/python.md, "Gradient buckets").

DDP starts bucket b's all-reduce once all its parameters' gradients are ready and every bucket
before b has started. A tensor hook runs just before its gradient is accumulated and DDP's hook
just after, so when the hook of the last of a bucket's parameters runs, the bucket starts next:
the recorder says "entered" a few microseconds before the process group sees the call. DDP waits
for every bucket in a callback it queues at the end of the backward pass once all buckets are
ready; final callbacks run in order and one may queue another, so a callback queued at the
step's first gradient queues a second one, which runs after DDP's.

A communication hook would have given the same moments, but in PyTorch 1.13 any Python hook
takes DDP's all-reduce out of C++ (its scaling fused into the copy into the bucket, its future
kept in C++), and DDP takes one hook only, so a user's own and ours excluded each other; this
leaves DDP as it is and costs a small model slightly less (docs/performance.md). Once a step
has shown which gradient starts each bucket, one Python call a bucket a backward pass is left
(GradReady, below)."""
from __future__ import annotations

import functools
import time
from typing import Any, Callable

import torch as _torch

from . import recorder as _rec
from .recorder import Recorder

_now_ns = time.monotonic_ns


class GradReady:
    """The buckets of one DDP model and how far this backward pass has started them. The
    recorder is the watch's (None: none), and wait_ns the time with buckets in flight, which
    the watch takes at each step.

    Counting, each parameter's gradient is counted against its bucket; a step in which every
    bucket was started by a gradient, on the layout DDP keeps, teaches which parameter's
    gradient starts which buckets, and from the next step on only those parameters are hooked
    (a Python call a bucket instead of one a parameter). That assumes the next backward passes
    run in the same order, as a static graph's do; a bucket whose parameter comes late or never
    (an order changed, a parameter unused this step) sends the watch back to counting."""

    def __init__(self, model: Any, recorder: Recorder | None,
                 warn: Callable[[str], None]) -> None:
        self.model = model
        self.recorder = recorder
        self.warn = warn
        self.wait_ns = 0  # time with buckets in flight, until the watch takes it (CLOCK_MONOTONIC)
        self._wait_from = 0
        self._queue = _torch.autograd.Variable._execution_engine.queue_callback
        # The first callback only queues the second (which so runs after DDP's): a C partial,
        # no Python frame.
        self._before_ddp = functools.partial(self._queue, self._after_ddp)
        self._rebuilt = bool(getattr(model, "_has_rebuilt_buckets", False))
        self._params = [p for p in model.parameters() if p.requires_grad]
        self._number = {id(p): i for i, p in enumerate(self._params)}
        self.bucket_of: list[int] = []  # by parameter number; -1: in no bucket
        self.sizes: list[int] = []  # parameters a bucket
        self.nbytes: list[int] = []
        self._layout()
        self.armed = False  # a forward pass whose backward DDP reduces came first
        self._first = True  # no gradient of this backward pass yet
        self._left: list[int] = []  # parameters still to come, by bucket
        self._next = 0  # the first bucket not started
        # Sequence numbers of the buckets started, not seen done (without a recorder, only
        # their count matters).
        self._open: list[int] = []
        self._starter: list[int] = []  # counting: the parameter whose gradient started a bucket
        self._off_order = False  # a learned parameter came before its buckets' turn
        self.counting = True
        self._handles: list[Any] = []
        self._count_all()

    def _layout(self) -> None:
        """DDP's buckets as they are now: it lays them out again once, in the second step's
        forward, in the order the first step's gradients came in. Reading them allocates a
        zeroed copy of the buckets, so it is done at watch() and after that rebuild only."""
        bucket_of = [-1] * len(self._params)
        sizes: list[int] = []
        nbytes: list[int] = []
        for b, gb in enumerate(self.model.reducer._get_zeros_like_grad_buckets()):
            n = 0
            for p in gb.parameters():
                i = self._number.get(id(p))
                if i is not None:
                    bucket_of[i] = b
                    n += 1
            sizes.append(n)
            t = gb.buffer()
            nbytes.append(t.numel() * t.element_size())
        self.bucket_of, self.sizes, self.nbytes = bucket_of, sizes, nbytes

    def _layout_final(self) -> bool:
        """Whether DDP will not lay its buckets out again: it has, or it never does (when it
        looks for unused parameters without a static graph)."""
        m = self.model
        return self._rebuilt or (bool(getattr(m, "find_unused_parameters", False))
                                 and not getattr(m, "static_graph", False))

    def _unhook(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def _count_all(self) -> None:
        self._unhook()
        self.counting = True
        self._handles = [p.register_hook(self._counter(i)) for i, p in enumerate(self._params)
                         if self.bucket_of[i] >= 0]

    def _learn(self) -> None:
        """Hooks only the parameters that started buckets this step (each starts a run of
        buckets in order: the ones complete before it)."""
        runs: list[tuple[int, int, int]] = []  # parameter, first bucket, last bucket
        for b, i in enumerate(self._starter):
            if runs and runs[-1][0] == i:
                runs[-1] = (i, runs[-1][1], b)
            else:
                runs.append((i, b, b))
        self._unhook()
        self.counting = False
        self._handles = [self._params[i].register_hook(self._trigger(first, last))
                         for i, first, last in runs]

    def arm(self) -> None:
        """A forward pass whose backward DDP will reduce begins. Buckets still open are those of
        a backward pass that did not finish (it raised, or DDP's wait for them did): failed."""
        if self._open:
            self._end_open(False)
        self.armed = True
        self._first = True
        self._next = 0

    def disarm(self) -> None:
        """A forward pass under no_sync() or without gradients: DDP reduces nothing after it."""
        self.armed = False

    def _counter(self, i: int) -> Callable[[_torch.Tensor], None]:
        def ready(grad: _torch.Tensor) -> None:
            if not self.armed:
                return
            if self._first:
                self._begin()
                if not self.armed:
                    return
            b = self.bucket_of[i]
            left = self._left
            left[b] -= 1
            if left[b] == 0 and b == self._next:
                self._start_ready(i)
        return ready

    def _trigger(self, first: int, last: int) -> Callable[[_torch.Tensor], None]:
        rec = self.recorder
        if first == last and rec is not None:
            return self._trigger_one(rec, first)

        def ready(grad: _torch.Tensor) -> None:
            if not self.armed:
                return
            if self._first:  # learned on the layout DDP keeps: nothing to read again
                self._first = False
                self._queue(self._before_ddp)
            if self._next != first:
                self._off_order = True
            self._start_below(last + 1)
        return ready

    def _trigger_one(self, rec: Recorder, b: int) -> Callable[[_torch.Tensor], None]:
        """A learned hook that starts bucket b alone (every bucket of a one-bucket model, and
        most of a larger one's). In order, it writes the entry itself, as
        Recorder.start() does, without the calls: a Python call in the backward pass costs
        microseconds, and this took the hook from 26 to 15 us a step
        (docs/performance.md)."""
        words, versions, ops = rec._words, rec._versions, rec._open
        nbytes = self.nbytes[b]  # learned on the layout DDP keeps
        queue, before = self._queue, self._before_ddp
        running, head, no_root = _rec.ALL_REDUCE_RUNNING, _rec.ALL_REDUCE_HEAD, _rec.NO_ROOT
        base, stride, issued = _rec.ENTRY_WORD, _rec.ENTRY_WORDS, _rec.ISSUED_WORD
        capacity, after = _rec.CAPACITY, b + 1

        def ready(grad: _torch.Tensor) -> None:
            if not self.armed:
                return
            if self._first:
                self._first = False
                queue(before)
            if self._next != b:
                self._off_order = True
                self._start_below(after)
                return
            now = _now_ns()
            open_ = self._open
            if not open_:
                self._wait_from = now
            rec.seq = seq = rec.seq + 1
            slot = seq % capacity
            i = base + slot * stride
            ver = versions[slot] + 2
            versions[slot] = ver
            ops[slot] = (seq, head, no_root)
            words[i] = running | (ver - 1)
            words[i + 1] = seq
            words[i + 2] = nbytes
            words[i + 3] = now
            words[i + 4] = 0
            words[i + 5] = no_root
            words[i] = running | ver
            words[issued] = seq
            open_.append(seq)
            self._next = after
        return ready

    def _begin(self) -> None:
        """Counting, the backward pass's first gradient."""
        self._first = False
        rebuilt = bool(getattr(self.model, "_has_rebuilt_buckets", False))
        if rebuilt != self._rebuilt:
            self._rebuilt = rebuilt
            try:
                self._layout()
            except (AttributeError, RuntimeError, TypeError) as e:
                # Inside the backward pass: raising would fail the user's step.
                self.warn(f"gradient buckets no longer recorded: {e}")
                self.armed = False
                self._unhook()
                return
        self._left = self.sizes[:]
        self._starter = [-1] * len(self.sizes)
        self._queue(self._before_ddp)

    def _start_below(self, end: int) -> None:
        """Records the buckets from the next one up to end (not included) started. The
        recorder is written here and in _end_open directly, not through the watch's op_start
        and op_end with their lock: these run on the training thread only, and each call
        less in the backward pass counts (docs/performance.md)."""
        first = self._next
        end = min(end, len(self.nbytes))
        if first >= end:
            return
        now = _now_ns()
        open_ = self._open
        if not open_:
            self._wait_from = now
        rec = self.recorder
        if rec is not None:
            nbytes = self.nbytes
            for k in range(first, end):
                open_.append(rec.start(_rec.ALL_REDUCE, nbytes[k], -1, now))
        else:
            open_.extend(range(first, end))
        self._next = end

    def _end_open(self, ok: bool) -> None:
        now = _now_ns()
        if self.recorder is not None:
            for seq in self._open:
                self.recorder.end(seq, ok, now)
        self.wait_ns += now - self._wait_from
        self._open = []

    def _start_ready(self, i: int) -> None:
        """Counting: parameter i's gradient completed the next bucket, and maybe more after it."""
        left, end = self._left, self._next
        while end < len(left) and left[end] <= 0:
            self._starter[end] = i
            end += 1
        self._start_below(end)

    def _after_ddp(self) -> None:
        """DDP has waited for every bucket. One whose parameters did not all get a gradient
        (unused this step: DDP marks those ready itself) is recorded as started only now."""
        late = self._next < len(self.nbytes)
        if late:
            self._start_below(len(self.nbytes))
        open_ = self._open
        rec = self.recorder
        if rec is not None and len(open_) == 1:
            # _end_open(True) with Recorder.end() inline: a lone bucket, the usual case, where
            # each call in the backward pass counts.
            now = _now_ns()
            seq = open_[0]
            slot = seq % _rec.CAPACITY
            if rec._open[slot][0] == seq:
                i = _rec.ENTRY_WORD + slot * _rec.ENTRY_WORDS
                versions = rec._versions
                ver = versions[slot] + 2
                versions[slot] = ver
                words = rec._words
                words[i] = _rec.ALL_REDUCE_DONE | (ver - 1)
                words[i + 4] = now
                words[i] = _rec.ALL_REDUCE_DONE | ver
            self.wait_ns += now - self._wait_from
            self._open = []
        elif open_:
            self._end_open(True)
        self.armed = False
        if self.counting:
            if not late and self._layout_final():
                self._learn()
        elif late or self._off_order:
            self._count_all()
        self._off_order = False

    def remove(self) -> None:
        """Takes the gradient hooks off (Watch.close)."""
        self._unhook()
