//! Tenant IDs from `X-Scope-OrgID`, validated by Mimir's rules (dskit `ValidTenantID`). The
//! rule itself is [`runtime_config::tenant::validate`], shared with the overrides file, which
//! refuses a tenant that no push could name.

pub use runtime_config::tenant::{InvalidTenantId, MAX_TENANT_ID_LENGTH};

/// The header that names the tenant, as in Mimir and Cortex.
pub const TENANT_HEADER: &str = "X-Scope-OrgID";

/// Why a tenant ID was refused. Missing answers 401; the rest answer 400.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TenantError {
    #[error("no tenant ID: set the {TENANT_HEADER} header")]
    Missing,
    #[error(transparent)]
    Invalid(#[from] InvalidTenantId),
    #[error("tenant ID is not valid UTF-8")]
    NotUtf8,
}

/// Checks a tenant ID against Mimir's rules.
pub fn validate(tenant: &str) -> Result<&str, TenantError> {
    Ok(runtime_config::tenant::validate(tenant)?)
}

/// Resolves the tenant of a request from its header value. With `no_auth_tenant` set
/// (single-tenant mode), a request without the header belongs to that tenant.
pub fn resolve<'a>(
    header: Option<&'a [u8]>,
    no_auth_tenant: Option<&'a str>,
) -> Result<&'a str, TenantError> {
    match header {
        // An empty header names no tenant, as in dskit (Mimir's): 401, or the default.
        Some(bytes) if !bytes.is_empty() => {
            validate(std::str::from_utf8(bytes).map_err(|_| TenantError::NotUtf8)?)
        }
        _ => no_auth_tenant.ok_or(TenantError::Missing),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_header_names_no_tenant() {
        assert_eq!(resolve(Some(b""), None), Err(TenantError::Missing));
        assert_eq!(resolve(Some(b""), Some("anonymous")), Ok("anonymous"));
        assert_eq!(resolve(Some(b"a"), Some("anonymous")), Ok("a"));
    }

    #[test]
    fn mimir_rules_from_the_shared_check() {
        assert_eq!(validate("team-1"), Ok("team-1"));
        assert_eq!(
            validate("a/b"),
            Err(TenantError::Invalid(InvalidTenantId::UnsupportedCharacter(
                '/'
            )))
        );
        assert_eq!(
            validate("a/b").unwrap_err().to_string(),
            "tenant ID contains unsupported character '/': allowed are a-z A-Z 0-9 and \
             ! - _ . * ' ( )"
        );
    }

    #[test]
    fn single_tenant_mode_fills_in_a_missing_header() {
        assert_eq!(resolve(None, None), Err(TenantError::Missing));
        assert_eq!(resolve(None, Some("anonymous")), Ok("anonymous"));
        assert_eq!(resolve(Some(b"t1"), Some("anonymous")), Ok("t1"));
        assert_eq!(resolve(Some(b"\xff"), None), Err(TenantError::NotUtf8));
        assert_eq!(
            resolve(Some(b".."), None),
            Err(TenantError::Invalid(InvalidTenantId::DotOrDotDot))
        );
    }
}
