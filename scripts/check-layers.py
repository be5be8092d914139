#!/usr/bin/env python3
"""The layer rule (docs/architecture.md), checked on the sources: a file may include a header of its
own folder or of a folder in a lower layer, never of its own layer's other folders' or of a layer
above; libuv stays out of the folders that must build without an event loop. Exits 1 naming each
forbidden include as FILE:LINE, so a wrong arrow fails the build's unit tests.

    check-layers.py [SOURCE_ROOT]     check the tree (default: this script's project)
    check-layers.py --self-test       show that a forbidden include is caught
"""
import os
import re
import sys
import tempfile
from dataclasses import dataclass

# The layers, lowest first. A folder may use its own and every lower layer's headers. Folders of one
# layer do not use each other (plugin is the loader that etcd and http both sit on).
LAYERS: list[tuple[str, ...]] = [
    ("plugin", "diag", "config", "proto"),
    ("rendezvous",),
    ("collective", "http", "etcd"),
    ("trainer", "agent"),
    ("cmd", "daemon", "bench", "fuzz"),
]

# Folders whose code must not depend on an event loop: the wire format, settings, pure diagnostics,
# and the collective and trainer, which run inside workers that bring their own threads.
NO_LIBUV: tuple[str, ...] = ("proto", "config", "diag", "collective", "trainer")

INCLUDE = re.compile(r'^\s*#\s*include\s+([<"])([^>"]+)[>"]')


@dataclass
class Finding:
    where: str
    why: str


def layer_of(folder: str) -> int | None:
    for i, names in enumerate(LAYERS):
        if folder in names:
            return i
    return None


def headers_by_name(root: str) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for folder in (f for names in LAYERS for f in names):
        for dirpath, _, files in os.walk(os.path.join(root, folder)):
            for name in files:
                if name.endswith(".h"):
                    found.setdefault(name, set()).add(folder)
    return found


def check(root: str) -> list[Finding]:
    headers = headers_by_name(root)
    findings: list[Finding] = []
    for folder in (f for names in LAYERS for f in names):
        own = layer_of(folder)
        assert own is not None
        for dirpath, _, files in os.walk(os.path.join(root, folder)):
            for name in sorted(files):
                if not name.endswith((".c", ".h")):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root)
                with open(path, encoding="utf-8", errors="replace") as f:
                    for lineno, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        kind, target = m.groups()
                        where = f"{rel}:{lineno}"
                        if kind == "<":
                            if target == "uv.h" and folder in NO_LIBUV:
                                findings.append(Finding(where, f"<uv.h> in {folder}/, which must not need an event loop"))
                            continue
                        if os.path.exists(os.path.join(dirpath, target)):
                            continue
                        owners = headers.get(os.path.basename(target), set())
                        if "/" in target:
                            owners = {target.split("/")[0]} & owners or owners
                        for other in sorted(owners - {folder}):
                            theirs = layer_of(other)
                            if theirs is not None and theirs >= own:
                                findings.append(Finding(where, f'"{target}" is {other}/ (layer {theirs}), not below {folder}/ (layer {own})'))
    return findings


def self_test() -> int:
    with tempfile.TemporaryDirectory() as root:
        def write(rel: str, text: str) -> None:
            os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
            with open(os.path.join(root, rel), "w") as f:
                f.write(text)
        write("proto/proto.h", "")
        write("rendezvous/rendezvous.h", '#include "proto.h"\n')
        write("agent/agent.h", '#include "rendezvous.h"\n')
        clean = check(root)
        write("proto/frame.c", '#include "proto.h"\n#include "rendezvous.h"\n')
        write("trainer/loop.c", "#include <uv.h>\n")
        write("http/page.c", '#include "agent.h"\n')
        caught = {f.where for f in check(root)}
    want = {"proto/frame.c:2", "trainer/loop.c:1", "http/page.c:1"}
    if clean or caught != want:
        print(f"check-layers self-test: clean tree gave {[f.where for f in clean]}, wrong one {sorted(caught)} (want {sorted(want)})")
        return 1
    print("check-layers self-test: an upward include, libuv in trainer/ and a sideways-up include are caught")
    return 0


def main(argv: list[str]) -> int:
    if argv[1:] == ["--self-test"]:
        return self_test()
    root = argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    findings = check(root)
    for f in findings:
        print(f"{f.where}: {f.why}")
    if findings:
        print(f"check-layers: {len(findings)} include(s) against the layer rule (docs/architecture.md)")
        return 1
    print(f"check-layers: {sum(len(n) for n in LAYERS)} folders in {len(LAYERS)} layers, no include against the rule")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
