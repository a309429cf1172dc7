//! What the admission API's two doors share: the gRPC service ([`crate::grpc`]) and its
//! HTTP/JSON twin ([`crate::admission_http`]) check names by the same rules, default a lease's
//! lifetime alike and name engine errors with the same codes and reasons. Both adapters import
//! this module and neither imports the other. Both ask [`authorized_tenant`] first.

use std::time::Duration;

use engine::{AdmissionError, Ask, Limiter, TenantHooks};
use runtime_config::{LimitSource, LimitSpec};
use tonic::Code;

use crate::auth::{Allowed, Authenticator, Denied, Door, Source};
use crate::tenant::{TenantError, MAX_TENANT_ID_LENGTH};

/// A lease's lifetime when the caller sets none.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(30);

/// Longest admission key accepted, in bytes. A key is a name (a route, a client ID), not a
/// payload; it travels percent-encoded (up to three bytes a byte) in every gossip report and
/// store key, so a bound keeps one caller from filling a peer's report.
pub const MAX_KEY_LENGTH: usize = 1024;

/// Longest lease ID accepted, in bytes: room for the longest one weir issues (a `shared`
/// lease names its tenant and percent-encoded key after a 34-byte prefix).
pub const MAX_LEASE_ID_LENGTH: usize = 40 + MAX_TENANT_ID_LENGTH + 3 * MAX_KEY_LENGTH;

/// Why a request's tenant, key or lease ID was refused before the engine saw it: each is
/// `INVALID_ARGUMENT` (400 in JSON). Every door checks with [`check_names`], so a name the
/// push path refuses is refused here too, and no name can reach gossip or the store that
/// they cannot carry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("{0} is required")]
    Missing(&'static str),
    #[error("{0}")]
    Tenant(#[from] TenantError),
    #[error("key is too long: {0} bytes, max {MAX_KEY_LENGTH}")]
    KeyTooLong(usize),
    #[error("lease_id is too long: {0} bytes, max {MAX_LEASE_ID_LENGTH}")]
    LeaseIdTooLong(usize),
}

impl NameError {
    /// The stable reason, in `google.rpc.ErrorInfo` and the JSON `reason`.
    pub fn reason(&self) -> &'static str {
        match self {
            NameError::Missing(_) => "MISSING_FIELD",
            NameError::Tenant(_) => "BAD_TENANT",
            NameError::KeyTooLong(_) => "KEY_TOO_LONG",
            NameError::LeaseIdTooLong(_) => "LEASE_ID_TOO_LONG",
        }
    }
}

/// A tenant ID by the push path's rules (Mimir's: [`crate::tenant::validate`]) and a key
/// within [`MAX_KEY_LENGTH`]. Keys are otherwise free-form: the engine percent-encodes them.
pub fn check_names(tenant: &str, key: &str) -> Result<(), NameError> {
    if tenant.is_empty() {
        return Err(NameError::Missing("tenant"));
    }
    crate::tenant::validate(tenant)?;
    check_key(key)
}

fn check_key(key: &str) -> Result<(), NameError> {
    if key.len() > MAX_KEY_LENGTH {
        return Err(NameError::KeyTooLong(key.len()));
    }
    Ok(())
}

/// A batch's tenants, each checked as [`authorized_tenant`] and [`check_names`] check one:
/// an item naming the tenant the item before it named, and passed, takes that answer (a
/// batch names one tenant again and again; the caller is the same for the whole batch). The
/// batch's refusals spend one failure of the caller's budget between them, as one request.
#[derive(Default)]
pub struct BatchTenants<'a> {
    last: Option<(&'a str, std::borrow::Cow<'a, str>)>,
    /// Whether an item has spent the batch's one failure.
    spent: bool,
}

impl<'a> BatchTenants<'a> {
    pub fn check<E: From<Denied> + From<NameError>>(
        &mut self,
        auth: &Authenticator,
        door: Door,
        source: Source<'_>,
        tenant: &'a str,
        key: &str,
    ) -> Result<std::borrow::Cow<'a, str>, E> {
        if let Some((named, authorized)) = &self.last {
            if *named == tenant {
                check_key(key)?;
                return Ok(authorized.clone());
            }
        }
        let allowed =
            auth.authorize_item(door, source, Some(tenant.as_bytes()), &mut self.spent)?;
        let authorized = as_allowed(allowed, tenant);
        check_names(&authorized, key)?;
        self.last = Some((tenant, authorized.clone()));
        Ok(authorized)
    }
}

