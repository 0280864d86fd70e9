"""Inverted mode: the gRPC service env clients dial, each call one stream of the pool's,
its failures mapped to the status codes a client can act on."""

from __future__ import annotations

import logging

import grpc

from torchbeast.core.errors import shown
from torchbeast.runtime.console import RateLimitedLog
from torchbeast.runtime.poly import codec
from torchbeast.runtime.poly import polybeast_pb2 as pb
from torchbeast.runtime.poly import polybeast_pb2_grpc as pb_grpc
from torchbeast.runtime.poly.env_streams import EnvStreams
from torchbeast.runtime.poly.run_spec import SpecMismatch
from torchbeast.runtime.poly.stream_limits import BeyondBudget, OverBudget, StreamClosed
from torchbeast.runtime.queues import Closed

log = logging.getLogger("torchbeast")


class LearnerServicer(pb_grpc.LearnerServicer):
    """Inverted mode: env clients dial the learner."""

    def __init__(self, pool: EnvStreams):
        self.pool = pool
        self.refusals = RateLimitedLog("refused streams")

    def ConnectEnv(self, request_iterator, context):  # noqa: N802 (gRPC's name)
        try:
            yield from self.pool.serve_env(request_iterator, context.cancel)
        except grpc.RpcError:
            log.info("An env client at %s disconnected.", context.peer())
        except StreamClosed as error:
            self.refusals.warning("Closed a stream from %s: %s", context.peer(), error)
            context.abort(grpc.StatusCode.ABORTED, str(error))
        except codec.ProtocolError as error:
            self.refusals.warning("Closing a stream from %s: %s", context.peer(), error)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        except SpecMismatch as error:
            self.refusals.warning("Refused a stream from %s: %s", context.peer(), error)
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(error))
        except OverBudget as error:
            self.refusals.warning("Refused a stream from %s: %s", context.peer(), error)
            # Beyond the whole budget, coming back later cannot help: the client stops.
            beyond = isinstance(error, BeyondBudget)
            code = (
                grpc.StatusCode.FAILED_PRECONDITION
                if beyond
                else grpc.StatusCode.RESOURCE_EXHAUSTED
            )
            context.abort(code, str(error))
        except Closed:
            context.abort(grpc.StatusCode.UNAVAILABLE, "the learner is stopping")
        except Exception as error:  # not the client's fault: say so, keep the traceback here
            log.exception("Serving a stream from %s failed.", context.peer())
            context.abort(grpc.StatusCode.INTERNAL, f"the learner failed: {shown(repr(error))}")


def add_learner_servicer(server: grpc.Server, servicer: LearnerServicer) -> None:
    """Registers ``servicer`` with a deserializer that lets the stream refuse (and log) a
    message protobuf cannot parse; gRPC's own would close the stream without a word."""
    handlers = {
        "ConnectEnv": grpc.stream_stream_rpc_method_handler(
            servicer.ConnectEnv,
            request_deserializer=codec.parse_env_message,
            response_serializer=pb.Action.SerializeToString,
        )
    }
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("torchbeast.polybeast.Learner", handlers),)
    )
    server.add_registered_method_handlers("torchbeast.polybeast.Learner", handlers)
