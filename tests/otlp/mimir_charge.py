#!/usr/bin/env python3
"""What Grafana Mimir's distributor would charge to a tenant's ingestion rate limit for one
OTLP metrics export request: a Python model of the rules in docs/otlp-counting.md.

    mimir_charge.py FILE [--exemplars] [--nhcb] [--native-delta]

FILE is an OTLP/JSON (`.json`) or binary protobuf (anything else) ExportMetricsServiceRequest.
Prints one JSON line: samples, histograms, exemplars, metadata, total (the number Mimir passes
to the limiter: samples + histograms + exemplars + metadata), the HTTP status Mimir would
answer (200, or 400 when the translator refused a metric) and the translator's errors.

Defaults are Mimir's: exemplars are dropped (`max_global_exemplars_per_user: 0`), explicit
histograms become classic `_bucket`/`_sum`/`_count` series (`otel_convert_histograms_to_nhcb:
false`), delta sums and histograms are refused (`otel_native_delta_ingestion: false`).
The flags turn each of those on, as the tenant's limit would.

Label names are approximated (attribute keys as sent, the metric name with every character
outside [a-zA-Z0-9_:] replaced by `_`); they only matter for two points that Mimir would merge
into one series at one timestamp (counted once) and for metadata per metric family.
"""

import argparse
import base64
import json
import re
import sys

from google.protobuf import json_format
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

CUMULATIVE = 2
DELTA = 1
IDENTIFYING = ("service.namespace", "service.name", "service.instance.id")
TARGET_INFO_INTERVAL_NS = 150 * 1_000_000_000  # half of the default 5m lookback delta
MAX_EXEMPLAR_LABEL_RUNES = 128
EXPONENTIAL_SCHEMA_MIN = -4


def parse_json(text):
    """OTLP/JSON → protobuf: traceId/spanId are hex in OTLP/JSON, base64 in proto3 JSON."""

    def walk(value):
        if isinstance(value, dict):
            out = {}
            for key, item in value.items():
                if key in ("traceId", "spanId") and isinstance(item, str):
                    out[key] = base64.b64encode(bytes.fromhex(item)).decode()
                else:
                    out[key] = walk(item)
            return out
        if isinstance(value, list):
            return [walk(item) for item in value]
        return value

    req = ExportMetricsServiceRequest()
    json_format.ParseDict(walk(json.loads(text)), req, ignore_unknown_fields=True)
    return req


def any_value_str(v):
    kind = v.WhichOneof("value")
    if kind is None:
        return ""
    if kind == "string_value":
        return v.string_value
    if kind == "bool_value":
        return "true" if v.bool_value else "false"
    if kind == "int_value":
        return str(v.int_value)
    if kind == "double_value":
        return repr(v.double_value)
    return str(getattr(v, kind))


def attrs(kvs):
    return {kv.key: any_value_str(kv.value) for kv in kvs}


def family_name(name):
    # The translator's MetricNamer without suffixes: each run of characters outside
    # [a-zA-Z0-9_:] becomes one `_` (none at either end), `_` as sent is kept, and a name
    # that starts with a digit gets a `_`. (Units are compared as sent, not as named.)
    name = "_".join(field for field in re.split(r"[^a-zA-Z0-9_:]", name) if field)
    return "_" + name if name[:1].isdigit() else name


