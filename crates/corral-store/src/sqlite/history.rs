//! The allocation history in SQLite (schema 7): an append-only log of events numbered in the
//! order recorded, summarised in chunks, with no index written per event.
//!
//! * `history_events (seq, first, n, min_at, events)`: one row per write of a transaction's
//!   events (a commit's, at most [`ROW_MAX`] of them), keyed by its last event's number:
//!   `first` is its first event's, `n` how many it holds, `min_at` the oldest time among them,
//!   and `events` each event's number (as a gap from the one before), time and compact
//!   encoding (`encode`), in order. A commit appends one row at the end of the table's
//!   B-tree, whatever the number of its events: SQLite's insert of a row (~1,900
//!   instructions) is paid once per commit, not once per event as in schema 6 (one row per
//!   event), and schema 5 also inserted each event into four indexes (time, address, owner,
//!   container), each on a page of its own (BENCHMARKS.md).
//! * Pruning drops events, not rows: a row that holds events on both sides of what goes is
//!   rewritten with the events it keeps (keyed by the last of them), so the count and the age
//!   bounds drop exactly the events they dropped when each event was a row, and an event
//!   keeps its number (rows never overlap).
//! * `history_chunks`: a summary of each [`CHUNK`] consecutive sequence numbers, written once
//!   the log holds that many events past the last chunk (by
//!   [`Txn::prune_history`](crate::Txn::prune_history), in the commit that records the
//!   chunk's last events): the range, the oldest and newest time, the scopes, and a Bloom
//!   filter each of the addresses, owners and containers. Events past the last chunk are the
//!   *tail*.
//! * A query reads the tail (fewer than [`CHUNK`] events while the agent prunes) and then the
//!   chunks whose filters and times may hold a match, newest first, and stops once no chunk
//!   left can hold an event newer than the last it keeps; who held an address at an instant
//!   stops once every scope of the chunks left has a newer event.
//!
//! A chunk is only ever a summary of rows already written, in the same transaction as its
//! rows or a later one: a crash before a chunk is written leaves its events in the tail,
//! which every query reads, so nothing acknowledged is lost or unanswered. Pruning deletes
//! rows and keeps every chunk a superset of its rows (a stale key only costs a chunk read);
//! chunks whose rows all went are dropped, and rows only ever get numbers above every chunk.
//!
//! The agent's store (owned mode) keeps the log's ends in memory across its commits
//! ([`Ends`]), so a commit that neither prunes nor completes a chunk runs no query at all
//! for the history's bounds; and with them the summaries of the tail's chunks, each event
//! added as it is written ([`Open`]), so completing a chunk reads none of its rows back. They
//! are made from the tail's rows once after an open (a restart or a crash), a rollback, or a
//! prune that reached the tail. Other stores read a chunk's rows back to summarise it.

use std::cmp::Reverse;
use std::collections::VecDeque;
use std::net::IpAddr;

use corral_core::{AttachmentKey, Family, PoolName, Timestamp};
use rusqlite::{Connection, OptionalExtension, Row, params};

use super::columns::{addr_blob, corrupt, family_code, millis, read_addr};
use crate::history::holders;
use crate::{
    HistoryEvent, HistoryKind, HistoryLimits, HistoryQuery, HistoryRecord, PRUNE_BATCH, StoreError,
};

/// Sequence numbers per chunk.
pub(crate) const CHUNK: i64 = 1024;

/// Version 6: the log, one row per event, and its chunks; the migration moves schema 5's
/// rows into it, and 6 → 7 groups them ([`SCHEMA_7_EVENTS`]).
const SCHEMA_6_HISTORY: &str = "CREATE TABLE history_events (
        seq INTEGER PRIMARY KEY,
        at INTEGER NOT NULL,
        event BLOB NOT NULL
    ) STRICT;
    CREATE TABLE history_chunks (
        lo INTEGER PRIMARY KEY,
        hi INTEGER NOT NULL,
        min_at INTEGER NOT NULL,
        max_at INTEGER NOT NULL,
        scopes BLOB NOT NULL,
        addrs BLOB NOT NULL,
        owners BLOB NOT NULL,
        containers BLOB NOT NULL
    ) STRICT;
    CREATE INDEX history_chunks_by_age ON history_chunks (min_at);";

/// Version 7: the log's rows hold a write's events (the module's documentation); the chunks
/// are schema 6's.
const SCHEMA_7_EVENTS: &str = "CREATE TABLE history_events (
        seq INTEGER PRIMARY KEY,
        first INTEGER NOT NULL,
        n INTEGER NOT NULL,
        min_at INTEGER NOT NULL,
        events BLOB NOT NULL
    ) STRICT;";

/// The most events in one row: a query that reads a chunk reads the rows that hold its
/// events, each whole, so a transaction of many events (a migration, an import) is written
/// as several rows.
pub(crate) const ROW_MAX: usize = 256;

/// 5 → 6: the log; schema 5's events, if it has some, become the log's, in their order and
/// with their numbers, and the old table and its four indexes go; 6 → 7 then groups them and
/// summarises every whole chunk. (A database of schema 4 or less goes through 5 without the
/// old table.)
pub(super) fn migrate_to_log(tx: &rusqlite::Transaction<'_>) -> Result<(), StoreError> {
    tx.execute_batch(SCHEMA_6_HISTORY)?;
    let old: bool = tx.query_row(
        "SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = 'history'",
        [],
        |r| r.get(0),
    )?;
    if !old {
        return Ok(());
    }
    {
        let mut select = tx.prepare(&format!(
            "SELECT {}, seq FROM history ORDER BY seq",
            HISTORY_COLUMNS
        ))?;
        let mut insert =
            tx.prepare("INSERT INTO history_events (seq, at, event) VALUES (?1, ?2, ?3)")?;
        let mut rows = select.query([])?;
        let mut buf = Vec::new();
        while let Some(row) = rows.next()? {
            let event = read_history(row)??;
            let seq: i64 = row.get(11)?;
            buf.clear();
            encode((&event).into(), &mut buf);
            insert.execute(params![seq, millis(event.at), buf])?;
        }
    }
    tx.execute_batch("DROP TABLE history")?;
    Ok(())
}

