"""bench/faults' PyTorch rows: tests/integration/torchrun/recover_mlp.py (a small DDP MLP in
dlaunch.torch.Recoverable's loop, gloo, one thread a worker) on 2 agents x 2 workers.
torch_worker_sigkill: rank 3 SIGKILLed from outside at step FAULT_STEP, under `--recovery
restart`, `--recovery in-job` and `--recovery in-job --spares 1` (rows "in-job+spare": the kill
waits until node 1's spare says it waits). torch_host_agent_sigkill: `--nodes 1:2`, node 0's
agent (the host of the embedded rendezvous) and its workers SIGKILLed at step FAULT_STEP, under
`--recovery restart` and `--recovery in-job`: node 1 hosts the rendezvous and goes on alone.
Its figures are bench/faults' (train_ms: the kill -> rank 0 completes the step after the one
training went on from; steps_lost: the last step completed before that minus the one it went on
from;
params_equal: the final parameters against an uninterrupted run's, bitwise; a job that shrank
sums in another order and cannot be)."""
import os
import re
import shutil
import signal
import subprocess
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SCRIPT = os.path.join(ROOT, "tests", "integration", "torchrun", "recover_mlp.py")
PACKAGE = os.path.join(ROOT, "python")
TORCH_PYTHON = "/usr/bin/python3"
FAULT_STEP = 40
EPOCHS = "20"       # 480 steps of 16 samples a rank on 4 ranks
STEP_MS = "10"      # each step stretched, so that a spare is up (seconds) long before the end
CKPT_EVERY = "25"   # restart mode goes back to step 25


