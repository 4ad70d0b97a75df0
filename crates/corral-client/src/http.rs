//! HTTP/1.1 on a byte stream: encoding one request, and reading one response — its head
//! parsed by `httparse`, its body framed by `Content-Length`, by the chunked coding, or by the
//! end of the stream.

use std::io::{self, Read};

use httparse::Status;

/// The longest response head (status line and headers) accepted.
const MAX_HEAD_BYTES: usize = 64 * 1024;
/// The most headers a response head (or a chunked body's trailer) may have.
const MAX_HEADERS: usize = 64;
/// The largest response body accepted: a dump of many thousand allocations fits easily.
pub(crate) const MAX_BODY_BYTES: usize = 256 << 20;
/// How much is read from the stream at a time.
const READ_CHUNK: usize = 16 * 1024;

/// The request methods the API uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Method {
    Get,
    Post,
    Delete,
}

/// One request's bytes, ready to be written in one go.
pub(crate) fn encode_request(
    method: Method,
    path: &str,
    host: &str,
    bearer_token: Option<&str>,
    json_body: Option<&[u8]>,
) -> Vec<u8> {
    let method = match method {
        Method::Get => "GET",
        Method::Post => "POST",
        Method::Delete => "DELETE",
    };
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: corral-client/{}\r\n",
        env!("CARGO_PKG_VERSION")
    );
    if let Some(token) = bearer_token {
        head.push_str(&format!("Authorization: Bearer {token}\r\n"));
    }
    if let Some(body) = json_body {
        head.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    head.push_str("\r\n");
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(json_body.unwrap_or_default());
    bytes
}

/// A complete response.
#[derive(Debug)]
pub(crate) struct Response {
    pub status: u16,
    pub body: Vec<u8>,
    /// Whether the connection can carry the next request: HTTP/1.1 without `Connection:
    /// close`, a body not framed by the end of the stream, and nothing left over after it.
    pub reusable: bool,
}

/// Why no response could be read.
#[derive(Debug)]
pub(crate) enum ReadError {
    /// The stream failed or ended (`UnexpectedEof`); `received` bytes of the response had
    /// arrived by then.
    Io { error: io::Error, received: usize },
    /// The bytes are not an HTTP/1.x response, or break a limit.
    Malformed(String),
}

impl From<String> for ReadError {
    fn from(message: String) -> ReadError {
        ReadError::Malformed(message)
    }
}

/// What the head of a response says.
#[derive(Debug, PartialEq, Eq)]
struct Head {
    status: u16,
    framing: Framing,
    keep_alive: bool,
}

/// How the body of a response is delimited.
#[derive(Debug, PartialEq, Eq)]
enum Framing {
    None,
    Length(u64),
    Chunked,
    UntilEof,
}

