//! The daemons' logs as a log collector and a person read them (`--log-format`, `--log-level`,
//! `CORRAL_LOG`): with `--log-format json` every line of `corral operator`'s and `corral
//! agent`'s stderr is one JSON object with a level, a target and a message, a grant is logged
//! inside its node's span, a request inside its own (the CNI verb's container ID in it); the
//! text format's lines keep one readable shape; no bearer token is ever logged; a format or a
//! filter that does not parse is a usage error (exit 2).
//!
//! The cluster test needs Debian's etcd (`make deps`) and is ignored by a plain `cargo test`.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;

use corral_client::Client;
use serde_json::Value;

use crate::cluster_common;
use crate::common;

use cluster_common::*;
use common::{Agent, BINARY};

/// The bearer token of both daemons' TCP listeners: it must appear in no log line.
const TOKEN: &str = "tok-3f9a1c7e5b2d4086-never-logged";

/// A loopback address free when asked (the daemon binds it a moment later).
fn free_addr() -> SocketAddr {
    let port = corral_etcd::testing::free_ports(1).expect("a free port")[0];
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// Every line of `log` as a JSON object; fails naming the first line that is not one, or that
/// lacks a level, a target or a message.
fn json_lines(who: &str, log: &str) -> Vec<Value> {
    assert!(!log.is_empty(), "{who} logged nothing");
    log.lines()
        .map(|line| {
            let value: Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("{who}: not a JSON line ({e}): {line}\n{log}"));
            for (field, found) in [
                ("level", &value["level"]),
                ("target", &value["target"]),
                ("fields.message", &value["fields"]["message"]),
            ] {
                assert!(found.is_string(), "{who}: no {field} in {line}");
            }
            value
        })
        .collect()
}

/// The events whose message is `message`.
fn events<'a>(lines: &'a [Value], message: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
    lines
        .iter()
        .filter(move |line| line["fields"]["message"] == message)
}

