#!/usr/bin/env python3
"""Exports a fixed, known number of OTLP metric data points once, with the OpenTelemetry Python
SDK's OTLP/HTTP protobuf exporter (opentelemetry-exporter-otlp-proto-http), and reports what
was sent, what Grafana Mimir would charge for it, and what the receiver answered.

    export.py [--endpoint URL] [--tenant ID] [--compression gzip|none]
              [--kind gauge|sum|updown|histogram|exponential|summary|all]
              [--points N] [--metrics M] [--bounds B] [--exemplars E]
              [--resource sdk|service|none] [--temporality cumulative|delta]
              [--timeout SECONDS] [--attempts N] [--header NAME=VALUE ...]

The data is built directly as the SDK's MetricsData (no MeterProvider, no reader, no timer),
so the request is the same on every run apart from the timestamps: M metrics of each kind,
each with N data points (attribute `series`="0".."N-1"), all stamped with one time. `summary`
has no SDK type: it is built as the protobuf message and sent through the same exporter's
internal `_export_batch` (this version's; see README.md).

`--resource sdk` (default) is `Resource.create({"service.name": "weir-otlp-test"})`, which adds
`telemetry.sdk.*` attributes, so Mimir also charges one `target_info` sample and its metadata;
`service` sends only `service.name` and `none` an empty resource (no `target_info` either way).

Prints one JSON line: `sent` (data points per kind, exemplars), `expected` (Mimir's charge with
its defaults: samples, histograms, exemplars, metadata, total, status), the same with exemplars
enabled and with NHCB, the exporter's `result` (SUCCESS/FAILURE) and every HTTP attempt
(status, Retry-After, response Content-Type and body length). Exit status 0 on SUCCESS, 1 on
FAILURE.

The exporter treats 2xx/3xx as success; it retries 429, 502, 503 and 504 (and connection
errors) up to 6 attempts, waiting 2^n s ±20% or the Retry-After seconds, and gives up at once
when that wait would pass `--timeout`. `--attempts 1` (default) caps the tries at one, so a
429 comes back immediately.
"""

import argparse
import json
import logging
import os
import sys
import time

