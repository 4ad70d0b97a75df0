//! For the daemons' tests of their OpenAPI documents (feature `testing`): the committed
//! document's check, the `paths` constants read from source, dangling references, and a
//! schemathesis run against a live daemon.

use std::io::Read;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The repository's root, where the committed documents are.
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Fails, naming the first differing line, unless the file at `path` holds `expected`; with
/// `UPDATE_EXPECT` set it writes `expected` there instead. Answers the committed text.
pub fn check_committed(path: &Path, expected: &str) -> String {
    if std::env::var_os("UPDATE_EXPECT").is_some() {
        std::fs::write(path, expected).expect("the document is written");
        return expected.to_owned();
    }
    let committed = std::fs::read_to_string(path).expect("the committed document is read");
    if committed != expected {
        let line = committed
            .lines()
            .zip(expected.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| committed.lines().count().min(expected.lines().count()));
        panic!(
            "{} differs from the generated document from line {}:\n  committed: {:?}\n  \
             generated: {:?}\nrerun with UPDATE_EXPECT=1 to rewrite it after a deliberate change",
            path.display(),
            line + 1,
            committed.lines().nth(line).unwrap_or("<end of file>"),
            expected.lines().nth(line).unwrap_or("<end of file>"),
        );
    }
    committed
}

/// The constants of the `pub mod paths` in a file's `source`, name and value: a module's
/// constants cannot be listed at run time, and a path added there must not be missed.
pub fn path_constants(source: &str) -> Vec<(String, String)> {
    let start = source.find("pub mod paths {").expect("a paths module");
    let end = start + source[start..].find("\n}").expect("the module ends");
    let paths: Vec<(String, String)> = source[start..end]
        .lines()
        .filter_map(|line| {
            let rest = line.trim().strip_prefix("pub const ")?;
            let (name, rest) = rest.split_once(": &str = \"")?;
            let value = rest.strip_suffix("\";")?;
            Some((name.to_owned(), value.to_owned()))
        })
        .collect();
    let constants = source[start..end].matches("pub const ").count();
    assert_eq!(paths.len(), constants, "every constant of paths is read");
    paths
}

/// The references to component schemas and responses that a document does not have.
pub fn dangling_references(document: &Value) -> Vec<String> {
    let text = document.to_string();
    let mut missing = Vec::new();
    for (kind, prefix) in [
        ("schemas", "#/components/schemas/"),
        ("responses", "#/components/responses/"),
    ] {
        for piece in text.split(prefix).skip(1) {
            let name = &piece[..piece.find('"').expect("a reference ends")];
            if document["components"][kind].get(name).is_none() {
                missing.push(format!("{prefix}{name}"));
            }
        }
    }
    missing
}

/// What `make deps` installs, and the advice when it is missing.
const INSTALL: &str = "make deps  (or: python3 -m venv target/schemathesis-venv && \
                       target/schemathesis-venv/bin/pip install 'schemathesis==4.32.5')";
/// Examples per operation and phase; with 31 operations the agent's run takes about 30 s on
/// two cores.
const EXAMPLES: u32 = 100;
const SEED: u64 = 20261122;
/// The whole schemathesis run is killed (and the test fails) after this long.
const DEADLINE: Duration = Duration::from_secs(180);

/// schemathesis' `st` executable. `SCHEMATHESIS` names another one, `SCHEMATHESIS_SEED`
/// another seed (the default is fixed, so a failure is reproducible), `SCHEMATHESIS_EXAMPLES`
/// another number of examples per operation.
#[derive(Debug)]
pub struct Schemathesis(PathBuf);

/// A finished (or killed) schemathesis run.
#[derive(Debug)]
pub struct Run {
    pub seed: u64,
    pub examples: u32,
    pub elapsed: Duration,
    /// `None` when it was killed at the deadline.
    pub status: Option<ExitStatus>,
    /// Its standard output and error.
    pub output: String,
}

