"""In-job recovery for a PyTorch DDP job (docs/recovery.md, "PyTorch"): when a rank dies or
hangs, the living ranks keep their processes and their state, form a new gloo process group with
the membership their agent gives them on DLAUNCH_CONTROL_FD, and a replacement takes the model's
and optimizer's state, the sampler's position, the RNG states and the step count from a living
replica by a broadcast over the new group. Every rank then does the interrupted step again.

    job = Recoverable(net, optimizer, sampler=sampler)
    for x, y in job.batches(loader, epochs=3):
        with job.step():
            optimizer.zero_grad()
            loss_fn(job.model(x), y).backward()
            optimizer.step()

The process group is made directly (ProcessGroupGloo over a PrefixStore of the agent's TCPStore,
one prefix a generation), never through torch.distributed's default group, which torch 1.13 cannot
tear down while a collective is pending. gloo has no abort in 1.13: a group is aborted by shutting
down the sockets it opened (read from /proc/self/fd as it is formed), which fails every operation
pending on it at once."""
from __future__ import annotations

import datetime
import gc
import io
import itertools
import os
import queue
import random
import socket
import sys
import threading
import time
from typing import Any, Iterable, Iterator

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler

from . import recorder as _rec
from .beat import Beats
from .recorder import Recorder

__all__ = ["Recoverable", "RecoveryFailed", "wait_as_spare"]

# Store keys of generation G live under this prefix (docs/recovery.md: a group's keys of its own).
STORE_PREFIX = "dlaunch/torch/gen"

# What a gloo operation says when its group broke under it (a peer gone, or our own abort):
# gloo's exceptions name its source file ("[../gloo/transport/tcp/pair.cc:589] Read error ...").
# Anything else raised in a step is the step's own error and goes up as it is.
_BROKEN_WORDS = ("gloo/", "Connection reset by peer", "Connection closed by peer")


class RecoveryFailed(RuntimeError):
    """The group could not be formed again here, or the agent gave the recovery up."""


def _say(msg: str) -> None:
    print(f"dlaunch: {msg}", file=sys.stderr, flush=True)


def _socket_fds() -> dict[int, str]:
    """This process's sockets: fd -> 'socket:[inode]'."""
    found: dict[int, str] = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue  # closed meanwhile, or listdir's own fd
        if link.startswith("socket:"):
            found[int(name)] = link
    return found


def wait_as_spare() -> None:
    """A hot spare (DLAUNCH_SPARE=1, docs/recovery.md): waits, with the program's imports
    loaded, until the agent gives it a failed rank's place and that rank's environment; exits
    when the agent stops it instead."""
    if os.environ.get("DLAUNCH_SPARE") != "1":
        return
    ctl = socket.socket(fileno=int(os.environ["DLAUNCH_CONTROL_FD"]))
    _say(f"spare waiting for a rank's place (pid {os.getpid()}), its imports loaded")
    buf = b""
    try:
        while True:
            data = ctl.recv(65536)
            if not data:
                os._exit(0)  # the agent went, or stopped the attempt: nothing to do
            buf += data
            while b"\n" in buf:
                raw, buf = buf.split(b"\n", 1)
                line = raw.decode(errors="replace")
                if line.startswith("env ") and "=" in line:
                    name, _, value = line[4:].partition("=")
                    os.environ[name] = value
                elif line.startswith("assign"):
                    os.environ.pop("DLAUNCH_SPARE", None)
                    return
                elif line == "stop":
                    os._exit(0)
    finally:
        ctl.detach()  # the descriptor stays: Recoverable's channel is the same one


