"""Which dtype the torso computes in: bf16 where the hardware computes it natively.

The convolutions and matrix products of a conv torso dominate both the learner's update and
an actor's forward pass. On a CPU with native bf16 instructions (x86's AVX512-BF16 or AMX)
they run about 40% faster in bf16 than in fp32. Only the torso runs in bf16 (under autocast,
so its weights stay fp32 and its gradients reach fp32 weights); the recurrent core, the
heads, the losses, V-trace and the optimizer stay fp32.
"""

from __future__ import annotations

import functools
import sys

import torch

PRECISIONS = ("auto", "fp32", "bf16")
# Torsos whose cost is convolutions: the small ones (MLP, MinAtar's grid) gain little and
# keep fp32 unless asked.
CONV_TORSOS = ("atari", "resnet")
# /proc/cpuinfo flags of x86 CPUs that compute bf16 products natively.
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


@functools.cache
def cpu_computes_bf16() -> bool:
    """Whether this CPU has native bf16 instructions (read from /proc/cpuinfo on Linux;
    elsewhere taken as no)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("flags"):
                    return bool(set(line.split()) & set(NATIVE_BF16_FLAGS))
    except OSError:
        pass
    return False


def compute_dtype(precision: str, device: torch.device | str, torso: str) -> torch.dtype:
    """The dtype a ``torso`` computes in on ``device`` under ``--precision``: auto is bf16
    for conv torsos on a CPU with native bf16, else fp32 (on a GPU too: on an H200 the
    recipe ran no faster in bf16, its learner bound by the host, not the GPU's work)."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}: use one of {PRECISIONS}")
    if precision == "bf16":
        return torch.bfloat16
    device_type = torch.device(device).type
    if precision == "auto" and torso in CONV_TORSOS and device_type == "cpu":
        return torch.bfloat16 if cpu_computes_bf16() else torch.float32
    return torch.float32


def bf16_on_cpu(dtype: torch.dtype, device: torch.device | str) -> bool:
    """Whether a learner computes its torso in bf16 on the CPU: where the run shares the
    cores differently (``runtime.layout``)."""
    return dtype == torch.bfloat16 and torch.device(device).type == "cpu"


def dtype_name(dtype: torch.dtype) -> str:
    """ "bf16" or "fp32", as ``--precision`` names them."""
    return "bf16" if dtype == torch.bfloat16 else "fp32"


def describe(precision: str, dtype: torch.dtype, device: torch.device | str, torso: str) -> str:
    """A line for the run's log: the torso's dtype on ``device`` and why."""
    name = dtype_name(dtype)
    where = torch.device(device).type.upper()
    if precision != "auto":
        why = f"--precision {precision}"
        if name == "bf16" and where == "CPU" and not cpu_computes_bf16():
            why += "; this CPU has no native bf16, so it is emulated, likely slower than fp32"
    elif torso not in CONV_TORSOS:
        why = f"auto: the {torso} torso gains little from bf16"
    elif where != "CPU":
        why = "auto: on a GPU bf16 ran no faster (an H200); --precision bf16 asks for it"
    elif dtype == torch.bfloat16:
        why = "auto: this CPU computes bf16 natively"
    else:
        why = "auto: this CPU has no native bf16"
    return f"The torso computes in {name} on the {where} ({why})."
