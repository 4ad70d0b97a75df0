//! corral-ipam waits for an agent that answers late: an ADD may wait in the agent up to its
//! pool wait (20 s by default: for the agent to finish restoring, or for a grant through an
//! operator failover), so the plugin waits up to 60 s for the answer. Before, it gave up after
//! 10 s with code 11 while the agent was still working on the ADD.
//!
//! The agent here is a stand-in on a unix socket that answers the ADD after 12 s.

use std::io::{Read, Write};
use std::os::unix::net::UnixListener;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::common;

/// How long the stand-in agent takes to answer: past the plugin's old 10 s timeout.
const ANSWER_AFTER: Duration = Duration::from_secs(12);

/// Reads one HTTP request (head and `Content-Length` body) from `stream`.
fn read_request(stream: &mut impl Read) -> String {
    let mut received = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        let n = stream.read(&mut buffer).unwrap();
        assert!(n > 0, "the plugin closed before its request was whole");
        received.extend_from_slice(&buffer[..n]);
        let text = String::from_utf8_lossy(&received).into_owned();
        if let Some(end) = text.find("\r\n\r\n") {
            let length = text[..end]
                .lines()
                .find_map(|l| {
                    let (name, value) = l.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse::<usize>().unwrap())
                })
                .unwrap_or(0);
            if received.len() >= end + 4 + length {
                return text;
            }
        }
    }
}

#[test]
fn an_add_the_agent_answers_after_twelve_seconds_succeeds() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("agent.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let mut stream = stream.unwrap();
            std::thread::spawn(move || {
                let request = read_request(&mut stream);
                assert!(request.starts_with("POST /v1/cni/add "), "{request}");
                std::thread::sleep(ANSWER_AFTER);
                let body = json!({"allocations": [{
                    "address": "10.8.0.2",
                    "family": "ipv4",
                    "pool": "slownet-0",
                    "generation": 1,
                    "existing": false,
                }]})
                .to_string();
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(answer.as_bytes());
            });
        }
    });
    let conf = serde_json::to_vec(&json!({
        "cniVersion": "1.0.0",
        "name": "slownet",
        "type": "bridge",
        "ipam": {
            "type": "corral-ipam",
            "agent": socket,
            "dataDir": dir.path().join("cni"),
            "ranges": [[{"subnet": "10.8.0.0/29"}]],
        }
    }))
    .unwrap();
    let started = Instant::now();
    let out = common::run("ADD", "slow", "eth0", &[], &conf);
    assert!(started.elapsed() >= ANSWER_AFTER, "{:?}", started.elapsed());
    assert_eq!(out.code, 0, "{} {}", out.stdout, out.stderr);
    assert_eq!(
        out.json()["ips"][0]["address"],
        "10.8.0.2/29",
        "{}",
        out.stdout
    );
}
