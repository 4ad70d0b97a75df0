//! The bodies both daemons answer alike: the OpenAPI document they serve verbatim, their
//! metrics in the OpenMetrics text format, and the messages of their fallbacks (an unknown
//! path, a known path with another method).

use axum::http::header;
use axum::response::{IntoResponse, Response};

/// The content type of `GET /metrics`, OpenMetrics 1.0.0 text.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The message of a 404 for a path neither router knows.
pub const NO_SUCH_PATH: &str = "no such path; see /openapi.json";

/// The message of a 405 for a known path asked with another method.
pub const OTHER_METHOD: &str = "this path exists with another method; see /openapi.json";

/// A JSON document (the daemon's OpenAPI document, built into it) served as it is.
pub fn json_document(document: &'static str) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], document).into_response()
}

/// Metrics text (the caller's, ending in `# EOF`) served as OpenMetrics.
pub fn openmetrics(text: String) -> Response {
    ([(header::CONTENT_TYPE, OPENMETRICS)], text).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_body_says_what_it_is() {
        let response = json_document("{}");
        assert_eq!(response.headers()[header::CONTENT_TYPE], "application/json");
        let response = openmetrics("# EOF\n".to_owned());
        assert_eq!(response.headers()[header::CONTENT_TYPE], OPENMETRICS);
    }
}