#[test]
#[ignore = "needs etcd (make deps)"]
fn json_logs_are_one_object_a_line_with_grants_in_their_node_span_and_no_token() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let etcd = initialized(1, dir, DUAL);
    let token_file = dir.join("token");
    common::write_token_file(&token_file, TOKEN);
    let operator_tcp = free_addr().to_string();
    let state = dir.join("op-a-state");
    let json = ["--log-format", "json", "--log-level", "debug"];
    let mut extra: Vec<&std::ffi::OsStr> = json.iter().map(|a| a.as_ref()).collect();
    extra.extend([
        "--state-dir".as_ref(),
        state.as_os_str(),
        "--api-tcp".as_ref(),
        operator_tcp.as_ref(),
        "--token-file".as_ref(),
        token_file.as_os_str(),
    ]);
    let operator = Operator::start_with(&etcd, dir, "op-a", &extra);
    let agent_tcp = free_addr();
    let agent_tcp_text = agent_tcp.to_string();
    let mut agent_extra = json.to_vec();
    agent_extra.extend([
        "--tcp",
        &agent_tcp_text,
        "--token-file",
        token_file.to_str().unwrap(),
    ]);
    let agent = start_agent_with(&etcd, &dir.join("a"), "node-a", &agent_extra);
    wait_showing(
        "node-a holds its two cluster ranges",
        std::time::Duration::from_secs(20),
        || agent_ranges(&agent.socket).len() == 2,
        || format!("{}\n{}", operator.log(), agent.log()),
    );

    // Requests with the token, on both daemons' TCP listeners, and a CNI ADD and DEL.
    let mut over_tcp = Client::tcp(agent_tcp, TOKEN).unwrap();
    over_tcp
        .allocate(&node_request(corral_api::FamilyChoice::Ipv4, "logs"))
        .unwrap();
    let no_pool = corral_api::AllocateRequest {
        pool: "no-such-pool".into(),
        ..node_request(corral_api::FamilyChoice::Ipv4, "logs")
    };
    assert!(over_tcp.allocate(&no_pool).is_err());
    let mut operator_client = Client::tcp(operator_tcp.parse().unwrap(), TOKEN).unwrap();
    operator_client.operator_status().unwrap();
    common::pod_add_at(&agent.socket, "default", "c-logs").unwrap();
    common::pod_del(&mut Client::unix(&agent.socket), "default", "c-logs").unwrap();

    // Both stopped first, so that no line is read half written.
    let (operator_log, agent_log) = (
        operator.log.clone(),
        agent.socket.with_file_name("agent.log"),
    );
    drop((operator, agent));
    let operator_log = std::fs::read_to_string(operator_log).unwrap();
    let agent_log = std::fs::read_to_string(agent_log).unwrap();
    for (who, log) in [("operator", &operator_log), ("agent", &agent_log)] {
        assert!(!log.contains(TOKEN), "{who} logged the token:\n{log}");
    }
    let operator_lines = json_lines("operator", &operator_log);
    let agent_lines = json_lines("agent", &agent_log);

    // The operator: leading, then node-a's CIDRs granted inside node-a's span, each with its
    // pool, family and CIDR as fields.
    let leading = events(&operator_lines, "leading").next();
    assert!(
        leading.is_some_and(|l| l["level"] == "INFO" && l["fields"]["replica"] == "op-a"),
        "{operator_log}"
    );
    let granted: Vec<&Value> = events(&operator_lines, "granted").collect();
    assert_eq!(granted.len(), 2, "{operator_log}");
    for grant in &granted {
        assert_eq!(grant["level"], "INFO", "{grant}");
        assert_eq!(grant["span"]["name"], "node", "{grant}");
        assert_eq!(grant["span"]["node"], "node-a", "{grant}");
        assert_eq!(grant["fields"]["pool"], "default", "{grant}");
        assert!(grant["fields"]["cidr"].is_string(), "{grant}");
        assert!(grant["fields"]["family"].is_string(), "{grant}");
    }
    // The operator's request over TCP, answered in its own span.
    assert!(
        events(&operator_lines, "answered").any(|l| l["span"]["name"] == "request"
            && l["span"]["path"] == "/v1/status"
            && l["span"]["method"] == "GET"
            && l["fields"]["status"] == 200),
        "{operator_log}"
    );

    // The agent: ready; the grants taken up inside the cluster link's span; each request in a
    // span with an id, the CNI verbs' with the container ID and interface.
    assert!(
        events(&agent_lines, "ready").any(|l| l["level"] == "INFO"),
        "{agent_log}"
    );
    let taken: Vec<&Value> = events(&agent_lines, "granted")
        .filter(|l| l["span"]["name"] == "cluster" && l["span"]["node"] == "node-a")
        .collect();
    assert_eq!(taken.len(), 2, "{agent_log}");
    let answered: Vec<&Value> = events(&agent_lines, "answered").collect();
    assert!(
        answered
            .iter()
            .any(|l| l["span"]["path"] == "/v1/allocate" && l["fields"]["status"] == 200),
        "{agent_log}"
    );
    // The refusal: its code and error as fields, in its request's span.
    assert!(
        events(&agent_lines, "refused").any(|l| l["span"]["path"] == "/v1/allocate"
            && l["fields"]["operation"] == "allocate"
            && l["fields"]["code"].is_string()
            && l["fields"]["error"]
                .as_str()
                .is_some_and(|e| e.contains("no-such-pool"))),
        "{agent_log}"
    );
    for verb in ["/v1/cni/add", "/v1/cni/del"] {
        assert!(
            answered.iter().any(|l| l["span"]["path"] == verb
                && l["span"]["container_id"] == "c-logs"
                && l["span"]["ifname"] == "eth0"
                && l["span"]["request_id"].is_u64()),
            "{verb}: {agent_log}"
        );
    }
}

/// The text format: the agent's ready line and a request's line, pinned in shape (the time
/// stamp aside), with no colour codes when stderr is a file.
#[test]
fn text_lines_keep_their_shape() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("agent.sock");
    let state = dir.path().join("state");
    let agent = Agent::serve_with(&state, &socket, &["--log-level".as_ref(), "debug".as_ref()]);
    Client::unix(&socket).status(None).unwrap();
    drop(agent);
    let log = std::fs::read_to_string(socket.with_file_name("agent.log")).unwrap();
    let lines: Vec<&str> = log.lines().map(without_time).collect();
    let socket = socket.display();
    let ready = format!(
        " INFO corral_cli: ready data_dir=\"{}\" socket=\"{socket}\" \
         hint=\"try: corral --socket {socket} status\"",
        state.display()
    );
    assert!(lines.contains(&ready.as_str()), "{ready}\n{log}");
    // The status request (after the readiness probes): its span, then the answer's fields.
    let answered = lines
        .iter()
        .find(|l| l.contains("path=\"/v1/status\""))
        .unwrap_or_else(|| panic!("{log}"));
    let (head, took) = answered.rsplit_once(" took_us=").unwrap();
    assert!(took.parse::<u64>().is_ok(), "{answered}");
    let (span, rest) = head.split_once("}: ").unwrap();
    assert!(
        span.starts_with("DEBUG request{method=GET path=\"/v1/status\" request_id="),
        "{answered}"
    );
    assert_eq!(
        rest, "corral_http::listen: answered status=200",
        "{answered}"
    );
    assert!(!log.contains('\u{1b}'), "colour codes in a file:\n{log}");
}

