"""dlaunch kv and the control commands as docs/control.md describes them: the store a shell
worker reaches through its environment, whole numbers over the whole 64-bit range, a wait that
times out (exit 1, after the documented default), and what a one-node job's store says to
control commands."""
import os
import time

import dltest

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


class Control(dltest.Case):
    def test_kv_as_documented(self):
        p = self.dlaunch("--gpus-per-node", "1", "--", "sh", "-c", SCRIPT,
                         env={"DL": dltest.DLAUNCH}, check_code=0)
        self.assertIn("[rank 0] kv-ok", p.stdout)
        self.assertIn("overflows", self.read("overflow.err"))
        self.assertTrue(self.read("wait.err").strip(), "a timed-out wait says so")

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


if __name__ == "__main__":
    dltest.main()
