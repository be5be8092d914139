"""A real etcd cluster for the etcd rendezvous tests: three members (Debian's etcd-server) on
loopback ports, their data in a temporary folder, every process gone when the cluster stops,
whatever happened. Members can be killed and started again mid-test, TLS and user/password auth
set up with certificates made here by openssl.

    with etcdlib.Cluster() as c:          # 3 members, plain http
        c.endpoints                       # "127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3"
        c.kill(1); c.restart(1)           # SIGKILL a member, start it again on its data
        c.get_prefix("/dlaunch/job/")     # what the job left there (etcdctl)

Run as a program it starts a cluster, prints its endpoints and waits for a signal, for trying
dlaunch by hand: python3 tests/integration/etcdlib.py [--tls] [--auth]"""
import os
import ctypes
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

ETCD = shutil.which("etcd") or "/usr/bin/etcd"
ETCDCTL = shutil.which("etcdctl") or "/usr/bin/etcdctl"


_LIBC = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG = 1


def _die_with_the_test():
    """In a member before exec: a test killed by its time limit (SIGKILL, no teardown) takes
    its members with it, where they would otherwise beat for the rest of the suite."""
    _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def have_etcd():
    return os.access(ETCD, os.X_OK) and os.access(ETCDCTL, os.X_OK)


def _free_ports(n):
    """n distinct ports below the ephemeral range that nothing listens on now."""
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    ports = []
    while len(ports) < n:
        port = rng.randrange(20000, 32000)
        if port in ports:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        ports.append(port)
    return ports


def make_certs(folder, names=("127.0.0.1", "localhost")):
    """A CA, a server certificate for 127.0.0.1/localhost and a client certificate, all made
    with openssl here. Returns a dict of paths: ca, server_cert, server_key, client_cert,
    client_key, and other_ca (a CA that signed nothing of this cluster)."""
    os.makedirs(folder, exist_ok=True)
    p = {k: os.path.join(folder, f) for k, f in (
        ("ca", "ca.pem"), ("ca_key", "ca.key"), ("server_cert", "server.pem"),
        ("server_key", "server.key"), ("client_cert", "client.pem"),
        ("client_key", "client.key"), ("other_ca", "other-ca.pem"),
        ("other_ca_key", "other-ca.key"))}

    def run(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    for ca, key, cn in ((p["ca"], p["ca_key"], "dlaunch test CA"),
                        (p["other_ca"], p["other_ca_key"], "some other CA")):
        run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={cn}",
            "-keyout", key, "-out", ca)
    san = ",".join(("IP:" if n[0].isdigit() else "DNS:") + n for n in names)
    ext = os.path.join(folder, "ext.cnf")
    # The client certificate has no CommonName: etcd 3.4's JSON gateway refuses a client
    # certificate that has one (it would otherwise stand for an etcd user name).
    for cert, key, subj, usage in ((p["server_cert"], p["server_key"], "/CN=etcd",
                                    "serverAuth,clientAuth"),
                                   (p["client_cert"], p["client_key"], "/O=dlaunch test client",
                                    "clientAuth")):
        with open(ext, "w") as f:
            f.write(f"subjectAltName={san}\nextendedKeyUsage={usage}\n")
        csr = cert + ".csr"
        run("req", "-newkey", "rsa:2048", "-nodes", "-subj", subj, "-keyout", key,
            "-out", csr)
        run("x509", "-req", "-in", csr, "-CA", p["ca"], "-CAkey", p["ca_key"],
            "-CAcreateserial", "-days", "2", "-extfile", ext, "-out", cert)
        os.unlink(csr)
    for k in ("server_key", "client_key", "ca_key", "other_ca_key"):
        os.chmod(p[k], 0o600)
    return p


