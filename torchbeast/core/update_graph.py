"""The learner's update as one CUDA graph (``--cuda_graphs``).

On a GPU the recipe's update (two passes of forward, V-trace, losses, backward, clipping
and RMSprop, then the figures) is ~1,000 small kernels, each launched by the host: on an
H200 the learner spent 22-36 ms per update with the GPU 11-17% busy. Captured once as a
CUDA graph, an update is one launch: the batch is copied into the graph's own input
tensors, the graph replays every kernel of ``Learner.device_update``, and the learner reads
the figures and checks from the graph's own output, as it reads them from an eager update.

What a graph needs, and how it gets it:
- Fixed shapes: only batches shaped like the first (no padded partial rollouts) go
  through the graph, and none with LASER's replay; any other update runs eagerly.
- A learning rate that changes each update: the graph's RMSprop or Adam reads it from a
  0-dim tensor on the device (their ``capturable`` mode), filled before each replay from
  the schedule; the optimizer's own rate stays a float (checkpoints, eager updates).
- No host waits inside: ``device_update`` waits for nothing; value normalisation waits, so
  a run with ``--normalize_values`` updates eagerly.
- The same results as eager updates: the first graphed update is checked against an eager
  update of the same batch from the same state; any difference beyond float noise, or any
  error while capturing, and the run goes on eagerly, with one warning that says why.
"""

from __future__ import annotations

import contextlib
import logging
import warnings

import torch

from torchbeast.core.learner import DeviceUpdate, Learner, UndoBuffer
from torchbeast.core.models import CoreState

log = logging.getLogger("torchbeast")

# How far a graphed update may land from the eager one, relative to the weights' change.
AGREEMENT = 1e-3