/// 6 → 7: schema 6's rows, one per event, grouped into rows of up to [`ROW_MAX`] events, with
/// their numbers and times; the chunks stay as they are (their summaries are of the events,
/// not of the rows), and every whole chunk of the tail not yet summarised is.
pub(super) fn migrate_to_rows(tx: &rusqlite::Transaction<'_>) -> Result<(), StoreError> {
    tx.execute_batch("ALTER TABLE history_events RENAME TO history_events_6")?;
    tx.execute_batch(SCHEMA_7_EVENTS)?;
    {
        let mut select = tx.prepare("SELECT seq, at, event FROM history_events_6 ORDER BY seq")?;
        let mut rows = select.query([])?;
        let mut group = RowBuilder::new();
        while let Some(row) = rows.next()? {
            let (seq, at): (i64, i64) = (row.get(0)?, row.get(1)?);
            if group.n == ROW_MAX || !group.fits(seq) {
                group.insert(tx)?;
                group = RowBuilder::new();
            }
            group.push(seq, at, blob(row, 2)?);
        }
        group.insert(tx)?;
    }
    tx.execute_batch("DROP TABLE history_events_6")?;
    let mut ends = Ends::load(tx)?;
    build_chunks(tx, &mut ends)?;
    Ok(())
}

/// Schema 5's history columns, in the order `read_history` reads them (the migration from it).
macro_rules! history_columns {
    () => {
        "at, kind, scope, pool, family, addr, network, container_id, ifname, owner, generation"
    };
}
const HISTORY_COLUMNS: &str = history_columns!();

fn read_history(row: &Row<'_>) -> Result<Result<HistoryEvent, StoreError>, rusqlite::Error> {
    let at: i64 = row.get(0)?;
    let kind: i64 = row.get(1)?;
    let scope: String = row.get(2)?;
    let pool: String = row.get(3)?;
    let family: i64 = row.get(4)?;
    let addr: Vec<u8> = row.get(5)?;
    let network: Option<String> = row.get(6)?;
    let container_id: Option<String> = row.get(7)?;
    let ifname: Option<String> = row.get(8)?;
    let owner: String = row.get(9)?;
    let generation: i64 = row.get(10)?;
    Ok((|| {
        let key = match (network, container_id, ifname) {
            (Some(n), Some(c), Some(i)) => {
                Some(AttachmentKey::new(&n, &c, &i).map_err(|e| corrupt("history", e))?)
            }
            _ => None,
        };
        Ok(HistoryEvent {
            at: Timestamp::from_unix_millis(u64::try_from(at).unwrap_or(0)),
            kind: HistoryKind::from_code(kind)
                .ok_or_else(|| corrupt("history", format!("event kind {kind}")))?,
            scope,
            pool: PoolName::new(&pool).map_err(|e| corrupt("history", e))?,
            addr: read_addr("history", family, addr)?,
            key,
            owner,
            generation: u64::try_from(generation).unwrap_or(0),
        })
    })())
}

// ---------------------------------------------------------------------------------------
// The event's encoding.

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&u32::try_from(s.len()).unwrap_or(u32::MAX).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// An event as stored: kind, family, address (16 bytes), generation, scope, pool, owner, and
/// the attachment's network, container and interface if it has one.
pub(super) fn encode(event: HistoryRecord<'_>, out: &mut Vec<u8>) {
    out.push(event.kind.code() as u8);
    out.push(family_code(Family::of(event.addr)) as u8);
    out.extend_from_slice(&addr_blob(event.addr));
    out.extend_from_slice(&event.generation.to_le_bytes());
    put_str(out, event.scope);
    put_str(out, event.pool.as_str());
    put_str(out, event.owner);
    match event.key {
        None => out.push(0),
        Some(key) => {
            out.push(1);
            put_str(out, key.network());
            put_str(out, key.container_id());
            put_str(out, key.ifname());
        }
    }
}

/// An event as read, borrowing the row: its strings checked to be UTF-8 (`S` = `&str`,
/// [`decode`]), or as stored (`&[u8]`, [`raw`]: a chunk's filters hash bytes).
struct EventRef<'a, S = &'a str> {
    kind: u8,
    /// Family code and address: the address filter's key.
    addr_key: &'a [u8],
    generation: u64,
    scope: S,
    pool: S,
    owner: S,
    key: Option<(S, S, S)>,
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], StoreError> {
        if self.0.len() < n {
            return Err(corrupt("history", "event is cut short"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    /// A string's bytes, not checked to be UTF-8.
    fn raw_str(&mut self) -> Result<&'a [u8], StoreError> {
        let len = u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")) as usize;
        self.take(len)
    }

    fn str(&mut self) -> Result<&'a str, StoreError> {
        std::str::from_utf8(self.raw_str()?).map_err(|e| corrupt("history", e))
    }
}

/// Event `bytes` read with `string` for each of its strings: the one reading of the layout
/// [`encode`] writes.
fn decode_with<'a, S>(
    bytes: &'a [u8],
    string: fn(&mut Reader<'a>) -> Result<S, StoreError>,
) -> Result<EventRef<'a, S>, StoreError> {
    let mut r = Reader(bytes);
    let kind = r.take(1)?[0];
    let addr_key = r.take(17)?;
    let generation = u64::from_le_bytes(r.take(8)?.try_into().expect("8 bytes"));
    let scope = string(&mut r)?;
    let pool = string(&mut r)?;
    let owner = string(&mut r)?;
    let key = match r.take(1)?[0] {
        0 => None,
        1 => Some((string(&mut r)?, string(&mut r)?, string(&mut r)?)),
        other => return Err(corrupt("history", format!("attachment flag {other}"))),
    };
    if !r.0.is_empty() {
        return Err(corrupt("history", "bytes after the event"));
    }
    Ok(EventRef {
        kind,
        addr_key,
        generation,
        scope,
        pool,
        owner,
        key,
    })
}

fn decode(bytes: &[u8]) -> Result<EventRef<'_>, StoreError> {
    decode_with(bytes, Reader::str)
}

/// Event `bytes`, its strings not checked to be UTF-8 (a chunk's summary hashes their bytes,
/// and checks a scope when it first keeps it).
fn raw(bytes: &[u8]) -> Result<EventRef<'_, &[u8]>, StoreError> {
    decode_with(bytes, Reader::raw_str)
}

/// Column `index` of `row`, a blob.
fn blob<'a>(row: &'a Row<'_>, index: usize) -> Result<&'a [u8], StoreError> {
    row.get_ref(index)?
        .as_blob()
        .map_err(|e| corrupt("history", e))
}

