"""Job keys end and can be withdrawn (issue #32, 3): a key handed out once for run id X used to
read, stop and restart every later job named X, forever. Each test runs dlaunchd with a token on
loopback and asserts what a user holding an old key can no longer do, and what a fresh key
still does.

Keys are made here by hand too, from the formula in docs/protocol.md ("Credentials"), to
reach times `dlaunch token` never makes (a key that expired days ago)."""
import hashlib
import hmac
import json
import os
import re
import subprocess
import time

import dltest
import test_security

MASTER = "site-secret"
DAY = 86400


def job_key(run_id, issued, expires, master=MASTER):
    key = hmac.new(master.encode(), f"dlaunch job key v2\n{run_id}\n{issued}\n{expires}".encode(),
                   hashlib.sha256).digest()
    return f"dlaunch-job-v2:{run_id}:{issued}:{expires}:{key.hex()}"


def worker_key(job_text):
    run_id, issued, expires, hexkey = re.fullmatch(
        r"dlaunch-job-v2:(.+):(\d+):(\d+):([0-9a-f]{64})", job_text).groups()
    key = hmac.new(bytes.fromhex(hexkey), f"dlaunch worker key v2\n{run_id}".encode(),
                   hashlib.sha256).digest()
    return f"dlaunch-worker-v2:{run_id}:{issued}:{expires}:{key.hex()}"


def issued_of(key_text):
    return int(key_text.split(":")[-3])


def one_line(text):
    """The message of a refusal: one line that begins with 'dlaunch:'."""
    lines = [l for l in text.split("\n") if l.strip()]
    return len(lines) == 1 and lines[0].startswith("dlaunch: ")


class Keys(test_security.Base):
    def setUp(self):
        super().setUp()
        self.master = self.token("site.token", MASTER)

    def start(self, *args):
        d, port = self.daemon("--token-file", self.master, *args)
        self.endpoint = f"127.0.0.1:{port}"
        return d

    def make_key(self, name, run_id, *args):
        p = self.run_cmd("token", "--token-file", self.master, *args, run_id)
        self.assertEqual(p.returncode, 0, p.stderr)
        return self.token(name, p.stdout.strip()), p.stdout.strip()

    def ctl(self, cmd, key_file, run_id):
        return self.run_cmd(cmd, "--endpoint", self.endpoint, "--token-file", key_file, run_id)

    def job(self, name, run_id, key_file, *cmd):
        return self.agent(name, "-q", "--rdzv-endpoint", self.endpoint, "--run-id", run_id,
                          "--gpus-per-node", "1", "--token-file", key_file, "--", *cmd)

    def kv(self, key_text, run_id, *args):
        return self.run_cmd("kv", *args, env={"DLAUNCH_TOKEN": key_text,
                                              "DLAUNCH_STORE": self.endpoint,
                                              "TORCHELASTIC_RUN_ID": run_id})

    def wait_past(self, t):
        """Until the clock has passed the second t: keys issued at t are 'before' now."""
        while time.time() < t + 1.05:
            time.sleep(0.05)


