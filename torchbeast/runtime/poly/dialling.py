"""Classic mode: the learner dials the env servers, one stream per actor, and redials a
server that died or failed its stream, with backoff."""

from __future__ import annotations

import itertools
import logging
import queue
import re
import threading
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
# An env server not reached this long is said to be, with why (refused, no such host, a
# TLS handshake that failed): before, the learner waited on it in silence. Servers that
# this command starts are up well within it.
UNREACHABLE_NOTICE_S = 10.0
# A method no env server has: a call to it fails at once where the channel cannot
# connect, with gRPC's reason, and costs a reachable server nothing (UNIMPLEMENTED).
PROBE_METHOD = "/torchbeast.polybeast.EnvServer/Reachable"
PROBE_TIMEOUT_S = 5.0
CONNECT_FAILED = r"^failed to connect to all addresses; last error: [A-Z_]+: (\S+: )?"
PROBE_INTERVAL_S = 0.2


class Unreachable:
    """What the learner has said of env servers it cannot reach: each reason once per
    address, whichever of the address's streams found it."""

    def __init__(self):
        self.said: dict[str, str] = {}
        self.lock = threading.Lock()

    def say(self, address: str, reason: str) -> None:
        with self.lock:
            if self.said.get(address) == reason:
                return
            self.said[address] = reason
        log.warning("Env server %s cannot be reached: %s; still dialling.", address, reason)

    def reached(self, address: str) -> None:
        with self.lock:
            if self.said.pop(address, None) is not None:
                log.info("Env server %s reached.", address)


def misconfigured(pool: EnvStreams, address: str, reason: str) -> str:
    """A server at ``address`` that refuses the learner, or is not the run's (redialling it
    alone cannot help): before any stream served, the run's settings are wrong and it stops
    with ``reason``; once the run trains on others, a server (restarted otherwise) costs
    only its own streams, redialled until it is put right. Returns the reason to log."""
    if not pool.has_served.is_set():
        pool.fail(f"env server {address}: {reason}")
    return reason


def unreachable_reason(
    channel: grpc.Channel, metadata: tuple[tuple[str, str], ...] = ()
) -> str | None:
    """Why ``channel`` cannot reach its server (gRPC's words), or None where it answers;
    ``metadata`` (the token): a server sees no call without it. ValueError where the
    channel was closed."""
    try:
        channel.unary_unary(PROBE_METHOD)(
            b"", timeout=PROBE_TIMEOUT_S, wait_for_ready=False, metadata=metadata
        )
    except grpc.RpcError as error:
        if error.code() == grpc.StatusCode.UNAVAILABLE:
            # "failed to connect to all addresses; last error: UNKNOWN: ipv4:HOST:PORT:
            # Tls handshake failed ...": the line names the address; the cause is the rest.
            details = re.sub(CONNECT_FAILED, "", error.details() or "unavailable")
            return shown(details, limit=300, quote=False)
        if error.code() == grpc.StatusCode.DEADLINE_EXCEEDED:  # e.g. a handshake never done
            return f"it did not answer within {PROBE_TIMEOUT_S:.0f} s"
    return None  # it answered (UNIMPLEMENTED, as any server does)


def wait_until_reachable(
    pool: EnvStreams,
    address: str,
    channel: grpc.Channel,
    metadata: tuple[tuple[str, str], ...],
    unreachable: Unreachable,
) -> bool:
    """Waits until the server at ``address`` answers on ``channel``, saying why it does
    not once it has not for ``UNREACHABLE_NOTICE_S``; False where the pool stops first.
    (Probes, not wait_for_ready, which hides the reason.)"""
    started = time.monotonic()
    while not pool.stopping.is_set():
        try:
            reason = unreachable_reason(channel, metadata)
        except ValueError:  # the pool closed the channel: it is stopping
            return False
        if reason is None:
            unreachable.reached(address)
            return True
        if time.monotonic() - started >= UNREACHABLE_NOTICE_S:
            unreachable.say(address, reason)
        pool.stopping.wait(PROBE_INTERVAL_S)  # a channel in backoff fails a probe at once
    return False


def dial(
    pool: EnvStreams,
    address: str,
    channel: grpc.Channel,
    metadata: tuple[tuple[str, str], ...],
    unreachable: Unreachable | None = None,
) -> None:
    """Keeps one of ``pool``'s streams open to the env server at ``address``, over
    ``channel`` (the pool's to close), sending ``metadata`` with each call (the token);
    ``unreachable``: what the streams have said of servers they cannot reach."""
    unreachable = unreachable or Unreachable()
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
        if not wait_until_reachable(pool, address, channel, metadata, unreachable):
            return
        requests: queue.Queue[pb.Action | None] = queue.Queue()  # None: half-close
        # wait_for_ready: a server that went down again since is waited for.
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
        # is just down is waited for by wait_until_reachable instead.
        backoff = min(2 * backoff, MAX_BACKOFF_S) if reason != "UNAVAILABLE" else 0.1
