#!/usr/bin/env python3
"""Pushes bodies with Python's http.client, as a client that talks to weir directly would,
and reports what it saw.

    refusal_client.py HOST PORT TENANT BODY_BYTES COUNT

Sends COUNT pushes of BODY_BYTES (random bytes: weir refuses them before reading, by the
tenant's request rate, or reads them and answers 400) on one keep-alive connection, the body
streamed after the headers, and
prints one JSON line: the statuses seen, the Retry-After headers seen, the errors (a reset or
broken pipe instead of an answer) and how many connections were opened.
"""

import http.client
import json
import os
import sys
import time


def main():
    host, port, tenant, size, count = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    body = os.urandom(size)
    headers = {"X-Scope-OrgID": tenant, "Content-Encoding": "snappy",
               "Content-Type": "application/x-protobuf", "X-Prometheus-Remote-Write-Version": "0.1.0"}
    statuses, retry_after, errors, connections = [], [], [], 0
    conn = None
    for _ in range(count):
        if conn is None:
            conn = http.client.HTTPConnection(host, port, timeout=30)
            connections += 1
        try:
            # Headers first, then the body in 32 KiB pieces, 2 ms apart, as over a
            # real network: the answer can come while the body is still on its way.
            conn.putrequest("POST", "/api/v1/push")
            for name, value in headers.items():
                conn.putheader(name, value)
            conn.putheader("Content-Length", str(len(body)))
            conn.endheaders()
            for start in range(0, len(body), 32 << 10):
                conn.send(body[start:start + (32 << 10)])
                time.sleep(0.002)
            response = conn.getresponse()
            response.read()
            statuses.append(response.status)
            if response.getheader("Retry-After"):
                retry_after.append(response.getheader("Retry-After"))
            if response.getheader("Connection", "").lower() == "close":
                conn.close()
                conn = None
        except (BrokenPipeError, ConnectionResetError, http.client.HTTPException, OSError) as err:
            errors.append(type(err).__name__)
            conn.close()
            conn = None
    print(json.dumps({"statuses": statuses, "retry_after": len(retry_after), "errors": errors,
                      "connections": connections}))


if __name__ == "__main__":
    main()
