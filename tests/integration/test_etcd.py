"""The etcd rendezvous (--rdzv-backend etcd) on a real 3-member etcd cluster on loopback
(etcdlib.py): the cluster itself first, then jobs on it. Skipped where etcd-server is missing."""
import os
import signal
import time
import unittest

import dltest
import etcdlib


@unittest.skipUnless(etcdlib.have_etcd(), "etcd-server is not installed (scripts/deps.sh test)")
class Fixture(dltest.Case):
    def test_three_members_survive_one_and_come_back(self):
        with etcdlib.Cluster() as c:
            members = c.ctl("member", "list").stdout.splitlines()
            self.assertEqual(len(members), 3, members)
            c.ctl("put", "/dl-fixture/k", "v")
            c.kill(1)
            # Two of three still make a quorum: writes go on.
            c.ctl("put", "/dl-fixture/k", "w",
                  endpoints=f"http://{c.endpoint(0)},http://{c.endpoint(2)}")
            c.restart(1)
            self.assertEqual(c.get_prefix("/dl-fixture/"), {"/dl-fixture/k": "w"})
            folder = c.folder
        self.assertFalse(os.path.exists(folder))
        self.assertTrue(all(p.poll() is not None for p in c.procs))


if __name__ == "__main__":
    dltest.main()
