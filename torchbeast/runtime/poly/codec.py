"""Arrays to and from protobuf: raw bytes with an explicit dtype and shape, never pickle.

Everything that arrives from a peer is checked here: the dtype against a whitelist, the
shape and byte count against the spec from the peer's Hello, and the message size
against a limit. A message that fails a check raises ``ProtocolError``; the stream that
carried it is closed with INVALID_ARGUMENT and training goes on with the others.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

import numpy as np

from torchbeast.core.errors import shown
from torchbeast.core.spec import STORED_DTYPES, EnvSpec, extra_key
from torchbeast.runtime.poly import polybeast_pb2 as pb

# 2: Steps carry the true return and move; 3: any episode extras; 4: the last observations
# of episodes a time limit ended (a Step of 3 that carries them exceeds a 3's size limit).
PROTOCOL_VERSION = 4
DTYPES = frozenset(STORED_DTYPES)
MAX_OBSERVATION_BYTES = 32 << 20  # a Hello announcing more per step is refused
MAX_ENVS_PER_STREAM = 1024
# The model's size follows the spec: a Hello must not make the learner build a huge one.
MAX_NUM_ACTIONS = 4096
MAX_OBSERVATION_ELEMENTS = 1 << 20
MAX_EPISODE_EXTRAS = 16
MAX_ENV_OPTIONS = 64  # env family flags in a Hello
MAX_OBSERVATION_DIMS = 8  # numpy takes 64; no environment here has more than 4
STEP_OVERHEAD_BYTES = 1024  # room for a Step's framing
SCALAR_BYTES_PER_ENV = 48  # reward, done, episode_end, the episode return and step
EXTRA_OVERHEAD_BYTES = 32  # an episode extra's map entry, besides its name and values


# How an env server ends a stream whose environment raised (gRPC's ABORTED): this, the
# error's line, then its traceback (the learner that started the server logs it).
ENV_FAILED = "the environment failed: "


class ProtocolError(ValueError):
    """A peer sent a message that does not follow the protocol; the message says how."""


def _little_endian(name: str) -> np.dtype:
    if name not in DTYPES:
        allowed = ", ".join(sorted(DTYPES))
        raise ProtocolError(f"dtype {shown(name)} is not allowed (allowed: {allowed})")
    return np.dtype(name).newbyteorder("<")


def encode_array(array: np.ndarray) -> pb.NDArray:
    array = np.asarray(array, dtype=_little_endian(array.dtype.name))  # keeps 0-d arrays
    return pb.NDArray(dtype=array.dtype.name, shape=array.shape, data=array.tobytes())


def decode_array(
    message: pb.NDArray, shape: tuple[int, ...] | None = None, dtype: np.dtype | None = None
) -> np.ndarray:
    """A read-only view of the message's bytes, checked against ``shape`` and ``dtype``."""
    received_dtype = _little_endian(message.dtype)
    if len(message.shape) > MAX_OBSERVATION_DIMS + 1:  # [num_envs, *observation]
        raise ProtocolError(f"an array of {len(message.shape)} dimensions is not allowed")
    received_shape = tuple(message.shape)
    if dtype is not None and received_dtype.name != np.dtype(dtype).name:
        raise ProtocolError(f"dtype {received_dtype.name} does not match the expected {dtype}")
    if shape is not None and received_shape != tuple(shape):
        raise ProtocolError(
            f"shape {list(received_shape)} does not match the expected {list(shape)}"
        )
    if any(size < 0 for size in received_shape):
        raise ProtocolError(f"shape {list(received_shape)} has a negative size")
    expected_bytes = math.prod(received_shape) * received_dtype.itemsize
    if len(message.data) != expected_bytes:
        raise ProtocolError(
            f"array of shape {list(received_shape)} and dtype {received_dtype.name} needs "
            f"{expected_bytes} bytes, got {len(message.data)}"
        )
    return np.frombuffer(message.data, dtype=received_dtype).reshape(received_shape)


