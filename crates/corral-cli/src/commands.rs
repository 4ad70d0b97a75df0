//! The subcommands that talk to the agent: their arguments, the request each sends through
//! corral-client, and how each renders the answer (a table, or the API's JSON).

use std::collections::HashSet;
use std::fs;
use std::io::{self, Read};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use clap::{ArgGroup, Args, Subcommand, ValueEnum};
use corral_api::{
    AllocateRequest, AttachmentKey, DEFAULT_POOL, ExclusionRequest, FamilyChoice, GcRequest,
    GcSuspect, LeaseStartRequest, LeaseStopRequest, RangeRemoval, RangeRequest, ReleaseRequest,
};
use corral_client::Client;
use corral_cluster::report::readable_count;
use serde::Serialize;

use crate::check::{self, KeyText};
use crate::exit::{Exit, Failure, Outcome};
use crate::output::{self, Table};
use crate::{Globals, Output, parse};

// ---- arguments --------------------------------------------------------------------------

#[derive(Debug, Args)]
pub struct AllocArgs {
    /// The pool to allocate from
    #[arg(long, default_value = DEFAULT_POOL)]
    pool: String,
    /// Which family; defaults to the family of --address, else ipv4 (dual: one of each, all
    /// or nothing)
    #[arg(long, value_enum)]
    family: Option<FamilyArg>,
    /// A specific address instead of the next free one
    #[arg(long)]
    address: Option<IpAddr>,
    /// Who holds the address (free text; `release --owner` releases all it holds)
    #[arg(long)]
    owner: String,
    /// The CNI attachment the address is for; allocating again with it returns the same
    /// address
    #[arg(long, value_name = "NETWORK/CONTAINER/IFNAME", value_parser = parse::attachment_key)]
    key: Option<AttachmentKey>,
    /// Start an expiration timer with the allocation (e.g. 30s, 5m, 1h)
    #[arg(long, value_name = "DURATION", value_parser = parse::duration_ms)]
    lease: Option<u64>,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum FamilyArg {
    Ipv4,
    Ipv6,
    Dual,
}

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("what").required(true).args(["key", "address", "owner"])))]
pub struct ReleaseArgs {
    /// Every address of this CNI attachment
    #[arg(long, value_name = "NETWORK/CONTAINER/IFNAME", value_parser = parse::attachment_key)]
    key: Option<AttachmentKey>,
    /// This address
    #[arg(long)]
    address: Option<IpAddr>,
    /// With --address: only if the address is still of this generation
    // (clap waives `requires` when the required argument conflicts with one given, as the
    // group makes --address conflict with --key and --owner: hence the explicit conflicts.)
    #[arg(long, requires = "address", conflicts_with_all = ["key", "owner"])]
    generation: Option<u64>,
    /// Every address this owner holds
    #[arg(long)]
    owner: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum PoolCommand {
    /// The pools with their ranges and exclusions
    List,
    /// Add a range to a pool, creating the pool if it does not exist
    Add {
        pool: String,
        /// SUBNET[,range=START-END][,start=IP][,end=IP][,gateway=IP], or a bare address
        range: String,
    },
    /// Remove a range; one that holds allocations drains (hands out nothing more and goes
    /// with its last allocation)
    Remove { pool: String, range: String },
    /// Exclude from the pools every address the node's routes and interface addresses cover
    /// (the agent reads them; it also does this when it starts)
    ///
    /// Replaces what the last reservation excluded: an exclusion whose route or address is
    /// gone is removed. A route or address is the pool's own, and excludes nothing, when it
    /// holds a whole range's subnet (the bridge's subnet route, the default route), is a
    /// range's gateway, goes through the interface holding a gateway (the bridge), or is a
    /// pod's host route. An allocated address is never excluded nor released: it is shown
    /// as a conflict.
    ReserveLocalRoutes,
}

#[derive(Debug, Args)]
pub struct ExcludeArgs {
    pool: String,
    /// An address, or a network in CIDR form
    network: String,
    /// Why (shown by `corral pool list`)
    #[arg(long, conflicts_with = "remove")]
    reason: Option<String>,
    /// Remove the exclusion instead of adding it
    #[arg(long)]
    remove: bool,
}

#[derive(Debug, Subcommand)]
pub enum LeaseCommand {
    /// Start an expiration timer: the address is released when it runs out
    Start {
        address: IpAddr,
        /// e.g. 30s, 5m, 1h30m
        #[arg(value_parser = parse::duration_ms)]
        duration: u64,
    },
    /// Stop a timer; the address stays allocated
    Stop {
        address: IpAddr,
        /// The lease's id, as `lease start` or `dump` show it
        id: String,
    },
}

#[derive(Debug, Args)]
pub struct ExportArgs {
    /// Where to write the checkpoint (default, or "-": standard output)
    file: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ImportArgs {
    /// The checkpoint document ("-": standard input)
    file: PathBuf,
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The live attachments, one NETWORK/CONTAINER/IFNAME per line ("-": standard input;
    /// blank lines and lines starting with # are skipped)
    #[arg(long, value_name = "FILE")]
    live: PathBuf,
}

#[derive(Debug, Args)]
pub struct GcArgs {
    /// The live attachments, one NETWORK/CONTAINER/IFNAME per line ("-": standard input;
    /// blank lines and lines starting with # are skipped); a malformed line is refused, naming
    /// it, before anything is sent
    #[arg(long, value_name = "FILE")]
    live: PathBuf,
    /// How long after an attachment was first seen missing its addresses may go (e.g. 30s,
    /// 15m) [default: 15m]
    #[arg(long, value_name = "DURATION", value_parser = parse::duration_ms)]
    grace: Option<u64>,
    /// Release at most this many attachments in this run; the rest wait for the next [default:
    /// 64]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    max: Option<u64>,
    /// Report what this run would do, and change nothing (no suspect is recorded either)
    #[arg(long)]
    dry_run: bool,
}

// ---- the session ------------------------------------------------------------------------

/// What every subcommand works with: the client and the global options.
#[derive(Debug)]
pub struct Session {
    pub(crate) client: Client,
    output: Output,
    scope: String,
    all_scopes: bool,
    /// The scope reads show: `None` for every scope.
    read_scope: Option<String>,
}

impl Session {
    pub fn new(globals: &Globals) -> Session {
        Session {
            client: Client::unix(globals.socket()),
            output: globals.output,
            scope: globals.scope.clone(),
            all_scopes: globals.all_scopes,
            read_scope: (!globals.all_scopes).then(|| globals.scope.clone()),
        }
    }

    /// The scope a change applies to.
    fn write_scope(&self) -> Result<String, Failure> {
        if self.all_scopes {
            return Err(Failure::Usage(
                "--all-scopes applies to status, dump, pool list and check only".to_owned(),
            ));
        }
        Ok(self.scope.clone())
    }

    /// The answer as JSON, or as `table` renders it.
    pub(crate) fn render<T: Serialize>(
        &self,
        value: &T,
        table: impl FnOnce(&T) -> String,
    ) -> Result<Outcome, Failure> {
        Ok(Outcome::ok(match self.output {
            Output::Json => output::json(value)?,
            Output::Table => table(value),
        }))
    }
}

// ---- subcommands ------------------------------------------------------------------------

pub fn status(session: &mut Session) -> Result<Outcome, Failure> {
    let response = session.client.status(session.read_scope.as_deref())?;
    session.render(&response, |response| {
        let mut table = Table::new(&[
            "SCOPE", "POOL", "FAMILY", "CAPACITY", "USED", "FREE", "EXCLUDED", "COOLING",
        ])
        .right(&["CAPACITY", "USED", "FREE", "EXCLUDED", "COOLING"]);
        for scope in &response.scopes {
            for pool in &scope.pools {
                for family in &pool.families {
                    table.push(vec![
                        scope.scope.clone(),
                        pool.pool.clone(),
                        output::family(family.family).to_owned(),
                        readable_count(&family.capacity),
                        readable_count(&family.used),
                        readable_count(&family.free),
                        readable_count(&family.excluded),
                        readable_count(&family.cooling),
                    ]);
                }
            }
        }
        let mut text = String::new();
        if !response.ready {
            text.push_str("the agent is still restoring its state (not ready)\n");
        }
        if table.is_empty() {
            text.push_str("no pools\n");
        } else {
            text.push_str(&table.render());
        }
        for warning in &response.warnings {
            text.push_str(&format!("warning: {warning}\n"));
        }
        // The cluster link's last error (another agent holding the node's liveness, say).
        if let Some(error) = response
            .cluster
            .as_ref()
            .and_then(|c| c.last_error.as_ref())
        {
            text.push_str(&format!("cluster error: {error}\n"));
        }
        // Cloud records the cluster link skipped, and cloud addresses frozen in use.
        for problem in response.cluster.iter().flat_map(|c| &c.problems) {
            text.push_str(&format!("cluster problem: {problem}\n"));
        }
        text
    })
}

pub fn dump(session: &mut Session) -> Result<Outcome, Failure> {
    let response = session.client.dump(session.read_scope.as_deref())?;
    session.render(&response, |response| {
        let mut table = Table::new(&[
            "SCOPE",
            "POOL",
            "ADDRESS",
            "OWNER",
            "ATTACHMENT",
            "GENERATION",
            "LEASE",
            "EXPIRES",
        ])
        .right(&["GENERATION"]);
        for scope in &response.scopes {
            for pool in &scope.pools {
                for entry in &pool.allocations {
                    table.push(vec![
                        scope.scope.clone(),
                        pool.pool.clone(),
                        entry.address.to_string(),
                        entry.owner.clone(),
                        entry
                            .key
                            .as_ref()
                            .map_or_else(output::none, |key| KeyText::of(key).0),
                        entry.generation.to_string(),
                        entry
                            .lease
                            .as_ref()
                            .map_or_else(output::none, |lease| lease.id.clone()),
                        entry
                            .lease
                            .as_ref()
                            .map_or_else(output::none, |lease| output::utc(lease.expires_at_ms)),
                    ]);
                }
            }
        }
        if table.is_empty() {
            "no allocations\n".to_owned()
        } else {
            table.render()
        }
    })
}

/// How long `corral alloc` waits for the agent's answer: in a pool the cluster grants, the agent
/// holds an allocation up to its pool wait (20 s by default) for a grant, as it does a CNI ADD;
/// the same bound as corral-ipam's.
const ALLOC_ANSWER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

pub fn alloc(session: &mut Session, args: AllocArgs) -> Result<Outcome, Failure> {
    session.client = std::mem::replace(&mut session.client, Client::unix(""))
        .with_read_timeout(Some(ALLOC_ANSWER_TIMEOUT));
    let request = AllocateRequest {
        scope: session.write_scope()?,
        pool: args.pool,
        family: args.family.map(|family| match family {
            FamilyArg::Ipv4 => FamilyChoice::Ipv4,
            FamilyArg::Ipv6 => FamilyChoice::Ipv6,
            FamilyArg::Dual => FamilyChoice::Dual,
        }),
        address: args.address,
        owner: args.owner,
        key: args.key,
        lease_ms: args.lease,
    };
    let response = session.client.allocate(&request)?;
    session.render(&response, |response| {
        let mut table = Table::new(&[
            "ADDRESS",
            "FAMILY",
            "POOL",
            "GENERATION",
            "SUBNET",
            "GATEWAY",
            "LEASE",
            "EXPIRES",
            "STATE",
        ])
        .right(&["GENERATION"]);
        for allocated in &response.allocations {
            table.push(vec![
                allocated.address.to_string(),
                output::family(allocated.family).to_owned(),
                allocated.pool.clone(),
                allocated.generation.to_string(),
                allocated.subnet.clone().unwrap_or_else(output::none),
                allocated
                    .gateway
                    .map_or_else(output::none, |gateway| gateway.to_string()),
                allocated
                    .lease
                    .as_ref()
                    .map_or_else(output::none, |lease| lease.id.clone()),
                allocated
                    .lease
                    .as_ref()
                    .map_or_else(output::none, |lease| output::utc(lease.expires_at_ms)),
                if allocated.existing {
                    "existing"
                } else {
                    "new"
                }
                .to_owned(),
            ]);
        }
        table.render()
    })
}

pub fn release(session: &mut Session, args: ReleaseArgs) -> Result<Outcome, Failure> {
    let request = ReleaseRequest {
        scope: session.write_scope()?,
        key: args.key,
        address: args.address,
        generation: args.generation,
        owner: args.owner,
    };
    let response = session.client.release(&request)?;
    session.render(&response, |response| {
        let mut table = Table::new(&["ADDRESS", "POOL", "GENERATION"]).right(&["GENERATION"]);
        for released in &response.released {
            table.push(vec![
                released.address.to_string(),
                released.pool.clone(),
                released.generation.to_string(),
            ]);
        }
        if table.is_empty() {
            "nothing released: nothing matched\n".to_owned()
        } else {
            table.render()
        }
    })
}

pub fn pool(session: &mut Session, command: PoolCommand) -> Result<Outcome, Failure> {
    match command {
        PoolCommand::List => {
            let response = session.client.pools(session.read_scope.as_deref())?;
            session.render(&response, |response| {
                let mut table =
                    Table::new(&["SCOPE", "POOL", "COOLDOWN", "REUSE", "RANGE", "EXCLUSION"]);
                for pool in &response.pools {
                    // Each range with where it came from; a draining one with how many
                    // allocations it still holds; file ranges removed at run time last.
                    let ranges: Vec<String> = pool
                        .ranges
                        .iter()
                        .map(|range| {
                            let source = output::range_source(range.source);
                            if range.draining {
                                format!(
                                    "{} [{source}] (draining, {} left)",
                                    range.range, range.allocated
                                )
                            } else {
                                format!("{} [{source}]", range.range)
                            }
                        })
                        .chain(
                            pool.removed
                                .iter()
                                .map(|range| format!("{range} [file] (removed)")),
                        )
                        .collect();
                    let exclusions: Vec<String> = pool
                        .exclusions
                        .iter()
                        .map(|exclusion| {
                            if exclusion.reason.is_empty() {
                                exclusion.network.clone()
                            } else {
                                format!("{} ({})", exclusion.network, exclusion.reason)
                            }
                        })
                        .collect();
                    // The pool's own cells on its first line; its ranges and exclusions side
                    // by side, one per line.
                    let lines = ranges.len().max(exclusions.len()).max(1);
                    for line in 0..lines {
                        let first = line == 0;
                        table.push(vec![
                            if first {
                                pool.scope.clone()
                            } else {
                                String::new()
                            },
                            if first {
                                pool.name.clone()
                            } else {
                                String::new()
                            },
                            if first {
                                output::duration(pool.cooldown_ms)
                            } else {
                                String::new()
                            },
                            match (first, pool.lowest_free) {
                                (false, _) => String::new(),
                                (true, true) => "lowest-free".to_owned(),
                                (true, false) => "next-fit".to_owned(),
                            },
                            ranges.get(line).cloned().unwrap_or_default(),
                            exclusions.get(line).cloned().unwrap_or_default(),
                        ]);
                    }
                }
                if table.is_empty() {
                    "no pools\n".to_owned()
                } else {
                    table.render()
                }
            })
        }
        PoolCommand::Add { pool, range } => {
            let request = RangeRequest {
                scope: session.write_scope()?,
                pool,
                range,
            };
            let done = session.client.add_range(&request)?;
            session.render(&done, |_| {
                format!(
                    "added range {} to pool {} (scope {})\n",
                    request.range, request.pool, request.scope
                )
            })
        }
        PoolCommand::Remove { pool, range } => {
            let request = RangeRequest {
                scope: session.write_scope()?,
                pool,
                range,
            };
            let removed = session.client.remove_range(&request)?;
            session.render(&removed, |removed| match removed.outcome {
                RangeRemoval::Removed => format!(
                    "removed range {} from pool {} (scope {})\n",
                    request.range, request.pool, request.scope
                ),
                RangeRemoval::Draining => format!(
                    "range {} of pool {} (scope {}) is draining: it holds allocations, hands out \
                     nothing more, and goes with the last of them\n",
                    request.range, request.pool, request.scope
                ),
            })
        }
        PoolCommand::ReserveLocalRoutes => {
            let request = corral_api::ReserveLocalRoutesRequest {
                scope: session.write_scope()?,
            };
            let response = session.client.reserve_local_routes(&request)?;
            session.render(&response, crate::local_routes::table)
        }
    }
}

pub fn exclude(session: &mut Session, args: ExcludeArgs) -> Result<Outcome, Failure> {
    let request = ExclusionRequest {
        scope: session.write_scope()?,
        pool: args.pool,
        network: args.network,
        reason: args.reason.unwrap_or_default(),
    };
    if args.remove {
        let done = session.client.remove_exclusion(&request)?;
        session.render(&done, |_| {
            format!(
                "removed the exclusion of {} from pool {}\n",
                request.network, request.pool
            )
        })
    } else {
        let done = session.client.add_exclusion(&request)?;
        session.render(&done, |_| {
            format!("excluded {} from pool {}\n", request.network, request.pool)
        })
    }
}

pub fn lease(session: &mut Session, command: LeaseCommand) -> Result<Outcome, Failure> {
    match command {
        LeaseCommand::Start { address, duration } => {
            let request = LeaseStartRequest {
                scope: session.write_scope()?,
                address,
                duration_ms: duration,
            };
            let lease = session.client.lease_start(&request)?;
            session.render(&lease, |lease| {
                format!(
                    "lease {} on {address} expires at {}\n",
                    lease.id,
                    output::utc(lease.expires_at_ms)
                )
            })
        }
        LeaseCommand::Stop { address, id } => {
            let request = LeaseStopRequest {
                scope: session.write_scope()?,
                address,
                id,
            };
            let done = session.client.lease_stop(&request)?;
            session.render(&done, |_| {
                format!("stopped lease {} on {address}\n", request.id)
            })
        }
    }
}

pub fn export(session: &mut Session, args: ExportArgs) -> Result<Outcome, Failure> {
    let checkpoint = session.client.export_checkpoint()?;
    let text = output::json(&checkpoint)?;
    match args.file.filter(|file| !is_stdio(file)) {
        None => Ok(Outcome::ok(text)),
        Some(file) => {
            fs::write(&file, text).map_err(|source| Failure::File {
                action: "write",
                path: file.clone(),
                source,
            })?;
            Ok(Outcome::ok(match session.output {
                Output::Table => format!("exported the checkpoint to {}\n", file.display()),
                Output::Json => String::new(),
            }))
        }
    }
}

pub fn import(session: &mut Session, args: ImportArgs) -> Result<Outcome, Failure> {
    let text = read_input(&args.file)?;
    let checkpoint: serde_json::Value = serde_json::from_str(&text)
        .map_err(|error| Failure::Usage(format!("{} is not JSON: {error}", args.file.display())))?;
    let done = session.client.import_checkpoint(&checkpoint)?;
    session.render(&done, |_| {
        format!("imported the checkpoint from {}\n", args.file.display())
    })
}

pub fn check(session: &mut Session, args: CheckArgs) -> Result<Outcome, Failure> {
    let live: HashSet<KeyText> = read_live(&args.live)?.iter().map(KeyText::of).collect();

    let dump = session.client.dump(session.read_scope.as_deref())?;
    let status = session.client.status(session.read_scope.as_deref())?;
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
        });
    let report = check::report(&dump, &status, &live, now_ms)
        .map_err(|message| Failure::Agent(corral_client::Error::Protocol(message)))?;

