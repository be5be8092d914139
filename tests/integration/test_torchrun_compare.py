"""The same command lines under the real torchrun (Debian's python3-torch) and under dlaunch:
the same files touched by the same ranks, the same exit status. Prints the table that
docs/torchrun.md shows. Debian's torch 1.13 on Python 3.11 cannot parse its own default
-r/-t value ("0": enum.IntFlag no longer iterates a zero member), so torchrun gets the known
workaround `--redirects 1 --tee 1` (stdout filed and shown, stderr shown: what 0 shows, plus
a file); 1.13 also knows only the underscore spellings, which dlaunch takes too."""
import os
import shutil
import subprocess
import tempfile
import unittest
import uuid

import dltest

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torchrun")
TOUCH_PY = os.path.join(HERE, "touch.py")
TOUCH_SH = os.path.join(HERE, "touch.sh")
TORCHRUN = shutil.which("torchrun", path="/usr/bin")


def cases(touch):
    rid = str(uuid.uuid4().int)
    base = ["--nnodes=1", "--monitor_interval=1", "--start_method=spawn"]
    yield "python script, 4 workers", [*base, "--nproc_per_node=4", f"--rdzv_id={rid}",
                                       TOUCH_PY, f"--touch-file-dir={touch}"], {}
    yield "static: master addr, port, node rank", [
        *base, "--nproc_per_node=4", "--master_addr=localhost", f"--master_port={dltest.free_port()}",
        "--node_rank=0", TOUCH_PY, f"--touch-file-dir={touch}"], {}
    yield "--no-python shell script", [*base, "--nproc_per_node=4", "--no_python", TOUCH_SH,
                                       touch], {}
    yield "--no-python with --module", [*base, "--nproc_per_node=4", "--no_python", "--module",
                                        TOUCH_SH, touch], {}
    yield "default nproc", [*base, "--no_python", TOUCH_SH, touch], {}
    yield "flags through PET_*", [TOUCH_SH, touch], {
        "PET_NNODES": "1", "PET_NPROC_PER_NODE": "4", "PET_RDZV_ID": rid,
        "PET_MONITOR_INTERVAL": "1", "PET_START_METHOD": "spawn", "PET_NO_PYTHON": "1"}
    yield "--nproc_per_node=cpu", [*base, "--nproc_per_node=cpu", "--no_python", TOUCH_SH,
                                   touch], {}
    yield "--nproc_per_node=unknown", [*base, "--nproc_per_node=unknown", "--no_python",
                                       TOUCH_SH, touch], {}
    yield "elastic 1:2, c10d, one agent", [
        "--nnodes=1:2", "--nproc_per_node=4", "--rdzv_backend=c10d",
        f"--rdzv_endpoint=localhost:{dltest.free_port()}",
        "--rdzv_conf=join_timeout=5,last_call_timeout=1", f"--rdzv_id={rid}",
        "--monitor_interval=1", TOUCH_PY, f"--touch-file-dir={touch}"], {}
    yield "failing worker, --max_restarts=0", [*base, "--nproc_per_node=2",
                                               "--max_restarts=0", TOUCH_PY, "--fail"], {}
    yield "--standalone", [*base, "--nproc_per_node=4", "--standalone", TOUCH_PY,
                           f"--touch-file-dir={touch}"], {}
    # --monitor_int=1, a prefix too: torchrun's default 5 s poll would be 5 s of nothing here.
    yield "prefixes: --nproc=2 --max_rest=0 --no_py", [
        "--nproc=2", "--max_rest=0", "--monitor_int=1", "--no_py", TOUCH_SH, touch], {}
    yield "ambiguous prefix --no", ["--no", "--nproc_per_node=2", TOUCH_SH, touch], {}
    yield "c10d localhost:0, keep-alive keys", [
        *base, "--nproc_per_node=2", "--rdzv_backend=c10d", "--rdzv_endpoint=localhost:0",
        "--rdzv_conf=keep_alive_interval=1,keep_alive_max_attempt=4,heartbeat_timeout=3",
        "--no_python", TOUCH_SH, touch], {}
    yield "--run_path", ["--run_path", *base, "--nproc_per_node=4", TOUCH_PY,
                         f"--touch-file-dir={touch}"], {}


@unittest.skipUnless(TORCHRUN, "torchrun (python3-torch) is not installed")
class Compare(dltest.Case):
    def run_one(self, launcher, args, env, touch):
        for f in os.listdir(touch):
            os.unlink(os.path.join(touch, f))
        full = {k: v for k, v in os.environ.items()
                if not k.startswith(("DLAUNCH_", "PET_"))}
        full.update(env)
        full["TEST_SENTINEL_PARENT"] = "FOOBAR"
        full["PYTHON_EXEC"] = "/usr/bin/python3"
        if launcher == "torchrun":
            cmd = [TORCHRUN, "--redirects", "1", "--tee", "1", *args]
        else:
            cmd = [dltest.DLAUNCH, "-q", *args]
        p = subprocess.run(cmd, cwd=self.dir, env=full, capture_output=True, text=True,
                           timeout=180)
        return p.returncode, sorted(os.listdir(touch), key=int)

    def test_same_files_and_exit_codes(self):
        touch = tempfile.mkdtemp(prefix="dl-touch-")
        rows = []
        try:
            for name, args, env in cases(touch):
                t = self.run_one("torchrun", args, env, touch)
                d = self.run_one("dlaunch", args, env, touch)
                rows.append((name, t, d))
        finally:
            shutil.rmtree(touch, ignore_errors=True)
        print("\n| command line | torchrun: files, exit | dlaunch: files, exit |")
        print("| --- | --- | --- |")
        for name, t, d in rows:
            show = lambda r: f"{','.join(r[1]) or 'none'}, exit {r[0]}"
            print(f"| {name} | {show(t)} | {show(d)} |")
        for name, t, d in rows:
            self.assertEqual(t[1], d[1], f"{name}: files")
            # torchrun raises a Python exception for a usage error (exit 1); dlaunch's usage
            # errors are exit 2, as documented (docs/exit-codes.md). Everything else agrees.
            if t[0] != d[0]:
                self.assertEqual((t[0], d[0]), (1, 2), name)


if __name__ == "__main__":
    dltest.main()
