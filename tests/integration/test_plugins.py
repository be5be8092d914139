"""etcd (libcurl) and the status server (libmicrohttpd) are plugins that dlaunch loads only when
a job asks for them, and libyaml is opened for a job spec only: a plain launch maps none of them, and asking for one that cannot be
loaded (the plugin missing, or a library it needs missing) gets one line naming what is missing
and exit 2, never a crash. That each feature works when loaded is what test_etcd.py and
test_http.py show; they run through the same plugins."""
import json
import os
import re
import shutil
import subprocess
import urllib.request

import dltest

DLAUNCHD = dltest.DLAUNCHD
BUILD_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(dltest.DLAUNCH)))
PLUGINS = {"etcd": ("libcurl.so.4", b"libcurl.so.4\0", b"libcurX.so.4\0"),
           "http": ("libmicrohttpd.so.12", b"libmicrohttpd.so.12\0", b"libmicrohttpX.so.12\0")}
# What libcurl brings along (TLS, Kerberos, LDAP, SSH, compression), and libcrypto (opened for
# the first HMAC, proto/hmac.c): none is for a plain launch.
HEAVY = ["libcurl", "libmicrohttpd", "libcrypto", "libyaml", "libssl", "libgnutls", "libgssapi", "libldap", "libssh",
         "libz.", "libnghttp2", "libidn2", "libzstd", "libbrotli"]