/// The address filter's key: family code and 16 bytes, as stored.
fn addr_key(addr: IpAddr) -> [u8; 17] {
    let mut key = [0; 17];
    key[0] = family_code(Family::of(addr)) as u8;
    key[1..].copy_from_slice(&addr_blob(addr));
    key
}

impl EventRef<'_, &str> {
    fn matches(&self, at: i64, query: &HistoryQuery, addr: Option<&[u8; 17]>) -> bool {
        addr.is_none_or(|addr| self.addr_key == addr)
            && query.owner.as_deref().is_none_or(|o| self.owner == o)
            && query
                .container_id
                .as_deref()
                .is_none_or(|id| self.key.is_some_and(|(_, c, _)| c == id))
            && query
                .ifname
                .as_deref()
                .is_none_or(|name| self.key.is_some_and(|(_, _, i)| i == name))
            && query.since.is_none_or(|since| at >= millis(since))
            && query.until.is_none_or(|until| at <= millis(until))
    }

    fn to_event(&self, at: i64) -> Result<HistoryEvent, StoreError> {
        let kind = HistoryKind::from_code(i64::from(self.kind))
            .ok_or_else(|| corrupt("history", format!("event kind {}", self.kind)))?;
        let key = match self.key {
            Some((n, c, i)) => {
                Some(AttachmentKey::new(n, c, i).map_err(|e| corrupt("history", e))?)
            }
            None => None,
        };
        Ok(HistoryEvent {
            at: Timestamp::from_unix_millis(u64::try_from(at).unwrap_or(0)),
            kind,
            scope: self.scope.to_owned(),
            pool: PoolName::new(self.pool).map_err(|e| corrupt("history", e))?,
            addr: read_addr(
                "history",
                i64::from(self.addr_key[0]),
                self.addr_key[1..].to_vec(),
            )?,
            key,
            owner: self.owner.to_owned(),
            generation: self.generation,
        })
    }
}

// ---------------------------------------------------------------------------------------
// Bloom filters: ~8 bits per event and 6 probes (about 2% false positives).

const BITS_PER_KEY: usize = 8;
const PROBES: u64 = 6;

/// FNV-1a, then a second hash from it (SplitMix64's finaliser): stable across builds, as the
/// filters are stored.
fn hashes(key: &[u8]) -> (u64, u64) {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in key {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    let mut z = h.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (h, (z ^ (z >> 31)) | 1)
}

fn bloom_new(keys: usize) -> Vec<u8> {
    vec![0; (keys * BITS_PER_KEY).div_ceil(8).max(8)]
}

fn bloom_add(bits: &mut [u8], key: &[u8]) {
    let m = bits.len() as u64 * 8;
    let (h1, h2) = hashes(key);
    for i in 0..PROBES {
        let bit = h1.wrapping_add(i.wrapping_mul(h2)) % m;
        bits[(bit / 8) as usize] |= 1 << (bit % 8);
    }
}

fn bloom_has(bits: &[u8], key: &[u8]) -> bool {
    if bits.is_empty() {
        return true;
    }
    let m = bits.len() as u64 * 8;
    let (h1, h2) = hashes(key);
    (0..PROBES).all(|i| {
        let bit = h1.wrapping_add(i.wrapping_mul(h2)) % m;
        bits[(bit / 8) as usize] & (1 << (bit % 8)) != 0
    })
}

// ---------------------------------------------------------------------------------------
// Chunks' summaries.

/// A chunk's summary as `history_chunks` keeps it, made by adding its events one by one: by
/// `build_chunks` from the rows read back, or as each event is written ([`Open`]).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Summary {
    min_at: i64,
    max_at: i64,
    /// In the order first seen.
    scopes: Vec<String>,
    addrs: Vec<u8>,
    owners: Vec<u8>,
    containers: Vec<u8>,
}

impl Summary {
    fn new() -> Summary {
        let size = usize::try_from(CHUNK).unwrap_or(1024);
        Summary {
            min_at: i64::MAX,
            max_at: i64::MIN,
            scopes: Vec::new(),
            addrs: bloom_new(size),
            owners: bloom_new(size),
            containers: bloom_new(size),
        }
    }

    /// Adds the event encoded as `event`.
    fn add(&mut self, at: i64, event: &[u8]) -> Result<(), StoreError> {
        let event = raw(event)?;
        self.min_at = self.min_at.min(at);
        self.max_at = self.max_at.max(at);
        bloom_add(&mut self.addrs, event.addr_key);
        bloom_add(&mut self.owners, event.owner);
        if let Some((_, container, _)) = event.key {
            bloom_add(&mut self.containers, container);
        }
        if !self.scopes.iter().any(|s| s.as_bytes() == event.scope) {
            let scope = std::str::from_utf8(event.scope).map_err(|e| corrupt("history", e))?;
            self.scopes.push(scope.to_owned());
        }
        Ok(())
    }

    /// The summary of the events numbered within `[lo, hi]`, read back from their rows.
    fn read(conn: &Connection, (lo, hi): (i64, i64)) -> Result<Summary, StoreError> {
        let mut summary = Summary::new();
        each_event(conn, (lo, hi), |_, at, event| summary.add(at, event))?;
        Ok(summary)
    }

    fn insert(&self, conn: &Connection, (lo, hi): (i64, i64)) -> Result<(), StoreError> {
        let mut scope_bytes = Vec::new();
        for scope in &self.scopes {
            put_str(&mut scope_bytes, scope);
        }
        conn.prepare_cached(
            "INSERT INTO history_chunks (lo, hi, min_at, max_at, scopes, addrs, owners, containers)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        )?
        .execute(params![
            lo,
            hi,
            self.min_at,
            self.max_at,
            scope_bytes,
            self.addrs,
            self.owners,
            self.containers
        ])?;
        Ok(())
    }
}

/// The agent's store (owned mode): the summaries of the tail's chunks, each event added as it
/// is written, so completing a chunk reads no row back. `chunks[i]` summarises the events
/// numbered within `lo + i·CHUNK ..= lo + (i + 1)·CHUNK - 1`, and `lo` is where the tail
/// starts. Made from the tail's rows once ([`Ends::track`]: at the store's first commit
/// after its open, after a rollback, or after events of the tail were pruned).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Open {
    lo: i64,
    chunks: VecDeque<Summary>,
}

