"""PolyBeast's wire format: raw arrays with dtype and shape, checked against the Hello."""

import dataclasses
import filecmp
import os
import subprocess
import sys

import numpy as np
import pytest

from torchbeast.core.spec import EnvSpec
from torchbeast.runtime.poly import codec, network
from torchbeast.runtime.poly import polybeast_pb2 as pb

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PONG = EnvSpec("PongNoFrameskip-v4", (4, 84, 84), np.dtype("uint8"), 6)


def env_step(num_envs: int, spec: EnvSpec = PONG, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return dict(
        frame=rng.integers(0, 255, (num_envs, *spec.observation_shape)).astype(
            spec.observation_dtype
        ),
        reward=rng.normal(size=num_envs).astype(np.float32),
        done=rng.random(num_envs) < 0.5,
        episode_end=rng.random(num_envs) < 0.5,
        episode_return=rng.normal(size=num_envs).astype(np.float32),
        episode_step=rng.integers(0, 1000, num_envs).astype(np.int32),
        **{key: rng.normal(size=num_envs).astype(np.float32) for key in spec.extra_keys},
    )


def test_generated_modules_match_the_proto(tmp_path):
    proto = "torchbeast/runtime/poly/polybeast.proto"
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-I", ".", f"--python_out={tmp_path}",
         f"--grpc_python_out={tmp_path}", proto],
        cwd=ROOT,
        check=True,
    )  # fmt: skip
    for name in ("polybeast_pb2.py", "polybeast_pb2_grpc.py"):
        generated = tmp_path / "torchbeast/runtime/poly" / name
        checked_in = os.path.join(ROOT, "torchbeast/runtime/poly", name)
        assert filecmp.cmp(generated, checked_in, shallow=False), f"{name} is stale: make proto"


@pytest.mark.parametrize("dtype", sorted(codec.DTYPES))
def test_every_allowed_dtype_round_trips_bit_for_bit(dtype):
    array = (np.arange(24).reshape(2, 3, 4) % 7).astype(dtype)
    message = pb.NDArray.FromString(codec.encode_array(array).SerializeToString())
    decoded = codec.decode_array(message, (2, 3, 4), np.dtype(dtype))
    assert decoded.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(decoded, array)


@pytest.mark.parametrize("dtype", ["float64", "object", "complex64", "<U3", "V8"])
def test_a_dtype_outside_the_whitelist_is_refused(dtype):
    message = pb.NDArray(dtype=np.dtype(dtype).name, shape=[1], data=b"\0" * 8)
    with pytest.raises(codec.ProtocolError, match="not allowed"):
        codec.decode_array(message)


def test_a_shape_other_than_expected_is_refused():
    message = codec.encode_array(np.zeros((4, 84, 83), np.uint8))
    with pytest.raises(codec.ProtocolError, match="does not match the expected"):
        codec.decode_array(message, (4, 84, 84), np.dtype("uint8"))


def test_bytes_that_disagree_with_the_shape_are_refused():
    message = pb.NDArray(dtype="float32", shape=[3], data=b"\0" * 8)
    with pytest.raises(codec.ProtocolError, match="needs 12 bytes, got 8"):
        codec.decode_array(message)


def test_nests_of_lists_and_maps_round_trip():
    nest = {"a": np.ones(2, np.float32), "b": [np.zeros(3, np.uint8), {"c": np.int64(5)}]}
    decoded = codec.decode_nest(
        pb.ArrayNest.FromString(codec.encode_nest(nest).SerializeToString())
    )
    np.testing.assert_array_equal(decoded["a"], nest["a"])
    np.testing.assert_array_equal(decoded["b"][0], nest["b"][0])
    assert int(decoded["b"][1]["c"]) == 5


def test_a_step_of_several_envs_round_trips():
    step = env_step(num_envs=3)
    wire = pb.EnvMessage.FromString(codec.step_message(step).SerializeToString())
    fields, observation = codec.read_step(wire, PONG, 3, codec.max_step_bytes(PONG, 3))
    np.testing.assert_array_equal(observation, step["frame"])
    for name in codec.STEP_FIELDS:
        np.testing.assert_array_equal(fields[name], step[name])