/// Parses a response head from the start of `bytes`: `Ok(None)` while it is incomplete,
/// else its length and meaning.
fn parse_head(bytes: &[u8]) -> Result<Option<(usize, Head)>, String> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut headers);
    let head_len = match response.parse(bytes) {
        Ok(Status::Complete(head_len)) => head_len,
        Ok(Status::Partial) => return Ok(None),
        Err(error) => return Err(format!("bad response head: {error}")),
    };
    let (Some(version), Some(status)) = (response.version, response.code) else {
        return Err("bad response head: no version or status".to_owned());
    };

    let mut content_length: Option<u64> = None;
    let mut transfer_codings: Vec<String> = Vec::new();
    let mut connection_close = false;
    let mut connection_keep_alive = false;
    for header in response.headers.iter() {
        let value = std::str::from_utf8(header.value)
            .map_err(|_| format!("header {} is not UTF-8", header.name))?;
        if header.name.eq_ignore_ascii_case("content-length") {
            let value = value.trim();
            let length = value
                .parse::<u64>()
                .ok()
                .filter(|_| value.bytes().all(|b| b.is_ascii_digit()))
                .ok_or_else(|| format!("bad Content-Length {value:?}"))?;
            if content_length.is_some_and(|previous| previous != length) {
                return Err("conflicting Content-Length headers".to_owned());
            }
            content_length = Some(length);
        } else if header.name.eq_ignore_ascii_case("transfer-encoding") {
            transfer_codings.extend(
                value
                    .split(',')
                    .map(|coding| coding.trim().to_ascii_lowercase())
                    .filter(|coding| !coding.is_empty()),
            );
        } else if header.name.eq_ignore_ascii_case("connection") {
            for option in value.split(',').map(str::trim) {
                connection_close |= option.eq_ignore_ascii_case("close");
                connection_keep_alive |= option.eq_ignore_ascii_case("keep-alive");
            }
        }
    }

    // RFC 9112 section 6.3: these statuses never have a body; a transfer coding outranks
    // Content-Length; a response whose coding does not end in chunked, or that declares no
    // length, runs to the end of the stream.
    let framing = if (100..200).contains(&status) || status == 204 || status == 304 {
        Framing::None
    } else if !transfer_codings.is_empty() {
        if transfer_codings
            .last()
            .is_some_and(|last| last == "chunked")
        {
            Framing::Chunked
        } else {
            Framing::UntilEof
        }
    } else if let Some(length) = content_length {
        Framing::Length(length)
    } else {
        Framing::UntilEof
    };
    let persistent = if version >= 1 {
        !connection_close
    } else {
        connection_keep_alive && !connection_close
    };
    let keep_alive = persistent && framing != Framing::UntilEof && transfer_codings.len() <= 1;
    Ok(Some((
        head_len,
        Head {
            status,
            framing,
            keep_alive,
        },
    )))
}

/// Bytes read from a stream and not yet consumed.
struct Incoming<'a, S> {
    stream: &'a mut S,
    buffer: Vec<u8>,
    /// Where the unconsumed bytes start in `buffer`.
    start: usize,
    /// Bytes read from the stream so far.
    received: usize,
}

impl<S: Read> Incoming<'_, S> {
    fn available(&self) -> &[u8] {
        self.buffer.get(self.start..).unwrap_or_default()
    }

    fn consume(&mut self, n: usize) {
        self.start = (self.start + n).min(self.buffer.len());
    }

    /// Reads more; `false` at the end of the stream.
    fn fill(&mut self) -> Result<bool, ReadError> {
        if self.start > 0 && self.start * 2 >= self.buffer.len() {
            self.buffer.drain(..self.start);
            self.start = 0;
        }
        let old_len = self.buffer.len();
        self.buffer.resize(old_len + READ_CHUNK, 0);
        loop {
            match self.stream.read(&mut self.buffer[old_len..]) {
                Ok(n) => {
                    self.buffer.truncate(old_len + n);
                    self.received += n;
                    return Ok(n > 0);
                }
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => {
                    self.buffer.truncate(old_len);
                    return Err(ReadError::Io {
                        error,
                        received: self.received,
                    });
                }
            }
        }
    }

    /// Reads more, failing at the end of the stream.
    fn fill_or_eof(&mut self, expecting: &str) -> Result<(), ReadError> {
        if self.fill()? {
            Ok(())
        } else {
            Err(ReadError::Io {
                error: io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("the connection closed before {expecting}"),
                ),
                received: self.received,
            })
        }
    }

    /// Appends the next `n` bytes to `body`.
    fn take_into(&mut self, n: usize, body: &mut Vec<u8>) -> Result<(), ReadError> {
        let mut remaining = n;
        while remaining > 0 {
            if self.available().is_empty() {
                self.fill_or_eof("the end of the response body")?;
            }
            let here = self.available().len().min(remaining);
            body.extend_from_slice(&self.available()[..here]);
            self.consume(here);
            remaining -= here;
        }
        Ok(())
    }
}

