"""The one rollout layout every runtime writes (``core.rollout.write_step``): step t holds
the env's output at t and the action, chosen at t - 1, that led there; step 0 repeats the
last step of the previous rollout. Checked on the actors' Unroller (MonoBeast, RayBeast)
and on PolyBeast's learner end of a stream, each stepping real CartPole environments."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from torchbeast import envs
from torchbeast.config.flags import parse_flags
from torchbeast.config.parsers import make_poly_parser
from torchbeast.config.settings import Settings, build_settings
from torchbeast.core import rollout
from torchbeast.core.models import create_model, model_config
from torchbeast.runtime.acting import Unroller
from torchbeast.runtime.poly import codec
from torchbeast.runtime.poly import inference as inference_module
from torchbeast.runtime.poly.episodes_log import EpisodeLog
from torchbeast.runtime.poly.inference import StreamInference
from torchbeast.runtime.poly.stream_limits import Stream, StreamMemory
from torchbeast.runtime.poly.stream_rollouts import StreamRollouts
from torchbeast.runtime.queues import RolloutQueue

T, E, ROLLOUTS = 4, 3, 15  # 60 steps: every env ends an episode (random play: ~22)


def small_settings(*more: str) -> Settings:
    argv = ["--env", "CartPole-v1", "--num_actors", "1", "--envs_per_actor", str(E), *more]
    argv += ["--unroll_length", str(T), "--batch_size", str(E), "--seed", "3"]
    return build_settings(parse_flags(argv, make_poly_parser()), "poly")


def assert_layout(rollouts: list[dict[str, torch.Tensor]], model: torch.nn.Module) -> None:
    """``rollouts``: one env's consecutive rollouts, name -> [T+1, ...]."""
    ended = 0
    for steps in rollouts:
        # The action chosen at t - 1 is the one the env reports at t as its last.
        assert torch.equal(steps["last_action"][1:], steps["action"][1:])
        # ... chosen from the outputs of the model on the frame of step t - 1.
        inputs = {key: steps[key][:-1].unsqueeze(1) for key in rollout.ENV_KEYS}  # [T, 1]
        with torch.no_grad():
            outputs, _ = model(inputs, (), act=False)
        torch.testing.assert_close(outputs["policy_logits"][:, 0], steps["policy_logits"][1:])
        torch.testing.assert_close(outputs["baseline"][:, 0], steps["baseline"][1:])
        ended += int(steps["episode_end"][1:].sum())
    for before, after in zip(rollouts, rollouts[1:], strict=False):
        for key in before:
            assert torch.equal(after[key][0], before[key][T]), key
    assert ended > 0  # the layout held across an episode's end and reset


TIME_LIMITED = ("--env", "tests.envs_for_tests:TimeLimitedCartPole-v0")


