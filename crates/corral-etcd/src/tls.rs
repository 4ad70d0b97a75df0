//! TLS to etcd: the files (`EtcdTls`: a CA bundle, optionally a client certificate and key),
//! their checks before any connection (`TlsError`: a file that cannot be read, a key others can
//! read, no PEM in it, a certificate out of its validity, a key that does not match its
//! certificate, each naming the file), and what a change of the files on disk looks like (their
//! contents, compared at each poll by `EtcdKv`'s reload task).
//!
//! etcd's certificate is verified against the CA bundle only: no system roots, no "insecure"
//! mode. An `https://` endpoint without a CA bundle, or TLS files with an `http://` endpoint,
//! is refused before connecting.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use etcd_client::{Certificate, Identity, TlsOptions};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// How often the TLS files are read again to see whether they changed (rotation).
pub const DEFAULT_RELOAD_INTERVAL: Duration = Duration::from_secs(5);

/// The TLS files of a client of etcd (as etcdctl's `--cacert`, `--cert`, `--key`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdTls {
    /// The CA bundle (PEM) that etcd's server certificate must verify against.
    pub ca_cert: PathBuf,
    /// The client certificate (PEM, the certificate first, then any intermediates), for an etcd
    /// run with `--client-cert-auth`; given with `key`.
    pub cert: Option<PathBuf>,
    /// The client certificate's private key (PEM); others (not owner, not group) may not
    /// read it.
    pub key: Option<PathBuf>,
    /// How often the files are read again; a change makes new connections use them.
    pub reload_interval: Duration,
}

impl EtcdTls {
    /// TLS with the CA bundle `ca_cert` and no client certificate.
    pub fn new(ca_cert: impl Into<PathBuf>) -> EtcdTls {
        EtcdTls {
            ca_cert: ca_cert.into(),
            cert: None,
            key: None,
            reload_interval: DEFAULT_RELOAD_INTERVAL,
        }
    }

    /// With the client certificate `cert` and its key `key`.
    pub fn with_client(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> EtcdTls {
        self.cert = Some(cert.into());
        self.key = Some(key.into());
        self
    }

    /// The files, in the order `Loaded::contents` holds them.
    fn files(&self) -> Vec<&Path> {
        let mut files = vec![self.ca_cert.as_path()];
        files.extend(self.cert.as_deref());
        files.extend(self.key.as_deref());
        files
    }

    /// The files' contents now (a file that cannot be read: empty), to tell whether they
    /// changed since `Loaded::contents`.
    pub(crate) fn contents(&self) -> Vec<Vec<u8>> {
        self.files()
            .into_iter()
            .map(|path| std::fs::read(path).unwrap_or_default())
            .collect()
    }

    /// Reads and checks the files: the TLS options they make, or what is wrong, naming the
    /// file.
    pub(crate) fn load(&self) -> Result<Loaded, TlsError> {
        let (cert_path, key_path) = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => (Some(cert), Some(key)),
            (None, None) => (None, None),
            (Some(cert), None) => {
                return Err(TlsError::Options(format!(
                    "the etcd client certificate {} is given without its key",
                    cert.display()
                )));
            }
            (None, Some(key)) => {
                return Err(TlsError::Options(format!(
                    "the etcd client key {} is given without its certificate",
                    key.display()
                )));
            }
        };
        let ca = read(&self.ca_cert, "CA certificate")?;
        certificates(&ca, &self.ca_cert, "CA certificate")?;
        let mut options = TlsOptions::new().ca_certificate(Certificate::from_pem(&ca));
        let mut contents = vec![ca];
        let mut identity = None;
        if let (Some(cert_path), Some(key_path)) = (cert_path, key_path) {
            let cert = read(cert_path, "client certificate")?;
            let chain = certificates(&cert, cert_path, "client certificate")?;
            let key = read(key_path, "client key")?;
            let mode = std::fs::metadata(key_path)
                .map_err(|source| TlsError::Unreadable {
                    what: "client key",
                    path: key_path.clone(),
                    source,
                })?
                .permissions()
                .mode();
            if mode & 0o007 != 0 {
                return Err(TlsError::KeyExposed {
                    path: key_path.clone(),
                    mode: mode & 0o7777,
                });
            }
            let private =
                PrivateKeyDer::from_pem_slice(&key).map_err(|error| TlsError::BadKey {
                    path: key_path.clone(),
                    reason: error.to_string(),
                })?;
            check_validity(&chain[0], cert_path)?;
            let signing =
                rustls::crypto::ring::sign::any_supported_type(&private).map_err(|error| {
                    TlsError::BadKey {
                        path: key_path.clone(),
                        reason: error.to_string(),
                    }
                })?;
            match rustls::sign::CertifiedKey::new(chain.clone(), signing).keys_match() {
                Ok(())
                | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {}
                Err(_) => {
                    return Err(TlsError::KeyMismatch {
                        cert: cert_path.clone(),
                        key: key_path.clone(),
                    });
                }
            }
            options = options.identity(Identity::from_pem(&cert, &key));
            identity = Some((chain, private));
            contents.push(cert);
            contents.push(key);
        }
        let probe = probe_config(&self.ca_cert, &contents[0], identity)?;
        Ok(Loaded {
            options,
            contents,
            probe,
        })
    }
}

