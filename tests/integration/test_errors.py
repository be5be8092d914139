"""Bad flags, bad YAML and bad commands: one line naming the place, exit 2, nothing started."""
import os
import socket

import dltest


class Errors(dltest.Case):
    def one_line_exit_2(self, *args, expect):
        p = self.dlaunch(*args, check_code=2)
        self.assertEqual(p.stdout, "")
        lines = p.stderr.splitlines()
        self.assertEqual(len(lines), 1, p.stderr)
        self.assertIn(expect, lines[0])
        self.assertTrue(lines[0].startswith("dlaunch: "), lines[0])
        self.assertFalse(os.path.exists(os.path.join(self.dir, "dlaunch_logs")))

    def test_bad_flags(self):
        self.one_line_exit_2("--nodes", "x", "--", "true", expect="--nodes: 'x' is not N or MIN:MAX")
        self.one_line_exit_2("--frobnicate", expect="unknown option '--frobnicate'")
        self.one_line_exit_2("--max-restarts", "-1", "--", "true",
                             expect="--max-restarts: '-1' is out of range")
        self.one_line_exit_2("--stop-timeout", "soon", "--", "true",
                             expect="--stop-timeout: 'soon' is not a number")
        self.one_line_exit_2(expect="nothing to run")

    def test_bad_environment_variable(self):
        p = self.dlaunch("--", "true", env={"DLAUNCH_MAX_RESTARTS": "many"}, check_code=2)
        self.assertEqual(p.stderr, "dlaunch: DLAUNCH_MAX_RESTARTS: 'many' is not a whole number\n")

    def test_bad_yaml(self):
        path = self.write("bad.yaml", "command: [true]\nmax_restarts: 1\ngpu_per_node: 2\n")
        self.one_line_exit_2(path, expect=f"{path}:3:1: unknown key 'gpu_per_node'")
        path = self.write("syntax.yaml", "command: [true\nnodes: 1\n")
        self.one_line_exit_2(path, expect=f"{path}:2:")
        path = self.write("nocmd.yaml", "nodes: 1\n")
        self.one_line_exit_2(path, expect="no 'command:' or 'train:' in the job spec")
        self.one_line_exit_2("missing.yaml", expect="missing.yaml: cannot open the job spec")
        path = self.write("binary.yaml", "\x00\x01\x02garbage")
        self.one_line_exit_2(path, expect=f"{path}:")

    def test_command_not_found(self):
        self.one_line_exit_2("--", "no-such-program-xyz",
                             expect="cannot run 'no-such-program-xyz': command not found")
        path = self.write("not-executable.sh", "echo hi\n")
        os.chmod(path, 0o644)
        self.one_line_exit_2("--", path, expect="Permission denied")

    def test_events_file_unwritable(self):
        self.one_line_exit_2("--events", "/nonexistent/dir/ev", "--", "true",
                             expect="--events '/nonexistent/dir/ev': No such file or directory")

    def test_log_dir_unusable(self):
        # Checked before anything starts: exit 2 with the path and the cause, no attempt used
        # and no rank blamed.
        self.write("afile", "x")
        p = self.dlaunch("--log-dir", "afile/sub", "--max-restarts", "3", "--events",
                         self.events_path, "--", "touch", "started", check_code=2)
        self.assertEqual(p.stderr.count("\n"), 1, p.stderr)
        self.assertRegex(p.stderr, r"^dlaunch: --log-dir: cannot write the log folder "
                                   r"'afile/sub/[^']+': Not a directory\n$")
        self.assertFalse(os.path.exists(os.path.join(self.dir, "started")))
        self.assertNotIn("worker_start", open(self.events_path).read())

    def test_node_rank_outside_the_job_is_exit_2_before_any_connection(self):
        # docs/exit-codes.md: a usage error, not exit 4 after reaching the rendezvous.
        with socket.socket() as rdzv:
            rdzv.bind(("127.0.0.1", 0))
            rdzv.listen(8)
            rdzv.settimeout(0.2)
            port = rdzv.getsockname()[1]
            self.one_line_exit_2("--nodes", "2", "--node-rank", "2", "--rdzv-endpoint",
                                 f"127.0.0.1:{port}", "--run-id", "x", "--", "true",
                                 expect="--node-rank 2: a job of 2 nodes has ranks 0 to 1")
            self.one_line_exit_2("--nnodes", "2", "--node-rank", "5", "--rdzv-backend",
                                 "static", "--master-addr", "127.0.0.1", "--master-port",
                                 str(port), "--run-id", "x", "--", "true",
                                 expect="--node-rank 5: a job of 2 nodes has ranks 0 to 1")
            with self.assertRaises(socket.timeout):
                rdzv.accept()

    def test_dead_after_not_above_the_heartbeat_is_refused(self):
        # Else every node is declared dead between two heartbeats, round after round.
        self.one_line_exit_2("--dead-after", "0.1", "--nodes", "2", "--rdzv-endpoint",
                             "127.0.0.1:9", "--run-id", "x", "--", "true",
                             expect="--dead-after 0.1 is not above --heartbeat 1: every node "
                                    "would be declared dead between two of its heartbeats")

    def test_yaml_command_runs(self):
        path = self.write("job.yaml", "gpus_per_node: 2\ncommand: [sh, -c, 'echo yaml-$RANK']\n")
        p = self.dlaunch(path, check_code=0)
        self.assertIn("[rank 0] yaml-0", p.stdout)
        self.assertIn("[rank 1] yaml-1", p.stdout)


if __name__ == "__main__":
    dltest.main()
