#!/usr/bin/env python3
"""bench/faults: every failure a job should survive, made for real and timed.

    bench/faults.py [--runs N] [--json] [--only NAME[,NAME]] [--recovery restart|in-job|both]

Runs the bundled trainer on 2 agents x 2 workers (`--heartbeat 0.2 --dead-after 1`), on
loopback or, for the network faults, each agent in a network namespace of its own, injects one
fault per run and measures, medians over the runs of a scenario. With --recovery both (the
default) every scenario runs under `--recovery restart` and `--recovery in-job` in turn, in
the same run, and gives a row (a JSON object, with "recovery") for each:

  detect_ms   fault -> first sign that dlaunch noticed (the worker's exit, the hang, a lost
              node or rendezvous on a surviving agent)
  recover_ms  fault -> the next attempt's workers started (in-job: the replacement started)
  train_ms    fault -> the first step completed after it (rank 0 reports every step)
  steps_lost  the last step reported before the fault minus the step training resumed from
              (in-job: the step the recovery went on from)
  params_equal  the final parameters equal an uninterrupted run's (bitwise; a run that shrank to
              fewer nodes trains another global batch and cannot)
  culprit_ok  every surviving node's restart event (and the failure summary) named the faulty
              node and rank
  passed      the job ended with exit 0 on every surviving agent (or as the scenario expects)
  spent       (JSON; silent_drop_3s/8s) restarts plus in-job recoveries spent, the most any
              agent counts: one fault should cost one, and those scenarios pass only so

torch_worker_sigkill (bench/torchfaults.py) is the same for a PyTorch DDP job in
dlaunch.torch.Recoverable's loop (2 x 2 workers of a small MLP, rank 3 SIGKILLed at step 40,
checkpoints every 25 steps), and torch_host_agent_sigkill for node 0 lost whole with the
rendezvous it hosts (--nodes 1:2); they need python3-torch.

Needs root and nftables for the namespace scenarios (skipped otherwise). Prints a table; with
--json one object per scenario. The figures go to docs/reliability.md."""
import argparse
import json
import os
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
os.environ.setdefault("DLAUNCH", os.path.join(HERE, "..", "build", "cmd", "dlaunch"))
import faultlib  # noqa: E402
import torchfaults  # noqa: E402

FAULT_STEP = 350


def first_after(items, t):
    for x in items:
        if x[0] >= t:
            return x
    return None


def event_times(job, pred, agents=None):
    out = []
    for a in job.agents:
        if agents is not None and a.index not in agents:
            continue
        out += [(e["mono"], a.index, e) for e in a.events() if pred(e)]
    return sorted(out, key=lambda x: x[0])


def stderr_times(job, pattern, agents=None):
    out = []
    for a in job.agents:
        if agents is not None and a.index not in agents:
            continue
        out += [(t, a.index, l) for t, l in a.err.snapshot() if re.search(pattern, l)]
    return sorted(out)


def measure(job, t_fault, detect, culprit_rank=None, culprit_node=None, survivors=None):
    """The common figures of a run whose fault came at t_fault."""
    r = {}
    d = first_after(detect, t_fault) if detect else None
    r["detect_ms"] = (d[0] - t_fault) * 1e3 if d else None
    starts = event_times(job, lambda e: e["event"] == "worker_start", survivors)
    s = first_after(starts, t_fault)
    r["recover_ms"] = (s[0] - t_fault) * 1e3 if s else None
    before = [st for t, st in job.progress() if t < t_fault]
    resumed = None
    for t, _, line in job.lines():
        if t >= t_fault and "resuming from" in line:
            m = re.search(r"step (\d+)", line)
            resumed = int(m.group(1)) if m else None
            break
    # In-job: training goes on once the recovery is done, from the step it names.
    done = first_after(event_times(job, lambda e: e["event"] == "recovery" and
                                   e.get("status") == "done", survivors), t_fault)
    if done is not None and resumed is None:
        resumed = done[2].get("step")
    base = done[0] if done is not None else s[0] if s else None
    after = [x for x in job.progress() if base is not None and x[0] > base and
             (resumed is None or x[1] > resumed)]
    r["train_ms"] = (after[0][0] - t_fault) * 1e3 if after else None
    if before:
        r["steps_lost"] = before[-1] - (resumed if resumed is not None else 0)
    else:
        r["steps_lost"] = None
    # Who each survivor blamed: its restart event, or in-job its recovery's start.
    blamed = event_times(job, lambda e: e["event"] == "restart" or
                         (e["event"] == "recovery" and e.get("status") == "started"), survivors)
    ok = bool(blamed)
    for _, _, e in blamed:
        reason = e.get("reason") or {}
        if isinstance(reason, str):
            # Over several nodes: the rendezvous's words ("rank 3 on vm was killed ...").
            if culprit_rank is not None and f"rank {culprit_rank} " not in reason:
                ok = False
            continue
        if culprit_rank is not None and reason.get("rank") != culprit_rank:
            ok = False
        if culprit_node is not None and reason.get("node_rank", reason.get("node")) != culprit_node:
            ok = False
    r["culprit_ok"] = ok
    return r