class _Group:
    """One generation's process group and the sockets gloo opened for it."""

    def __init__(self, gen: int, rank: int, world: int, addr: str, port: int,
                 timeout: datetime.timedelta) -> None:
        self.gen, self.rank, self.world = gen, rank, world
        self.store = dist.TCPStore(addr, port, None, False, timeout)
        before = _socket_fds()
        self.pg = dist.ProcessGroupGloo(dist.PrefixStore(f"{STORE_PREFIX}{gen}", self.store),
                                        rank, world, timeout)
        self.sockets = {fd: link for fd, link in _socket_fds().items()
                        if before.get(fd) != link}
        self.aborted = False

    def abort(self) -> None:
        """Fails every operation pending on the group, from any thread."""
        self.aborted = True
        for fd, link in self.sockets.items():
            try:
                if os.readlink(f"/proc/self/fd/{fd}") != link:
                    continue  # gloo closed it and the number went to something else
                s = socket.socket(fileno=os.dup(fd))
            except OSError:
                continue
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # a listening socket, or one already shut
            finally:
                s.close()


class _Channel:
    """DLAUNCH_CONTROL_FD: lines to the agent, and a thread that reads the agent's."""

    def __init__(self, fd: int, on_recover: Any) -> None:
        self.sock = socket.socket(fileno=fd)
        self.messages: queue.Queue[dict[str, str] | None] = queue.Queue()
        self._on_recover = on_recover
        self._lock = threading.Lock()
        threading.Thread(target=self._read, name="dlaunch-control", daemon=True).start()

    def send(self, line: str) -> None:
        with self._lock:
            try:
                self.sock.sendall((line + "\n").encode())
            except OSError:
                pass  # the agent closed it: it expects nothing more

    def _read(self) -> None:
        buf = b""
        while True:
            try:
                data = self.sock.recv(4096)
            except OSError:
                data = b""
            if not data:
                self.messages.put(None)
                return
            buf += data
            while b"\n" in buf:
                raw, buf = buf.split(b"\n", 1)
                line = raw.decode(errors="replace")
                verb, _, rest = line.partition(" ")
                words: dict[str, str] = {"verb": verb}
                for w in rest.split(" "):
                    key, eq, value = w.partition("=")
                    if key == "reason":  # the rest of the line
                        words["reason"] = rest[rest.index("reason=") + 7:]
                        break
                    if eq:
                        words[key] = value
                if verb == "recover":
                    self._on_recover()  # at once: the main thread may be stuck in the group
                if verb in ("recover", "stop"):
                    self.messages.put(words)


class _StepContext:
    def __init__(self, job: Recoverable) -> None:
        self.job = job

    def __enter__(self) -> _StepContext:
        self.job._step_started()
        return self

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> bool:
        return self.job._step_ended(exc)


