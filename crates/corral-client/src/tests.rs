//! Client tests against a scripted fake agent: a thread on a unix socket (or TCP) that reads
//! each request and writes canned bytes, so every framing and failure is exercised for real.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::mpsc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use corral_api::{
    AllocateRequest, ErrorCode, FamilyChoice, FamilyName, LeaseStartRequest, NODE_SCOPE,
    RangeRemoval, RangeRequest,
};

use super::*;

/// What the fake agent does after reading a request.
enum Reply {
    /// Writes these bytes.
    Send(Vec<u8>),
    /// Writes these bytes a few at a time, pausing between writes.
    Trickle(Vec<u8>),
    /// Closes the connection without answering.
    Close,
    /// Answers nothing for this long, then closes.
    Hang(Duration),
}

/// One request as the fake agent read it.
#[derive(Debug)]
struct Recorded {
    /// Which accepted connection it came on, from 0.
    connection: usize,
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Recorded {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }
}

struct FakeAgent {
    _dir: tempfile::TempDir,
    socket: PathBuf,
    /// Receives the index of each connection once the fake agent has closed it.
    closed: mpsc::Receiver<usize>,
    thread: JoinHandle<Vec<Recorded>>,
}

impl FakeAgent {
    /// Serves one script per connection, in order: each connection reads a request, then
    /// does the next reply, until its script ends; then it is closed.
    fn unix(script: Vec<Vec<Reply>>) -> FakeAgent {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("agent.sock");
        let listener = UnixListener::bind(&socket).unwrap();
        let (closed_sender, closed) = mpsc::channel();
        let thread = thread::spawn(move || {
            serve(
                || listener.accept().map(|(stream, _)| stream).unwrap(),
                script,
                closed_sender,
            )
        });
        FakeAgent {
            _dir: dir,
            socket,
            closed,
            thread,
        }
    }

    fn client(&self) -> Client {
        Client::unix(&self.socket)
    }

    fn wait_closed(&self) -> usize {
        self.closed.recv_timeout(Duration::from_secs(10)).unwrap()
    }

    fn requests(self) -> Vec<Recorded> {
        self.thread.join().unwrap()
    }
}

fn serve<S: Read + Write>(
    mut accept: impl FnMut() -> S,
    script: Vec<Vec<Reply>>,
    closed: mpsc::Sender<usize>,
) -> Vec<Recorded> {
    let mut recorded = Vec::new();
    for (connection, replies) in script.into_iter().enumerate() {
        let mut stream = accept();
        let mut buffer = Vec::new();
        for reply in replies {
            let Some(request) = read_request(&mut stream, &mut buffer, connection) else {
                break;
            };
            recorded.push(request);
            match reply {
                Reply::Send(bytes) => stream.write_all(&bytes).unwrap(),
                Reply::Trickle(bytes) => {
                    for piece in bytes.chunks(3) {
                        stream.write_all(piece).unwrap();
                        stream.flush().unwrap();
                        thread::sleep(Duration::from_millis(1));
                    }
                }
                Reply::Close => break,
                Reply::Hang(duration) => {
                    thread::sleep(duration);
                    break;
                }
            }
        }
        drop(stream);
        let _ = closed.send(connection);
    }
    recorded
}

/// Reads one request (head and `Content-Length` body); `None` at the end of the stream.
fn read_request(
    stream: &mut impl Read,
    buffer: &mut Vec<u8>,
    connection: usize,
) -> Option<Recorded> {
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut request = httparse::Request::new(&mut headers);
        if let httparse::Status::Complete(head_len) = request.parse(buffer).unwrap() {
            let headers: Vec<(String, String)> = request
                .headers
                .iter()
                .map(|h| {
                    (
                        h.name.to_owned(),
                        String::from_utf8(h.value.to_vec()).unwrap(),
                    )
                })
                .collect();
            let method = request.method.unwrap().to_owned();
            let path = request.path.unwrap().to_owned();
            let length: usize = headers
                .iter()
                .find(|(name, _)| name.eq_ignore_ascii_case("content-length"))
                .map_or(0, |(_, value)| value.parse().unwrap());
            while buffer.len() < head_len + length {
                let mut chunk = [0; 4096];
                let n = stream.read(&mut chunk).unwrap();
                assert!(n > 0, "request body cut short");
                buffer.extend_from_slice(&chunk[..n]);
            }
            let body = buffer[head_len..head_len + length].to_vec();
            buffer.drain(..head_len + length);
            return Some(Recorded {
                connection,
                method,
                path,
                headers,
                body,
            });
        }
        let mut chunk = [0; 4096];
        let n = stream.read(&mut chunk).unwrap_or(0);
        if n == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..n]);
    }
}

