"""MonoBeast's actors with central inference step their envs in groups that take turns
(``--env_groups``, Sample Factory's double-buffered sampling): while the server chooses one
group's actions, the actor steps the other's envs. Real CartPole envs and a real server."""

from __future__ import annotations

import multiprocessing
import threading
import time

import pytest
import torch

from tests.test_monobeast import SMALL_RUN, monobeast, wait_for
from torchbeast import envs
from torchbeast.config.flags import parse_flags
from torchbeast.config.parsers import make_mono_parser
from torchbeast.config.settings import Settings, build_settings
from torchbeast.core import rollout
from torchbeast.core.models import create_model, model_config
from torchbeast.runtime.acting import Unroller
from torchbeast.runtime.mono_actor import TakingTurns
from torchbeast.runtime.mono_inference import InferenceFigures, InferenceServer, InferenceSlots
from torchbeast.runtime.mono_weights import SharedWeights

T, E, ROLLOUTS = 4, 4, 15  # 60 steps: every env ends an episode (random play: ~22)


def mono_settings(*argv: str) -> Settings:
    flags = ["--env", "CartPole-v1", "--num_actors", "1", "--envs_per_actor", str(E)]
    flags += ["--unroll_length", str(T), "--batch_size", str(E), "--seed", "3", *argv]
    return build_settings(parse_flags(flags, make_mono_parser()), "mono")


class WhenEveryRowAsked:
    """A server that runs a pass only once every row has asked: an actor that waited for
    one group's actions before the other group asked would wait forever (here: 10 s, then
    ``stalled``)."""

    def __init__(self, server: InferenceServer, conns: dict):
        self.server, self.conns = server, conns  # pipe -> row
        self.stopping = threading.Event()
        self.stalled = self.asked_twice = False
        self.thread = threading.Thread(target=self.serve)
        self.thread.start()

    def serve(self) -> None:
        pending: list = []
        since = time.monotonic()
        while not self.stopping.is_set():
            for conn in multiprocessing.connection.wait(list(self.conns), timeout=0.05):
                conn.recv_bytes()
                self.asked_twice |= conn in pending
                pending.append(conn)
            patience = 0 if self.stalled else 10  # one stall fails the test: no more waits
            if not pending:
                since = time.monotonic()
            elif len(pending) < len(self.conns) and time.monotonic() - since < patience:
                continue
            else:
                self.stalled |= len(pending) < len(self.conns)
                self.server.infer([self.conns[conn] for conn in pending])
                for conn in pending:
                    conn.send_bytes(b"!")
                pending.clear()

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join()