/// A line without its time stamp (`2026-11-29T12:00:00.000000Z`), checked for its shape.
fn without_time(line: &str) -> &str {
    let (time, rest) = line.split_once(' ').unwrap_or_else(|| panic!("{line}"));
    assert!(
        time.len() == 27 && time.ends_with('Z') && time.as_bytes()[10] == b'T',
        "no time stamp: {line}"
    );
    rest
}

/// `corral DAEMON ARGS` with `env` set, expected to refuse at once: its exit code and stderr.
fn refused(args: &[&str], env: Option<(&str, &str)>, dir: &Path) -> (i32, String) {
    let mut command = Command::new(BINARY);
    command.args(args).current_dir(dir);
    if let Some((name, value)) = env {
        command.env(name, value);
    }
    let output = command.output().unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn a_bad_log_format_level_or_filter_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    for daemon in ["agent", "operator"] {
        let (code, stderr) = refused(&[daemon, "--log-format", "yaml"], None, dir.path());
        assert_eq!(code, 2, "{stderr}");
        assert!(
            stderr.contains("invalid value 'yaml' for '--log-format <FORMAT>'")
                && stderr.contains("[possible values: text, json]"),
            "{stderr}"
        );
        let (code, stderr) = refused(&[daemon, "--log-level", "loud"], None, dir.path());
        assert_eq!(code, 2, "{stderr}");
        assert!(
            stderr.contains("invalid value 'loud' for '--log-level <LEVEL>'"),
            "{stderr}"
        );
    }
    // A filter that does not parse: refused before anything starts.
    let state = dir.path().join("state");
    let (code, stderr) = refused(
        &["agent", "--data-dir", state.to_str().unwrap()],
        Some(("CORRAL_LOG", "corral_agent=loud")),
        dir.path(),
    );
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.starts_with("corral: CORRAL_LOG: \"corral_agent=loud\" is no directive"),
        "{stderr}"
    );
    assert!(!state.exists(), "the agent started: {stderr}");
}

/// The agent's configuration file sets the format and level (`[log]`), a flag wins over it,
/// and a value of the file that does not parse is refused naming the file.
#[test]
fn the_agent_configuration_file_sets_the_log_and_a_flag_wins() {
    let dir = tempfile::tempdir().unwrap();
    let config = |name: &str, log: &str| {
        let sub = dir.path().join(name);
        std::fs::create_dir_all(&sub).unwrap();
        let path = common::agent_toml(&sub, &format!("\n[log]\n{log}\n"));
        (path, sub.join("agent.sock"))
    };

    let (path, socket) = config("json", "format = \"json\"\nlevel = \"debug\"");
    let agent = Agent::start(&["--config".as_ref(), path.as_os_str()], &socket);
    Client::unix(&socket).status(None).unwrap();
    drop(agent);
    let log = std::fs::read_to_string(socket.with_file_name("agent.log")).unwrap();
    let lines = json_lines("agent", &log);
    assert!(
        events(&lines, "answered").any(|l| l["span"]["path"] == "/v1/status"),
        "debug from the file: {log}"
    );

    let (path, socket) = config("flag", "format = \"json\"");
    let agent = Agent::start(
        &[
            "--config".as_ref(),
            path.as_os_str(),
            "--log-format".as_ref(),
            "text".as_ref(),
        ],
        &socket,
    );
    let log = agent.log();
    assert!(log.lines().all(|l| !l.starts_with('{')), "{log}");
    assert!(log.contains(" INFO corral_cli: ready "), "{log}");
    drop(agent);

    let (path, _) = config("bad", "format = \"yaml\"");
    let (code, stderr) = refused(
        &["agent", "--config", path.to_str().unwrap()],
        None,
        dir.path(),
    );
    assert_eq!(code, 2, "{stderr}");
    assert_eq!(
        stderr.trim_end(),
        format!(
            "corral: {}: log.format \"yaml\" is not text or json",
            path.display()
        )
    );
}
