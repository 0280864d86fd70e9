"""The torso's precision: which dtype it computes in (``--precision``), what stays fp32, and
that bf16 computes what fp32 does to within bf16's rounding, on real Pong frames."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.settings_for_tests import setup
from torchbeast.config.flags import parse_flags
from torchbeast.config.settings import build_settings
from torchbeast.core import precision, weights
from torchbeast.core.learner import Learner
from torchbeast.core.models import create_model, model_config
from torchbeast.core.rollout import rollout_spec
from torchbeast.core.settings import ModelSettings
from torchbeast.core.spec import EnvSpec
from torchbeast.envs import create_env

ATARI_SHAPE = (4, 84, 84)
PONG = EnvSpec("PongNoFrameskip-v4", ATARI_SHAPE, np.dtype(np.uint8), 6)
T, B = 5, 4


@pytest.mark.parametrize(
    "setting, device, torso, native, expected",
    [
        ("fp32", "cpu", "atari", True, torch.float32),
        ("bf16", "cpu", "mlp", False, torch.bfloat16),  # asked for: even where it is slow
        ("bf16", "cuda", "atari", False, torch.bfloat16),
        ("auto", "cpu", "atari", True, torch.bfloat16),
        ("auto", "cpu", "resnet", True, torch.bfloat16),
        ("auto", "cpu", "atari", False, torch.float32),  # no native bf16: emulated, slower
        ("auto", "cpu", "mlp", True, torch.float32),  # small torsos gain little
        ("auto", "cpu", "grid", True, torch.float32),
        ("auto", "cuda", "atari", True, torch.float32),  # not measured on a GPU yet
    ],
)
def test_auto_is_bf16_for_conv_torsos_on_cpus_that_compute_it_natively(
    monkeypatch, setting, device, torso, native, expected
):
    monkeypatch.setattr(precision, "cpu_computes_bf16", lambda: native)
    assert precision.compute_dtype(setting, device, torso) == expected


@pytest.mark.parametrize("native", [True, False])
def test_by_default_pong_computes_in_bf16_where_the_cpu_does_it_natively(monkeypatch, native):
    monkeypatch.setattr(precision, "cpu_computes_bf16", lambda: native)
    settings = build_settings(parse_flags(["--env", "PongNoFrameskip-v4"]))
    dtype = precision.compute_dtype(settings.model.precision, "cpu", "atari")
    assert dtype == (torch.bfloat16 if native else torch.float32)
    fp32 = build_settings(parse_flags(["--env", "PongNoFrameskip-v4", "--precision", "fp32"]))
    assert precision.compute_dtype(fp32.model.precision, "cpu", "atari") == torch.float32


def test_the_log_line_says_the_dtype_and_why(monkeypatch):
    monkeypatch.setattr(precision, "cpu_computes_bf16", lambda: True)
    dtype = precision.compute_dtype("auto", "cpu", "atari")
    line = precision.describe("auto", dtype, "cpu", "atari")
    assert line == "The torso computes in bf16 on the CPU (auto: this CPU computes bf16 natively)."
    line = precision.describe("fp32", torch.float32, "cpu", "atari")
    assert line == "The torso computes in fp32 on the CPU (--precision fp32)."
    line = precision.describe("auto", torch.float32, "cuda", "atari")
    assert "fp32 on the CUDA" in line and "--precision bf16 asks for it" in line
    monkeypatch.setattr(precision, "cpu_computes_bf16", lambda: False)
    line = precision.describe("bf16", torch.bfloat16, "cpu", "atari")
    assert "(--precision bf16; this CPU has no native bf16, so it is emulated" in line
    line = precision.describe("auto", torch.float32, "cpu", "atari")
    assert line == "The torso computes in fp32 on the CPU (auto: this CPU has no native bf16)."


def test_the_cpu_check_reads_the_cpus_flags():
    with open("/proc/cpuinfo") as cpuinfo:
        flags = next(line for line in cpuinfo if line.startswith("flags")).split()
    native = "avx512_bf16" in flags or "amx_bf16" in flags
    assert precision.cpu_computes_bf16() == native


def pong_frames(steps: int, num_envs: int) -> torch.Tensor:
    """Real Pong observations [steps, num_envs, 4, 84, 84] under random play."""
    env = create_env("PongNoFrameskip-v4", num_envs=num_envs)
    try:
        rng = np.random.default_rng(0)
        frames = [torch.from_numpy(env.reset(seed=0)["frame"]).clone()]
        for _ in range(60 + steps - 1):  # past the serve: the ball and paddles move
            step = env.step(rng.integers(0, 6, size=num_envs))
            frames.append(torch.from_numpy(step["frame"]).clone())
        return torch.stack(frames[-steps:])
    finally:
        env.close()


def pong_batch() -> dict[str, torch.Tensor]:
    """A [T+1, B] batch of real frames with random actions, rewards and behaviour logits."""
    generator = torch.Generator().manual_seed(0)
    batch = {}
    for name, (shape, dtype) in rollout_spec(PONG, T).items():
        shape = (shape[0], B, *shape[1:])
        if name == "frame":
            continue
        if dtype == torch.bool:
            batch[name] = torch.zeros(shape, dtype=dtype)
        elif name in ("action", "last_action"):
            batch[name] = torch.randint(0, 6, shape, generator=generator)
        elif dtype in (torch.int32, torch.int64):
            batch[name] = torch.zeros(shape, dtype=dtype)
        else:
            batch[name] = torch.randn(shape, generator=generator, dtype=dtype)
    batch["frame"] = pong_frames(T + 1, B)
    return batch


def atari_model(dtype: torch.dtype, inference_only: bool = False, seed: int = 0):
    torch.manual_seed(seed)
    config = model_config(ModelSettings(), ATARI_SHAPE)
    return create_model(
        config, ATARI_SHAPE, 6, "orthogonal", compute_dtype=dtype, inference_only=inference_only
    )


@pytest.fixture(scope="module")
def batch():
    return pong_batch()


def model_inputs(batch):
    return {key: batch[key] for key in ("frame", "reward", "done", "last_action")}


def test_a_bf16_torso_computes_in_bf16_and_hands_fp32_to_the_heads(batch):
    model = atari_model(torch.bfloat16)
    seen = {}
    model.torso.convs[0].register_forward_hook(lambda m, i, out: seen.update(conv=out.dtype))
    model.policy.register_forward_hook(lambda m, i, out: seen.update(policy=out.dtype))
    outputs, _ = model(model_inputs(batch))
    assert seen == {"conv": torch.bfloat16, "policy": torch.float32}
    assert outputs["policy_logits"].dtype == outputs["baseline"].dtype == torch.float32
    # The learner's copy keeps fp32 weights everywhere.
    assert {param.dtype for param in model.parameters()} == {torch.float32}


def test_bf16_gives_the_policy_and_value_of_fp32_to_within_its_rounding(batch):
    fp32, bf16 = atari_model(torch.float32), atari_model(torch.bfloat16)
    with torch.no_grad():
        expected, _ = fp32(model_inputs(batch), act=False)
        got, _ = bf16(model_inputs(batch), act=False)
    probabilities = F.softmax(expected["policy_logits"], -1)
    assert (F.softmax(got["policy_logits"], -1) - probabilities).abs().max() < 2e-3
    scale = expected["baseline"].abs().max()
    assert (got["baseline"] - expected["baseline"]).abs().max() < 0.02 * scale


def test_an_acting_copy_keeps_its_torso_in_bf16_and_acts_as_the_learners_model(batch):
    learner_model = atari_model(torch.bfloat16, seed=1)
    actor_model = atari_model(torch.bfloat16, inference_only=True, seed=2)
    assert {p.dtype for p in actor_model.torso.parameters()} == {torch.bfloat16}
    heads = [*actor_model.policy.parameters(), *actor_model.baseline.parameters()]
    assert {p.dtype for p in heads} == {torch.float32}
    # Weights reach it through the flat fp32 tensor actors read (cast as they are loaded).
    flat = weights.flatten(learner_model)
    assert flat.dtype == torch.float32
    weights.load_flat(actor_model, flat)
    with torch.no_grad():
        expected, _ = learner_model(model_inputs(batch), act=False)
        got, _ = actor_model(model_inputs(batch), act=False)
    torch.testing.assert_close(got["policy_logits"], expected["policy_logits"])
    torch.testing.assert_close(got["baseline"], expected["baseline"])
    # And a copy of the model's weights (central and PolyBeast inference) alike.
    other = atari_model(torch.bfloat16, inference_only=True, seed=3)
    weights.copy_weights(other, learner_model)
    with torch.no_grad():
        torch.testing.assert_close(
            other(model_inputs(batch), act=False)[0]["baseline"], expected["baseline"]
        )


def test_a_bf16_update_moves_the_fp32_weights_as_an_fp32_update_does(batch):
    case = setup(unroll_length=T, batch_size=B, epochs=2, ppo_clip=0.2)
    deltas = {}
    for dtype in (torch.float32, torch.bfloat16):
        model = atari_model(dtype)
        before = weights.flatten(model).clone()
        stats = Learner(case.learner, model).learn(batch)
        assert np.isfinite(stats["total_loss"])
        after = weights.flatten(model)
        assert after.dtype == torch.float32
        deltas[dtype] = after - before
    fp32, bf16 = deltas[torch.float32], deltas[torch.bfloat16]
    assert bf16.abs().sum() > 0
    cosine = F.cosine_similarity(fp32, bf16, dim=0)
    assert cosine > 0.99, cosine
    assert 0.9 < bf16.norm() / fp32.norm() < 1.1
