//! Parsing of `postgres://` and `postgresql://` store URLs.
//!
//! ```text
//! postgres://[user[:password]@][host][:port][/database][?parameter=value&...]
//! ```
//!
//! The URL is libpq's: the user and password are percent-decoded; the host may be a name,
//! an address, `[ipv6]`, or (percent-encoded, or as `?host=`) the directory of a unix
//! socket. Its query holds two kinds of parameters:
//!
//! - PostgreSQL's own, passed to the driver: `sslmode` (`disable`, `allow`, `prefer` — the
//!   default —, `require`, `verify-ca`, `verify-full`), `sslrootcert`, `sslcert`, `sslkey`,
//!   `host`, `hostaddr`, `port`, `dbname`, `user`, `password`, `application_name` and
//!   `options` (e.g. `options=-csearch_path%3Dcoordination` to keep baton's tables in a
//!   schema of their own);
//! - baton's [`PostgresOptions`].
//!
//! Anything else (an unknown or repeated parameter, a fragment, another scheme) is rejected
//! before any I/O, and no error message ever shows the password. Environment variables
//! (`PGHOST`, `PGUSER`, `PGPASSWORD`, ...) and `~/.pgpass` fill in what the URL leaves out,
//! as in libpq.

use std::fmt;

use baton_core::options::{in_url, list};
use baton_core::{Error, Result};
use sqlx::ConnectOptions;
use sqlx::postgres::PgConnectOptions;
use url::Url;

use crate::options::{KNOWN_OPTIONS, PostgresOptions};

/// PostgreSQL's connection parameters that a store URL may carry.
const PG_PARAMETERS: &[&str] = &[
    "sslmode",
    "sslrootcert",
    "sslcert",
    "sslkey",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "application_name",
    "options",
];

/// The `sslmode`s that refuse to connect without TLS.
const TLS_REQUIRED: &[&str] = &["require", "verify-ca", "verify-full"];
const SSL_MODES: &[&str] = &[
    "disable",
    "allow",
    "prefer",
    "require",
    "verify-ca",
    "verify-full",
];

/// A parsed store URL.
#[derive(Clone)]
pub(crate) struct Target {
    /// What the driver connects with.
    pub(crate) connect: PgConnectOptions,
    /// The URL with the password replaced by `***`, for messages.
    pub(crate) redacted: String,
    /// The user and password the URL names, for a `listen_url` that names no user.
    pub(crate) credentials: Option<(String, Option<String>)>,
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted)
    }
}

/// Splits a store URL into where to connect and validated options.
///
/// # Errors
/// `InvalidInput` naming the problem (with the password redacted); `Unsupported` for an
/// `sslmode` that needs TLS in a build without the `tls` feature.
pub(crate) fn parse(text: &str) -> Result<(Target, PostgresOptions)> {
    let scheme_ok = text.starts_with("postgres://") || text.starts_with("postgresql://");
    let url = Url::parse(text).ok().filter(|_| scheme_ok);
    let Some(url) = url else {
        return Err(Error::invalid_input(format!(
            "store URL {:?} is not a postgres:// or postgresql:// URL; write postgres://[user[:password]@]host[:port]/database",
            baton_core::redact_url(text)
        )));
    };
    let redacted = baton_core::redact_url(url.as_str());
    let bad = |what: String| Error::invalid_input(format!("store URL {redacted:?}: {what}"));
    if url.fragment().is_some() {
        return Err(bad(
            "has a fragment (#...); parameters go in the query, e.g. ?sslmode=require".into(),
        ));
    }
    let mut options = PostgresOptions::new();
    let mut driver = url.clone();
    driver.set_query(None);
    {
        let mut passed = driver.query_pairs_mut();
        let pairs = baton_core::options::unique(url.query_pairs().collect(), "parameter")
            .map_err(|e| bad(e.message().to_owned()))?;
        for (name, value) in pairs {
            if let Some(set) = options.clone().set(&name, &value) {
                options = set.map_err(|e| bad(e.message().to_owned()))?;
            } else if PG_PARAMETERS.contains(&&*name) {
                if name == "sslmode" {
                    check_ssl_mode(&value).map_err(|e| in_url(&redacted, e))?;
                }
                passed.append_pair(&name, &value);
            } else {
                return Err(bad(format!(
                    "unknown parameter {name:?}; baton's options are {}, and PostgreSQL's are {}",
                    list(KNOWN_OPTIONS),
                    PG_PARAMETERS.join(", ")
                )));
            }
        }
    }
    if driver.query() == Some("") {
        driver.set_query(None);
    }
    options
        .validate()
        .map_err(|e| bad(e.message().to_owned()))?;
    let connect = PgConnectOptions::from_url(&driver)
        .map_err(|e| bad(format!("the driver rejected it: {e}")))?
        // baton reads no floating-point text, and PgBouncer refuses this startup parameter
        // unless told to ignore it.
        .extra_float_digits(None);
    let credentials = (!url.username().is_empty()).then(|| {
        // Percent-decoding (a `+` in a user part is a plus, not a space).
        let decode = |s: &str| {
            url::form_urlencoded::parse(format!("x={}", s.replace('+', "%2B")).as_bytes())
                .next()
                .map(|(_, v)| v.into_owned())
                .unwrap_or_default()
        };
        (decode(url.username()), url.password().map(decode))
    });
    Ok((
        Target {
            connect,
            redacted,
            credentials,
        },
        options,
    ))
}

