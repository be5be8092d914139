"""Says one line on stdout and one on stderr."""
import os
import sys

print(f"out of {os.environ['RANK']}", flush=True)
print(f"err of {os.environ['RANK']}", file=sys.stderr, flush=True)
