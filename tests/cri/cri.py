#!/usr/bin/python3
"""A CRI client for tests/tests/cri.rs: one call of the CRI API (the kubelet's gRPC API,
k8s.io/cri-api runtime.v1) on a containerd socket, the request as JSON on stdin (the
proto's field names), the response as JSON on stdout (the same names).

    cri.py GEN_DIR SOCKET METHOD < request.json

GEN_DIR holds api_pb2.py, which the test makes with protoc from k8s.io/cri-api's
api.proto. The stubs grpc_tools would generate are not needed: the method's service and
message types are read from the proto's own descriptor, and the call is made with
grpcio's generic unary-unary channel call.

Exit status 0 and the response, or 1 and the gRPC status on stderr.
"""

import json
import os
import sys

import grpc
from google.protobuf import json_format

GEN_DIR, SOCKET, METHOD = sys.argv[1:4]
sys.path.insert(0, GEN_DIR)
import api_pb2  # noqa: E402  (generated into GEN_DIR)


def method_descriptor(name):
    for service in api_pb2.DESCRIPTOR.services_by_name.values():
        method = service.methods_by_name.get(name)
        if method is not None:
            return service, method
    sys.exit(f"cri.py: no CRI method {name}")


def main():
    service, method = method_descriptor(METHOD)
    request_type = getattr(api_pb2, method.input_type.name)
    response_type = getattr(api_pb2, method.output_type.name)
    request = json_format.Parse(sys.stdin.read() or "{}", request_type())
    with grpc.insecure_channel("unix://" + os.path.abspath(SOCKET)) as channel:
        call = channel.unary_unary(
            f"/{service.full_name}/{method.name}",
            request_serializer=request_type.SerializeToString,
            response_deserializer=response_type.FromString,
        )
        try:
            response = call(request, timeout=120)
        except grpc.RpcError as e:
            print(f"{METHOD}: {e.code().name}: {e.details()}", file=sys.stderr)
            sys.exit(1)
    print(
        json.dumps(
            json_format.MessageToDict(response, preserving_proto_field_name=True)
        )
    )


main()
