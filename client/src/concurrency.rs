//! Concurrency limits: [`Client::acquire`] takes one of the key's `max_concurrent` slots
//! from the fleet (`Acquire`), a task renews it every third of its TTL (`Renew`), and the
//! [`Guard`] gives it back when dropped (`Release`). Unlike rates, a slot cannot be leased
//! in batches: every acquisition is one call (bounded by the timeout).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

use crate::fleet::{duration, fleet_answered, permitted};
use crate::{proto, Client, FailurePolicy, Inner, Source};

/// Holds a slot until dropped.
pub struct Guard {
    lease_id: Option<String>,
    /// The replica that granted it: its renewals and release go there.
    replica: usize,
    source: Source,
    renew: Option<JoinHandle<()>>,
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard")
            .field("lease_id", &self.lease_id)
            .field("source", &self.source)
            .finish()
    }
}

impl Guard {
    /// The fleet's lease (none when the `open` policy let this through with the fleet away).
    pub fn lease_id(&self) -> Option<&str> {
        self.lease_id.as_deref()
    }

    pub fn source(&self) -> Source {
        self.source
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.inner.metrics.held.dec();
        if let Some(renew) = self.renew.take() {
            renew.abort();
        }
        if let Some(lease_id) = self.lease_id.take() {
            let inner = Arc::clone(&self.inner);
            // Released in the background: a drop cannot wait. If this call is lost the
            // slot frees at its TTL.
            let replica = self.replica;
            self.inner.runtime.spawn(async move {
                let mut api = inner.replica(replica);
                let started = Instant::now();
                let released = tokio::time::timeout(
                    inner.timeout,
                    api.release(inner.request(proto::ReleaseRequest { lease_id })),
                )
                .await;
                let ok = matches!(released, Ok(Ok(_)));
                inner
                    .metrics
                    .call("Release", ok, started.elapsed().as_secs_f64());
            });
        }
    }
}

/// A refused acquisition.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
#[error("no slot free ({in_flight} of {limit} held); retry after {retry_after:?}")]
pub struct Refused {
    pub retry_after: Duration,
    /// Held fleet-wide, as the replica knew it (0 when the fleet did not answer).
    pub in_flight: u64,
    /// The key's max_concurrent (0 when the fleet did not answer).
    pub limit: u64,
    /// What decided (`Lease`: the fleet refused; `FailClosed`: the fleet was away).
    pub origin: Source,
}

impl Client {
    /// Takes one slot of `tenant`'s `key` (its `max_concurrent`), waiting no longer than
    /// the timeout; with the fleet away, the failure policy decides.
    pub async fn acquire(&self, tenant: &str, key: &str) -> Result<Guard, Refused> {
        let inner = &self.inner;
        let by_policy = |inner: &Arc<Inner>| match inner.policy {
            FailurePolicy::Open => Ok(guard(inner, None, 0, Source::FailOpen)),
            FailurePolicy::Closed => Err(Refused {
                retry_after: Duration::ZERO,
                in_flight: 0,
                limit: 0,
                origin: Source::FailClosed,
            }),
        };
        if !permitted(inner) {
            return by_policy(inner);
        }
        let ttl = inner.concurrency_ttl;
        let request = proto::AcquireRequest {
            tenant: tenant.to_string(),
            key: key.to_string(),
            limit: None,
            ttl: Some(duration(ttl)),
        };
        let (replica, mut api) = inner.api();
        let started = Instant::now();
        let answer = tokio::time::timeout(inner.timeout, api.acquire(inner.request(request))).await;
        inner.metrics.call(
            "Acquire",
            matches!(answer, Ok(Ok(_))),
            started.elapsed().as_secs_f64(),
        );
        let response = match answer {
            Ok(Ok(response)) => {
                fleet_answered(inner, true, inner.now());
                response.into_inner()
            }
            Ok(Err(status)) if status.code() != tonic::Code::Unavailable => {
                fleet_answered(inner, true, inner.now());
                tracing::warn!(tenant, key, code = ?status.code(), message = status.message(),
                    "weir refused to acquire");
                return by_policy(inner);
            }
            Ok(Err(_)) | Err(_) => {
                fleet_answered(inner, false, inner.now());
                inner.failed_over(replica);
                return by_policy(inner);
            }
        };
        if !response.granted {
            return Err(Refused {
                retry_after: response
                    .retry_after
                    .and_then(|retry| Duration::try_from(retry).ok())
                    .unwrap_or_default(),
                in_flight: response.in_flight,
                limit: response.limit,
                origin: Source::Lease,
            });
        }
        let mut held = guard(
            inner,
            Some(response.lease_id.clone()),
            replica,
            Source::Lease,
        );
        let renewer = Arc::clone(inner);
        let lease_id = response.lease_id;
        held.renew = Some(inner.runtime.spawn(async move {
            let mut every = tokio::time::interval(ttl / 3);
            every.tick().await;
            loop {
                every.tick().await;
                let mut api = renewer.replica(replica);
                let request = proto::RenewRequest {
                    lease_id: lease_id.clone(),
                    ttl: Some(duration(ttl)),
                };
                let renewed =
                    tokio::time::timeout(renewer.timeout, api.renew(renewer.request(request)))
                        .await;
                if let Ok(Err(status)) = &renewed {
                    if status.code() == tonic::Code::NotFound {
                        // Expired or released: nothing left to renew.
                        return;
                    }
                }
            }
        }));
        Ok(held)
    }
}

fn guard(inner: &Arc<Inner>, lease_id: Option<String>, replica: usize, source: Source) -> Guard {
    inner.metrics.held.inc();
    Guard {
        lease_id,
        replica,
        source,
        renew: None,
        inner: Arc::clone(inner),
    }
}
