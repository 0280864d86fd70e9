"""Rollout assembly at the learner's end of one env stream: each Step written into the
stream's rollout buffers ([T+1, E, ...]: its E envs side by side), an action asked of
batched inference, and every T steps each env's rollout queued for the learner. A stream
that ends before its rollout is full (a client that left, a server that died) still
delivers what it sent: zero-padded to T+1, with a mask."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import numpy as np
import torch

from torchbeast.core import rollout
from torchbeast.core.models import CoreState
from torchbeast.core.rollout import rollout_bytes
from torchbeast.core.spec import EnvSpec
from torchbeast.runtime.poly import codec
from torchbeast.runtime.poly import polybeast_pb2 as pb
from torchbeast.runtime.poly.episodes_log import EpisodeLog, client_id_of
from torchbeast.runtime.poly.inference import StreamInference
from torchbeast.runtime.poly.stream_limits import Stream, StreamClosed, StreamMemory
from torchbeast.runtime.queues import Closed, RolloutQueue

log = logging.getLogger("torchbeast")

Rollout = tuple[dict[str, torch.Tensor], CoreState]  # [T+1, ...] with "mask"; [layers, 1, H]


class StreamRollouts:
    """Turns env streams' Steps into rollouts on ``queue``, acting with ``inference``."""

    def __init__(
        self,
        unroll_length: int,
        inference: StreamInference,
        episodes: EpisodeLog,
        queue: RolloutQueue,
        memory: StreamMemory,
        stopping: threading.Event,
    ):
        self.unroll_length = unroll_length
        self.inference = inference
        self.episodes = episodes
        self.queue = queue
        self.memory = memory
        self.stopping = stopping

    def act(
        self, incoming: Iterator[pb.EnvMessage], stream: Stream, spec: EnvSpec, num_envs: int
    ) -> Iterator[pb.Action]:
        """Reads the stream's Steps after its Hello, yields an Action for each."""
        size_limit = codec.max_step_bytes(spec, num_envs)
        first = next(incoming, None)
        if first is None:
            return
        # Memory is spent only on a stream that sends Steps (a bare Hello costs nothing).
        first_step = codec.read_step(first, spec, num_envs, size_limit)
        buffer_size = num_envs * rollout_bytes(spec, self.unroll_length)
        with self.memory.reserved(stream.client_id, buffer_size):
            yield from self._act_on_steps(incoming, stream, spec, num_envs, first_step)

    def _act_on_steps(
        self,
        incoming: Iterator[pb.EnvMessage],
        stream: Stream,
        spec: EnvSpec,
        num_envs: int,
        first_step: tuple[dict[str, np.ndarray], np.ndarray],
    ) -> Iterator[pb.Action]:
        T = self.unroll_length
        client_id = stream.client_id
        size_limit = codec.max_step_bytes(spec, num_envs)
        keys = rollout.env_keys(spec)
        # [T+1, E, ...]: the stream's E envs side by side, as the model wants them; made so
        # (a transposed copy of [E, T+1, ...] took twice what the stream reserved).
        buffers = {
            key: torch.zeros((shape[0], num_envs, *shape[1:]), dtype=dtype)
            for key, (shape, dtype) in rollout.rollout_spec(spec, T).items()
        }
        arrays = {key: value.numpy() for key, value in buffers.items()}  # views, for numpy writes
        core_state = initial_core_state = tuple(
            s.expand(-1, num_envs, -1).contiguous() for s in self.inference.initial_core_state
        )
        fields, observation = first_step
        # The env side sends no last action: the learner knows the one it answered.
        env_output = {
            "frame": observation,
            "last_action": np.zeros(num_envs, np.int64),
            **fields,
            rollout.TRUNCATION_KEY: np.zeros(num_envs, np.float32),
        }
        agent_output = rollout.first_agent_output(num_envs, spec.num_actions)
        t = 0
        # The frame's one copy out of the message is this numpy write.
        rollout.write_step(arrays, 0, keys, env_output, agent_output)
        try:
            while True:
                env_inputs = {key: buffers[key][t : t + 1] for key in rollout.MODEL_KEYS}
                try:
                    agent_output, core_state = self.inference.compute((env_inputs, core_state))
                except StreamClosed:
                    # Its last frame broke inference: the rollout that holds it would make
                    # the loss of the batch it joins non-finite, and cost others theirs.
                    stream.discard = True
                    raise
                actions = agent_output["action"]  # [E]
                yield pb.Action(action=actions.tolist())
                message = next(incoming, None)
                if message is None:
                    break
                # A bad Step raises before t moves on.
                fields, observation = codec.read_step(message, spec, num_envs, size_limit)
                env_output = {"frame": observation, "last_action": actions.numpy(), **fields}
                env_output[rollout.TRUNCATION_KEY] = self._truncation_values(
                    env_output, core_state, stream
                )
                t += 1
                rollout.write_step(arrays, t, keys, env_output, agent_output)
                for env in np.flatnonzero(fields["episode_end"]):
                    self.episodes.write(
                        client_id_of(client_id, env, num_envs),
                        float(fields["episode_return"][env]),
                        int(fields["episode_step"][env]),
                        "game",
                    )
                if t == T:
                    self._deliver(stream.serial, buffers, T, initial_core_state)
                    # Step 0 repeats the last step of the previous rollout.
                    rollout.write_step(arrays, 0, keys, env_output, agent_output)
                    initial_core_state, t = core_state, 0
        finally:  # also when the peer went away (grpc.RpcError): a disconnect
            if not self.stopping.is_set():
                log.info("Stream %s ended %d steps into a rollout.", client_id, t)
            if not self.stopping.is_set() and not stream.discard:
                # Each env's episode under way ends here, also right after a whole rollout
                # (t = 0); one that has not begun (no step yet) is no episode.
                under_way = ~arrays["episode_end"][t] & (arrays["episode_step"][t] > 0)
                for env in np.flatnonzero(under_way):
                    self.episodes.write(
                        client_id_of(client_id, env, num_envs),
                        float(arrays["episode_return"][t, env]),
                        int(arrays["episode_step"][t, env]),
                        "disconnect",
                    )
            if t > 0 and not self.stopping.is_set() and not stream.discard:
                # What the stream sent is still learned from: partial rollouts.
                try:
                    self._deliver(stream.serial, buffers, t, initial_core_state)
                except Closed:
                    pass

    def _truncation_values(
        self, env_output: dict[str, np.ndarray], core_state: CoreState, stream: Stream
    ) -> np.ndarray:
        """[E]: the value of the state each env's episode stopped in where a time limit cut
        it short in this Step (``truncated``, its ``final_frame`` [K, ...]), 0 elsewhere;
        the K asked of inference from the core state their new frames would be read with."""
        truncated = env_output["truncated"]
        values = np.zeros(len(truncated), dtype=np.float32)
        if not truncated.any():
            return values
        rows = torch.from_numpy(np.flatnonzero(truncated))
        inputs = {  # [1, K, ...]
            "frame": torch.from_numpy(np.array(env_output["final_frame"]))[None],
            "reward": torch.from_numpy(env_output["reward"][truncated].astype(np.float32))[None],
            "done": torch.zeros((1, len(rows)), dtype=torch.bool),  # the state goes on
            "last_action": torch.from_numpy(env_output["last_action"][truncated])[None],
        }
        try:
            outputs, _ = self.inference.compute((inputs, tuple(s[:, rows] for s in core_state)))
        except StreamClosed:
            stream.discard = True  # as for a frame that breaks inference
            raise
        values[truncated] = outputs["baseline"].float().numpy()
        return values

    def _deliver(
        self,
        stream: int,
        buffers: dict[str, torch.Tensor],
        length: int,
        core_state: CoreState,
    ) -> None:
        """Queues each env's rollout: its first ``length`` + 1 steps, zero-padded to T+1,
        with its source: (stream, env)."""
        T1, num_envs = buffers["frame"].shape[:2]
        mask = torch.zeros(T1, dtype=torch.bool)
        mask[: length + 1] = True
        for env in range(num_envs):
            column = {key: value[:, env].clone() for key, value in buffers.items()}
            if length + 1 < T1:  # padding: zeros, which the mask keeps out of every loss
                for value in column.values():
                    value[length + 1 :] = 0
            column["mask"] = mask
            env_state = tuple(s[:, env : env + 1] for s in core_state)
            self.queue.put((column, env_state, (stream, env)))
