"""One call for a PyTorch DDP job: `dlaunch.torch.watch(ddp_model)` after init_process_group.

It hooks PyTorch only where PyTorch offers hooks: gradient hooks on a DDP model's parameters
and a callback at the end of each backward pass (each gradient bucket's all-reduce, recorded as
DDP starts it and when this rank sees it done, DDP's own all-reduce left as it is:
gradready.py), a forward pre-hook on the model (a step starts where a forward starts, and the
batch's first dimension is its samples), the optimizer's step hook where PyTorch has one (2.0
and later), and the public functions of torch.distributed, wrapped where they are looked up
(torch.distributed.all_reduce and the others; a name imported before watch() keeps the
unwrapped function). docs/python.md."""
from __future__ import annotations

import atexit
import functools
import os
import sys
import threading
import time
import weakref
from typing import Any, Callable

import torch as _torch
import torch.distributed as _dist

from . import recorder as _rec
from .beat import BEAT_EVERY_S, Beats
from .gradready import GradReady
from .recorder import Recorder
from .recover import Recoverable, RecoveryFailed, wait_as_spare
from .stacks import Stacks

__all__ = ["watch", "step", "Watch", "Recoverable", "RecoveryFailed"]

# torch.distributed's public calls and how the recorder names them.
_WRAPPED = {
    "all_reduce": _rec.ALL_REDUCE, "broadcast": _rec.BROADCAST, "all_gather": _rec.ALL_GATHER,
    "all_gather_into_tensor": _rec.ALL_GATHER, "reduce_scatter": _rec.REDUCE_SCATTER,
    "reduce_scatter_tensor": _rec.REDUCE_SCATTER, "barrier": _rec.BARRIER, "send": _rec.SEND,
    "recv": _rec.RECV, "isend": _rec.SEND, "irecv": _rec.RECV,
}
_ASYNC_ALWAYS = ("isend", "irecv")

_current: Watch | None = None
_now_ns = time.monotonic_ns
_originals: dict[str, Callable[..., Any]] = {}


def _warn(msg: str) -> None:
    print(f"dlaunch: {msg}", file=sys.stderr, flush=True)