def finish(job, baseline_crc, survivors):
    codes = job.wait(timeout=300)
    s = job.summary()
    passed = all(codes[i] == 0 for i in survivors)
    return {"passed": passed, "exit_codes": codes,
            "params_equal": bool(s and baseline_crc and s.get("params_crc32") == baseline_crc)}


# ---- Scenarios: each runs one job with one fault and returns its figures ----------------------

def worker_kill(job, args):
    job.start()
    job.wait_step(FAULT_STEP)
    pid = job.agents[1].worker_pid(3)
    t = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    r = finish(job, args.baseline, [0, 1])
    detect = event_times(job, lambda e: e["event"] == "worker_exit" and e["rank"] == 3)
    r.update(measure(job, t, detect, culprit_rank=3))
    return r


def worker_stop(job, args):
    job.start()
    job.wait_step(FAULT_STEP)
    pid = job.agents[1].worker_pid(3)
    t = time.monotonic()
    os.kill(pid, signal.SIGSTOP)
    r = finish(job, args.baseline, [0, 1])
    detect = event_times(job, lambda e: e["event"] == "worker_hung")
    r.update(measure(job, t, detect, culprit_rank=3))
    return r


def agent_kill(job, args, host=False):
    job.start()
    job.wait_step(FAULT_STEP)
    victim = job.agents[0 if host else 1]
    t = time.monotonic()
    victim.kill(signal.SIGKILL)
    survivors = [1] if host else [0]
    r = finish(job, args.baseline, survivors)
    detect = stderr_times(job, r"lost the rendezvous|round \d+:|is dead|no heartbeat",
                          survivors)
    detect += event_times(job, lambda e: e["event"] == "worker_exit", survivors)
    detect.sort(key=lambda x: x[0])
    r.update(measure(job, t, detect, culprit_node=0 if host else 1, survivors=survivors))
    return r


def host_kill(job, args):
    return agent_kill(job, args, host=True)


def host_silent(job, args):
    job.start()
    job.wait_step(FAULT_STEP)
    t = time.monotonic()
    job.net.drop(0)
    os.killpg(job.agents[0].proc.pid, signal.SIGSTOP)
    # The host lost power and never comes back: once the survivor is done, it goes for good
    # (else finish() waited its 300 s for a stopped process, every run).
    try:
        job.agents[1].proc.wait(timeout=300)
    finally:
        os.killpg(job.agents[0].proc.pid, signal.SIGKILL)
    r = finish(job, args.baseline, [1])
    detect = stderr_times(job, r"lost the rendezvous|round \d+:|no answer", [1])
    detect += event_times(job, lambda e: e["event"] == "worker_exit", [1])
    detect.sort(key=lambda x: x[0])
    r.update(measure(job, t, detect, culprit_node=0, survivors=[1]))
    return r


def dlaunchd_restart(job, args):
    job.start()
    job.wait_step(FAULT_STEP)
    t = time.monotonic()
    job.daemon.kill()
    job.daemon.wait()
    time.sleep(0.5)
    job.restart_dlaunchd()
    r = finish(job, args.baseline, [0, 1])
    detect = stderr_times(job, r"lost the rendezvous")
    r.update(measure(job, t, detect))
    r["culprit_ok"] = None
    return r


def link_cut(job, args, seconds=3.0):
    job.start()
    job.wait_step(FAULT_STEP)
    t = time.monotonic()
    job.net.drop(1)
    time.sleep(seconds)
    job.net.undrop(1)
    r = finish(job, args.baseline, [0, 1])
    detect = stderr_times(job, r"lost the rendezvous|round \d+:|no heartbeat")
    r.update(measure(job, t, detect, culprit_node=1))
    return r


def silent_drop(job, args):
    return link_cut(job, args, seconds=40.0)


def recoveries_spent(job):
    """The most restarts plus in-job recoveries any agent's job_end counts."""
    spent = [e["attempts"] - 1 + e.get("recoveries", 0) for a in job.agents
             for e in a.events() if e["event"] == "job_end"]
    return max(spent) if spent else None


