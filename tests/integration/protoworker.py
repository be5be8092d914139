"""A worker that speaks docs/recovery.md's control protocol and nothing else: the cheapest job
that makes an agent go through an in-job recovery, for tests of what the agent says (its events,
its log) rather than of training. Standard library only, so any python3 runs it.

Set through the environment (dlaunch passes its own on to its workers):
  PROTO_DIR        a folder for its marker files (required)
  PROTO_FAIL_RANK  this rank exits 1 once, as soon as every rank has said hello
  PROTO_ERROR      with PROTO_FAIL_RANK: first write an error file as PyTorch's @record does
  PROTO_SILENT     1: never say hello (a worker that does not speak the protocol)
  PROTO_HANG_RANK  this rank sends one health beat and hangs, once, when every rank said hello
Every worker exits 0 once the file PROTO_DIR/finish exists."""
import json
import os
import select
import socket
import sys
import time


def marker(name: str) -> str:
    return os.path.join(os.environ["PROTO_DIR"], name)


def everyone_said_hello(world: int) -> bool:
    return all(os.path.exists(marker(f"hello-{r}")) for r in range(world))


def write_error_file(rank: int) -> None:
    """{"message": {"message": ..., "extraInfo": {"py_callstack": ...}}}, as @record writes it."""
    trace = ("Traceback (most recent call last):\n"
             '  File "train.py", line 12, in <module>\n    main()\n'
             f"ValueError: rank {rank} fails on purpose\n")
    with open(os.environ["TORCHELASTIC_ERROR_FILE"], "w") as f:
        json.dump({"message": {"message": f"ValueError: rank {rank} fails on purpose",
                               "extraInfo": {"py_callstack": trace, "timestamp": "0"}}}, f)


def main() -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    gen = int(os.environ.get("DLAUNCH_GROUP_GEN", "0"))
    ctl = None
    if os.environ.get("DLAUNCH_CONTROL_FD") and os.environ.get("PROTO_SILENT") != "1":
        ctl = socket.socket(fileno=int(os.environ["DLAUNCH_CONTROL_FD"]))
        ctl.sendall(f"hello gen={gen} rank={rank} pid={os.getpid()}\n".encode())
        if gen > 0:
            # A replacement: it joins the running job, taking rank 0's state.
            ctl.sendall(f"recovered gen={gen} rank={rank} step=5 was=-1 source=0 ms=1\n"
                        .encode())
    open(marker(f"hello-{rank}"), "w").close()
    fails = os.environ.get("PROTO_FAIL_RANK") == str(rank) and \
        not os.path.exists(marker("failed"))
    if os.environ.get("PROTO_HANG_RANK") == str(rank) and not os.path.exists(marker("hung")):
        while not everyone_said_hello(world):
            time.sleep(0.02)
        open(marker("hung"), "w").close()
        os.write(int(os.environ["DLAUNCH_HEALTH_FD"]), b".")
        time.sleep(3600)
    buf = b""
    while not os.path.exists(marker("finish")):
        if fails and everyone_said_hello(world):
            time.sleep(0.3)  # the agent reads every hello before the exit
            open(marker("failed"), "w").close()
            if os.environ.get("PROTO_ERROR"):
                write_error_file(rank)
            sys.exit(1)
        if ctl is None:
            time.sleep(0.02)
            continue
        if not select.select([ctl], [], [], 0.02)[0]:
            continue
        data = ctl.recv(4096)
        if not data:
            ctl = None
            continue
        buf += data
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            words = dict(w.split("=", 1) for w in line.decode().split(" ")[1:] if "=" in w)
            if line.startswith(b"recover "):
                ctl.sendall(f"recovered gen={words['gen']} rank={words['rank']} step=5 was=5 "
                            f"source=0 ms=1\n".encode())


if __name__ == "__main__":
    main()
