"""What runs in Ray: the actors that step environments (``RolloutActor``), and the
learner's newest weights in the object store that they act with (``RayWeights``)."""

from __future__ import annotations

import threading
import time

import numpy as np
import ray
import torch
from torch import nn

from torchbeast.config.settings import Settings
from torchbeast.core import rollout
from torchbeast.core import weights as model_weights
from torchbeast.core.spec import EnvSpec
from torchbeast.envs.registry import EnvError, EnvImportError
from torchbeast.runtime.acting import Unroller, actor_seed
from torchbeast.runtime.supervision import last_line


def start_unroller(settings: Settings, env_spec: EnvSpec, config: dict, seed: int) -> Unroller:
    """The actor's envs and model; an env module this worker cannot import is said so."""
    try:
        return Unroller(settings, env_spec, config, seed)
    except (EnvImportError, ImportError) as error:  # the driver's import went well
        raise EnvError(
            f"a Ray worker on {ray.util.get_node_ip_address()} cannot import what the "
            f"driver could ({last_line(error)}): every node needs it, installed there or "
            "on the PYTHONPATH its `ray start` was given"
        ) from None


class RolloutActor:
    """A Ray actor: ``envs_per_actor`` environments and a CPU copy of the model."""

    def __init__(
        self,
        settings: Settings,
        env_spec: EnvSpec,
        config: dict,
        actor_index: int,
        incarnation: int,
    ):
        torch.set_num_threads(1)
        # A failure to start is raised by the first task, not here: Ray prints the traceback
        # of a failed actor creation on the driver's terminal, from every actor; a task's
        # error reaches the pool alone, which logs it to out.log and stops in one line.
        self.start_error: Exception | None = None
        try:
            self.unroller = start_unroller(
                settings, env_spec, config, actor_seed(settings, actor_index, incarnation)
            )
        except Exception as error:
            self.start_error = error
            return
        num_envs = settings.actors.envs_per_actor
        self.buffers = rollout.allocate(
            env_spec, settings.learner.unroll_length, num_envs
        )  # [E, T+1, ...]
        state = self.unroller.model.initial_state(1)  # each [layers, 1, H]
        self.initial_core_states = tuple(torch.zeros(num_envs, *s.shape[::2]) for s in state)
        self.index = torch.arange(num_envs)
        self.version = -1
        self.cpu_mark = time.process_time()

    def unroll(self, weights: list[ray.ObjectRef], version: int) -> dict:
        """One rollout of each env with weights ``version`` (fetched only if newer).

        ``weights`` is a one-element list so that Ray does not fetch the object for a task
        that already holds that version. Returns numpy arrays, which Ray passes without
        pickling element by element: rollout [E, T+1, ...], core_state [E, layers, H] each,
        timings (env, inference, all CPU seconds, agent steps).
        """
        if self.start_error is not None:
            raise self.start_error
        if version != self.version:
            flat = torch.from_numpy(ray.get(weights[0]).copy())  # [num_parameters] float32
            model_weights.load_flat(self.unroller.model, flat)
            self.unroller.model.policy_version.fill_(version)
            self.version = version
        self.unroller.unroll(self.buffers, self.index, self.initial_core_states)
        env_time, inference_time = self.unroller.take_times()
        now = time.process_time()
        steps = self.unroller.unroll_length * len(self.index)
        timings = np.array([env_time, inference_time, now - self.cpu_mark, steps])
        self.cpu_mark = now
        # Ray copies the arrays into the object store as the task returns, so the buffers
        # can be refilled by the next task.
        return {
            "rollout": {key: value.numpy() for key, value in self.buffers.items()},
            "core_state": tuple(s.numpy() for s in self.initial_core_states),
            "timings": timings,
        }


RemoteRolloutActor = ray.remote(max_restarts=0)(RolloutActor)


class RayWeights:
    """The learner's newest weights in the object store: one ``ray.put`` per update."""

    def __init__(self):
        self.lock = threading.Lock()
        self.ref: ray.ObjectRef | None = None
        self.version = -1  # the learner updates behind the weights (policy_version)

    def publish(self, model: nn.Module) -> None:
        flat = model_weights.flatten(model).cpu().numpy()
        ref = ray.put(flat)
        with self.lock:
            self.ref, self.version = ref, int(model.policy_version)

    def latest(self) -> tuple[ray.ObjectRef, int]:
        with self.lock:
            assert self.ref is not None, "publish before asking for rollouts"
            return self.ref, self.version
