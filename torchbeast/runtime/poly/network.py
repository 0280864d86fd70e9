"""gRPC plumbing shared by env servers, env clients and the learner: addresses, TLS, token.

Servers bind to a Unix socket or 127.0.0.1 unless told otherwise; one that listens beyond
this machine must have a shared token. With a token set, every stream must present it in
its metadata or is refused with UNAUTHENTICATED (and the refusal is logged).
"""

from __future__ import annotations

import errno
import hmac
import logging
import os
import socket
import ssl
import stat
from concurrent import futures

import grpc

from torchbeast.config.poly import TOKEN_ENV_VAR, NetworkSettings
from torchbeast.core.errors import UserError
from torchbeast.runtime.console import RateLimitedLog

log = logging.getLogger("torchbeast")

TOKEN_METADATA_KEY = "x-torchbeast-token"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]", "::1")
# gRPC's cap on a message. A Step of the largest observations a Hello may announce (32 MiB,
# and as much again in final observations) fits; the per-stream limit from the spec is tighter.
MAX_MESSAGE_BYTES = 80 << 20
KEEPALIVE_OPTIONS = [
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.keepalive_permit_without_calls", 1),
]
# Redial a restarted peer within a couple of seconds (gRPC's default backs off to 2 min).
RECONNECT_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2_000),
]


class NetworkError(UserError, RuntimeError):
    """An address, certificate or token problem the user must fix; the message says how."""


def auth_token(settings: NetworkSettings) -> str | None:
    return settings.auth_token or os.environ.get(TOKEN_ENV_VAR) or None


def call_metadata(settings: NetworkSettings) -> tuple[tuple[str, str], ...]:
    token = auth_token(settings)
    return ((TOKEN_METADATA_KEY, token),) if token else ()


def is_local_address(address: str) -> bool:
    if address.startswith("unix:") or address.startswith("unix-abstract:"):
        return True
    host = address.rsplit(":", 1)[0]
    return host in LOOPBACK_HOSTS


def _read(path: str, what: str) -> bytes:
    """A PEM file's bytes (gRPC would refuse another kind only in its own log lines, and
    then retry or fail to listen with a misleading reason)."""
    try:
        with open(os.path.expanduser(path), "rb") as f:
            pem = f.read()
    except OSError as error:
        raise NetworkError(f"cannot read {what} {path}: {error.strerror}") from None
    if b"-----BEGIN " not in pem:
        raise NetworkError(
            f"{what} {path} is not a PEM file (no -----BEGIN line): give the PEM certificate "
            "or key (openssl x509 -in FILE -outform PEM converts a DER one)"
        )
    return pem


def check_tls_files(settings: NetworkSettings) -> None:
    """Refuses TLS files whose PEM content OpenSSL cannot take (a certificate and a key
    that are not a pair, or garbage between the BEGIN and END lines): gRPC says so only in
    its own log lines, then fails to listen "on the address" or retries a handshake for
    ever. (``_read`` has checked that each is there and looks like PEM.)"""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    if settings.tls_cert and settings.tls_key:
        cert, key = settings.tls_cert, settings.tls_key
        try:  # an encrypted key (which gRPC cannot take either) fails without a prompt
            context.load_cert_chain(os.path.expanduser(cert), os.path.expanduser(key), b"")
        except ssl.SSLError as error:
            raise NetworkError(
                f"--tls_cert {cert} and --tls_key {key} are not a certificate and its "
                f"unencrypted private key ({error.reason or error}): give the pair that was "
                "made together"
            ) from None
    if settings.tls_ca:
        try:
            context.load_verify_locations(os.path.expanduser(settings.tls_ca))
        except ssl.SSLError as error:
            raise NetworkError(
                f"--tls_ca {settings.tls_ca} holds no certificate OpenSSL can read "
                f"({error.reason or error}): give the PEM certificate of the authority"
            ) from None


class TokenInterceptor(grpc.ServerInterceptor):
    """Refuses every stream whose metadata lacks the shared token."""

    def __init__(self, token: str):
        self.token = token.encode()
        # The door anyone who reaches the port knocks on: its lines cannot flood the log.
        self.refusals = RateLimitedLog("streams without a valid auth token")

    def intercept_service(self, continuation, handler_call_details):
        presented = dict(handler_call_details.invocation_metadata).get(TOKEN_METADATA_KEY, "")
        if hmac.compare_digest(presented.encode(), self.token):
            return continuation(handler_call_details)
        return grpc.stream_stream_rpc_method_handler(self._refuse)

    def _refuse(self, request_iterator, context):
        self.refusals.warning("Refused a stream from %s: no valid auth token.", context.peer())
        context.abort(grpc.StatusCode.UNAUTHENTICATED, "a valid auth token is required")


def in_the_clear(settings: NetworkSettings, tls_flags: str) -> str:
    """What crosses the network unencrypted without TLS, and the flags that encrypt it."""
    what = "the auth token and all traffic" if auth_token(settings) else "all traffic"
    return f"{what} cross the network in the clear; add {tls_flags} to encrypt them."


BIND_PROBLEMS = {
    errno.EADDRINUSE: "the port is in use (another run or server?): stop what holds it, or "
    "give another port",
    errno.EADDRNOTAVAIL: "the host is not an address of this machine: give one of its own, "
    "or 0.0.0.0 for all of them",
    errno.EACCES: "ports below 1024 need root: give a port above 1023",
}


