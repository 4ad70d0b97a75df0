//! The operator's API listeners: its defaults for `corral-http`, which serves them with the
//! agent's conventions (the unix socket with mode 0660, each listener under its own cap of
//! connections, a header-read and write timeout, accept errors that back off, graceful
//! shutdown).

use std::time::Duration;

/// Connections served at once on the socket and on TCP (which anyone on the host can open
/// without the token, so it gets fewer).
pub const MAX_UNIX_CONNECTIONS: usize = 256;
pub const MAX_TCP_CONNECTIONS: usize = 64;
/// A connection that sends no complete request head within this long (from its opening or
/// its previous answer) is closed; an answer that cannot be written within it, too.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
