//! The values every subcommand reads, one parser per kind, and the argument groups several
//! subcommands share.
//!
//! Every parser runs while clap parses, before any store is opened, and checks by the
//! library's own rule where it has one (a key, a holder, a TTL, a queue name), so a typo
//! exits 64 and changes nothing. A subcommand declares its arguments next to its code and
//! takes its parsers from here, so that two flags reading the same kind of value (a key, a
//! TTL, a grace period) accept exactly the same values.
//!
//! Durations are read by [`baton::time::parse_duration`] (`500ms`, `30s`, `5m`, `1h`, `2d`),
//! then held to one bound: the library's rule for what the library takes (a TTL, a wait, a
//! lease, a backoff, a delay, a window), or [`at_most`] for what only the command line
//! takes (a grace period, a drain, a page refresh).

use std::ffi::OsString;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use baton::Namespace;
use baton::limit::{MAX_WINDOW, MIN_WINDOW, Quota};
use baton::store::MemoryStore;
use baton::time::{Ttl, WaitTime, format_duration};
use baton::work::{Backoff, EnqueueOptions, MAX_PAYLOAD_BYTES, Queue, QueueOptions};
use clap::Args;
use serde_json::value::RawValue;

use crate::output::human_duration;

/// Default `--ttl` of `baton run` and of lease claims and renewals.
pub(crate) const DEFAULT_TTL: &str = "30s";
/// Default `--grace` of `baton run` and `baton worker`: time between SIGTERM and SIGKILL.
pub(crate) const DEFAULT_GRACE: &str = "10s";
/// The longest `--grace` of `baton run` and `baton worker`.
pub(crate) const MAX_GRACE: Duration = Duration::from_secs(3600);
/// The longest `--drain` of `baton worker`.
pub(crate) const MAX_DRAIN: Duration = Duration::from_secs(12 * 3600);
/// Default `--limit` of the list commands.
pub(crate) const DEFAULT_LIST_LIMIT: usize = 1000;

// ---- argument groups --------------------------------------------------------------------

/// COMMAND and its arguments, after `--`: what `baton run`, `baton worker` and the exec guard
/// start.
#[derive(Debug, Args)]
pub(crate) struct CommandLine {
    /// The command and its arguments, after `--`.
    #[arg(
        value_name = "COMMAND",
        last = true,
        required = true,
        num_args = 1..,
        allow_hyphen_values = true
    )]
    pub(crate) argv: Vec<OsString>,
}

/// `--holder`.
#[derive(Debug, Args)]
pub(crate) struct HolderArg {
    /// The holder id: a stable identity such as a host or instance name.
    #[arg(long = "holder", env = "BATON_HOLDER", value_name = "ID", value_parser = holder)]
    pub(crate) id: String,
}

/// Options of the list commands.
#[derive(Debug, Args)]
pub(crate) struct ListArgs {
    /// Only keys that start with this prefix.
    #[arg(long, value_name = "P", default_value = "", value_parser = prefix)]
    pub(crate) prefix: String,
    /// At most this many entries.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_LIST_LIMIT)]
    pub(crate) limit: usize,
}

// ---- text -------------------------------------------------------------------------------

/// `text` itself, once `check` (one of the library's rules) accepts it; otherwise the
/// library's message.
fn checked_text<'a, T>(
    text: &'a str,
    check: impl FnOnce(&'a str) -> baton::Result<T>,
) -> Result<String, String> {
    check(text)
        .map(|_| text.to_owned())
        .map_err(|e| e.message().to_owned())
}

/// A key (of a lock, a lease, a rate limit, a cache entry).
pub(crate) fn key(text: &str) -> Result<String, String> {
    checked_text(text, baton::Key::new)
}

/// An election's candidate id (`--id`): a lock's holder label by its rules.
pub(crate) fn candidate(text: &str) -> Result<String, String> {
    checked_text(text, baton::election::check_candidate)
}

