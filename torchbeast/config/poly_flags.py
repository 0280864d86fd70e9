"""PolyBeast's flag groups: addresses, TLS and the token (every PolyBeast entry point), the
learner's streams and inference, and ``polybeast_env``'s. No torch and no gRPC: env
machines and env processes import them."""

from __future__ import annotations

import argparse

from torchbeast.config.flags import add_env_side_flags
from torchbeast.config.poly import TOKEN_ENV_VAR, resolve_learner_flags
from torchbeast.config.values import (
    nonnegative_float,
    nonnegative_int,
    positive_float,
    positive_int,
)


def add_network_flags(parser: argparse.ArgumentParser) -> None:
    """Flags for addresses shared by every PolyBeast entry point, plus TLS and the token."""
    add = parser.add_argument
    add(
        "--pipes_basename",
        default="unix:/tmp/polybeast",
        help="Basename for the env servers' addresses: BASENAME.0, BASENAME.1, ...",
    )
    add(
        "--num_servers",
        default=4,
        type=positive_int,
        metavar="N",
        help="Number of environment servers.",
    )
    add(
        "--env_servers",
        default=None,
        metavar="ADDR,ADDR",
        help="(new) Env server addresses, comma-separated, e.g. 127.0.0.1:4431,host2:4431 "
        "(default: PIPES_BASENAME.0 .. PIPES_BASENAME.{num_servers-1}).",
    )
    add(
        "--auth_token",
        default=None,
        help=f"(new) Shared secret every stream must present (default: ${TOKEN_ENV_VAR}).",
    )
    add("--tls_cert", default=None, help="(new) PEM certificate this side serves TLS with.")
    add("--tls_key", default=None, help="(new) PEM private key of --tls_cert.")
    add(
        "--tls_ca",
        default=None,
        help="(new) PEM CA certificate: a client trusts servers signed by it (and dials with "
        "TLS); a server with it also requires client certificates.",
    )


def add_learner_flags(parser: argparse.ArgumentParser) -> None:
    """The learner's PolyBeast flags (the original's, plus addresses and inverted mode)."""
    add_network_flags(parser)
    add = parser.add_argument
    parser.set_defaults(env=None)
    add(
        "--serve",
        default=None,
        metavar="ADDRESS",
        help="(new) Inverted mode: serve env clients on ADDRESS (e.g. unix:/tmp/learner or "
        "127.0.0.1:4431) instead of dialling env servers.",
    )
    add(
        "--max_clients",
        default=256,
        type=positive_int,
        help="(new) Inverted mode: most env clients connected at once.",
    )
    add(
        "--stream_timeout_s",
        default=60.0,
        type=positive_float,
        help="(new) Close an env stream that sends no Step for this long (a client must "
        "also send its Hello within 10 s).",
    )
    add(
        "--stream_memory_mb",
        default=None,
        type=positive_int,
        metavar="MIB",
        help="(new) Most memory all env streams' rollout buffers may take; a stream that "
        "would exceed it is refused (default: a quarter of this machine's memory).",
    )
    add(
        "--max_learner_queue_size",
        default=None,
        type=positive_int,
        metavar="N",
        help="Most rollouts waiting for the learner (default: batch_size).",
    )
    add(
        "--num_inference_threads",
        default=2,
        type=positive_int,
        metavar="N",
        help="Number of threads running batched inference.",
    )
    add(
        "--max_inference_batch_size",
        default=512,
        type=positive_int,
        help="(new) Most env streams in one inference batch.",
    )
    add(
        "--inference_timeout_ms",
        default=1.0,
        type=nonnegative_float,
        help="(new) Longest wait for more streams to join an inference batch.",
    )


def add_env_flags(parser: argparse.ArgumentParser) -> None:
    """polybeast_env's flags."""
    add_network_flags(parser)
    add = parser.add_argument
    add("--env", type=str, default="PongNoFrameskip-v4", help="Gymnasium environment id.")
    add("--seed", type=nonnegative_int, default=None, help="(new) Seed for the environments.")
    add(
        "--connect",
        default=None,
        metavar="ADDRESS",
        help="(new) Inverted mode: dial the learner at ADDRESS (its --serve) instead of serving.",
    )
    add(
        "--clients_per_process",
        default=1,
        type=positive_int,
        help="(new) Inverted mode: env clients (streams) per process.",
    )
    add(
        "--envs_per_stream",
        default=1,
        type=positive_int,
        help="(new) Environments one stream steps together (a vectorised env, batched "
        "messages: less gRPC overhead per step).",
    )
    add(
        "--client_steps",
        default=0,
        type=nonnegative_int,
        help="(new) Inverted mode: a client leaves after this many steps (0: stays).",
    )
    add(
        "--max_streams",
        default=256,
        type=positive_int,
        help="(new) Classic mode: most streams one env server serves at once.",
    )
    add_env_side_flags(parser)


def add_runtime_flags(parser: argparse.ArgumentParser) -> None:
    """PolyBeast's learner flags on a runtime's parser (``runtime.registry``), with the
    defaults they derive."""
    add_learner_flags(parser)
    parser.resolvers.append(resolve_learner_flags)
