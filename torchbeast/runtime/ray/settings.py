"""RayBeast's own settings, each declared once as its flag (imports no Ray: the edge builds
them first)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torchbeast.core.settings import flag


@dataclass(frozen=True)
class RaySettings:
    flags_group: ClassVar[str] = "RayBeast"

    ray_address: str | None = flag(
        None,
        "(new) A running Ray cluster to join: host:port of its head, or auto "
        "(default: start a local Ray instance bound to 127.0.0.1, stopped at the end).",
        metavar="ADDRESS",
    )