def encode_nest(nest) -> pb.ArrayNest:
    """An array, a list/tuple of nests, or a dict of nests."""
    if isinstance(nest, dict):
        return pb.ArrayNest(map={key: encode_nest(value) for key, value in nest.items()})
    if isinstance(nest, list | tuple):
        return pb.ArrayNest(vector=[encode_nest(value) for value in nest])
    return pb.ArrayNest(array=encode_array(np.asarray(nest)))


def decode_nest(message: pb.ArrayNest):
    if message.HasField("array"):
        return decode_array(message.array)
    if message.map:
        return {key: decode_nest(value) for key, value in message.map.items()}
    return [decode_nest(value) for value in message.vector]


# --------------------------------------------------------------------------- messages


def hello(
    client_id: str, spec: EnvSpec, num_envs: int = 1, env_options: Mapping[str, object] = {}
) -> pb.EnvMessage:
    """``env_options``: the env family flags the env was made with (those not given, None,
    are left out)."""
    observation_spec = pb.NDArray(
        dtype=np.dtype(spec.observation_dtype).name, shape=spec.observation_shape
    )
    return pb.EnvMessage(
        hello=pb.Hello(
            client_id=client_id,
            env_id=spec.env_id,
            observation_spec=observation_spec,
            num_actions=spec.num_actions,
            protocol_version=PROTOCOL_VERSION,
            num_envs=num_envs,
            episode_extras=spec.episode_extras,
            env_options={
                name: json.dumps(value) for name, value in env_options.items() if value is not None
            },
        )
    )


def read_env_options(hello: pb.Hello) -> dict[str, object]:
    """A Hello's env options as values: at most ``MAX_ENV_OPTIONS`` flag names, each value
    a JSON number, string (short) or boolean; ProtocolError for anything else."""
    if len(hello.env_options) > MAX_ENV_OPTIONS:
        raise ProtocolError(f"a Hello may carry at most {MAX_ENV_OPTIONS} env options")
    options = {}
    for name, text in sorted(hello.env_options.items()):
        if not (name.isidentifier() and len(name) <= 64 and len(text) <= 256):
            raise ProtocolError(f"env option {shown(name)} is no flag name with a short value")
        try:
            value = json.loads(text)
        except ValueError:
            value = None
        finite = not isinstance(value, float) or math.isfinite(value)
        if not isinstance(value, (bool, int, float, str)) or not finite:
            raise ProtocolError(f"env option {name}'s value {shown(text)} is not a flag value")
        options[name] = value
    return options


class Undecodable:
    """Stands in for a message that protobuf could not parse, so that the stream that sent
    it is closed and logged like any other bad message (gRPC would close it silently)."""

    def __init__(self, error: Exception):
        self.error = error


def parse_env_message(data: bytes) -> pb.EnvMessage | Undecodable:
    """gRPC's deserializer for EnvMessage: never raises."""
    try:
        return pb.EnvMessage.FromString(data)
    except Exception as error:  # DecodeError, RecursionError (deep nesting), ...
        return Undecodable(error)


def check_decoded(message: pb.EnvMessage | Undecodable) -> pb.EnvMessage:
    if isinstance(message, Undecodable):
        reason = shown(message.error)
        raise ProtocolError(f"a message could not be parsed as an EnvMessage ({reason})")
    return message


