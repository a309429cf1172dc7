//! Tenant IDs by Mimir's rules (dskit `ValidTenantID`). The rule lives here, below both of its
//! users: the overrides file refuses a tenant no push could name, and weir's push path
//! (`src/tenant.rs`) refuses the same names in `X-Scope-OrgID`.

/// Longest tenant ID, in bytes.
pub const MAX_TENANT_ID_LENGTH: usize = 150;

/// Why a tenant ID breaks Mimir's rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum InvalidTenantId {
    #[error("tenant ID is empty")]
    Empty,
    #[error("tenant ID is too long: {0} bytes, max {MAX_TENANT_ID_LENGTH}")]
    TooLong(usize),
    #[error("tenant ID contains unsupported character {0:?}: allowed are a-z A-Z 0-9 and ! - _ . * ' ( )")]
    UnsupportedCharacter(char),
    #[error("tenant ID is '.' or '..'")]
    DotOrDotDot,
}

/// Checks a tenant ID against Mimir's rules. The character check comes first, so a tenant
/// with several problems gets the same message it would from Mimir.
pub fn validate(tenant: &str) -> Result<&str, InvalidTenantId> {
    if tenant.is_empty() {
        return Err(InvalidTenantId::Empty);
    }
    if let Some(bad) = tenant.chars().find(|&c| !is_allowed(c)) {
        return Err(InvalidTenantId::UnsupportedCharacter(bad));
    }
    if tenant.len() > MAX_TENANT_ID_LENGTH {
        return Err(InvalidTenantId::TooLong(tenant.len()));
    }
    if tenant == "." || tenant == ".." {
        return Err(InvalidTenantId::DotOrDotDot);
    }
    Ok(tenant)
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
        assert_eq!(validate(""), Err(InvalidTenantId::Empty));
        assert_eq!(validate("."), Err(InvalidTenantId::DotOrDotDot));
        assert_eq!(validate(".."), Err(InvalidTenantId::DotOrDotDot));
        assert_eq!(
            validate(&"x".repeat(151)),
            Err(InvalidTenantId::TooLong(151))
        );
        for (bad, c) in [
            ("a/b", '/'),
            ("a b", ' '),
            ("a|b", '|'),
            ("é", 'é'),
            ("a:b", ':'),
        ] {
            assert_eq!(validate(bad), Err(InvalidTenantId::UnsupportedCharacter(c)));
        }
    }
}