/// A batch item its door has checked (authentication, names, cost, the caller's limit): what
/// the engine is asked.
pub struct CheckedAsk<'a> {
    pub tenant: std::borrow::Cow<'a, str>,
    pub key: &'a str,
    pub cost: u64,
    pub limit: Option<LimitSpec>,
}

/// Decides a batch at either door, one answer an item, in order, each made by `answer`: the
/// items that passed their door's checks are asked of the engine as one batch; an item
/// refused before keeps its error.
pub async fn allow_checked<H: TenantHooks, E, T>(
    limiter: &Limiter<H>,
    checked: Vec<Result<CheckedAsk<'_>, E>>,
    mut answer: impl FnMut(Result<Result<engine::Allowed, AdmissionError>, E>) -> T,
) -> Vec<T> {
    let asks: Vec<Ask> = (checked.iter().filter_map(|item| item.as_ref().ok()))
        .map(|item| Ask {
            tenant: &item.tenant,
            key: item.key,
            cost: item.cost,
            limit: item.limit,
        })
        .collect();
    let mut answers = limiter.allow_batch(&asks).await.into_iter();
    (checked.into_iter())
        .map(|item| answer(item.map(|_| answers.next().expect("an answer for each ask"))))
        .collect()
}

/// The tenant a call may spend, checked by tenant authentication before any name rule or
/// limit: the one it names, or, when it names none (an empty `tenant`), the one tenant its
/// credential covers. Under `--tenant-auth header` the named one, unchecked.
pub fn authorized_tenant<'a>(
    auth: &Authenticator,
    door: Door,
    source: Source<'_>,
    tenant: &'a str,
) -> Result<std::borrow::Cow<'a, str>, Denied> {
    let allowed = auth.authorize(door, source, Some(tenant.as_bytes()))?;
    Ok(as_allowed(allowed, tenant))
}

/// The tenant a call goes on as: the one it named, or the one its credentials allow.
fn as_allowed(allowed: Allowed, named: &str) -> std::borrow::Cow<'_, str> {
    match allowed {
        Allowed::AsNamed => std::borrow::Cow::Borrowed(named),
        Allowed::Tenant(only) => std::borrow::Cow::Owned(only),
    }
}

/// A lease ID given back: present, and no longer than any weir issues.
pub fn check_lease_id(lease_id: &str) -> Result<(), NameError> {
    if lease_id.is_empty() {
        return Err(NameError::Missing("lease_id"));
    }
    if lease_id.len() > MAX_LEASE_ID_LENGTH {
        return Err(NameError::LeaseIdTooLong(lease_id.len()));
    }
    Ok(())
}

/// The gRPC code and stable reason for an engine error.
pub fn code_and_reason(err: &AdmissionError) -> (Code, &'static str) {
    match err {
        AdmissionError::UnknownTenant(_) => (Code::NotFound, "UNKNOWN_TENANT"),
        AdmissionError::UnknownKey(..) => (Code::NotFound, "UNKNOWN_KEY"),
        AdmissionError::NoLimit(..) => (Code::NotFound, "NO_LIMIT"),
        AdmissionError::UnknownLease(_) => (Code::NotFound, "UNKNOWN_LEASE"),
        AdmissionError::BadSpec(_) => (Code::InvalidArgument, "BAD_SPEC"),
        AdmissionError::BadCost(reason) if reason.starts_with("cost must") => {
            (Code::InvalidArgument, "BAD_COST")
        }
        AdmissionError::BadCost(_) => (Code::OutOfRange, "COST_OVER_LIMIT"),
        AdmissionError::NotConcurrent(_) => (Code::FailedPrecondition, "NOT_CONCURRENT"),
        AdmissionError::WrongReplica { .. } => (Code::FailedPrecondition, "WRONG_REPLICA"),
        AdmissionError::TooManyKeys { .. } => (Code::ResourceExhausted, "TOO_MANY_KEYS"),
        AdmissionError::StoreUnavailable => (Code::Unavailable, "STORE_UNAVAILABLE"),
    }
}

/// The name of the place a limit in force came from, in both doors' answers.
pub fn source_name(source: LimitSource) -> &'static str {
    match source {
        LimitSource::Key => "key",
        LimitSource::Client => "client",
        LimitSource::Default => "default",
    }
}
