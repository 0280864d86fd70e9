"""Batched inference for the env streams: one forward pass of a copy of the learner's
model for every stream waiting (``DynamicBatcher``), on the learner's device."""

from __future__ import annotations

import threading

import torch
from torch import nn

from torchbeast.config.poly import PolySettings
from torchbeast.core.learner import NonFiniteLossError
from torchbeast.core.models import CoreState, create_model, sampling_generator
from torchbeast.core.spec import EnvSpec
from torchbeast.core.weights import copy_weights, model_is_sound
from torchbeast.runtime.poly.batching import DynamicBatcher, Failed
from torchbeast.runtime.poly.stream_limits import StreamClosed

Request = tuple[dict[str, torch.Tensor], CoreState]  # inputs [1, E, ...]; [layers, E, H]

# Most rows (envs) in one forward pass. The streams' sizes are their peers' (up to 512
# streams of 1,024 envs in one batch): without a bound, one pass's activations grew with
# them until the device's memory ran out and the run ended.
MAX_ROWS_PER_PASS = 4096


class StreamInference:
    """The streams' model: the learner's weights as last published, and its batcher."""

    def __init__(self, model: nn.Module, config: dict, spec: EnvSpec, poly: PolySettings):
        self.device = next(model.parameters()).device
        self.spec = spec
        # The learner's device, so the learner's precision.
        inference_model = create_model(
            config,
            spec.observation_shape,
            spec.num_actions,
            compute_dtype=model.compute_dtype,
            inference_only=True,
        )
        copy_weights(inference_model, model)
        self.model = inference_model.to(self.device)
        self.lock = threading.Lock()
        self.generator = sampling_generator(self.device)
        self.initial_core_state = tuple(s.cpu() for s in inference_model.initial_state(1))
        self.batcher = DynamicBatcher(
            self.infer,
            max_batch_size=poly.max_inference_batch_size,
            timeout_s=poly.inference_timeout_ms / 1000,
            num_threads=poly.num_inference_threads,
        )

    def compute(self, request: Request) -> tuple[dict[str, torch.Tensor], CoreState]:
        """One stream's outputs [E, ...] and next core state, batched with other streams'."""
        return self.batcher.compute(request)

    def publish(self, model: nn.Module) -> None:
        """Copies the learner's new weights into the inference model."""
        with self.lock:
            copy_weights(self.model, model)

    def close(self) -> None:
        self.batcher.close()

    def forward(
        self, inputs: dict[str, torch.Tensor], core_state: CoreState
    ) -> tuple[dict[str, torch.Tensor], CoreState]:
        """The model's outputs [1, N, ...] and next core state [layers, N, H], in passes
        of at most ``MAX_ROWS_PER_PASS`` rows (each row's outputs are its own)."""
        rows = inputs["frame"].shape[1]
        if rows <= MAX_ROWS_PER_PASS:
            return self.model(inputs, core_state, act=False)
        passes = [
            self.model(
                {key: value[:, start : start + MAX_ROWS_PER_PASS] for key, value in inputs.items()},
                tuple(s[:, start : start + MAX_ROWS_PER_PASS] for s in core_state),
                act=False,
            )
            for start in range(0, rows, MAX_ROWS_PER_PASS)
        ]
        outputs = {key: torch.cat([out[key] for out, _ in passes], dim=1) for key in passes[0][0]}
        states = zip(*(state for _, state in passes), strict=True)  # per tensor of the state
        return outputs, tuple(torch.cat(parts, dim=1) for parts in states)

    def infer(self, requests: list[Request]) -> list:
        """One forward pass for many streams: inputs [1, E, ...] each, batched on dim 1.

        Actions are sampled here, not in the model (which runs in eval mode), so that a
        stream whose observations give non-finite outputs fails alone (``Failed``)."""
        if len(requests) == 1:  # often: no copy needed
            inputs, core_state = requests[0]
        else:
            inputs = {
                key: torch.cat([request[0][key] for request in requests], dim=1)
                for key in requests[0][0]
            }
            core_state = tuple(
                torch.cat([request[1][i] for request in requests], dim=1)
                for i in range(len(requests[0][1]))
            )
        inputs = {key: value.to(self.device) for key, value in inputs.items()}
        core_state = tuple(s.to(self.device) for s in core_state)
        with self.lock, torch.inference_mode():
            outputs, core_state = self.forward(inputs, core_state)
        logits = outputs["policy_logits"][0]  # [N, A]
        # One reduction per row: a non-finite logit or baseline makes the sum non-finite.
        finite = torch.isfinite(logits.sum(dim=1) + outputs["baseline"][0])  # [N]
        all_finite = bool(finite.all())
        if not all_finite:  # rare: sample the good rows; the others fail their stream
            with self.lock:
                broken = not model_is_sound(self.model, self.spec)
            if broken:  # the learner's own doing, not the streams': stop the run
                raise NonFiniteLossError(
                    "the model's weights or outputs became non-finite (an update too large), "
                    "so every stream's outputs are. Lower --learning_rate"
                )
            logits = torch.where(finite[:, None], logits, 0.0)
        probabilities = torch.softmax(logits, dim=1)
        outputs["action"] = torch.multinomial(probabilities, 1, generator=self.generator).view(
            1, -1
        )
        outputs = {key: value.cpu() for key, value in outputs.items()}  # [1, N, ...]
        core_state = tuple(s.cpu() for s in core_state)  # [layers, N, H]
        row_finite = None if all_finite else finite.tolist()
        results: list = []
        start = 0
        for request in requests:
            end = start + request[0]["frame"].shape[1]
            if row_finite is not None and not all(row_finite[start:end]):
                error = StreamClosed(
                    "inference on its observations gave non-finite outputs "
                    "(are its values too large?)"
                )
                results.append(Failed(error))
            else:
                results.append(
                    (
                        {key: value[0, start:end] for key, value in outputs.items()},
                        # Its own copy: a view would keep the whole pass's state alive
                        # in every rollout queued from it (LSTM: [layers, N, H] each).
                        tuple(s[:, start:end].clone() for s in core_state),
                    )
                )
            start = end
        return results
