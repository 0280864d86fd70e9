"""torchbeast: IMPALA in PyTorch."""

__version__ = "0.2.0"
