"""MonoBeast's own settings, each declared once as its flag (torch-free: the parser and the
settings are built at the edge, before any runtime is imported)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torchbeast.core.settings import flag


@dataclass(frozen=True)
class MonoSettings:
    flags_group: ClassVar[str] = "MonoBeast"

    central_inference: bool = flag(
        False,
        "(new) MonoBeast: actors only step their environments; an inference process "
        "beside the learner's runs one batched forward pass for every actor waiting, on the "
        "learner's device (the GPU where there is one), as Sample Factory's policy workers "
        "do.",
    )
