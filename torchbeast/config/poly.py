"""PolyBeast's settings, kept free of torch and gRPC: env machines and env processes import
them, and an env process receives a :class:`PolyEnvSettings` as it is (it pickles)."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from torchbeast.config.env import env_settings, from_flags
from torchbeast.envs.settings import EnvSettings

TOKEN_ENV_VAR = "TORCHBEAST_AUTH_TOKEN"  # where --auth_token is read from when not given


@dataclass(frozen=True)
class NetworkSettings:
    """Where the env servers are, and TLS and the shared token (the flags of the same names)."""

    pipes_basename: str = "unix:/tmp/polybeast"
    num_servers: int = 4
    env_servers: str | None = None
    auth_token: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None

    def server_addresses(self) -> list[str]:
        """--env_servers, or PIPES_BASENAME.i for each of --num_servers."""
        if self.env_servers:
            return [address.strip() for address in self.env_servers.split(",") if address.strip()]
        return [f"{self.pipes_basename}.{i}" for i in range(self.num_servers)]


@dataclass(frozen=True)
class PolyEnvSettings:
    """What ``polybeast_env``'s processes do: its flags of the same names."""

    env: EnvSettings
    network: NetworkSettings
    connect: str | None = None
    clients_per_process: int = 1
    envs_per_stream: int = 1
    client_steps: int = 0
    max_streams: int = 256


@dataclass(frozen=True)
class PolySettings:
    """The learner's PolyBeast flags of the same names, defaults resolved."""

    network: NetworkSettings
    serve: str | None
    max_clients: int
    stream_timeout_s: float
    stream_memory_mb: int
    max_learner_queue_size: int
    num_inference_threads: int
    max_inference_batch_size: int
    inference_timeout_ms: float


def poly_env_settings(flags: argparse.Namespace) -> PolyEnvSettings:
    """``polybeast_env``'s parsed command line, as its processes take it."""
    return from_flags(
        PolyEnvSettings,
        flags,
        env=env_settings(flags),
        network=from_flags(NetworkSettings, flags),
    )


def poly_settings(flags: argparse.Namespace) -> PolySettings:
    return from_flags(PolySettings, flags, network=from_flags(NetworkSettings, flags))


def resolve_learner_flags(flags: argparse.Namespace, parser: argparse.ArgumentParser) -> dict:
    """The PolyBeast learner's derived defaults: a queue of --batch_size rollouts, and a
    quarter of this machine's memory for the streams' rollout buffers."""
    resolved = {}
    if flags.max_learner_queue_size is None:
        resolved["max_learner_queue_size"] = flags.batch_size
    if flags.stream_memory_mb is None:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        resolved["stream_memory_mb"] = memory // 4 >> 20
    return resolved
