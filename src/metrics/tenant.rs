//! One tenant's series: plain atomics kept with its limiter state, and their text
//! exposition, written by hand at scrape time under the families' names and labels (see
//! [`super`] for why not `prometheus` crate series).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use once_cell::race::OnceBox;

use super::reasons::DiscardReason;
use crate::counts::{Discarded, DroppedExemplars, ExemplarReason, MetadataReason, SeriesReason};

/// A per-tenant counter: one atomic, no labels of its own (the tenant and reason are where
/// it is kept).
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    pub fn inc(&self) {
        self.inc_by(1);
    }

    pub fn inc_by(&self, by: u64) {
        self.0.fetch_add(by, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A tenant's limits as a scrape shows them, per second (+Inf: unlimited): as configured,
/// fleet-wide, and as this replica enforces them. Read from the limiter's state at the scrape,
/// not kept with the tenant's counters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TenantRates {
    pub request: f64,
    pub ingestion: f64,
    pub local_request: f64,
    pub local_ingestion: f64,
}

impl Default for TenantRates {
    fn default() -> Self {
        TenantRates {
            request: f64::INFINITY,
            ingestion: f64::INFINITY,
            local_request: f64::INFINITY,
            local_ingestion: f64::INFINITY,
        }
    }
}

/// One tenant's series: 29 atomics (232 bytes) and a pointer to 8 more for the drops that
/// refuse nothing, kept with its limiter state; and one more atomic, its pushes held here now.
#[derive(Debug, Default)]
pub struct TenantMetrics {
    /// The tenant's pushes held on this replica now (`--max-admission-delay`): not a series,
    /// the count [`crate::push`] bounds so that one tenant cannot fill the replica with them.
    pub held: AtomicU64,
    pub requests_in: Counter,
    pub received_requests: Counter,
    pub received_samples: Counter,
    pub received_exemplars: Counter,
    pub received_metadata: Counter,
    discarded_requests: [Counter; DiscardReason::ALL.len()],
    /// Only for the reasons decided after the body was decoded (see
    /// [`DiscardReason::COUNTS_SAMPLES`]); the others never know a sample count.
    discarded_samples: [Counter; DiscardReason::COUNTS_SAMPLES.len()],
    /// Series refused by validation, per [`SeriesReason`]: Mimir counts each once in its
    /// `discarded_samples_total`, whatever its samples.
    invalid_samples: [Counter; SeriesReason::ALL.len()],
    /// Metadata entries refused by validation, per [`MetadataReason`].
    invalid_metadata: [Counter; MetadataReason::ALL.len()],
    /// What validation drops without refusing a series: made on the first drop, so a tenant
    /// that never has one pays a pointer, not eight counters.
    drops: OnceBox<Drops>,
}

/// A tenant's drops that refuse nothing: exemplars, per [`ExemplarReason`], samples and
/// histograms that repeated a timestamp of their series, and OTLP metrics the translation
/// left out of an export it took the rest of.
#[derive(Debug, Default)]
struct Drops {
    exemplars: [Counter; ExemplarReason::ALL.len()],
    repeated_timestamps: Counter,
    untranslated: Counter,
    /// A refused push's exemplars and metadata entries, per reason that knows its items
    /// ([`DiscardReason::COUNTS_SAMPLES`]), as Mimir counts a rate-limited push's.
    refused_exemplars: [Counter; DiscardReason::COUNTS_SAMPLES.len()],
    refused_metadata: [Counter; DiscardReason::COUNTS_SAMPLES.len()],
}

impl TenantMetrics {
    /// What validation refused, as Mimir counts it: one per refused series, per
    /// [`SeriesReason`] (Mimir's checks count a series once, whatever its samples), and
    /// metadata entries, per [`MetadataReason`].
    pub fn discard_series(&self, discarded: &Discarded) {
        let counters = self.invalid_samples.iter().zip(&discarded.series);
        for (counter, items) in
            counters.chain(self.invalid_metadata.iter().zip(&discarded.metadata))
        {
            if *items > 0 {
                counter.inc_by(*items);
            }
        }
    }

    /// What validation dropped from one push without refusing a series: exemplars, per
    /// [`ExemplarReason`], and samples and histograms that repeated a timestamp.
    pub fn count_drops(&self, exemplars: &DroppedExemplars, repeated_timestamps: u64) {
        if repeated_timestamps == 0 && exemplars.iter().all(|&items| items == 0) {
            return;
        }
        let drops = self.drops.get_or_init(Box::default);
        for (counter, &items) in drops.exemplars.iter().zip(exemplars) {
            if items > 0 {
                counter.inc_by(items);
            }
        }
        if repeated_timestamps > 0 {
            drops.repeated_timestamps.inc_by(repeated_timestamps);
        }
    }

    /// OTLP metrics one push's translation left out: Mimir counts each as a discarded sample
    /// with reason `otlp_parse_error`.
    pub fn count_untranslated(&self, metrics: u64) {
        if metrics > 0 {
            let drops = self.drops.get_or_init(Box::default);
            drops.untranslated.inc_by(metrics);
        }
    }

    /// A push admitted and delivered (or kept, in sink mode): its request and items.
    pub fn count_received(&self, counts: &crate::counts::WriteCounts) {
        self.received_requests.inc();
        self.received_samples
            .inc_by(counts.samples + counts.histograms);
        self.received_exemplars.inc_by(counts.exemplars);
        self.received_metadata.inc_by(counts.metadata);
    }

    pub fn discard(&self, reason: DiscardReason, samples: u64) {
        self.discarded_requests[reason as usize].inc();
        if let Some(index) = DiscardReason::COUNTS_SAMPLES
            .iter()
            .position(|r| *r == reason)
        {
            self.discarded_samples[index].inc_by(samples);
        }
    }

    /// A push refused whole once decoded: its samples and histograms, its exemplars and its
    /// metadata entries each counted under `reason`, as Mimir's distributor counts a
    /// rate-limited push (`discarded_samples`, `_exemplars`, `_metadata`).
    pub fn discard_items(&self, reason: DiscardReason, items: &crate::counts::WriteCounts) {
        self.discard(reason, items.samples + items.histograms);
        let Some(index) = DiscardReason::COUNTS_SAMPLES
            .iter()
            .position(|r| *r == reason)
        else {
            return;
        };
        if items.exemplars == 0 && items.metadata == 0 {
            return;
        }
        let drops = self.drops.get_or_init(Box::default);
        drops.refused_exemplars[index].inc_by(items.exemplars);
        drops.refused_metadata[index].inc_by(items.metadata);
    }

    pub fn discarded_requests(&self, reason: DiscardReason) -> u64 {
        self.discarded_requests[reason as usize].get()
    }
}

/// Every tenant's series, visited by whoever keeps them (the limiter): the scrape walks them
/// once per family.
pub trait TenantSource {
    /// Visits every tenant; with `rates`, each with its limits (otherwise
    /// [`TenantRates::default`]), which cost a read of the limiter's state a tenant.
    fn for_each_tenant(
        &self,
        rates: bool,
        visit: &mut dyn FnMut(&str, &TenantMetrics, TenantRates),
    );
}

/// No tenants (a registry without a limiter, e.g. in tests of the other families).
impl TenantSource for () {
    fn for_each_tenant(&self, _: bool, _: &mut dyn FnMut(&str, &TenantMetrics, TenantRates)) {}
}

/// A per-tenant family: its name, help, type, and how to write its series for one tenant.
pub(super) struct TenantFamily {
    pub name: &'static str,
    pub help: &'static str,
    pub kind: &'static str,
    pub write: fn(&mut String, &'static str, &str, &TenantMetrics, TenantRates),
    /// Whether `write` reads the [`TenantRates`].
    pub rates: bool,
}

pub(super) const TENANT_FAMILIES: [TenantFamily; 11] = [
    TenantFamily {
        name: "weir_distributor_requests_in_total",
        help: "Push requests received per tenant, including rejected ones.",
        kind: "counter",
        rates: false,
        write: |out, name, user, m, _| per_user(out, name, user, &m.requests_in),
    },
    TenantFamily {
        name: "weir_distributor_received_requests_total",
        help: "Push requests admitted per tenant (not those given back when the forward \
               wrote nothing).",
        kind: "counter",
        rates: false,
        write: |out, name, user, m, _| per_user(out, name, user, &m.received_requests),
    },
    TenantFamily {
        name: "weir_distributor_received_samples_total",
        help: "Samples and histograms admitted per tenant (not those given back when the \
               forward wrote nothing).",
        kind: "counter",
        rates: false,
        write: |out, name, user, m, _| per_user(out, name, user, &m.received_samples),
    },
    TenantFamily {
        name: "weir_distributor_received_exemplars_total",
        help: "Exemplars admitted per tenant.",
        kind: "counter",
        rates: false,
        write: |out, name, user, m, _| per_user(out, name, user, &m.received_exemplars),
    },
    TenantFamily {
        name: "weir_distributor_received_metadata_total",
        help: "Metadata entries admitted per tenant.",
        kind: "counter",
        rates: false,
        write: |out, name, user, m, _| per_user(out, name, user, &m.received_metadata),
    },
    TenantFamily {
        name: "weir_discarded_requests_total",
        help: "Push requests discarded per tenant, by reason.",
        kind: "counter",
        rates: false,
        write: |out, name, user, m, _| {
            for (reason, counter) in DiscardReason::ALL.iter().zip(&m.discarded_requests) {
                let labels = [("reason", reason.request_reason()), ("user", user)];
                sample(out, name, &labels, counter.get() as f64);
            }
        },
    },
    TenantFamily {
        name: "weir_discarded_samples_total",
        help: "Samples, histograms, exemplars and metadata discarded per tenant, by reason.",
        kind: "counter",
        rates: false,
        write: |out, name, user, m, _| {
            for (reason, counter) in DiscardReason::COUNTS_SAMPLES
                .iter()
                .zip(&m.discarded_samples)
            {
                let labels = [("reason", reason.as_str()), ("user", user)];
                sample(out, name, &labels, counter.get() as f64);
            }
            // Validation's reasons only once one counted something: eleven more series per
            // tenant for what most tenants never send.
            for (reason, counter) in SeriesReason::ALL.iter().zip(&m.invalid_samples) {
                if counter.get() > 0 {
                    let labels = [("reason", reason.as_str()), ("user", user)];
                    sample(out, name, &labels, counter.get() as f64);
                }
            }
            // Mimir's reason for a sample or histogram that repeated a timestamp.
            let repeated = m
                .drops
                .get()
                .map_or(0, |drops| drops.repeated_timestamps.get());
            if repeated > 0 {
                let labels = [("reason", "sample_duplicate_timestamp"), ("user", user)];
                sample(out, name, &labels, repeated as f64);
            }
            // Mimir's reason for an OTLP metric its translation left out.
            let untranslated = m.drops.get().map_or(0, |drops| drops.untranslated.get());
            if untranslated > 0 {
                let labels = [("reason", "otlp_parse_error"), ("user", user)];
                sample(out, name, &labels, untranslated as f64);
            }
        },
    },
    TenantFamily {
        name: "weir_discarded_metadata_total",
        help: "Metadata entries refused by validation per tenant, by reason.",
        kind: "counter",
        rates: false,
        write: |out, name, user, m, _| {
            // Only once one counted something, as validation's sample reasons.
            for (reason, counter) in MetadataReason::ALL.iter().zip(&m.invalid_metadata) {
                if counter.get() > 0 {
                    let labels = [("reason", reason.as_str()), ("user", user)];
                    sample(out, name, &labels, counter.get() as f64);
                }
            }
            if let Some(drops) = m.drops.get() {
                refused_items(out, name, user, &drops.refused_metadata);
            }
        },
    },
    TenantFamily {
        name: "weir_discarded_exemplars_total",
        help: "Exemplars dropped by validation per tenant, by reason.",
        kind: "counter",
        rates: false,
        write: |out, name, user, m, _| {
            // Only once one was dropped, as validation's sample reasons.
            let Some(drops) = m.drops.get() else {
                return;
            };
            for (reason, counter) in ExemplarReason::ALL.iter().zip(drops.exemplars.iter()) {
                if counter.get() > 0 {
                    let labels = [("reason", reason.as_str()), ("user", user)];
                    sample(out, name, &labels, counter.get() as f64);
                }
            }
            refused_items(out, name, user, &drops.refused_exemplars);
        },
    },
    TenantFamily {
        name: "weir_limiter_limit",
        help: "A tenant's fleet-wide limit as configured, per second (+Inf: unlimited), by \
               limit (request_rate, ingestion_rate): the same on every replica.",
        kind: "gauge",
        rates: true,
        write: |out, name, user, _, rates| {
            limits(out, name, user, rates.request, rates.ingestion);
        },
    },
    TenantFamily {
        name: "weir_limiter_local_limit",
        help: "The rate this replica enforces of a tenant's fleet-wide limit, per second \
               (+Inf: unlimited), by limit (request_rate, ingestion_rate): its share under \
               divided, the whole limit (one fleet bucket) under weighted and shared.",
        kind: "gauge",
        rates: true,
        write: |out, name, user, _, rates| {
            limits(out, name, user, rates.local_request, rates.local_ingestion);
        },
    },
];

/// A tenant's request and ingestion rates, a series each, labelled by `limit`.
fn limits(out: &mut String, name: &str, user: &str, request: f64, ingestion: f64) {
    for (limit, value) in [("request_rate", request), ("ingestion_rate", ingestion)] {
        sample(out, name, &[("user", user), ("limit", limit)], value);
    }
}

/// A family with one series per tenant, labelled `user` only.
fn per_user(out: &mut String, name: &str, user: &str, counter: &Counter) {
    sample(out, name, &[("user", user)], counter.get() as f64);
}

/// A refused push's exemplars or metadata entries, per reason, those that counted any.
fn refused_items(
    out: &mut String,
    name: &str,
    user: &str,
    counters: &[Counter; DiscardReason::COUNTS_SAMPLES.len()],
) {
    for (reason, counter) in DiscardReason::COUNTS_SAMPLES.iter().zip(counters) {
        if counter.get() > 0 {
            let labels = [("reason", reason.as_str()), ("user", user)];
            sample(out, name, &labels, counter.get() as f64);
        }
    }
}

/// One line of the text exposition format: `name{label="value",…} value`.
pub(super) fn sample(out: &mut String, name: &str, labels: &[(&str, &str)], value: f64) {
    out.push_str(name);
    out.push('{');
    for (i, (label, value)) in labels.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(label);
        out.push_str("=\"");
        for c in value.chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '"' => out.push_str("\\\""),
                '\n' => out.push_str("\\n"),
                c => out.push(c),
            }
        }
        out.push('"');
    }
    out.push_str("} ");
    if value.is_infinite() {
        out.push_str(if value > 0.0 { "+Inf" } else { "-Inf" });
    } else {
        let _ = write!(out, "{value}");
    }
    out.push('\n');
}
