#!/usr/bin/env python3
"""The house format (.clang-format, STYLE.md "Format"), checked on every C source: exits 1 naming
each file that `clang-format` would change, with the first line it would change, so a badly
formatted change fails the unit tests instead of a reviewer's eye. To apply the format:
`clang-format -i FILE...`.

    check-format.py [SOURCE_ROOT]     check the tree (default: this script's project)
    check-format.py --self-test       show that a badly formatted file is caught
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

FOLDERS = ("agent", "bench", "cmd", "collective", "config", "daemon", "diag", "etcd", "fuzz", "http",
           "plugin", "proto", "rendezvous", "tests", "trainer")


def sources(root: str) -> list[str]:
    found = []
    for folder in FOLDERS:
        for dirpath, _, files in os.walk(os.path.join(root, folder)):
            found += [os.path.join(dirpath, f) for f in files if f.endswith((".c", ".h"))]
    return sorted(found)


# clang-format --dry-run's finding: "FILE:LINE:COL: warning: code should be clang-formatted".
FINDING = re.compile(r"^(.+?):(\d+):\d+: (warning|error): (.*)$")


def unformatted(root: str, files: list[str]) -> list[str]:
    tool = shutil.which("clang-format")
    if tool is None:
        return ["clang-format is not installed (scripts/deps.sh test installs it)"]
    if not files:
        return []
    style = "--style=file:" + os.path.join(root, ".clang-format")
    # One process for every file: one clang-format a file cost 4-5 times the CPU (its start,
    # libLLVM's loading), which a loaded machine turned into minutes.
    out = subprocess.run([tool, style, "--dry-run", *files], capture_output=True, text=True)
    first: dict[str, str] = {}
    for line in out.stderr.splitlines():
        m = FINDING.match(line)
        if m is None or m.group(1) in first:
            continue
        rel = os.path.relpath(m.group(1), root)
        if m.group(3) == "warning" and "clang-formatted" in m.group(4):
            first[m.group(1)] = (f"{rel}:{m.group(2)}: not in the house format "
                                 f"(clang-format -i {rel})")
        else:
            first[m.group(1)] = f"{rel}:{m.group(2)}: clang-format failed: {m.group(4)}"
    if out.returncode != 0 and not first:
        return [f"clang-format failed (exit {out.returncode}): "
                f"{out.stderr.strip().splitlines()[:1]}"]
    return [first[f] for f in files if f in first]


def self_test(root: str) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(os.path.join(root, ".clang-format"), tmp)
        os.mkdir(os.path.join(tmp, "agent"))
        good = os.path.join(tmp, "agent", "good.c")
        bad = os.path.join(tmp, "agent", "bad.c")
        with open(good, "w", encoding="utf-8") as f:
            f.write("int twice(int x)\n{\n    return 2 * x;\n}\n")
        with open(bad, "w", encoding="utf-8") as f:
            f.write("int twice(int x) {\n  return 2*x;\n}\n")
        found = unformatted(tmp, sources(tmp))
        if len(found) == 1 and found[0].startswith("agent/bad.c:1:"):
            print("check-format: self-test: a badly formatted file is caught, a good one passes")
            return 0
        print(f"check-format: self-test failed: {found}")
        return 1


def main() -> int:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if sys.argv[1:] == ["--self-test"]:
        return self_test(here)
    root = sys.argv[1] if len(sys.argv) > 1 else here
    files = sources(root)
    findings = unformatted(root, files)
    for line in findings:
        print(line)
    if findings:
        print(f"check-format: {len(findings)} of {len(files)} files not in the house format")
        return 1
    print(f"check-format: {len(files)} files in the house format")
    return 0


if __name__ == "__main__":
    sys.exit(main())
