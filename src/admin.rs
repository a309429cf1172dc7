//! The operator's pages (`/metrics`, `/ring`, `/runtime_config`, `/distributor/ha_tracker`)
//! list every tenant and its limits, so they can be kept from clients: on a listener of their
//! own (`--admin-addr`, wired in [`crate::server`]) and/or behind a bearer token
//! (`--admin-token-file`, checked here).
//!
//! The token is kept only as its BLAKE2b digest, and a presented token is compared digest to
//! digest in constant time, so neither its content nor its length shows in the answer's
//! timing. Neither the token nor what a client presents is ever logged.
//!
//! The file is re-read by the same periodic task as the credentials file and the certificates
//! (every `--runtime-config-period`, in [`crate::server`]): a changed token is in force at the
//! next check, and the old one answers 403 from then on. A bad or unreadable file keeps the
//! last good token in force (logged once, counted in `weir_admin_token_reloads_total`).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use blake2::{Blake2b512, Digest};
use subtle::ConstantTimeEq;

use crate::metrics::Metrics;

/// Shorter tokens are refused at start-up: `openssl rand -hex 32` makes a good one.
pub const MIN_TOKEN_LENGTH: usize = 16;

/// Longest token file read: a token is one word; anything this long is not a token file.
const MAX_FILE_BYTES: u64 = 64 << 10;

/// The bearer token `--admin-token-file` holds, as its digest; swapped when the file changes.
pub struct AdminToken {
    digest: ArcSwap<[u8; 64]>,
    /// The file and what was last seen in it; `None` for a token made from text.
    file: Option<TokenFile>,
}

struct TokenFile {
    path: PathBuf,
    /// The digest of the bytes last looked at, good or bad (an unchanged file is not parsed
    /// again, and a bad one is logged once), or the read error last logged.
    last_seen: Mutex<Seen>,
    reloads: prometheus::IntCounterVec,
    last_reload_successful: prometheus::IntGauge,
}

#[derive(PartialEq, Eq)]
enum Seen {
    Content([u8; 64]),
    ReadError(String),
}

/// Why a request for an operator's page was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denied {
    /// No `Authorization: Bearer …` header: 401.
    NoToken,
    /// A bearer token, not this one: 403.
    WrongToken,
}

/// The token in `text` (a file's contents), surrounding whitespace ignored, as its digest. It
/// must be one word of visible ASCII (what a bearer token in a header can carry), at least
/// [`MIN_TOKEN_LENGTH`] long. Errors never repeat the token.
fn parse(text: &str) -> Result<[u8; 64], String> {
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
    Ok(digest(token.as_bytes()))
}

fn parse_bytes(bytes: &[u8]) -> Result<[u8; 64], String> {
    parse(std::str::from_utf8(bytes).map_err(|_| "not UTF-8".to_string())?)
}

impl AdminToken {
    /// The token in `text`; see [`parse`]. Not reloaded (for tests and embedding).
    pub fn new(text: &str) -> Result<AdminToken, String> {
        Ok(AdminToken {
            digest: ArcSwap::from_pointee(parse(text)?),
            file: None,
        })
    }

    /// The token in `path` (`--admin-token-file`): a missing or bad file is an error (fatal at
    /// start-up). Later changes are picked up by [`AdminToken::reload_if_changed`].
    pub fn from_file(path: &Path, metrics: &Metrics) -> anyhow::Result<AdminToken> {
        let bytes = crate::auth::read_limited(path, MAX_FILE_BYTES).map_err(|err| {
            anyhow::anyhow!("cannot read --admin-token-file {}: {err}", path.display())
        })?;
        let token = parse_bytes(&bytes)
            .map_err(|why| anyhow::anyhow!("--admin-token-file {}: {why}", path.display()))?;
        metrics.admin_token_reloads.with_label_values(&["ok"]).inc();
        metrics.admin_token_last_reload_successful.set(1);
        Ok(AdminToken {
            digest: ArcSwap::from_pointee(token),
            file: Some(TokenFile {
                path: path.to_path_buf(),
                last_seen: Mutex::new(Seen::Content(digest(&bytes))),
                reloads: metrics.admin_token_reloads.clone(),
                last_reload_successful: metrics.admin_token_last_reload_successful.clone(),
            }),
        })
    }

