"""torchbeast: IMPALA in PyTorch."""

import os

from torchbeast import entry

# OpenMP threads with no work sleep instead of spinning, so that the learner's ops can use
# every core without burning the CPU the actors need between ops (on 2 cores a spinning
# learner took half as much CPU again per update). OpenMP reads this once, when PyTorch
# loads it: every entry point imports this package first. A value already set wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# A Ctrl-C while `python -m torchbeast.bench` (or another tool) imports torch is one line,
# not a traceback: this runs before the tool's module does.
entry.quit_while_a_tool_loads()

__version__ = "0.2.0"
