//! The operator's dashboard in a real headless Chromium (issue 23): etcd started here on
//! 127.0.0.1, `corral operator` `op-a` (and its standby `op-b`) with a TCP listener and a
//! bearer token, and two `corral agent`s on a block pool of one block, so one node starves.
//! Chromium (Debian's `chromium`, `make deps`) opens `http://127.0.0.1:PORT/dashboard#token=...`;
//! the test drives it over the DevTools protocol (`--remote-debugging-port`, a websocket) and
//! waits on what the page shows (`Runtime.evaluate` of the DOM), never on a sleep:
//!
//! - the empty cluster, and a pool of 2^64 blocks counted exactly;
//! - the standby's page naming the leader from its 503, then keeping it when the standby is
//!   gone; a tab without the token asking for it;
//! - the starving node with its reason, a node CIDR's use; then `corral cluster apply` widens
//!   the pool, a block is granted, and the same page session (no reload: a marker set in the
//!   page survives) shows the node served;
//! - the history panel drawing events of `/v1/history`'s shape (a fake `fetch` in the page
//!   answers it, so the panel is checked whether or not this operator serves it).
//!
//! A screenshot of the starving node goes to the test's temporary directory, and to
//! `$CORRAL_DASHBOARD_PNG` when set (how `docs/dashboard.png` is made).
//!
//! Needs etcd and chromium (`make deps`); ignored by a plain `cargo test`, and failing loudly
//! when chromium is missing under `--include-ignored`.

use std::collections::BTreeSet;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use base64::Engine as _;
use corral_etcd::testing::EtcdCluster;
use serde_json::{Value, json};

use crate::cluster_common;
use crate::common;

use cluster_common::*;

/// One /28 block of IPv4; a node's watermarks (pre-allocate 4) ask for one block, so of two
/// nodes one starves. Pool `wide` has 2^64 IPv6 blocks, pool `nodes` /24 node CIDRs. (The
/// starving node is granted its block of `wide` all the same: a full pool starves no other,
/// and the page shows it waiting in `pods` only.)
fn one_block() -> String {
    block_pool(2, "10.90.0.0/28")
        + "\n"
        + &blocks_table("wide", "fd00:90::/40", 104, Some(2))
        + r#"
[[pools]]
name = "nodes"
[pools.ipv4]
cidrs = ["10.91.0.0/16"]
node_prefix_len = 24
"#
}

/// Pool `wide`'s capacity in /104 blocks: 2^64, past what a JavaScript number holds
/// exactly (2^53), printed exactly.
const IPV6_BLOCKS: &str = "18,446,744,073,709,551,616";

const NODES: [&str; 2] = ["node-a", "node-b"];

const EXHAUSTED: &str = "no free block: the pool is exhausted";

const TOKEN: &str = "dashboard-test-token-0123456789";

/// Makes the page's `fetch` answer `/v1/history` with two events of histl's shape.
const HISTORY_FAKE: &str = r#"(() => {
  const real = window.fetch;
  window.fetch = (path, options) => String(path).startsWith('/v1/history')
    ? Promise.resolve(new Response(JSON.stringify({ events: [
        { pool: 'pods', family: 'ipv4', cidr: '10.90.0.0/28', node: 'gone-node',
          from_ms: 1000, to_ms: 2000, why: 'node removed' },
        { pool: 'pods', family: 'ipv4', cidr: '10.90.0.16/28', node: '__STARVING__',
          from_ms: Date.now(), to_ms: null, why: null },
      ] }), { status: 200, headers: { 'Content-Type': 'application/json' } }))
    : real(path, options);
})()"#;

/// The nodes etcd says hold a block of pool `pods` (every node gets one of pool `wide`).
fn served(etcd: &EtcdCluster) -> BTreeSet<String> {
    grants(etcd)
        .into_iter()
        .filter(|(_, keys)| keys.iter().any(|key| key.contains("/10.90.")))
        .map(|(node, _)| node)
        .collect()
}

/// A headless Chromium, ended when dropped.
struct Chromium {
    child: Child,
    /// Its `--user-data-dir`, where it writes `DevToolsActivePort`.
    profile: PathBuf,
}

impl Chromium {
    fn start(dir: &Path) -> Chromium {
        let profile = dir.join("chromium-profile");
        let child = Command::new("chromium")
            .args([
                "--headless=new",
                "--no-sandbox",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--disable-extensions",
                "--hide-scrollbars",
                "--force-device-scale-factor=1",
                "--window-size=1280,1000",
                "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("chromium.log")).unwrap())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("chromium does not start ({e}): it is Debian's `chromium`, run `make deps`")
            });
        Chromium { child, profile }
    }

