//! The agent on a state directory whose log vanished from outside while it held commits:
//! it refuses to start, naming the file, rather than serve a state that forgot allocations.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;

use corral_agent::{AgentConfig, AgentError, Running};
use corral_store::{LostState, StoreError};

/// One allocation through the agent's API, so the state holds something to lose.
fn allocate(socket: &Path, owner: &str) {
    let body = format!(r#"{{"pool":"default","family":"ipv4","owner":"{owner}"}}"#);
    let mut stream = UnixStream::connect(socket).unwrap();
    write!(
        stream,
        "POST /v1/allocate HTTP/1.1\r\nHost: corral\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

#[test]
fn an_agent_whose_log_was_deleted_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let config = AgentConfig::in_dir(dir.path());
    let agent = Running::start(config.clone()).unwrap();
    for owner in ["a", "b", "c"] {
        allocate(&config.socket, owner);
    }
    agent.stop().unwrap();
    let log = config.data_dir.join("corral.db-wal");
    std::fs::remove_file(&log).unwrap();
    let refused = match Running::start(config.clone()) {
        Ok(_) => panic!("the agent started over a lost log"),
        Err(error) => error,
    };
    let message = refused.to_string();
    assert!(
        matches!(
            &refused,
            AgentError::Store(StoreError::StateLost {
                kind: LostState::LogMissing,
                ..
            })
        ),
        "{message}"
    );
    assert!(message.contains(&log.display().to_string()), "{message}");
    assert!(!log.exists(), "the refusal created no log");
}
