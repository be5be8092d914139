"""dlaunch kv and the control commands as docs/control.md describes them: the store a shell
worker reaches through its environment, whole numbers over the whole 64-bit range, a wait that
times out (exit 1, after the documented default), and what a one-node job's store says to
control commands."""
import json
import os
import socket
import subprocess
import threading
import time

import dltest
from dltest import frame, read_frame

SCRIPT = r'''
set -u
kv() { "$DL" kv "$@"; }
kv set a hello || exit 10
[ "$(kv get a)" = hello ] || exit 11
kv add n 9223372036854775800 > /dev/null || exit 12
[ "$(kv add n 7)" = 9223372036854775807 ] || exit 13
kv add n 1 2> overflow.err; [ $? = 1 ] || exit 14
[ "$(kv add m -9223372036854775808)" = -9223372036854775808 ] || exit 15
kv get missing 2> /dev/null; [ $? = 1 ] || exit 16
kv wait missing --timeout 0.5 2> wait.err; [ $? = 1 ] || exit 17
kv cas a wrong x; [ $? = 1 ] || exit 18
kv cas a hello world || exit 19
[ "$(kv get a)" = world ] || exit 20
kv del a || exit 21
kv del a; [ $? = 1 ] || exit 22
echo kv-ok
'''

# `dlaunch status --json` of one job, keys in the order docs/control.md shows them (the server
# writes them through the status reply's one table, proto/status-reply.c).
JOB_KEYS = ["run_id", "state", "round", "restarts", "max_restarts", "min_nodes", "max_nodes",
            "world_size", "keys", "nodes", "store_bytes", "store_waits"]
NODE_KEYS = ["node_id", "host", "slots", "node_rank", "heartbeat_age", "connected", "left"]


def serve_one_status(listener, result):
    """A server without a token that answers one control connection's status with result."""
    conn, _ = listener.accept()
    with conn:
        conn.settimeout(30)
        hello = read_frame(conn, 30)
        conn.sendall(frame({"v": 1, "type": "auth_ok", "id": hello["id"]}))
        status = read_frame(conn, 30)
        conn.sendall(frame({"v": 1, "type": "reply", "id": status["id"], "result": result}))
        try:
            read_frame(conn, 30)
        except OSError:
            pass