    /// Re-reads the file if its content changed: a good token replaces the one in force; a
    /// bad or unreadable file is logged (once, never its content) and the last good token
    /// stays.
    pub fn reload_if_changed(&self) {
        let Some(file) = &self.file else {
            return;
        };
        let path = file.path.display();
        let mut last = file.last_seen.lock().unwrap_or_else(|err| err.into_inner());
        let bytes = match crate::auth::read_limited(&file.path, MAX_FILE_BYTES) {
            Ok(bytes) => bytes,
            Err(err) => {
                let seen = Seen::ReadError(err.to_string());
                if *last != seen {
                    *last = seen;
                    file.reloads.with_label_values(&["error"]).inc();
                    tracing::error!(%path, %err, "cannot read --admin-token-file; the last good admin token stays in force");
                }
                file.last_reload_successful.set(0);
                return;
            }
        };
        let seen = Seen::Content(digest(&bytes));
        if *last == seen {
            return;
        }
        *last = seen;
        match parse_bytes(&bytes) {
            Ok(token) => {
                self.digest.store(Arc::new(token));
                file.reloads.with_label_values(&["ok"]).inc();
                file.last_reload_successful.set(1);
                tracing::info!(%path, "admin token reloaded");
            }
            Err(why) => {
                file.reloads.with_label_values(&["error"]).inc();
                file.last_reload_successful.set(0);
                tracing::error!(%path, err = %why, "--admin-token-file is invalid; the last good admin token stays in force");
            }
        }
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
        if bool::from(digest(presented.as_bytes()).ct_eq(&**self.digest.load())) {
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

    #[test]
    fn a_changed_file_replaces_the_token_and_a_bad_one_keeps_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("admin-token");
        std::fs::write(&path, format!("{TOKEN}\n")).unwrap();
        let metrics = Metrics::new();
        let token = AdminToken::from_file(&path, &metrics).unwrap();
        let ok = |token: &AdminToken, presented: &str| {
            token.check(&headers(Some(&format!("Bearer {presented}"))))
        };
        let reloads = |outcome: &str| {
            metrics
                .admin_token_reloads
                .with_label_values(&[outcome])
                .get()
        };
        assert_eq!(ok(&token, TOKEN), Ok(()));
        assert_eq!(reloads("ok"), 1);
        token.reload_if_changed();
        assert_eq!(reloads("ok"), 1, "an unchanged file is not loaded again");

        let rotated = "rotated-0123456789abcdef-admin";
        std::fs::write(&path, rotated).unwrap();
        token.reload_if_changed();
        assert_eq!(ok(&token, rotated), Ok(()));
        assert_eq!(ok(&token, TOKEN), Err(Denied::WrongToken));
        assert_eq!(reloads("ok"), 2);

        for bad in ["short", ""] {
            std::fs::write(&path, bad).unwrap();
            token.reload_if_changed();
            token.reload_if_changed();
            assert_eq!(ok(&token, rotated), Ok(()), "the last good token stays");
        }
        assert_eq!(reloads("error"), 2, "each bad content counted once");
        assert_eq!(metrics.admin_token_last_reload_successful.get(), 0);
        std::fs::remove_file(&path).unwrap();
        token.reload_if_changed();
        token.reload_if_changed();
        assert_eq!(reloads("error"), 3);
        assert_eq!(ok(&token, rotated), Ok(()));
        std::fs::write(&path, TOKEN).unwrap();
        token.reload_if_changed();
        assert_eq!(ok(&token, TOKEN), Ok(()));
        assert_eq!(metrics.admin_token_last_reload_successful.get(), 1);
    }
}