def read_hello(message: pb.EnvMessage) -> tuple[str, EnvSpec, int, dict[str, object]]:
    """The client id, env spec, number of envs and env options (``read_env_options``) of
    a stream's first message."""
    message = check_decoded(message)
    if message.WhichOneof("kind") != "hello":
        raise ProtocolError("the first message of a stream must be a Hello")
    hello = message.hello
    if hello.protocol_version != PROTOCOL_VERSION:
        raise ProtocolError(
            f"protocol version {hello.protocol_version} is not {PROTOCOL_VERSION}: "
            "run the same torchbeast version on both sides"
        )
    dtype = _little_endian(hello.observation_spec.dtype)
    if len(hello.observation_spec.shape) > MAX_OBSERVATION_DIMS:
        raise ProtocolError(
            f"an observation of {len(hello.observation_spec.shape)} dimensions is not "
            f"allowed (at most {MAX_OBSERVATION_DIMS})"
        )
    shape = tuple(int(size) for size in hello.observation_spec.shape)
    if any(size <= 0 for size in shape):
        raise ProtocolError(f"observation shape {list(shape)} has a size below 1")
    if not 1 <= hello.num_envs <= MAX_ENVS_PER_STREAM:
        raise ProtocolError(f"num_envs {hello.num_envs} is not in [1, {MAX_ENVS_PER_STREAM}]")
    if math.prod(shape) > MAX_OBSERVATION_ELEMENTS:
        raise ProtocolError(
            f"observation shape {list(shape)} has more than {MAX_OBSERVATION_ELEMENTS} elements"
        )
    if hello.num_envs * math.prod(shape) * dtype.itemsize > MAX_OBSERVATION_BYTES:
        raise ProtocolError(
            f"{hello.num_envs} observations of shape {list(shape)} are too large for one message"
        )
    if not 1 <= hello.num_actions <= MAX_NUM_ACTIONS:
        raise ProtocolError(f"num_actions {hello.num_actions} is not in [1, {MAX_NUM_ACTIONS}]")
    if not (0 < len(hello.client_id) <= 200 and hello.client_id.isprintable()):
        raise ProtocolError("a Hello's client_id must be 1 to 200 printable characters")
    if not (0 < len(hello.env_id) <= 200 and hello.env_id.isprintable()):
        raise ProtocolError("a Hello's env_id must be 1 to 200 printable characters")
    if len(hello.episode_extras) > MAX_EPISODE_EXTRAS:
        raise ProtocolError(f"a Hello may name at most {MAX_EPISODE_EXTRAS} episode extras")
    try:
        spec = EnvSpec(
            hello.env_id,
            shape,
            np.dtype(dtype.name),
            int(hello.num_actions),
            tuple(hello.episode_extras),
        )
    except ValueError as error:  # an episode extra's name
        raise ProtocolError(str(error)) from None
    return hello.client_id, spec, int(hello.num_envs), read_env_options(hello)


def max_step_bytes(spec: EnvSpec, num_envs: int) -> int:
    """The largest serialized Step a stream of ``num_envs`` envs with this spec can need."""
    observation = math.prod(spec.observation_shape) * spec.observation_dtype.itemsize
    extras = sum(len(name) + EXTRA_OVERHEAD_BYTES for name in spec.episode_extras)
    # Each env's new observation, and its last one where a time limit ended its episode.
    per_env = 2 * observation + SCALAR_BYTES_PER_ENV + 4 * len(spec.episode_extras)
    return num_envs * per_env + extras + STEP_OVERHEAD_BYTES


def step_message(
    step: dict[str, np.ndarray], episode_extras: tuple[str, ...] = ()
) -> pb.EnvMessage:
    """A batched env step (``create_env``'s dict of [N, ...] arrays) as one Step, with the
    env's ``episode_extras`` (its spec's) from ``step["episode_<name>"]``."""
    return pb.EnvMessage(
        step=pb.Step(
            observation=pb.ArrayNest(array=encode_array(step["frame"])),
            reward=step["reward"].tolist(),
            done=step["done"].tolist(),
            episode_end=step["episode_end"].tolist(),
            episode_return=step["episode_return"].tolist(),
            episode_step=step["episode_step"].tolist(),
            episode_extras={
                name: pb.Floats(values=step[extra_key(name)].tolist()) for name in episode_extras
            },
            **truncation_fields(step),
        )
    )


def truncation_fields(step: dict[str, np.ndarray]) -> dict:
    """A Step's ``truncated`` and ``final_observation``, only where a time limit ended an
    episode in this step: most Steps carry neither."""
    if "truncated" not in step or not step["truncated"].any():
        return {}
    return dict(
        truncated=step["truncated"].tolist(),
        final_observation=encode_array(step["final_frame"]),
    )


STEP_FIELDS = ("reward", "done", "episode_end", "episode_return", "episode_step")
FLOAT_FIELDS = ("reward", "episode_return")


