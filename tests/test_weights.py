"""core.weights: the one way a model's weights are copied, flattened and loaded."""

import numpy as np
import pytest
import torch

from torchbeast.core import weights
from torchbeast.core.models import create_model
from torchbeast.core.spec import EnvSpec

CONFIG = {"kind": "atari", "hidden_size": 64, "num_layers": 1, "use_lstm": True}
SHAPE = (4, 84, 84)


def model(seed: int):
    torch.manual_seed(seed)
    return create_model(CONFIG, SHAPE, 6, weight_init="orthogonal")


def same_weights(a, b) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))


def test_copy_weights_copies_parameters_and_policy_version_and_keeps_the_layout():
    source, target = model(1), model(2)
    source.policy_version.fill_(17)
    assert not same_weights(source, target)
    weights.copy_weights(target, source)
    assert same_weights(source, target) and int(target.policy_version) == 17
    convs = [p for p in target.parameters() if p.dim() == 4]
    assert convs and all(p.is_contiguous(memory_format=torch.channels_last) for p in convs)


def test_flatten_and_load_flat_round_trip_through_one_tensor_and_shared_memory():
    source, target = model(1), model(2)
    flat = weights.flatten(source)
    assert flat.shape == (weights.num_weights(source),)
    weights.load_flat(target, flat)
    assert same_weights(source, target)
    shared = torch.zeros(weights.num_weights(source)).share_memory_()
    assert weights.flatten(model(3), out=shared) is shared
    weights.load_flat(target, shared)
    assert same_weights(model(3), target) and not same_weights(source, target)


def test_a_model_is_sound_unless_its_weights_or_its_outputs_on_a_probe_step_are_not_finite():
    spec = EnvSpec("Pong", SHAPE, np.dtype(np.uint8), 6)
    sound = model(1)
    assert weights.model_is_sound(sound, spec)
    huge = model(1)  # as after a step of learning rate 1e30: finite, but not its outputs
    with torch.no_grad():
        for parameter in huge.parameters():
            parameter.mul_(1e30)
    assert all(torch.isfinite(p).all() for p in huge.parameters())
    assert not weights.model_is_sound(huge, spec)
    broken = model(1)
    with torch.no_grad():
        next(broken.parameters())[0].fill_(float("nan"))
    assert not weights.model_is_sound(broken, spec)


@pytest.mark.parametrize(
    "kind, shape, dtype",
    [("mlp", (4,), np.float32), ("grid", (4, 10, 10), np.bool_), ("mlp", (3,), np.int64)],
)
def test_a_freshly_made_model_of_any_torso_and_observation_dtype_is_sound(kind, shape, dtype):
    config = {"kind": kind, "hidden_size": 32, "num_layers": 1, "use_lstm": False}
    for seed in range(5):
        torch.manual_seed(seed)
        fresh = create_model(config, shape, 3)
        assert weights.model_is_sound(fresh, EnvSpec("e", shape, np.dtype(dtype), 3))