def partition(job, args, seconds):
    """Every packet between the nodes vanishes on arrival, both ways, for `seconds`: nothing is
    refused, reset or answered with an error, as when a switch drops everything for a moment.
    The workers of each node are on a host of their own, so that the partition cuts their ring
    too. Passed: every agent exits 0 with one recovery (or restart) spent on the fault."""
    job.start()
    job.wait_step(FAULT_STEP)
    t = time.monotonic()
    for i in (0, 1):
        job.net.drop_incoming(i)
    time.sleep(seconds)
    for i in (0, 1):
        job.net.undrop(i)
    r = finish(job, args.baseline, [0, 1])
    r["spent"] = recoveries_spent(job)
    r["passed"] = r["passed"] and r["spent"] == 1
    detect = stderr_times(job, r"lost the rendezvous|round \d+:|no heartbeat")
    r.update(measure(job, t, detect, culprit_node=1))
    return r


def silent_drop_short(job, args):
    return partition(job, args, 3.0)


def silent_drop_mid(job, args):
    return partition(job, args, 8.0)


def checkpoint_crash(job, args):
    # fail_at_step kills rank fail_rank right after the step a checkpoint is written at: the
    # write of the next one is where a crash mid-checkpoint lands most often in practice.
    job.start()
    t_start = time.monotonic()
    r = finish(job, args.baseline, [0, 1])
    kills = event_times(job, lambda e: e["event"] == "worker_exit" and e.get("signal") ==
                        "SIGKILL")
    t = kills[0][0] if kills else t_start
    r.update(measure(job, t, kills, culprit_rank=1))
    return r


def agent_term(job, args):
    job.start()
    job.wait_step(FAULT_STEP)
    t = time.monotonic()
    job.agents[1].kill(signal.SIGTERM)
    codes = job.wait(timeout=300)
    # An operator stopping a node stops the job: every agent ends promptly, none as a failure.
    r = {"passed": codes[1] == 128 + signal.SIGTERM and codes[0] in (0, 128 + signal.SIGTERM),
         "exit_codes": codes, "params_equal": None}
    ends = event_times(job, lambda e: e["event"] == "job_end")
    r["detect_ms"] = (ends[0][0] - t) * 1e3 if ends else None
    r["recover_ms"] = r["train_ms"] = r["steps_lost"] = None
    r["culprit_ok"] = not event_times(job, lambda e: e["event"] == "restart")
    return r


def always_fails(job, args):
    job.start()
    codes = job.wait(timeout=300)
    summaries = [l for t, _, l in stderr_times(job, r"the job failed")]
    r = {"passed": all(c == 1 for c in codes), "exit_codes": codes, "params_equal": None,
         "detect_ms": None, "recover_ms": None, "train_ms": None, "steps_lost": None}
    # Every node names rank 2's own words, not a collateral failure.
    err = "".join(l + "\n" for a in job.agents for _, l in a.err.snapshot())
    r["culprit_ok"] = bool(summaries) and "rank 2 fails on every attempt" in err
    return r


SCENARIOS = [
    # name, function, Job keyword arguments, needs namespaces
    ("worker_sigkill", worker_kill, {}, False),
    ("worker_sigstop_hung", worker_stop, {"extra": ("--health-timeout", "1")}, False),
    ("agent_sigkill", agent_kill, {"nodes_range": "1:2"}, False),
    ("host_agent_sigkill", host_kill, {"nodes_range": "1:2"}, False),
    ("host_silently_gone", host_silent, {"nodes_range": "1:2", "net": True}, True),
    ("dlaunchd_restart", dlaunchd_restart, {"dlaunchd": True}, False),
    ("link_cut_3s", link_cut, {"net": True}, True),
    ("silent_drop_40s", silent_drop, {"net": True}, True),
    ("silent_drop_3s", silent_drop_short, {"net": True, "hosts": True}, True),
    ("silent_drop_8s", silent_drop_mid, {"net": True, "hosts": True}, True),
    ("checkpoint_crash", checkpoint_crash,
     {"train": {"fail_at_step": 400, "fail_rank": 1, "checkpoint_every": 100}}, False),
    ("agent_sigterm", agent_term, {}, False),
    ("always_fails", always_fails, {"command": True}, False),
]


