"""Specification of the agent networks: shapes, sizes, the LSTM reset, acting, config."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from torchbeast.config.flags import parse_flags
from torchbeast.config.settings import build_settings
from torchbeast.core.errors import UserError
from torchbeast.core.models import count_parameters, create_model, model_config, parameter_bound
from torchbeast.core.settings import ModelSettings

ATARI_SHAPE = (4, 84, 84)
VECTOR_SHAPE = (4,)


def make_model(observation_shape, num_actions, **model_flags):
    config = model_config(ModelSettings(**model_flags), observation_shape)
    return create_model(config, observation_shape, num_actions)


def inputs(T, B, observation_shape, num_actions, seed=0, done=None):
    """Random time-major inputs [T, B, ...]; uint8 pixels for images, float features else."""
    generator = torch.Generator().manual_seed(seed)
    if len(observation_shape) == 3:
        shape = (T, B, *observation_shape)
        frame = torch.randint(0, 256, shape, dtype=torch.uint8, generator=generator)
    else:
        frame = torch.randn(T, B, *observation_shape, generator=generator)
    return dict(
        frame=frame,
        reward=torch.randn(T, B, generator=generator),
        done=torch.zeros(T, B, dtype=torch.bool) if done is None else done,
        last_action=torch.randint(0, num_actions, (T, B), generator=generator),
    )


# Output shapes: policy_logits [T, B, A], baseline [T, B], action [T, B].


@pytest.mark.parametrize(
    "observation_shape, model_flags",
    [
        (ATARI_SHAPE, {}),
        (ATARI_SHAPE, {"use_lstm": True}),
        (ATARI_SHAPE, {"use_resnet": True}),
        (VECTOR_SHAPE, {}),
        (VECTOR_SHAPE, {"use_lstm": True}),
    ],
    ids=["atari", "atari-lstm", "resnet", "mlp", "mlp-lstm"],
)
def test_outputs_are_time_major(observation_shape, model_flags):
    T, B, A = 3, 2, 6
    model = make_model(observation_shape, A, **model_flags)
    outputs, _ = model(inputs(T, B, observation_shape, A), model.initial_state(B))
    assert outputs["policy_logits"].shape == (T, B, A)
    assert outputs["baseline"].shape == (T, B)
    assert outputs["action"].shape == (T, B)
    assert outputs["action"].dtype == torch.int64


def test_lstm_core_state_is_two_layers_of_the_core_size():
    model = make_model(ATARI_SHAPE, 6, use_lstm=True)
    _, (h, c) = model(inputs(2, 3, ATARI_SHAPE, 6), model.initial_state(3))
    assert h.shape == c.shape == (2, 3, 512 + 6 + 1)


def test_feed_forward_model_has_no_core_state():
    model = make_model(ATARI_SHAPE, 6)
    assert model.initial_state(3) == ()


# Sizes.


def conv_parameters(in_channels, out_channels, kernel):
    return in_channels * out_channels * kernel * kernel + out_channels


def linear_parameters(in_size, out_size):
    return in_size * out_size + out_size


def lstm_layer_parameters(input_size, hidden_size):
    # Four gates, each with input and hidden weights and two biases (PyTorch's b_ih, b_hh).
    return 4 * (input_size * hidden_size + hidden_size * hidden_size + 2 * hidden_size)


def original_atari_net_parameters(num_actions, use_lstm):
    """TorchBeast's AtariNet: Nature-DQN convs, fc 3136->512, core of 512 + A + 1."""
    core = 512 + num_actions + 1
    count = (
        conv_parameters(4, 32, 8)
        + conv_parameters(32, 64, 4)
        + conv_parameters(64, 64, 3)
        + linear_parameters(3136, 512)
        + linear_parameters(core, num_actions)  # policy
        + linear_parameters(core, 1)  # baseline
    )
    if use_lstm:
        count += 2 * lstm_layer_parameters(core, core)
    return count


def test_atari_net_has_the_original_parameter_count():
    assert count_parameters(make_model(ATARI_SHAPE, 6)) == original_atari_net_parameters(6, False)
    assert original_atari_net_parameters(6, False) == 1_687_768


def test_atari_net_with_lstm_has_the_original_parameter_count():
    model = make_model(ATARI_SHAPE, 6, use_lstm=True)
    assert count_parameters(model) == original_atari_net_parameters(6, True)


def linear_shapes(module):
    return [(m.in_features, m.out_features) for m in module.modules() if isinstance(m, nn.Linear)]


def test_atari_torso_is_one_fc_layer_of_512_by_default():
    assert linear_shapes(make_model(ATARI_SHAPE, 6).torso) == [(3136, 512)]


