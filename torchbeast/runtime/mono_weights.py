"""The weights MonoBeast's learner publishes for whoever chooses the actions (its actor
processes, or the central inference process): in shared memory, under a seqlock."""

from __future__ import annotations

import time

import torch
from torch import nn

from torchbeast.core import weights


class SharedWeights:
    """Model parameters in shared memory, published with a version (a seqlock).

    The version is odd while the learner writes. A reader copies, then checks that the
    version did not move; if it did, it copies again. No lock is shared with actors, so
    an actor killed mid-copy cannot block the learner.
    """

    def __init__(self, model: nn.Module):
        self.flat = torch.zeros(weights.num_weights(model)).share_memory_()
        self.version = torch.zeros(1, dtype=torch.int64).share_memory_()
        self.policy_version = torch.zeros((), dtype=torch.int64).share_memory_()

    def publish(self, model: nn.Module) -> None:
        self.version += 1
        weights.flatten(model, out=self.flat)
        self.policy_version.copy_(model.policy_version)
        self.version += 1

    def read_into(
        self, model: nn.Module, known_version: int, staging: torch.Tensor | None = None
    ) -> int:
        """Copies newer weights into ``model``; returns the version it now holds.

        ``staging``, a host buffer shaped as ``flat`` (pinned, for a model on a GPU): the
        weights are copied there first, in one piece, and from there to the model without
        the host waiting for the device; the caller must not read again before the device
        has done those copies (central inference waits for each pass, which follows
        them). Straight from shared memory, each parameter was a copy from pageable memory
        that the host waited for: 0.74 ms of each of central inference's passes on an
        H100 machine. And a reader through ``staging`` that holds weights already never
        waits for the learner: while it writes (or if it wrote during the copy), the model
        keeps the weights it has until the next read."""
        while True:
            before = int(self.version)
            if before == known_version:
                return known_version
            if before % 2 == 0:
                if staging is None:
                    weights.load_flat(model, self.flat)
                else:
                    staging.copy_(self.flat)
                policy_version = int(self.policy_version)
                if int(self.version) == before:
                    break
            if staging is not None and known_version >= 0:
                return known_version  # the model is untouched: it reads the next time
            if before % 2:
                time.sleep(0.0005)
        if staging is not None:
            weights.load_flat(model, staging, non_blocking=True)
        model.policy_version.fill_(policy_version)
        return before