/// A leader's value (`--value`): at most 1024 bytes, no control characters.
pub(crate) fn leader_value(text: &str) -> Result<String, String> {
    checked_text(text, baton::election::check_value)
}

/// A broadcast channel: a key by its rules, named as a channel in the message.
pub(crate) fn channel(text: &str) -> Result<String, String> {
    key(text).map_err(|message| message.replacen("key", "channel", 1))
}

/// A lease holder id.
pub(crate) fn holder(text: &str) -> Result<String, String> {
    checked_text(text, baton::lease::Holder::new)
}

/// A lease's reason.
pub(crate) fn reason(text: &str) -> Result<String, String> {
    checked_text(text, baton::lease::check_reason)
}

/// A key prefix for listing: empty, or what a key could start with.
pub(crate) fn prefix(text: &str) -> Result<String, String> {
    checked_text(text, |prefix| {
        Namespace::default().qualify_prefix(baton::store::KeyKind::Lock, prefix)
    })
}

/// A prefix of names (of queues): empty, or text a key could be.
pub(crate) fn name_prefix(text: &str) -> Result<String, String> {
    if text.is_empty() {
        return Ok(String::new());
    }
    key(text)
}

/// `--namespace`.
pub(crate) fn namespace(text: &str) -> Result<Namespace, String> {
    Namespace::new(text).map_err(|e| e.message().to_owned())
}

/// A queue's name.
pub(crate) fn queue(text: &str) -> Result<String, String> {
    checked_text(text, |name| Queue::new(Arc::new(MemoryStore::new()), name))
}

/// An enqueue's de-duplication id.
pub(crate) fn dedup_id(text: &str) -> Result<String, String> {
    checked_text(text, |id| EnqueueOptions::dedup(id).validate())
}

/// `--store`, checked as the store reads it (scheme, path or address, options) without
/// opening anything.
///
/// clap prints a rejected value in its message; a store URL can hold a password, so this
/// parser's error carries only the library's message, which redacts it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StoreUrl;

impl clap::builder::TypedValueParser for StoreUrl {
    type Value = String;