class Lifetime(Keys):
    def test_an_expired_key_is_refused_at_join_control_and_store(self):
        self.start()
        now = int(time.time())
        old = job_key("jobA", now - 3 * DAY, now - DAY)
        expired = self.token("old.key", old)
        fresh, _ = self.make_key("new.key", "jobA")
        a = self.job("a", "jobA", fresh, "sleep", "30")
        self.wait_started(["a"])
        # Control: the fresh key reads the job, the expired one is told why, in one line.
        self.assertEqual(self.ctl("status", fresh, "jobA").returncode, 0)
        for cmd in ("status", "stop", "restart"):
            p = self.ctl(cmd, expired, "jobA")
            self.assertEqual(p.returncode, 4, (cmd, p.stderr))
            self.assertTrue(one_line(p.stderr), p.stderr)
            self.assertIn("expired at", p.stderr)
            self.assertIn(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - DAY)), p.stderr)
        # Store: the worker key of an expired job key ends with it.
        self.assertEqual(self.kv(worker_key(self.read("new.key").strip()), "jobA",
                                 "set", "k", "v").returncode, 0)
        p = self.kv(worker_key(old), "jobA", "get", "k")
        self.assertEqual(p.returncode, 4, p.stderr)
        self.assertTrue(one_line(p.stderr), p.stderr)
        self.assertIn("expired at", p.stderr)
        # Join: an agent holding the expired key gets no place in the job.
        p = self.run_cmd("--rdzv-endpoint", self.endpoint, "--run-id", "jobA",
                         "--gpus-per-node", "1", "--token-file", expired, "--", "true")
        self.assertNotEqual(p.returncode, 0, p.stderr)
        self.assertIn("expired at", p.stdout + p.stderr)
        # By hand, the server answers auth_failed and closes, saying so.
        c = self.client(int(self.endpoint.split(":")[1]))
        reply = c.hello("agent", "jobA", old)
        self.assertEqual(reply["error"]["code"], "auth_failed", reply)
        self.assertIn("expired at", reply["error"]["message"])
        self.assertIsNone(a.poll(), self.read("a.log"))
        self.assertEqual(self.ctl("stop", fresh, "jobA").returncode, 0)
        self.assertEqual(a.wait(timeout=60), 0, self.read("a.log"))

    def test_a_key_within_its_span_and_the_leeway_works_and_an_edited_span_does_not(self):
        self.start()
        now = int(time.time())
        a = self.job("a", "jobA", self.master, "sleep", "30")
        self.wait_started(["a"])
        # Issued a minute ahead of the server's clock (skew) and expired a minute ago: within
        # the leeway of docs/protocol.md.
        skewed = self.token("skew.key", job_key("jobA", now + 60, now + 3600))
        self.assertEqual(self.ctl("status", skewed, "jobA").returncode, 0)
        late = self.token("late.key", job_key("jobA", now - 3600, now - 60))
        self.assertEqual(self.ctl("status", late, "jobA").returncode, 0)
        ahead = self.token("ahead.key", job_key("jobA", now + DAY, now + 2 * DAY))
        p = self.ctl("status", ahead, "jobA")
        self.assertEqual(p.returncode, 4, p.stderr)
        self.assertIn("ahead of the server's clock", p.stderr)
        # Stretching a key's expiry in its text makes another key, which proves nothing.
        _, text = self.make_key("k.key", "jobA", "--expires", "1h")
        parts = text.split(":")
        parts[-2] = str(int(parts[-2]) + 365 * DAY)
        stretched = self.token("stretched.key", ":".join(parts))
        p = self.ctl("status", stretched, "jobA")
        self.assertEqual(p.returncode, 4, p.stderr)
        self.assertIn("wrong job token", p.stderr)
        self.ctl("stop", self.master, "jobA")
        a.wait(timeout=60)

    def test_a_key_made_just_after_a_second_turns_is_issued_in_that_second(self):
        # Just after the wall clock turns a second, a key made then is issued in the new
        # second, never in the one before (a clock that lags by a tick, as time() does, put it
        # there; a script comparing with `date +%s` taken first saw it issued before it asked).
        for _ in range(6):
            while (frac := time.time() % 1) > 0.0005:  # sleep to 10 ms before, then spin
                time.sleep(max(0.0, 0.99 - frac))
            before = int(time.time())
            p = self.run_cmd("token", "--token-file", self.master, "jobA")
            self.assertEqual(p.returncode, 0, p.stderr)
            issued = int(p.stdout.split(":")[2])
            self.assertGreaterEqual(issued, before, p.stdout)

    def test_dlaunch_token_makes_keys_that_end(self):
        before = int(time.time())
        p = self.run_cmd("token", "--token-file", self.master, "jobA")
        self.assertEqual(p.returncode, 0, p.stderr)
        m = re.fullmatch(r"dlaunch-job-v2:jobA:(\d+):(\d+):[0-9a-f]{64}\n", p.stdout)
        self.assertIsNotNone(m, p.stdout)
        issued, expires = int(m.group(1)), int(m.group(2))
        self.assertGreaterEqual(issued, before)
        self.assertEqual(expires - issued, 7 * DAY)  # the documented default
        # The key is what the formula gives for its span.
        self.assertEqual(p.stdout.strip(), job_key("jobA", issued, expires))
        _, text = self.make_key("h.key", "jobA", "--expires", "90m")
        self.assertEqual(int(text.split(":")[-2]) - issued_of(text), 5400)
        # Its worker key keeps its span, made from the job key as from the token.
        job_file = self.token("j.key", text)
        p = self.run_cmd("token", "--worker", "--token-file", job_file, "jobA")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout.strip(), worker_key(text))
        # A job key keeps its own expiry; bad lifetimes are refused, naming the flag.
        p = self.run_cmd("token", "--worker", "--expires", "1d", "--token-file", job_file, "jobA")
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("keeps its own expiry", p.stderr)
        for bad in ("0", "-1h", "367d", "1w", "1.5h", "99999999999999999999"):
            p = self.run_cmd("token", "--expires", bad, "--token-file", self.master, "jobA")
            self.assertEqual(p.returncode, 2, (bad, p.stderr))
            self.assertTrue(one_line(p.stderr), p.stderr)
            self.assertIn("--expires", p.stderr)

    def test_a_version_1_key_is_refused_saying_to_make_a_new_one(self):
        self.start()
        hexkey = hmac.new(MASTER.encode(), b"dlaunch job key v1\njobA", hashlib.sha256).hexdigest()
        v1 = self.token("v1.key", f"dlaunch-job-v1:jobA:{hexkey}")
        p = self.ctl("status", v1, "jobA")
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertTrue(one_line(p.stderr), p.stderr)
        self.assertIn("version 1", p.stderr)
        self.assertIn("dlaunch token", p.stderr)