impl Open {
    /// Adds event `seq`, encoded as `event`; false if it falls before the open chunks (then
    /// they no longer match the rows).
    fn add(&mut self, seq: i64, at: i64, event: &[u8]) -> Result<bool, StoreError> {
        if seq < self.lo {
            return Ok(false);
        }
        let index = usize::try_from((seq - self.lo) / CHUNK).unwrap_or(usize::MAX);
        while self.chunks.len() <= index {
            self.chunks.push_back(Summary::new());
        }
        self.chunks[index].add(at, event)?;
        Ok(true)
    }
}

// ---------------------------------------------------------------------------------------
// The log's ends, and keeping it bounded.

/// What a commit needs to know to keep the history bounded, without a query: the numbers of
/// the first and last events, where the tail starts, the oldest time of any chunk and the
/// time of the tail's first event; in owned mode also the tail's summaries ([`Open`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Ends {
    /// The first and last events' numbers, if there are events.
    span: Option<(i64, i64)>,
    /// The first number past the last chunk.
    tail_start: i64,
    oldest_chunk_at: Option<i64>,
    tail_first_at: Option<i64>,
    /// The tail's summaries, if tracked (owned mode).
    open: Option<Open>,
}

impl Ends {
    pub(crate) fn load(conn: &Connection) -> Result<Ends, StoreError> {
        Ends::load_with_span(conn, seq_span(conn)?)
    }

    /// [`Ends::load`] with the events' first and last numbers already read (`seq_span`).
    fn load_with_span(conn: &Connection, span: Option<(i64, i64)>) -> Result<Ends, StoreError> {
        let first = span.map_or(0, |(first, _)| first);
        let tail_start = tail_start(conn)?.unwrap_or(first);
        let oldest_chunk_at: Option<i64> = conn
            .prepare_cached("SELECT min(min_at) FROM history_chunks")?
            .query_row([], |r| r.get(0))?;
        let tail_first_at = first_at_from(conn, tail_start)?;
        Ok(Ends {
            span,
            tail_start,
            oldest_chunk_at,
            tail_first_at,
            open: None,
        })
    }

    /// From now on, summarises the tail's chunks as their events are written ([`Open`]):
    /// reads the tail's rows once.
    pub(crate) fn track(&mut self, conn: &Connection) -> Result<(), StoreError> {
        let mut open = Open {
            lo: self.tail_start,
            chunks: VecDeque::new(),
        };
        each_event(conn, (self.tail_start, i64::MAX), |seq, at, event| {
            open.add(seq, at, event).map(drop)
        })?;
        self.open = Some(open);
        Ok(())
    }

    /// Event `seq` at `at`, encoded as `event`, was appended.
    fn appended(&mut self, seq: i64, at: i64, event: &[u8]) -> Result<(), StoreError> {
        self.span = Some(match self.span {
            Some((first, _)) => (first, seq),
            None => (seq, seq),
        });
        if seq >= self.tail_start && self.tail_first_at.is_none() {
            self.tail_first_at = Some(at);
        }
        if let Some(open) = &mut self.open
            && !open.add(seq, at, event)?
        {
            self.open = None;
        }
        Ok(())
    }
}

/// The first number past the last chunk, if there is a chunk.
fn tail_start(conn: &Connection) -> Result<Option<i64>, StoreError> {
    Ok(conn
        .prepare_cached("SELECT hi FROM history_chunks ORDER BY lo DESC LIMIT 1")?
        .query_row([], |r| r.get::<_, i64>(0))
        .optional()?
        .map(|hi| hi + 1))
}

/// The time of the first event numbered `from` or more, if there is one: in the first row
/// whose last event is numbered so.
fn first_at_from(conn: &Connection, from: i64) -> Result<Option<i64>, StoreError> {
    let mut statement = conn.prepare_cached(
        "SELECT first, events FROM history_events WHERE seq >= ?1 ORDER BY seq LIMIT 1",
    )?;
    let mut rows = statement.query([from])?;
    let Some(row) = rows.next()? else {
        return Ok(None);
    };
    for entry in entries(row.get(0)?, blob(row, 1)?) {
        let (seq, at, _) = entry?;
        if seq >= from {
            return Ok(Some(at));
        }
    }
    Err(corrupt("history", "a row ends before its number"))
}

// ---------------------------------------------------------------------------------------
// Rows of events.

/// Bytes before each event's encoding in a row: the gap from the number before (u32: 0 when
/// numbered one past it; the first event's is `first`'s, its gap 0), the time (i64) and the
/// encoding's length (u32).
const ENTRY_HEAD: usize = 16;

fn put_entry_head(out: &mut Vec<u8>, gap: u32, at: i64, len: usize) {
    out.extend_from_slice(&gap.to_le_bytes());
    out.extend_from_slice(&at.to_le_bytes());
    out.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_le_bytes());
}

/// The events of a row whose first is numbered `first`, in order: (number, time, encoding).
struct Entries<'a> {
    next: i64,
    rest: &'a [u8],
}

fn entries(first: i64, events: &[u8]) -> Entries<'_> {
    Entries {
        next: first,
        rest: events,
    }
}

impl<'a> Iterator for Entries<'a> {
    type Item = Result<(i64, i64, &'a [u8]), StoreError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let mut r = Reader(self.rest);
        let entry = (|| {
            let head = r.take(ENTRY_HEAD)?;
            let gap = u32::from_le_bytes(head[0..4].try_into().expect("4 bytes"));
            let at = i64::from_le_bytes(head[4..12].try_into().expect("8 bytes"));
            let len = u32::from_le_bytes(head[12..16].try_into().expect("4 bytes"));
            let event = r.take(len as usize)?;
            Ok((self.next + i64::from(gap), at, event))
        })();
        match entry {
            Ok((seq, at, event)) => {
                self.rest = r.0;
                self.next = seq + 1;
                Some(Ok((seq, at, event)))
            }
            Err(e) => {
                self.rest = &[];
                Some(Err(e))
            }
        }
    }
}

/// Calls `f` with each event numbered within `[lo, hi]` (number, time, encoding), in order;
/// returns how many there were.
fn each_event(
    conn: &Connection,
    (lo, hi): (i64, i64),
    mut f: impl FnMut(i64, i64, &[u8]) -> Result<(), StoreError>,
) -> Result<usize, StoreError> {
    let mut statement = conn
        .prepare_cached("SELECT first, events FROM history_events WHERE seq >= ?1 ORDER BY seq")?;
    let mut rows = statement.query([lo])?;
    let mut count = 0;
    while let Some(row) = rows.next()? {
        let first: i64 = row.get(0)?;
        if first > hi {
            break;
        }
        for entry in entries(first, blob(row, 1)?) {
            let (seq, at, event) = entry?;
            if seq > hi {
                break;
            }
            if seq >= lo {
                count += 1;
                f(seq, at, event)?;
            }
        }
    }
    Ok(count)
}

