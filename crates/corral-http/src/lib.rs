//! What corral's daemons (the agent and the operator) serve their REST APIs with: one
//! listener served with hyper under a connection cap and timeouts (`listen.rs`), the unix
//! socket bound and removed safely (`socket.rs`), the bearer token of the TCP listener
//! (`token.rs`), and the bodies both answer alike (`respond.rs`: the OpenAPI document, metrics).
//!
//! A crate of its own so the operator shares the agent's listener without linking the agent
//! (and SQLite with it). Each daemon keeps its own defaults (caps, timeouts, messages) and
//! passes them in.

mod listen;
pub mod respond;
mod socket;
mod token;

pub use listen::{Acceptor, serve};
pub use socket::{FileIdentity, bind_socket, remove_socket};
pub use token::{BearerToken, MIN_TOKEN_LEN, with_token};
