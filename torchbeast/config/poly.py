"""PolyBeast's settings, each declared once as the flag it is (``core.settings.flag``), kept
free of torch and gRPC: env machines and env processes import them, and an env process
receives a :class:`PolyEnvSettings` as it is (it pickles)."""

from __future__ import annotations

import argparse
import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from torchbeast.config.declared import from_flags
from torchbeast.config.env import env_settings
from torchbeast.config.resolvers import Sources
from torchbeast.core.settings import flag
from torchbeast.envs.settings import EnvSettings

TOKEN_ENV_VAR = "TORCHBEAST_AUTH_TOKEN"  # where --auth_token is read from when not given
# Flags whose values no record holds (meta.json, checkpoints: run folders are shared and
# committed); the record says only where the value came from.
SECRET_FLAGS = ("auth_token",)
HIDDEN = "(hidden)"


def without_secrets(argv: Sequence[str]) -> list[str]:
    """``argv`` with the values of ``SECRET_FLAGS`` hidden (``--auth_token X``,
    ``--auth_token=X``, or a prefix of the flag, which argparse takes too)."""
    shown: list[str] = []
    hide_next = False
    for arg in argv:
        name, equals, _ = arg.partition("=")
        secret = name.startswith("--") and len(name) > 2
        secret = secret and any(f"--{flag}".startswith(name) for flag in SECRET_FLAGS)
        if hide_next:
            shown.append(HIDDEN)
        elif secret and equals:
            shown.append(f"{name}={HIDDEN}")
        else:
            shown.append(arg)
        hide_next = secret and not equals and not hide_next
    return shown


@dataclass(frozen=True)
class NetworkSettings:
    """Where the env servers are, and TLS and the shared token: every PolyBeast command's."""

    flags_group: ClassVar[str] = "PolyBeast: addresses, TLS and token"

    pipes_basename: str = flag(
        "unix:/tmp/polybeast",
        "Basename for the env servers' addresses: BASENAME.0, BASENAME.1, ...",
    )
    num_servers: int = flag(4, "Number of environment servers.", metavar="N", check="positive")
    env_servers: str | None = flag(
        None,
        "(new) Env server addresses, comma-separated, e.g. 127.0.0.1:4431,host2:4431 "
        "(default: PIPES_BASENAME.0 .. PIPES_BASENAME.{num_servers-1}).",
        metavar="ADDR,ADDR",
    )
    auth_token: str | None = flag(
        None, f"(new) Shared secret every stream must present (default: ${TOKEN_ENV_VAR})."
    )
    tls_cert: str | None = flag(None, "(new) PEM certificate this side serves TLS with.")
    tls_key: str | None = flag(None, "(new) PEM private key of --tls_cert.")
    tls_ca: str | None = flag(
        None,
        "(new) PEM CA certificate: a client trusts servers signed by it (and dials with "
        "TLS); a server with it also requires client certificates.",
    )

    def server_addresses(self) -> list[str]:
        """--env_servers, or PIPES_BASENAME.i for each of --num_servers."""
        if self.env_servers:
            return [address.strip() for address in self.env_servers.split(",") if address.strip()]
        return [f"{self.pipes_basename}.{i}" for i in range(self.num_servers)]


@dataclass(frozen=True)
class PolyEnvSettings:
    """What ``polybeast_env``'s processes do."""

    flags_group: ClassVar[str] = "Env servers and clients"

    env: EnvSettings
    network: NetworkSettings
    connect: str | None = flag(
        None,
        "(new) Inverted mode: dial the learner at ADDRESS (its --serve) instead of serving.",
        metavar="ADDRESS",
    )
    clients_per_process: int = flag(
        1, "(new) Inverted mode: env clients (streams) per process.", check="positive"
    )
    envs_per_stream: int = flag(
        1,
        "(new) Environments one stream steps together (a vectorised env, batched "
        "messages: less gRPC overhead per step).",
        check="positive",
    )
    client_steps: int = flag(
        0,
        "(new) Inverted mode: a client leaves after this many steps (0: stays).",
        check="nonnegative",
    )
    max_streams: int = flag(
        256, "(new) Classic mode: most streams one env server serves at once.", check="positive"
    )


@dataclass(frozen=True)
class PolySettings:
    """The learner's PolyBeast settings, defaults resolved (``resolve_learner_flags``)."""

    flags_group: ClassVar[str] = "PolyBeast learner: env streams and inference"

    network: NetworkSettings
    serve: str | None = flag(
        None,
        "(new) Inverted mode: serve env clients on ADDRESS (e.g. unix:/tmp/learner or "
        "127.0.0.1:4431) instead of dialling env servers.",
        metavar="ADDRESS",
    )
    max_clients: int = flag(
        256, "(new) Inverted mode: most env clients connected at once.", check="positive"
    )
    stream_timeout_s: float = flag(
        60.0,
        "(new) Close an env stream that sends no Step for this long (a client must "
        "also send its Hello within 10 s).",
        check="positive",
    )
    stream_memory_mb: int | None = flag(
        None,
        "(new) Most memory all env streams' rollout buffers may take; a stream that "
        "would exceed it is refused (default: a quarter of this machine's memory).",
        metavar="MIB",
        check="positive",
    )
    max_learner_queue_size: int | None = flag(
        None,
        "Most rollouts waiting for the learner (default: batch_size).",
        metavar="N",
        check="positive",
    )
    num_inference_threads: int = flag(
        2, "Number of threads running batched inference.", metavar="N", check="positive"
    )
    max_inference_batch_size: int = flag(
        512, "(new) Most env streams in one inference batch.", check="positive"
    )
    inference_timeout_ms: float = flag(
        1.0,
        "(new) Longest wait for more streams to join an inference batch.",
        check="nonnegative",
    )


