#!/usr/bin/env python3
"""weir's gRPC admission API over TLS from Python's grpc package (grpcio), with tenant tokens
in the `authorization` metadata: the client of tests/auth.rs's
python_grpc_client_over_tls_with_tokens, which starts weir with --grpc-tls-cert-file (a
certificate rcgen made) and --tenant-auth tokens.

    admission_tls_client.py HOST:PORT CA_PEM OTHER_CA_PEM TOKEN_A TOKEN_AB

TOKEN_A may use tenant team-a only, TOKEN_AB team-a and team-b; team-b's key "k" has a burst
of 5 and refills once in 1 000 s. Prints one JSON object with what each call got (status
code, ErrorInfo reason, allowed, remaining); the Rust test judges it.
"""

import json
import sys

import grpc

from admission_client import generate

TIMEOUT = 5


def outcome(call):
    """What a unary call got: its answer's fields, or its status code and reason."""
    try:
        answer = call()
    except grpc.RpcError as err:
        details = dict(err.trailing_metadata() or []).get("grpc-status-details-bin", b"")
        reasons = ["UNAUTHENTICATED", "TENANT_FORBIDDEN", "TENANT_AMBIGUOUS", "AUTH_THROTTLED"]
        return {
            "code": err.code().name,
            "reason": next((r for r in reasons if r.encode() in details), None),
        }
    return {
        "code": "OK",
        "allowed": answer.allowed,
        "remaining": answer.remaining,
        "retry_after": answer.retry_after.ToNanoseconds() / 1e9,
    }


def main(address, ca_file, other_ca_file, token_a, token_ab):
    from weir.admission.v1 import admission_pb2 as pb, admission_pb2_grpc as rpc

    with open(ca_file, "rb") as f:
        ca = f.read()
    with open(other_ca_file, "rb") as f:
        other_ca = f.read()
    tls = grpc.ssl_channel_credentials(root_certificates=ca)

    def allow(stub, tenant, metadata=None):
        request = pb.AllowRequest(tenant=tenant, key="k", cost=1)
        return outcome(lambda: stub.Allow(request, timeout=TIMEOUT, metadata=metadata))

    def bearer(token):
        return [("authorization", f"Bearer {token}")]

    results = {}
    # The TLS port refuses plaintext, and a client that does not trust weir's CA.
    with grpc.insecure_channel(address) as channel:
        results["plaintext"] = allow(rpc.AdmissionStub(channel), "team-b", bearer(token_ab))
    untrusted = grpc.ssl_channel_credentials(root_certificates=other_ca)
    with grpc.secure_channel(address, untrusted) as channel:
        results["untrusted_ca"] = allow(rpc.AdmissionStub(channel), "team-b", bearer(token_ab))

    with grpc.secure_channel(address, tls) as channel:
        stub = rpc.AdmissionStub(channel)
        results["no_token"] = allow(stub, "team-b")
        results["bad_token"] = allow(stub, "team-b", bearer("not-a-token-" + "0" * 32))
        # Valid, but for another tenant: refused, and team-b is not charged.
        results["other_tenant"] = [allow(stub, "team-b", bearer(token_a)) for _ in range(3)]
        # No tenant named: the one tenant TOKEN_A covers.
        results["filled_in"] = allow(stub, "", bearer(token_a))

    # grpcio's own way to send a bearer token: call credentials, only over a secure channel.
    with_token = grpc.composite_channel_credentials(
        tls, grpc.access_token_call_credentials(token_ab))
    with grpc.secure_channel(address, with_token) as channel:
        stub = rpc.AdmissionStub(channel)
        results["own"] = [allow(stub, "team-b") for _ in range(6)]
    print(json.dumps(results))


if __name__ == "__main__":
    generate()
    main(*sys.argv[1:6])