def libraries(path):
    out = subprocess.run(["ldd", path], capture_output=True, text=True, check=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


class Plugins(dltest.Case):
    def run_cmd(self, argv, env=None, timeout=60):
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("DLAUNCH_")}
        full_env.update(env or {})
        return subprocess.run(argv, cwd=self.dir, env=full_env, capture_output=True, text=True,
                              timeout=timeout)

    def empty_dir(self):
        d = os.path.join(self.dir, "no-plugins")
        os.makedirs(d, exist_ok=True)
        return d

    def broken_dir(self):
        """The real plugins, each with the name of its library changed to one that does not
        exist: what a machine without libcurl or libmicrohttpd gives."""
        d = os.path.join(self.dir, "broken-plugins")
        os.makedirs(d, exist_ok=True)
        for name, (_, real, gone) in PLUGINS.items():
            with open(os.path.join(BUILD_ROOT, name, f"dlaunch-{name}.so"), "rb") as f:
                data = f.read()
            self.assertIn(real, data)
            self.assertEqual(len(real), len(gone))  # offsets in the file stay as they are
            with open(os.path.join(d, f"dlaunch-{name}.so"), "wb") as f:
                f.write(data.replace(real, gone))
        return d

    def assert_one_line(self, p, *want):
        self.assertEqual(p.returncode, 2, p.stderr)
        # Warnings of their own (a sanitizer build's dlaunchd says one about mallopt) aside.
        lines = [x for x in p.stderr.strip().splitlines() if ": warning: " not in x]
        self.assertEqual(len(lines), 1, p.stderr)
        for w in want:
            self.assertIn(w, lines[0])
        return lines[0]

    def test_programs_link_neither_library(self):
        for prog in [dltest.DLAUNCH, DLAUNCHD]:
            libs = libraries(prog)
            heavy = [lib for lib in libs if any(lib.startswith(h) for h in HEAVY)]
            self.assertEqual(heavy, [], f"{prog}: {libs}")
            self.assertLessEqual(len(libs), 12, f"{prog}: {libs}")
        for name, (lib, _, _) in PLUGINS.items():
            plugin = os.path.join(BUILD_ROOT, name, f"dlaunch-{name}.so")
            self.assertTrue(any(x.startswith(lib) for x in libraries(plugin)), plugin)

    def test_the_loader_finds_each_library_at_its_first_try(self):
        # A folder in RUNPATH that holds none of them (the trainer's OpenBLAS once put
        # openblas-pthread there) costs every start a miss per library and hwcaps subfolder.
        for prog in [dltest.DLAUNCH, DLAUNCHD]:
            p = self.run_cmd([prog, "--version"], env={"LD_DEBUG": "libs"})
            self.assertEqual(p.returncode, 0, p.stderr)
            tried = [line.split("trying file=", 1)[1].strip() for line in p.stderr.splitlines()
                     if "trying file=" in line]
            self.assertTrue(tried, p.stderr)
            self.assertEqual([f for f in tried if not os.path.exists(f)], [], prog)

    def test_a_plain_launch_maps_neither_library(self):
        # The worker reads its parent's (dlaunch's) memory map while dlaunch runs.
        p = self.dlaunch("--log-dir", "logs", "--", "sh", "-c", "cat /proc/$PPID/maps",
                         check_code=0)
        maps = open(os.path.join(self.dir, "logs", os.listdir(os.path.join(self.dir, "logs"))[0],
                                 "attempt_0", "rank_0.out")).read()
        self.assertIn("libc.so", maps, p.stderr)
        # libuv and jansson are inside the program (meson.build, static_runtime_args): each
        # shared library costs every launch its mapping and relocations.
        for lib in ["libcurl", "libmicrohttpd", "libcrypto", "libyaml", "dlaunch-etcd",
                    "dlaunch-http", "libuv", "libjansson"]:
            self.assertNotIn(lib, maps)

    def write_spec(self):
        spec = os.path.join(self.dir, "job.yaml")
        with open(spec, "w") as f:
            f.write('nproc_per_node: 1\ncommand: [sh, -c, "cat /proc/$PPID/maps"]\n')
        return spec

    def test_a_job_spec_opens_libyaml(self):
        self.dlaunch("--log-dir", "logs", self.write_spec(), check_code=0)
        run = os.listdir(os.path.join(self.dir, "logs"))[0]
        maps = open(os.path.join(self.dir, "logs", run, "attempt_0", "rank_0.out")).read()
        self.assertIn("libyaml", maps)

    def test_a_job_spec_without_libyaml(self):
        # dlaunch with the library's name changed to one that does not exist: what a machine
        # without libyaml gives. A launch without a job spec still runs.
        with open(dltest.DLAUNCH, "rb") as f:
            data = f.read()
        self.assertEqual(data.count(b"libyaml-0.so.2\0"), 1)
        copy = os.path.join(self.dir, "dlaunch")
        with open(copy, "wb") as f:
            f.write(data.replace(b"libyaml-0.so.2\0", b"libyamX-0.so.2\0"))
        os.chmod(copy, 0o755)
        p = self.run_cmd([copy, "--log-dir", "logs", self.write_spec()])
        self.assert_one_line(p, f"dlaunch: {self.dir}/job.yaml: the YAML parser (libyaml) is not "
                             "available: libyamX-0.so.2: cannot open shared object file")
        self.assertFalse(os.path.exists(os.path.join(self.dir, "logs")))
        p = self.run_cmd([copy, "--log-dir", "logs", "--", "true"])
        self.assertEqual(p.returncode, 0, p.stderr)

    def test_etcd_without_its_plugin_or_libcurl(self):
        for plugins, want in [(self.empty_dir(), "dlaunch-etcd.so: cannot open shared object"),
                              (self.broken_dir(), "libcurX.so.4: cannot open shared object")]:
            env = {"DLAUNCH_PLUGIN_DIR": plugins}
            p = self.run_cmd([dltest.DLAUNCH, "--rdzv-backend", "etcd", "--rdzv-endpoint",
                              "127.0.0.1:2379", "--run-id", "j", "--", "true"], env)
            self.assert_one_line(p, "dlaunch: ", "the etcd client (libcurl) is not available",
                                 want)
            # The control commands too.
            p = self.run_cmd([dltest.DLAUNCH, "status", "--rdzv-backend", "etcd", "--endpoint",
                              "127.0.0.1:2379", "j"], env)
            self.assert_one_line(p, "the etcd client (libcurl) is not available", want)

    def test_http_without_its_plugin_or_libmicrohttpd(self):
        for plugins, want in [(self.empty_dir(), "dlaunch-http.so: cannot open shared object"),
                              (self.broken_dir(), "libmicrohttpX.so.12: cannot open shared")]:
            env = {"DLAUNCH_PLUGIN_DIR": plugins}
            p = self.run_cmd([DLAUNCHD, "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0"], env)
            self.assert_one_line(p, "dlaunchd: --http: the status server (libmicrohttpd) is not "
                                 "available", want)
            # An agent hosting the rendezvous with --http.
            p = self.run_cmd([dltest.DLAUNCH, "--nodes", "1", "--node-rank", "0",
                              "--rdzv-endpoint", f"127.0.0.1:{dltest.free_port()}", "--run-id", "j",
                              "--http", "127.0.0.1:0", "--", "true"], env)
            self.assert_one_line(p, "dlaunch: --http: the status server (libmicrohttpd) is not "
                                 "available", want)

    def test_the_plugins_load_from_a_folder_given(self):
        # The same plugins, copied elsewhere, serve a status page: DLAUNCH_PLUGIN_DIR is where
        # they are looked for, and nowhere else.
        d = os.path.join(self.dir, "copied")
        os.makedirs(d)
        shutil.copy(os.path.join(BUILD_ROOT, "http", "dlaunch-http.so"), d)
        log = os.path.join(self.dir, "d.log")
        old = os.environ.get("DLAUNCH_PLUGIN_DIR")
        os.environ["DLAUNCH_PLUGIN_DIR"] = d
        try:
            proc, _ = dltest.start_dlaunchd(log, "--http", "127.0.0.1:0")
        finally:
            if old is None:
                del os.environ["DLAUNCH_PLUGIN_DIR"]
            else:
                os.environ["DLAUNCH_PLUGIN_DIR"] = old
        try:
            maps = open(f"/proc/{proc.pid}/maps").read()
            self.assertIn(os.path.join(d, "dlaunch-http.so"), maps)
            self.assertIn("libmicrohttpd", maps)
            # The plugin binds to the program's own libuv and jansson (meson.build,
            # static_runtime_args): no second copy is loaded, and its JSON API answers.
            self.assertNotIn("libuv", maps)
            self.assertNotIn("libjansson", maps)
            with open(log) as f:
                port = re.search(r"http://[^\s/]*:(\d+)/", f.read()).group(1)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/jobs", timeout=30) as r:
                self.assertEqual(json.load(r)["jobs"], [])
        finally:
            proc.terminate()
            proc.wait(timeout=30)


if __name__ == "__main__":
    dltest.main()