class Renewal(Keys):
    def test_a_job_run_with_the_token_gets_a_fresh_worker_key_at_each_restart(self):
        # A key made from the token ends (7 days), a job run with the token must not: its
        # agent makes its workers a new key, issued then, at every restart.
        script = ('cut -d: -f3,4 "$DLAUNCH_TOKEN_FILE"; "$D" kv set k v || exit 3; '
                  'if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then sleep 1.5; exit 1; fi')
        a = self.agent("a", "-q", "--run-id", "renew", "--gpus-per-node", "1",
                       "--max-restarts", "1", "--token-file", self.master, "--",
                       "sh", "-c", script, env={"D": dltest.DLAUNCH})
        self.assertEqual(a.wait(timeout=90), 0, self.read("a.log"))
        spans = [tuple(map(int, self.read("dlaunch_logs", "renew", f"attempt_{k}",
                                          "rank_0.out").split(":")))
                 for k in (0, 1)]
        for issued, expires in spans:
            self.assertEqual(expires - issued, 7 * DAY)
        self.assertGreater(spans[1][0], spans[0][0], spans)


class Revocation(Keys):
    def test_a_revoked_runs_older_keys_are_refused_and_a_newer_one_works(self):
        self.start()
        old, old_text = self.make_key("old.key", "jobA")
        a = self.job("a", "jobA", old, "sleep", "60")
        self.wait_started(["a"])
        self.assertEqual(self.ctl("status", old, "jobA").returncode, 0)
        self.wait_past(issued_of(old_text))
        # Only the server's own token withdraws keys.
        p = self.ctl("revoke", old, "jobA")
        self.assertEqual(p.returncode, 4, p.stderr)
        self.assertIn("server's own token", p.stderr)
        p = self.ctl("revoke", self.master, "jobA")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertRegex(p.stdout, r"^jobA: keys issued before \d{4}-\d\d-\d\dT[\d:]+Z are "
                                   r"refused\n$")
        # The old key: refused for control and store, and the agents holding it are cut off.
        for cmd in ("status", "stop"):
            p = self.ctl(cmd, old, "jobA")
            self.assertEqual(p.returncode, 4, (cmd, p.stderr))
            self.assertTrue(one_line(p.stderr), p.stderr)
            self.assertIn("revoked", p.stderr)
        p = self.kv(worker_key(old_text), "jobA", "get", "k")
        self.assertEqual(p.returncode, 4, p.stderr)
        self.assertIn("revoked", p.stderr)
        self.assertNotEqual(a.wait(timeout=90), 0, self.read("a.log"))
        self.assertIn("revoked", self.read("a.log"))
        # A key made after the revocation works; other runs are untouched.
        new, _ = self.make_key("new.key", "jobA")
        self.assertEqual(self.kv(self.read("new.key").strip(), "jobA", "set", "k", "v")
                         .returncode, 0)
        other, _ = self.make_key("other.key", "jobB")
        b = self.job("b", "jobB", other, "sleep", "30")
        self.wait_started(["b"])
        self.assertEqual(self.ctl("status", other, "jobB").returncode, 0)
        self.assertEqual(self.ctl("stop", other, "jobB").returncode, 0)
        self.assertEqual(b.wait(timeout=60), 0, self.read("b.log"))
        # Revocation only grows: an earlier --before changes nothing.
        p = self.run_cmd("revoke", "--endpoint", self.endpoint, "--token-file", self.master,
                         "--before", "2020-01-01T00:00:00Z", "jobA")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertNotIn("2020-01-01", p.stdout)
        self.assertEqual(self.ctl("status", old, "jobA").returncode, 4)
        for bad in ("yesterday", "2026-13-01T00:00:00Z", "-5", "253402300800",
                    "2999-01-01T00:00:00Z"):
            p = self.run_cmd("revoke", "--endpoint", self.endpoint, "--token-file", self.master,
                             "--before", bad, "jobA")
            self.assertEqual(p.returncode, 2, (bad, p.stderr))
            self.assertIn("--before", p.stderr)

    def test_a_key_of_an_earlier_instance_cannot_stop_a_later_one(self):
        self.start("--linger", "0")
        first, first_text = self.make_key("first.key", "jobA")
        one = self.job("one", "jobA", first, "true")
        self.assertEqual(one.wait(timeout=60), 0, self.read("one.log"))
        # The run id is used again; the site withdraws the keys of the first instance.
        self.wait_past(issued_of(first_text))
        p = self.ctl("revoke", self.master, "jobA")
        self.assertEqual(p.returncode, 0, p.stderr)
        second, _ = self.make_key("second.key", "jobA")
        two = self.job("two", "jobA", second, "sleep", "60")
        self.wait_started(["two"])
        for cmd in ("stop", "restart", "status"):
            p = self.ctl(cmd, first, "jobA")
            self.assertEqual(p.returncode, 4, (cmd, p.stderr))
            self.assertIn("revoked", p.stderr)
        self.assertIsNone(two.poll(), self.read("two.log"))
        self.assertFalse(any(e["event"] == "restart" for e in self.evs("two")))
        p = self.ctl("stop", second, "jobA")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(two.wait(timeout=60), 0, self.read("two.log"))

    def test_revocations_survive_a_restart_of_dlaunchd(self):
        path = os.path.join(self.dir, "revoked.json")
        d = self.start("--revocations", path)
        old, old_text = self.make_key("old.key", "jobA")
        self.wait_past(issued_of(old_text))
        p = self.ctl("revoke", self.master, "jobA")
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(path) as f:
            self.assertEqual(list(json.load(f)), ["jobA"])
        self.assertEqual(os.stat(path).st_mode & 0o777, 0o600)
        d.terminate()
        d.wait(timeout=30)
        self.start("--revocations", path)
        new, _ = self.make_key("new.key", "jobA")
        a = self.job("a", "jobA", new, "sleep", "30")
        self.wait_started(["a"])
        p = self.ctl("stop", old, "jobA")
        self.assertEqual(p.returncode, 4, p.stderr)
        self.assertIn("revoked", p.stderr)
        self.assertEqual(self.ctl("stop", new, "jobA").returncode, 0)
        self.assertEqual(a.wait(timeout=60), 0, self.read("a.log"))

    def test_a_bad_revocations_file_stops_dlaunchd_with_a_line_naming_it(self):
        for name, text in (("notjson", "{"), ("badrun", '{"a/b": 5}'), ("badtime", '{"a": -1}'),
                           ("list", "[]")):
            path = self.write(f"{name}.json", text)
            p = subprocess.run([dltest.DLAUNCHD, "--listen", "127.0.0.1:0", "--token-file",
                                self.master, "--revocations", path], timeout=30,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            self.assertEqual(p.returncode, 2, (name, p.stderr))
            self.assertIn(f"revocations file '{path}'", p.stderr)
            # One line (a sanitizer build adds a warning of its own about malloc's settings).
            lines = [l for l in p.stderr.strip().split("\n")
                     if not l.startswith("dlaunchd: warning:")]
            self.assertEqual(len(lines), 1, p.stderr)


if __name__ == "__main__":
    dltest.main()
