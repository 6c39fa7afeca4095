//! Parsing of `redis://` and `rediss://` store URLs.
//!
//! ```text
//! redis://[[user]:password@]host[:port][/db][?option=value&...]
//! rediss://...   (the same, over TLS)
//! ```
//!
//! The user and password are percent-decoded and sent with `AUTH` (an ACL user when a user
//! is given); the database number is sent with `SELECT`; the port defaults to 6379. The
//! query holds [`RedisOptions`], `name=value` joined by `&`. Anything else (an unknown or
//! repeated option, a database that is not a number, a fragment, a path after the database)
//! is rejected before any I/O, and no error message ever shows the password.

use baton_core::{Error, Result};
use url::Url;

use crate::options::RedisOptions;

/// A parsed store URL.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Target {
    /// The URL for the redis client: the store URL without baton's options.
    pub(crate) client_url: String,
    /// The URL with the password replaced by `***`, for messages.
    pub(crate) redacted: String,
    /// Whether the connection uses TLS (`rediss://`).
    pub(crate) tls: bool,
    /// The database number.
    pub(crate) db: i64,
    /// The user, if one is given.
    pub(crate) user: Option<String>,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.redacted)
    }
}

/// Splits a store URL into where to connect and validated options.
///
/// # Errors
/// `InvalidInput` naming the problem (with the password redacted).
pub(crate) fn parse(text: &str) -> Result<(Target, RedisOptions)> {
    let scheme_ok = text.starts_with("redis://") || text.starts_with("rediss://");
    let url = Url::parse(text).ok().filter(|_| scheme_ok);
    let Some(mut url) = url else {
        return Err(Error::invalid_input(format!(
            "store URL {:?} is not a redis:// or rediss:// URL; write redis://[[user]:password@]host[:port][/db]",
            redact_text(text)
        )));
    };
    let redacted = redact(&url);
    let bad = |what: String| Error::invalid_input(format!("store URL {redacted:?}: {what}"));
    if url.host_str().is_none_or(str::is_empty) {
        return Err(bad("has no host; write redis://host[:port][/db]".into()));
    }
    if url.fragment().is_some() {
        return Err(bad(
            "has a fragment (#...); options go in the query, e.g. ?connect_timeout=1s".into(),
        ));
    }
    let db = match url.path().trim_start_matches('/') {
        "" => 0,
        path => path.parse::<u32>().map(i64::from).map_err(|_| {
            bad(format!(
                "the database {path:?} is not a number; write the database as /0, /1, ... after the host"
            ))
        })?,
    };
    let mut options = RedisOptions::new();
    let mut seen: Vec<&str> = Vec::new();
    let query = url.query().map(str::to_owned);
    for pair in query
        .as_deref()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let Some((name, value)) = pair.split_once('=') else {
            return Err(bad(format!(
                "option {pair:?} has no value; write name=value"
            )));
        };
        if seen.contains(&name) {
            return Err(bad(format!("option {name:?} is given twice")));
        }
        seen.push(name);
        options = options
            .set(name, value)
            .map_err(|e| bad(e.message().to_owned()))?;
    }
    options
        .validate()
        .map_err(|e| bad(e.message().to_owned()))?;
    url.set_query(None);
    let user = (!url.username().is_empty()).then(|| url.username().to_owned());
    Ok((
        Target {
            tls: url.scheme() == "rediss",
            client_url: url.into(),
            redacted,
            db,
            user,
        },
        options,
    ))
}

/// The URL with its password replaced by `***`.
fn redact(url: &Url) -> String {
    let mut shown = url.clone();
    if shown.password().is_some() {
        let _ = shown.set_password(Some("***"));
    }
    shown.into()
}