def test_hello_round_trips_the_spec_number_of_envs_and_env_options():
    options = {"fuel_multiplier": 5.0, "move_penalty": None, "no_fire_on_life_loss": False}
    message = codec.hello("client-7", PONG, 8, options)
    wire = pb.EnvMessage.FromString(message.SerializeToString())
    given = {"fuel_multiplier": 5.0, "no_fire_on_life_loss": False}  # not given: left out
    assert codec.read_hello(wire) == ("client-7", PONG, 8, given)
    assert codec.read_hello(codec.hello("old", PONG, 1))[3] == {}  # an older env side's


@pytest.mark.parametrize(
    "options, said",
    [
        ({"fuel_multiplier": "NaN"}, "is not a flag value"),
        ({"fuel_multiplier": "[1, 2]"}, "is not a flag value"),
        ({"fuel_multiplier": "not json"}, "is not a flag value"),
        ({"bad name!": "1"}, "is no flag name with a short value"),
        ({"x": '"' + "y" * 300 + '"'}, "is no flag name with a short value"),
        ({f"o{i}": "1" for i in range(codec.MAX_ENV_OPTIONS + 1)}, "at most 64 env options"),
    ],
)
def test_a_hellos_env_options_are_checked_as_a_peers_data(options, said):
    message = codec.hello("client", PONG, 1)
    message.hello.env_options.update(options)
    with pytest.raises(codec.ProtocolError, match=said):
        codec.read_hello(pb.EnvMessage.FromString(message.SerializeToString()))


@pytest.mark.parametrize(
    "field, value, error",
    [
        ("num_actions", 0, "num_actions 0"),
        ("num_envs", 0, "num_envs 0"),
        ("num_envs", 5000, "num_envs 5000"),
        ("protocol_version", 99, "protocol version 99"),
    ],
)
def test_an_impossible_hello_is_refused(field, value, error):
    message = codec.hello("client", PONG, 1)
    setattr(message.hello, field, value)
    with pytest.raises(codec.ProtocolError, match=error):
        codec.read_hello(message)


def test_a_hello_announcing_huge_observations_is_refused():
    huge = EnvSpec("Huge-v0", (1024, 1024, 64), np.dtype("uint8"), 2)
    with pytest.raises(codec.ProtocolError, match="more than 1048576 elements"):
        codec.read_hello(codec.hello("client", huge, 1))


def test_a_hello_whose_envs_together_exceed_the_message_size_is_refused():
    large = EnvSpec("Large-v0", (512, 512, 4), np.dtype("uint8"), 2)  # 1 MiB each
    codec.read_hello(codec.hello("client", large, 32))
    with pytest.raises(codec.ProtocolError, match="too large for one message"):
        codec.read_hello(codec.hello("client", large, 33))


@pytest.mark.parametrize("num_actions", [4097, 1_000_000, 2147483647])
def test_a_hello_with_too_many_actions_is_refused(num_actions):
    message = codec.hello("client", PONG, 1)
    message.hello.num_actions = num_actions
    with pytest.raises(codec.ProtocolError, match=f"num_actions {num_actions} is not in"):
        codec.read_hello(message)


def test_bytes_that_do_not_parse_become_a_protocol_error_not_a_silent_close():
    message = codec.parse_env_message(b"\xff\xff\xff\xff garbage")
    assert isinstance(message, codec.Undecodable)
    with pytest.raises(codec.ProtocolError, match="could not be parsed"):
        codec.read_hello(message)
    with pytest.raises(codec.ProtocolError, match="could not be parsed"):
        codec.read_step(message, PONG, 1, codec.max_step_bytes(PONG, 1))


def test_a_good_message_parses_as_itself():
    message = codec.hello("client", PONG, 1)
    assert codec.parse_env_message(message.SerializeToString()) == message


def test_a_step_over_the_size_limit_is_refused_before_it_is_read():
    message = codec.step_message(env_step(num_envs=1))
    with pytest.raises(codec.ProtocolError, match="exceeds the limit of 100"):
        codec.read_step(message, PONG, 1, size_limit=100)


def test_a_step_whose_fields_miss_an_env_is_refused():
    message = codec.step_message(env_step(num_envs=2))
    del message.step.reward[1]
    with pytest.raises(codec.ProtocolError, match="reward has 1 entries, not 2"):
        codec.read_step(message, PONG, 2, codec.max_step_bytes(PONG, 2))