/// Reads one response from `stream`, skipping interim (1xx) responses.
pub(crate) fn read_response(stream: &mut impl Read) -> Result<Response, ReadError> {
    let mut incoming = Incoming {
        stream,
        buffer: Vec::with_capacity(READ_CHUNK),
        start: 0,
        received: 0,
    };
    let head = loop {
        match parse_head(incoming.available())? {
            Some((head_len, head)) => {
                incoming.consume(head_len);
                // 101 would switch protocols, which the API never asks for.
                if (100..200).contains(&head.status) && head.status != 101 {
                    continue;
                }
                break head;
            }
            None if incoming.available().len() > MAX_HEAD_BYTES => {
                return Err(format!("response head longer than {MAX_HEAD_BYTES} bytes").into());
            }
            None => incoming.fill_or_eof("a complete response head")?,
        }
    };

    let mut body = Vec::new();
    match head.framing {
        Framing::None => {}
        Framing::Length(length) => {
            let length = usize::try_from(length)
                .ok()
                .filter(|&length| length <= MAX_BODY_BYTES)
                .ok_or_else(|| format!("response body of {length} bytes is too large"))?;
            body.reserve(length.min(READ_CHUNK * 64));
            incoming.take_into(length, &mut body)?;
        }
        Framing::Chunked => read_chunked(&mut incoming, &mut body)?,
        Framing::UntilEof => loop {
            let here = incoming.available().len();
            if body.len() + here > MAX_BODY_BYTES {
                return Err(format!("response body over {MAX_BODY_BYTES} bytes").into());
            }
            body.extend_from_slice(incoming.available());
            incoming.consume(here);
            if !incoming.fill()? {
                break;
            }
        },
    }
    Ok(Response {
        status: head.status,
        body,
        reusable: head.keep_alive && incoming.available().is_empty(),
    })
}

