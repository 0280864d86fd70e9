"""Central inference's forward pass as CUDA graphs (``--cuda_graphs``), one per size of pass.

On an H100 machine an eager pass of AtariNet for 32 envs cost the central inference server
1.4 ms of host time, launching its kernels one by one: the largest part of a 3.3 ms pass,
with the server busy 91% of the time (docs/runs/gpu_h100_visit4.log). Replayed as a graph,
the pass is one launch. A graph has fixed shapes, so a pass for N actors replays the graph
of the next power of two of actors (at most all of them); the rows beyond its own keep
whatever an earlier pass left there, and nothing reads their outputs. Each size is captured
the first time a pass of it comes, and its first replay is checked against an eager pass
of the same inputs: a difference beyond float noise, or any error while capturing, and the
caller goes on eagerly. Actions are sampled after the graph, eagerly, as the eager pass
samples them (``Agent.choose``), so the server's generator never enters a capture.
"""

from __future__ import annotations

import torch

from torchbeast.core.models import Agent, CoreState

# How far a graph's outputs may land from the eager pass's, relative to their size.
AGREEMENT = 1e-3


class InferenceGraphError(RuntimeError):
    """A graph that disagreed with the eager pass; the message says by how much."""


class CapturedPass:
    """One size of pass as a CUDA graph: its own input tensors, filled before each replay,
    and the outputs its replay writes."""

    def __init__(
        self, model: Agent, inputs: dict[str, torch.Tensor], core_state: CoreState, envs: int
    ):
        """Captures ``model``'s forward pass (no action) for ``envs`` envs, shaped and typed
        like ``inputs`` [1, n, ...] and ``core_state`` [layers, n, H]."""
        device = inputs["reward"].device
        self.inputs = {
            key: torch.zeros((1, envs, *value.shape[2:]), dtype=value.dtype, device=device)
            for key, value in inputs.items()
        }
        self.core_state = tuple(
            torch.zeros((state.shape[0], envs, *state.shape[2:]), dtype=state.dtype, device=device)
            for state in core_state
        )
        # A capture needs its kernels warmed up (cuDNN's and cuBLAS's handles, workspaces)
        # on a stream other than the default one.
        warmup = torch.cuda.Stream(device)
        warmup.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(warmup):
            for _ in range(2):
                model(self.inputs, self.core_state, act=False)
        current = torch.cuda.current_stream(device)
        current.wait_stream(warmup)
        self.graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(self.graph):
                self.outputs, self.next_state = model(self.inputs, self.core_state, act=False)
        except Exception as error:
            # A capture that failed inside leaves the capture's stream current (its end
            # raises before the stream is restored) and hides the first error behind its
            # own: restore the stream, and say the first.
            torch.cuda.set_stream(current)
            first = error
            while first.__context__ is not None:
                first = first.__context__
            raise InferenceGraphError(
                f"capturing a pass for {envs} envs failed: {first}".strip()
            ) from error

    def replay(
        self, inputs: dict[str, torch.Tensor], core_state: CoreState
    ) -> tuple[dict[str, torch.Tensor], CoreState]:
        """Policy logits [1, n, A] and baseline [1, n], and the core state [layers, n, H],
        for ``inputs`` [1, n, ...]: views of the graph's outputs, valid until its next
        replay."""
        n = inputs["reward"].shape[1]
        for key, value in inputs.items():
            self.inputs[key][:, :n].copy_(value, non_blocking=True)
        for static, state in zip(self.core_state, core_state, strict=True):
            static[:, :n].copy_(state, non_blocking=True)
        self.graph.replay()
        outputs = {key: self.outputs[key][:, :n] for key in ("policy_logits", "baseline")}
        return outputs, tuple(state[:, :n] for state in self.next_state)


class InferenceGraphs:
    """``model``'s forward pass for a server of ``num_actors`` actors of ``envs_per_actor``
    envs each, replayed from the graph of its size (captured and checked on first use)."""

    def __init__(self, model: Agent, num_actors: int, envs_per_actor: int):
        self.model = model
        self.num_actors = num_actors
        self.envs_per_actor = envs_per_actor
        self.captured: dict[int, CapturedPass] = {}  # actors per graph -> its graph

    def size_for(self, actors: int) -> int:
        """The actors of the graph that serves a pass for ``actors``: the next power of
        two, at most all of them."""
        size = 1
        while size < actors:
            size *= 2
        return min(size, self.num_actors)

    def run(
        self, inputs: dict[str, torch.Tensor], core_state: CoreState
    ) -> tuple[dict[str, torch.Tensor], CoreState]:
        """Policy logits [1, n, A], baseline [1, n] and the next core state for ``inputs``
        [1, n, ...] on the device, n a whole number of actors' envs. Raises
        ``InferenceGraphError`` if a new size's first replay disagrees with an eager pass,
        and whatever a failed capture raises."""
        actors = -(-inputs["reward"].shape[1] // self.envs_per_actor)
        size = self.size_for(actors)
        captured = self.captured.get(size)
        if captured is not None:
            return captured.replay(inputs, core_state)
        captured = CapturedPass(self.model, inputs, core_state, size * self.envs_per_actor)
        outputs, next_state = captured.replay(inputs, core_state)
        # The eager pass of the graph's own inputs, at its size: what the graph replays,
        # without the float noise of another batch size's kernels (TF32 convolutions).
        n = inputs["reward"].shape[1]
        eager, eager_state = self.model(captured.inputs, captured.core_state, act=False)
        eager = {key: value[:, :n] for key, value in eager.items()}
        eager_state = tuple(state[:, :n] for state in eager_state)
        worst = max(
            relative_difference(got, want)
            for got, want in zip(
                (outputs["policy_logits"], outputs["baseline"], *next_state),
                (eager["policy_logits"], eager["baseline"], *eager_state),
                strict=True,
            )
        )
        if not worst <= AGREEMENT:  # NaN too
            raise InferenceGraphError(
                f"the graph of a pass for {size} actors differed from the eager pass by "
                f"{worst:.2g} (relative)"
            )
        self.captured[size] = captured
        return outputs, next_state


def relative_difference(got: torch.Tensor, want: torch.Tensor) -> float:
    """The largest difference of two tensors, relative to the larger of 1 and ``want``'s
    largest magnitude."""
    if got.numel() == 0:
        return 0.0
    scale = max(1.0, float(want.abs().max()))
    return float((got.float() - want.float()).abs().max()) / scale