def test_hidden_size_and_num_layers_shape_the_atari_torso():
    model = make_model(ATARI_SHAPE, 6, hidden_size=128, num_layers=3)
    assert linear_shapes(model.torso) == [(3136, 128), (128, 128), (128, 128)]


@pytest.mark.parametrize("width, depth", [(256, 1), (1024, 2), (4096, 3)])
def test_width_and_depth_set_the_parameter_count(width, depth):
    # The reward-misspecification sweeps: Linear(3136, H), then L - 1 Linear(H, H).
    model = make_model(ATARI_SHAPE, 18, hidden_size=width, num_layers=depth)
    core = width + 18 + 1
    expected = (
        conv_parameters(4, 32, 8)
        + conv_parameters(32, 64, 4)
        + conv_parameters(64, 64, 3)
        + linear_parameters(3136, width)
        + (depth - 1) * linear_parameters(width, width)
        + linear_parameters(core, 18)
        + linear_parameters(core, 1)
    )
    assert count_parameters(model) == expected


def test_heads_read_the_hidden_size_plus_reward_and_last_action():
    model = make_model(ATARI_SHAPE, 6, hidden_size=128)
    assert linear_shapes(model.policy) == [(128 + 1 + 6, 6)]
    assert linear_shapes(model.baseline) == [(128 + 1 + 6, 1)]


def test_mlp_torso_is_two_layers_of_64_by_default():
    assert linear_shapes(make_model(VECTOR_SHAPE, 2).torso) == [(4, 64), (64, 64)]


def test_hidden_size_and_num_layers_shape_the_mlp_torso():
    model = make_model(VECTOR_SHAPE, 2, hidden_size=32, num_layers=1)
    assert linear_shapes(model.torso) == [(4, 32)]


def test_resnet_torso_flattens_3872_features_into_256_by_default():
    # Three stages of stride-2 pooling: 84 -> 42 -> 21 -> 11, with 32 channels.
    assert linear_shapes(make_model(ATARI_SHAPE, 6, use_resnet=True).torso) == [(32 * 11 * 11, 256)]


# The LSTM state is zeroed where an episode starts.


def test_lstm_state_is_reset_where_done():
    T, B, A, reset_at = 6, 2, 3, 3
    done = torch.zeros(T, B, dtype=torch.bool)
    done[reset_at, 0] = True  # column 0 starts a new episode at step 3; column 1 does not
    model = make_model(VECTOR_SHAPE, A, use_lstm=True).eval()
    batch = inputs(T, B, VECTOR_SHAPE, A, done=done)
    with torch.no_grad():
        whole, _ = model(batch, model.initial_state(B))
        tail = {key: value[reset_at:] for key, value in batch.items()}
        fresh, _ = model(tail, model.initial_state(B))

    for key in ("policy_logits", "baseline"):
        torch.testing.assert_close(whole[key][reset_at:, 0], fresh[key][:, 0])
        # Column 1 carries its state on, so a fresh start differs from it.
        assert not torch.allclose(whole[key][reset_at:, 1], fresh[key][:, 1])


def test_lstm_state_is_carried_between_calls():
    T, B, A = 4, 2, 3
    model = make_model(VECTOR_SHAPE, A, use_lstm=True).eval()
    batch = inputs(T, B, VECTOR_SHAPE, A)
    with torch.no_grad():
        whole, _ = model(batch, model.initial_state(B))
        _, state = model({k: v[:2] for k, v in batch.items()}, model.initial_state(B))
        second, _ = model({k: v[2:] for k, v in batch.items()}, state)
    torch.testing.assert_close(whole["policy_logits"][2:], second["policy_logits"])


# Acting: greedy in eval mode, sampled from the policy in train mode.


def test_eval_mode_acts_greedily():
    model = make_model(ATARI_SHAPE, 6).eval()
    with torch.no_grad():
        outputs, _ = model(inputs(3, 4, ATARI_SHAPE, 6), ())
    assert torch.equal(outputs["action"], outputs["policy_logits"].argmax(dim=-1))


def one_state_many_times(num_samples, A, seed=0):
    """One observation repeated over the batch, so every column has the same policy."""
    batch = inputs(1, 1, VECTOR_SHAPE, A, seed=seed)
    return {key: value.expand(1, num_samples, *value.shape[2:]) for key, value in batch.items()}


def peaked_model(A):
    """An MLP whose policy is far from uniform and far from greedy."""
    model = make_model(VECTOR_SHAPE, A).train()
    with torch.no_grad():
        model.policy.weight.zero_()
        model.policy.bias.copy_(torch.tensor([1.5, 0.5, 0.0, -1.0]))
    return model


