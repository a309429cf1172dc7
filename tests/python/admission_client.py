#!/usr/bin/env python3
"""A client of weir's admission API in another language, generated from the checked-in
protos at test time (grpcio-tools), calling every RPC of weir.admission.v1.Admission and
envoy.service.ratelimit.v3.RateLimitService on a real server.

    admission_client.py HOST:PORT [holder N TTL_SECONDS]

Without `holder`: checks every RPC and its errors against the overrides the Rust test set
(see tests/admission_api.rs), prints "ok" and exits 0. With `holder`: acquires N leases of
tenant "a" key "slots", prints their ids, and sleeps until killed (the holder the
crash test SIGKILLs).
"""

import os
import sys
import tempfile
import time

import grpc
from grpc_tools import protoc

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROTO = os.path.join(ROOT, "proto")


def generate():
    out = tempfile.mkdtemp(prefix="weir-python-grpc-")
    include = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    for proto in ["weir/admission/v1/admission.proto", "envoy/service/ratelimit/v3/rls.proto",
                  "envoy/extensions/common/ratelimit/v3/ratelimit.proto",
                  "envoy/config/core/v3/base.proto", "envoy/type/v3/ratelimit_unit.proto"]:
        code = protoc.main(["protoc", f"-I{PROTO}", f"-I{include}", f"--python_out={out}",
                            f"--grpc_python_out={out}", os.path.join(PROTO, proto)])
        assert code == 0, f"protoc failed on {proto}"
    sys.path.insert(0, out)


def expect_error(call, code, reason):
    try:
        call()
    except grpc.RpcError as err:
        assert err.code() == code, f"{err.code()} != {code}: {err.details()}"
        # The google.rpc.ErrorInfo detail carries the reason.
        metadata = dict(err.trailing_metadata() or [])
        details = metadata.get("grpc-status-details-bin", b"")
        assert reason.encode() in details, f"{reason} not in the status details: {details!r}"
        return
    raise AssertionError(f"expected {code} {reason}")