def assert_truncation_values(
    rollouts: list[dict[str, torch.Tensor]], env_steps: list[dict], env: int, model
) -> tuple[int, int]:
    """An env's rollouts hold at each step where a time limit ended its episode the
    model's value of the state it stopped in (the step's ``final_frame``), read after the
    step's reward and action, and 0 at every other step; ``env_steps``: the envs' outputs
    of each step in order, as the env returned them. Returns how many episodes a time
    limit and how many the game ended."""
    cut, ended = 0, 0
    for i, output in enumerate(env_steps):
        written = rollouts[i // T]["truncation_value"][1 + i % T]
        if not output["truncated"][env]:
            assert written == 0.0
            ended += int(output["episode_end"][env])
            continue
        k = int(output["truncated"][: env + 1].sum()) - 1  # its row in final_frame
        inputs = dict(
            frame=torch.as_tensor(output["final_frame"][k : k + 1])[None],  # [1, 1, ...]
            reward=torch.as_tensor(output["reward"][env : env + 1])[None].float(),
            done=torch.zeros(1, 1, dtype=torch.bool),
            last_action=torch.as_tensor(output["last_action"][env : env + 1])[None],
        )
        with torch.no_grad():
            value = model(inputs, (), act=False)[0]["baseline"][0, 0]
        torch.testing.assert_close(written, value)
        assert written != 0.0
        cut += 1
    return cut, ended


def keeping_steps(env, outputs: list[dict]) -> None:
    """Makes ``env`` (a BatchedEnv) keep a copy of each step's output in ``outputs``."""
    step = env.step

    def recorded_step(actions):
        output = step(actions)
        outputs.append({key: np.array(value) for key, value in output.items()})
        return output

    env.step = recorded_step


def test_actors_write_the_rollout_layout():
    settings = small_settings()
    spec = envs.env_spec(settings.env)
    config = model_config(settings.model, spec.observation_shape)
    unroller = Unroller(settings, spec, config, seed=settings.env.seed)
    try:
        core_states = tuple(torch.zeros(E, *s.shape[::2]) for s in unroller.model.initial_state(1))
        columns: list[list[dict]] = [[] for _ in range(E)]
        for _ in range(ROLLOUTS):
            buffers = rollout.allocate(spec, T, E)  # [E, T+1, ...]: fresh, as from a pool
            unroller.unroll(buffers, torch.arange(E), core_states)
            for env in range(E):
                columns[env].append({key: value[env] for key, value in buffers.items()})
        for env in range(E):
            assert_layout(columns[env], unroller.model)
    finally:
        unroller.close()


def test_actors_write_the_value_where_a_time_limit_ended_an_episode():
    settings = small_settings(*TIME_LIMITED)
    spec = envs.env_spec(settings.env)
    config = model_config(settings.model, spec.observation_shape)
    unroller = Unroller(settings, spec, config, seed=settings.env.seed)
    env_steps: list[dict] = []
    keeping_steps(unroller.env, env_steps)
    try:
        columns: list[list[dict]] = [[] for _ in range(E)]
        for _ in range(ROLLOUTS):
            buffers = rollout.allocate(spec, T, E)  # [E, T+1, ...]
            unroller.unroll(buffers, torch.arange(E), ())
            for env in range(E):
                columns[env].append({key: value[env] for key, value in buffers.items()})
        ends = []
        for env in range(E):
            assert_layout(columns[env], unroller.model)
            ends.append(assert_truncation_values(columns[env], env_steps, env, unroller.model))
        assert all(sum(kind) > 0 for kind in zip(*ends, strict=True))  # both kinds of episode end
    finally:
        unroller.close()


def stream_rollouts(settings: Settings, tmp_path) -> tuple[list, list[dict], torch.nn.Module]:
    """Each env's rollouts ([T+1, ...] each) from PolyBeast's learner end of one stream of
    E envs, ROLLOUTS of each; the envs' outputs of each step; the inference model."""
    spec = envs.env_spec(settings.env)
    config = model_config(settings.model, spec.observation_shape)
    model = create_model(config, spec.observation_shape, spec.num_actions)
    inference = StreamInference(model, config, spec, settings.runtime)
    stopping = threading.Event()
    queue = RolloutQueue(ROLLOUTS * E + E, stopping)
    episodes = EpisodeLog(str(tmp_path / "episodes.csv"))
    rollouts = StreamRollouts(T, inference, episodes, queue, StreamMemory(64), stopping)
    env = envs.create_env(settings.env, num_envs=E, num_threads=1)
    keeping_steps(env, env_steps := [])
    sent: list[np.ndarray] = []

    def steps():  # the env side of the stream: a Step for each Action
        yield codec.step_message(env.reset(seed=3))
        while True:
            yield codec.step_message(env.step(sent[-1]))

    try:
        stream = Stream(serial=0, cancel=lambda: None)
        answers = rollouts.act(steps(), stream, spec, E)
        for _ in range(ROLLOUTS * T + 1):
            sent.append(np.asarray(next(answers).action))
        stopping.set()  # the stream ends on a full rollout: nothing partial to deliver
        answers.close()
        columns: list[list[dict]] = [[] for _ in range(E)]
        for (column, _, (_, env_index)), _ in queue.waiting.items:  # closed: read directly
            assert column.pop("mask").all()
            columns[env_index].append(column)
        assert [len(c) for c in columns] == [ROLLOUTS] * E
        return columns, env_steps, inference.model
    finally:
        inference.close()
        episodes.close()
        env.close()


def test_polybeast_streams_write_the_rollout_layout(tmp_path):
    columns, _, model = stream_rollouts(small_settings(), tmp_path)
    for env_index in range(E):
        assert_layout(columns[env_index], model)


def test_polybeast_streams_write_the_value_where_a_time_limit_ended_an_episode(tmp_path):
    """The env side sends each truncated episode's last observation; the learner's end
    asks inference for its value."""
    columns, env_steps, model = stream_rollouts(small_settings(*TIME_LIMITED), tmp_path)
    ends = []
    for env in range(E):
        assert_layout(columns[env], model)
        ends.append(assert_truncation_values(columns[env], env_steps, env, model))
    assert all(sum(kind) > 0 for kind in zip(*ends, strict=True))  # both kinds of episode end


def test_polybeast_inference_samples_from_its_own_generator():
    """Its threads sample beside the learner's, whose CUDA-graph capture owns the device's
    default generator meanwhile."""
    settings = small_settings()
    spec = envs.env_spec(settings.env)
    config = model_config(settings.model, spec.observation_shape)
    torch.manual_seed(0)
    model = create_model(config, spec.observation_shape, spec.num_actions)
    inference = StreamInference(model, config, spec, settings.runtime)
    try:
        frames = torch.randn(1, 64, *spec.observation_shape)
        inputs = dict(
            frame=frames,
            reward=torch.zeros(1, 64),
            done=torch.zeros(1, 64, dtype=torch.bool),
            last_action=torch.zeros(1, 64, dtype=torch.int64),
        )
        default_state = torch.get_rng_state()
        ((outputs, _),) = inference.infer([(inputs, inference.initial_core_state)])
        assert torch.equal(torch.get_rng_state(), default_state)
        assert len(set(outputs["action"].flatten().tolist())) == 2  # sampled
    finally:
        inference.close()


@pytest.mark.parametrize("use_lstm", [False, True])
def test_polybeast_inference_of_more_rows_than_one_pass_takes_gives_each_rows_outputs(
    monkeypatch, use_lstm
):
    settings = small_settings(*(["--use_lstm"] if use_lstm else []))
    spec = envs.env_spec(settings.env)
    config = model_config(settings.model, spec.observation_shape)
    torch.manual_seed(0)
    model = create_model(config, spec.observation_shape, spec.num_actions)
    inference = StreamInference(model, config, spec, settings.runtime)
    rows = 10
    inputs = dict(
        frame=torch.randn(1, rows, *spec.observation_shape),
        reward=torch.randn(1, rows),
        done=torch.rand(1, rows) < 0.3,
        last_action=torch.randint(0, spec.num_actions, (1, rows)),
    )
    core_state = tuple(torch.randn_like(s.expand(-1, rows, -1)) for s in model.initial_state(1))
    try:
        with torch.inference_mode():
            whole = inference.model(inputs, core_state, act=False)
        passes = []
        monkeypatch.setattr(inference, "model", recording(inference.model, passes))
        monkeypatch.setattr(inference_module, "MAX_ROWS_PER_PASS", 4)
        with torch.inference_mode():
            outputs, next_state = inference.forward(inputs, core_state)
        assert passes == [4, 4, 2]
        assert outputs.keys() == whole[0].keys()
        for key in outputs:
            torch.testing.assert_close(outputs[key], whole[0][key])
        assert len(next_state) == (2 if use_lstm else 0)
        for state, expected in zip(next_state, whole[1], strict=True):
            torch.testing.assert_close(state, expected)
    finally:
        inference.close()


def recording(model, passes: list[int]):
    """``model``, noting the rows of each forward pass in ``passes``."""

    def forward(inputs, core_state, act):
        passes.append(inputs["frame"].shape[1])
        return model(inputs, core_state, act=act)

    return forward


def test_each_streams_lstm_state_from_a_batched_pass_is_its_own_not_a_view_of_the_pass():
    # Each queued rollout kept the whole pass's [layers, N, H] state alive through a view.
    settings = small_settings("--use_lstm")
    spec = envs.env_spec(settings.env)
    config = model_config(settings.model, spec.observation_shape)
    model = create_model(config, spec.observation_shape, spec.num_actions)
    inference = StreamInference(model, config, spec, settings.runtime)

    def request(rows: int):
        inputs = dict(
            frame=torch.randn(1, rows, *spec.observation_shape),
            reward=torch.zeros(1, rows),
            done=torch.zeros(1, rows, dtype=torch.bool),
            last_action=torch.zeros(1, rows, dtype=torch.int64),
        )
        return inputs, tuple(s.expand(-1, rows, -1).contiguous() for s in model.initial_state(1))

    try:
        results = inference.infer([request(2), request(3)])
        for (_, state), rows in zip(results, (2, 3), strict=True):
            for tensor in state:
                assert tensor.shape[1] == rows
                assert tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size()
    finally:
        inference.close()