UNIX_PATH_MAX = 107  # bytes of a Unix socket's path (sockaddr_un's 108, less its NUL)


def address_problem(address: str) -> str | None:
    """What makes ``address`` no gRPC address of ours (host:port with a port in 1-65535,
    or unix:PATH); None for a good one. (gRPC takes port 99999 as 99999 mod 65536, and
    dials a malformed address forever.)"""
    if address.startswith("unix:"):
        path = address[len("unix:") :].removeprefix("//")
        if not path.strip():
            return "unix: names no socket path"
        if len(os.fsencode(path)) > UNIX_PATH_MAX:
            return (
                f"has a socket path of {len(os.fsencode(path))} bytes, more than the "
                f"{UNIX_PATH_MAX} a Unix socket takes: give a shorter path"
            )
        return None
    host, colon, port = address.rpartition(":")
    if not colon or not host:
        return "is not host:port or unix:PATH"
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        return f"has no port in 1-65535 ({port!r})"
    return None


def check_addresses(parser: argparse.ArgumentParser, named: dict[str, list[str]]) -> None:
    """Refuses, in one line, the first address of ``named`` (flag -> its addresses) that
    is no address, or a flag that names none."""
    for inverted in ("--serve", "--connect"):
        if inverted in named and "--env_servers" in named:  # one of them went unused
            parser.error(
                f"{inverted} (inverted mode: env clients dial the learner) and --env_servers "
                "(classic mode: the learner dials env servers) exclude each other: keep one"
            )
    for flag_name, addresses in named.items():
        if not addresses:
            parser.error(
                f"{flag_name} names no address: give host:port or unix:PATH addresses, "
                "comma-separated, or leave it out"
            )
        for address in addresses:
            problem = address_problem(address)
            if problem and flag_name == "--pipes_basename" and not address.startswith("unix:"):
                parser.error(  # a TCP address there gets ".N"
                    f"--pipes_basename {address.rpartition('.')[0]!r} is no unix:PATH: each "
                    "env server adds .N to it; give host:port addresses with --env_servers"
                )
            if problem:
                parser.error(
                    f"{flag_name} {address!r} {problem}: e.g. 127.0.0.1:4431 or unix:/tmp/x"
                )


def addresses_of(flags: argparse.Namespace) -> dict[str, list[str]]:
    """The addresses the flags give, by the flag that gives them (--connect, --serve, and
    the env servers' --env_servers or --pipes_basename)."""
    named: dict[str, list[str]] = {}
    for name in ("serve", "connect"):
        if getattr(flags, name, None) is not None:
            named[f"--{name}"] = [getattr(flags, name)]
    if flags.env_servers is not None:
        named["--env_servers"] = [a.strip() for a in flags.env_servers.split(",") if a.strip()]
    else:
        last = max(getattr(flags, "num_servers", 1), 1) - 1  # the longest socket path
        named["--pipes_basename"] = [f"{flags.pipes_basename}.{last}"]
    return named


def sockets_of_its_own(flags: dict[str, object], key: str) -> dict[str, object]:
    """A study's PolyBeast run's env servers on Unix sockets of its own, named from its
    ``key`` (short: a socket path has at most 107 bytes), unless its flags place them: on
    the default --pipes_basename, runs side by side would serve, and dial, each other's."""
    if any(name in flags for name in ("pipes_basename", "env_servers", "serve")):
        return {}
    digest = hashlib.sha1(key.encode()).hexdigest()[:12]
    # /tmp, not this machine's $TMPDIR: on a Ray cluster the cell runs on another node.
    return {"pipes_basename": f"unix:/tmp/torchbeast-{digest}"}


def poly_env_settings(flags: argparse.Namespace) -> PolyEnvSettings:
    """``polybeast_env``'s parsed command line, as its processes take it."""
    return from_flags(PolyEnvSettings, flags, env=env_settings(flags))


def resolve_learner_flags(
    flags: argparse.Namespace, parser: argparse.ArgumentParser, sources: Sources
) -> dict:
    """The PolyBeast learner's derived defaults: a queue of --batch_size rollouts, and a
    quarter of this machine's memory for the streams' rollout buffers."""
    resolved = {}
    check_addresses(parser, addresses_of(flags))
    if flags.max_learner_queue_size is None:
        resolved["max_learner_queue_size"] = flags.batch_size
    if flags.stream_memory_mb is None:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        resolved["stream_memory_mb"] = memory // 4 >> 20
    return resolved