@contextlib.contextmanager
def quiet_stream_mismatch():
    """Without autograd's warning (seen on an H200) that a gradient accumulator made on the
    default stream meets the side stream a capture needs: it costs a synchronisation, not a
    wrong result, and the first graphed update is checked against an eager one anyway."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The AccumulateGrad node's stream")
        yield


class UpdateGraph:
    """Captures ``learner.device_update`` on its first batch, then replays it."""

    def __init__(self, learner: Learner):
        self.learner = learner
        self.graph: torch.cuda.CUDAGraph | None = None
        self.batch: dict[str, torch.Tensor] = {}  # the graph's inputs ...
        self.core_state: tuple[torch.Tensor, ...] = ()
        self.output: DeviceUpdate | None = None  # ... and outputs
        self.lr: torch.Tensor | None = None
        self.before: UndoBuffer | None = None  # the state before the first graphed update
        self.given_up = False

    def fits(self, batch: dict[str, torch.Tensor], core_state: CoreState, num_online) -> bool:
        """Whether this update can be the graph's: a batch of online rollouts, whole, of
        the first graphed batch's shapes, without replay or value normalisation."""
        learner = self.learner
        if self.given_up or learner.value_scale.enabled or learner.settings.replays:
            return False
        if "mask" in batch:
            return False
        if num_online is not None and num_online != batch["reward"].shape[1]:
            return False
        if self.graph is None:
            return True
        return (batch.keys() == self.batch.keys()) and all(
            batch[key].shape == self.batch[key].shape for key in batch
        )

    def run(self, batch: dict[str, torch.Tensor], core_state: CoreState) -> DeviceUpdate:
        """The update of ``batch``, replayed (captured first, and checked, on the first)."""
        if self.graph is None:
            try:
                return self._capture_and_check(batch, core_state)
            except Exception as error:  # noqa: BLE001 - any failure: eager from now on
                if self.before is not None:  # a warm-up or check may have stepped
                    self.before.restore()
                self.give_up(f"capturing it failed ({error!r:.200})")
                return self.learner.device_update(batch, core_state, None)
        self._replay(batch, core_state)
        return self.output

    def give_up(self, why: str) -> None:
        self.given_up, self.graph = True, None
        self._optimizer_off_graph()
        log.warning("The update runs eagerly, not as a CUDA graph: %s.", why)

    # Capture.

    def _capture_and_check(
        self, batch: dict[str, torch.Tensor], core_state: CoreState
    ) -> DeviceUpdate:
        learner = self.learner
        self._optimizer_capturable()
        before = self.before = UndoBuffer(learner.model, learner.optimizer)
        before.save()
        self.batch = {key: value.clone() for key, value in batch.items()}
        self.core_state = tuple(state.clone() for state in core_state)
        # Warm up on a side stream (libraries' handles, autograd's lazy state), as CUDA
        # graphs need, then take its update back.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), quiet_stream_mismatch():
            learner.device_update(self.batch, self.core_state, None)
        torch.cuda.current_stream().wait_stream(side)
        # The state the warm-up made (an optimizer's first update makes it) stays, zeroed:
        # captured with none, the graph would make it anew, zeros, at every replay, and
        # hold tensors the optimizer (and its checkpoints) no longer has.
        before.restore(keep_new_state=True)
        before.save()
        graph = torch.cuda.CUDAGraph()
        groups = learner.optimizer.param_groups
        rates = [group["lr"] for group in groups]
        try:  # the graph reads the rate from self.lr, which each replay fills
            for group in groups:
                group["lr"] = self.lr
            with (
                torch.cuda.graph(graph, capture_error_mode="thread_local"),
                quiet_stream_mismatch(),
            ):
                self.output = learner.device_update(self.batch, self.core_state, None)
        finally:
            for group, rate in zip(groups, rates, strict=True):
                group["lr"] = rate
        self.graph = graph
        # The first update both ways, from the same state: the eager one is kept.
        self._replay(batch, core_state)
        graphed = [param.detach().clone() for param in learner.model.parameters()]
        graphed_values = self.output.stacked.clone()
        before.restore()
        eager = learner.device_update(batch, core_state, None)
        difference = self._difference(graphed, graphed_values, before, eager)
        self.before = None
        if not difference <= AGREEMENT:  # NaN too
            self.give_up(f"its first update differed from the eager one by {difference:.2g}")
        else:
            log.info("The update runs as one CUDA graph (its first agreed with the eager one).")
        return eager

    def _difference(
        self,
        graphed: list[torch.Tensor],
        graphed_values: torch.Tensor,
        before: UndoBuffer,
        eager: DeviceUpdate,
    ) -> float:
        """The gap between the graphed and the eager update: in the weights, relative to
        how far the eager update moved them, and in each figure, relative to its size."""
        parameters = [param.detach() for param in self.learner.model.parameters()]
        starts = before.copies[: len(parameters)]  # saved first: the parameters
        gap = torch.stack([(g - p).norm() for g, p in zip(graphed, parameters, strict=True)])
        change = torch.stack([(p - s).norm() for p, s in zip(parameters, starts, strict=True)])
        weights = gap.norm() / change.norm().clamp(min=1e-12)
        values = eager.stacked.nan_to_num(nan=0.0)
        gaps = (graphed_values.nan_to_num(nan=0.0) - values).abs() / values.abs().clamp(min=1e-6)
        return max(float(weights), float(gaps.max()))

    # Replay.

    def _replay(self, batch: dict[str, torch.Tensor], core_state: CoreState) -> None:
        for key, value in batch.items():
            self.batch[key].copy_(value, non_blocking=True)
        for static, state in zip(self.core_state, core_state, strict=True):
            static.copy_(state, non_blocking=True)
        self.lr.fill_(self.learner.scheduler.get_last_lr()[0])
        self.graph.replay()

    # While the graph is used, the optimizer keeps its state steps on the device and runs
    # in its ``capturable`` mode (which reads a tensor learning rate on the device).

    def _optimizer_capturable(self) -> None:
        learner = self.learner
        device = next(learner.model.parameters()).device
        self.lr = torch.zeros((), device=device)
        self._each_group(True, lambda step: step.to(device))

    def _optimizer_off_graph(self) -> None:
        """Back to the optimizer's own mode (steps on the CPU)."""
        self._each_group(False, lambda step: step.cpu())

    def _each_group(self, capturable: bool, move) -> None:
        optimizer = self.learner.optimizer
        for group in optimizer.param_groups:
            group["capturable"] = capturable
            for param in group["params"]:
                state = optimizer.state[param]
                if torch.is_tensor(state.get("step")):
                    state["step"] = move(state["step"])