/// Checked TLS files: the options connections use, the contents they were made from, and
/// the same as a rustls configuration for `probe`.
#[derive(Clone, Debug)]
pub(crate) struct Loaded {
    pub options: TlsOptions,
    pub contents: Vec<Vec<u8>>,
    probe: Arc<rustls::ClientConfig>,
}

/// The rustls configuration of `probe`: the CA bundle's roots, the client certificate if any.
fn probe_config(
    ca_path: &Path,
    ca: &[u8],
    identity: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let bad_ca = |reason: String| TlsError::BadCertificate {
        what: "CA certificate",
        path: ca_path.to_path_buf(),
        reason,
    };
    let mut roots = rustls::RootCertStore::empty();
    for cert in certificates(ca, ca_path, "CA certificate")? {
        roots
            .add(cert)
            .map_err(|error| bad_ca(format!("is not a usable CA certificate: {error}")))?;
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|error| TlsError::Options(format!("TLS versions: {error}")))?
    .with_root_certificates(roots);
    let mut config = match identity {
        Some((chain, key)) => builder
            .with_client_auth_cert(chain, key)
            .map_err(|error| TlsError::Options(format!("the client certificate: {error}")))?,
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// Asks the etcd member at `endpoint` over a TLS connection of its own whether it accepts
/// this client: etcd refuses a client certificate with an alert after the handshake (TLS 1.3),
/// which gRPC reports only as a closed connection. Answers what etcd said if it refused, or
/// None (it accepted, or it could not be asked within `patience`).
pub(crate) async fn probe(endpoint: &str, loaded: &Loaded, patience: Duration) -> Option<String> {
    let authority = endpoint
        .strip_prefix("https://")
        .unwrap_or(endpoint)
        .split('/')
        .next()?
        .to_owned();
    let config = Arc::clone(&loaded.probe);
    let asked = tokio::task::spawn_blocking(move || probe_blocking(&authority, config, patience));
    asked.await.ok().flatten()
}

/// What etcd's refusal of this client's certificate (its TLS `alert`) says.
pub(crate) fn refused_client(alert: &str) -> String {
    format!(
        "etcd refused the TLS client certificate (alert {alert}): is one given (--etcd-cert, \
         --etcd-key), signed by a CA in etcd's --trusted-ca-file, and valid?"
    )
}

fn probe_blocking(
    authority: &str,
    config: Arc<rustls::ClientConfig>,
    patience: Duration,
) -> Option<String> {
    use std::io::Read;
    use std::net::ToSocketAddrs;
    let host = authority
        .rsplit_once(':')
        .map_or(authority, |(host, _)| host)
        .trim_start_matches('[')
        .trim_end_matches(']');
    let name = rustls::pki_types::ServerName::try_from(host.to_owned()).ok()?;
    let address = authority.to_socket_addrs().ok()?.next()?;
    let tcp = std::net::TcpStream::connect_timeout(&address, patience).ok()?;
    tcp.set_read_timeout(Some(patience)).ok()?;
    tcp.set_write_timeout(Some(patience)).ok()?;
    let connection = rustls::ClientConnection::new(config, name).ok()?;
    let mut stream = rustls::StreamOwned::new(connection, tcp);
    // etcd's HTTP/2 server speaks first (its SETTINGS): data means it accepted this client.
    let mut byte = [0u8; 1];
    let error = stream.read(&mut byte).err()?;
    let alert = error
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())?;
    match alert {
        rustls::Error::AlertReceived(alert) => Some(refused_client(&format!("{alert:?}"))),
        _ => None,
    }
}

/// Why TLS to etcd cannot be set up from the options and files given.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The endpoints and TLS options do not go together (an `http://` endpoint with TLS files,
    /// an `https://` one without a CA bundle, a certificate without its key).
    #[error("{0}")]
    Options(String),
    /// A file cannot be read (missing, no permission).
    #[error("cannot read the etcd {what} {}: {source}", path.display())]
    Unreadable {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A certificate file holds no PEM certificate, or one that cannot be parsed.
    #[error("the etcd {what} {} {reason}", path.display())]
    BadCertificate {
        what: &'static str,
        path: PathBuf,
        reason: String,
    },
    /// The key file others may read.
    #[error(
        "the etcd client key {} can be read by others (mode {mode:04o}): \
         `chmod o-rwx` it (0600 or 0640)",
        path.display()
    )]
    KeyExposed { path: PathBuf, mode: u32 },
    /// The key file holds no usable private key.
    #[error("the etcd client key {} is not a usable private key: {reason}", path.display())]
    BadKey { path: PathBuf, reason: String },
    /// The client certificate expired, or is not valid yet.
    #[error("the etcd client certificate {} {state}", path.display())]
    OutOfValidity { path: PathBuf, state: String },
    /// The key is not the one the certificate certifies.
    #[error(
        "the etcd client key {} does not match the certificate {}",
        key.display(),
        cert.display()
    )]
    KeyMismatch { cert: PathBuf, key: PathBuf },
}

