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


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def prepare_environment(settings: Settings) -> None:
    """Settings Ray reads from the environment when it is imported, so set them first
    (see ``prepare_ray_environment``)."""
    prepare_ray_environment(settings.runtime.ray_address)


def prepare_ray_environment(address: str | None) -> None:
    """Settings Ray reads from the environment when it is imported, for a Ray started on
    this machine (``address`` None) or joined at ``address`` (host:port or "auto").

    Ray replaces 127.0.0.1 with this machine's network address unless told that this is
    a single-machine cluster; then every Ray server listens on 127.0.0.1 only. Token
    authentication is asked for when joining a cluster (Ray starts its own clusters with
    it); RAY_AUTH_MODE=disabled in the environment opts out.
    """
    resolved = auto_address() if address == "auto" else None
    if resolved is not None and "://" not in resolved:  # joined as one given by its address
        address = resolved
    host = None if address in (None, "auto") else address.rpartition(":")[0]
    if address is None or (host is not None and is_loopback(host)):
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "token")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # The pool reads every task result it needs and reports failures itself; tasks it
    # abandons while stopping would otherwise print their errors as "unhandled".
    os.environ.setdefault("RAY_IGNORE_UNHANDLED_ERRORS", "1")
    if host is not None:
        check_reachable(address)


def auto_address() -> str | None:
    """The address ``--ray_address auto`` joins, found as Ray finds it: $RAY_ADDRESS, else
    the cluster last started on this machine (its temp dir's ray_current_cluster); None
    where there is none. (Ray itself cannot be imported to ask: it reads the settings above
    as it is.)"""
    if os.environ.get("RAY_ADDRESS"):
        return os.environ["RAY_ADDRESS"]
    temp = os.environ.get("RAY_TMPDIR") or tempfile.gettempdir()
    try:
        with open(os.path.join(temp, "ray", "ray_current_cluster")) as file:
            return file.read().strip() or None
    except OSError:
        return None


def check_reachable(address: str) -> None:
    """Fails in seconds where Ray would retry an unreachable address for minutes."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise TrainingError(
            f"--ray_address {address!r} is not host:port (e.g. 127.0.0.1:6379) or auto"
        )
    try:
        socket.create_connection((host, int(port)), timeout=REACH_TIMEOUT_S).close()
    except OSError as error:
        raise TrainingError(
            f"cannot reach a Ray cluster at --ray_address {address}: {error}. Start one "
            "with `ray start --head`, or leave out --ray_address to run Ray on this machine"
        ) from None
