//! Which file a connection is on: [`FileId`], the device and inode numbers of a path.
//!
//! An open SQLite connection keeps the file it opened, not the path: when the file is
//! deleted, or another file is moved over the path, the connection goes on reading and
//! writing the old file, which nobody else will ever open again. A holder renewing there
//! would never learn that the next process, opening the path, found the key free. So every
//! operation first compares the path's [`FileId`] with the one its connection was opened on
//! (one `stat`), and a connection on a file that is no longer at the path is closed and
//! replaced by one on the file that is (see [`crate::connection`]).
//!
//! While a connection holds the old file open its inode cannot be reused, so a new file at
//! the path has another [`FileId`] as long as the old connections are closed only after the
//! new one is open (the pool does so); a new file is prepared whatever its number.

use std::io;
use std::path::Path;

/// The identity of a file: its device and inode numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileId {
    dev: u64,
    ino: u64,
}

impl FileId {
    /// The identity of the file at `path` now.
    pub(crate) fn of(path: &Path) -> io::Result<FileId> {
        let meta = std::fs::metadata(path)?;
        Ok(FileId::from_metadata(&meta))
    }

    #[cfg(unix)]
    fn from_metadata(meta: &std::fs::Metadata) -> FileId {
        use std::os::unix::fs::MetadataExt;
        FileId {
            dev: meta.dev(),
            ino: meta.ino(),
        }
    }

    /// The store refuses to open where there is no unix clock, so this is never compared.
    #[cfg(not(unix))]
    fn from_metadata(_meta: &std::fs::Metadata) -> FileId {
        FileId { dev: 0, ino: 0 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(unix)]
    #[test]
    fn a_file_moved_over_the_path_has_another_identity() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a");
        std::fs::write(&path, b"a").unwrap();
        let first = FileId::of(&path).unwrap();
        assert_eq!(FileId::of(&path).unwrap(), first, "stable");
        let held = std::fs::File::open(&path).unwrap();
        let other = dir.path().join("b");
        std::fs::write(&other, b"b").unwrap();
        std::fs::rename(&other, &path).unwrap();
        assert_ne!(FileId::of(&path).unwrap(), first);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(
            FileId::of(&path).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
        drop(held);
    }
}