def _nbytes(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """This rank's tensor in the call: the first tensor argument (a list is the other side's)."""
    for a in (*args, kwargs.get("tensor"), kwargs.get("output")):
        if isinstance(a, _torch.Tensor):
            return a.numel() * a.element_size()
    return 0


class Watch:
    """What watch() set up for this rank. One a process."""

    def __init__(self, model: Any = None, optimizer: Any = None, group: Any = None,
                 buckets: bool = True) -> None:
        self.group = group
        self.rank = _dist.get_rank(group)
        self.world = _dist.get_world_size(group)
        self._lock = threading.Lock()
        self._inflight = 0
        self._wait_from = 0  # nanoseconds, _now_ns()
        self._wait_ns = 0
        self._samples = 0.0
        self._step_from: int | None = None
        self._sum_steps = 0  # steps not yet handed to the beats
        self._sum_compute_ns = 0
        self._sum_wait_ns = 0
        self._sum_samples = 0.0
        self._beat_due = 0  # _now_ns() from which the next sum is handed over
        self._manual = False
        self._handles: list[Any] = []
        # Our future callbacks that a gloo thread still holds (see _settle_at_exit), and the
        # DDP model, kept until they are let go.
        self._callbacks: weakref.WeakSet[Any] = weakref.WeakSet()
        self._model = model
        self._ready: GradReady | None = None
        self.beats = Beats.from_env()
        self.recorder: Recorder | None = None
        self.stacks: Stacks | None = None
        try:
            self.recorder = Recorder.from_env(self.rank, self.world,
                                              str(_dist.get_backend(group)))
        except OSError as e:
            _warn(f"rank {self.rank}: no flight recorder: {e}")
        try:
            self.stacks = Stacks.from_env(self.rank)
        except (OSError, RuntimeError, ValueError) as e:
            _warn(f"rank {self.rank}: no stacks on request: {e}")
        if model is not None:
            self._hook_model(model, buckets)
        if optimizer is not None and hasattr(optimizer, "register_step_post_hook"):
            self._handles.append(optimizer.register_step_post_hook(lambda *a: self._auto_step()))
            self._by_optimizer = True
        else:
            self._by_optimizer = False

    # ---- collectives ------------------------------------------------------------------------

    def op_start(self, op: int, nbytes: int, root: int = -1) -> int:
        # One clock read serves the wait time and the recorder (CLOCK_MONOTONIC, nanoseconds).
        now = _now_ns()
        with self._lock:
            if self._inflight == 0:
                self._wait_from = now
            self._inflight += 1
            return self.recorder.start(op, nbytes, root, now) if self.recorder else 0

    def op_end(self, seq: int, ok: bool = True) -> None:
        now = _now_ns()
        with self._lock:
            if self.recorder is not None and seq:
                self.recorder.end(seq, ok, now)
            self._inflight -= 1
            if self._inflight == 0:
                self._wait_ns += now - self._wait_from

    # ---- steps ------------------------------------------------------------------------------

    def step(self, samples: float | None = None) -> None:
        """One step ended (and the next begins)."""
        now = _now_ns()
        if samples is not None:
            self._samples = samples
        if self._step_from is None:
            self._step_from = now
            return
        wait = 0
        # torch.distributed calls' wait: most steps have none, and one that starts on another
        # thread just after this look counts in the next step.
        if self._inflight or self._wait_ns:
            with self._lock:
                wait = self._wait_ns
                if self._inflight > 0:  # an operation spans the boundary: split it
                    wait += now - self._wait_from
                    self._wait_from = now
                self._wait_ns = 0
        r = self._ready
        if r is not None and r.wait_ns:  # the buckets' (summed apart, on this thread)
            wait += r.wait_ns
            r.wait_ns = 0
        took = now - self._step_from
        self._step_from = now
        if self.beats is None:
            return
        # The steps are summed here and handed to the beats when a line is due: one Python call
        # less a step, which runs from cold caches (docs/performance.md).
        wait = min(wait, took)
        self._sum_steps += 1
        self._sum_compute_ns += took - wait
        self._sum_wait_ns += wait
        self._sum_samples += self._samples
        if now >= self._beat_due:
            self._beat_due = now + int(BEAT_EVERY_S * 1e9)
            self.beats.add_steps(self._sum_steps, self._sum_compute_ns * 1e-9,
                                 self._sum_wait_ns * 1e-9, self._sum_samples, now * 1e-9,
                                 force=True)
            self._sum_steps = self._sum_compute_ns = self._sum_wait_ns = 0
            self._sum_samples = 0.0

    def _auto_step(self) -> None:
        if not self._manual:
            self.step()

    def _hook_model(self, model: Any, buckets: bool) -> None:
        def pre_forward(module: Any, args: tuple[Any, ...]) -> None:
            if args:
                x = args[0]
                if isinstance(x, _torch.Tensor) and x.dim() > 0:
                    self._samples = float(x.size(0))
            if not self._by_optimizer and not self._manual:
                self.step()
            r = self._ready
            if r is not None:
                if module.require_backward_grad_sync and _torch.is_grad_enabled():
                    r.arm()
                else:
                    r.disarm()
        self._handles.append(model.register_forward_pre_hook(pre_forward))
        if buckets and isinstance(model, _torch.nn.parallel.DistributedDataParallel):
            try:
                self._ready = GradReady(model, self.recorder,
                                        lambda msg: _warn(f"rank {self.rank}: {msg}"))
            except (AttributeError, RuntimeError, TypeError) as e:  # a DDP unlike 1.13's
                _warn(f"rank {self.rank}: gradient buckets not recorded: {e}")
                return
            self._handles.append(self._ready)

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def callback(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """fn, to be handed to a future; counted until the thread that ran it lets it go."""
        self._callbacks.add(fn)
        return fn

    def settle(self, timeout: float) -> int:
        """Waits, without the GIL, until no callback of ours is held by a backend thread; the
        ones still held after timeout seconds."""
        deadline = time.monotonic() + timeout
        while len(self._callbacks) > 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        return len(self._callbacks)


# Why the wait at exit: a Python callback on a collective's future runs on the backend's thread
# (gloo's worker), which takes the GIL to run it and again to let it go, after the future is
# already complete. The process group's C++ destructor joins those threads while holding the GIL
# (it runs when the last reference goes: the DDP model's reducer, at the end of main() or in the
# interpreter's teardown), so a worker still on its way to the GIL then never gets it and the
# process never exits. Before any of that, while the interpreter still hands the GIL around, we
# wait for every callback to be let go, and keep the model (and so its process group) alive
# until then: it is destroyed in the teardown, with its threads idle.
SETTLE_AT_EXIT_S = 10.0


def _settle_at_exit() -> None:
    w = _current
    if w is None:
        return
    left = w.settle(SETTLE_AT_EXIT_S)
    if left:
        _warn(f"rank {w.rank}: {left} collectives still unfinished at exit after "
              f"{SETTLE_AT_EXIT_S:.0f} s; exit may hang in the process group's destructor")


def _wrap(name: str, op: int, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        w = _current
        if w is None:
            return fn(*args, **kwargs)
        root = -1
        if op == _rec.BROADCAST:
            root = int(kwargs.get("src", args[1] if len(args) > 1 else -1))
        seq = w.op_start(op, _nbytes(args, kwargs), root)
        try:
            r = fn(*args, **kwargs)
        except BaseException:
            w.op_end(seq, False)
            raise
        if r is None or not (kwargs.get("async_op") or name in _ASYNC_ALWAYS):
            w.op_end(seq, True)
            return r
        try:
            fut = r.get_future()
        except RuntimeError:  # gloo's point-to-point work has no future: issue time only
            w.op_end(seq, True)
            return r
        fut.add_done_callback(w.callback(lambda f: w.op_end(seq, f.done())))
        return r
    return call


def watch(model: Any = None, optimizer: Any = None, group: Any = None,
          buckets: bool = True) -> Watch | None:
    """Starts watching this rank: beats every step, its collectives in the flight recorder, its
    stacks on the agent's request. Call after init_process_group; model is the
    DistributedDataParallel module (or any module whose forward starts a step), optimizer (with
    PyTorch 2.0 or later) ends a step at its step(). buckets=False leaves out the gradient hooks
    (a Python call a bucket a step, or a parameter until a step has shown which gradient starts
    each bucket: docs/python.md); the buckets' all-reduces are then
    not in the recorder, nor in the wait time. Outside dlaunch, returns None and changes
    nothing."""
    global _current
    if _current is not None:
        return _current
    if "DLAUNCH_ATTEMPT_DIR" not in os.environ and "DLAUNCH_HEALTH_FD" not in os.environ:
        return None
    if not _dist.is_initialized():
        raise RuntimeError("dlaunch.torch.watch: call it after init_process_group")
    for name, op in _WRAPPED.items():
        fn = getattr(_dist, name, None)
        if fn is not None and name not in _originals:
            _originals[name] = fn
            setattr(_dist, name, _wrap(name, op, fn))
    _current = Watch(model, optimizer, group, buckets)
    atexit.register(_settle_at_exit)
    return _current


def step(samples: float | None = None) -> None:
    """Ends a step by hand (then only these calls count steps)."""
    w = _current
    if w is not None:
        w._manual = True
        w.step(samples)


# A hot spare stops here, its imports loaded, until it has a rank (docs/recovery.md): import
# dlaunch.torch before reading RANK and the rest.
wait_as_spare()