    /// The browser's DevTools websocket address, once Chromium wrote it (port, then path).
    fn devtools_url(&mut self) -> String {
        let file = self.profile.join("DevToolsActivePort");
        let mut url = None;
        wait_until(
            "chromium writes DevToolsActivePort",
            Duration::from_secs(60),
            || {
                if let Ok(Some(status)) = self.child.try_wait() {
                    panic!("chromium exited: {status}");
                }
                let text = std::fs::read_to_string(&file).unwrap_or_default();
                let mut lines = text.lines();
                if let (Some(port), Some(path)) = (lines.next(), lines.next()) {
                    url = Some(format!("ws://127.0.0.1:{port}{path}"));
                }
                url.is_some()
            },
        );
        url.unwrap()
    }
}

impl Drop for Chromium {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A DevTools protocol client on one websocket, attached to one page (flat sessions).
struct DevTools {
    socket: tungstenite::WebSocket<TcpStream>,
    next_id: u64,
    session: Option<String>,
    /// What the page threw or logged as an error, for a failure to show.
    errors: Vec<String>,
}

impl DevTools {
    fn connect(url: &str) -> DevTools {
        let address = url
            .strip_prefix("ws://")
            .and_then(|rest| rest.split('/').next())
            .unwrap();
        let stream = TcpStream::connect(address).unwrap();
        let (socket, _) = tungstenite::client(url, stream).unwrap();
        DevTools {
            socket,
            next_id: 0,
            session: None,
            errors: Vec::new(),
        }
    }

    /// Sends `method` and answers its result, noting the events that come before it.
    fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut message = json!({ "id": id, "method": method, "params": params });
        if let Some(session) = &self.session {
            message["sessionId"] = json!(session);
        }
        self.socket
            .send(tungstenite::Message::text(message.to_string()))
            .unwrap();
        loop {
            let text = match self.socket.read().unwrap() {
                tungstenite::Message::Text(text) => text,
                _ => continue,
            };
            let answer: Value = serde_json::from_str(&text).unwrap();
            if answer["id"] == id {
                assert!(
                    answer.get("error").is_none(),
                    "{method}: {}",
                    answer["error"]
                );
                return answer["result"].clone();
            }
            match answer["method"].as_str() {
                Some("Runtime.exceptionThrown") => self
                    .errors
                    .push(answer["params"]["exceptionDetails"].to_string()),
                Some("Runtime.consoleAPICalled") if answer["params"]["type"] == "error" => {
                    self.errors.push(answer["params"]["args"].to_string());
                }
                _ => {}
            }
        }
    }

    /// Opens a page, attaches to it and navigates it to `url`.
    fn open(&mut self, url: &str) {
        let target = self.call("Target.createTarget", json!({ "url": "about:blank" }));
        let attached = self.call(
            "Target.attachToTarget",
            json!({ "targetId": target["targetId"], "flatten": true }),
        );
        self.session = Some(attached["sessionId"].as_str().unwrap().to_owned());
        self.call("Runtime.enable", json!({}));
        self.call("Page.enable", json!({}));
        self.call(
            "Emulation.setDeviceMetricsOverride",
            json!({ "width": 1280, "height": 1000, "deviceScaleFactor": 1, "mobile": false }),
        );
        let navigated = self.call("Page.navigate", json!({ "url": url }));
        assert!(navigated.get("errorText").is_none(), "{navigated}");
    }

    /// The value of a JavaScript expression in the page.
    fn eval(&mut self, expression: &str) -> Value {
        let result = self.call(
            "Runtime.evaluate",
            json!({ "expression": expression, "returnByValue": true }),
        );
        result["result"]["value"].clone()
    }