class Recoverable:
    """A DDP job that survives a rank's death in-job. model is the plain module (job.model is
    its DistributedDataParallel wrapper, rebuilt with each group: use job.model in every step and
    keep no reference to it); optimizer is built on the module's parameters; sampler (a
    DistributedSampler, or anything with set_epoch, rank and num_replicas) gets the epoch and,
    after a change of world, its new rank and world; state names further objects with
    state_dict() and load_state_dict() (a learning-rate scheduler, a GradScaler) that a
    replacement takes from the replica too.

    Outside dlaunch's in-job mode (no DLAUNCH_CONTROL_FD) it forms the default group from the
    environment and recovers nothing: the same loop runs under torchrun or `--recovery restart`."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 sampler: Any = None, state: dict[str, Any] | None = None,
                 timeout_s: float = 60.0) -> None:
        self.module = model
        self.optimizer = optimizer
        self.sampler = sampler
        self.state = dict(state or {})
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.rank = int(os.environ.get("RANK", "0"))
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.steps = 0          # steps completed
        self.epoch = 0
        self.batch = 0          # batches of this epoch completed
        self.recoveries = 0
        self.source: int | None = None  # the rank a replacement took its state from
        self.group: _Group | None = None
        self.model: DistributedDataParallel
        self._redo = False
        self._graveyard: list[_Group | None] = []  # aborted groups, never destroyed (_recover)
        self._broken_at: float | None = None
        self._channel: _Channel | None = None
        self._in_op = False
        self._op_seq = 0
        self._op_from = 0.0
        self._step_from = 0.0
        self.beats = Beats.from_env()
        try:
            self.recorder = Recorder.from_env(self.rank, self.world, "gloo")
        except OSError as e:
            _say(f"rank {self.rank}: no flight recorder: {e}")
            self.recorder = None
        # A gradient computed is this rank inside the step's all-reduce (DDP starts it then):
        # the agent's hang rule tells the rank that never got there from the ones waiting.
        for p in self.module.parameters():
            if p.requires_grad:
                p.register_hook(self._grad_ready)
        fd = os.environ.get("DLAUNCH_CONTROL_FD", "")
        in_job = os.environ.get("DLAUNCH_RECOVERY") == "in-job" and fd.isdigit()
        if in_job and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
            _say("in-job recovery needs the agent's store (docs/store.md); this job's rank 0 "
                 "hosts it: recovering by restart")
            in_job = False
        if not in_job:
            if not dist.is_initialized():
                dist.init_process_group("gloo", timeout=self.timeout)
            self.rank, self.world = dist.get_rank(), dist.get_world_size()
            self.model = self._ddp(None)
            return
        gen = int(os.environ.get("DLAUNCH_GROUP_GEN", "0"))
        self._channel = _Channel(int(fd), self._abort)
        self._form(gen, self.rank, self.world, os.environ["MASTER_ADDR"],
                   int(os.environ["MASTER_PORT"]), fresh=True)
        self._channel.send(f"hello gen={gen} rank={self.rank} pid={os.getpid()}")
        if gen > 0:  # a replacement: the living ranks wait for it in the group it just formed
            self._channel.send(f"recovered gen={gen} rank={self.rank} step={self.steps} was=-1 "
                               f"source={-1 if self.source is None else self.source} ms=0")
            self._say_going_on(gen, " (this rank's replacement)")

    # ---- the loop -------------------------------------------------------------------------

    def batches(self, loader: Iterable[Any], epochs: int = 1) -> Iterator[Any]:
        """The loader's batches for epochs epochs, from the position the job is at: after a
        recovery, the interrupted batch again (the batches before it are skipped, loaded and
        dropped)."""
        while self.epoch < epochs:
            if self.sampler is not None and hasattr(self.sampler, "set_epoch"):
                self.sampler.set_epoch(self.epoch)
            it = iter(loader)
            if sum(1 for _ in itertools.islice(it, self.batch)) < self.batch:
                # The position is past this epoch's end (a checkpoint of a smaller world).
                self.epoch += 1
                self.batch = 0
                continue
            restarted = False
            for batch in it:
                if self._pending():
                    self._recover()
                    restarted = True
                    break
                yield batch
                if self._redo:
                    self._recover()
                    restarted = True
                    break
            if not restarted:
                self.epoch += 1
                self.batch = 0

    def step(self) -> _StepContext:
        """Around one step's forward, backward and optimizer step: a step that fails because
        the group broke is done again after the recovery."""
        return _StepContext(self)

    # ---- steps ----------------------------------------------------------------------------

    def _grad_ready(self, grad: torch.Tensor) -> None:
        if not self._in_op:
            self._in_op = True
            self._op_from = time.perf_counter()
            if self.recorder is not None:
                self._op_seq = self.recorder.start(_rec.ALL_REDUCE, 0)

    def _op_done(self, ok: bool) -> float:
        if not self._in_op:
            return 0.0
        self._in_op = False
        if self.recorder is not None:
            self.recorder.end(self._op_seq, ok)
        return time.perf_counter() - self._op_from

    def _step_started(self) -> None:
        self._step_from = time.perf_counter()
        self._in_op = False

    def _step_ended(self, exc: BaseException | None) -> bool:
        wait = self._op_done(exc is None)
        if exc is None:
            self.steps += 1
            self.batch += 1
            if self.beats is not None:
                took = time.perf_counter() - self._step_from
                self.beats.add(took - min(wait, took), min(wait, took), 0.0)
            return False
        if self._channel is None or not isinstance(exc, RuntimeError):
            return False
        group = self.group
        broken = (group is not None and group.aborted) or any(w in str(exc)
                                                              for w in _BROKEN_WORDS)
        if not broken:
            return False
        self._broken_at = time.monotonic()
        if group is not None and not group.aborted:
            # Our news before the agent's: over several nodes it may not know yet.
            reason = str(exc).replace("\n", " ")[:200]
            self._channel.send(f"broken gen={group.gen} rank={self.rank} reason={reason}")
        self._redo = True
        return True

    # ---- recovery -------------------------------------------------------------------------

    def _abort(self) -> None:
        if self.group is not None:
            self.group.abort()

    def _pending(self) -> bool:
        return self._channel is not None and not self._channel.messages.empty()

    def _recover(self) -> None:
        """Waits for the agent's `recover`, forms its group, takes the state."""
        assert self._channel is not None
        if self._broken_at is None:
            self._broken_at = time.monotonic()
        old = self.group
        deadline = time.monotonic() + self.timeout.total_seconds()
        while True:
            try:
                m = self._channel.messages.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                raise RecoveryFailed(f"rank {self.rank}: the group broke and the agent said "
                                     f"nothing within {self.timeout.total_seconds():.0f} s")
            if m is None:
                raise RecoveryFailed(f"rank {self.rank}: the agent closed the control channel")
            if m["verb"] == "stop":
                raise RecoveryFailed(f"rank {self.rank}: the agent gave the recovery up; it "
                                     f"restarts the job")
            if old is None or int(m.get("gen", "-1")) > old.gen:
                break
        gen, rank, world = int(m["gen"]), int(m["rank"]), int(m["world"])
        addr, port = m.get("master_addr", ""), int(m.get("master_port", "0"))
        was = self.steps
        # The broken group goes first: DDP's reducer unhooks itself from the parameters when it
        # is destroyed. The group itself is kept (aborted, idle): gloo's destructor would join
        # threads we have no reason to wait for.
        del self.model
        gc.collect()
        self._graveyard.append(old)
        try:
            self._form(gen, rank, world, addr or os.environ["MASTER_ADDR"],
                       port or int(os.environ["MASTER_PORT"]), fresh=False)
        except Exception as e:
            self._channel.send(f"failed gen={gen} reason={str(e).splitlines()[0][:200]}")
            raise RecoveryFailed(f"rank {self.rank}: cannot form generation {gen}: {e}") from e
        ms = (time.monotonic() - self._broken_at) * 1e3
        self._broken_at = None
        self._redo = False
        self.recoveries += 1
        self._channel.send(f"recovered gen={gen} rank={self.rank} step={self.steps} was={was} "
                           f"source={-1 if self.source is None else self.source} ms={ms:.0f}")
        self._say_going_on(gen, f", {ms:.0f} ms after the group broke")

    def _say_going_on(self, gen: int, after: str) -> None:
        """Rank 0's line, whether it lived on or is the replacement."""
        if self.rank == 0 and self.source is not None:
            _say(f"in-job recovery to generation {gen}: going on at step {self.steps} in a "
                 f"group of {self.world} with rank {self.source}'s state (model, optimizer, "
                 f"sampler position, RNG, step; no checkpoint read){after}")

    def _form(self, gen: int, rank: int, world: int, addr: str, port: int, fresh: bool) -> None:
        old_world = self.world
        self.group = _Group(gen, rank, world, addr, port, self.timeout)
        self.rank, self.world = rank, world
        pg = self.group.pg
        # Who has which step: the newest complete state any rank holds wins (a rank's all-reduce
        # can complete on it and fail on another, so one may be a step ahead; its state is the
        # whole step, the same bits on every rank that completes it).
        have = -1 if (fresh and gen > 0) else self.steps
        mine = torch.tensor([have], dtype=torch.int64)
        every = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
        pg.allgather([every], [mine]).wait()
        steps = [int(t.item()) for t in every]
        best = max(steps)
        self.source = steps.index(best) if best >= 0 else None
        took = False
        if self.source is not None and any(s != best for s in steps):
            took = have != best
            self._share(pg, self.source, take=took, old_world=old_world)
        if not took and not fresh and world != old_world:
            # A batch is one per rank: with another world, the same samples consumed in all.
            self.batch = (self.batch * old_world + world - 1) // world
        self._resample(rank, world)
        self.model = self._ddp(pg)

    def _resample(self, rank: int, world: int) -> None:
        """The sampler's share for this rank of this world."""
        sm = self.sampler
        if sm is None or (getattr(sm, "rank", rank), getattr(sm, "num_replicas", world)) == \
                (rank, world):
            return
        if isinstance(sm, DistributedSampler):
            # Its sizes come from its constructor: made again, the epoch kept.
            epoch = sm.epoch
            sm.__init__(sm.dataset, num_replicas=world, rank=rank,  # type: ignore[misc]
                        shuffle=sm.shuffle, seed=sm.seed, drop_last=sm.drop_last)
            sm.set_epoch(epoch)
            return
        for attr, v in (("rank", rank), ("num_replicas", world)):
            if hasattr(sm, attr):
                setattr(sm, attr, v)

    def _ddp(self, pg: Any) -> DistributedDataParallel:
        """The DDP wrapper, its gradient buckets laid out the same in every group: DDP lays
        them out again after its first step by the order gradients came in, and a layout puts
        each element in another chunk of gloo's ring, summed in another order (other bits).
        The parameters' own order, from the first step on, is the same in every generation."""
        model = DistributedDataParallel(self.module, process_group=pg)
        model.reducer._push_all_rebuilt_params()
        return model

    def _share(self, pg: Any, source: int, take: bool, old_world: int) -> None:
        """The source rank's state to every rank; the ranks behind it take it."""
        if self.rank == source:
            buf = io.BytesIO()
            torch.save(self._state(old_world), buf)
            data = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
            size = torch.tensor([data.numel()], dtype=torch.int64)
        else:
            size = torch.zeros(1, dtype=torch.int64)
        pg.broadcast(size, source).wait()
        if self.rank != source:
            data = torch.empty(int(size.item()), dtype=torch.uint8)
        pg.broadcast(data, source).wait()
        if take:
            self._load(torch.load(io.BytesIO(data.numpy().tobytes())))

    def _state(self, world: int) -> dict[str, Any]:
        rng: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
        np = sys.modules.get("numpy")
        if np is not None:
            rng["numpy"] = np.random.get_state()
        return {"model": self.module.state_dict(), "optimizer": self.optimizer.state_dict(),
                "steps": self.steps, "epoch": self.epoch, "batch": self.batch, "world": world,
                "rng": rng, "state": {k: v.state_dict() for k, v in self.state.items()}}

    def _load(self, s: dict[str, Any]) -> None:
        self.module.load_state_dict(s["model"])
        self.optimizer.load_state_dict(s["optimizer"])
        self.steps, self.epoch = s["steps"], s["epoch"]
        # A batch is one per rank: with another world, the same samples consumed in all.
        self.batch = (s["batch"] * s["world"] + self.world - 1) // self.world
        torch.set_rng_state(s["rng"]["torch"])
        random.setstate(s["rng"]["python"])
        np = sys.modules.get("numpy")
        if np is not None and "numpy" in s["rng"]:
            np.random.set_state(s["rng"]["numpy"])
        for k, v in s["state"].items():
            if k in self.state:
                self.state[k].load_state_dict(v)
