"""PolyBeast: environments and the learner as gRPC peers (see polybeast.proto)."""