    fn parse_ref(
        &self,
        _command: &clap::Command,
        _arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<String, clap::Error> {
        let invalid = |message: String| {
            clap::Error::raw(
                clap::error::ErrorKind::ValueValidation,
                format!("invalid --store (BATON_STORE): {message}\n"),
            )
        };
        let url = value
            .to_str()
            .ok_or_else(|| invalid("the URL is not UTF-8".to_owned()))?;
        baton::store::check_url(url).map_err(|e| invalid(e.message().to_owned()))?;
        Ok(url.to_owned())
    }
}

// ---- JSON -------------------------------------------------------------------------------

/// Checks that `text` is one JSON document of at most `max_bytes`; `what` names it in the
/// message ("the payload", "VALUE").
pub(crate) fn check_json(text: &str, what: &str, max_bytes: usize) -> Result<(), String> {
    if text.len() > max_bytes {
        return Err(format!(
            "{what} is {} bytes long; the limit is {max_bytes} bytes: store large data elsewhere and pass its reference",
            text.len()
        ));
    }
    serde_json::from_str::<serde::de::IgnoredAny>(text)
        .map(drop)
        .map_err(|e| {
            format!("{what} is not JSON ({e}); quote strings, e.g. '\"hello\"' or '{{\"to\":\"ada@example.com\"}}'")
        })
}

/// One JSON document as its text without the whitespace outside strings (`{"a": 1}` is kept
/// as `{"a":1}`, every number digit for digit), at most [`MAX_PAYLOAD_BYTES`]: a cached
/// value, a broadcast message.
pub(crate) fn json(text: &str) -> Result<Box<RawValue>, String> {
    check_json(text, "the value", MAX_PAYLOAD_BYTES)?;
    RawValue::from_string(compact(text)).map_err(|e| format!("the value is not JSON ({e})"))
}

/// `text` (valid JSON) without the whitespace outside its strings.
fn compact(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let (mut in_string, mut escaped) = (false, false);
    for c in text.chars() {
        if in_string {
            out.push(c);
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
        } else if !matches!(c, ' ' | '\t' | '\n' | '\r') {
            in_string = c == '"';
            out.push(c);
        }
    }
    out
}

// ---- durations --------------------------------------------------------------------------

/// `text` read as a duration, once `check` accepts it; otherwise `check`'s message.
fn checked_duration<T>(
    text: &str,
    check: impl FnOnce(Duration) -> baton::Result<T>,
) -> Result<Duration, String> {
    let duration = baton::time::parse_duration(text).map_err(|e| e.message().to_owned())?;
    check(duration)
        .map(|_| duration)
        .map_err(|e| e.message().to_owned())
}

/// A duration of at most `max`: the rule of every duration flag whose bound is the command
/// line's own rather than the library's.
pub(crate) fn at_most(text: &str, max: Duration) -> Result<Duration, String> {
    checked_duration(text, |d| {
        if d > max {
            Err(baton::Error::invalid_input(format!(
                "{text:?} is above the maximum of {}",
                human_duration(max)
            )))
        } else {
            Ok(())
        }
    })
}

/// A TTL by the library's rule (10ms to 30d): `--ttl`, `--cooldown`.
pub(crate) fn ttl(text: &str) -> Result<Duration, String> {
    checked_duration(text, Ttl::new)
}

/// A wait by the library's rule (0 to 1d): `--wait`.
pub(crate) fn wait(text: &str) -> Result<Duration, String> {
    checked_duration(text, WaitTime::new)
}

/// `--grace`: at most [`MAX_GRACE`].
pub(crate) fn grace(text: &str) -> Result<Duration, String> {
    at_most(text, MAX_GRACE)
}

/// `--drain`: at most [`MAX_DRAIN`].
pub(crate) fn drain(text: &str) -> Result<Duration, String> {
    at_most(text, MAX_DRAIN)
}

/// A work item's lease by the library's rule: `baton worker --lease`.
pub(crate) fn lease(text: &str) -> Result<Duration, String> {
    checked_duration(text, |lease| QueueOptions::new().lease(lease).validate())
}

/// A retry delay by the library's rule: `--backoff`, `--backoff-max`.
pub(crate) fn backoff(text: &str) -> Result<Duration, String> {
    checked_duration(text, |delay| Backoff::fixed(delay).validate())
}

/// An enqueue's delay by the library's rule: `--delay`.
pub(crate) fn delay(text: &str) -> Result<Duration, String> {
    checked_duration(text, |delay| EnqueueOptions::new().delay(delay).validate())
}

/// How long a de-duplication id is remembered, by the library's rule: `--dedup-window`.
pub(crate) fn dedup_window(text: &str) -> Result<Duration, String> {
    checked_duration(text, |window| {
        EnqueueOptions::dedup("x").dedup_window(window).validate()
    })
}

/// A rate limit's window by the library's rule: `--window`.
pub(crate) fn window(text: &str) -> Result<Duration, String> {
    checked_duration(text, |window| {
        Quota::new(1, window).map_err(|_| {
            baton::Error::invalid_input(format!(
                "window {} is out of range; use {} to {}",
                format_duration(window),
                format_duration(MIN_WINDOW),
                format_duration(MAX_WINDOW)
            ))
        })
    })
}

/// `baton status --refresh`: whole seconds from 1s to 1h (the page's `<meta>` refresh).
pub(crate) fn refresh(text: &str) -> Result<Duration, String> {
    let d = at_most(text, Duration::from_secs(3600))?;
    if d.subsec_nanos() != 0 || d < Duration::from_secs(1) {
        return Err(format!(
            "{text:?}: the refresh is whole seconds from 1s to 1h"
        ));
    }
    Ok(d)
}

// ---- numbers and addresses --------------------------------------------------------------

/// A whole number from `min` to `max`; `what` names it in the message.
pub(crate) fn number_in<N>(text: &str, min: N, max: N, what: &str) -> Result<N, String>
where
    N: std::str::FromStr + PartialOrd + std::fmt::Display + Copy,
{
    match text.parse::<N>() {
        Ok(n) if min <= n && n <= max => Ok(n),
        _ => Err(format!("{text:?}: {what} is a number from {min} to {max}")),
    }
}

/// `--permits`: a number, then the library's rule (1 to
/// [`MAX_PERMITS`](baton::semaphore::MAX_PERMITS)).
pub(crate) fn permits(text: &str) -> Result<u32, String> {
    let n = number_in(text, 0, u32::MAX, "the permits")?;
    baton::semaphore::check_permits(n)
        .map(|()| n)
        .map_err(|e| e.message().to_owned())
}

/// `--listen`: `IP:PORT` (`127.0.0.1:9464`, `[::1]:9464`, port 0 for any free one) or
/// `HOST:PORT` resolved now (`localhost:9464`).
pub(crate) fn listen(text: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(addr);
    }
    text.to_socket_addrs()
        .ok()
        .and_then(|mut addrs| addrs.next())
        .ok_or_else(|| {
            format!(
                "{text:?} is not an address to listen on; write IP:PORT, such as 127.0.0.1:9464"
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_is_checked_and_kept_as_text() {
        assert_eq!(json("42").unwrap().get(), "42");
        assert_eq!(json("\"hi\"").unwrap().get(), "\"hi\"");
        assert_eq!(
            json(" {\"a b\": [1, 12345678901234567890123],\n \"c\": \"\\\" x\"} ")
                .unwrap()
                .get(),
            "{\"a b\":[1,12345678901234567890123],\"c\":\"\\\" x\"}"
        );
        assert!(json("hi").unwrap_err().contains("quote strings"));
        let big = format!("\"{}\"", "x".repeat(MAX_PAYLOAD_BYTES));
        assert!(json(&big).unwrap_err().contains("limit"));
    }

    #[test]
    fn durations_keep_their_bounds() {
        assert!(ttl("5ms").is_err());
        assert!(ttl("1h").is_ok());
        assert!(wait("0s").is_ok());
        assert!(wait("2d").is_err());
        assert_eq!(grace("1h"), Ok(Duration::from_secs(3600)));
        assert!(grace("2h").unwrap_err().contains("maximum of 1h"));
        assert!(drain("13h").is_err());
        assert!(window("1s").is_ok());
        assert!(window("5ms").unwrap_err().contains("10ms to 30d"));
        assert!(window("31d").is_err());
        assert!(window("soon").is_err());
        assert_eq!(refresh("5s"), Ok(Duration::from_secs(5)));
        for bad in ["500ms", "1500ms", "2h", "soon"] {
            assert!(refresh(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn permits_follow_the_library() {
        assert_eq!(permits("4"), Ok(4));
        for bad in ["0", "10001", "-1", "four"] {
            assert!(permits(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn numbers_are_ranged() {
        assert_eq!(number_in("4", 1, 1024, "the concurrency"), Ok(4));
        assert!(number_in("0", 1, 1024, "the concurrency").is_err());
        assert!(
            number_in("x", 1u32, 10, "the batch")
                .unwrap_err()
                .contains("the batch")
        );
    }

    #[test]
    fn names_follow_the_library() {
        assert!(channel("").unwrap_err().contains("channel"));
        assert!(key("a\u{1}b").is_err());
        assert!(holder("").is_err());
        assert!(queue("").is_err());
        assert!(namespace("a:b").is_err());
        assert!(listen("nowhere").is_err());
        assert!(listen("9464").is_err());
        assert_eq!(
            listen("127.0.0.1:9464").unwrap(),
            "127.0.0.1:9464".parse::<SocketAddr>().unwrap()
        );
        assert_eq!(listen("[::1]:0").unwrap().port(), 0);
    }
}
