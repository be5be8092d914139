"""The operators' HTTP side (docs/operations.md): dlaunchd --http and dlaunch --http serve
/metrics, the status page and /api/jobs while real jobs run; a real Prometheus scrapes them and a
real headless Chromium renders the page."""
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import unittest
import urllib.error
import urllib.parse
import urllib.request

import dltest
import etcdlib
from dltest import free_port

PROMETHEUS = shutil.which("prometheus")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FASHION = "/usr/share/datasets/fashion-mnist"
ARTIFACTS = os.path.join(os.environ.get("BUILD_ROOT", "build"), "test-artifacts")


def get(url, headers=None, timeout=10):
    """(status, headers, body text) of a GET, errors included."""
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.headers, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read().decode()


def http_port(log_path, timeout=30):
    """The port in dlaunchd's 'serving ...; http://HOST:PORT/' line."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(log_path) as f:
            m = re.search(r"http://[^\s/]*:(\d+)/", f.read())
        if m:
            return int(m.group(1))
        time.sleep(0.05)
    raise RuntimeError(f"no http line in {log_path}")


class Base(dltest.Case):
    def setUp(self):
        super().setUp()
        self.procs = []  # what is not an agent: dlaunchd, prometheus
        self.cluster = dltest.Cluster(self, endpoint=False, run_id=None, args=[
            "--gpus-per-node", "1", "--heartbeat", "0.2", "--join-timeout", "60"])

    def tearDown(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        super().tearDown()

    def daemon(self, *args):
        log = os.path.join(self.dir, "dlaunchd.log")
        d, port = dltest.start_dlaunchd(log, "--http", "127.0.0.1:0", *args)
        self.procs.append(d)
        return d, port, http_port(log)

    def agent(self, name, endpoint, *args, run_id="job", nodes="2", env=None):
        return self.cluster.agent(*args, name=name, nodes=nodes, env=env, endpoint=endpoint,
                                  run_id=run_id)

    def log(self, name):
        return self.cluster.log(name)

    def wait_json(self, url, pred, timeout=60):
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            status, _, body = get(url)
            if status == 200:
                last = json.loads(body)
                if pred(last):
                    return last
            time.sleep(0.1)
        self.fail(f"timed out waiting on {url}; last: {last}")


class Endpoints(Base):
    def test_endpoints_of_dlaunchd(self):
        _, port, hport = self.daemon()
        base = f"http://127.0.0.1:{hport}"
        # A job that fails once and then runs until stopped.
        cmd = ["--", "sh", "-c",
               'if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && [ "$RANK" = 1 ]; then '
               'echo boom >&2; exit 3; fi; exec sleep 30']
        a = [self.agent(f"a{i}", f"127.0.0.1:{port}", "--max-restarts", "2", *cmd)
             for i in range(2)]
        job = self.wait_json(f"{base}/api/jobs/job",
                             lambda j: j["state"] == "running" and j["round"] == 1)
        self.assertEqual(len(job["nodes"]), 2)
        self.assertEqual(job["restarts_by_cause"], {"worker_failed": 1})
        self.assertEqual(job["last_failure"]["rank"], 1)
        self.assertEqual(job["last_failure"]["exit_code"], 3)
        self.assertIn("boom", job["last_failure"]["log_tail"])
        self.assertEqual(job["history"][0]["cause"], "worker_failed")
        for n in job["nodes"]:
            self.assertGreaterEqual(n["heartbeat_age"], 0)
            self.assertLess(n["heartbeat_age"], 10)
        # The same status fields as `dlaunch status --json`.
        st = subprocess.run([dltest.DLAUNCH, "status", "--json", "--endpoint",
                             f"127.0.0.1:{port}", "job"], capture_output=True, text=True,
                            timeout=30)
        self.assertEqual(st.returncode, 0, st.stderr)
        status = json.loads(st.stdout)
        for k in ("run_id", "state", "round", "restarts", "max_restarts", "world_size"):
            self.assertEqual(status[k], job[k], k)
        self.assertEqual(sorted(n["node_id"] for n in status["nodes"]),
                         sorted(n["node_id"] for n in job["nodes"]))

        code, hdrs, body = get(f"{base}/api/jobs")
        self.assertEqual(code, 200)
        self.assertEqual(hdrs["Content-Type"], "application/json")
        self.assertEqual([j["run_id"] for j in json.loads(body)["jobs"]], ["job"])
        self.assertEqual(get(f"{base}/api/jobs/nope")[0], 404)
        self.assertEqual(get(f"{base}/nope")[0], 404)
        req = urllib.request.Request(f"{base}/metrics", method="POST", data=b"x")
        with self.assertRaises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10)
        self.assertEqual(e.exception.code, 405)

        code, hdrs, text = get(f"{base}/metrics")
        self.assertEqual(code, 200)
        self.assertTrue(hdrs["Content-Type"].startswith("text/plain; version=0.0.4"))
        self.assertIn('dlaunch_jobs{state="running"} 1', text)
        self.assertIn('dlaunch_job_restarts_total{run_id="job",reason="worker_failed"} 1', text)
        self.assertRegex(text, r'dlaunch_node_heartbeat_age_seconds\{run_id="job",node="[^"]+",'
                               r'host="[^"]+"\} [0-9.e-]+\n')
        self.assertRegex(text, r"process_resident_memory_bytes [1-9]\d*\n")
        self.assertRegex(text, r'dlaunch_rendezvous_round_seconds_bucket\{le="\+Inf"\} 2\n')
        # Every sample belongs to a family declared before it, and no family twice.
        declared = []
        for line in text.splitlines():
            if line.startswith("# TYPE "):
                name = line.split()[2]
                self.assertNotIn(name, declared)
                declared.append(name)
            elif line and not line.startswith("#"):
                base_name = re.match(r"[a-z_]+", line).group(0)
                fam = re.sub(r"_(bucket|sum|count)$", "", base_name)
                self.assertIn(declared[-1], (base_name, fam), line)

        code, hdrs, html = get(f"{base}/")
        self.assertEqual(code, 200)
        self.assertNotIn("<script", html)
        self.assertIn('id="job-job"', html)
        self.assertIn("Last failure", html)
        self.assertIn("boom", html)
        self.assertIn("default-src 'none'", hdrs["Content-Security-Policy"])

        stop = subprocess.run([dltest.DLAUNCH, "stop", "--endpoint", f"127.0.0.1:{port}", "job"],
                              capture_output=True, text=True, timeout=30)
        self.assertEqual(stop.returncode, 0, stop.stderr)
        for p in a:
            p.wait(timeout=60)

    def test_token_protects_http(self):
        token = self.write("token", "s3cret\n")
        os.chmod(token, 0o600)
        _, _, hport = self.daemon("--token-file", token)
        url = f"http://127.0.0.1:{hport}/metrics"
        code, hdrs, _ = get(url)
        self.assertEqual(code, 401)
        self.assertEqual(hdrs["WWW-Authenticate"], "Bearer")
        self.assertEqual(get(url, {"Authorization": "Bearer wrong"})[0], 401)
        self.assertEqual(get(url, {"Authorization": "Bearer s3cret"})[0], 200)

    def test_bad_http_flags(self):
        cases = [
            ([dltest.DLAUNCHD, "--http", "nohost"], "dlaunchd: --http: 'nohost' is not ADDR:PORT"),
            ([dltest.DLAUNCHD, "--listen", "127.0.0.1:0", "--http", "0.0.0.0:0"],
             "dlaunchd: --http: refusing to serve HTTP on 0.0.0.0:0: only loopback is served"),
            ([dltest.DLAUNCHD, "--http"], "dlaunchd: option '--http' needs a value (ADDR:PORT)"),
            ([dltest.DLAUNCHD, "--htpp", "127.0.0.1:0"],
             "dlaunchd: unknown option '--htpp' (did you mean --http? see dlaunchd --help)"),
            ([dltest.DLAUNCHD, "--listen="], "dlaunchd: --listen: must not be empty"),
            ([dltest.DLAUNCHD, "--verbose=yes"], "dlaunchd: option '--verbose' takes no value"),
            ([dltest.DLAUNCH, "--http", "127.0.0.1:0", "--", "true"],
             "dlaunch: --http: only the node that hosts a rendezvous serves it"),
        ]
        for argv, want in cases:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=30, cwd=self.dir)
            self.assertEqual(p.returncode, 2, (argv, p.stderr))
            self.assertIn(want, p.stderr)
        # A port in use: the error names the address and the cause.
        _, _, hport = self.daemon()
        p = subprocess.run([dltest.DLAUNCHD, "--listen", "127.0.0.1:0", "--http",
                            f"127.0.0.1:{hport}"], capture_output=True, text=True, timeout=30)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn(f"cannot serve HTTP on 127.0.0.1:{hport}: Address already in use", p.stderr)


@unittest.skipUnless(PROMETHEUS, "prometheus is not installed")
class Prometheus(Base):
    def test_prometheus_sees_the_restart_and_the_heartbeats(self):
        _, port, hport = self.daemon()
        pport = free_port()
        cfg = self.write("prometheus.yml", f"""