def check(address):
    from weir.admission.v1 import admission_pb2 as pb, admission_pb2_grpc as rpc
    from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
    from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2

    channel = grpc.insecure_channel(address)
    stub = rpc.AdmissionStub(channel)

    # Allow: tenant a's "GET /s" allows 3 per second (token bucket, burst 3).
    answers = [stub.Allow(pb.AllowRequest(tenant="a", key="GET /s", cost=1)) for _ in range(4)]
    assert [a.allowed for a in answers] == [True, True, True, False], answers
    refused = answers[3]
    assert refused.retry_after.ToNanoseconds() > 0
    assert refused.limit_in_force.burst == 3 and refused.limit_source == "key"

    # AllowBatch: answers and errors in order.
    batch = stub.AllowBatch(pb.AllowBatchRequest(requests=[
        pb.AllowRequest(tenant="a", key="batch", cost=1),
        pb.AllowRequest(tenant="a", key="batch", cost=0),
    ]))
    assert batch.results[0].HasField("response") and batch.results[0].response.allowed
    assert batch.results[1].error.reason == "BAD_COST", batch.results[1]

    # Client limits apply only where allowed (tenant b allows them).
    spec = pb.LimitSpec(algorithm=pb.SLIDING_WINDOW, rate=1000)
    b = stub.Allow(pb.AllowRequest(tenant="b", key="mine", cost=500, limit=spec))
    assert b.allowed and b.limit_source == "client"
    a = stub.Allow(pb.AllowRequest(tenant="a", key="mine", cost=1, limit=spec))
    assert a.limit_source == "default", a

    # Errors: status codes with reasons.
    expect_error(lambda: stub.Allow(pb.AllowRequest(tenant="a", key="GET /s", cost=0)),
                 grpc.StatusCode.INVALID_ARGUMENT, "BAD_COST")
    expect_error(lambda: stub.Allow(pb.AllowRequest(tenant="a", key="GET /s", cost=4)),
                 grpc.StatusCode.OUT_OF_RANGE, "COST_OVER_LIMIT")
    expect_error(lambda: stub.Allow(pb.AllowRequest(tenant="b", key="k", cost=1,
                                                    limit=pb.LimitSpec(rate=-1))),
                 grpc.StatusCode.INVALID_ARGUMENT, "BAD_SPEC")
    expect_error(lambda: stub.Allow(pb.AllowRequest(key="k", cost=1)),
                 grpc.StatusCode.INVALID_ARGUMENT, "MISSING_FIELD")

    # Acquire / Renew / Release, and their errors.
    lease = stub.Acquire(pb.AcquireRequest(tenant="a", key="slots"))
    assert lease.granted and lease.lease_id and lease.limit == 50, lease
    stub.Renew(pb.RenewRequest(lease_id=lease.lease_id))
    stub.Release(pb.ReleaseRequest(lease_id=lease.lease_id))
    expect_error(lambda: stub.Release(pb.ReleaseRequest(lease_id=lease.lease_id)),
                 grpc.StatusCode.NOT_FOUND, "UNKNOWN_LEASE")
    expect_error(lambda: stub.Renew(pb.RenewRequest(lease_id="nonsense")),
                 grpc.StatusCode.NOT_FOUND, "UNKNOWN_LEASE")
    expect_error(lambda: stub.Acquire(pb.AcquireRequest(tenant="a", key="GET /s")),
                 grpc.StatusCode.FAILED_PRECONDITION, "NOT_CONCURRENT")

    # Envoy's rate-limit service, as Envoy calls it.
    envoy = rls_pb2_grpc.RateLimitServiceStub(channel)
    Entry = ratelimit_pb2.RateLimitDescriptor.Entry
    request = rls_pb2.RateLimitRequest(domain="edge", descriptors=[
        ratelimit_pb2.RateLimitDescriptor(entries=[Entry(key="remote_address", value="10.0.0.1")]),
        ratelimit_pb2.RateLimitDescriptor(entries=[Entry(key="unlisted", value="x")]),
    ])
    codes = [envoy.ShouldRateLimit(request).overall_code for _ in range(3)]
    OK, OVER = rls_pb2.RateLimitResponse.OK, rls_pb2.RateLimitResponse.OVER_LIMIT
    assert codes == [OK, OK, OVER], codes
    response = envoy.ShouldRateLimit(request)
    assert response.statuses[0].code == OVER and response.statuses[1].code == OK
    assert response.statuses[0].current_limit.requests_per_unit == 2
    # More hits than the limit holds: over it, with the limit and the window, for Envoy's
    # X-RateLimit headers.
    heavy = envoy.ShouldRateLimit(rls_pb2.RateLimitRequest(domain="edge", hits_addend=5,
        descriptors=[ratelimit_pb2.RateLimitDescriptor(
            entries=[Entry(key="remote_address", value="10.0.0.2")])]))
    assert heavy.overall_code == OVER, heavy
    assert heavy.statuses[0].current_limit.requests_per_unit == 2, heavy
    assert heavy.statuses[0].duration_until_reset.seconds > 0, heavy
    expect_error(lambda: envoy.ShouldRateLimit(rls_pb2.RateLimitRequest(domain="nowhere")),
                 grpc.StatusCode.NOT_FOUND, "UNKNOWN_DOMAIN")
    print("ok")


def hold(address, n, ttl):
    from weir.admission.v1 import admission_pb2 as pb, admission_pb2_grpc as rpc
    from google.protobuf import duration_pb2
    stub = rpc.AdmissionStub(grpc.insecure_channel(address))
    held = 0
    for _ in range(n):
        lease = stub.Acquire(pb.AcquireRequest(tenant="a", key="slots",
                                               ttl=duration_pb2.Duration(seconds=ttl)))
        held += lease.granted
    print(f"held {held}", flush=True)
    time.sleep(3600)


if __name__ == "__main__":
    generate()
    if len(sys.argv) > 2 and sys.argv[2] == "holder":
        hold(sys.argv[1], int(sys.argv[3]), int(sys.argv[4]))
    else:
        check(sys.argv[1])
