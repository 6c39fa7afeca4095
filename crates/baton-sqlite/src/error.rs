//! How SQLite failures become [`baton_core::Error`]s.
//!
//! Every rusqlite error is wrapped: the kind says what a caller can do (`Unavailable` for a
//! busy, locked or failing file, which may pass; `Internal` for a corrupt file or a schema
//! baton does not understand, which will not), the message names the operation and the
//! file, and the rusqlite error is kept as the `source`. No rusqlite type appears in the API.

use std::fmt;
use std::path::Path;

use baton_core::{Error, ErrorKind};
use rusqlite::ErrorCode;

/// A failure inside one blocking operation, before the file path is attached.
#[derive(Debug)]
pub(crate) enum OpError {
    /// SQLite or rusqlite failed.
    Sqlite(rusqlite::Error),
    /// The file holds something the store did not write (a row that breaks an invariant, a
    /// schema of another version or application). The message names it.
    Corrupt(String),
    /// An error that already has its kind and message.
    Baton(Error),
}

impl From<rusqlite::Error> for OpError {
    fn from(e: rusqlite::Error) -> Self {
        OpError::Sqlite(e)
    }
}

impl From<Error> for OpError {
    fn from(e: Error) -> Self {
        OpError::Baton(e)
    }
}

impl OpError {
    /// The error a caller sees: `what` failed on the file at `path`.
    pub(crate) fn into_error(self, what: &str, path: &Path) -> Error {
        match self {
            OpError::Sqlite(e) => sqlite_error(e, what, path),
            OpError::Corrupt(message) => Error::internal(format!(
                "{what} on SQLite file {}: {message}",
                path.display()
            )),
            OpError::Baton(e) => e,
        }
    }
}

fn sqlite_error(e: rusqlite::Error, what: &str, path: &Path) -> Error {
    let (kind, why) = classify(&e);
    Error::new(
        kind,
        format!("{what} on SQLite file {} failed: {why}", path.display()),
    )
    .with_source(e)
}

fn classify(e: &rusqlite::Error) -> (ErrorKind, Why) {
    let code = match e {
        rusqlite::Error::SqliteFailure(f, _) => f.code,
        // Type and conversion errors: a value in the file is not what baton wrote.
        _ => return (ErrorKind::Internal, Why::Unexpected),
    };
    match code {
        ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked => (ErrorKind::Unavailable, Why::Busy),
        ErrorCode::CannotOpen | ErrorCode::PermissionDenied | ErrorCode::ReadOnly => {
            (ErrorKind::Unavailable, Why::CannotOpen)
        }
        ErrorCode::SystemIoFailure
        | ErrorCode::DiskFull
        | ErrorCode::OutOfMemory
        | ErrorCode::NoLargeFileSupport
        | ErrorCode::FileLockingProtocolFailed
        | ErrorCode::OperationInterrupted => (ErrorKind::Unavailable, Why::Io),
        ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase => (ErrorKind::Internal, Why::Corrupt),
        _ => (ErrorKind::Internal, Why::Unexpected),
    }
}

#[derive(Debug, Clone, Copy)]
enum Why {
    Busy,
    CannotOpen,
    Io,
    Corrupt,
    Unexpected,
}

impl fmt::Display for Why {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Why::Busy => {
                "another connection held the file's write lock for longer than busy_timeout"
            }
            Why::CannotOpen => "the file cannot be opened for reading and writing",
            Why::Io => "I/O error",
            Why::Corrupt => "the file is corrupt or not an SQLite database",
            Why::Unexpected => "unexpected SQLite error",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::ffi;

    fn failure(code: i32) -> rusqlite::Error {
        rusqlite::Error::SqliteFailure(ffi::Error::new(code), None)
    }

    #[test]
    fn kinds() {
        let path = Path::new("/x/baton.db");
        let busy = OpError::from(failure(ffi::SQLITE_BUSY)).into_error("claim", path);
        assert_eq!(busy.kind(), ErrorKind::Unavailable);
        assert!(busy.message().contains("claim on SQLite file /x/baton.db"));
        assert!(busy.message().contains("busy_timeout"), "{busy}");
        assert!(std::error::Error::source(&busy).is_some());
        for code in [ffi::SQLITE_LOCKED, ffi::SQLITE_IOERR, ffi::SQLITE_CANTOPEN] {
            let e = OpError::from(failure(code)).into_error("renew", path);
            assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
        }
        for code in [
            ffi::SQLITE_CORRUPT,
            ffi::SQLITE_NOTADB,
            ffi::SQLITE_MISMATCH,
        ] {
            let e = OpError::from(failure(code)).into_error("list", path);
            assert_eq!(e.kind(), ErrorKind::Internal, "{e}");
        }
        let corrupt = OpError::Corrupt("a fence of 0".into()).into_error("claim", path);
        assert_eq!(corrupt.kind(), ErrorKind::Internal);
        assert_eq!(
            corrupt.message(),
            "claim on SQLite file /x/baton.db: a fence of 0"
        );
    }
}
