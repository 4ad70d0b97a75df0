//! One HTTP/1.1 exchange written and read by hand on a fresh connection (`Connection: close`),
//! for the tests that speak to the agent's API below any client: `api.rs` on the unix socket,
//! `schemathesis.rs` on TCP. Included by path, apart from the cluster harness.

use std::io::{Read, Write};

/// Writes `head` (the request line and headers, through the blank line) and `body` on
/// `stream`, reads the whole response; its status and body.
pub fn exchange(mut stream: impl Read + Write, head: &str, body: Option<&[u8]>) -> (u16, String) {
    stream.write_all(head.as_bytes()).unwrap();
    if let Some(body) = body {
        stream.write_all(body).unwrap();
    }
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status: u16 = response[9..12].parse().unwrap();
    let (_, body) = response.split_once("\r\n\r\n").unwrap();
    // Axum answers with Content-Length; a chunked body would need decoding here.
    assert!(
        !response
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked"),
        "{response}"
    );
    (status, body.to_owned())
}
