//! The operator's dashboard: one page (`GET /dashboard`) and its script and style, built into
//! the binary (`include_str!`: no CDN, no build step). The page holds no data: its script
//! reads the same read-only API the CLI reads (`/v1/status`, `/v1/nodes`, `/v1/history`)
//! every 2 s and draws it (see `dashboard/app.js`).
//!
//! So these three routes need no token on the TCP listener, while every API route behind them
//! still does: the page takes the bearer token from its address's fragment (`#token=...`,
//! which a browser never sends to a server, so no request line or log holds it) and sends it
//! as `Authorization: Bearer`. A strict Content-Security-Policy lets the page load nothing but
//! its own script and style and talk to nothing but its own origin.

use axum::Router;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;

/// The page's path; its assets live under it.
pub const PATH: &str = "/dashboard";

const INDEX: &str = include_str!("dashboard/index.html");
const SCRIPT: &str = include_str!("dashboard/app.js");
const STYLE: &str = include_str!("dashboard/app.css");

/// Only this origin's script and style, fetches to this origin only, no framing.
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; \
    frame-ancestors 'none'";

/// The page and its assets (no state: they are the same for every request).
pub fn routes() -> Router {
    Router::new()
        .route(
            PATH,
            get(|| async { asset("text/html; charset=utf-8", INDEX) }),
        )
        .route(
            "/dashboard/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", SCRIPT) }),
        )
        .route(
            "/dashboard/app.css",
            get(|| async { asset("text/css; charset=utf-8", STYLE) }),
        )
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, POLICY),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}