fn json_response(status: &str, body: &str) -> Reply {
    Reply::Send(
        format!(
            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes(),
    )
}

fn ok_json(body: &str) -> Reply {
    json_response("200 OK", body)
}

fn chunked(body: &str, piece: usize) -> Vec<u8> {
    let mut bytes = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    for part in body.as_bytes().chunks(piece) {
        bytes.extend_from_slice(format!("{:x}\r\n", part.len()).as_bytes());
        bytes.extend_from_slice(part);
        bytes.extend_from_slice(b"\r\n");
    }
    bytes.extend_from_slice(b"0\r\n\r\n");
    bytes
}

const STATUS_BODY: &str = r#"{"ready":true,"summary":["node: default ipv4 1/254 used"],"scopes":[{"scope":"node","pools":[{"pool":"default","families":[{"family":"ipv4","capacity":"254","used":"1","free":"253","excluded":"0","cooling":"0"}]}]}]}"#;

const ALLOCATED_BODY: &str = r#"{"allocations":[{"address":"10.0.0.2","family":"ipv4","pool":"default","generation":7,"existing":false,"subnet":"10.0.0.0/24","gateway":"10.0.0.1"}]}"#;

fn allocate_request() -> AllocateRequest {
    AllocateRequest {
        scope: NODE_SCOPE.to_owned(),
        pool: "default".to_owned(),
        family: Some(FamilyChoice::Ipv4),
        address: None,
        owner: "ns/pod".to_owned(),
        key: None,
        lease_ms: None,
    }
}

#[test]
fn get_with_content_length() {
    let agent = FakeAgent::unix(vec![vec![ok_json(STATUS_BODY)]]);
    let status = agent.client().status(Some("node")).unwrap();
    assert!(status.ready);
    assert_eq!(status.scopes[0].pools[0].families[0].free, "253");
    let requests = agent.requests();
    assert_eq!(requests[0].method, "GET");
    assert_eq!(requests[0].path, "/v1/status?scope=node");
    assert_eq!(requests[0].header("host"), Some("localhost"));
    assert_eq!(requests[0].header("authorization"), None);
    assert!(requests[0].body.is_empty());
}

#[test]
fn post_sends_json_with_length_and_type() {
    let agent = FakeAgent::unix(vec![vec![ok_json(ALLOCATED_BODY)]]);
    let response = agent.client().allocate(&allocate_request()).unwrap();
    assert_eq!(response.allocations[0].address.to_string(), "10.0.0.2");
    assert_eq!(response.allocations[0].family, FamilyName::Ipv4);
    let requests = agent.requests();
    let request = &requests[0];
    assert_eq!(
        (request.method.as_str(), request.path.as_str()),
        ("POST", "/v1/allocate")
    );
    assert_eq!(request.header("content-type"), Some("application/json"));
    assert_eq!(
        request.header("content-length"),
        Some(request.body.len().to_string().as_str())
    );
    let sent: AllocateRequest = serde_json::from_slice(&request.body).unwrap();
    assert_eq!(sent, allocate_request());
}

#[test]
fn chunked_body_arriving_in_pieces() {
    // A body larger than one read, in chunks of odd sizes, written three bytes at a time.
    let names: Vec<String> = (0..2000).map(|i| format!("\"r{i}\"")).collect();
    let body = format!("[{}]", names.join(","));
    let agent = FakeAgent::unix(vec![vec![
        Reply::Trickle(chunked(STATUS_BODY, 7)),
        Reply::Send(chunked(&body, 4093)),
    ]]);
    let mut client = agent.client();
    assert!(client.status(None).unwrap().ready);
    let value = client.openapi().unwrap();
    assert_eq!(value.as_array().map(Vec::len), Some(2000));
    let requests = agent.requests();
    assert_eq!(requests[0].path, "/v1/status");
    assert_eq!(
        requests[1].connection, 0,
        "the chunked answer left the connection reusable"
    );
}

#[test]
fn body_until_the_connection_closes() {
    let agent = FakeAgent::unix(vec![
        vec![Reply::Send(
            format!("HTTP/1.1 200 OK\r\n\r\n{STATUS_BODY}").into_bytes(),
        )],
        vec![ok_json(STATUS_BODY)],
    ]);
    let mut client = agent.client();
    client.status(None).unwrap();
    client.status(None).unwrap();
    let requests = agent.requests();
    assert_eq!(requests[1].connection, 1);
}

#[test]
fn api_error_body_is_typed() {
    let agent = FakeAgent::unix(vec![vec![json_response(
        "409 Conflict",
        r#"{"error":{"code":"in_use","message":"10.0.0.2 is in use","pool":"default"}}"#,
    )]]);
    match agent.client().allocate(&allocate_request()) {
        Err(Error::Api { status, error }) => {
            assert_eq!(status, 409);
            assert_eq!(error.code, ErrorCode::InUse);
            assert_eq!(error.pool.as_deref(), Some("default"));
            let text = Error::Api { status, error }.to_string();
            assert_eq!(text, "the agent answered 409 in_use: 10.0.0.2 is in use");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn other_error_bodies_keep_status_and_text() {
    let agent = FakeAgent::unix(vec![vec![Reply::Send(
        b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 13\r\n\r\nupstream died".to_vec(),
    )]]);
    match agent.client().healthz() {
        Err(error @ Error::Status { .. }) => {
            assert_eq!(error.status(), Some(502));
            assert!(!error.is_retryable());
            assert_eq!(error.to_string(), "the agent answered 502: upstream died");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn garbage_is_a_protocol_error() {
    let agent = FakeAgent::unix(vec![
        vec![Reply::Send(b"SSH-2.0-OpenSSH_9.6\r\n\r\n".to_vec())],
        vec![ok_json(r#"{"allocations": "#)],
        vec![ok_json(r#"{"ok":true,"extra":1}"#)],
        vec![Reply::Send(
            b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n\xff\xfe\xfd".to_vec(),
        )],
    ]);
    let mut client = agent.client();
    assert!(matches!(client.status(None), Err(Error::Protocol(_))));
    assert!(matches!(
        client.allocate(&allocate_request()),
        Err(Error::Protocol(_))
    ));
    let range = RangeRequest {
        scope: NODE_SCOPE.to_owned(),
        pool: "default".to_owned(),
        range: "10.0.0.0/24".to_owned(),
    };
    assert!(matches!(client.add_range(&range), Err(Error::Protocol(_))));
    assert!(matches!(client.metrics(), Err(Error::Protocol(_))));
    assert_eq!(agent.requests().len(), 4);
}

#[test]
fn connection_is_kept_alive() {
    let agent = FakeAgent::unix(vec![vec![
        ok_json(STATUS_BODY),
        ok_json(r#"{"outcome":"draining"}"#),
        ok_json(r#"{"id":"l-1","expires_at_ms":1000}"#),
    ]]);
    let mut client = agent.client();
    client.status(None).unwrap();
    let range = RangeRequest {
        scope: NODE_SCOPE.to_owned(),
        pool: "default".to_owned(),
        range: "10.0.0.0/24".to_owned(),
    };
    assert_eq!(
        client.remove_range(&range).unwrap().outcome,
        RangeRemoval::Draining
    );
    let lease = client
        .lease_start(&LeaseStartRequest {
            scope: NODE_SCOPE.to_owned(),
            address: "10.0.0.2".parse().unwrap(),
            duration_ms: 1000,
        })
        .unwrap();
    assert_eq!(lease.id, "l-1");
    let requests = agent.requests();
    assert!(requests.iter().all(|request| request.connection == 0));
    assert_eq!(requests[1].path, "/v1/pools/ranges/remove");
    assert_eq!(requests[2].path, "/v1/leases/start");
}

#[test]
fn idle_connection_closed_by_the_agent_is_reopened_once() {
    let agent = FakeAgent::unix(vec![
        vec![ok_json(STATUS_BODY)],
        vec![ok_json(ALLOCATED_BODY)],
    ]);
    let mut client = agent.client();
    client.status(None).unwrap();
    assert_eq!(agent.wait_closed(), 0);
    let response = client.allocate(&allocate_request()).unwrap();
    assert_eq!(response.allocations.len(), 1);
    let requests = agent.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[1].connection, 1);
    assert_eq!(requests[1].path, "/v1/allocate");
}

/// Asserts that `result` is a protocol error whose message says `text`.
#[track_caller]
fn assert_protocol_error<T: std::fmt::Debug>(result: Result<T, Error>, text: &str) {
    let error = result.unwrap_err();
    assert!(
        matches!(error, Error::Protocol(ref message) if message.contains(text)),
        "{error:?}"
    );
}

#[test]
fn no_retry_on_a_new_connection_closed_without_answer() {
    let agent = FakeAgent::unix(vec![vec![Reply::Close]]);
    assert_protocol_error(
        agent.client().allocate(&allocate_request()),
        "without answering",
    );
    assert_eq!(agent.requests().len(), 1);
}

#[test]
fn no_retry_after_part_of_an_answer() {
    // The agent closes mid-answer on the second request of a kept-alive connection: the
    // request may have been carried out, so it is not sent again.
    let agent = FakeAgent::unix(vec![vec![
        ok_json(STATUS_BODY),
        Reply::Send(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"allocations\"".to_vec()),
    ]]);
    let mut client = agent.client();
    client.status(None).unwrap();
    assert_protocol_error(client.allocate(&allocate_request()), "after");
    assert_eq!(agent.requests().len(), 2);
}

#[test]
fn missing_socket_is_unreachable() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nothing.sock");
    let error = Client::unix(&socket).status(None).unwrap_err();
    match &error {
        Error::Unreachable {
            socket: named,
            source,
        } => {
            assert_eq!(named, &socket.display().to_string());
            assert_eq!(source.kind(), io::ErrorKind::NotFound);
        }
        other => panic!("{other:?}"),
    }
    assert!(error.is_retryable());
    assert!(error.to_string().starts_with("cannot reach the agent at "));
}

#[test]
fn socket_without_listener_is_unreachable() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("stale.sock");
    drop(UnixListener::bind(&socket).unwrap());
    let error = Client::unix(&socket).healthz().unwrap_err();
    assert!(matches!(error, Error::Unreachable { .. }), "{error:?}");
}

#[test]
fn silent_agent_times_out() {
    let agent = FakeAgent::unix(vec![vec![Reply::Hang(Duration::from_millis(600))]]);
    let mut client = agent
        .client()
        .with_read_timeout(Some(Duration::from_millis(200)));
    let error = client.readyz().unwrap_err();
    assert!(matches!(error, Error::Timeout { .. }), "{error:?}");
    agent.requests();
}

#[test]
fn tcp_sends_the_bearer_token() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    let (closed_sender, _closed) = mpsc::channel();
    let script = vec![vec![ok_json(r#"{"ok":true}"#)]];
    let thread = thread::spawn(move || {
        serve(
            || listener.accept().map(|(stream, _)| stream).unwrap(),
            script,
            closed_sender,
        )
    });
    let mut client = Client::tcp(address, "s3cret").unwrap();
    assert!(!format!("{client:?}").contains("s3cret"));
    let done = client
        .import_checkpoint(&serde_json::json!({"format": "corral-checkpoint/1"}))
        .unwrap();
    assert!(done.ok);
    let requests = thread.join().unwrap();
    assert_eq!(requests[0].header("authorization"), Some("Bearer s3cret"));
    assert_eq!(
        requests[0].header("host"),
        Some(address.to_string().as_str())
    );
    assert_eq!(requests[0].path, "/v1/checkpoint");
    assert!(Client::tcp(address, "two words").is_err());
    assert!(Client::tcp(address, "").is_err());
}

#[test]
fn scope_is_percent_encoded() {
    assert_eq!(with_scope("/v1/dump", None), "/v1/dump");
    assert_eq!(
        with_scope("/v1/dump", Some("net-1_a.b~")),
        "/v1/dump?scope=net-1_a.b~"
    );
    assert_eq!(
        with_scope("/v1/dump", Some("a b/ü&x=1")),
        "/v1/dump?scope=a%20b%2F%C3%BC%26x%3D1"
    );
}