    /// The text of the element `selector` selects, empty without one.
    fn text(&mut self, selector: &str) -> String {
        let expression = format!(
            "(document.querySelector({}) || {{}}).innerText || ''",
            json!(selector)
        );
        self.eval(&expression)
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// Waits (30 s at most) until `done` holds of the page; on a timeout, shows what the page
    /// says and what it threw.
    fn wait_until(&mut self, what: &str, mut done: impl FnMut(&mut DevTools) -> bool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !done(self) {
            if std::time::Instant::now() > deadline {
                let body = self.text("body");
                panic!(
                    "timed out waiting until {what}\n{body}\nerrors: {:?}",
                    self.errors
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A PNG of the whole page.
    fn screenshot(&mut self) -> Vec<u8> {
        let metrics = self.call("Page.getLayoutMetrics", json!({}));
        let size = &metrics["cssContentSize"];
        let shot = self.call(
            "Page.captureScreenshot",
            json!({
                "format": "png",
                "captureBeyondViewport": true,
                "clip": {
                    "x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1,
                },
            }),
        );
        base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().unwrap())
            .unwrap()
    }
}

/// The operator's TCP address, from what it says once it listens.
/// Replica `name` with its state in `dir/NAME-state` and its API also on a free loopback TCP
/// port, behind the token in `token_file`.
fn tcp_replica(etcd: &EtcdCluster, dir: &Path, name: &str, token_file: &Path) -> Operator {
    let state = dir.join(format!("{name}-state"));
    let args: [&std::ffi::OsStr; 6] = [
        "--state-dir".as_ref(),
        state.as_os_str(),
        "--api-tcp".as_ref(),
        "127.0.0.1:0".as_ref(),
        "--token-file".as_ref(),
        token_file.as_os_str(),
    ];
    Operator::start_with(etcd, dir, name, &args)
}

fn tcp_address(operator: &Operator) -> String {
    let mut address = None;
    wait_showing(
        "op-a says where its TCP listener is",
        Duration::from_secs(20),
        || {
            // The ready line's `dashboard=http://127.0.0.1:PORT/dashboard` field.
            address = operator
                .log()
                .split("http://127.0.0.1:")
                .nth(1)
                .map(|rest| {
                    let port: String = rest.chars().take_while(char::is_ascii_digit).collect();
                    format!("127.0.0.1:{port}")
                });
            address.is_some()
        },
        || operator.log(),
    );
    address.unwrap()
}

#[test]
#[ignore = "needs etcd and chromium (make deps)"]
fn the_dashboard_shows_a_starving_node_then_the_grant_that_serves_it_in_the_same_page() {
    let found = Command::new("chromium").arg("--version").output();
    assert!(
        found.as_ref().is_ok_and(|o| o.status.success()),
        "chromium is missing ({found:?}): it is Debian's `chromium`, run `make deps`"
    );
    let (dir, etcd) = initialized_in_tempdir(1, &one_block());
    let token_file = dir.path().join("token");
    common::write_token_file(&token_file, TOKEN);
    let operator = tcp_replica(&etcd, dir.path(), "op-a", &token_file);
    let address = tcp_address(&operator);
    wait_leads(&etcd, "op-a", Duration::from_secs(20));

    // An empty cluster: no node yet.
    let mut chromium = Chromium::start(dir.path());
    let devtools = chromium.devtools_url();
    let mut page = DevTools::connect(&devtools);
    page.open(&format!("http://{address}/dashboard#token={TOKEN}"));
    page.wait_until("the page shows an empty cluster", |page| {
        page.text("#nodes").contains("No node is registered.")
            && page.text("#waiting").contains("No node is waiting.")
    });
    let pools = page.text("#pools");
    assert!(
        pools.contains(&format!("0 of {IPV6_BLOCKS} granted")),
        "{pools}"
    );

    // A standby's page names the leader, from its 503.
    let standby = tcp_replica(&etcd, dir.path(), "op-b", &token_file);
    let mut standby_page = DevTools::connect(&devtools);
    standby_page.open(&format!(
        "http://{}/dashboard#token={TOKEN}",
        tcp_address(&standby)
    ));
    standby_page.wait_until("the standby's page names the leader", |page| {
        page.text("#leader") == "op-a"
            && page.text("#replica") == "op-b (standby)"
            && page.text("#banner").contains("ask the leader, op-a")
    });
    assert!(
        standby_page.errors.is_empty(),
        "the standby's page failed: {:?}",
        standby_page.errors
    );
    // Its operator gone, the page says so and keeps the last picture.
    drop(standby);
    standby_page.wait_until("the page says its operator does not answer", |page| {
        page.text("#banner")
            .contains("the operator does not answer")
    });
    assert_eq!(standby_page.text("#leader"), "op-a");

    // Without the token (a new tab: its own session storage) the page asks for it.
    let mut bare = DevTools::connect(&devtools);
    bare.open(&format!("http://{address}/dashboard"));
    bare.wait_until("a page without the token asks for it", |page| {
        page.eval("document.getElementById('login').hidden") == false
            && page
                .text("#banner")
                .contains("needs the operator's bearer token")
    });

    let _agents = start_agents(&etcd, dir.path(), &NODES);
    wait_until(
        "one node holds the pods block, the other waits",
        Duration::from_secs(30),
        || served(&etcd).len() == 1 && waiting_nodes(&operator.socket) == Some(1),
    );
    let held = served(&etcd);
    let starving = NODES.iter().copied().find(|n| !held.contains(*n)).unwrap();
    let fed = NODES.iter().copied().find(|n| held.contains(*n)).unwrap();

    // Starving in `pods`, it is granted its block of `wide` all the same.
    wait_until(
        "the starving node holds a block of wide",
        Duration::from_secs(30),
        || {
            grants(&etcd)
                .get(starving)
                .is_some_and(|keys| keys.iter().any(|key| key.contains("/wide/ipv6/")))
        },
    );

    // The same page renders the pool, the starving node with its reason (in `pods` only), and
    // the leader.
    let waiting_row = format!("#waiting tr[data-node=\"{starving}\"]");
    page.wait_until("the page shows the starving node with its reason", |page| {
        let row = page.text(&waiting_row);
        row.contains(EXHAUSTED) && !row.contains("wide")
    });
    assert!(
        page.text("#pools").contains("pods"),
        "{}",
        page.text("body")
    );
    assert!(
        page.text(&format!("#pools [data-node=\"{fed}\"]"))
            .contains("addresses used"),
        "{}",
        page.text("#pools")
    );
    // A node CIDR's use, from what its agent asserts it holds.
    let node_cidr = format!("#pools [data-pool=\"nodes ipv4\"] [data-node=\"{fed}\"]");
    page.wait_until("the page shows the use of the fed node's CIDR", |page| {
        page.text(&node_cidr).contains("0 of 256 addresses used")
    });
    assert_eq!(page.text("#leader"), "op-a");
    // Recent grants and releases, from the operator's `/v1/history`: the fed node's grants.
    page.wait_until("the page lists the fed node's grants", |page| {
        let history = page.text("#history");
        history.contains(fed) && !history.contains("History not available")
    });
    assert_eq!(
        page.eval(&format!(
            "document.querySelector('#nodes tr[data-node=\"{starving}\"]').dataset.state"
        )),
        "waiting"
    );
    // The token left the address bar (it stays in the tab's session storage).
    let href = page.eval("location.href");
    assert!(!href.as_str().unwrap().contains(TOKEN), "{href}");
    // The picture of a starving node, as docs/dashboard.png shows it.
    let png = page.screenshot();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    std::fs::write(dir.path().join("dashboard.png"), &png).unwrap();
    if let Some(path) = std::env::var_os("CORRAL_DASHBOARD_PNG") {
        std::fs::write(path, &png).unwrap();
    }
    // A marker only this page session holds: a reload would lose it.
    page.eval("window.sameSession = 'yes'");
    let polls_before: u64 = page
        .eval("document.body.dataset.polls")
        .as_str()
        .unwrap()
        .parse()
        .unwrap();

    // Space comes back: the pool grows by a block through `corral cluster apply`.
    widen(
        &etcd,
        dir.path(),
        &one_block(),
        "10.90.0.0/28",
        "10.90.0.16/28",
    );

    let nodes_row = format!("#nodes tr[data-node=\"{starving}\"]");
    let state = format!("document.querySelector('{nodes_row}').dataset.state");
    page.wait_until(
        "the same page shows the node served and nothing waiting",
        |page| {
            page.eval(&state) == "served" && page.text("#waiting").contains("No node is waiting")
        },
    );
    assert_eq!(served(&etcd).len(), NODES.len());
    assert_eq!(
        page.eval("window.sameSession"),
        "yes",
        "the page was reloaded"
    );
    let polls_after: u64 = page
        .eval("document.body.dataset.polls")
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(polls_after > polls_before);
    assert!(
        page.text(&nodes_row).contains("10.90.0.16/28"),
        "{}",
        page.text("#nodes")
    );

    // The history panel draws `/v1/history`'s events (served by the fake below, which this
    // page session's fetch now answers with): a grant still held and one released.
    page.eval(&HISTORY_FAKE.replace("__STARVING__", starving));
    page.wait_until("the page draws the history's events", |page| {
        let history = page.text("#history");
        history.contains("10.90.0.16/28") && history.contains("node removed")
    });
    let rows = page.eval(
        "[...document.querySelectorAll('#history tbody tr')].map(r => r.innerText.split('\\t'))",
    );
    assert_eq!(rows.as_array().map(Vec::len), Some(2), "{rows}");
    // Newest first; a grant still held says so.
    assert_eq!(rows[0][1], "held", "{rows}");
    assert_eq!(rows[0][2], starving, "{rows}");
    assert_eq!(rows[1][5], "node removed", "{rows}");
    assert!(page.errors.is_empty(), "the page failed: {:?}", page.errors);

    page.call("Browser.close", json!({}));
    let _ = chromium.child.wait();
}

/// How many nodes wait, as the operator's `/v1/status` on its socket says.
fn waiting_nodes(socket: &Path) -> Option<u64> {
    let status = corral_client::Client::unix(socket).operator_status().ok()?;
    Some(status.cluster?.nodes_waiting)
}
