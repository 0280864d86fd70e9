"""Classic mode: the learner dials the env servers, one stream per actor, and redials a
server that died or failed its stream, with backoff."""

from __future__ import annotations

import itertools
import logging
import queue
import time

import grpc

from torchbeast.core.errors import shown
from torchbeast.runtime.poly import codec
from torchbeast.runtime.poly import polybeast_pb2 as pb
from torchbeast.runtime.poly.env_streams import EnvStreams
from torchbeast.runtime.poly.run_spec import SpecMismatch
from torchbeast.runtime.poly.stream_limits import BeyondBudget, OverBudget
from torchbeast.runtime.queues import Closed

log = logging.getLogger("torchbeast")

MAX_BACKOFF_S = 5.0
# A stream that served this long was a working one: its end starts the backoff afresh.
HEALTHY_STREAM_S = MAX_BACKOFF_S


def misconfigured(pool: EnvStreams, address: str, reason: str) -> str:
    """A server at ``address`` that refuses the learner, or is not the run's (redialling it
    alone cannot help): before any stream served, the run's settings are wrong and it stops
    with ``reason``; once the run trains on others, a server (restarted otherwise) costs
    only its own streams, redialled until it is put right. Returns the reason to log."""
    if not pool.has_served.is_set():
        pool.fail(f"env server {address}: {reason}")
    return reason


def dial(
    pool: EnvStreams, address: str, channel: grpc.Channel, metadata: tuple[tuple[str, str], ...]
) -> None:
    """Keeps one of ``pool``'s streams open to the env server at ``address``, over
    ``channel`` (the pool's to close), sending ``metadata`` with each call (the token)."""
    backoff = 0.1
    said = None  # the failure last logged: each new reason is logged once
    stream_env = channel.stream_stream(
        "/torchbeast.polybeast.EnvServer/StreamEnv",
        request_serializer=pb.Action.SerializeToString,
        response_deserializer=codec.parse_env_message,  # logs what it cannot parse
    )
    for attempt in itertools.count():
        if pool.stopping.is_set():
            return
        requests: queue.Queue[pb.Action | None] = queue.Queue()  # None: half-close
        # wait_for_ready: a server that is not up (yet, or again) is waited for.
        call = stream_env(iter(requests.get, None), metadata=metadata, wait_for_ready=True)
        first_action = None
        try:
            for action in pool.serve_env(call, call.cancel):
                if first_action is None:
                    first_action = time.monotonic()
                    pool.has_served.set()
                requests.put(action)
            reason = "it closed the stream"
        except grpc.RpcError as error:
            code, details = error.code(), error.details() or ""
            reason = code.name
            if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                reason = misconfigured(pool, address, f"it refused the learner: {shown(details)}")
            if code == grpc.StatusCode.UNIMPLEMENTED:  # something else listens there
                reason = misconfigured(
                    pool,
                    address,
                    "it is no env server (another learner's --serve, say): give the addresses "
                    "of polybeast_env servers (--env_servers or --pipes_basename)",
                )
            if code == grpc.StatusCode.ABORTED and details.startswith(codec.ENV_FAILED):
                line, _, trace = details.removeprefix(codec.ENV_FAILED).partition("\n")
                reason = codec.ENV_FAILED + shown(line, quote=False)
                if pool.owns_envs:  # this command's env servers: the run's own env failed
                    log.error("Env server %s: %s", address, trace)
                    pool.fail(f"env server {address}: {reason} (traceback in out.log)")
        except codec.ProtocolError as error:
            reason = f"it sent a bad stream: {error}"
        except OverBudget as error:
            reason = str(error)
            if isinstance(error, BeyondBudget):
                reason = misconfigured(pool, address, str(error))
        except SpecMismatch as error:
            reason = misconfigured(pool, address, str(error))
        except Closed:
            return
        finally:
            requests.put(None)
            call.cancel()
        if pool.stopping.is_set():
            return
        if first_action is not None and time.monotonic() - first_action >= HEALTHY_STREAM_S:
            backoff, said = 0.1, None  # it worked: this is a new failure, not the same one
        if reason != said:
            log.warning("Env server %s: %s; redialling.", address, reason)
            said = reason
        elif attempt % 20 == 0:
            log.info("Still redialling env server %s.", address)
        if pool.stopping.wait(backoff):
            return
        # A server that keeps failing streams is retried ever more slowly; one that
        # is just down is waited for by wait_for_ready instead.
        backoff = min(2 * backoff, MAX_BACKOFF_S) if reason != "UNAVAILABLE" else 0.1
