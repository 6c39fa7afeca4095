//! Parsing of `sqlite://` store URLs.
//!
//! `sqlite:///abs/path.db` names `/abs/path.db`; `sqlite://relative/path.db` names
//! `relative/path.db`, relative to the working directory. The path is everything up to the
//! first `?`, taken literally (no percent-decoding); a path that contains `?` can only be
//! opened with [`SqliteStore::open`](crate::SqliteStore::open). The query holds options,
//! `name=value` joined by `&` (see [`SqliteOptions`]).

use std::path::PathBuf;

use baton_core::{Error, Result, options};

use crate::options::SqliteOptions;

/// Splits a `sqlite://` URL into the file path and validated options.
///
/// # Errors
/// `InvalidInput` naming the problem: another scheme, an empty path, a path that ends in `/`,
/// `:memory:`, an option without `=`, an unknown or repeated option, or a bad value.
pub(crate) fn parse(url: &str) -> Result<(PathBuf, SqliteOptions)> {
    // Messages show the URL with any secret in it hidden (a password is no sqlite://
    // option, but one given by mistake must not be echoed).
    let shown = baton_core::redact_url(url);
    let Some(rest) = url.strip_prefix("sqlite://") else {
        return Err(Error::invalid_input(format!(
            "store URL {shown:?} is not a sqlite:// URL; write sqlite:///absolute/path.db or sqlite://relative/path.db"
        )));
    };
    let (path, query) = match rest.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (rest, None),
    };
    if path.is_empty() {
        return Err(Error::invalid_input(format!(
            "store URL {shown:?} has no file path; write sqlite:///absolute/path.db or sqlite://relative/path.db"
        )));
    }
    if path == ":memory:" {
        return Err(Error::invalid_input(format!(
            "store URL {shown:?}: an in-memory SQLite database is private to one connection and excludes nothing; use memory:// for a process-local store"
        )));
    }
    if path.ends_with('/') {
        return Err(Error::invalid_input(format!(
            "store URL {shown:?} names a directory; name the database file, e.g. sqlite://{path}baton.db"
        )));
    }
    let in_url = |e| options::in_url(&shown, e);
    let mut options = SqliteOptions::new();
    for (name, value) in options::query_pairs(query.unwrap_or("")).map_err(in_url)? {
        options = options.set(name, value).map_err(in_url)?;
    }
    options.validate().map_err(in_url)?;
    Ok((PathBuf::from(path), options))
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Duration;

    use super::*;
    use crate::Synchronous;

    #[test]
    fn absolute_and_relative_paths() {
        let (path, options) = parse("sqlite:///var/lib/app/baton.db").unwrap();
        assert_eq!(path, Path::new("/var/lib/app/baton.db"));
        assert_eq!(options, SqliteOptions::new());
        let (path, _) = parse("sqlite://state/baton.db").unwrap();
        assert_eq!(path, Path::new("state/baton.db"));
        let (path, _) = parse("sqlite://baton.db").unwrap();
        assert_eq!(path, Path::new("baton.db"));
        let (path, _) = parse("sqlite:///tmp/with space/%41.db").unwrap();
        assert_eq!(path, Path::new("/tmp/with space/%41.db"), "taken literally");
    }

    #[test]
    fn options_in_the_query() {
        let (path, options) =
            parse("sqlite:///a/b.db?busy_timeout=250ms&synchronous=normal&poll_interval=20ms")
                .unwrap();
        assert_eq!(path, Path::new("/a/b.db"));
        assert_eq!(options.get_busy_timeout(), Duration::from_millis(250));
        assert_eq!(options.get_synchronous(), Synchronous::Normal);
        assert_eq!(options.get_poll_interval(), Duration::from_millis(20));
        let (_, options) = parse("sqlite:///a/b.db?").unwrap();
        assert_eq!(
            options,
            SqliteOptions::new(),
            "an empty query is no options"
        );
        let (_, options) = parse("sqlite:///a/b.db?synchronous=FULL&").unwrap();
        assert_eq!(options.get_synchronous(), Synchronous::Full);
    }

    fn rejected(url: &str, needle: &str) {
        let err = parse(url).expect_err(url);
        assert!(err.is_invalid_input(), "{url}: {err}");
        assert!(
            err.message().contains(needle),
            "{url}: expected {needle:?} in {err}"
        );
    }

    #[test]
    fn a_password_given_by_mistake_is_not_echoed() {
        for url in [
            "sqlite:///x.db?password=Zq7pw",
            "sqlite:///x.db?busy_timeout=1s&password=Zq7pw",
        ] {
            let err = parse(url).unwrap_err();
            assert!(err.message().contains("\"password\""), "{err}");
            assert!(!err.message().contains("Zq7pw"), "{err}");
        }
    }

    #[test]
    fn bad_urls_name_the_problem() {
        rejected("sqlite://", "has no file path");
        rejected("sqlite://?busy_timeout=1s", "has no file path");
        rejected("sqlite:///var/lib/", "names a directory");
        rejected("sqlite://:memory:", "memory://");
        rejected("postgres://x", "not a sqlite:// URL");
        rejected("sqlite:/x.db", "not a sqlite:// URL");
        rejected(
            "sqlite:///x.db?mode=rwc",
            "unknown sqlite:// option \"mode\"",
        );
        rejected(
            "sqlite:///x.db?mode=rwc",
            "busy_timeout, synchronous and poll_interval",
        );
        rejected("sqlite:///x.db?busy_timeout", "has no value");
        rejected("sqlite:///x.db?busy_timeout=5", "duration \"5\"");
        rejected(
            "sqlite:///x.db?busy_timeout=0",
            "busy_timeout 0ms is out of range",
        );
        rejected(
            "sqlite:///x.db?poll_interval=1m",
            "poll_interval 1m is out of range",
        );
        rejected("sqlite:///x.db?synchronous=off", "synchronous=\"off\"");
        rejected(
            "sqlite:///x.db?synchronous=full&synchronous=normal",
            "\"synchronous\" is given twice",
        );
    }
}