/// A row being made of events given one by one, in the order of their numbers.
struct RowBuilder {
    first: i64,
    last: i64,
    n: usize,
    min_at: i64,
    events: Vec<u8>,
}

impl RowBuilder {
    fn new() -> RowBuilder {
        RowBuilder {
            first: 0,
            last: 0,
            n: 0,
            min_at: i64::MAX,
            events: Vec::new(),
        }
    }

    /// Whether event `seq` may follow the last (its gap fits the entry's head).
    fn fits(&self, seq: i64) -> bool {
        self.n == 0 || u32::try_from(seq - self.last - 1).is_ok()
    }

    fn push(&mut self, seq: i64, at: i64, event: &[u8]) {
        let gap = if self.n == 0 {
            self.first = seq;
            0
        } else {
            u32::try_from(seq - self.last - 1).expect("the gap fits (RowBuilder::fits)")
        };
        put_entry_head(&mut self.events, gap, at, event.len());
        self.events.extend_from_slice(event);
        self.last = seq;
        self.n += 1;
        self.min_at = self.min_at.min(at);
    }

    /// Inserts the row, if it holds an event.
    fn insert(&self, conn: &Connection) -> Result<(), StoreError> {
        if self.n > 0 {
            insert_row(
                conn,
                (self.first, self.last),
                self.n,
                self.min_at,
                &self.events,
            )?;
        }
        Ok(())
    }
}

fn insert_row(
    conn: &Connection,
    (first, last): (i64, i64),
    n: usize,
    min_at: i64,
    events: &[u8],
) -> Result<(), StoreError> {
    let mut statement = conn.prepare_cached(
        "INSERT INTO history_events(seq,first,n,min_at,events)VALUES(?1,?2,?3,?4,?5)",
    )?;
    statement.raw_bind_parameter(1, last)?;
    statement.raw_bind_parameter(2, first)?;
    statement.raw_bind_parameter(3, n as i64)?;
    statement.raw_bind_parameter(4, min_at)?;
    statement.raw_bind_parameter(5, events)?;
    statement.raw_execute()?;
    Ok(())
}

/// Row `key` (first event `first`, `events`) without the events `drop` picks (given each
/// one's number and time, in order): deleted, and written again with those it keeps, keyed
/// by the last of them. Returns how many went.
fn rewrite_row(
    conn: &Connection,
    key: i64,
    (first, events): (i64, &[u8]),
    mut drop: impl FnMut(i64, i64) -> bool,
) -> Result<u64, StoreError> {
    let mut kept = Vec::new();
    let mut dropped = 0;
    for entry in entries(first, events) {
        let (seq, at, event) = entry?;
        if drop(seq, at) {
            dropped += 1;
        } else {
            kept.push((seq, at, event));
        }
    }
    if dropped == 0 {
        return Ok(0);
    }
    conn.prepare_cached("DELETE FROM history_events WHERE seq = ?1")?
        .execute([key])?;
    let mut row = RowBuilder::new();
    for (seq, at, event) in kept {
        if !row.fits(seq) {
            row.insert(conn)?;
            row = RowBuilder::new();
        }
        row.push(seq, at, event);
    }
    row.insert(conn)?;
    Ok(dropped)
}