def make_job(kw, subset, root, recovery="restart"):
    net = faultlib.Net(2) if kw.get("net") else None
    extra = list(kw.get("extra", ())) + ["--recovery", recovery]
    # Rank 0 reports every step, so that "the first step after the fault" is seen when it is
    # done, not up to a window of steps later; the same in both modes.
    train = {"log_every": 1, **(kw.get("train") or {})}
    try:
        # With "hosts", each node's workers have a host of their own, so that the ranks of the
        # two nodes meet over TCP (by default they find one host and use shared memory).
        hosts = ([{"DLAUNCH_COLL_HOST_ID": f"node{i}"} for i in range(2)]
                 if kw.get("hosts") else None)
        job = faultlib.Job(net=net, dlaunchd=kw.get("dlaunchd", False), extra=extra,
                           train=train, subset=subset, root=root, agent_env=hosts)
    except Exception:
        if net:
            net.close()
        raise
    if kw.get("nodes_range"):
        i = job.common.index("--nodes")
        job.common[i + 1] = kw["nodes_range"]
    if kw.get("command"):
        # rank 2 fails on every attempt with a line of its own; the others would train
        job.spec = os.path.join(job.dir, "fails.yaml")
        with open(job.spec, "w") as f:
            f.write("command: [sh, -c, 'if [ \"$RANK\" = 2 ]; then echo \"rank 2 fails on "
                    "every attempt\" >&2; exit 5; fi; sleep 30']\n")
    return job, net


def run(args):
    root = tempfile.mkdtemp(prefix="dl-bench-faults-")
    try:
        return run_in(args, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run_in(args, root):
    subset = os.path.join(root, "data")
    os.mkdir(subset)
    faultlib.write_subset(subset)
    # The uninterrupted run every other is compared with (both modes train the same bits);
    # ranks on hosts of their own sum over TCP, in another order than shared memory: a second
    # one for those.
    baselines = {}
    for hosts in (False, True):
        if not any(bool(kw.get("hosts")) == hosts for name, _, kw, _ in SCENARIOS
                   if not args.only or name in args.only):
            continue
        job, _ = make_job({"hosts": hosts}, subset, root)
        try:
            job.start()
            job.wait(timeout=600)
            s = job.summary()
            baselines[hosts] = s["params_crc32"] if s else None
        finally:
            job.close()
    netns = faultlib.can_netns()
    modes = ["restart", "in-job"] if args.recovery == "both" else [args.recovery]
    results = []
    for name, fn, kw, needs_ns in SCENARIOS:
        if args.only and name not in args.only:
            continue
        if needs_ns and not netns:
            for mode in modes:
                results.append({"scenario": name, "recovery": mode,
                                "skipped": "needs root, ip netns and nft"})
            continue
        runs = {mode: [] for mode in modes}
        args.baseline = baselines.get(bool(kw.get("hosts")))
        # The modes take turns, so that a burst of load from elsewhere hits both alike.
        for _ in range(args.runs):
            for mode in modes:
                job, net = make_job(kw, subset, root, mode)
                try:
                    runs[mode].append(fn(job, args))
                except Exception as e:  # a scenario that breaks is a failed run, not a crash
                    runs[mode].append({"passed": False, "error": str(e)})
                finally:
                    job.close()
                    if net:
                        net.close()
        for mode in modes:
            results.append(summarize(name, runs[mode], args, mode))
    if not args.only or any(name.startswith("torch_") for name in args.only):
        args.root = root
        results += torchfaults.rows(args, faultlib.free_port, summarize)
    return results


def median(runs, key):
    vals = [r[key] for r in runs if r.get(key) is not None]
    return round(statistics.median(vals), 1) if vals else None


def summarize(name, runs, args, mode):
    out = {"scenario": name, "recovery": mode, "runs": len(runs),
           "passed": sum(1 for r in runs if r.get("passed"))}
    for k in ("detect_ms", "recover_ms", "train_ms", "steps_lost", "spent"):
        out[k] = median(runs, k)
    pe = [r.get("params_equal") for r in runs if r.get("params_equal") is not None]
    out["params_equal"] = (sum(pe) == len(pe)) if pe else None
    co = [r.get("culprit_ok") for r in runs if r.get("culprit_ok") is not None]
    out["culprit_ok"] = (sum(co) == len(co)) if co else None
    errors = [r["error"] for r in runs if r.get("error")]
    if errors:
        out["errors"] = errors[:2]
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--json", action="store_true")
    p.add_argument("--only", type=lambda s: s.split(","), default=None)
    p.add_argument("--recovery", default="both", choices=["restart", "in-job", "both"])
    args = p.parse_args()
    results = run(args)
    if args.json:
        for r in results:
            print(json.dumps(r))
        return
    cols = ["scenario", "recovery", "runs", "passed", "detect_ms", "recover_ms", "train_ms",
            "steps_lost", "params_equal", "culprit_ok"]
    print(" | ".join(cols))
    print(" | ".join("---" for _ in cols))
    for r in results:
        if "skipped" in r:
            print(f"{r['scenario']} | {r['recovery']} | skipped: {r['skipped']}")
            continue
        print(" | ".join(str(r.get(c, "")) for c in cols))


if __name__ == "__main__":
    main()