def test_train_mode_samples_actions_that_vary():
    torch.manual_seed(0)
    model = peaked_model(4)
    with torch.no_grad():
        outputs, _ = model(one_state_many_times(200, 4), ())
    assert set(outputs["action"].flatten().tolist()) == {0, 1, 2, 3}


def test_train_mode_samples_follow_the_policy():
    torch.manual_seed(0)
    num_samples = 20000
    model = peaked_model(4)
    with torch.no_grad():
        outputs, _ = model(one_state_many_times(num_samples, 4), ())
    frequencies = torch.bincount(outputs["action"].flatten(), minlength=4) / num_samples
    policy = F.softmax(torch.tensor([1.5, 0.5, 0.0, -1.0]), dim=0)  # 0.59, 0.22, 0.13, 0.05
    # Standard error is at most 0.0035 per action: 0.015 is over four of them.
    torch.testing.assert_close(frequencies, policy, atol=0.015, rtol=0)


def test_train_mode_sampling_is_reproducible_with_a_seed():
    model = peaked_model(4)
    batch = one_state_many_times(100, 4)
    torch.manual_seed(1)
    first, _ = model(batch, ())
    torch.manual_seed(1)
    second, _ = model(batch, ())
    assert torch.equal(first["action"], second["action"])


# model_config picks the architecture from the observation shape and flags.


def test_model_config_for_atari_frames_is_atari_net():
    assert model_config(ModelSettings(), ATARI_SHAPE) == dict(
        kind="atari", hidden_size=512, num_layers=1, use_lstm=False
    )


def test_model_config_with_use_resnet_is_resnet():
    assert model_config(ModelSettings(use_resnet=True, use_lstm=True), ATARI_SHAPE) == dict(
        kind="resnet", hidden_size=256, num_layers=1, use_lstm=True
    )


def test_model_config_for_vector_observations_is_mlp():
    assert model_config(ModelSettings(), VECTOR_SHAPE) == dict(
        kind="mlp", hidden_size=64, num_layers=2, use_lstm=False
    )


def test_model_config_for_small_grids_like_minatar_is_mlp():
    assert model_config(ModelSettings(), (10, 10, 4))["kind"] == "mlp"


@pytest.mark.parametrize("observation_shape", [(10, 10, 4), VECTOR_SHAPE])
def test_use_resnet_without_frames_is_refused_as_torso_resnet_is(observation_shape):
    # It quietly trained an MLP.
    with pytest.raises(UserError, match=r"--torso resnet reads \[C, H, W\] frames .* \(and "):
        model_config(ModelSettings(use_resnet=True), observation_shape)


def test_use_resnet_against_another_torso_names_the_preset_and_the_fix():
    with pytest.raises(UserError, match=r"--torso \(given, or the env's preset\) for grid: leave"):
        model_config(ModelSettings(use_resnet=True, torso="grid"), (10, 10, 4))


def test_grid_torso_is_the_minatar_papers_conv_then_one_layer():
    assert model_config(ModelSettings(torso="grid"), (10, 10, 4)) == dict(
        kind="grid", hidden_size=128, num_layers=1, use_lstm=False
    )
    model = make_model((10, 10, 4), 3, torso="grid")
    conv = 4 * 16 * 3 * 3 + 16
    fc = 16 * 8 * 8 * 128 + 128
    heads = (128 + 3 + 1) * 3 + 3 + (128 + 3 + 1) + 1
    assert count_parameters(model) == conv + fc + heads


def test_grid_torso_reads_channels_last():
    # MinAtar's SpaceInvaders: 10x10 cells, 6 object channels, last.
    model = make_model((10, 10, 6), 4, torso="grid")
    assert model.torso.conv[0].in_channels == 6
    frame = torch.rand(5, 10, 10, 6) > 0.5
    assert model.torso(frame.float()).shape == (5, 128)


@pytest.mark.parametrize(
    "observation_shape, torso",
    [(ATARI_SHAPE, "resnet"), (ATARI_SHAPE, "mlp"), ((10, 10, 4), "grid"), (VECTOR_SHAPE, "mlp")],
)
def test_torso_flag_picks_the_torso(observation_shape, torso):
    assert model_config(ModelSettings(torso=torso), observation_shape)["kind"] == torso
    model = make_model(observation_shape, 3, torso=torso)
    outputs, _ = model(inputs(2, 3, observation_shape, 3), ())
    assert outputs["policy_logits"].shape == (2, 3, 3)