/// Best-effort redaction of a URL that did not parse: drops everything between `://` and
/// the last `@` before the host.
fn redact_text(text: &str) -> String {
    match text.split_once("://") {
        Some((scheme, rest)) => {
            let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
            match rest[..authority_end].rfind('@') {
                Some(at) => format!("{scheme}://***@{}", &rest[at + 1..]),
                None => text.to_owned(),
            }
        }
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn host_port_db_user_password() {
        let (target, options) = parse("redis://127.0.0.1:6380/2").unwrap();
        assert_eq!(target.client_url, "redis://127.0.0.1:6380/2");
        assert_eq!((target.db, target.tls, target.user), (2, false, None));
        assert_eq!(options, RedisOptions::new());

        let (target, _) = parse("redis://localhost").unwrap();
        assert_eq!(target.db, 0);
        let (target, _) = parse("redis://localhost/").unwrap();
        assert_eq!(target.db, 0);

        let (target, _) = parse("redis://app:s%40cret@cache.internal:6379/5").unwrap();
        assert_eq!(target.user.as_deref(), Some("app"));
        assert_eq!(target.db, 5);
        assert_eq!(target.redacted, "redis://app:***@cache.internal:6379/5");
        let info =
            redis::IntoConnectionInfo::into_connection_info(target.client_url.as_str()).unwrap();
        assert_eq!(info.redis_settings().username(), Some("app"));
        assert_eq!(
            info.redis_settings().password(),
            Some("s@cret"),
            "percent-decoded"
        );
        assert_eq!(info.redis_settings().db(), 5);

        let (target, _) = parse("redis://:only-password@h").unwrap();
        assert_eq!(target.user, None);
        assert_eq!(target.redacted, "redis://:***@h");
        let info =
            redis::IntoConnectionInfo::into_connection_info(target.client_url.as_str()).unwrap();
        assert_eq!(info.redis_settings().password(), Some("only-password"));

        let (target, _) = parse("redis://[::1]:7000").unwrap();
        assert_eq!(target.client_url, "redis://[::1]:7000");
    }

    #[test]
    fn tls() {
        let (target, _) = parse("rediss://user:pw@redis.example.com:6380/1").unwrap();
        assert!(target.tls);
        assert_eq!(target.db, 1);
        assert_eq!(
            target.redacted,
            "rediss://user:***@redis.example.com:6380/1"
        );
    }

    #[test]
    fn options_in_the_query() {
        let (target, options) =
            parse("redis://h:1/3?connect_timeout=250ms&response_timeout=1s").unwrap();
        assert_eq!(options.get_connect_timeout(), Duration::from_millis(250));
        assert_eq!(options.get_response_timeout(), Duration::from_secs(1));
        assert_eq!(
            target.client_url, "redis://h:1/3",
            "options are not sent on"
        );
        let (_, options) = parse("redis://h?").unwrap();
        assert_eq!(options, RedisOptions::new());
    }

    fn rejected(url: &str, needle: &str) {
        let err = parse(url).expect_err(url);
        assert!(err.is_invalid_input(), "{url}: {err}");
        assert!(
            err.message().contains(needle),
            "{url}: expected {needle:?} in {err}"
        );
        assert!(!err.message().contains("hunter2"), "password leaked: {err}");
    }

    #[test]
    fn bad_urls_name_the_problem() {
        rejected("redis://", "has no host");
        rejected("redis:///0", "has no host");
        rejected("http://h", "not a redis:// or rediss:// URL");
        rejected("redis:h", "not a redis:// or rediss:// URL");
        rejected("redis://u:hunter2@h:notaport", "not a redis://");
        rejected(
            "redis://u:hunter2@h/abc",
            "the database \"abc\" is not a number",
        );
        rejected("redis://u:hunter2@h/-1", "is not a number");
        rejected("redis://h/1/2", "is not a number");
        rejected("redis://u:hunter2@h/0#insecure", "has a fragment");
        rejected("redis://u:hunter2@h?db=1", "unknown redis:// option \"db\"");
        rejected(
            "redis://h?db=1",
            "connect_timeout, response_timeout and min_replicas",
        );
        rejected("redis://h?connect_timeout", "has no value");
        rejected("redis://h?connect_timeout=5", "duration \"5\"");
        rejected(
            "redis://h?response_timeout=0",
            "response_timeout 0ms is out of range",
        );
        rejected(
            "redis://h?connect_timeout=1s&connect_timeout=2s",
            "\"connect_timeout\" is given twice",
        );
    }

    #[test]
    fn unparsable_urls_do_not_show_the_password() {
        assert_eq!(redact_text("redis://u:hunter2@h:x/0"), "redis://***@h:x/0");
        assert_eq!(redact_text("redis://h:x"), "redis://h:x");
    }
}
