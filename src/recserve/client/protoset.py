"""Triton's gRPC services as a protoset (a ``FileDescriptorSet``: grpc_service.proto and model_config.proto, as
the pinned tritonclient was built from them), for a gRPC tool that needs the schema: Triton answers no
reflection, so ``grpcurl -protoset triton.protoset ...`` calls it with this file (docs/integration.md).

    python -m recserve.client.protoset triton.protoset
"""

from __future__ import annotations

import sys
from pathlib import Path


def protoset_bytes() -> bytes:
    """The serialized FileDescriptorSet of Triton's inference service, its dependencies first."""
    from google.protobuf import descriptor_pb2
    from tritonclient.grpc import service_pb2

    ordered, seen = [], set()

    def add(file) -> None:
        if file.name in seen:
            return
        seen.add(file.name)
        for dependency in file.dependencies:
            add(dependency)
        proto = descriptor_pb2.FileDescriptorProto()
        file.CopyToProto(proto)
        ordered.append(proto)

    add(service_pb2.DESCRIPTOR)
    return descriptor_pb2.FileDescriptorSet(file=ordered).SerializeToString()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0].startswith("-"):
        print("usage: python -m recserve.client.protoset OUT (Triton's gRPC services, for grpcurl -protoset)")
        return 2
    Path(argv[0]).write_bytes(protoset_bytes())
    print(f"wrote {argv[0]}: inference.GRPCInferenceService (ModelInfer, ModelMetadata, ModelConfig, ...)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
