//! The operator's pages (`/metrics`, `/ring`, `/runtime_config`, `/distributor/ha_tracker`)
//! list every tenant and its limits, so they can be kept from clients: on a listener of their
//! own (`--admin-addr`, wired in [`crate::server`]) and/or behind a bearer token
//! (`--admin-token-file`, checked here).
//!
//! The token is kept only as its BLAKE2b digest, and a presented token is compared digest to
//! digest in constant time, so neither its content nor its length shows in the answer's
//! timing. Neither the token nor what a client presents is ever logged.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use blake2::{Blake2b512, Digest};
use subtle::ConstantTimeEq;

/// Shorter tokens are refused at start-up: `openssl rand -hex 32` makes a good one.
pub const MIN_TOKEN_LENGTH: usize = 16;

/// The bearer token `--admin-token-file` holds.
pub struct AdminToken {
    digest: [u8; 64],
}

/// Why a request for an operator's page was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denied {
    /// No `Authorization: Bearer …` header: 401.
    NoToken,
    /// A bearer token, not this one: 403.
    WrongToken,
}

impl AdminToken {
    /// The token in `text` (a file's contents), surrounding whitespace ignored. It must be
    /// one word of visible ASCII (what a bearer token in a header can carry), at least
    /// [`MIN_TOKEN_LENGTH`] long. Errors never repeat the token.
    pub fn new(text: &str) -> Result<AdminToken, String> {
        let token = text.trim();
        if token.is_empty() {
            return Err("holds no token".to_string());
        }
        if !token.bytes().all(|byte| byte.is_ascii_graphic()) {
            return Err(
                "the token must be one word of visible ASCII (no spaces, no control or \
                 non-ASCII characters)"
                    .to_string(),
            );
        }
        if token.len() < MIN_TOKEN_LENGTH {
            return Err(format!(
                "the token has {} characters; at least {MIN_TOKEN_LENGTH} are needed \
                 (openssl rand -hex 32 makes one)",
                token.len()
            ));
        }
        Ok(AdminToken {
            digest: digest(token.as_bytes()),
        })
    }

    /// Whether `headers` carry this token as `Authorization: Bearer <token>` (the scheme in
    /// any case, as RFC 9110 allows).
    pub fn check(&self, headers: &HeaderMap) -> Result<(), Denied> {
        let presented = headers
            .get(header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim())
            .ok_or(Denied::NoToken)?;
        if bool::from(digest(presented.as_bytes()).ct_eq(&self.digest)) {
            Ok(())
        } else {
            Err(Denied::WrongToken)
        }
    }
}

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken(..)")
    }
}

fn digest(bytes: &[u8]) -> [u8; 64] {
    Blake2b512::digest(bytes).into()
}

/// Middleware for the operator's pages: passes a request that carries the token, answers 401
/// (with `WWW-Authenticate: Bearer`) without one and 403 with another.
pub async fn require_token(
    State(token): State<Arc<AdminToken>>,
    request: Request,
    next: Next,
) -> Response {
    match token.check(request.headers()) {
        Ok(()) => next.run(request).await,
        Err(denied) => {
            tracing::debug!(path = %request.uri().path(), ?denied, "admin page refused");
            denied.into_response()
        }
    }
}

impl IntoResponse for Denied {
    fn into_response(self) -> Response {
        match self {
            Denied::NoToken => (
                StatusCode::UNAUTHORIZED,
                [(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Bearer realm=\"weir admin\""),
                )],
                "this page needs Authorization: Bearer <the --admin-token-file token>\n",
            )
                .into_response(),
            Denied::WrongToken => (
                StatusCode::FORBIDDEN,
                "wrong token for this page (--admin-token-file)\n",
            )
                .into_response(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "0123456789abcdef-admin";

    fn headers(authorization: Option<&str>) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Some(value) = authorization {
            headers.insert(header::AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        }
        headers
    }

    #[test]
    fn the_token_passes_and_nothing_else_does() {
        let token = AdminToken::new(&format!("  {TOKEN}\n")).unwrap();
        for (authorization, expected) in [
            (Some(format!("Bearer {TOKEN}")), Ok(())),
            (Some(format!("bearer {TOKEN}")), Ok(())),
            (Some(format!("Bearer  {TOKEN} ")), Ok(())),
            (None, Err(Denied::NoToken)),
            (Some(format!("Basic {TOKEN}")), Err(Denied::NoToken)),
            (Some(TOKEN.to_string()), Err(Denied::NoToken)),
            (Some("Bearer ".to_string()), Err(Denied::WrongToken)),
            (Some(format!("Bearer {TOKEN}x")), Err(Denied::WrongToken)),
            (
                Some(format!("Bearer {}", &TOKEN[..TOKEN.len() - 1])),
                Err(Denied::WrongToken),
            ),
            (
                Some(format!("Bearer {}", TOKEN.to_uppercase())),
                Err(Denied::WrongToken),
            ),
        ] {
            assert_eq!(
                token.check(&headers(authorization.as_deref())),
                expected,
                "{authorization:?}"
            );
        }
    }

    #[test]
    fn bad_token_files_are_refused_without_repeating_them() {
        for (text, expected) in [
            ("", "holds no token"),
            (" \n", "holds no token"),
            ("short", "at least 16"),
            ("two words of a token", "one word"),
            ("token\u{7f}0123456789abcdef", "one word"),
            ("tökén0123456789abcdef", "one word"),
        ] {
            let err = AdminToken::new(text).unwrap_err();
            assert!(err.contains(expected), "{text:?}: {err}");
            if !text.trim().is_empty() {
                assert!(!err.contains(text.trim()), "{err}");
            }
        }
        let token = AdminToken::new(TOKEN).unwrap();
        assert!(!format!("{token:?}").contains(TOKEN));
    }
}