@pytest.mark.parametrize("field", codec.FLOAT_FIELDS)
def test_a_step_with_a_non_finite_reward_or_return_is_refused(field):
    message = codec.step_message(env_step(num_envs=1))
    getattr(message.step, field)[0] = float("nan")
    with pytest.raises(codec.ProtocolError, match="finite"):
        codec.read_step(message, PONG, 1, codec.max_step_bytes(PONG, 1))


def test_a_hello_where_a_step_belongs_is_refused():
    with pytest.raises(codec.ProtocolError, match="expected a Step"):
        codec.read_step(codec.hello("c", PONG), PONG, 1, codec.max_step_bytes(PONG, 1))


def test_a_step_with_a_non_finite_float_observation_is_refused():
    spec = EnvSpec("CartPole-v1", (4,), np.dtype("float32"), 2)
    step = env_step(num_envs=1, spec=spec)
    step["frame"][0, 2] = np.inf
    message = codec.step_message(step)
    with pytest.raises(codec.ProtocolError, match="observation must be finite"):
        codec.read_step(message, spec, 1, codec.max_step_bytes(spec, 1))


# Episode extras: named per-episode figures, carried generically.

COINS = EnvSpec("tests.envs_for_tests:Coins-v0", (3,), np.dtype("float32"), 2, ("coins", "gems"))


def test_a_step_with_episode_extras_round_trips_them_by_name():
    step = env_step(num_envs=3, spec=COINS)
    message = codec.step_message(step, COINS.episode_extras)
    assert sorted(message.step.episode_extras) == ["coins", "gems"]
    wire = pb.EnvMessage.FromString(message.SerializeToString())
    fields, _ = codec.read_step(wire, COINS, 3, codec.max_step_bytes(COINS, 3))
    for key in ("episode_coins", "episode_gems"):
        np.testing.assert_array_equal(fields[key], step[key])


def test_hello_round_trips_the_names_of_the_episode_extras():
    wire = pb.EnvMessage.FromString(codec.hello("client", COINS, 2).SerializeToString())
    assert list(wire.hello.episode_extras) == ["coins", "gems"]
    assert codec.read_hello(wire) == ("client", COINS, 2, {})


def test_a_step_without_an_episode_extra_its_hello_named_is_refused():
    message = codec.step_message(env_step(num_envs=1, spec=COINS), ("coins",))
    with pytest.raises(
        codec.ProtocolError, match="extras 'coins' are not the Hello's 'coins, gems'"
    ):
        codec.read_step(message, COINS, 1, codec.max_step_bytes(COINS, 1))


def test_a_step_with_an_episode_extra_its_hello_did_not_name_is_refused():
    message = codec.step_message(env_step(num_envs=1, spec=COINS), COINS.episode_extras)
    plain = dataclasses.replace(COINS, episode_extras=())
    with pytest.raises(codec.ProtocolError, match="extras 'coins, gems' are not the Hello's none"):
        codec.read_step(message, plain, 1, codec.max_step_bytes(plain, 1))


def test_an_episode_extra_that_misses_an_env_or_is_not_finite_is_refused():
    message = codec.step_message(env_step(num_envs=2, spec=COINS), COINS.episode_extras)
    del message.step.episode_extras["gems"].values[1]
    with pytest.raises(codec.ProtocolError, match="extra gems has 1 entries, not 2"):
        codec.read_step(message, COINS, 2, codec.max_step_bytes(COINS, 2))
    message = codec.step_message(env_step(num_envs=1, spec=COINS), COINS.episode_extras)
    message.step.episode_extras["coins"].values[0] = float("inf")
    with pytest.raises(codec.ProtocolError, match="extra coins must be finite"):
        codec.read_step(message, COINS, 1, codec.max_step_bytes(COINS, 1))


@pytest.mark.parametrize(
    "names, error",
    [
        (["return"], "'return' would clash with a figure of torchbeast's own"),
        (["length"], "'length' would clash with a figure of torchbeast's own"),
        (["a,b"], "is not a name"),
        (["coins", "coins"], "name one figure twice"),
        ([f"x{i}" for i in range(17)], "at most 16 episode extras"),
    ],
)
def test_a_hello_with_episode_extras_that_cannot_be_columns_is_refused(names, error):
    message = codec.hello("client", PONG, 1)
    message.hello.episode_extras.extend(names)
    with pytest.raises(codec.ProtocolError, match=error):
        codec.read_hello(message)