class Control(dltest.Case):
    def test_kv_as_documented(self):
        p = self.dlaunch("--gpus-per-node", "1", "--", "sh", "-c", SCRIPT,
                         env={"DL": dltest.DLAUNCH}, check_code=0)
        self.assertIn("[rank 0] kv-ok", p.stdout)
        self.assertIn("overflows", self.read("overflow.err"))
        self.assertTrue(self.read("wait.err").strip(), "a timed-out wait says so")

    def test_an_argument_past_the_limit_is_refused_not_dropped(self):
        # kv wait takes many keys, up to 64 arguments after `kv`: one more is a usage error
        # that names the command and the limit, before anything is sent (the store here is a
        # port nobody listens on: no connection is tried).
        env = {"DLAUNCH_STORE": f"127.0.0.1:{dltest.free_port()}", "TORCHELASTIC_RUN_ID": "one"}
        keys = [f"k{i}" for i in range(64)]
        p = self.dlaunch("kv", "wait", *keys, env=env, check_code=2)
        self.assertEqual(p.stderr, "dlaunch: too many arguments: dlaunch kv takes at most 64, "
                                   "and 'k63' is one more\n")
        self.assertEqual(p.stdout, "")
        # At the limit every argument goes through: the store is asked (and is not there).
        p = self.dlaunch("kv", "wait", *keys[:63], env=env)
        self.assertEqual(p.returncode, 3, p.stderr)

    def test_each_command_has_its_options_help_and_typo_hints(self):
        # One table gives every control command its options, its --help and `dlaunch help`.
        listing = self.dlaunch("help", check_code=0).stdout
        overall = self.dlaunch("--help", check_code=0).stdout
        self.assertIn(listing, overall)
        want = {"status": ["--json", "--ranks", "--endpoint", "--timeout", "--rdzv-backend"],
                "stop": ["--json", "--endpoint", "--token-file"],
                "restart": ["--endpoint", "--token-file"],
                "events": ["--endpoint", "--timeout"],
                "kv": ["--endpoint", "--timeout"],
                "token": ["--worker", "--read-only", "--expires", "--token-file"],
                "revoke": ["--before", "--json", "--endpoint"]}
        for cmd, flags in want.items():
            self.assertIn(f"\n  {cmd} ", listing)
            for ask in (["help", cmd], [cmd, "--help"], [cmd, "-h"]):
                p = self.dlaunch(*ask, check_code=0)
                self.assertTrue(p.stdout.startswith(f"Usage: dlaunch {cmd} [OPTIONS]"), p.stdout)
                for flag in flags:
                    self.assertIn(f"  {flag}", p.stdout, (cmd, flag))
        self.assertNotIn("--ranks", self.dlaunch("token", "--help", check_code=0).stdout)
        # A typo gets the closest option of that command; another command's option is refused.
        p = self.dlaunch("status", "--jsn", "one", check_code=2)
        self.assertEqual(p.stderr, "dlaunch: unknown option '--jsn' (did you mean --json? see "
                                   "dlaunch status --help)\n")
        p = self.dlaunch("token", "--ranks", "one", check_code=2)
        self.assertEqual(p.stderr, "dlaunch: unknown option '--ranks' (see dlaunch token "
                                   "--help)\n")
        p = self.dlaunch("status", "--timeout", check_code=2)
        self.assertEqual(p.stderr, "dlaunch: option '--timeout' needs a value (SECONDS)\n")
        p = self.dlaunch("status", "--json=yes", check_code=2)
        self.assertEqual(p.stderr, "dlaunch: option '--json' takes no value\n")
        # events took --json (its lines are JSON anyway) and still does, unlisted.
        self.assertNotIn("--json", self.dlaunch("events", "--help", check_code=0).stdout)
        p = self.dlaunch("events", "--json", check_code=2)
        self.assertEqual(p.stderr, "dlaunch: events needs the RUN_ID of the job\n")
        p = self.dlaunch("help", "statsu", check_code=2)
        self.assertIn("'statsu' is no control command", p.stderr)

    def test_kv_wait_defaults_to_10_seconds(self):
        # The documented default: a wait with no --timeout gives up after 10 s with exit 1.
        script = ('t0=$(date +%s); "$DL" kv wait never 2>/dev/null; rc=$?; '
                  't1=$(date +%s); echo "rc=$rc took=$((t1 - t0))"')
        p = self.dlaunch("--gpus-per-node", "1", "--", "sh", "-c", script,
                         env={"DL": dltest.DLAUNCH}, timeout=60, check_code=0)
        rc, took = [x.split("=")[1] for x in p.stdout.split("] ")[1].split()]
        self.assertEqual(rc, "1")
        self.assertGreaterEqual(int(took), 9)
        self.assertLessEqual(int(took), 20)

    def test_control_commands_at_a_one_node_store_say_they_cannot(self):
        # docs/control.md: a one-node job's store is no rendezvous; status, stop, restart and
        # events there are refused in one line, exit 4, and the job runs on untouched.
        token = self.write("job.token", "s3cret\n")
        os.chmod(token, 0o600)
        for with_token in (False, True):
            store = os.path.join(self.dir, "store")
            release = os.path.join(self.dir, "release")
            for f in (store, release, self.events_path):
                if os.path.exists(f):
                    os.unlink(f)
            script = (f'echo $DLAUNCH_STORE > {store}.new; mv {store}.new {store}; '
                      f'while [ ! -e {release} ]; do sleep 0.05; done; echo done')
            extra = ["--token-file", token] if with_token else []
            job = self.start("-q", "--run-id", "one", "--events", self.events_path, *extra,
                             "--", "sh", "-c", script)
            try:
                deadline = time.monotonic() + 30
                while not os.path.exists(store) and time.monotonic() < deadline:
                    time.sleep(0.05)
                endpoint = self.read("store").strip()
                env = {"DLAUNCH_TOKEN_FILE": token} if with_token else {}
                for cmd in (["status", "one"], ["status"], ["stop", "one"], ["restart", "one"],
                            ["events", "--timeout", "1", "one"]):
                    p = self.dlaunch(cmd[0], "--endpoint", endpoint, *cmd[1:], env=env)
                    self.assertEqual(p.returncode, 4, f"{cmd}: {p.stdout}{p.stderr}")
                    self.assertEqual(p.stdout, "")
                    self.assertEqual(
                        p.stderr, f"dlaunch: {endpoint}: this is a one-node job's key-value "
                        "store, not a rendezvous: it takes no status, stop, restart, events or "
                        "agents (signal the job's agent, or run the job with --rdzv-endpoint)\n")
                # The store still serves the job's workers.
                kv_env = {"DLAUNCH_STORE": endpoint, "TORCHELASTIC_RUN_ID": "one", **env}
                if with_token:
                    kv_env["DLAUNCH_TOKEN_FILE"] = self.worker_key(token)
                self.dlaunch("kv", "set", "k", "v", env=kv_env, check_code=0)
                self.assertIsNone(job.poll(), "nothing stopped the job")
            finally:
                open(release, "w").close()
                out, err = job.communicate(timeout=60)
            self.assertEqual(job.returncode, 0, err)
            end = self.events()[-1]
            self.assertEqual((end["event"], end["status"], end["attempts"]),
                             ("job_end", "succeeded", 1))

    def test_a_one_node_job_through_a_rendezvous_answers_control_commands(self):
        # The way docs/control.md gives: --rdzv-endpoint, one node; its agent hosts it.
        endpoint = f"127.0.0.1:{dltest.free_port()}"
        job = self.start("-q", "--rdzv-endpoint", endpoint, "--run-id", "solo", "--events",
                         self.events_path, "--", "sleep", "60")
        try:
            self.wait_events(lambda evs: any(e["event"] == "worker_start" for e in evs), 30)
            p = self.dlaunch("status", "--json", "--endpoint", endpoint, "solo", check_code=0)
            st = json.loads(p.stdout)
            self.assertEqual((st["state"], st["world_size"], len(st["nodes"])), ("running", 1, 1))
            self.assertEqual([k for k in st if k in JOB_KEYS], JOB_KEYS)
            self.assertEqual(list(st["nodes"][0]), NODE_KEYS)
            p = self.dlaunch("status", "--endpoint", endpoint, "solo", check_code=0)
            self.assertTrue(p.stdout.startswith(
                "solo: running, round 0, restarts 0 of 0, nodes 1..1, world size 1\n"
                "  store: "), p.stdout)
            self.assertRegex(p.stdout, r"\n  node 0  \S+ +\S+ +slots 1  heartbeat \d+\.\ds ago\n")
            p = self.dlaunch("stop", "--endpoint", endpoint, "solo", check_code=0)
            self.assertEqual(p.stdout, "solo: stopping\n")
            job.communicate(timeout=30)
        finally:
            if job.poll() is None:
                job.kill()
                job.communicate()
        self.assertEqual(job.returncode, 0)
        self.assertEqual(self.events()[-1]["status"], "stopped")

    def test_a_malformed_status_reply_is_one_line_naming_the_field(self):
        # A server whose reply passes the protocol's checks (state, round) but whose node has
        # slots as a string: no figures made up from it, the field named, exit 1.
        listener = socket.create_server(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        result = {"run_id": "bad", "state": "running", "round": 0, "restarts": 0,
                  "max_restarts": 0, "min_nodes": 1, "max_nodes": 1, "world_size": 1, "keys": 0,
                  "nodes": [{"node_id": "n0", "host": "h", "slots": "two", "node_rank": 0,
                             "heartbeat_age": 0.1, "connected": True, "left": False}]}
        server = threading.Thread(target=serve_one_status, args=(listener, result), daemon=True)
        server.start()
        try:
            p = self.dlaunch("status", "--endpoint", f"127.0.0.1:{port}", "bad", check_code=1)
        finally:
            server.join(30)
            listener.close()
        self.assertEqual(p.stdout, "")
        self.assertEqual(p.stderr, "dlaunch: status reply: field 'nodes[0].slots' must be an "
                                   "integer, got a string\n")

    def worker_key(self, token):
        p = self.dlaunch("token", "--worker", "--token-file", token, "one", check_code=0)
        path = self.write("worker.key", p.stdout)
        os.chmod(path, 0o600)
        return path


if __name__ == "__main__":
    dltest.main()