/// Decodes a chunked body (RFC 9112 section 7.1) into `body`: size lines (with any
/// extensions), data each followed by CRLF, a last chunk of size 0, then trailer fields up to
/// an empty line, which are read and ignored.
fn read_chunked<S: Read>(
    incoming: &mut Incoming<'_, S>,
    body: &mut Vec<u8>,
) -> Result<(), ReadError> {
    loop {
        let size = match httparse::parse_chunk_size(incoming.available()) {
            Ok(Status::Complete((line_len, size))) => {
                incoming.consume(line_len);
                size
            }
            Ok(Status::Partial) if incoming.available().len() > MAX_HEAD_BYTES => {
                return Err("chunk size line too long".to_owned().into());
            }
            Ok(Status::Partial) => {
                incoming.fill_or_eof("the next chunk size")?;
                continue;
            }
            Err(httparse::InvalidChunkSize) => {
                return Err("bad chunk size line".to_owned().into());
            }
        };
        if size == 0 {
            break;
        }
        let size = usize::try_from(size)
            .ok()
            .filter(|&size| size <= MAX_BODY_BYTES.saturating_sub(body.len()))
            .ok_or_else(|| format!("chunked response body over {MAX_BODY_BYTES} bytes"))?;
        incoming.take_into(size, body)?;
        while incoming.available().len() < 2 {
            incoming.fill_or_eof("the end of a chunk")?;
        }
        if !incoming.available().starts_with(b"\r\n") {
            return Err("chunk data not followed by CRLF".to_owned().into());
        }
        incoming.consume(2);
    }
    loop {
        let mut trailers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        match httparse::parse_headers(incoming.available(), &mut trailers) {
            Ok(Status::Complete((trailer_len, _))) => {
                incoming.consume(trailer_len);
                return Ok(());
            }
            Ok(Status::Partial) if incoming.available().len() > MAX_HEAD_BYTES => {
                return Err("chunked trailer too long".to_owned().into());
            }
            Ok(Status::Partial) => incoming.fill_or_eof("the end of the chunked body")?,
            Err(error) => return Err(format!("bad chunked trailer: {error}").into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(bytes: &[u8]) -> Result<Response, ReadError> {
        read_response(&mut &bytes[..])
    }

    fn body_of(bytes: &[u8]) -> Vec<u8> {
        match read(bytes) {
            Ok(response) => response.body,
            Err(error) => panic!("{error:?}"),
        }
    }

    fn malformed(bytes: &[u8]) -> String {
        match read(bytes) {
            Err(ReadError::Malformed(message)) => message,
            other => panic!("expected a malformed response, got {other:?}"),
        }
    }

    #[test]
    fn request_with_body_has_length_and_type() {
        let bytes = encode_request(Method::Post, "/v1/x", "localhost", Some("t0k"), Some(b"{}"));
        let text = String::from_utf8(bytes).unwrap();
        assert!(text.starts_with("POST /v1/x HTTP/1.1\r\nHost: localhost\r\n"));
        assert!(text.contains("\r\nAuthorization: Bearer t0k\r\n"));
        assert!(text.contains("\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"));
        assert!(text.ends_with("\r\n\r\n{}"));
    }

    #[test]
    fn chunked_with_extensions_and_trailers() {
        let response = read(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\
              3;name=value\r\nabc\r\nA\r\n0123456789\r\n0\r\nX-Trailer: 1\r\n\r\n",
        )
        .unwrap();
        assert_eq!(response.body, b"abc0123456789");
        assert!(response.reusable);
    }

    #[test]
    fn chunked_outranks_content_length_and_closes() {
        let response = read(
            b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\nTransfer-Encoding: gzip, chunked\r\n\r\n\
              2\r\nhi\r\n0\r\n\r\n",
        )
        .unwrap();
        assert_eq!(response.body, b"hi");
        // Two codings: a coding corral does not decode was applied, so do not reuse.
        assert!(!response.reusable);
    }

    #[test]
    fn bad_chunks_are_malformed() {
        let head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        for tail in [
            &b"zz\r\nab\r\n0\r\n\r\n"[..],
            b"2\r\nabXY0\r\n\r\n",
            b"ffffffffffffffffff\r\n",
            b"2\r\nab\r\n0\r\nnot a header\r\n\r\n",
        ] {
            let bytes = [head.as_slice(), tail].concat();
            malformed(&bytes);
        }
    }

    #[test]
    fn truncated_chunked_body_is_an_eof() {
        let bytes = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab";
        match read(bytes) {
            Err(ReadError::Io { error, received }) => {
                assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof);
                assert_eq!(received, bytes.len());
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn no_length_reads_to_the_end() {
        let response = read(b"HTTP/1.1 200 OK\r\n\r\nall of it").unwrap();
        assert_eq!(response.body, b"all of it");
        assert!(!response.reusable);
    }

    #[test]
    fn interim_responses_are_skipped() {
        let response = read(
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok",
        )
        .unwrap();
        assert_eq!(
            (response.status, response.body.as_slice()),
            (201, &b"ok"[..])
        );
    }

    #[test]
    fn no_content_has_no_body() {
        let response = read(b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n").unwrap();
        assert!(response.body.is_empty());
        assert!(response.reusable);
    }

    #[test]
    fn connection_close_and_http_1_0_are_not_reused() {
        assert!(
            !read(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
                .unwrap()
                .reusable
        );
        assert!(
            !read(b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n")
                .unwrap()
                .reusable
        );
        assert!(
            read(b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n")
                .unwrap()
                .reusable
        );
        // Bytes after the body: something is off, do not read the next answer from them.
        assert!(
            !read(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\nextra")
                .unwrap()
                .reusable
        );
    }

    #[test]
    fn bad_heads_are_malformed() {
        malformed(b"hello\r\n\r\n");
        malformed(b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n");
        malformed(b"HTTP/1.1 200 OK\r\nContent-Length: +1\r\n\r\nx");
        malformed(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nxx");
        malformed(b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999999\r\n\r\n");
        malformed(b"HTTP/1.1 200 OK\r\nX: \xff\r\nContent-Length: 0\r\n\r\n");
        let many_headers = "X: y\r\n".repeat(MAX_HEADERS + 1);
        malformed(format!("HTTP/1.1 200 OK\r\n{many_headers}\r\n").as_bytes());
        let long_header = format!("HTTP/1.1 200 OK\r\nX: {}", "y".repeat(MAX_HEAD_BYTES + 10));
        malformed(long_header.as_bytes());
    }

    #[test]
    fn repeated_equal_lengths_are_accepted() {
        assert_eq!(
            body_of(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\ncontent-length: 2\r\n\r\nok"),
            b"ok"
        );
    }
}
