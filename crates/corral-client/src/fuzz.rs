//! Entry point for the fuzz target `client_response` (`fuzz/fuzz_targets/`) and its corpus
//! replay (`tests/fuzz_corpus.rs`): arbitrary bytes as what the agent sent back, read as the
//! client reads a connection (responses one after another while the connection is reusable,
//! delivered in pieces), and each body decoded as the client decodes answers and refusals.

use std::io::{self, Read};

use corral_api::{AllocateResponse, DumpResponse, GcResponse, PoolsResponse, StatusResponse};

use crate::http::read_response;
use crate::{decode, refusal};

/// A stream that hands out at most `piece` bytes per read, as a socket may.
struct Pieces<'a> {
    data: &'a [u8],
    piece: usize,
}

impl Read for Pieces<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = buf.len().min(self.piece).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

/// The first byte chooses the size of the pieces the rest arrives in (0: all at once).
pub fn response(data: &[u8]) {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let piece = match first % 17 {
        0 => usize::MAX,
        n => usize::from(n),
    };
    let mut stream = Pieces { data: rest, piece };
    // A connection carries a few responses at most before the client gives it up.
    for _ in 0..8 {
        let before = stream.data.len();
        let Ok(response) = read_response(&mut stream) else {
            return;
        };
        let consumed = before - stream.data.len();
        assert!(
            response.body.len() <= consumed,
            "a body of {} bytes from {consumed} bytes read",
            response.body.len()
        );
        // Three digits, but not always a valid status: RFC 9110 section 15 has a client treat
        // one outside 100..=599 (`099` passes httparse) as a server error, as a non-2xx is.
        assert!(
            response.status < 1000,
            "status {} is not three digits",
            response.status
        );
        if (200..300).contains(&response.status) {
            let _ = decode::<AllocateResponse>("fuzz", &response.body);
            let _ = decode::<StatusResponse>("fuzz", &response.body);
            let _ = decode::<DumpResponse>("fuzz", &response.body);
            let _ = decode::<PoolsResponse>("fuzz", &response.body);
            let _ = decode::<GcResponse>("fuzz", &response.body);
        } else {
            let _ = refusal(response.status, &response.body).to_string();
        }
        if !response.reusable || stream.data.is_empty() {
            return;
        }
    }
}