def read_step(
    message: pb.EnvMessage, spec: EnvSpec, num_envs: int, size_limit: int
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The Step's fields ([num_envs] each) and observation, checked against ``spec``.

    The observation is a read-only view of the message's bytes.
    """
    message = check_decoded(message)
    size = message.ByteSize()
    if size > size_limit:
        raise ProtocolError(f"a message of {size} bytes exceeds the limit of {size_limit}")
    if message.WhichOneof("kind") != "step":
        raise ProtocolError("expected a Step after the Hello")
    step = message.step
    if not step.observation.HasField("array"):
        raise ProtocolError("a Step's observation must be one array")
    observation = decode_array(
        step.observation.array, (num_envs, *spec.observation_shape), spec.observation_dtype
    )
    fields = {}
    for name in STEP_FIELDS:
        values = getattr(step, name)
        if len(values) != num_envs:
            raise ProtocolError(f"a Step's {name} has {len(values)} entries, not {num_envs}")
        fields[name] = np.asarray(values)
    if not all(np.isfinite(fields[name]).all() for name in FLOAT_FIELDS):
        raise ProtocolError("a Step's reward and episode return must be finite")
    if step.episode_extras or spec.episode_extras:
        fields.update(read_episode_extras(step, spec, num_envs))
    if observation.dtype.kind == "f" and not np.isfinite(observation).all():
        raise ProtocolError("a Step's observation must be finite")
    fields.update(read_truncation(step, spec, num_envs))
    return fields, observation


def read_truncation(step: pb.Step, spec: EnvSpec, num_envs: int) -> dict[str, np.ndarray]:
    """``truncated`` [num_envs] (none sent: all False) and ``final_frame`` [K, ...], the
    last observations of the K episodes it marks, checked against ``spec``."""
    if len(step.truncated) not in (0, num_envs):
        raise ProtocolError(
            f"a Step's truncated has {len(step.truncated)} entries, not {num_envs} (or none)"
        )
    truncated = np.zeros(num_envs, dtype=bool)
    if step.truncated:
        truncated[:] = step.truncated
    shape = (int(truncated.sum()), *spec.observation_shape)
    if not step.HasField("final_observation"):
        if truncated.any():
            raise ProtocolError("a Step that marks truncated episodes needs final_observation")
        return {"truncated": truncated, "final_frame": np.zeros(shape, spec.observation_dtype)}
    try:
        final = decode_array(step.final_observation, shape, spec.observation_dtype)
    except ProtocolError as error:
        raise ProtocolError(f"a Step's final_observation: {error}") from None
    if final.dtype.kind == "f" and not np.isfinite(final).all():
        raise ProtocolError("a Step's final_observation must be finite")
    if not np.asarray(step.done)[truncated].all():
        raise ProtocolError("a Step's truncated episodes must be done")
    return {"truncated": truncated, "final_frame": final}


def names_text(names: list[str]) -> str:
    """A peer's names as a message shows them: bounded and escaped (``shown``), or none."""
    return shown(", ".join(names)) if names else "none"


def read_episode_extras(step: pb.Step, spec: EnvSpec, num_envs: int) -> dict[str, np.ndarray]:
    """``episode_<name>`` -> [num_envs] float32 of each episode extra the Hello named."""
    if sorted(step.episode_extras) != sorted(spec.episode_extras):
        raise ProtocolError(
            f"a Step's episode extras {names_text(sorted(step.episode_extras))} are not the "
            f"Hello's {names_text(sorted(spec.episode_extras))}"
        )
    extras = {}
    for name in spec.episode_extras:
        values = np.asarray(step.episode_extras[name].values, dtype=np.float32)
        if len(values) != num_envs:
            raise ProtocolError(
                f"a Step's episode extra {name} has {len(values)} entries, not {num_envs}"
            )
        if not np.isfinite(values).all():
            raise ProtocolError(f"a Step's episode extra {name} must be finite")
        extras[extra_key(name)] = values
    return extras