/// The target of a store's `listen_url`: a `postgres://` URL with PostgreSQL's parameters
/// only and no password; without a user it takes the user and password of `store`.
///
/// # Errors
/// `InvalidInput` naming the problem, as for a store URL, and for baton's options or a
/// password in it.
pub(crate) fn parse_listen(text: &str, store: &Target) -> Result<Target> {
    let redacted = baton_core::redact_url(text);
    let bad = |what: &str| Error::invalid_input(format!("listen_url {redacted:?}: {what}"));
    let (mut target, options) = parse(text).map_err(|e| {
        Error::new(
            e.kind(),
            format!(
                "listen_url: {}",
                e.message().trim_start_matches("store URL ")
            ),
        )
    })?;
    if options != PostgresOptions::new() {
        return Err(bad(
            "carries baton's options; it may hold PostgreSQL's parameters only (sslmode, ...)",
        ));
    }
    let has_password = Url::parse(text).is_ok_and(|url| {
        url.password().is_some() || url.query_pairs().any(|(name, _)| name == "password")
    });
    if has_password {
        return Err(bad(
            "carries a password; leave it out (it would show wherever the store URL is shown): without a user the LISTEN connection takes the store URL's user and password, with one it reads PGPASSWORD or ~/.pgpass",
        ));
    }
    if target.credentials.is_none()
        && let Some((user, password)) = &store.credentials
    {
        target.connect = target.connect.username(user);
        if let Some(password) = password {
            target.connect = target.connect.password(password);
        }
    }
    Ok(target)
}

fn check_ssl_mode(mode: &str) -> Result<()> {
    if !SSL_MODES.contains(&mode) {
        return Err(Error::invalid_input(format!(
            "sslmode={mode:?} is not one of {}",
            SSL_MODES.join(", ")
        )));
    }
    if !cfg!(feature = "tls") && TLS_REQUIRED.contains(&mode) {
        return Err(Error::unsupported(format!(
            "sslmode={mode} needs TLS, and this build of baton-postgres has no TLS; enable its `tls` feature"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn urls_with_parameters_and_options() {
        let (target, options) = parse(
            "postgres://app:s%40cret@db.internal:6543/coord?sslmode=disable&application_name=billing&connect_timeout=3&response_timeout=500ms&listen=off&durable_grants=off",
        )
        .unwrap();
        assert_eq!(target.connect.get_host(), "db.internal");
        assert_eq!(target.connect.get_port(), 6543);
        assert_eq!(target.connect.get_username(), "app");
        assert_eq!(target.connect.get_database(), Some("coord"));
        assert_eq!(target.connect.get_application_name(), Some("billing"));
        assert!(!target.redacted.contains("s%40cret"), "{}", target.redacted);
        assert!(target.redacted.contains("***"), "{}", target.redacted);
        assert_eq!(options.get_connect_timeout(), Duration::from_secs(3));
        assert_eq!(options.get_response_timeout(), Duration::from_millis(500));
        assert!(!options.get_listen());
        assert!(!options.get_durable_grants());
        let (target, options) = parse("postgresql://localhost/x").unwrap();
        assert_eq!(target.connect.get_database(), Some("x"));
        assert_eq!(options, PostgresOptions::new());
        let (target, _) = parse("postgres://u@%2Frun%2Fpostgresql/x").unwrap();
        assert_eq!(
            target.connect.get_socket().map(|p| p.display().to_string()),
            Some("/run/postgresql".to_owned())
        );
    }

    fn rejected(url: &str, needle: &str) {
        let err = parse(url).expect_err(url);
        assert!(err.is_invalid_input(), "{url}: {err}");
        assert!(
            err.message().contains(needle),
            "{url}: expected {needle:?} in {err}"
        );
        assert!(!err.message().contains("hunter2"), "{err}");
    }

    #[test]
    fn bad_urls_name_the_problem_and_hide_the_password() {
        rejected("redis://x", "not a postgres://");
        rejected("postgres:/x", "not a postgres://");
        rejected(
            "postgres://u:hunter2@h/d?frobnicate=1",
            "unknown parameter \"frobnicate\"",
        );
        rejected(
            "postgres://u:hunter2@h/d?sslmode=require&sslmode=disable",
            "given twice",
        );
        rejected("postgres://u:hunter2@h/d?sslmode=sometimes", "sslmode");
        rejected(
            "postgres://u:hunter2@h/d?response_timeout=0",
            "out of range",
        );
        rejected("postgres://u:hunter2@h/d?max_connections=0", "between 1");
        rejected(
            "postgres://u:hunter2@h/d?durable_grants=maybe",
            "neither on nor off",
        );
        rejected("postgres://u:hunter2@h/d#x", "fragment");
        rejected("postgres://u:hunter2@h/d?password=hunter2&x=1", "unknown");
    }

    #[test]
    fn sslmodes_are_passed_to_the_driver() {
        for mode in SSL_MODES {
            if cfg!(feature = "tls") || !TLS_REQUIRED.contains(mode) {
                let (target, _) = parse(&format!("postgres://h/d?sslmode={mode}")).unwrap();
                assert!(
                    format!("{:?}", target.connect.get_ssl_mode())
                        .to_ascii_lowercase()
                        .replace('-', "")
                        .contains(&mode.replace('-', "")),
                    "{mode}: {:?}",
                    target.connect.get_ssl_mode()
                );
            }
        }
    }
}