def test_the_largest_step_with_the_most_episode_extras_fits_the_size_limit():
    names = tuple(f"{i:02d}".rjust(64, "x") for i in range(codec.MAX_EPISODE_EXTRAS))
    spec = EnvSpec("Extras-v0", (4,), np.dtype("float32"), 2, names)
    step = env_step(num_envs=codec.MAX_ENVS_PER_STREAM, spec=spec)
    message = codec.step_message(step, names)
    assert message.ByteSize() <= codec.max_step_bytes(spec, codec.MAX_ENVS_PER_STREAM)


# Episodes a time limit cut short: their last observations travel with the Step.

CARTPOLE = EnvSpec("CartPole-v1", (4,), np.dtype("float32"), 2)


def truncated_step(truncated: list[bool], spec: EnvSpec = CARTPOLE) -> dict[str, np.ndarray]:
    """A step of len(truncated) envs, ``truncated`` ones done by a time limit."""
    step = env_step(num_envs=len(truncated), spec=spec)
    step["truncated"] = np.array(truncated)
    step["done"] = step["done"] | step["truncated"]
    shape = (sum(truncated), *spec.observation_shape)
    step["final_frame"] = np.arange(np.prod(shape)).reshape(shape).astype(spec.observation_dtype)
    return step


def read(message: pb.EnvMessage, num_envs: int, spec: EnvSpec = CARTPOLE):
    wire = pb.EnvMessage.FromString(message.SerializeToString())
    return codec.read_step(wire, spec, num_envs, codec.max_step_bytes(spec, num_envs))


def test_a_step_round_trips_its_truncated_episodes_and_their_last_observations():
    step = truncated_step([False, True, False, True])
    fields, _ = read(codec.step_message(step), 4)
    np.testing.assert_array_equal(fields["truncated"], [False, True, False, True])
    np.testing.assert_array_equal(fields["final_frame"], step["final_frame"])


def test_a_step_without_truncated_episodes_sends_neither_field_and_reads_none():
    message = codec.step_message(truncated_step([False, False]))
    assert not message.step.truncated and not message.step.HasField("final_observation")
    fields, _ = read(message, 2)  # also an older env side's Step
    np.testing.assert_array_equal(fields["truncated"], [False, False])
    assert fields["final_frame"].shape == (0, 4)


def test_a_step_whose_truncated_misses_an_env_is_refused():
    message = codec.step_message(truncated_step([True, False]))
    del message.step.truncated[1]
    with pytest.raises(codec.ProtocolError, match="truncated has 1 entries, not 2"):
        read(message, 2)


def test_a_step_with_truncated_episodes_but_no_last_observations_is_refused():
    message = codec.step_message(truncated_step([True, False]))
    message.step.ClearField("final_observation")
    with pytest.raises(codec.ProtocolError, match="needs final_observation"):
        read(message, 2)


def test_last_observations_of_more_episodes_than_were_truncated_are_refused():
    message = codec.step_message(truncated_step([True, True]))
    message.step.truncated[1] = False
    with pytest.raises(codec.ProtocolError, match=r"final_observation: shape \[2, 4\] does"):
        read(message, 2)


def test_a_non_finite_last_observation_is_refused():
    step = truncated_step([True])
    step["final_frame"][0, 1] = np.nan
    with pytest.raises(codec.ProtocolError, match="final_observation must be finite"):
        read(codec.step_message(step), 1)


def test_a_truncated_episode_that_is_not_done_is_refused():
    message = codec.step_message(truncated_step([True]))
    message.step.done[0] = False
    with pytest.raises(codec.ProtocolError, match="truncated episodes must be done"):
        read(message, 1)


def test_the_largest_step_with_every_env_truncated_fits_both_size_limits():
    large = EnvSpec("Large-v0", (512, 512, 4), np.dtype("uint8"), 2)  # 1 MiB each
    codec.read_hello(codec.hello("client", large, 32))  # the most envs a Hello may announce
    step = truncated_step([True] * 32, spec=large)
    size = codec.step_message(step).ByteSize()
    assert size <= codec.max_step_bytes(large, 32) <= network.MAX_MESSAGE_BYTES