@pytest.mark.parametrize(
    "observation_shape, torso, fix",
    [
        (VECTOR_SHAPE, "grid", "mlp"),
        (VECTOR_SHAPE, "atari", "mlp"),
        ((10, 10, 4), "atari", "grid"),  # a MinAtar grid: its own torso, not the MLP
        ((4, 84, 84), "grid", "atari or resnet"),  # Atari frames: read as a 4x84 grid before
    ],
)
def test_torso_that_cannot_read_the_observations_is_refused_with_the_fix(
    observation_shape, torso, fix
):
    with pytest.raises(UserError, match=f"--torso {torso} reads .* use --torso {fix}$"):
        model_config(ModelSettings(torso=torso), observation_shape)


def test_model_config_takes_hidden_size_and_num_layers_from_flags():
    config = model_config(ModelSettings(hidden_size=32, num_layers=3), VECTOR_SHAPE)
    assert (config["hidden_size"], config["num_layers"]) == (32, 3)


@pytest.mark.parametrize("torso", ["mlp", "grid"])
def test_model_runs_on_minatar_frames(torso):
    model = make_model((10, 10, 4), 3, torso=torso)
    batch = inputs(2, 5, (10, 10, 4), 3)
    batch["frame"] = torch.rand(2, 5, 10, 10, 4) > 0.5  # MinAtar frames are boolean
    outputs, _ = model(batch, ())
    assert outputs["policy_logits"].shape == (2, 5, 3)


def test_orthogonal_init_keeps_frame_features_at_scale():
    # PyTorch's default init shrinks AtariNet's features about 36-fold; orthogonal weights
    # with gain sqrt(2) keep them near the input's scale, so the heads see the frame.
    torch.manual_seed(0)
    config = model_config(ModelSettings(), ATARI_SHAPE)
    frames = torch.randint(0, 256, (8, *ATARI_SHAPE), dtype=torch.uint8).float() / 255
    default = create_model(config, ATARI_SHAPE, 6).torso(frames)
    orthogonal = create_model(config, ATARI_SHAPE, 6, weight_init="orthogonal").torso(frames)
    assert orthogonal.std() > 10 * default.std()


def test_orthogonal_init_starts_near_uniform_with_zero_biases():
    torch.manual_seed(0)
    model = create_model(model_config(ModelSettings(), ATARI_SHAPE), ATARI_SHAPE, 6, "orthogonal")
    weight = model.torso.fc[0].weight.detach()  # [512, 3136]: orthonormal rows times sqrt(2)
    assert torch.allclose(weight @ weight.T, 2 * torch.eye(512), atol=1e-4)
    for layer in (model.torso.convs[0], model.torso.fc[0], model.policy, model.baseline):
        assert torch.count_nonzero(layer.bias) == 0
    outputs, _ = model(inputs(2, 4, ATARI_SHAPE, 6))
    probabilities = F.softmax(outputs["policy_logits"], dim=-1)
    assert torch.allclose(probabilities, torch.full_like(probabilities, 1 / 6), atol=0.01)


@pytest.mark.parametrize("weight_init, orthogonal", [("orthogonal", True), ("pytorch", False)])
def test_the_learners_model_starts_from_the_weight_init_flag(tmp_path, weight_init, orthogonal):
    from torchbeast.core.spec import EnvSpec
    from torchbeast.runtime.training import Trainer

    spec = EnvSpec("PongNoFrameskip-v4", ATARI_SHAPE, np.dtype(np.uint8), 6)
    argv = ["--xpid", "test", "--savedir", str(tmp_path), "--weight_init", weight_init]
    trainer = Trainer(build_settings(parse_flags(argv), "mono"), spec)
    weight = trainer.learner.model.torso.fc[0].weight.detach()  # [512, 3136]
    is_orthogonal = torch.allclose(weight @ weight.T, 2 * torch.eye(512), atol=1e-4)
    assert is_orthogonal == orthogonal


def test_orthogonal_is_the_default_weight_init():
    assert parse_flags([]).weight_init == "orthogonal"


@pytest.mark.parametrize(
    "shape, torso",
    [((4, 84, 84), None), ((4, 84, 84), "resnet"), ((1, 36, 36), None), ((10, 10, 4), "grid")]
    + [((3, 3, 1), "grid"), ((4,), None), ((2, 3, 4), "mlp")],
)
@pytest.mark.parametrize("use_lstm", [False, True])
def test_the_parameter_bound_is_above_every_models_count(shape, torso, use_lstm):
    # Training checks its memory by it before building the model (a mistyped
    # --hidden_size was an allocation's traceback), so it must never be below.
    for hidden, layers, actions in [(None, None, 6), (16, 1, 2), (300, 3, 18)]:
        settings = ModelSettings(
            torso=torso, use_lstm=use_lstm, hidden_size=hidden, num_layers=layers
        )
        config = model_config(settings, shape)
        real = count_parameters(create_model(config, shape, actions))
        assert real <= parameter_bound(config, shape, actions) < 20 * real + 2_000_000
