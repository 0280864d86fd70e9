"""Settings Ray reads from the environment when it is imported: set before the Ray
runtime (``runtime.ray.trainer``) is, by ``registry.RUNTIMES["ray"].load``."""

from __future__ import annotations

import ipaddress
import os
import socket
import tempfile

from torchbeast.config.settings import Settings
from torchbeast.runtime.training import TrainingError

REACH_TIMEOUT_S = 5.0
ANSWER_TIMEOUT_S = 15.0  # a GCS answers its first call in milliseconds, even when busy
GCS_CLUSTER_ID = "/ray.rpc.NodeInfoGcsService/GetClusterId"  # the first call of Ray's driver
GIVE_THE_GCS = (
    "give the head's address as `ray start --head` printed it (host:6379 unless --port), "
    "or auto on a node of the cluster"
)
NOT_A_URL = (
    "torchbeast joins a cluster from one of its nodes, not through Ray Client (its learner, "
    f"or a study, reads what the workers return from the object store): {GIVE_THE_GCS}"
)


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def prepare_environment(settings: Settings) -> None:
    """Settings Ray reads from the environment when it is imported, so set them first
    (see ``prepare_ray_environment``)."""
    prepare_ray_environment(settings.runtime.ray_address)


def prepare_ray_environment(
    address: str | None, without: str = "leave out --ray_address to run Ray on this machine"
) -> None:
    """Settings Ray reads from the environment when it is imported, for a Ray started on
    this machine (``address`` None) or joined at ``address`` (host:port or "auto").

    Ray replaces 127.0.0.1 with this machine's network address unless told that this is
    a single-machine cluster; then every Ray server listens on 127.0.0.1 only. Token
    authentication is asked for when joining a cluster (Ray starts its own clusters with
    it); RAY_AUTH_MODE=disabled in the environment opts out. ``without``: what the command
    does without an address, as the line for an unreachable one offers it.
    """
    named = f"--ray_address {address}"  # the address as a line names it
    if address == "auto" and (found := auto_address()) is not None:
        address, source = found  # joined as one given by its address
        named = f"the address {address} that --ray_address auto found in {source}"
    if address is not None and "://" in address:
        raise TrainingError(f"{named} is a URL: {NOT_A_URL}")
    host = None if address in (None, "auto") else split_address(address, named)[0]
    if address is None or (host is not None and is_loopback(host)):
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "token")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # The pool reads every task result it needs and reports failures itself; tasks it
    # abandons while stopping would otherwise print their errors as "unhandled".
    os.environ.setdefault("RAY_IGNORE_UNHANDLED_ERRORS", "1")
    if host is not None:
        check_reachable(address, named, without)


def cannot_join(address: str, error: Exception, without: str) -> str:
    """The line for a Ray cluster at ``address`` that ``ray.init`` could not join
    (``error``); ``without``: what the command does without an address. A token refused,
    or asked for of a cluster started without token authentication (``ray start --head``
    with no token on its machine), says what to set."""
    from torchbeast.runtime.supervision import last_line  # noqa: PLC0415 - torch-free here

    line = f"cannot join the Ray cluster at --ray_address {address}: {last_line(error)}. "
    if type(error).__name__ == "AuthenticationError":  # ray.exceptions': Ray not imported
        return line + (
            "Give this machine the head's token (RAY_AUTH_TOKEN, or ~/.ray/auth_token, "
            "which `ray get-auth-token` prints on the head), or, for a head started without "
            "token authentication, set RAY_AUTH_MODE=disabled here"
        )
    return line + f"Start one with `ray start --head`, or {without}"


def auto_address() -> tuple[str, str] | None:
    """The address ``--ray_address auto`` joins, found as Ray finds it: $RAY_ADDRESS, else
    the cluster last started on this machine (its temp dir's ray_current_cluster), with
    where it was found; None where there is none. (Ray itself cannot be imported to ask:
    it reads the settings above as it is.)"""
    if os.environ.get("RAY_ADDRESS"):
        return os.environ["RAY_ADDRESS"], "$RAY_ADDRESS"
    temp = os.environ.get("RAY_TMPDIR") or tempfile.gettempdir()
    path = os.path.join(temp, "ray", "ray_current_cluster")
    try:
        with open(path) as file:
            address = file.read().strip()
    except OSError:
        return None
    return (address, path) if address else None


def split_address(address: str, named: str) -> tuple[str, int]:
    """The host (an IPv6 one without its brackets) and port of ``address``, host:port;
    ``named``: the address as an error line names it."""
    host, _, port = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise TrainingError(f"{named}: write an IPv6 host in brackets, e.g. [::1]:6379")
    if not host or not port.isdigit():
        raise TrainingError(f"{named} is not host:port (e.g. 127.0.0.1:6379) or auto")
    return host, int(port)


def check_reachable(
    address: str, named: str, without: str = "leave out --ray_address to run Ray on this machine"
) -> None:
    """Fails in seconds where Ray would retry an unreachable address for minutes, or
    one that answers but is not a Ray cluster's GCS for ~20 s (or, silent, for ever), then
    name the wrong fix; ``named``: the address as an error line names it."""
    try:
        socket.create_connection(split_address(address, named), REACH_TIMEOUT_S).close()
    except OSError as error:
        raise TrainingError(
            f"cannot reach a Ray cluster at {named}: {error}. Start one with `ray start "
            f"--head`, or {without}"
        ) from None
    check_is_ray_gcs(address, named)


def check_is_ray_gcs(address: str, named: str) -> None:
    """Asks ``address`` for its cluster id, as Ray's driver does first. A gRPC server
    without that method (a raylet; Ray Client's port, 10001) or an HTTP/1 server (the
    dashboard, 8265) is refused; any other answer, or none, is left to Ray."""
    if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
        return  # a plain channel cannot speak to it
    import grpc  # not Ray: it reads the settings above when it is imported

    with grpc.insecure_channel(address) as channel:
        try:
            channel.unary_unary(GCS_CLUSTER_ID)(b"", timeout=ANSWER_TIMEOUT_S)
            return
        except grpc.RpcError as error:
            code, details = error.code(), (error.details() or "").lower()
    if code == grpc.StatusCode.UNIMPLEMENTED:
        what = "a Ray server but not the cluster's GCS (10001 is Ray Client's port)"
    elif "http1" in details or "parsing http/2" in details:  # it does not speak gRPC
        what = "an HTTP server (8265 is Ray's dashboard)"
    elif code == grpc.StatusCode.DEADLINE_EXCEEDED:  # Ray would wait on it for ever
        what = (
            f"a server that takes connections but did not answer in {ANSWER_TIMEOUT_S:g} s "
            "(a cluster's GCS answers at once)"
        )
    else:
        return  # the GCS asking for its token, or something Ray itself will explain
    raise TrainingError(f"{named} is {what}: {GIVE_THE_GCS}")