    let mut outcome = session.render(&report, |report| {
        let mut text = String::new();
        if !report.problems.is_empty() {
            let mut table = Table::new(&["PROBLEM", "SCOPE", "POOL", "SUBJECT", "DETAIL"]);
            for problem in &report.problems {
                table.push(vec![
                    problem.problem.label().to_owned(),
                    problem.scope.clone(),
                    problem.pool.clone(),
                    problem.subject.clone(),
                    problem.detail.clone(),
                ]);
            }
            text.push_str(&table.render());
        }
        text.push_str(&format!(
            "{} in {} allocations and {} pools\n",
            match report.problems.len() {
                0 => "no problems".to_owned(),
                1 => "1 problem".to_owned(),
                n => format!("{n} problems"),
            },
            report.allocations_checked,
            report.pools_checked
        ));
        text
    })?;
    if !report.ok {
        outcome.exit = Exit::ProblemsFound;
    }
    Ok(outcome)
}

pub fn gc(session: &mut Session, args: GcArgs) -> Result<Outcome, Failure> {
    let live = read_live(&args.live)?;
    let request = GcRequest {
        scope: session.write_scope()?,
        live,
        grace_ms: args.grace,
        max_released: args.max,
        dry_run: args.dry_run,
    };
    let response = session.client.gc(&request)?;
    session.render(&response, |response| {
        let mut table = Table::new(&["ATTACHMENT", "STATE", "ADDRESSES", "FIRST SEEN", "DUE"]);
        let groups: [(&str, &[GcSuspect]); 4] = [
            (
                if response.dry_run {
                    "would release"
                } else {
                    "released"
                },
                &response.released,
            ),
            ("capped", &response.capped),
            ("waiting", &response.waiting),
            ("recorded", &response.recorded),
        ];
        for (state, suspects) in groups {
            for suspect in suspects {
                table.push(vec![
                    key_text(&suspect.key),
                    state.to_owned(),
                    suspect
                        .addresses
                        .iter()
                        .map(|a| a.address.to_string())
                        .collect::<Vec<_>>()
                        .join(","),
                    output::utc(suspect.first_seen_ms),
                    suspect.due_ms.map_or_else(output::none, output::utc),
                ]);
            }
        }
        for key in &response.cleared {
            table.push(vec![
                key_text(key),
                "cleared".to_owned(),
                output::none(),
                output::none(),
                output::none(),
            ]);
        }
        let mut text = if table.is_empty() {
            String::new()
        } else {
            table.render()
        };
        text.push_str(&format!(
            "{} live, {} recorded, {} {}, {} waiting, {} capped, {} cleared{}\n",
            response.live,
            response.recorded.len(),
            response.released.len(),
            if response.dry_run {
                "would be released"
            } else {
                "released"
            },
            response.waiting.len(),
            response.capped.len(),
            response.cleared.len(),
            if response.dry_run {
                " (dry run: nothing changed)"
            } else {
                ""
            },
        ));
        text
    })
}

// ---- helpers ----------------------------------------------------------------------------

fn key_text(key: &AttachmentKey) -> String {
    format!("{}/{}/{}", key.network, key.container_id, key.ifname)
}

/// The live attachments a file lists: one `NETWORK/CONTAINER/IFNAME` per line, each checked
/// against the CNI naming rules; blank lines and `#` comments are skipped. A bad line is a
/// usage error naming the file and the line.
fn read_live(path: &Path) -> Result<Vec<AttachmentKey>, Failure> {
    let text = read_input(path)?;
    let mut live = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let key = parse::attachment_key(line)
            .and_then(|key| {
                corral_core::AttachmentKey::new(&key.network, &key.container_id, &key.ifname)
                    .map(|_| key)
                    .map_err(|error| error.to_string())
            })
            .map_err(|error| {
                Failure::Usage(format!("{} line {}: {error}", path.display(), index + 1))
            })?;
        live.push(key);
    }
    Ok(live)
}

fn is_stdio(path: &Path) -> bool {
    path.as_os_str() == "-"
}

/// The text of `path`, or of standard input for `-`.
pub(crate) fn read_input(path: &Path) -> Result<String, Failure> {
    let failure = |source| Failure::File {
        action: "read",
        path: path.to_owned(),
        source,
    };
    if is_stdio(path) {
        let mut text = String::new();
        io::stdin().read_to_string(&mut text).map_err(failure)?;
        Ok(text)
    } else {
        fs::read_to_string(path).map_err(failure)
    }
}