fn read(path: &Path, what: &'static str) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Unreadable {
        what,
        path: path.to_path_buf(),
        source,
    })
}

/// The PEM certificates in `pem`, at least one.
fn certificates(
    pem: &[u8],
    path: &Path,
    what: &'static str,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bad = |reason: String| TlsError::BadCertificate {
        what,
        path: path.to_path_buf(),
        reason,
    };
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| bad(format!("is not PEM: {error}")))?;
    if certs.is_empty() {
        return Err(bad("holds no PEM certificate".into()));
    }
    Ok(certs)
}

/// Refuses a certificate outside its validity period now.
fn check_validity(cert: &CertificateDer<'_>, path: &Path) -> Result<(), TlsError> {
    let (not_before, not_after) = validity(cert).ok_or_else(|| TlsError::BadCertificate {
        what: "client certificate",
        path: path.to_path_buf(),
        reason: "is not an X.509 certificate (no validity period found)".into(),
    })?;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| {
            i64::try_from(elapsed.as_secs()).unwrap_or(i64::MAX)
        });
    let state = if now > not_after.seconds {
        format!("expired at {}", not_after.text)
    } else if now < not_before.seconds {
        format!("is not valid before {}", not_before.text)
    } else {
        return Ok(());
    };
    Err(TlsError::OutOfValidity {
        path: path.to_path_buf(),
        state,
    })
}