impl Schemathesis {
    /// `$SCHEMATHESIS`, the venv `make deps` creates, `st` on the PATH, or pip's `--user`
    /// location; panics, saying how to install it, when none works (a test fails, it does not
    /// skip).
    pub fn find() -> Schemathesis {
        let works = |candidate: &Path| {
            Command::new(candidate)
                .arg("--version")
                .output()
                .is_ok_and(|out| {
                    out.status.success()
                        && String::from_utf8_lossy(&out.stdout).contains("st, version")
                })
        };
        if let Some(path) = std::env::var_os("SCHEMATHESIS") {
            let path = PathBuf::from(path);
            assert!(
                works(&path),
                "SCHEMATHESIS={} does not run `st --version`",
                path.display()
            );
            return Schemathesis(path);
        }
        let mut candidates = vec![workspace_root().join("target/schemathesis-venv/bin/st")];
        if let Some(path) = std::env::var_os("PATH") {
            candidates.extend(std::env::split_paths(&path).map(|dir| dir.join("st")));
        }
        if let Some(home) = std::env::var_os("HOME") {
            candidates.push(PathBuf::from(home).join(".local/bin/st"));
        }
        match candidates.iter().find(|candidate| works(candidate)) {
            Some(found) => Schemathesis(found.clone()),
            None => panic!(
                "schemathesis is not installed: no working `st` in $SCHEMATHESIS, {}, the PATH \
                 or ~/.local/bin; install it with:\n    {INSTALL}",
                candidates[0].display()
            ),
        }
    }

    /// Feeds every operation of `document` (a file of the repository's root) generated valid
    /// and invalid requests, single and chained along its links, on `http://{addr}` with the
    /// bearer `token`: a response must never be a 5xx, its status, media type and body must
    /// be what the document says, invalid requests and undocumented methods must be refused.
    /// Reports and hypothesis' files go to `dir`, not the tree.
    pub fn run(&self, document: &str, addr: SocketAddr, token: &str, dir: &Path) -> Run {
        let seed: u64 = env_or("SCHEMATHESIS_SEED", SEED);
        let examples: u32 = env_or("SCHEMATHESIS_EXAMPLES", EXAMPLES);
        let started = Instant::now();
        let mut child = Command::new(&self.0)
            .arg("run")
            .arg(workspace_root().join(document))
            .args(["--url", &format!("http://{addr}")])
            .args(["--header", &format!("Authorization: Bearer {token}")])
            .args([
                "--checks",
                "not_a_server_error,response_schema_conformance,status_code_conformance,\
                 content_type_conformance,negative_data_rejection,unsupported_method,\
                 allow_header_conformance",
            ])
            .args(["--max-examples", &examples.to_string()])
            .args(["--seed", &seed.to_string()])
            .args(["--workers", "2"])
            .args(["--request-timeout", "10"])
            .args(["--generation-database", "none"])
            .args(["--max-failures", "20"])
            .arg("--no-color")
            .current_dir(dir)
            .env_remove("SCHEMATHESIS_HOOKS")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run {}: {e}; install it with:\n    {INSTALL}",
                    self.0.display()
                )
            });
        // Read both pipes while waiting, so a chatty run never blocks on a full pipe.
        let readers = [
            child
                .stdout
                .take()
                .map(|pipe| Box::new(pipe) as Box<dyn Read + Send>),
            child
                .stderr
                .take()
                .map(|pipe| Box::new(pipe) as Box<dyn Read + Send>),
        ]
        .map(|pipe| {
            let mut pipe = pipe.expect("the pipe is taken once");
            std::thread::spawn(move || {
                let mut text = String::new();
                let _ = pipe.read_to_string(&mut text);
                text
            })
        });
        let status = loop {
            if let Some(status) = child.try_wait().expect("the child is waited for") {
                break Some(status);
            }
            if started.elapsed() > DEADLINE {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let [out, err] = readers.map(|reader| reader.join().expect("the pipe is read"));
        Run {
            seed,
            examples,
            elapsed: started.elapsed(),
            status,
            output: format!("{out}\n{err}"),
        }
    }
}

impl Run {
    /// Panics, with the output and how to reproduce it, unless schemathesis passed.
    pub fn assert_passed(&self) {
        let Run {
            seed,
            examples,
            elapsed,
            status,
            output,
        } = self;
        match status {
            None => {
                panic!("schemathesis did not finish within {DEADLINE:?} (seed {seed}):\n{output}")
            }
            Some(status) if !status.success() => panic!(
                "schemathesis found problems (seed {seed}, {examples} examples per operation, \
                 {elapsed:.0?}); reproduce with SCHEMATHESIS_SEED={seed}:\n{output}"
            ),
            Some(_) => eprintln!("schemathesis passed in {elapsed:.0?} (seed {seed}):\n{output}"),
        }
    }
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(text) => text
            .parse()
            .unwrap_or_else(|_| panic!("{name}={text:?} is not a number")),
        Err(_) => default,
    }
}