class Charge:
    def __init__(self, exemplars, nhcb, native_delta):
        self.exemplars_enabled = exemplars
        self.nhcb = nhcb
        self.native_delta = native_delta
        self.samples = 0
        self.histograms = 0
        self.exemplars = 0
        self.metadata = 0
        self.families = {}
        self.seen = set()
        self.errors = []

    def append(self, family, meta, labels, ts_ns, histogram=False, exemplars=()):
        key = (histogram, tuple(sorted(labels.items())), ts_ns // 1_000_000)
        if key not in self.seen:  # Mimir drops a second sample of a series at one timestamp
            self.seen.add(key)
            if histogram:
                self.histograms += 1
            else:
                self.samples += 1
        if self.exemplars_enabled:
            for ex in exemplars:
                runes = 0
                labelled = False
                if any(ex.trace_id):
                    labelled, runes = True, runes + len("trace_id") + 2 * len(ex.trace_id)
                if any(ex.span_id):
                    labelled, runes = True, runes + len("span_id") + 2 * len(ex.span_id)
                filtered = attrs(ex.filtered_attributes)
                extra = sum(len(k) + len(v) for k, v in filtered.items())
                if runes + extra <= MAX_EXEMPLAR_LABEL_RUNES and filtered:
                    labelled = True
                # Mimir drops exemplars without labels or without a timestamp.
                if labelled and ex.time_unix_nano // 1_000_000 != 0:
                    self.exemplars += 1
        if self.families.get(family) != meta:
            self.families[family] = meta
            self.metadata += 1

    def resource(self, rm):
        res = attrs(rm.resource.attributes)
        # pdata's Get: the first attribute of a key; `job` and `instance` set only with a value.
        first = {}
        for kv in rm.resource.attributes:
            first.setdefault(kv.key, any_value_str(kv.value))
        base = {}
        if "service.name" in first:
            job = first["service.name"]
            if "service.namespace" in first:
                job = first["service.namespace"] + "/" + job
            if job:
                base["job"] = job
        if first.get("service.instance.id"):
            base["instance"] = first["service.instance.id"]
        earliest, latest = None, None
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                kind = m.WhichOneof("data")
                points = list(getattr(m, kind).data_points) if kind else []
                for p in points:
                    earliest = p.time_unix_nano if earliest is None else min(earliest, p.time_unix_nano)
                    latest = p.time_unix_nano if latest is None else max(latest, p.time_unix_nano)
                self.metric(m, kind, points, base)
        if earliest is None:
            return
        identifying = sum(1 for k in IDENTIFYING if k in res)
        if len(rm.resource.attributes) <= identifying:
            return
        labels = {k: v for k, v in res.items() if k not in IDENTIFYING and v}
        labels.update(base)
        if "job" not in labels and "instance" not in labels:
            return
        labels["__name__"] = "target_info"
        meta = ("gauge", "", "Target metadata")
        t = earliest
        while t < latest:
            self.append("target_info", meta, labels, t)
            t += TARGET_INFO_INTERVAL_NS
        self.append("target_info", meta, labels, latest)

    def metric(self, m, kind, points, base):
        if kind is None:
            self.errors.append(f"metric {m.name!r} has no data (unsupported metric type)")
            return
        data = getattr(m, kind)
        temporality = getattr(data, "aggregation_temporality", None)
        if temporality is not None and not (
            temporality == CUMULATIVE or (self.native_delta and temporality == DELTA)
        ):
            self.errors.append(f"invalid temporality and type combination for metric {m.name!r}")
            return
        if not points:
            # Mimir 3.0.3's translator: an error, so the push is answered 400 (the rest kept).
            self.errors.append(f"empty data points. {m.name} is dropped")
            return
        name = family_name(m.name)
        delta = temporality == DELTA
        if kind == "gauge":
            ptype = "gauge"
        elif kind == "sum":
            ptype = "unknown" if delta else ("counter" if data.is_monotonic else "gauge")
        elif kind in ("histogram", "exponential_histogram"):
            ptype = "unknown" if delta else "histogram"
        else:
            ptype = "summary"
        meta = (ptype, m.unit, m.description)
        for p in points:
            labels = dict(base)
            labels.update(attrs(p.attributes))
            ts = p.time_unix_nano
            if kind == "gauge":
                self.append(name, meta, {**labels, "__name__": name}, ts)
            elif kind == "sum":
                self.append(name, meta, {**labels, "__name__": name}, ts, exemplars=p.exemplars)
            elif kind == "histogram" and self.nhcb:
                self.append(name, meta, {**labels, "__name__": name}, ts, True, p.exemplars)
            elif kind == "histogram":
                if p.HasField("sum"):
                    self.append(name, meta, {**labels, "__name__": name + "_sum"}, ts)
                self.append(name, meta, {**labels, "__name__": name + "_count"}, ts)
                n = min(len(p.explicit_bounds), len(p.bucket_counts))
                for i in range(n):
                    le = {**labels, "__name__": name + "_bucket", "le": repr(p.explicit_bounds[i])}
                    self.append(name, meta, le, ts)
                # Every exemplar lands on exactly one bucket series (the +Inf one at the latest).
                inf = {**labels, "__name__": name + "_bucket", "le": "+Inf"}
                self.append(name, meta, inf, ts, exemplars=p.exemplars)
            elif kind == "exponential_histogram":
                if p.scale < EXPONENTIAL_SCHEMA_MIN:
                    self.errors.append(f"cannot convert exponential to native histogram (scale {p.scale})")
                    return  # the points before this one stay converted
                self.append(name, meta, {**labels, "__name__": name}, ts, True, p.exemplars)
            else:  # summary
                self.append(name, meta, {**labels, "__name__": name + "_sum"}, ts)
                self.append(name, meta, {**labels, "__name__": name + "_count"}, ts)
                for q in p.quantile_values:
                    ql = {**labels, "__name__": name, "quantile": repr(q.quantile)}
                    self.append(name, meta, ql, ts)

    def result(self):
        converted = self.samples + self.histograms
        if converted == 0 and self.errors:
            # Nothing converted and something refused: 400 before the limiter, no charge.
            return {"samples": 0, "histograms": 0, "exemplars": 0, "metadata": 0, "total": 0,
                    "status": 400, "errors": self.errors}
        total = self.samples + self.histograms + self.exemplars + self.metadata
        return {"samples": self.samples, "histograms": self.histograms,
                "exemplars": self.exemplars, "metadata": self.metadata, "total": total,
                # Converted series are pushed (and charged) even when the answer is 400.
                "status": 400 if self.errors else 200, "errors": self.errors}


def charge(req, exemplars=False, nhcb=False, native_delta=False):
    c = Charge(exemplars, nhcb, native_delta)
    for rm in req.resource_metrics:
        c.resource(rm)
    return c.result()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file")
    parser.add_argument("--exemplars", action="store_true", help="max_global_exemplars_per_user > 0")
    parser.add_argument("--nhcb", action="store_true", help="otel_convert_histograms_to_nhcb: true")
    parser.add_argument("--native-delta", action="store_true", help="otel_native_delta_ingestion: true")
    args = parser.parse_args()
    with open(args.file, "rb") as f:
        raw = f.read()
    if args.file.endswith(".json"):
        req = parse_json(raw.decode())
    else:
        req = ExportMetricsServiceRequest.FromString(raw)
    print(json.dumps(charge(req, args.exemplars, args.nhcb, args.native_delta)))


if __name__ == "__main__":
    sys.exit(main())
