//! Where the agent listens (its unix socket, or a TCP address with a bearer token) and the
//! blocking stream to it, with connect errors sorted into the client's error variants.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use crate::Error;

/// Where the agent listens.
#[derive(Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// The agent's unix socket (`/run/corral/agent.sock` by default).
    Unix(PathBuf),
    /// The agent's optional TCP listener, which requires its bearer token.
    Tcp { address: SocketAddr, token: String },
}

impl fmt::Debug for Endpoint {
    /// Never prints the token.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Unix(path) => f.debug_tuple("Unix").field(path).finish(),
            Endpoint::Tcp { address, .. } => f
                .debug_struct("Tcp")
                .field("address", address)
                .finish_non_exhaustive(),
        }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Unix(path) => write!(f, "{}", path.display()),
            Endpoint::Tcp { address, .. } => write!(f, "tcp://{address}"),
        }
    }
}

impl Endpoint {
    /// The `Host` header's value.
    pub(crate) fn host(&self) -> String {
        match self {
            Endpoint::Unix(_) => "localhost".to_owned(),
            Endpoint::Tcp { address, .. } => address.to_string(),
        }
    }

    pub(crate) fn bearer_token(&self) -> Option<&str> {
        match self {
            Endpoint::Unix(_) => None,
            Endpoint::Tcp { token, .. } => Some(token),
        }
    }

    /// Opens a connection. `read_timeout` also bounds each write, so an agent that stops
    /// reading cannot block the caller either.
    pub(crate) fn connect(
        &self,
        connect_timeout: Option<Duration>,
        read_timeout: Option<Duration>,
    ) -> Result<Stream, Error> {
        let connected = match self {
            // std has no connect timeout for unix sockets; a connect completes or fails at
            // once unless the agent's accept backlog is full.
            Endpoint::Unix(path) => UnixStream::connect(path).map(Stream::Unix),
            Endpoint::Tcp { address, .. } => match connect_timeout {
                Some(timeout) => TcpStream::connect_timeout(address, timeout),
                None => TcpStream::connect(address),
            }
            .map(Stream::Tcp),
        };
        let stream = connected.map_err(|source| match source.kind() {
            io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused => Error::Unreachable {
                socket: self.to_string(),
                source,
            },
            io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => Error::Timeout {
                socket: self.to_string(),
            },
            _ => Error::Io {
                socket: self.to_string(),
                source,
            },
        })?;
        stream.configure(read_timeout).map_err(|source| Error::Io {
            socket: self.to_string(),
            source,
        })?;
        Ok(stream)
    }
}

/// A connection to the agent.
#[derive(Debug)]
pub(crate) enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Stream {
    fn configure(&self, timeout: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Unix(stream) => {
                stream.set_read_timeout(timeout)?;
                stream.set_write_timeout(timeout)
            }
            Stream::Tcp(stream) => {
                stream.set_nodelay(true)?;
                stream.set_read_timeout(timeout)?;
                stream.set_write_timeout(timeout)
            }
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(stream) => stream.read(buf),
            Stream::Tcp(stream) => stream.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(stream) => stream.write(buf),
            Stream::Tcp(stream) => stream.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Unix(stream) => stream.flush(),
            Stream::Tcp(stream) => stream.flush(),
        }
    }
}