/// Deletes every event numbered below `kept_from`: the rows that end below it, and the
/// events of the row across it. Returns how many went.
fn delete_before(conn: &Connection, kept_from: i64) -> Result<u64, StoreError> {
    let whole: i64 = conn
        .prepare_cached("SELECT coalesce(sum(n), 0) FROM history_events WHERE seq < ?1")?
        .query_row([kept_from], |r| r.get(0))?;
    conn.prepare_cached("DELETE FROM history_events WHERE seq < ?1")?
        .execute([kept_from])?;
    let across: Option<(i64, i64, Vec<u8>)> = conn
        .prepare_cached(
            "SELECT seq, first, events FROM history_events WHERE seq >= ?1 ORDER BY seq LIMIT 1",
        )?
        .query_row([kept_from], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .optional()?;
    let mut dropped = u64::try_from(whole).unwrap_or(0);
    if let Some((key, first, events)) = across
        && first < kept_from
    {
        dropped += rewrite_row(conn, key, (first, &events), |seq, _| seq < kept_from)?;
    }
    Ok(dropped)
}

/// The oldest time of the events numbered within `range`, if there are some.
fn min_at_within(conn: &Connection, range: (i64, i64)) -> Result<Option<i64>, StoreError> {
    let mut min_at: Option<i64> = None;
    each_event(conn, range, |_, at, _| {
        min_at = Some(min_at.map_or(at, |m| m.min(at)));
        Ok(())
    })?;
    Ok(min_at)
}

/// Events recorded in a transaction and not yet written: their entries in a row (gap 0,
/// time, length, encoding) one after the other, and each one's time and where its entry
/// starts and its encoding ends. Written (`Pending::write`) as one row (or one per
/// [`ROW_MAX`] events) before anything reads the log or the transaction commits: SQLite's
/// insert of a row costs ~1,900 instructions whatever it holds (BENCHMARKS.md, 2026-11-30),
/// so a commit of many events pays it once.
#[derive(Debug, Default)]
pub(crate) struct Pending {
    bytes: Vec<u8>,
    events: Vec<(i64, usize, usize)>,
}

impl Pending {
    pub(crate) fn push(&mut self, event: HistoryRecord<'_>) {
        // Room for a few events at once: grown from nothing, the first event's encoding
        // took five reallocations (~2,000 instructions an event with one client).
        if self.bytes.capacity() == 0 {
            self.bytes.reserve(512);
            self.events.reserve(8);
        }
        let start = self.bytes.len();
        let at = millis(event.at);
        put_entry_head(&mut self.bytes, 0, at, 0);
        encode(event, &mut self.bytes);
        let end = self.bytes.len();
        let len = u32::try_from(end - start - ENTRY_HEAD).unwrap_or(u32::MAX);
        self.bytes[start + 12..start + ENTRY_HEAD].copy_from_slice(&len.to_le_bytes());
        self.events.push((at, start, end));
    }

    /// Appends the events, in the order recorded, to the log; tells `ends`.
    pub(crate) fn write(
        &mut self,
        conn: &Connection,
        ends: Option<&mut Ends>,
    ) -> Result<(), StoreError> {
        if self.events.is_empty() {
            return Ok(());
        }
        // Numbered on from the last event, as SQLite numbers a row past the table's largest
        // key (from 1 in an empty table).
        let before = match &ends {
            Some(ends) => ends.span.map_or(0, |(_, last)| last),
            None => conn
                .prepare_cached("SELECT coalesce(max(seq), 0) FROM history_events")?
                .query_row([], |r| r.get(0))?,
        };
        let mut first = before + 1;
        for row in self.events.chunks(ROW_MAX) {
            let (start, end) = (row[0].1, row[row.len() - 1].2);
            let min_at = row.iter().map(|&(at, _, _)| at).min().unwrap_or(0);
            let last = first + row.len() as i64 - 1;
            insert_row(
                conn,
                (first, last),
                row.len(),
                min_at,
                &self.bytes[start..end],
            )?;
            first = last + 1;
        }
        if let Some(ends) = ends {
            for (i, &(at, start, end)) in self.events.iter().enumerate() {
                ends.appended(
                    before + 1 + i as i64,
                    at,
                    &self.bytes[start + ENTRY_HEAD..end],
                )?;
            }
        }
        self.events.clear();
        self.bytes.clear();
        Ok(())
    }
}

/// Drops events over the bounds, a batch at a time (one of each kind at most per call; see
/// `history.rs`), then summarises every whole chunk of the tail. Returns how many went.
pub(crate) fn prune(
    conn: &Connection,
    ends: &mut Ends,
    limits: &HistoryLimits,
    now: Timestamp,
) -> Result<u64, StoreError> {
    let batch = i64::try_from(PRUNE_BATCH).unwrap_or(i64::MAX);
    let tracking = ends.open.is_some();
    let mut dropped = 0;
    // Events are numbered in the order recorded and dropped oldest first: the ends bound
    // how many are kept.
    if let Some((first, last)) = ends.span {
        let max = i64::try_from(limits.max_events).unwrap_or(i64::MAX);
        let over = (last - first + 1).saturating_sub(max);
        if over >= batch.min(max.max(1)) {
            let kept_from = first + over.min(batch);
            dropped += delete_before(conn, kept_from)?;
            after_delete(conn, ends, kept_from > ends.tail_start)?;
        }
    }
    let cutoff = millis(limits.cutoff(now));
    let old_chunk = ends.oldest_chunk_at.is_some_and(|at| at < cutoff);
    let old_tail = ends.tail_first_at.is_some_and(|at| at < cutoff);
    if old_chunk || old_tail {
        // A little past the bound, so the next commits find nothing to drop for a while.
        let ahead = millis(limits.cutoff(now).saturating_add(limits.max_age / 100));
        if old_chunk {
            let (lo, hi): (i64, i64) = conn
                .prepare_cached("SELECT lo, hi FROM history_chunks ORDER BY min_at LIMIT 1")?
                .query_row([], |r| Ok((r.get(0)?, r.get(1)?)))?;
            dropped += delete_older(conn, (lo, hi), ahead, batch)?;
            // The chunk's oldest now, or the chunk gone with its last event.
            let min_at = min_at_within(conn, (lo, hi))?;
            match min_at {
                Some(min_at) => conn
                    .prepare_cached("UPDATE history_chunks SET min_at = ?1 WHERE lo = ?2")?
                    .execute([min_at, lo])?,
                None => conn
                    .prepare_cached("DELETE FROM history_chunks WHERE lo = ?1")?
                    .execute([lo])?,
            };
        } else {
            dropped += delete_older(conn, (ends.tail_start, i64::MAX), ahead, batch)?;
        }
        after_delete(conn, ends, !old_chunk)?;
    }
    build_chunks(conn, ends)?;
    if tracking && ends.open.is_none() {
        ends.track(conn)?;
    }
    Ok(dropped)
}

/// Deletes up to `batch` events numbered within `range` older than `ahead`, first first.
fn delete_older(
    conn: &Connection,
    (lo, hi): (i64, i64),
    ahead: i64,
    batch: i64,
) -> Result<u64, StoreError> {
    let goes = |seq: i64, at: i64| seq >= lo && seq <= hi && at < ahead;
    // The rows holding the first `batch` such events, read before any is rewritten.
    let mut rows: Vec<(i64, i64, Vec<u8>)> = Vec::new();
    {
        let mut statement = conn.prepare_cached(
            "SELECT seq, first, events FROM history_events WHERE seq >= ?1 AND min_at < ?2
             ORDER BY seq",
        )?;
        let mut found = statement.query([lo, ahead])?;
        let mut wanted = batch;
        while wanted > 0
            && let Some(row) = found.next()?
        {
            let (key, first): (i64, i64) = (row.get(0)?, row.get(1)?);
            if first > hi {
                break;
            }
            let events = blob(row, 2)?;
            let mut holds = 0;
            for entry in entries(first, events) {
                let (seq, at, _) = entry?;
                holds += i64::from(goes(seq, at));
            }
            if holds > 0 {
                rows.push((key, first, events.to_vec()));
                wanted -= holds.min(wanted);
            }
        }
    }
    let mut left = batch;
    let mut dropped = 0;
    for (key, first, events) in rows {
        dropped += rewrite_row(conn, key, (first, &events), |seq, at| {
            let drop = left > 0 && goes(seq, at);
            left -= i64::from(drop);
            drop
        })?;
    }
    Ok(dropped)
}

/// After events were deleted: drops the chunks left without events at either end, and reads
/// the ends again; the tail's summaries are kept unless events of the tail went
/// (`tail_touched`: they would no longer be those of its rows).
fn after_delete(conn: &Connection, ends: &mut Ends, tail_touched: bool) -> Result<(), StoreError> {
    let span = seq_span(conn)?;
    match span {
        // Numbers start again from 1 in an empty table: no chunk may cover them.
        None => conn.execute("DELETE FROM history_chunks", [])?,
        Some((first, last)) => conn
            .prepare_cached("DELETE FROM history_chunks WHERE hi < ?1 OR hi > ?2")?
            .execute([first, last])?,
    };
    let open = if tail_touched { None } else { ends.open.take() };
    *ends = Ends::load_with_span(conn, span)?;
    ends.open = open.filter(|open| open.lo == ends.tail_start);
    Ok(())
}

/// The first and last events' numbers, if there are events (one read of the log's ends).
fn seq_span(conn: &Connection) -> Result<Option<(i64, i64)>, StoreError> {
    let (first, last): (Option<i64>, Option<i64>) = conn
        .prepare_cached(
            "SELECT (SELECT first FROM history_events ORDER BY seq LIMIT 1), max(seq)
             FROM history_events",
        )?
        .query_row([], |r| Ok((r.get(0)?, r.get(1)?)))?;
    Ok(first.zip(last))
}

/// Summarises every whole chunk of the tail: from the tail's summaries if they are tracked
/// ([`Open`]), else from its rows read back.
pub(crate) fn build_chunks(conn: &Connection, ends: &mut Ends) -> Result<(), StoreError> {
    while let Some((_, last)) = ends.span
        && last - ends.tail_start + 1 >= CHUNK
    {
        let (lo, hi) = (ends.tail_start, ends.tail_start + CHUNK - 1);
        // Every event numbered up to `last` was added to the open chunks: the first is whole.
        let kept = match &mut ends.open {
            Some(open) if open.lo == lo => open.chunks.pop_front().inspect(|_| open.lo = hi + 1),
            _ => None,
        };
        let summary = match kept {
            Some(summary) => summary,
            None => {
                ends.open = None;
                Summary::read(conn, (lo, hi))?
            }
        };
        summary.insert(conn, (lo, hi))?;
        ends.tail_start = hi + 1;
        ends.oldest_chunk_at = Some(
            ends.oldest_chunk_at
                .map_or(summary.min_at, |at| at.min(summary.min_at)),
        );
        ends.tail_first_at = first_at_from(conn, ends.tail_start)?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Queries.

/// A chunk that may hold a match.
struct Candidate {
    lo: i64,
    hi: i64,
    max_at: i64,
    scopes: Vec<String>,
}

/// The chunks whose filters may hold `addr`, `owner` and `container` and whose times meet
/// `[since, until]`.
fn candidates(
    conn: &Connection,
    (addr, owner, container): (Option<&[u8; 17]>, Option<&str>, Option<&str>),
    (since, until): (Option<i64>, Option<i64>),
    with_scopes: bool,
) -> Result<Vec<Candidate>, StoreError> {
    let column = |wanted: bool, name: &'static str| if wanted { name } else { "NULL" };
    let sql = format!(
        "SELECT lo, hi, min_at, max_at, {}, {}, {}, {} FROM history_chunks",
        column(with_scopes, "scopes"),
        column(addr.is_some(), "addrs"),
        column(owner.is_some(), "owners"),
        column(container.is_some(), "containers"),
    );
    let mut statement = conn.prepare_cached(&sql)?;
    let mut rows = statement.query([])?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        let (min_at, max_at): (i64, i64) = (row.get(2)?, row.get(3)?);
        if since.is_some_and(|since| max_at < since) || until.is_some_and(|until| min_at > until) {
            continue;
        }
        let may = |index: usize, key: Option<&[u8]>| -> Result<bool, StoreError> {
            Ok(match key {
                Some(key) => bloom_has(blob(row, index)?, key),
                None => true,
            })
        };
        if !(may(5, addr.map(|a| &a[..]))?
            && may(6, owner.map(str::as_bytes))?
            && may(7, container.map(str::as_bytes))?)
        {
            continue;
        }
        let scopes = if with_scopes {
            let mut r = Reader(blob(row, 4)?);
            let mut scopes = Vec::new();
            while !r.0.is_empty() {
                scopes.push(r.str()?.to_owned());
            }
            scopes
        } else {
            Vec::new()
        };
        out.push(Candidate {
            lo: row.get(0)?,
            hi: row.get(1)?,
            max_at,
            scopes,
        });
    }
    Ok(out)
}

/// An event found, with its time and number (the answer's order: newest first).
type Found = (Reverse<(i64, i64)>, HistoryEvent);

/// The events numbered within `[lo, hi]` that match; returns how many rows it read.
fn read_range(
    conn: &Connection,
    (lo, hi): (i64, i64),
    query: &HistoryQuery,
    addr: Option<&[u8; 17]>,
    out: &mut Vec<Found>,
) -> Result<usize, StoreError> {
    each_event(conn, (lo, hi), |seq, at, event| {
        let event = decode(event)?;
        if event.matches(at, query, addr) {
            out.push((Reverse((at, seq)), event.to_event(at)?));
        }
        Ok(())
    })
}

/// The answer to `query`, newest first, and how many rows were read for it.
pub(crate) fn history(
    conn: &Connection,
    query: &HistoryQuery,
) -> Result<(Vec<HistoryEvent>, usize), StoreError> {
    if query.limit == 0 {
        return Ok((Vec::new(), 0));
    }
    let addr = query.addr.map(addr_key);
    let tail = tail_start(conn)?.unwrap_or(i64::MIN);
    let mut found = Vec::new();
    let mut read = read_range(conn, (tail, i64::MAX), query, addr.as_ref(), &mut found)?;
    let mut chunks = candidates(
        conn,
        (
            addr.as_ref(),
            query.owner.as_deref(),
            query.container_id.as_deref(),
        ),
        (query.since.map(millis), query.until.map(millis)),
        false,
    )?;
    chunks.sort_by_key(|c| Reverse((c.max_at, c.hi)));
    for chunk in chunks {
        if found.len() >= query.limit {
            found.sort_by_key(|f| f.0);
            found.truncate(query.limit);
            // Every event left is older than the last kept.
            if found.last().is_some_and(|f| chunk.max_at < f.0.0.0) {
                break;
            }
        }
        read += read_range(conn, (chunk.lo, chunk.hi), query, addr.as_ref(), &mut found)?;
    }
    found.sort_by_key(|f| f.0);
    found.truncate(query.limit);
    Ok((found.into_iter().map(|f| f.1).collect(), read))
}

/// Who held `addr` at `at`, and how many rows were read for it.
pub(crate) fn held_at(
    conn: &Connection,
    addr: IpAddr,
    at: Timestamp,
) -> Result<(Vec<HistoryEvent>, usize), StoreError> {
    let query = HistoryQuery {
        until: Some(at),
        ..HistoryQuery::default()
    };
    let at = millis(at);
    let key = addr_key(addr);
    let tail = tail_start(conn)?.unwrap_or(i64::MIN);
    let mut found = Vec::new();
    let mut read = read_range(conn, (tail, i64::MAX), &query, Some(&key), &mut found)?;
    let mut chunks = candidates(conn, (Some(&key), None, None), (None, Some(at)), true)?;
    chunks.sort_by_key(|c| Reverse((c.max_at.min(at), c.hi)));
    // Per scope, the newest event found so far (time, number).
    let mut newest: Vec<(String, (i64, i64))> = Vec::new();
    let note = |found: &[Found], newest: &mut Vec<(String, (i64, i64))>| {
        for (Reverse(order), event) in found {
            match newest.iter_mut().find(|(scope, _)| *scope == event.scope) {
                Some((_, best)) => *best = (*best).max(*order),
                None => newest.push((event.scope.clone(), *order)),
            }
        }
    };
    note(&found, &mut newest);
    for chunk in chunks {
        let bound = chunk.max_at.min(at);
        // A chunk whose every scope already has a newer event cannot change the answer.
        let settled = chunk.scopes.iter().all(|scope| {
            newest
                .iter()
                .any(|(s, (t, seq))| s == scope && (*t > bound || (*t == bound && *seq > chunk.hi)))
        });
        if settled {
            continue;
        }
        let from = found.len();
        read += read_range(conn, (chunk.lo, chunk.hi), &query, Some(&key), &mut found)?;
        note(&found[from..], &mut newest);
    }
    found.sort_by_key(|f| f.0);
    Ok((holders(found.into_iter().map(|f| f.1)), read))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{SqliteStore, Store, StoredAllocation, Txn};

    /// Event `i` of a long history: allocation `i / 2` of its own address (of 60,000), pod
    /// and container, allocated then released, 1 s apart.
    fn event(i: u64) -> HistoryEvent {
        let allocation = i / 2;
        let host = allocation % 60_000;
        let row = StoredAllocation {
            pool: PoolName::default_pool(),
            addr: IpAddr::from([10, 64, (host / 256) as u8, (host % 256) as u8]),
            owner: format!("ns/pod-{allocation}"),
            key: Some(AttachmentKey::new("net", &format!("c{allocation}"), "eth0").unwrap()),
            generation: allocation,
            lease: None,
        };
        let kind = if i.is_multiple_of(2) {
            HistoryKind::Allocated
        } else {
            HistoryKind::Released
        };
        HistoryEvent::of(Timestamp::from_unix_millis(i * 1000), kind, "node", &row)
    }

    /// The agent's store keeps the tail's summaries across its commits and completes chunks
    /// from them; after a reopen its first commit makes them again from the tail's rows, the
    /// same as they were.
    #[test]
    fn the_owned_store_keeps_the_open_chunks_across_commits() {
        let dir = tempfile::tempdir().unwrap();
        let socket = std::path::Path::new("/x.sock");
        let mut store = SqliteStore::open_owned(dir.path(), socket).unwrap();
        let commit = |store: &mut SqliteStore, events: std::ops::Range<u64>| {
            let mut txn = store.begin().unwrap();
            for i in events.clone() {
                txn.record_history(&event(i)).unwrap();
            }
            let now = Timestamp::from_unix_millis(events.end * 1000);
            txn.prune_history(&HistoryLimits::default(), now).unwrap();
            txn.commit().unwrap();
        };
        for from in (0..1_500).step_by(100) {
            commit(&mut store, from..from + 100);
        }
        let open = |store: &SqliteStore| store.history_ends.borrow().as_ref().unwrap().open.clone();
        let before = open(&store).expect("tracked");
        assert_eq!(before.lo, CHUNK + 1);
        assert_eq!(before.chunks.len(), 1);
        drop(store);
        let mut store = SqliteStore::open_owned(dir.path(), socket).unwrap();
        commit(&mut store, 1_500..1_500);
        assert_eq!(open(&store), Some(before));
    }

    /// A query reads the tail and the chunks that may hold its answer, not the log: over 40
    /// chunks, an owner's, a container's or an address's events cost a chunk or two (and a
    /// false positive of a filter now and then), the newest events the last chunk, and who
    /// held an address the chunk of its newest event.
    #[test]
    fn queries_read_only_the_chunks_that_may_hold_the_answer() {
        let dir = tempfile::tempdir().unwrap();
        let mut store =
            SqliteStore::open_owned(dir.path(), std::path::Path::new("/x.sock")).unwrap();
        let n = 40 * CHUNK as u64 + 100;
        let mut txn = store.begin().unwrap();
        for i in 0..n {
            txn.record_history(&event(i)).unwrap();
            if i % 64 == 63 {
                txn.prune_history(
                    &HistoryLimits::default(),
                    Timestamp::from_unix_millis(n * 1000),
                )
                .unwrap();
            }
        }
        txn.prune_history(
            &HistoryLimits::default(),
            Timestamp::from_unix_millis(n * 1000),
        )
        .unwrap();
        txn.commit().unwrap();
        let conn = store.conn();
        let chunks: i64 = conn
            .query_row("SELECT count(*) FROM history_chunks", [], |r| r.get(0))
            .unwrap();
        assert_eq!(chunks, 40);
        let tail = 100;
        let bound = |chunks: usize| tail + chunks * CHUNK as usize;
        let ask = |query: HistoryQuery| {
            history(
                conn,
                &HistoryQuery {
                    limit: 100,
                    ..query
                },
            )
            .unwrap()
        };
        let (events, read) = ask(HistoryQuery::default());
        assert_eq!(events.len(), 100);
        assert!(read <= bound(1), "newest 100: {read} rows");
        for pod in [5u64, 9_000, 20_000] {
            let (events, read) = ask(HistoryQuery {
                owner: Some(format!("ns/pod-{pod}")),
                ..HistoryQuery::default()
            });
            assert_eq!(events.len(), 2);
            assert!(read <= bound(3), "owner: {read} rows");
            let (events, read) = ask(HistoryQuery {
                container_id: Some(format!("c{pod}")),
                ..HistoryQuery::default()
            });
            assert_eq!(events.len(), 2);
            assert!(read <= bound(3), "container: {read} rows");
            let addr = event(pod * 2).addr;
            let (events, read) = ask(HistoryQuery {
                addr: Some(addr),
                ..HistoryQuery::default()
            });
            assert_eq!(events.len(), 2);
            assert!(read <= bound(3), "address: {read} rows");
            let (held, read) =
                held_at(conn, addr, Timestamp::from_unix_millis(pod * 2000 + 500)).unwrap();
            assert_eq!(held.len(), 1);
            assert_eq!(held[0].owner, format!("ns/pod-{pod}"));
            assert!(read <= bound(3), "held at: {read} rows");
        }
    }
}
