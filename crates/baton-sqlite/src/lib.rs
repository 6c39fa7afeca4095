//! The embedded SQLite store of baton. Not for direct use; see `baton`.
#![forbid(unsafe_code)]