def grouped_actor(settings: Settings, groups: int):
    """An actor of E envs in ``groups`` groups, its server, and the learner's model."""
    spec = envs.env_spec(settings.env)
    config = model_config(settings.model, spec.observation_shape)
    torch.manual_seed(0)
    learner_model = create_model(config, spec.observation_shape, spec.num_actions)
    weights = SharedWeights(learner_model)
    weights.publish(learner_model)
    slots = InferenceSlots.allocate(spec, learner_model, groups, E // groups)
    model = create_model(config, spec.observation_shape, spec.num_actions, inference_only=True)
    server = InferenceServer(model, slots, InferenceFigures.allocate(groups), weights)
    pipes = [multiprocessing.Pipe() for _ in range(groups)]
    actor = TakingTurns.build(
        settings, spec, config, slots, 0, settings.env.seed, [a for a, _ in pipes]
    )
    return actor, server, {conn: row for row, (_, conn) in enumerate(pipes)}, learner_model


def spy_on_turns(actor: TakingTurns) -> list[tuple[str, int]]:
    """Records each group's asks, answers and env steps, in order, as they happen (the
    real methods still run)."""
    events: list[tuple[str, int]] = []

    def recorded(name: str, group: int, method):
        def call(*args):
            events.append((name, group))
            return method(*args)

        return call

    for group, unroller in enumerate(actor.groups):
        policy = unroller.split
        policy.ask = recorded("ask", group, policy.ask)
        policy.answer = recorded("answer", group, policy.answer)
        unroller.step = recorded("step", group, unroller.step)
    return events


def assert_the_other_group_waits_while_one_steps(events: list[tuple[str, int]]) -> None:
    waiting = {0: False, 1: False}  # asked and not yet answered
    for name, group in events:
        if name == "step":
            assert waiting[1 - group], f"group {group} stepped with no request of the other's"
        else:
            waiting[group] = name == "ask"


def assert_rollouts_replay(
    rollouts: list[dict[str, torch.Tensor]], states: list[tuple], model: torch.nn.Module
) -> None:
    """One env's consecutive rollouts (name -> [T+1, ...]) and the core state each started
    from ([layers, H] each): the model, run over steps 0..T-1 from that state as the
    learner runs it, gives the logits of steps 1..T; step 0 repeats the last rollout's T."""
    for steps, state in zip(rollouts, states, strict=True):
        inputs = {key: steps[key][:-1].unsqueeze(1) for key in rollout.ENV_KEYS}  # [T, 1]
        core_state = tuple(s.unsqueeze(1) for s in state)  # [layers, 1, H]
        with torch.no_grad():
            outputs, _ = model(inputs, core_state, act=False)
        torch.testing.assert_close(outputs["policy_logits"][:, 0], steps["policy_logits"][1:])
    for before, after in zip(rollouts, rollouts[1:], strict=False):
        for key in before:
            assert torch.equal(after[key][0], before[key][T]), key


@pytest.mark.parametrize("model", [[], ["--use_lstm"]], ids=["mlp", "lstm"])
def test_groups_take_turns_and_write_each_envs_rollouts_to_its_slots(model):
    """While one group steps, the other's request is with the server; each group asks for
    its next actions as soon as it has stepped, also after a rollout's last step. Each env's
    rollouts land in the slots handed out for it, replay from the core state recorded for
    them, and follow on from each other."""
    settings = mono_settings("--central_inference", *model)
    actor, server, conns, learner_model = grouped_actor(settings, groups=2)
    events = spy_on_turns(actor)
    serving = WhenEveryRowAsked(server, conns)
    spec = envs.env_spec(settings.env)
    generator = torch.Generator().manual_seed(0)
    columns: list[list[dict]] = [[] for _ in range(E)]
    states: list[list[tuple]] = [[] for _ in range(E)]
    # The actor's env i is env i % (E/G) of group i // (E/G).
    first_frames = torch.cat([group.env_output["frame"] for group in actor.groups])
    try:
        core_states = tuple(
            torch.zeros(E, *s.shape[::2]) for s in learner_model.initial_state(1)
        )  # [slots, layers, H] each
        for _ in range(ROLLOUTS):
            buffers = rollout.allocate(spec, T, E)  # [slots, T+1, ...]: fresh, as from a pool
            index = torch.randperm(E, generator=generator)  # env i -> slot index[i]
            actor.unroll(buffers, index, core_states)
            for env, slot in enumerate(index.tolist()):
                columns[env].append({key: value[slot] for key, value in buffers.items()})
                states[env].append(tuple(s[slot].clone() for s in core_states))
        # The groups' asks for the next rollout's first actions may still be in the pipes.
        wait_for(lambda: server.passes.sum() > ROLLOUTS * T, 10, "the last pass")
    finally:
        serving.stop()
        actor.close()
    assert not serving.stalled and not serving.asked_twice
    assert_the_other_group_waits_while_one_steps(events)
    # One pass per step, each for both groups, and the next rollout's first already asked.
    assert server.passes.tolist() == [0, 0, ROLLOUTS * T + 1]
    last = {group: name for name, group in events}
    assert last == {0: "ask", 1: "ask"}  # the next rollout's first actions, asked already
    for env in range(E):
        assert torch.equal(columns[env][0]["frame"][0], first_frames[env])  # its own env
        assert_rollouts_replay(columns[env], states[env], learner_model)
    if model:  # the LSTM's state moved on, rollout after rollout
        assert not torch.equal(states[0][-1][0], torch.zeros_like(states[0][-1][0]))


def test_grouped_envs_are_seeded_as_the_actors_envs_in_one_group():
    settings = mono_settings("--central_inference")
    actor, server, _, _ = grouped_actor(settings, groups=2)
    spec = envs.env_spec(settings.env)
    config = model_config(settings.model, spec.observation_shape)
    whole = Unroller(settings, spec, config, settings.env.seed)
    try:
        frames = torch.cat([group.env_output["frame"] for group in actor.groups])
        assert torch.equal(frames, whole.env_output["frame"])
        assert len(actor.groups) == 2 and all(len(g.env_output["frame"]) == 2 for g in actor.groups)
    finally:
        actor.close()
        whole.close()


@pytest.mark.parametrize(
    ("argv", "groups"),
    [
        (["--central_inference"], 2),
        (["--central_inference", "--envs_per_actor", "3"], 1),
        (["--central_inference", "--env_groups", "4"], 4),
        ([], 1),
    ],
)
def test_env_groups_default_to_two_where_central_inference_splits_the_envs(argv, groups):
    assert mono_settings(*argv).runtime.env_groups == groups


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--central_inference", "--env_groups", "3"],
            "--env_groups 3 does not divide --envs_per_actor 4 into equal groups: "
            "give a divisor of 4",
        ),
        (
            ["--env_groups", "2"],
            "--env_groups 2 takes turns waiting for central inference's actions: "
            "add --central_inference, or leave --env_groups out",
        ),
    ],
)
def test_env_groups_that_cannot_apply_are_refused_in_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        mono_settings(*argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err.strip().splitlines()[-1]


def test_monobeast_says_how_its_actors_step_their_envs(tmp_path):
    args = [*SMALL_RUN, "--central_inference", "--total_steps", "2000", "--xpid", "run"]
    result = monobeast(tmp_path, *args)
    assert result.returncode == 0, result.stderr
    out_log = (tmp_path / "run" / "out.log").read_text()
    assert (
        "each actor steps its 4 envs in 2 groups of 2 that take turns waiting for their "
        "actions (--env_groups)."
    ) in out_log


def test_groups_ask_the_server_for_the_value_where_a_time_limit_ended_an_episode():
    """The value of the state a truncated episode stopped in comes from the server too, in
    one more pass for the group, from the LSTM state its new frame would be read with."""
    from tests.test_rollout_layout import TIME_LIMITED, keeping_steps

    settings = mono_settings("--central_inference", "--use_lstm", *TIME_LIMITED)
    actor, server, conns, learner_model = grouped_actor(settings, groups=2)
    env_steps: list[list[dict]] = [[], []]  # each group's envs' outputs, step by step
    for group, unroller in enumerate(actor.groups):
        keeping_steps(unroller.env, env_steps[group])
    for conn, row in conns.items():
        server.add(row, conn)
    serving = threading.Thread(target=server.serve)  # as the inference process serves
    serving.start()
    spec = envs.env_spec(settings.env)
    columns: list[list[dict]] = [[] for _ in range(E)]
    states: list[list[tuple]] = [[] for _ in range(E)]
    try:
        core_states = tuple(torch.zeros(E, *s.shape[::2]) for s in learner_model.initial_state(1))
        for _ in range(ROLLOUTS):
            buffers = rollout.allocate(spec, T, E)
            actor.unroll(buffers, torch.arange(E), core_states)
            for env in range(E):
                columns[env].append({key: value[env] for key, value in buffers.items()})
                states[env].append(tuple(s[env].clone() for s in core_states))
    finally:
        server.stopping.set()
        serving.join()
        actor.close()
    per_group = E // 2
    cut = 0
    for env in range(E):
        outputs = env_steps[env // per_group]
        for i, output in enumerate(outputs[: ROLLOUTS * T]):
            steps, state = columns[env][i // T], states[env][i // T]
            written, k = steps["truncation_value"][1 + i % T], env % per_group
            if not output["truncated"][k]:
                assert written == 0.0
                continue
            seen = {key: steps[key][: 1 + i % T].unsqueeze(1) for key in rollout.MODEL_KEYS}
            row = int(output["truncated"][: k + 1].sum()) - 1
            final = dict(
                frame=torch.as_tensor(output["final_frame"][row : row + 1])[None],
                reward=torch.as_tensor(output["reward"][k : k + 1])[None].float(),
                done=torch.zeros(1, 1, dtype=torch.bool),
                last_action=torch.as_tensor(output["last_action"][k : k + 1])[None],
            )
            with torch.no_grad():
                _, after = learner_model(seen, tuple(s.unsqueeze(1) for s in state), act=False)
                value = learner_model(final, after, act=False)[0]["baseline"][0, 0]
            torch.testing.assert_close(written, value)
            cut += 1
    assert cut > 0
