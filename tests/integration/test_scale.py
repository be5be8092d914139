"""The shipped example at every world size from 1 to 16 workers on one machine, its full length:
it must reach 88% test accuracy everywhere (a larger world means a larger global batch, and the
learning rate must be scaled with care); that a learning rate far too high ends as divergence,
never as success, is test_train.py's. Slow: each run trains 10 epochs of Fashion-MNIST, in
lockstep, so that on a busy machine it mostly waits for the ranks the scheduler set aside: it
runs in the side pass of scripts/test.sh, beside the Slurm suite, out of the plain pass's slots.
Each world size's wall time is printed beside its accuracy."""
import json
import os
import time
import unittest

import dltest

FASHION = "/usr/share/datasets/fashion-mnist"
EXAMPLE = os.path.join(os.environ.get("SOURCE_ROOT") or
                       os.path.join(os.path.dirname(__file__), "..", ".."),
                       "examples", "train.yaml")


@unittest.skipUnless(os.path.isdir(FASHION), "dataset-fashion-mnist is not installed")
class Scale(dltest.Case):
    def test_the_example_converges_at_every_world_size(self):
        results, walls = {}, {}
        for world in (1, 2, 4, 8, 16):
            run = f"w{world}"
            os.makedirs(os.path.join(self.dir, run))
            started = time.monotonic()
            self.dlaunch("-q", "--run-id", run, "--gpus-per-node", str(world),
                         "--log-dir", os.path.join(self.dir, run, "logs"), EXAMPLE,
                         timeout=900, check_code=0)
            # The example's paths are relative to where it runs: here, the test's folder.
            path = os.path.join(self.dir, "dlaunch_checkpoints", "fashion-mnist", "summary.json")
            with open(path) as f:
                s = json.load(f)
            os.rename(os.path.join(self.dir, "dlaunch_checkpoints"),
                      os.path.join(self.dir, run, "checkpoints"))
            results[world] = s
            walls[world] = time.monotonic() - started
            self.assertEqual(s["world_size"], world)
            self.assertEqual(s["epochs_done"], 10)
            self.assertFalse(s["diverged"])
        print("world  global batch  lr       test accuracy  wall")
        for world, s in results.items():
            print(f"{world:5}  {s['global_batch']:12}  {s['lr']:.4f}   {s['test_accuracy']:.4f}"
                  f"         {walls[world]:.1f} s")
        for world, s in results.items():
            self.assertGreaterEqual(s["test_accuracy"], 0.88, f"world {world}")


if __name__ == "__main__":
    dltest.main()
