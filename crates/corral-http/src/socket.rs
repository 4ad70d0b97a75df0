//! The daemons' unix socket: bound with mode 0660, only a stale socket replaced (a live one,
//! or a path that is not a socket, refused and left as it is), and removed at shutdown only
//! if the path still names the socket bound.

use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;

use tokio::net::UnixListener;

/// A file's device and inode: which file a path named at one moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileIdentity {
    device: u64,
    inode: u64,
}

impl FileIdentity {
    fn of(metadata: &std::fs::Metadata) -> FileIdentity {
        FileIdentity {
            device: metadata.dev(),
            inode: metadata.ino(),
        }
    }
}

/// Binds the unix socket at `path`. Only a stale socket (one nobody answers on: a killed
/// daemon's) is removed; a socket another process answers on, and anything that is not a
/// socket (a configuration file given as the socket by mistake), are refused and left as
/// they are. Sets mode 0660 (owner and group may call the API). Returns the listener and the
/// socket file's identity, so shutdown removes this socket and nothing that replaced it.
///
/// `peer` names who may be listening already in the messages (`"agent"`: "another agent is
/// listening on it"); the error is a message about the path, which the caller names.
pub fn bind_socket(path: &Path, peer: &str) -> Result<(UnixListener, FileIdentity), String> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)
            .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(metadata) if metadata.file_type().is_socket() => {
            match std::os::unix::net::UnixStream::connect(path) {
                Ok(_) => return Err(format!("another {peer} is listening on it")),
                // Refused: nobody listens; the socket is a dead process's and can go.
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                    std::fs::remove_file(path)
                        .map_err(|e| format!("cannot remove the stale socket: {e}"))?;
                }
                Err(e) => {
                    return Err(format!(
                        "cannot tell whether another {peer} listens on it: {e}"
                    ));
                }
            }
        }
        Ok(metadata) => {
            return Err(format!(
                "it is {}, not a socket; refusing to replace it (name a socket path that \
                 does not exist yet)",
                file_kind(&metadata.file_type())
            ));
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e.to_string()),
    }
    let listener = UnixListener::bind(path).map_err(|e| e.to_string())?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
        .map_err(|e| format!("cannot set its mode: {e}"))?;
    let identity = std::fs::symlink_metadata(path)
        .map(|metadata| FileIdentity::of(&metadata))
        .map_err(|e| e.to_string())?;
    Ok((listener, identity))
}

/// Removes the socket bound, unless the path names another file by now.
pub fn remove_socket(path: &Path, bound: FileIdentity) {
    if std::fs::symlink_metadata(path).is_ok_and(|metadata| FileIdentity::of(&metadata) == bound) {
        let _ = std::fs::remove_file(path);
    }
}

/// What a file that is not a socket is, for the message that refuses it.
fn file_kind(file_type: &std::fs::FileType) -> &'static str {
    if file_type.is_file() {
        "a regular file"
    } else if file_type.is_dir() {
        "a directory"
    } else if file_type.is_symlink() {
        "a symbolic link"
    } else if file_type.is_fifo() {
        "a fifo"
    } else if file_type.is_char_device() || file_type.is_block_device() {
        "a device"
    } else {
        "a file of another kind"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_stale_socket_is_replaced_a_live_one_and_a_file_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("daemon.sock");
        let (live, _) = bind_socket(&path, "daemon").unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o660);
        let error = bind_socket(&path, "daemon").unwrap_err();
        assert_eq!(error, "another daemon is listening on it");
        // Dropping the listener leaves the socket file behind, as a killed process would.
        drop(live);
        let (_again, again) = bind_socket(&path, "daemon").unwrap();
        remove_socket(&path, again);
        assert!(!path.exists());
        let file = dir.path().join("config.toml");
        std::fs::write(&file, "x").unwrap();
        let error = bind_socket(&file, "daemon").unwrap_err();
        assert!(
            error.starts_with("it is a regular file, not a socket"),
            "{error}"
        );
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "x");
        let error = bind_socket(dir.path(), "daemon").unwrap_err();
        assert!(
            error.starts_with("it is a directory, not a socket"),
            "{error}"
        );
    }

    #[tokio::test]
    async fn only_the_socket_bound_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("daemon.sock");
        let (first, identity) = bind_socket(&path, "daemon").unwrap();
        // Another process replaced it (the first kept under another name, so its inode is
        // not reused): the new socket stays.
        drop(first);
        std::fs::rename(&path, dir.path().join("moved.sock")).unwrap();
        let (_second, _) = bind_socket(&path, "daemon").unwrap();
        remove_socket(&path, identity);
        assert!(path.exists());
    }
}
