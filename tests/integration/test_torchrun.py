"""dlaunch as a drop-in for torchrun: the command lines of PyTorch's own launcher tests
(test/distributed/launcher/test_run.py, torch 2.x flags), run through our binary. Each case
checks what that test checks (one file per rank, the exit status) and what a user would see.
Where Debian's python3-torch is installed, the workers that need torch import it as PyTorch's
test scripts do (@record, gloo through env:// and tcp://, the file timer); torchrun/touch.py
imports it only to fail under @record (torchrun/touch.py says why)."""
import os
import re
import subprocess
import time
import unittest
import uuid

import dltest

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torchrun")
TOUCH_PY = os.path.join(HERE, "touch.py")
TOUCH_SH = os.path.join(HERE, "touch.sh")
DDP_PY = os.path.join(HERE, "ddp.py")
SAY_PY = os.path.join(HERE, "say.py")
FILETIMER_PY = os.path.join(HERE, "filetimer.py")
TORCH_PYTHON = "/usr/bin/python3"


def have_torch():
    try:
        return subprocess.run([TORCH_PYTHON, "-c", "import torch.distributed"],
                              capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


HAVE_TORCH = have_torch()


def usable_cpus():
    return len(os.sched_getaffinity(0))


class Torchrun(dltest.Case):
    def setUp(self):
        super().setUp()
        self.touch = os.path.join(self.dir, "touched")
        os.mkdir(self.touch)

    def env(self, **extra):
        # The launcher's own environment reaches the workers (PyTorch's tests set this), and a
        # script runs under the interpreter that has torch, where there is one.
        e = {"TEST_SENTINEL_PARENT": "FOOBAR"}
        if HAVE_TORCH:
            e["PYTHON_EXEC"] = TORCH_PYTHON
        e.update(extra)
        return e

    def run_case(self, *args, env=None, code=0, timeout=120):
        p = self.dlaunch(*args, env=self.env(**(env or {})), timeout=timeout, check_code=code)
        return p

    def touched(self):
        return set(os.listdir(self.touch))

    def assert_ranks(self, n):
        self.assertEqual(self.touched(), {str(i) for i in range(n)})

    # ---- PyTorch's cases ----------------------------------------------------------------

    def test_python_script_4_workers(self):
        self.run_case("--nnodes=1", "--nproc-per-node=4", f"--rdzv-id={uuid.uuid4().int}",
                      "--monitor-interval=1", "--start-method=spawn", TOUCH_PY,
                      f"--touch-file-dir={self.touch}")
        self.assert_ranks(4)

    def test_static_backend_with_master_address_port_and_node_rank(self):
        port = dltest.free_port()
        self.run_case("--nnodes=1", "--nproc_per_node=4", "--monitor_interval=1",
                      "--start_method=spawn", "--master_addr=localhost", f"--master_port={port}",
                      "--node_rank=0", TOUCH_PY, f"--touch-file-dir={self.touch}")
        self.assert_ranks(4)
        # The workers meet where they were told to.
        with open(os.path.join(self.touch, "0")) as f:
            self.assertEqual(f.read().strip(), f"localhost:{port}")

    def test_no_python_shell_script_and_not_with_module(self):
        args = ["--nnodes=1", "--nproc-per-node=4", f"--rdzv-id={uuid.uuid4().int}",
                "--monitor-interval=1", "--start-method=spawn", "--no-python"]
        p = self.run_case(*args, "--module", TOUCH_SH, self.touch, code=2)
        self.assertEqual(p.stderr.count("\n"), 1, p.stderr)
        self.assertIn("--no-python and -m/--module do not go together", p.stderr)
        self.assertEqual(self.touched(), set())
        self.run_case(*args, TOUCH_SH, self.touch)
        self.assert_ranks(4)

    def test_default_nproc_is_one(self):
        self.run_case("--nnodes=1", f"--rdzv-id={uuid.uuid4().int}", "--monitor-interval=1",
                      "--start-method=spawn", "--no-python", TOUCH_SH, self.touch)
        self.assert_ranks(1)

    def test_every_flag_through_pet_variables(self):
        env = {"PET_NNODES": "1", "PET_NPROC_PER_NODE": "4",
               "PET_RDZV_ID": str(uuid.uuid4().int), "PET_MONITOR_INTERVAL": "1",
               "PET_START_METHOD": "spawn", "PET_NO_PYTHON": "1", "PET_MODULE": "1"}
        p = self.run_case(TOUCH_SH, self.touch, env=env, code=2)
        self.assertIn("--no-python and -m/--module do not go together", p.stderr)
        env["PET_MODULE"] = "0"
        self.run_case(TOUCH_SH, self.touch, env=env)
        self.assert_ranks(4)
        # A flag wins over its variable.
        for f in os.listdir(self.touch):
            os.unlink(os.path.join(self.touch, f))
        self.run_case("--nproc-per-node", "2", TOUCH_SH, self.touch, env=env)
        self.assert_ranks(2)

    def test_nproc_per_node_number_cpu_and_an_unknown_word(self):
        common = ["--nnodes=1", f"--rdzv-id={uuid.uuid4().int}", "--no-python"]
        self.run_case(*common, "--nproc-per-node=3", TOUCH_SH, self.touch)
        self.assert_ranks(3)
        for f in os.listdir(self.touch):
            os.unlink(os.path.join(self.touch, f))
        self.run_case(*common, "--nproc-per-node=cpu", TOUCH_SH, self.touch)
        self.assert_ranks(usable_cpus())
        p = self.run_case(*common, "--nproc-per-node=unknown", TOUCH_SH, self.touch, code=2)
        self.assertEqual(p.stderr, "dlaunch: --nproc-per-node: 'unknown' is not a count (1 to "
                                   "4096), auto, cpu, gpu or xpu (for a plug-in's device, give "
                                   "the count)\n")

    def test_nproc_per_node_xpu(self):
        # A fake machine: two Intel cards on i915 and xe, a connector, and another vendor's.
        root = os.path.join(self.dir, "hw")
        drm = os.path.join(root, "sys", "class", "drm")
        for card, vendor, driver in [("card0", "0x8086", "i915"), ("card1", "0x8086", "xe"),
                                     ("card2", "0x1a03", "ast"), ("card0-DP-1", None, None)]:
            os.makedirs(os.path.join(drm, card, "device"))
            if vendor is None:
                continue
            with open(os.path.join(drm, card, "device", "vendor"), "w") as f:
                f.write(vendor + "\n")
            target = os.path.join(root, "sys", "bus", "pci", "drivers", driver)
            os.makedirs(target, exist_ok=True)
            os.symlink(target, os.path.join(drm, card, "device", "driver"))
        common = ["--nproc-per-node=xpu", "--no-python", TOUCH_SH, self.touch]
        self.run_case(*common, env={"DLAUNCH_SYSFS_ROOT": root})
        self.assert_ranks(2)
        for f in os.listdir(self.touch):
            os.unlink(os.path.join(self.touch, f))
        self.run_case(*common, env={"DLAUNCH_SYSFS_ROOT": root, "ZE_AFFINITY_MASK": "1"})
        self.assert_ranks(1)
        os.unlink(os.path.join(self.touch, "0"))
        p = self.run_case(*common, env={"DLAUNCH_SYSFS_ROOT": os.path.join(self.dir, "none")},
                          code=2)
        self.assertIn("--nproc-per-node xpu: no Intel GPU found", p.stderr)
        self.assertEqual(self.touched(), set())

    def test_elastic_one_agent_of_one_to_two(self):
        self.run_case("--nnodes=1:2", "--nproc-per-node=4", "--rdzv-backend=c10d",
                      f"--rdzv-endpoint=localhost:{dltest.free_port()}",
                      "--rdzv-conf='join_timeout=5,last_call_timeout=1,timeout=5'",
                      f"--rdzv-id={uuid.uuid4().int}", "--monitor-interval=1",
                      "--start-method=spawn", TOUCH_PY, f"--touch-file-dir={self.touch}")
        self.assert_ranks(4)

    def test_elastic_two_agents_on_one_machine(self):
        args = ["--nnodes=1:2", "--nproc-per-node=4", "--rdzv-backend=c10d",
                f"--rdzv-endpoint=localhost:{dltest.free_port()}", "--rdzv_conf=timeout=20",
                f"--rdzv-id={uuid.uuid4().int}", "--monitor-interval=1", "--start-method=spawn",
                TOUCH_PY, f"--touch-file-dir={self.touch}"]
        procs = [self.start(*args, env={**os.environ, **self.env()}) for _ in range(2)]
        try:
            outs = [p.communicate(timeout=120) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        for p, (out, err) in zip(procs, outs):
            self.assertEqual(p.returncode, 0, err)
        self.assert_ranks(8)

    def test_failing_worker_with_max_restarts_0(self):
        p = self.run_case("--nnodes=1:2", "--nproc-per-node=2", "--rdzv-backend=c10d",
                          f"--rdzv-endpoint=localhost:{dltest.free_port()}",
                          "--rdzv-conf='join_timeout=5,last_call_timeout=1,timeout=5'",
                          f"--rdzv-id={uuid.uuid4().int}", "--monitor-interval=1",
                          "--max-restarts=0", "--start-method=spawn", "--events",
                          self.events_path, TOUCH_PY, "--fail", code=1)
        self.assertIn("the job failed after 1 attempt", p.stderr)
        if HAVE_TORCH:
            # PyTorch's @record wrote the error file: its message leads the summary and the
            # event, traceback and all, with no decorator of ours needed.
            self.assertRegex(p.stderr, r"its error: RuntimeError: rank \d fails on purpose")
            self.assertIn("traceback, last lines:", p.stderr)
            exits = [e for e in self.events() if e["event"] == "worker_exit" and "error" in e]
            self.assertTrue(exits, self.events())
            self.assertRegex(exits[0]["error"], r"RuntimeError: rank \d fails on purpose")
        else:
            self.assertRegex(p.stderr, r"\| RuntimeError: rank \d fails on purpose")

    def test_standalone(self):
        self.run_case("--nnodes=1", "--nproc-per-node=4", "--standalone",
                      "--monitor-interval=1", "--start-method=spawn", TOUCH_PY,
                      f"--touch-file-dir={self.touch}")
        self.assert_ranks(4)

    def test_run_path(self):
        self.run_case("--run-path", "--nnodes=1", "--nproc-per-node=4", "--monitor-interval=1",
                      "--start-method=spawn", TOUCH_PY, f"--touch-file-dir={self.touch}")
        self.assert_ranks(4)

    @unittest.skipUnless(HAVE_TORCH, "python3-torch is not installed")
    def test_init_method_tcp_and_env(self):
        for method in ("env", "tcp"):
            out = os.path.join(self.dir, f"sum-{method}")
            self.run_case("--nproc-per-node=3", "--standalone", DDP_PY, method, out,
                          timeout=180)
            with open(out) as f:
                self.assertEqual(f.read().strip(), "6", method)

    # ---- Logs as torchrun users expect them ---------------------------------------------

    def test_redirects_tee_and_the_prefix_template(self):
        tmpl = {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[${role_name}-${rank}-${local_rank}]:"}
        p = self.run_case("--nproc-per-node=2", "--role", "trainer", "--run-id", "tee",
                          "--redirects", "3", "--tee", "3", SAY_PY, env=tmpl)
        for r in range(2):
            self.assertIn(f"[trainer-{r}-{r}]:out of {r}\n", p.stdout)
            self.assertIn(f"[trainer-{r}-{r}]:err of {r}\n", p.stderr)
            self.assertEqual(self.read("dlaunch_logs", "tee", "attempt_0", f"rank_{r}.out"),
                             f"out of {r}\n")
        # Redirected and not teed: off the console, still in the files.
        p = self.run_case("--nproc-per-node=2", "--run-id", "quiet", "-r", "3", SAY_PY)
        self.assertNotIn("out of", p.stdout)
        self.assertNotIn("err of", p.stderr)
        self.assertEqual(self.read("dlaunch_logs", "quiet", "attempt_0", "rank_1.err"),
                         "err of 1\n")
        # Per local rank: rank 0's stdout redirected, rank 1's stderr.
        p = self.run_case("--nproc-per-node=2", "-r", "0:1,1:2", SAY_PY)
        self.assertNotIn("[rank 0] out of 0", p.stdout)
        self.assertIn("[rank 0] err of 0", p.stderr)
        self.assertIn("[rank 1] out of 1", p.stdout)
        self.assertNotIn("[rank 1] err of 1", p.stderr)

    def test_local_ranks_filter(self):
        p = self.run_case("--nproc-per-node=4", "--run-id", "filter", "--local-ranks-filter",
                          "0,3", SAY_PY)
        shown = sorted(int(m) for m in re.findall(r"\[rank (\d)\] out of", p.stdout))
        self.assertEqual(shown, [0, 3])
        for r in range(4):
            self.assertEqual(self.read("dlaunch_logs", "filter", "attempt_0", f"rank_{r}.out"),
                             f"out of {r}\n")

    # ---- Usage errors are one line and exit 2 --------------------------------------------

    def test_bad_torchrun_arguments(self):
        cases = [(["--nnodes=2:20:30"], "--nnodes: '2:20:30' is not N or MIN:MAX"),
                 (["--master-port=abc"], "--master-port: 'abc' is not a whole number"),
                 (["--rdzv-backend=etcd-v2"], "etcd's v2 API was removed in etcd 3.6"),
                 (["--rdzv-conf=join_timeout=5,bogus=1"], "unknown key 'bogus'"),
                 (["--redirects=7"], "is not 0-3 or LOCAL_RANK:N"),
                 (["--nproc-per-node"], "option '--nproc-per-node' needs a value")]
        for args, want in cases:
            p = self.run_case(*args, "--no-python", TOUCH_SH, self.touch, code=2)
            self.assertEqual(p.stderr.count("\n"), 1, f"{args}: {p.stderr}")
            self.assertIn(want, p.stderr, args)
        self.assertEqual(self.touched(), set())

    def test_unambiguous_prefixes_as_argparse_takes_them(self):
        self.run_case("--nproc=3", "--max_rest", "0", "--stand", "--no_py", TOUCH_SH, self.touch)
        self.assert_ranks(3)
        p = self.run_case("--no", "--nproc-per-node=2", TOUCH_SH, self.touch, code=2)
        self.assertEqual(p.stderr.count("\n"), 1, p.stderr)
        self.assertIn("ambiguous option '--no' could match --nodes, --node-rank, --no-python",
                      p.stderr)

    def test_rdzv_conf_keep_alive_keys_and_a_free_port_endpoint(self):
        # Two single-node jobs side by side, each on a port of its own (torchrun's HOST:0).
        conf = ("--rdzv-conf=keep_alive_interval=1,keep_alive_max_attempt=4,"
                "heartbeat_timeout=3,store_type=tcp")
        jobs = [self.start("--nproc-per-node=2", "--rdzv-backend=c10d",
                                "--rdzv-endpoint=localhost:0", conf, "--", "sh", "-c",
                                f"echo $MASTER_PORT > {self.touch}/{j}-$RANK; sleep 1",
                                env=self.env())
                for j in "ab"]
        for p in jobs:
            out, err = p.communicate(timeout=120)
            self.assertEqual(p.returncode, 0, err)
        ports = {}
        for name in os.listdir(self.touch):
            with open(os.path.join(self.touch, name)) as f:
                ports.setdefault(name[0], set()).add(f.read().strip())
        self.assertEqual(sorted(ports), ["a", "b"])
        self.assertEqual(len(ports["a"] | ports["b"]), 2, ports)
        p = self.run_case("--nnodes=2", "--rdzv-id=x", "--rdzv-endpoint=localhost:0",
                          "--no-python", TOUCH_SH, self.touch, code=2)
        self.assertIn("port 0 picks a free port that the other nodes cannot know", p.stderr)
        p = self.run_case("--rdzv-conf=store_type=file", "--no-python", TOUCH_SH, self.touch,
                          code=2)
        self.assertIn("store_type=file: dlaunch's rendezvous is always served over TCP",
                      p.stderr)

    def test_virtual_local_rank(self):
        show = f"echo $LOCAL_RANK $CUDA_VISIBLE_DEVICES > {self.touch}/$RANK"

        def seen():
            out = {}
            for name in os.listdir(self.touch):
                with open(os.path.join(self.touch, name)) as f:
                    out[int(name)] = f.read().split()
                os.unlink(os.path.join(self.touch, name))
            return out
        self.run_case("--nproc-per-node=3", "--virtual-local-rank", "--", "sh", "-c", show,
                      env={"CUDA_VISIBLE_DEVICES": "4,6,7"})
        self.assertEqual(seen(), {0: ["0", "4"], 1: ["0", "6"], 2: ["0", "7"]})
        # Without a list each worker's device is its local rank; PET_ sets the flag too.
        self.run_case("--nproc-per-node=2", "--", "sh", "-c", show,
                      env={"PET_VIRTUAL_LOCAL_RANK": "1"})
        self.assertEqual(seen(), {0: ["0", "0"], 1: ["0", "1"]})
        p = self.run_case("--nproc-per-node=2", "--virtual-local-rank", "--", "sh", "-c", show,
                          env={"CUDA_VISIBLE_DEVICES": "5"}, code=2)
        self.assertIn("--virtual-local-rank: 2 workers, but CUDA_VISIBLE_DEVICES '5' names 1 "
                      "device", p.stderr)
        self.assertEqual(seen(), {})

    def test_duplicate_stdout_and_stderr_filters(self):
        script = ("echo apple $RANK; echo plain $RANK; echo a pear; echo err $RANK >&2; "
                  "echo other >&2")
        self.run_case("--nproc-per-node=2", "--rdzv-id=dup", "--log-dir=logs",
                      "--duplicate-stdout-filters", "apple,pear",
                      "--", "sh", "-c", script, env={"PET_DUPLICATE_STDERR_FILTERS": "err"})
        attempt = os.path.join(self.dir, "logs", "dup", "attempt_0")

        def lines(name):
            with open(os.path.join(attempt, name)) as f:
                return sorted(f.read().splitlines())
        self.assertEqual(lines("filtered_stdout.log"),
                         ["[rank 0] a pear", "[rank 0] apple 0", "[rank 1] a pear",
                          "[rank 1] apple 1"])
        self.assertEqual(lines("filtered_stderr.log"), ["[rank 0] err 0", "[rank 1] err 1"])
        # The ranks' own files keep every line.
        self.assertEqual(lines("rank_1.out"), ["a pear", "apple 1", "plain 1"])
        self.assertEqual(lines("rank_1.err"), ["err 1", "other"])

    def test_flags_accepted_for_torchrun_and_warned_about(self):
        p = self.run_case("--nproc-per-node=1", "--logs-specs=x",
                          "--event-log-handler=y", "--signals-to-handle=SIGTERM,SIGUSR1",
                          "--no-python", TOUCH_SH, self.touch)
        self.assertIn("--logs-specs x is ignored", p.stderr)
        self.assertIn("--event-log-handler y is ignored", p.stderr)
        self.assert_ranks(1)

    def test_signals_to_handle_reach_the_workers(self):
        # torchrun's agent passes --signals-to-handle on to its workers; so do we.
        p = self.run_case("--nproc-per-node=1", "--signals-to-handle=SIGTERM,SIGUSR1", "--",
                          "sh", "-c", "echo got=$TORCHELASTIC_SIGNALS_TO_HANDLE")
        self.assertIn("got=SIGTERM,SIGUSR1", p.stdout)
        p = self.run_case("--nproc-per-node=1", "--", "sh", "-c",
                          "echo got=$TORCHELASTIC_SIGNALS_TO_HANDLE")
        self.assertIn("got=SIGTERM,SIGINT,SIGHUP,SIGQUIT", p.stdout)

    @unittest.skipUnless(HAVE_TORCH, "needs Debian's python3-torch (FileTimerClient)")
    def test_file_timer_kills_the_worker_that_overruns(self):
        env = {"TORCHELASTIC_ENABLE_FILE_TIMER": "1",
               "TORCHELASTIC_TIMER_FILE": os.path.join(self.dir, "timer.pipe")}
        started = time.monotonic()
        p = self.run_case("--nproc-per-node=2", "--max-restarts=0", "--events",
                          self.events_path, FILETIMER_PY, "overrun", env=env, code=1)
        self.assertLess(time.monotonic() - started, 40, "the overrun rank slept its 60 s")
        self.assertIn("rank 0 done", p.stdout)
        self.assertNotIn("was never killed", p.stdout)
        self.assertIn("rank 1 (pid ", p.stderr)
        self.assertIn("overran its file timer 'slow_step'", p.stderr)
        fired = [e for e in self.events() if e["event"] == "worker_timer_expired"]
        self.assertEqual([(e["rank"], e["scope_id"], e["signal"]) for e in fired],
                         [(1, "slow_step", 9)])
        # The pipe is the agent's and goes with it.
        self.assertFalse(os.path.exists(env["TORCHELASTIC_TIMER_FILE"]))

    @unittest.skipUnless(HAVE_TORCH, "needs Debian's python3-torch (FileTimerClient)")
    def test_file_timer_releases_and_bad_lines(self):
        pipe = os.path.join(self.dir, "timer.pipe")
        env = {"TORCHELASTIC_ENABLE_FILE_TIMER": "1", "TORCHELASTIC_TIMER_FILE": pipe}
        # A released timer never fires; a line that is no request is warned about once.
        p = self.run_case("--nproc-per-node=2", FILETIMER_PY, env=env)
        self.assertIn("rank 0 done", p.stdout)
        self.assertIn("rank 1 done", p.stdout)
        p = self.run_case("--nproc-per-node=1", "--", "sh", "-c",
                          'printf "junk\\nmore junk\\n" > "$TORCHELASTIC_TIMER_FILE"; '
                          "sleep 0.5; echo alive", env=env)
        self.assertIn("alive", p.stdout)
        self.assertEqual(p.stderr.count(f"file timer '{pipe}': ignored a line"), 1, p.stderr)
        # Without the switch nothing is served, and a path given still reaches the workers.
        p = self.run_case("--nproc-per-node=1", "--", "sh", "-c",
                          'echo "file=$TORCHELASTIC_TIMER_FILE"; test ! -e "$TORCHELASTIC_TIMER_FILE"',
                          env={"TORCHELASTIC_TIMER_FILE": pipe})
        self.assertIn(f"file={pipe}", p.stdout)

    @unittest.skipUnless(HAVE_TORCH, "needs Debian's python3-torch (FileTimerClient)")
    # No dlaunch code runs in it: the plain build's run says all it can (15 s under the
    # sanitizers for nothing of theirs).
    @unittest.skipIf(os.environ.get("DLAUNCH_TEST_SANITIZER"), "torch's own agent, no dlaunch")
    def test_file_timer_under_torchrun_too(self):
        # The same worker under torch's own agent: the overrun rank is killed there as well.
        env = dict(os.environ, TORCHELASTIC_ENABLE_FILE_TIMER="1",
                   TORCHELASTIC_TIMER_FILE=os.path.join(self.dir, "torch.pipe"))
        started = time.monotonic()
        # --redirects 1 --tee 1: Debian's torch 1.13 on Python 3.11 fails on the default
        # (test_torchrun_compare.py says why). --monitor_interval 1: torch's agent looks at its
        # workers every 5 s by default, which here is only waiting to see the killed rank gone.
        p = subprocess.run([TORCH_PYTHON, "-m", "torch.distributed.run", "--nproc_per_node=2",
                            "--redirects", "1", "--tee", "1", "--monitor_interval", "1",
                            "--max_restarts=0", "--master_port", str(dltest.free_port()),
                            FILETIMER_PY, "overrun"], cwd=self.dir, env=env,
                           capture_output=True, text=True, timeout=120)
        self.assertNotEqual(p.returncode, 0)
        self.assertLess(time.monotonic() - started, 55)
        self.assertIn("rank 0 done", p.stdout)
        self.assertNotIn("was never killed", p.stdout)

    def test_health_check_port_is_said_to_be_unserved(self):
        # torchrun's open-source health-check server is a stub; we say so instead of nothing.
        p = self.run_case("--nproc-per-node=1", "--", "sh", "-c", "echo ran",
                          env={"TORCHELASTIC_HEALTH_CHECK_PORT": "29555"})
        self.assertIn("ran", p.stdout)
        self.assertIn("TORCHELASTIC_HEALTH_CHECK_PORT=29555: no health-check server is started",
                      p.stderr)
        p = self.run_case("--nproc-per-node=1", "--", "sh", "-c", "echo ran")
        self.assertNotIn("HEALTH_CHECK_PORT", p.stderr)

    def test_merge_output_folds_the_same_line_of_several_ranks(self):
        # The fold takes lines that come within --merge-window of each other: the ranks wait
        # for each other first, and the window is 2 s, so that a busy machine that lets one of
        # them run late (over the default 0.1 s, with two busy loops beside three test passes)
        # does not split them.
        script = ("touch merge-started.$RANK; "
                  "while [ $(ls merge-started.* | wc -l) -lt 4 ]; do sleep 0.01; done; "
                  "echo same line; echo mine $RANK; echo err same >&2")
        p = self.run_case("--nproc-per-node=4", "--merge-output", "--merge-window=2",
                          "--rdzv-id=merge", "--log-dir=logs", "--", "sh", "-c", script)
        out = p.stdout.splitlines()
        self.assertEqual(out.count("[ranks 0-3] same line"), 1, p.stdout)
        self.assertFalse([l for l in out if l.endswith("same line") and "ranks 0-3" not in l])
        self.assertEqual(sorted(l for l in out if "mine" in l),
                         [f"[rank {r}] mine {r}" for r in range(4)])
        self.assertIn("[ranks 0-3] err same", p.stderr.splitlines())
        # The log files keep every rank's lines.
        for r in range(4):
            self.assertEqual(self.read("logs", "merge", "attempt_0", f"rank_{r}.out"),
                             f"same line\nmine {r}\n")
        # Without the flag every rank's line is shown.
        p = self.run_case("--nproc-per-node=4", "--", "sh", "-c", script)
        self.assertEqual(len([l for l in p.stdout.splitlines() if l.endswith("same line")]), 4)

    def test_merge_window_is_how_long_a_line_waits_for_the_other_ranks(self):
        # Rank 1 prints the line 1 s after rank 0 has printed it (however late a busy machine
        # runs rank 0): apart with the default window (0.1 s), one line with a window of 5 s.
        script = ("if [ $RANK = 1 ]; then while [ ! -e printed ]; do sleep 0.01; done; sleep 1; "
                  "fi; echo same line; [ $RANK = 0 ] && touch printed; true")
        p = self.run_case("--nproc-per-node=2", "--merge-output", "--", "sh", "-c", script)
        self.assertEqual(sorted(l for l in p.stdout.splitlines() if l.endswith("same line")),
                         ["[rank 0] same line", "[rank 1] same line"], p.stdout)
        os.remove(os.path.join(self.dir, "printed"))
        p = self.run_case("--nproc-per-node=2", "--merge-output", "--merge-window", "5", "--",
                          "sh", "-c", script)
        self.assertEqual([l for l in p.stdout.splitlines() if l.endswith("same line")],
                         ["[ranks 0-1] same line"], p.stdout)


if __name__ == "__main__":
    dltest.main()