class Cluster:
    """n etcd members on 127.0.0.1. tls: serve clients over https (certificates in
    self.certs, client certificates required); the peers talk plain http among themselves.
    Timing is tightened (heartbeat 50 ms, election 500 ms), so that leases of one second are
    allowed (etcd's floor is 1.5 election timeouts) and a lost leader is replaced quickly."""

    def __init__(self, n=3, tls=False, folder=None):
        self.n = n
        self.tls = tls
        self.own_folder = folder is None
        self.folder = folder or tempfile.mkdtemp(prefix="dl-etcd-")
        os.makedirs(self.folder, exist_ok=True)
        ports = _free_ports(2 * n)
        self.client_ports = ports[:n]
        self.peer_ports = ports[n:]
        self.names = [f"m{i}" for i in range(n)]
        self.procs = [None] * n
        self.logs = [os.path.join(self.folder, f"{name}.log") for name in self.names]
        self.certs = make_certs(os.path.join(self.folder, "certs")) if tls else None
        self.auth = None  # (user, password) once enable_auth ran
        self.token = f"dl-{os.getpid()}-{random.randrange(1 << 30)}"

    @property
    def scheme(self):
        return "https" if self.tls else "http"

    @property
    def endpoints(self):
        return ",".join(f"127.0.0.1:{p}" for p in self.client_ports)

    def endpoint(self, i):
        return f"127.0.0.1:{self.client_ports[i]}"

    def _cmd(self, i, new):
        name = self.names[i]
        cluster = ",".join(f"{m}=http://127.0.0.1:{p}"
                           for m, p in zip(self.names, self.peer_ports))
        url = f"{self.scheme}://127.0.0.1:{self.client_ports[i]}"
        cmd = [ETCD, "--name", name, "--data-dir", os.path.join(self.folder, name),
               "--listen-client-urls", url, "--advertise-client-urls", url,
               "--listen-peer-urls", f"http://127.0.0.1:{self.peer_ports[i]}",
               "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.peer_ports[i]}",
               "--initial-cluster", cluster, "--initial-cluster-token", self.token,
               "--initial-cluster-state", "new" if new else "existing",
               "--heartbeat-interval", "50", "--election-timeout", "500",
               "--logger", "zap", "--log-outputs", "stderr"]
        if self.tls:
            cmd += ["--cert-file", self.certs["server_cert"], "--key-file",
                    self.certs["server_key"], "--trusted-ca-file", self.certs["ca"],
                    "--client-cert-auth"]
        return cmd

    def _spawn(self, i, new):
        log = open(self.logs[i], "a")
        self.procs[i] = subprocess.Popen(self._cmd(i, new), stdout=log, stderr=log,
                                         stdin=subprocess.DEVNULL, start_new_session=True,
                                         preexec_fn=_die_with_the_test)
        log.close()

    def start(self, timeout=30):
        for i in range(self.n):
            self._spawn(i, new=True)
        self.wait_healthy(timeout=timeout)
        return self

    def ctl(self, *args, endpoints=None, user=True, check=True, timeout=20):
        """Runs etcdctl (v3 API) against the cluster; returns the CompletedProcess."""
        env = dict(os.environ, ETCDCTL_API="3")
        cmd = [ETCDCTL, "--endpoints",
               endpoints or ",".join(f"{self.scheme}://{e}" for e in self.endpoints.split(",")),
               "--dial-timeout", "2s", "--command-timeout", "5s"]
        if self.tls:
            cmd += ["--cacert", self.certs["ca"], "--cert", self.certs["client_cert"], "--key",
                    self.certs["client_key"]]
        if user and self.auth is not None:
            cmd += ["--user", f"{self.auth[0]}:{self.auth[1]}"]
        p = subprocess.run(cmd + list(args), env=env, capture_output=True, text=True,
                           timeout=timeout)
        if check and p.returncode != 0:
            raise RuntimeError(f"etcdctl {' '.join(args)}: {p.stderr.strip()}")
        return p

    def wait_healthy(self, members=None, timeout=30):
        """Waits until the members (default: all running ones) answer a linearized read."""
        members = members if members is not None else [
            i for i in range(self.n) if self.procs[i] is not None]
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            for i in members:
                if self.procs[i].poll() is not None:
                    raise RuntimeError(f"etcd member {self.names[i]} exited "
                                       f"{self.procs[i].returncode}:\n{self.log_tail(i)}")
            eps = ",".join(f"{self.scheme}://{self.endpoint(i)}" for i in members)
            try:
                p = self.ctl("endpoint", "health", endpoints=eps, check=False, timeout=10)
                last = p.stdout + p.stderr
                if p.returncode == 0:
                    return
            except subprocess.TimeoutExpired:
                last = "etcdctl timed out"
            time.sleep(0.1)
        raise RuntimeError(f"etcd cluster not healthy after {timeout} s: {last}\n" +
                           "\n".join(self.log_tail(i) for i in range(self.n)))

    def log_tail(self, i, lines=15):
        try:
            with open(self.logs[i]) as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    def kill(self, i, sig=signal.SIGKILL):
        p = self.procs[i]
        if p is not None and p.poll() is None:
            p.send_signal(sig)
            p.wait(timeout=10)

    def restart(self, i, wait=True):
        """Starts member i again on its data (after kill)."""
        self.kill(i)
        self._spawn(i, new=False)
        if wait:
            self.wait_healthy(members=[i])

    def enable_auth(self, user="dl", password="s3cret"):
        """Turns on etcd's authentication: root (needed to enable it) and user with read/write
        on every key. Returns (user, password)."""
        root_pw = "rootpw"
        self.ctl("user", "add", f"root:{root_pw}")
        self.ctl("user", "add", f"{user}:{password}")
        self.ctl("role", "add", "dl")
        self.ctl("role", "grant-permission", "dl", "--prefix=true", "readwrite", "/")
        self.ctl("user", "grant-role", user, "dl")
        self.ctl("auth", "enable")
        self.auth = (user, password)
        return self.auth

    def get_prefix(self, prefix):
        """Keys (and values) under prefix, as a dict of str."""
        p = self.ctl("get", "--prefix", prefix)
        lines = p.stdout.splitlines()
        return dict(zip(lines[0::2], lines[1::2]))

    def stop(self):
        for i in range(self.n):
            p = self.procs[i]
            if p is None:
                continue
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            p.wait(timeout=10)
        if self.own_folder:
            shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def main():
    tls = "--tls" in sys.argv
    c = Cluster(tls=tls).start()
    try:
        if "--auth" in sys.argv:
            print("auth: user %s password %s" % c.enable_auth())
        print(f"endpoints: {c.endpoints}" + (f" (https; certificates in {c.folder}/certs)"
                                            if tls else ""), flush=True)
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        c.stop()


if __name__ == "__main__":
    main()
