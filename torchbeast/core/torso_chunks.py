"""The learner's torso over its batch in chunks, one thread each, on the CPU.

The torso's convolutions are most of an update's work on a CPU. Split over threads one op
at a time (PyTorch's intra-op threads), each of the few hundred ops of a pass waits for
its slowest thread, and on a machine whose other cores step environments that wait often
costs a core's turn. Here each thread instead runs the whole torso, forward and backward,
on its own rows of the batch, with one thread per op; the threads meet once per forward
and once per backward pass. On 2 cores with the training recipe, in five paired runs each
(docs/benchmarks.md), the recipe ran 2.8% faster in fp32 (mean 497 -> 511 SPS) and 4.5%
in bf16 (695 -> 727): the machine was already about 85% busy, and little was left to win.

The result is the torso's over the whole batch up to the order of float sums: each row's
features are computed as they would be, and each weight's gradient is the sum of the
chunks' gradients, added in a fixed order (so the same inputs give the same update).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait

import torch
from torch import nn
from torch.autograd.function import once_differentiable


class TorsoChunks:
    """Runs ``features(x)`` with gradient as ``chunks`` row chunks of ``x`` on as many
    threads, the calling thread one of them; ``params``: the weights it uses. A batch of
    fewer than ``chunks`` rows, or one without gradient, runs whole."""

    def __init__(self, chunks: int):
        if chunks < 2:
            raise ValueError(f"chunks must be at least 2, not {chunks}")
        self.chunks = chunks
        self._pool: ThreadPoolExecutor | None = None  # made at the first call

    def __call__(
        self,
        features: Callable[[torch.Tensor], torch.Tensor],
        x: torch.Tensor,
        params: Iterable[nn.Parameter],
    ) -> torch.Tensor:
        """``features(x)``: [N, ...] -> [N, H], the same values and the same gradients
        for the weights. An input that wants its own gradient runs whole."""
        trained = [param for param in params if param.requires_grad]
        if x.shape[0] < self.chunks or not torch.is_grad_enabled() or x.requires_grad:
            return features(x)
        return _Chunked.apply(self, features, x, *trained)

    def map(self, run: Callable, *per_chunk: Sequence) -> list:
        """``run(*args)`` for each chunk's args, the first on the calling thread."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.chunks - 1, thread_name_prefix="torso-chunk")
        calls = list(zip(*per_chunk, strict=True))
        futures = [self._pool.submit(run, *args) for args in calls[1:]]
        try:
            first = run(*calls[0])
        finally:  # no chunk outlives the call: the weights may change right after it
            wait(futures)
        return [first, *(future.result() for future in futures)]


class _Chunked(torch.autograd.Function):
    """Forward: each chunk's features build their own graph on their thread. Backward:
    each chunk's graph gives its weights' gradients on its thread; they are summed here,
    in the chunks' order."""

    @staticmethod
    def forward(ctx, chunks: TorsoChunks, features: Callable, x: torch.Tensor, *params):
        def run(rows: torch.Tensor) -> torch.Tensor:
            with torch.enable_grad():  # off inside forward, and per thread
                return features(rows)

        outputs = chunks.map(run, x.chunk(chunks.chunks))
        ctx.chunks, ctx.outputs, ctx.params = chunks, outputs, params
        return torch.cat([output.detach() for output in outputs])

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        outputs, params = ctx.outputs, ctx.params
        if outputs is None:
            raise RuntimeError("a torso split over threads takes one backward pass per forward")
        ctx.outputs = None  # each chunk's graph is freed as its backward pass ends

        def gradients(output: torch.Tensor, output_grad: torch.Tensor):
            return torch.autograd.grad(output, params, output_grad, allow_unused=True)

        grads = grad.split([output.shape[0] for output in outputs])
        per_chunk = ctx.chunks.map(gradients, outputs, grads)
        summed = []
        for chunk_grads in zip(*per_chunk, strict=True):
            present = [g for g in chunk_grads if g is not None]
            summed.append(sum(present[1:], present[0]) if present else None)
        return (None, None, None, *summed)
