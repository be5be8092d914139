"""Every shell example the docs mark as runnable on one machine (a ```sh runnable block in
README.md or docs/*.md) runs here as written, with the built programs on PATH under their
installed names, in a fresh folder that holds the repository's examples/. A doc example that
stops working turns the suite red."""
import glob
import os
import re
import shutil
import subprocess
import tempfile
import unittest

import dltest

ROOT = os.environ.get("SOURCE_ROOT") or os.path.join(os.path.dirname(__file__), "..", "..")
BUILD = os.environ.get("BUILD_ROOT", os.path.join(ROOT, "build"))
PROGRAMS = {"dlaunch": "cmd/dlaunch", "dlaunchd": "daemon/dlaunchd",
            "dlaunch-train": "trainer/dlaunch-train"}
BLOCK = re.compile(r"^```sh runnable[^\n]*\n(.*?)^```", re.S | re.M)


def blocks():
    """(file, line, text) of every runnable block."""
    for path in [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs",
                                                                                  "*.md"))):
        with open(path) as f:
            text = f.read()
        for m in BLOCK.finditer(text):
            yield os.path.relpath(path, ROOT), text.count("\n", 0, m.start()) + 1, m.group(1)


class Docs(dltest.Case):
    def setUp(self):
        super().setUp()
        self.bin = os.path.join(self.dir, "bin")
        os.mkdir(self.bin)
        for name, rel in PROGRAMS.items():
            os.symlink(os.path.join(BUILD, rel), os.path.join(self.bin, name))
        os.symlink(os.path.join(os.path.abspath(ROOT), "examples"),
                   os.path.join(self.dir, "examples"))

    def test_runnable_blocks_run(self):
        found = list(blocks())
        self.assertGreaterEqual(len(found), 5, "the docs mark their runnable examples")
        for path, line, text in found:
            with self.subTest(f"{path}:{line}"):
                work = tempfile.mkdtemp(dir=self.dir)
                os.symlink(os.path.join(self.dir, "examples"), os.path.join(work, "examples"))
                env = {k: v for k, v in os.environ.items() if not k.startswith("DLAUNCH_")}
                env["PATH"] = self.bin + os.pathsep + env.get("PATH", "")
                p = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", text], cwd=work,
                                   env=env, capture_output=True, text=True, timeout=600)
                self.assertEqual(p.returncode, 0,
                                 f"{path}:{line}: exit {p.returncode}\n{text}\nstdout:\n"
                                 f"{p.stdout[-2000:]}\nstderr:\n{p.stderr[-2000:]}")
                shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    dltest.main()