def check_can_listen_on_unix(address: str, path: str) -> None:
    """A Unix socket's folder must exist, and nothing may serve on it: gRPC removes what
    is at the path before it binds, a file or another server's socket alike (which then
    served nobody, its run left waiting)."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise NetworkError(
            f"cannot listen on {address}: no folder {folder}: create it, or give another "
            "socket path"
        )
    if not os.path.lexists(path):
        return
    if not stat.S_ISSOCK(os.lstat(path).st_mode):
        raise NetworkError(
            f"cannot listen on {address}: {path} is a file, not a socket: give another "
            "socket path (or move the file away)"
        )
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)  # a live server answers at once
        try:
            probe.connect(path)
        except OSError:
            return  # a socket left by a server that is gone: gRPC replaces it
    raise NetworkError(
        f"cannot listen on {address}: another process serves it (another run or env "
        "server?): stop it, or give another socket path"
    )


def check_can_listen(address: str) -> None:
    """Raises NetworkError where ``address`` cannot be listened on, saying why: a Unix
    socket in a missing folder, a port in use, a host not this machine's. (gRPC says only
    that it failed to bind, in a log line of its own beside.) Like gRPC, a host:port that
    names several addresses is good if one of them binds."""
    if address.startswith("unix:"):
        check_can_listen_on_unix(address, address[len("unix:") :].removeprefix("//"))
        return
    host, _, port = address.rpartition(":")
    if address.startswith("unix-abstract:") or not port.isdigit() or int(port) == 0:
        return  # gRPC's own checks (a port it picks, or one address_problem refused)
    try:
        candidates = socket.getaddrinfo(
            host.strip("[]") or None, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror as error:
        raise NetworkError(
            f"cannot listen on {address}: no address for {host!r} ({error.strerror})"
        ) from None
    problems = []
    for family, kind, protocol, _, socket_address in candidates:
        with socket.socket(family, kind, protocol) as probe:
            # As gRPC's listener: a port left in TIME_WAIT by a run that ended is free.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(socket_address)
                return
            except OSError as error:
                problems.append(BIND_PROBLEMS.get(error.errno, error.strerror))
    raise NetworkError(f"cannot listen on {address}: {problems[0]}")


def create_server(
    settings: NetworkSettings, address: str, max_streams: int
) -> tuple[grpc.Server, int]:
    """A gRPC server listening on ``address`` with this side's TLS and token; and its port.

    Every stream holds a worker thread for its lifetime, so ``max_streams`` bounds both the
    threads and the concurrent streams; more are refused with RESOURCE_EXHAUSTED.
    """
    token = auth_token(settings)
    check_can_listen(address)
    if not is_local_address(address) and not token:
        raise NetworkError(
            f"{address} listens beyond this machine without a token: set --auth_token "
            f"(or ${TOKEN_ENV_VAR}), and TLS with --tls_cert and --tls_key"
        )
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_streams, thread_name_prefix="stream"),
        interceptors=[TokenInterceptor(token)] if token else [],
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", 0),
            ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
            *KEEPALIVE_OPTIONS,
        ],
        maximum_concurrent_rpcs=max_streams,
    )
    if bool(settings.tls_cert) != bool(settings.tls_key):
        raise NetworkError("TLS needs both --tls_cert and --tls_key")
    if not settings.tls_cert and not is_local_address(address):
        log.warning(
            "Listening on %s without TLS: %s",
            address,
            in_the_clear(settings, "--tls_cert and --tls_key"),
        )
    if settings.tls_cert:
        key, cert = _read(settings.tls_key, "--tls_key"), _read(settings.tls_cert, "--tls_cert")
        ca = _read(settings.tls_ca, "--tls_ca") if settings.tls_ca else None
        check_tls_files(settings)
    try:
        if settings.tls_cert:
            credentials = grpc.ssl_server_credentials(
                [(key, cert)], root_certificates=ca, require_client_auth=bool(settings.tls_ca)
            )
            port = server.add_secure_port(address, credentials)
        else:
            port = server.add_insecure_port(address)
    except RuntimeError as error:
        raise NetworkError(f"cannot listen on {address}: {error}") from None
    if port == 0:
        raise NetworkError(f"cannot listen on {address}: is the address in use or invalid?")
    return server, port


def create_channel(settings: NetworkSettings, address: str) -> grpc.Channel:
    """A channel to ``address``: TLS when --tls_ca is set (client certificate if given)."""
    options = [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        *KEEPALIVE_OPTIONS,
        *RECONNECT_OPTIONS,
    ]
    if not settings.tls_ca:
        if not is_local_address(address):
            log.warning("Dialling %s without TLS: %s", address, in_the_clear(settings, "--tls_ca"))
        return grpc.insecure_channel(address, options=options)
    root_certificates = _read(settings.tls_ca, "--tls_ca")
    key = _read(settings.tls_key, "--tls_key") if settings.tls_key else None
    cert = _read(settings.tls_cert, "--tls_cert") if settings.tls_cert else None
    check_tls_files(settings)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=root_certificates, private_key=key, certificate_chain=cert
    )
    return grpc.secure_channel(address, credentials, options=options)