global:
  scrape_interval: 250ms
  scrape_timeout: 200ms
scrape_configs:
  - job_name: dlaunchd
    static_configs:
      - targets: ['127.0.0.1:{hport}']
""")
        log = open(os.path.join(self.dir, "prometheus.log"), "w")
        prom = subprocess.Popen(
            [PROMETHEUS, f"--config.file={cfg}",
             f"--storage.tsdb.path={os.path.join(self.dir, 'tsdb')}",
             f"--web.listen-address=127.0.0.1:{pport}", "--log.level=warn"],
            stdout=log, stderr=subprocess.STDOUT, cwd=self.dir)
        log.close()
        self.procs.append(prom)
        api = f"http://127.0.0.1:{pport}"
        deadline = time.monotonic() + 60
        while not self.ready(api):
            self.assertIsNone(prom.poll(), self.read("prometheus.log"))
            self.assertLess(time.monotonic(), deadline, "prometheus did not get ready")
            time.sleep(0.2)

        # Prometheus applies its targets a few seconds after it starts: the job starts once it
        # scrapes, so that it watches the whole job.
        self.query_until(api, 'up{job="dlaunchd"} == 1', lambda r: r)

        # Two nodes; rank 1 fails in the first attempt, then both succeed.
        cmd = ["--", "sh", "-c",
               'if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && [ "$RANK" = 1 ]; then sleep 1; '
               'exit 3; fi; sleep 2']
        agents = [self.agent(f"a{i}", f"127.0.0.1:{port}", "--max-restarts", "2",
                             run_id="promjob", *cmd) for i in range(2)]
        for i, p in enumerate(agents):
            self.assertEqual(p.wait(timeout=120), 0, self.log(f"a{i}"))

        q = 'dlaunch_job_restarts_total{run_id="promjob",reason="worker_failed"}'
        res = self.query_until(api, q, lambda r: r and float(r[0]["value"][1]) == 1)
        self.assertEqual(res[0]["metric"]["reason"], "worker_failed")
        ages = self.query_until(api, 'dlaunch_node_heartbeat_age_seconds{run_id="promjob"}',
                                lambda r: len(r) == 2)
        self.assertEqual(len({r["metric"]["node"] for r in ages}), 2)
        for r in ages:
            self.assertGreaterEqual(float(r["value"][1]), 0)
        # While the job ran, some scrape saw both nodes beating recently.
        recent = self.query_until(
            api, 'max_over_time(dlaunch_job_state{run_id="promjob",state="running"}[5m])',
            lambda r: r and float(r[0]["value"][1]) == 1)
        self.assertTrue(recent)

    def ready(self, api):
        try:
            return get(f"{api}/-/ready", timeout=2)[0] == 200
        except OSError:
            return False

    def query_until(self, api, q, pred, timeout=30):
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            code, _, body = get(f"{api}/api/v1/query?" + urllib.parse.urlencode({"query": q}))
            if code == 200:
                last = json.loads(body)["data"]["result"]
                if pred(last):
                    return last
            time.sleep(0.25)
        self.fail(f"prometheus: {q} never matched; last result {last}")


@unittest.skipUnless(CHROMIUM, "chromium is not installed")
@unittest.skipUnless(os.path.isdir(FASHION), "dataset-fashion-mnist is not installed")
class StatusPage(Base):
    def chromium(self, *args, timeout=120):
        profile = tempfile.mkdtemp(prefix="dl-chromium-", dir=self.dir)
        return subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--no-first-run", f"--user-data-dir={profile}", *args],
            capture_output=True, text=True, timeout=timeout)

    def test_page_in_chromium_during_a_training_job(self):
        """Node 0's agent hosts the rendezvous and serves the page beside it."""
        port = free_port()
        self.page_in_chromium(f"127.0.0.1:{port}", (), "status-page.png")

    @unittest.skipUnless(etcdlib.have_etcd(), "etcd-server is not installed")
    def test_page_in_chromium_during_an_etcd_job(self):
        """--rdzv-backend etcd: node 0's agent serves the page of the job as etcd holds it
        (docs/etcd.md, "Control"), with the same sections, charts and failure."""
        with etcdlib.Cluster() as cluster:
            self.page_in_chromium(cluster.endpoints, ("--rdzv-backend", "etcd"),
                                  "status-page-etcd.png")

    def page_in_chromium(self, endpoint, backend, shot_name):
        """A training job of two nodes whose rank 1 fails at step 200 once, node 0's agent with
        --http: the page Chromium renders shows the job, its nodes, the progress with its charts
        and the failure; its screenshot goes to the build's test-artifacts as shot_name."""
        self.write("job.yaml", """gpus_per_node: 1
max_restarts: 2
recovery: restart
train:
  steps: 1000000
  log_every: 20
  layers: 784-64-10
  batch_size: 32
  fail_at_step: 200
  fail_rank: 1
""")
        a0 = self.agent("a0", endpoint, *backend, "--node-rank", "0", "--http", "127.0.0.1:0",
                        "job.yaml", run_id="fashion-mnist")
        a1 = self.agent("a1", endpoint, *backend, "--node-rank", "1", "job.yaml",
                        run_id="fashion-mnist")
        deadline = time.monotonic() + 60
        while not re.search(r"http://127\.0\.0\.1:(\d+)/", self.log("a0")):
            self.assertIsNone(a0.poll(), self.log("a0"))
            self.assertLess(time.monotonic(), deadline, self.log("a0"))
            time.sleep(0.05)
        base = "http://127.0.0.1:" + re.search(r"http://127\.0\.0\.1:(\d+)/",
                                                self.log("a0")).group(1)
        # After the failure and restart, enough progress for the charts to have a few points.
        job = self.wait_json(f"{base}/api/jobs/fashion-mnist",
                             lambda j: j["round"] == 1 and j["state"] == "running" and
                             len([p for p in j.get("progress", []) if "loss" in p]) >= 5,
                             timeout=120)
        dom = self.chromium("--dump-dom", f"{base}/")
        self.assertEqual(dom.returncode, 0, dom.stderr[-2000:])
        html = dom.stdout
        self.assertIn('<section class="job" id="job-fashion-mnist">', html)
        for n in job["nodes"]:
            self.assertIn(f"<td>{n['node_id']}</td>", html)
        m = re.search(r'<p class="progress">Training: step <b>(\d+)</b>, loss <b>([0-9.]+)</b>',
                      html)
        self.assertTrue(m, html[:3000])
        self.assertGreater(int(m.group(1)), 0)
        self.assertGreaterEqual(html.count("<polyline"), 3)
        self.assertIn("Last failure", html)

        os.makedirs(ARTIFACTS, exist_ok=True)
        shot = os.path.join(ARTIFACTS, shot_name)
        if os.path.exists(shot):
            os.unlink(shot)
        s = self.chromium("--window-size=1100,900", "--hide-scrollbars",
                          f"--screenshot={shot}", f"{base}/")
        self.assertEqual(s.returncode, 0, s.stderr[-2000:])
        with open(shot, "rb") as f:
            png = f.read()
        self.assertEqual(png[:8], b"\x89PNG\r\n\x1a\n")
        self.assertGreater(len(png), 10000)

        for p in (a0, a1):
            p.send_signal(signal.SIGTERM)
        for p in (a0, a1):
            p.wait(timeout=60)
        self.assert_gone([a0.pid, a1.pid])


if __name__ == "__main__":
    dltest.main()
