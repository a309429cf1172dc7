//! Tenant IDs from `X-Scope-OrgID`, validated by Mimir's rules (dskit `ValidTenantID`).

/// The header that names the tenant, as in Mimir and Cortex.
pub const TENANT_HEADER: &str = "X-Scope-OrgID";

/// Longest tenant ID, in bytes.
pub const MAX_TENANT_ID_LENGTH: usize = 150;

/// Why a tenant ID was refused. Missing answers 401; the rest answer 400.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TenantError {
    #[error("no tenant ID: set the {TENANT_HEADER} header")]
    Missing,
    #[error("tenant ID is empty")]
    Empty,
    #[error("tenant ID is too long: {0} bytes, max {MAX_TENANT_ID_LENGTH}")]
    TooLong(usize),
    #[error("tenant ID contains unsupported character {0:?}: allowed are a-z A-Z 0-9 and ! - _ . * ' ( )")]
    UnsupportedCharacter(char),
    #[error("tenant ID is '.' or '..'")]
    DotOrDotDot,
    #[error("tenant ID is not valid UTF-8")]
    NotUtf8,
}

/// Checks a tenant ID against Mimir's rules. The character check comes first, so a tenant
/// with several problems gets the same message it would from Mimir.
pub fn validate(tenant: &str) -> Result<&str, TenantError> {
    if tenant.is_empty() {
        return Err(TenantError::Empty);
    }
    if let Some(bad) = tenant.chars().find(|&c| !is_allowed(c)) {
        return Err(TenantError::UnsupportedCharacter(bad));
    }
    if tenant.len() > MAX_TENANT_ID_LENGTH {
        return Err(TenantError::TooLong(tenant.len()));
    }
    if tenant == "." || tenant == ".." {
        return Err(TenantError::DotOrDotDot);
    }
    Ok(tenant)
}

/// Resolves the tenant of a request from its header value. With `no_auth_tenant` set
/// (single-tenant mode), a request without the header belongs to that tenant.
pub fn resolve<'a>(
    header: Option<&'a [u8]>,
    no_auth_tenant: Option<&'a str>,
) -> Result<&'a str, TenantError> {
    match header {
        Some(bytes) => validate(std::str::from_utf8(bytes).map_err(|_| TenantError::NotUtf8)?),
        None => no_auth_tenant.ok_or(TenantError::Missing),
    }
}

fn is_allowed(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '!' | '-' | '_' | '.' | '*' | '\'' | '(' | ')')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mimir_rules() {
        for ok in ["a", "team-1", "A_b.c*d'(e)!", &"x".repeat(150), "..."] {
            assert_eq!(validate(ok), Ok(ok));
        }
        assert_eq!(validate(""), Err(TenantError::Empty));
        assert_eq!(validate("."), Err(TenantError::DotOrDotDot));
        assert_eq!(validate(".."), Err(TenantError::DotOrDotDot));
        assert_eq!(validate(&"x".repeat(151)), Err(TenantError::TooLong(151)));
        for (bad, c) in [
            ("a/b", '/'),
            ("a b", ' '),
            ("a|b", '|'),
            ("é", 'é'),
            ("a:b", ':'),
        ] {
            assert_eq!(validate(bad), Err(TenantError::UnsupportedCharacter(c)));
        }
    }

    #[test]
    fn single_tenant_mode_fills_in_a_missing_header() {
        assert_eq!(resolve(None, None), Err(TenantError::Missing));
        assert_eq!(resolve(None, Some("anonymous")), Ok("anonymous"));
        assert_eq!(resolve(Some(b"t1"), Some("anonymous")), Ok("t1"));
        assert_eq!(resolve(Some(b"\xff"), None), Err(TenantError::NotUtf8));
    }
}