def have_torch():
    try:
        return subprocess.run([TORCH_PYTHON, "-c", "import torch.distributed"],
                              capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


class TorchJob:
    def __init__(self, root, name, mode, port, nodes="2"):
        spares = mode.endswith("+spare")
        mode = mode.removesuffix("+spare")
        self.dir = os.path.join(root, name)
        self.out = os.path.join(self.dir, "out")
        os.makedirs(self.out)
        env = {k: v for k, v in os.environ.items() if not k.startswith("DLAUNCH_")}
        env["PYTHONPATH"] = PACKAGE
        self.logs = [os.path.join(self.dir, f"node{i}.log") for i in range(2)]
        self.procs = []
        for i in range(2):
            with open(self.logs[i], "w") as log:
                self.procs.append(subprocess.Popen(
                    [os.environ["DLAUNCH"], "--nodes", nodes, "--nproc-per-node", "2",
                     "--rdzv-endpoint", f"127.0.0.1:{port}", "--run-id", name,
                     "--node-rank", str(i), "--recovery", mode, "--max-restarts", "3",
                     "--heartbeat", "0.2", "--dead-after", "1", "--last-call", "0.5",
                     *(["--spares", "1"] if spares else []), "--",
                     TORCH_PYTHON, SCRIPT, self.out, EPOCHS, "progress=1", f"step_ms={STEP_MS}",
                     f"ckpt_every={CKPT_EVERY}"],
                    cwd=self.dir, env=env, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True))

    def text(self):
        return "".join(open(p, errors="replace").read() for p in self.logs)

    def progress(self):
        """(monotonic time, step) of rank 0's steps."""
        return [(float(t), int(s)) for s, t in
                re.findall(r"progress step=(\d+) mono=([0-9.]+)", self.text())]

    def wait_step(self, step, timeout=300):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(s >= step for _, s in self.progress()):
                return
            if all(p.poll() is not None for p in self.procs):
                break
            time.sleep(0.05)
        raise RuntimeError(f"no step {step}: {self.text()[-2000:]}")

    def wait_spare(self, timeout=300):
        """Until node 1's spare waits, its imports loaded."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if re.search(r"\[node1 spare 0\] dlaunch: spare waiting", self.text()):
                return
            time.sleep(0.05)
        raise RuntimeError(f"no spare waiting: {self.text()[-2000:]}")

    def pid_of(self, rank):
        pids = [int(n.split("-")[2]) for n in os.listdir(self.out)
                if n.startswith(f"start-{rank}-")]
        return max(pids)

    def wait(self, timeout=600):
        return [p.wait(timeout=timeout) for p in self.procs]

    def params(self):
        path = os.path.join(self.out, "params-0.bin")
        return open(path, "rb").read() if os.path.exists(path) else None

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def worker_kill(root, name, mode, port, baseline):
    job = TorchJob(root, name, mode, port)
    try:
        job.wait_step(FAULT_STEP)
        if mode.endswith("+spare"):
            job.wait_spare()
        t = time.monotonic()
        os.kill(job.pid_of(3), signal.SIGKILL)
        codes = job.wait()
        return measure(job, t, codes, codes == [0, 0], baseline)
    finally:
        job.close()


def host_kill(root, name, mode, port, baseline):
    """Node 0 lost whole: its agent, which hosts the rendezvous, and its workers."""
    job = TorchJob(root, name, mode, port, nodes="1:2")
    try:
        job.wait_step(FAULT_STEP)
        t = time.monotonic()
        os.killpg(job.procs[0].pid, signal.SIGKILL)
        job.procs[0].wait()
        code = job.procs[1].wait(timeout=600)
        return measure(job, t, [job.procs[0].returncode, code], code == 0, baseline)
    finally:
        job.close()


def measure(job, t, codes, passed, baseline):
    text = job.text()
    m = re.search(r"going on at step (\d+)|loaded checkpoint at step (\d+)", text)
    resumed = int(m.group(1) or m.group(2)) if m else None
    # Training again: the step after the one it went on from, done after the fault (a step in
    # flight at the fault can still complete before anyone notices).
    prog = job.progress()
    again = next(((tt, s) for tt, s in prog if tt > t and resumed is not None and
                  s == resumed + 1), None)
    done = [s for tt, s in prog if again is None or tt < again[0]]
    return {"passed": passed, "exit_codes": codes,
            "train_ms": (again[0] - t) * 1e3 if again else None,
            "steps_lost": max(done) - resumed if done and resumed is not None else None,
            "params_equal": bool(baseline) and job.params() == baseline}


# name, the run's function, whether it has an in-job+spare row
SCENARIOS = [("torch_worker_sigkill", worker_kill, True),
             ("torch_host_agent_sigkill", host_kill, False)]


def rows(args, free_port, summarize):
    """The rows of every scenario args.only names (all without it) in every mode args.recovery
    names, medians of args.runs runs, or one row a mode saying why none ran."""
    scenarios = [s for s in SCENARIOS if not args.only or s[0] in args.only]
    base = ["restart", "in-job"] if args.recovery == "both" else [args.recovery]
    modes = {name: base + (["in-job+spare"] if spare and "in-job" in base else [])
             for name, _, spare in scenarios}
    if not have_torch():
        return [{"scenario": name, "recovery": m, "skipped": "needs python3-torch"}
                for name, _, _ in scenarios for m in modes[name]]
    if not scenarios:
        return []
    root = os.path.join(args.root, "torch")
    os.makedirs(root)
    try:
        ref = TorchJob(root, "reference", "in-job", free_port())
        try:
            ref.wait()
            baseline = ref.params()
        finally:
            ref.close()
        out = []
        for name, fn, _ in scenarios:
            runs = {m: [] for m in modes[name]}
            for i in range(args.runs):
                for m in modes[name]:  # taking turns, as the other scenarios do
                    try:
                        runs[m].append(fn(root, f"{name}-{m.replace('+', '-')}-{i}", m,
                                          free_port(), baseline))
                    except Exception as e:  # a run that breaks is a failed run, not a crash
                        runs[m].append({"passed": False, "error": str(e)[-300:]})
            out += [summarize(name, runs[m], args, m) for m in modes[name]]
        return out
    finally:
        shutil.rmtree(root, ignore_errors=True)