import requests

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import mimir_charge  # noqa: E402
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics  # noqa: E402
from opentelemetry.exporter.otlp.proto.http import Compression  # noqa: E402
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter  # noqa: E402
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (  # noqa: E402
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import (  # noqa: E402
    AnyValue,
    KeyValue,
)
from opentelemetry.proto.metrics.v1 import metrics_pb2 as pb2  # noqa: E402
from opentelemetry.sdk.metrics._internal.exemplar import Exemplar  # noqa: E402
from opentelemetry.sdk.metrics.export import (  # noqa: E402
    AggregationTemporality,
    Buckets,
    ExponentialHistogram,
    ExponentialHistogramDataPoint,
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricExportResult,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.util.instrumentation import InstrumentationScope  # noqa: E402

KINDS = ["gauge", "sum", "updown", "histogram", "exponential", "summary"]


def limit_attempts(n):
    """The exporter's retry loop reads a module constant (`_MAX_RETRIES` in
    opentelemetry.exporter.otlp.common.http in 1.4x; `_MAX_RETRYS` in older releases)."""
    patched = []
    for modname in ("opentelemetry.exporter.otlp.common.http",
                    "opentelemetry.exporter.otlp.proto.http.metric_exporter",
                    "opentelemetry.exporter.otlp.proto.http._common"):
        module = sys.modules.get(modname)
        if module is None:
            try:
                module = __import__(modname, fromlist=["_"])
            except ImportError:
                continue
        for const in ("_MAX_RETRIES", "_MAX_RETRYS"):
            if hasattr(module, const):
                setattr(module, const, n)
                patched.append(f"{modname}.{const}")
    return patched


def build(args, now_ns):
    start_ns = now_ns - 60 * 1_000_000_000
    temporality = (AggregationTemporality.DELTA if args.temporality == "delta"
                   else AggregationTemporality.CUMULATIVE)
    kinds = KINDS if args.kind == "all" else [args.kind]
    bounds = [float(10 ** i) for i in range(args.bounds)]  # 1, 10, 100, ...

    def exemplars(i):
        return [Exemplar({"ex": str(j)}, float(j), now_ns, span_id=0x1000 + j, trace_id=0x2000 + i)
                for j in range(args.exemplars)]

    def points(kind, n):
        out = []
        for i in range(n):
            a = {"series": str(i)}
            if kind in ("gauge", "sum", "updown"):
                out.append(NumberDataPoint(a, start_ns, now_ns, i + 1, exemplars(i)))
            elif kind == "histogram":
                counts = [1] * (len(bounds) + 1)
                out.append(HistogramDataPoint(a, start_ns, now_ns, sum(counts), 42.0, counts,
                                              bounds, 0.5, 500.0, exemplars(i)))
            elif kind == "exponential":
                out.append(ExponentialHistogramDataPoint(
                    a, start_ns, now_ns, 4, 6.0, 0, 1, Buckets(0, [1, 2]), Buckets(0, []),
                    0, 1.0, 3.0, exemplars(i)))
        return out

    sdk_metrics, summaries = [], []
    for kind in kinds:
        for m in range(args.metrics):
            name = f"weir.test.{kind}.{m}"
            if kind == "gauge":
                data = Gauge(points(kind, args.points))
            elif kind == "sum":
                data = Sum(points(kind, args.points), temporality, True)
            elif kind == "updown":
                data = Sum(points(kind, args.points), temporality, False)
            elif kind == "histogram":
                data = Histogram(points(kind, args.points), temporality)
            elif kind == "exponential":
                data = ExponentialHistogram(points(kind, args.points), temporality)
            else:
                summaries.append(pb2.Metric(name=name, unit="s", description="test summary",
                                            summary=pb2.Summary(data_points=[
                                                pb2.SummaryDataPoint(
                                                    attributes=[KeyValue(key="series", value=AnyValue(string_value=str(i)))],
                                                    start_time_unix_nano=start_ns, time_unix_nano=now_ns,
                                                    count=3, sum=1.5,
                                                    quantile_values=[
                                                        pb2.SummaryDataPoint.ValueAtQuantile(quantile=0.5, value=0.4),
                                                        pb2.SummaryDataPoint.ValueAtQuantile(quantile=0.99, value=0.9)])
                                                for i in range(args.points)])))
                continue
            sdk_metrics.append(Metric(name, f"test {kind}", "1", data))

    if args.resource == "sdk":
        resource = Resource.create({"service.name": "weir-otlp-test"})
    elif args.resource == "service":
        resource = Resource({"service.name": "weir-otlp-test"})
    else:
        resource = Resource({})
    scope = InstrumentationScope("weir.tests.otlp", "1.0.0")
    data = MetricsData([ResourceMetrics(resource, [ScopeMetrics(scope, sdk_metrics, "")], "")])

    # The request exactly as the exporter encodes it (the SDK keeps the resource and the scope
    # even when the scope has no metrics), plus the summaries: one request either way.
    request = encode_metrics(data)
    if summaries:
        request.resource_metrics[0].scope_metrics[0].metrics.extend(summaries)
    return data, request, bool(summaries)


def count_sent(request):
    per_kind, exemplars = {}, 0
    for rm in request.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                kind = m.WhichOneof("data")
                pts = getattr(m, kind).data_points
                per_kind[kind] = per_kind.get(kind, 0) + len(pts)
                exemplars += sum(len(getattr(p, "exemplars", [])) for p in pts)
    return per_kind, exemplars


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--endpoint", default="http://127.0.0.1:8080/otlp/v1/metrics")
    p.add_argument("--tenant", default="", help="sent as X-Scope-OrgID (omitted when empty)")
    p.add_argument("--compression", choices=["gzip", "none"], default="none")
    p.add_argument("--kind", choices=KINDS + ["all"], default="gauge")
    p.add_argument("--points", type=int, default=10, help="data points per metric")
    p.add_argument("--metrics", type=int, default=1, help="metrics per kind")
    p.add_argument("--bounds", type=int, default=3, help="explicit bounds per histogram point")
    p.add_argument("--exemplars", type=int, default=0, help="exemplars per data point")
    p.add_argument("--resource", choices=["sdk", "service", "none"], default="sdk")
    p.add_argument("--temporality", choices=["cumulative", "delta"], default="cumulative")
    p.add_argument("--timeout", type=float, default=5.0, help="exporter timeout, seconds")
    p.add_argument("--attempts", type=int, default=1, help="HTTP attempts at most (1: no retry)")
    p.add_argument("--header", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--quiet", action="store_true", help="silence the exporter's log lines")
    args = p.parse_args()

    logging.basicConfig(level=logging.CRITICAL if args.quiet else logging.WARNING,
                        stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    patched = limit_attempts(max(1, args.attempts))

    headers = dict(h.split("=", 1) for h in args.header)
    if args.tenant:
        headers["X-Scope-OrgID"] = args.tenant

    attempts = []
    session = requests.Session()

    def record(response, *_, **__):
        attempts.append({
            "status": response.status_code,
            "retry_after": response.headers.get("Retry-After"),
            "content_type": response.headers.get("Content-Type"),
            "body_bytes": len(response.content or b""),
        })

    session.hooks["response"].append(record)

    exporter = OTLPMetricExporter(
        endpoint=args.endpoint,
        headers=headers,
        timeout=args.timeout,
        compression=Compression.Gzip if args.compression == "gzip" else Compression.NoCompression,
        session=session,
    )

    now_ns = time.time_ns()
    data, request, has_summary = build(args, now_ns)
    per_kind, exemplars = count_sent(request)

    started = time.monotonic()
    if has_summary:
        # No SDK type carries a summary: send the protobuf request through the exporter itself.
        result = exporter._export_batch(request)  # pylint: disable=protected-access
    else:
        result = exporter.export(data, timeout_millis=args.timeout * 1000)
    elapsed = time.monotonic() - started
    exporter.shutdown()

    print(json.dumps({
        "sent": {"data_points": per_kind, "total_data_points": sum(per_kind.values()),
                 "exemplars": exemplars, "request_bytes": request.ByteSize(),
                 "compression": args.compression, "tenant": args.tenant or None},
        "expected": mimir_charge.charge(request),
        "expected_with_exemplars": mimir_charge.charge(request, exemplars=True),
        "expected_with_nhcb": mimir_charge.charge(request, nhcb=True),
        "expected_converting": mimir_charge.charge(request, exemplars=True, nhcb=True,
                                                   native_delta=True),
        "result": "SUCCESS" if result == MetricExportResult.SUCCESS else "FAILURE",
        "attempts": attempts,
        "elapsed_s": round(elapsed, 3),
        "attempt_limit_patched": patched,
    }))
    return 0 if result == MetricExportResult.SUCCESS else 1


if __name__ == "__main__":
    sys.exit(main())
