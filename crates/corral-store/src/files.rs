//! Reading the small files a configuration or another plugin names (`resolvConf`, host-local's
//! address files): regular files only, with a size cap, never blocking.
//!
//! `std::fs::read` would wait forever on a FIFO (its `open` blocks until a writer comes) and
//! read `/dev/zero` until memory runs out, while the caller holds the state directory's lock.
//! So the file is opened with `O_NONBLOCK` (which a FIFO's `open` honours and a regular file
//! ignores), its type is checked on the open descriptor (no window to swap it), and at most
//! one byte more than the cap is read.
//!
//! Also the creation of the directories the store and the pending records live in, each
//! made durable in its parent.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Why a small file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SmallFileError {
    /// The path names something other than a regular file (after following symlinks).
    #[error("{path} is a {kind}, not a regular file")]
    NotRegular { path: PathBuf, kind: &'static str },
    #[error("{path} is larger than {limit} bytes")]
    TooLarge { path: PathBuf, limit: u64 },
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// What a file type is called in a message.
fn kind_of(file_type: std::fs::FileType) -> &'static str {
    if file_type.is_dir() {
        "directory"
    } else if file_type.is_fifo() {
        "fifo (named pipe)"
    } else if file_type.is_char_device() {
        "character device"
    } else if file_type.is_block_device() {
        "block device"
    } else if file_type.is_socket() {
        "socket"
    } else {
        "special file"
    }
}

/// The contents of the regular file at `path`, at most `limit` bytes.
pub fn read_small_file(path: &Path, limit: u64) -> Result<Vec<u8>, SmallFileError> {
    let io = |source| SmallFileError::Io {
        path: path.to_path_buf(),
        source,
    };
    let flags = rustix::fs::OFlags::NONBLOCK | rustix::fs::OFlags::NOCTTY;
    let file = File::options()
        .read(true)
        .custom_flags(i32::try_from(flags.bits()).unwrap_or(0))
        .open(path)
        .map_err(io)?;
    let metadata = file.metadata().map_err(io)?;
    if !metadata.file_type().is_file() {
        return Err(SmallFileError::NotRegular {
            path: path.to_path_buf(),
            kind: kind_of(metadata.file_type()),
        });
    }
    if metadata.len() > limit {
        return Err(SmallFileError::TooLarge {
            path: path.to_path_buf(),
            limit,
        });
    }
    let mut contents = Vec::with_capacity(usize::try_from(metadata.len()).unwrap_or(0));
    // The file may grow between the size check and the read: read one byte more than
    // allowed, so that is seen too.
    file.take(limit.saturating_add(1))
        .read_to_end(&mut contents)
        .map_err(io)?;
    if contents.len() as u64 > limit {
        return Err(SmallFileError::TooLarge {
            path: path.to_path_buf(),
            limit,
        });
    }
    Ok(contents)
}

/// Creates `dir` and any missing parents, syncing each new directory's parent (with
/// `sync_dir`) so the directory itself survives a power loss. `create_error` names a failed
/// creation.
pub(crate) fn create_dirs_synced<E>(
    dir: &Path,
    create_error: impl FnOnce(std::io::Error) -> E,
    sync_dir: impl Fn(&Path) -> Result<(), E>,
) -> Result<(), E> {
    if dir.is_dir() {
        return Ok(());
    }
    let mut missing = Vec::new();
    let mut current = Some(dir);
    while let Some(path) = current {
        if path.as_os_str().is_empty() || path.exists() {
            break;
        }
        missing.push(path);
        current = path.parent();
    }
    std::fs::create_dir_all(dir).map_err(create_error)?;
    for path in missing.iter().rev() {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            sync_dir(parent)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_regular_files_and_refuses_everything_else_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let small = dir.path().join("small");
        std::fs::write(&small, "nameserver 10.0.0.1\n").unwrap();
        assert_eq!(
            read_small_file(&small, 64).unwrap(),
            b"nameserver 10.0.0.1\n"
        );
        assert!(matches!(
            read_small_file(&small, 4),
            Err(SmallFileError::TooLarge { limit: 4, .. })
        ));
        assert!(matches!(
            read_small_file(Path::new("/dev/zero"), 64),
            Err(SmallFileError::NotRegular {
                kind: "character device",
                ..
            })
        ));
        assert!(matches!(
            read_small_file(dir.path(), 64),
            Err(SmallFileError::NotRegular {
                kind: "directory",
                ..
            })
        ));
        let fifo = dir.path().join("fifo");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("mkfifo runs");
        assert!(made.success());
        let error = read_small_file(&fifo, 64).unwrap_err();
        assert!(
            matches!(error, SmallFileError::NotRegular { .. }),
            "{error}"
        );
        assert!(error.to_string().contains("fifo"), "{error}");
        assert!(matches!(
            read_small_file(&dir.path().join("absent"), 64),
            Err(SmallFileError::Io { .. })
        ));
    }
}