/// A certificate's time: seconds since the epoch, and as written (`2001-01-01 00:00:00 UTC`).
#[derive(Debug, PartialEq, Eq)]
struct CertTime {
    seconds: i64,
    text: String,
}

/// One DER element at the start of `input`: its tag, contents, and what follows it.
fn der_element(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (length, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let bytes = usize::from(first & 0x7f);
        if bytes == 0 || bytes > 4 || rest.len() < bytes {
            return None;
        }
        let length = rest[..bytes]
            .iter()
            .fold(0usize, |length, byte| (length << 8) | usize::from(*byte));
        (length, &rest[bytes..])
    };
    (rest.len() >= length).then(|| (tag, &rest[..length], &rest[length..]))
}

/// A certificate's validity period (RFC 5280 4.1: the fifth field of the TBSCertificate, after
/// an optional explicit version).
fn validity(cert: &[u8]) -> Option<(CertTime, CertTime)> {
    const SEQUENCE: u8 = 0x30;
    let (tag, certificate, _) = der_element(cert)?;
    if tag != SEQUENCE {
        return None;
    }
    let (tag, tbs, _) = der_element(certificate)?;
    if tag != SEQUENCE {
        return None;
    }
    let mut rest = tbs;
    let (tag, _, after) = der_element(rest)?;
    if tag == 0xa0 {
        rest = after; // [0] version
    }
    // serialNumber, signature, issuer
    for _ in 0..3 {
        rest = der_element(rest)?.2;
    }
    let (tag, validity, _) = der_element(rest)?;
    if tag != SEQUENCE {
        return None;
    }
    let (tag_before, before, rest) = der_element(validity)?;
    let (tag_after, after, _) = der_element(rest)?;
    Some((cert_time(tag_before, before)?, cert_time(tag_after, after)?))
}

/// A UTCTime (tag 23, `YYMMDDHHMMSSZ`) or GeneralizedTime (tag 24, `YYYYMMDDHHMMSSZ`).
fn cert_time(tag: u8, text: &[u8]) -> Option<CertTime> {
    let text = std::str::from_utf8(text).ok()?.strip_suffix('Z')?;
    if !text.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    let (year, rest) = match (tag, text.len()) {
        (23, 12) => {
            let year: i64 = text[..2].parse().ok()?;
            (
                if year >= 50 { 1900 + year } else { 2000 + year },
                &text[2..],
            )
        }
        (24, 14) => (text[..4].parse().ok()?, &text[4..]),
        _ => return None,
    };
    let field = |i: usize| rest[i..i + 2].parse::<i64>().ok();
    let (month, day, hour, minute, second) =
        (field(0)?, field(2)?, field(4)?, field(6)?, field(8)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return None;
    }
    let seconds = days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second;
    Some(CertTime {
        seconds,
        text: format!("{year:04}-{month:02}-{day:02} {hour:02}:{minute:02}:{second:02} UTC"),
    })
}

/// Days since 1970-01-01 of a date of the proleptic Gregorian calendar (Howard Hinnant's
/// `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let month_index = (month + 9) % 12;
    let day_of_year = (153 * month_index + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

#[cfg(test)]
mod tests {
    use super::{cert_time, days_from_civil};

    #[test]
    fn certificate_times_are_read_as_utc_seconds() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        let utc = cert_time(23, b"010101000000Z").expect("UTCTime");
        assert_eq!(utc.seconds, 978_307_200);
        assert_eq!(utc.text, "2001-01-01 00:00:00 UTC");
        let generalized = cert_time(24, b"40960101000000Z").expect("GeneralizedTime");
        assert_eq!(generalized.text, "4096-01-01 00:00:00 UTC");
        assert!(cert_time(23, b"0101010000Z").is_none());
        assert!(cert_time(23, b"011301000000Z").is_none());
    }
}
