"""Prints what a process started as ``python -m tests.process_report [CODE]`` sees of
itself, as JSON, and exits with CODE (for tests/test_warm_start.py)."""

import json
import os
import sys

import numpy as np

report = {
    "name": __name__,
    "argv": sys.argv,
    "cwd": os.getcwd(),
    "path0": sys.path[0],
    "parent": os.getppid(),
    "group": os.getpgid(0),
    "session": os.getsid(0),
    "variable": os.environ.get("WARM_START_TEST"),
    "draw": np.random.randint(1 << 30),
}
print(json.dumps(report))
print("to stderr", file=sys.stderr)
sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
