//! The bearer token a TCP listener requires: `Authorization: Bearer <token>`, the scheme's
//! name in any case, the token compared in constant time.

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
}
