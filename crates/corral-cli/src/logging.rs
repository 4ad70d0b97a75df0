//! The daemons' logs (`corral agent`, `corral operator`): which `tracing` subscriber writes
//! their events and spans on stderr, in which format, from which level.
//!
//! The libraries (corral-agent, corral-operator, corral-http) emit `tracing` events with
//! fields and open spans (a node's reconcile task, an API request, the agent's cluster link);
//! only this binary installs a subscriber. `--log-format text` (the default) writes one
//! readable line an event (`TIME LEVEL spans: target: message key=value ...`, coloured only
//! on a terminal), `--log-format json` one JSON object a line (`timestamp`, `level`,
//! `target`, `fields` with `message`, `span` and `spans`). `--log-level` is the lowest level
//! written. The agent's configuration file may set both (`[log]`: `format`, `level`); a flag
//! wins over the file. `CORRAL_LOG` adds per-module directives in `RUST_LOG`'s syntax
//! (`corral_agent::link=debug,corral_http=debug`), a bare level among them overriding
//! `--log-level`.
//!
//! The CLI's other subcommands and the CNI plugin print plain text and install nothing.

use std::io::IsTerminal as _;
use std::sync::OnceLock;

use clap::{Args, ValueEnum};
use corral_cluster::daemon::LogTable;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::{Directive, LevelFilter};

use crate::exit::Failure;

/// The environment variable of per-module log directives.
pub const LOG_ENV: &str = "CORRAL_LOG";

/// How a daemon writes its log.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// One readable line an event
    Text,
    /// One JSON object a line
    Json,
}

/// The log options of `corral agent` and `corral operator`. Options, not clap defaults, so
/// that the agent's configuration file fills in what the flags leave out.
#[derive(Debug, Args)]
#[command(next_help_heading = "Log options")]
pub struct LogArgs {
    /// How the log is written on stderr: readable lines, or one JSON object a line (level,
    /// target, fields with the message, spans) for a log collector [default: text]
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub log_format: Option<LogFormat>,
    /// The lowest level written: error, warn, info, debug or trace (CORRAL_LOG sets levels
    /// per module, e.g. CORRAL_LOG=corral_agent::link=debug) [default: info]
    #[arg(long, value_name = "LEVEL")]
    pub log_level: Option<LevelFilter>,
}

impl LogArgs {
    /// The flags over the agent configuration file's `[log]` table (`file`, read from
    /// `path`), over the defaults (text, info). A value of the file that does not parse is
    /// a usage error naming the file.
    pub fn over_file(
        &self,
        file: &LogTable,
        path: Option<&std::path::Path>,
    ) -> Result<(LogFormat, LevelFilter), Failure> {
        let bad = |key: &str, value: &str, expected: &str| {
            let path = path.map(|p| p.display().to_string()).unwrap_or_default();
            Failure::Usage(format!("{path}: log.{key} {value:?} is not {expected}"))
        };
        let format = match (self.log_format, &file.format) {
            (Some(format), _) => format,
            (None, Some(value)) => LogFormat::from_str(value, false)
                .map_err(|_| bad("format", value, LogTable::FORMATS))?,
            (None, None) => LogFormat::Text,
        };
        let level = match (self.log_level, &file.level) {
            (Some(level), _) => level,
            (None, Some(value)) => value
                .parse()
                .map_err(|_| bad("level", value, LogTable::LEVELS))?,
            (None, None) => LevelFilter::INFO,
        };
        Ok((format, level))
    }
}

/// The format installed, once a daemon installed its subscriber.
static INSTALLED: OnceLock<LogFormat> = OnceLock::new();

/// The format of the subscriber installed, if a daemon installed one.
pub fn installed() -> Option<LogFormat> {
    INSTALLED.get().copied()
}

/// The filter: `level`, then `CORRAL_LOG`'s directives (`env`) over it, in order.
fn filter(level: LevelFilter, env: Option<&str>) -> Result<EnvFilter, Failure> {
    let mut filter = EnvFilter::builder()
        .with_regex(false)
        .parse(level.to_string())
        .map_err(|e| Failure::Usage(format!("--log-level {level}: {e}")))?;
    for directive in env
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
    {
        let parsed: Directive = directive.parse().map_err(|e| {
            Failure::Usage(format!("{LOG_ENV}: {directive:?} is no directive: {e}"))
        })?;
        filter = filter.add_directive(parsed);
    }
    Ok(filter)
}

/// Installs the daemon's subscriber on stderr, writing `format` from `level` (the first call
/// only: a second is refused by `tracing` and changes nothing). A `CORRAL_LOG` that does not
/// parse is a usage error.
pub fn install(format: LogFormat, level: LevelFilter) -> Result<(), Failure> {
    let env = std::env::var(LOG_ENV).ok();
    let filter = filter(level, env.as_deref())?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let installed = match format {
        LogFormat::Text => builder
            .with_ansi(std::io::stderr().is_terminal())
            .try_init(),
        LogFormat::Json => builder
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .try_init(),
    };
    if installed.is_ok() {
        let _ = INSTALLED.set(format);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn corral_log_adds_directives_and_refuses_what_does_not_parse() {
        let filter = filter(LevelFilter::INFO, Some("corral_agent::link=debug, warn")).unwrap();
        let text = filter.to_string();
        assert!(text.contains("corral_agent::link=debug"), "{text}");
        // The bare level given last replaces --log-level's.
        assert!(text.contains("warn") && !text.contains("info"), "{text}");
        let Err(Failure::Usage(message)) = filter_refused() else {
            panic!("a bad CORRAL_LOG is a usage error");
        };
        assert!(message.starts_with("CORRAL_LOG: \"x=loud\""), "{message}");
    }

    fn filter_refused() -> Result<EnvFilter, Failure> {
        filter(LevelFilter::INFO, Some("x=loud"))
    }
}
