//! The bearer token a TCP listener requires: `Authorization: Bearer <token>`, the scheme's
//! name in any case, the token compared in constant time. The token itself is a
//! [`BearerToken`]: read from a file only others cannot read (as ssh refuses a private key),
//! and never shown by `Debug`, so no configuration dump or error logs it.

use std::fmt;
use std::io::Read as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::sync::Arc;

use axum::Router;
use axum::extract::Request;
use axum::http::header;
use axum::middleware::{self, Next};
use axum::response::Response;

/// `router` behind the bearer token `token`: a request without it gets `refusal()` (each
/// daemon's own 401 answer) and reaches no route.
pub fn with_token(
    router: Router,
    token: Arc<str>,
    refusal: impl Fn() -> Response + Clone + Send + Sync + 'static,
) -> Router {
    router.layer(middleware::from_fn(move |req: Request, next: Next| {
        let token = Arc::clone(&token);
        let refusal = refusal.clone();
        async move {
            let given = req
                .headers()
                .get(header::AUTHORIZATION)
                .and_then(|v| bearer_credentials(v.as_bytes()));
            if given.is_some_and(|g| constant_time_eq(g, token.as_bytes())) {
                next.run(req).await
            } else {
                refusal()
            }
        }
    }))
}

/// The shortest bearer token accepted.
pub const MIN_TOKEN_LEN: usize = 16;

/// A daemon's bearer token. `Debug` prints `BearerToken(***)`: a configuration printed with
/// `{:?}` or carried in an error shows that there is a token, never what it is.
#[derive(Clone, PartialEq, Eq)]
pub struct BearerToken(String);

impl BearerToken {
    /// A token given whole (`CORRAL_TOKEN`, a test).
    pub fn new(token: impl Into<String>) -> BearerToken {
        BearerToken(token.into())
    }

    /// Reads the token file at `path` (its content trimmed). Refused, each with a message
    /// naming the file: a file that cannot be read, one that others may read or write (group
    /// or other permission bits: `mode & 0o077`, as ssh refuses a private key, the mode
    /// checked on the file opened, so a swap between the check and the read changes
    /// nothing), and a token shorter than [`MIN_TOKEN_LEN`] characters.
    pub fn read_file(path: &Path) -> Result<BearerToken, String> {
        let cannot = |e: std::io::Error| format!("cannot read token file {}: {e}", path.display());
        let mut file = std::fs::File::open(path).map_err(cannot)?;
        let mode = file.metadata().map_err(cannot)?.permissions().mode() & 0o7777;
        if mode & 0o077 != 0 {
            return Err(format!(
                "token file {} is readable by others (mode {mode:04o}): chmod 600 it",
                path.display()
            ));
        }
        let mut text = String::new();
        file.read_to_string(&mut text).map_err(cannot)?;
        let token = text.trim().to_owned();
        if token.len() < MIN_TOKEN_LEN {
            return Err(format!(
                "token in {} is shorter than {MIN_TOKEN_LEN} characters",
                path.display()
            ));
        }
        Ok(BearerToken(token))
    }

    /// The token, for the listener that compares it.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("BearerToken(***)")
    }
}

/// The credentials of an `Authorization: Bearer <token>` header. The scheme's name is
/// case-insensitive (RFC 7235 section 2.1, RFC 6750 section 2.1), so `bearer` and `BEARER`
/// are the same scheme; one or more spaces separate it from the token.
fn bearer_credentials(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(b"bearer".len())?;
    if !scheme.eq_ignore_ascii_case(b"bearer") || rest.first() != Some(&b' ') {
        return None;
    }
    let token = rest.trim_ascii_start();
    (!token.is_empty()).then_some(token)
}

/// Equality whose time does not depend on where the inputs differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scheme_in_any_case_then_spaces_then_the_token() {
        assert_eq!(bearer_credentials(b"Bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer_credentials(b"bEARER   abc"), Some(&b"abc"[..]));
        assert_eq!(bearer_credentials(b"Bearer"), None);
        assert_eq!(bearer_credentials(b"Bearer "), None);
        assert_eq!(bearer_credentials(b"Bearerabc"), None);
        assert_eq!(bearer_credentials(b"Basic abc"), None);
    }

    #[test]
    fn equal_only_when_every_byte_is() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secrets"));
        assert!(!constant_time_eq(b"", b"x"));
    }

    fn token_file(dir: &Path, mode: u32, text: &str) -> std::path::PathBuf {
        let path = dir.join(format!("token-{mode:o}"));
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        path
    }

    #[test]
    fn a_token_file_others_can_read_or_write_is_refused_naming_it_and_its_mode() {
        let dir = tempfile::tempdir().unwrap();
        for mode in [0o644, 0o640, 0o604, 0o620, 0o602, 0o660, 0o666] {
            let path = token_file(dir.path(), mode, "a-token-of-enough-length");
            assert_eq!(
                BearerToken::read_file(&path).unwrap_err(),
                format!(
                    "token file {} is readable by others (mode {mode:04o}): chmod 600 it",
                    path.display()
                )
            );
        }
        for mode in [0o600, 0o400] {
            let path = token_file(dir.path(), mode, " a-token-of-enough-length\n");
            let token = BearerToken::read_file(&path).unwrap();
            assert_eq!(token.as_str(), "a-token-of-enough-length");
        }
    }

    #[test]
    fn a_short_or_missing_token_file_keeps_its_message() {
        let dir = tempfile::tempdir().unwrap();
        let short = token_file(dir.path(), 0o600, "short");
        assert_eq!(
            BearerToken::read_file(&short).unwrap_err(),
            format!("token in {} is shorter than 16 characters", short.display())
        );
        let missing = dir.path().join("missing");
        let error = BearerToken::read_file(&missing).unwrap_err();
        assert!(
            error.starts_with(&format!("cannot read token file {}: ", missing.display())),
            "{error}"
        );
    }

    #[test]
    fn debug_never_shows_the_token() {
        let token = BearerToken::new("never-shown-0123456789");
        let shown = format!("{token:?} {:?}", Some(&token));
        assert!(!shown.contains("never-shown"), "{shown}");
        assert_eq!(format!("{token:?}"), "BearerToken(***)");
    }
}
