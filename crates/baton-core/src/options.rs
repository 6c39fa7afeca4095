//! Reading the options of a store URL's query (`?connect_timeout=1s&listen=off`): the
//! helpers every store crate parses its options with, so that a bad option reads the same
//! whichever store it was given to.
//!
//! Every error is `InvalidInput` and names the option, the value given and what is accepted
//! (the range, the words, the known options). A store prefixes it with the URL it came from
//! ([`in_url`]), redacted.
//!
//! # Examples
//! ```
//! use std::time::Duration;
//! use baton_core::options;
//!
//! let mut timeout = Duration::from_secs(2);
//! for (name, value) in options::query_pairs("timeout=250ms")? {
//!     match name {
//!         "timeout" => timeout = options::duration(name, value)?,
//!         _ => return Err(options::unknown("example://", name, &["timeout"])),
//!     }
//! }
//! options::check_range("timeout", timeout, Duration::from_millis(1), Duration::from_secs(300))?;
//! assert_eq!(timeout, Duration::from_millis(250));
//!
//! let e = options::check_range("timeout", Duration::ZERO, Duration::from_millis(1), Duration::from_secs(300))
//!     .unwrap_err();
//! assert_eq!(e.message(), "timeout 0ms is out of range; it must be between 1ms and 5m");
//! # Ok::<(), baton_core::Error>(())
//! ```

use std::fmt::Display;
use std::str::FromStr;
use std::time::Duration;

use crate::time::{format_duration, parse_duration};
use crate::{Error, Result};

/// A store's options as the query of its URL sets them, one `name=value` at a time, then
/// checked as a whole: what [`from_query`] needs of them.
pub trait QueryOptions: Sized + Default {
    /// The options with `name` set to `value`.
    ///
    /// # Errors
    /// `InvalidInput` for an unknown name or a bad value.
    fn set_option(self, name: &str, value: &str) -> Result<Self>;

    /// Checks the rules that span options (and each option's range).
    ///
    /// # Errors
    /// `InvalidInput` naming the rule.
    fn check(&self) -> Result<()>;
}

/// The options of a URL's `query`: the defaults, each pair set in order ([`query_pairs`]),
/// then checked. Every error's message goes through `bad`, which says which URL it was.
///
/// # Errors
/// What `bad` makes of the first error.
pub fn from_query<O: QueryOptions>(query: &str, bad: &impl Fn(String) -> Error) -> Result<O> {
    let mut options = O::default();
    for (name, value) in query_pairs(query).map_err(|e| bad(e.message().to_owned()))? {
        options = options
            .set_option(name, value)
            .map_err(|e| bad(e.message().to_owned()))?;
    }
    options.check().map_err(|e| bad(e.message().to_owned()))?;
    Ok(options)
}

/// The `name=value` pairs of a URL query, in order: split on `&` and on the first `=` of
/// each pair, not percent-decoded. Empty pairs (`a=1&&b=2`, a trailing `&`, an empty query)
/// are skipped.
///
/// # Errors
/// `InvalidInput` for a pair without `=` and for a name given twice.
pub fn query_pairs(query: &str) -> Result<Vec<(&str, &str)>> {
    let mut pairs = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let Some((name, value)) = pair.split_once('=') else {
            return Err(Error::invalid_input(format!(
                "option {pair:?} has no value; write name=value"
            )));
        };
        pairs.push((name, value));
    }
    unique(pairs, "option")
}

/// The pairs back, once every name is known to be given once; `noun` names them in the
/// error (`option`, `parameter`). For queries split elsewhere (percent-decoded, say).
///
/// # Errors
/// `InvalidInput` for the first name given twice: `option "name" is given twice`.
pub fn unique<N: AsRef<str>, V>(pairs: Vec<(N, V)>, noun: &str) -> Result<Vec<(N, V)>> {
    for (i, (name, _)) in pairs.iter().enumerate() {
        let name = name.as_ref();
        if pairs[..i].iter().any(|(seen, _)| seen.as_ref() == name) {
            return Err(Error::invalid_input(format!(
                "{noun} {name:?} is given twice"
            )));
        }
    }
    Ok(pairs)
}

/// A duration option: a number and a unit (`500ms`, `30s`, `5m`; see
/// [`crate::parse_duration`]).
///
/// # Errors
/// `InvalidInput` naming the option and the text: `name: duration "5" is not a number
/// followed by a unit ...`.
pub fn duration(name: &str, value: &str) -> Result<Duration> {
    parse_duration(value).map_err(|e| Error::invalid_input(format!("{name}: {}", e.message())))
}

/// A duration option that must lie in `min..=max`: [`duration`], then [`check_range`].
///
/// # Errors
/// As [`duration`] and [`check_range`].
pub fn duration_in(name: &str, value: &str, min: Duration, max: Duration) -> Result<Duration> {
    let parsed = duration(name, value)?;
    check_range(name, parsed, min, max)?;
    Ok(parsed)
}

/// Checks a duration option against its range, bounds included.
///
/// # Errors
/// `InvalidInput`: `name 0ms is out of range; it must be between 1ms and 5m`.
pub fn check_range(name: &str, value: Duration, min: Duration, max: Duration) -> Result<()> {
    if value < min || value > max {
        return Err(out_of_range(
            name,
            format_duration(value),
            format_duration(min),
            format_duration(max),
        ));
    }
    Ok(())
}

/// A whole-number option (`max_connections=10`).
///
/// # Errors
/// `InvalidInput`: `name="ten" is not a whole number`; also for a negative value or one
/// too large for `T`.
pub fn number<T: FromStr>(name: &str, value: &str) -> Result<T> {
    value
        .parse()
        .map_err(|_| Error::invalid_input(format!("{name}={value:?} is not a whole number")))
}

/// Checks a whole-number option against its range, bounds included.
///
/// # Errors
/// `InvalidInput`: `name 0 is out of range; it must be between 1 and 1000`.
pub fn check_count<T: PartialOrd + Display>(name: &str, value: T, min: T, max: T) -> Result<()> {
    if value < min || value > max {
        return Err(out_of_range(name, value, min, max));
    }
    Ok(())
}

/// An on/off option: `on`, `true`, `1`, `yes` or `off`, `false`, `0`, `no`, in any case.
///
/// # Errors
/// `InvalidInput`: `name="maybe" is neither on nor off`.
pub fn switch(name: &str, value: &str) -> Result<bool> {
    match value.to_ascii_lowercase().as_str() {
        "on" | "true" | "1" | "yes" => Ok(true),
        "off" | "false" | "0" | "no" => Ok(false),
        _ => Err(Error::invalid_input(format!(
            "{name}={value:?} is neither on nor off"
        ))),
    }
}

/// The error of an option the store does not know: `unknown redis:// option "timeout";
/// the options are connect_timeout, response_timeout and min_replicas`.
pub fn unknown(store: &str, name: &str, known: &[&str]) -> Error {
    Error::invalid_input(format!(
        "unknown {store} option {name:?}; the options are {}",
        list(known)
    ))
}

/// Names for a sentence: `a`, `a and b`, `a, b and c`.
pub fn list(names: &[&str]) -> String {
    match names {
        [] => String::new(),
        [one] => (*one).to_owned(),
        [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
    }
}

/// `error` as said about the store URL `shown` (already redacted, see
/// [`redact_url`](crate::redact_url)): `store URL "redis://h": <message>`, of the same kind.
pub fn in_url(shown: &str, error: Error) -> Error {
    Error::new(
        error.kind(),
        format!("store URL {shown:?}: {}", error.message()),
    )
}

fn out_of_range(name: &str, value: impl Display, min: impl Display, max: impl Display) -> Error {
    Error::invalid_input(format!(
        "{name} {value} is out of range; it must be between {min} and {max}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    const MS: Duration = Duration::from_millis(1);
    const FIVE_MIN: Duration = Duration::from_secs(300);

    fn message<T: std::fmt::Debug>(result: Result<T>) -> String {
        let e = result.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
        e.message().to_owned()
    }

    #[test]
    fn queries_split_into_pairs() {
        assert_eq!(
            query_pairs("a=1&b=&c=x=y").unwrap(),
            [("a", "1"), ("b", ""), ("c", "x=y")]
        );
        assert_eq!(query_pairs("").unwrap(), []);
        assert_eq!(query_pairs("a=1&&b=2&").unwrap(), [("a", "1"), ("b", "2")]);
        assert_eq!(
            message(query_pairs("a=1&flag")),
            "option \"flag\" has no value; write name=value"
        );
        assert_eq!(
            message(query_pairs("a=1&b=2&a=3")),
            "option \"a\" is given twice"
        );
    }

    #[test]
    fn repeats_are_named_with_the_callers_noun() {
        let pairs = vec![("sslmode".to_owned(), "1"), ("sslmode".to_owned(), "2")];
        assert_eq!(
            message(unique(pairs, "parameter")),
            "parameter \"sslmode\" is given twice"
        );
        assert_eq!(unique(vec![("a", 1), ("b", 2)], "option").unwrap().len(), 2);
    }

    #[test]
    fn durations_name_the_option_and_the_range() {
        assert_eq!(duration("t", "250ms").unwrap(), Duration::from_millis(250));
        let e = message(duration("response_timeout", "5"));
        assert!(e.starts_with("response_timeout: duration \"5\""), "{e}");
        assert_eq!(duration_in("t", "1ms", MS, FIVE_MIN).unwrap(), MS);
        assert_eq!(duration_in("t", "5m", MS, FIVE_MIN).unwrap(), FIVE_MIN);
        assert_eq!(
            message(duration_in("connect_timeout", "6m", MS, FIVE_MIN)),
            "connect_timeout 6m is out of range; it must be between 1ms and 5m"
        );
        assert_eq!(
            message(check_range("busy_timeout", Duration::ZERO, MS, FIVE_MIN)),
            "busy_timeout 0ms is out of range; it must be between 1ms and 5m"
        );
    }

    #[test]
    fn numbers_name_the_option_and_the_range() {
        assert_eq!(number::<u32>("n", "10").unwrap(), 10);
        assert_eq!(
            message(number::<u32>("max_connections", "-1")),
            "max_connections=\"-1\" is not a whole number"
        );
        assert!(number::<u32>("n", "4294967296").is_err());
        check_count("n", 1u32, 1, 1000).unwrap();
        check_count("n", 1000u32, 1, 1000).unwrap();
        assert_eq!(
            message(check_count("max_connections", 0u32, 1, 1000)),
            "max_connections 0 is out of range; it must be between 1 and 1000"
        );
    }

    #[test]
    fn switches_take_the_usual_words() {
        for on in ["on", "TRUE", "1", "Yes"] {
            assert!(switch("s", on).unwrap(), "{on}");
        }
        for off in ["off", "False", "0", "NO"] {
            assert!(!switch("s", off).unwrap(), "{off}");
        }
        assert_eq!(
            message(switch("durable_grants", "sometimes")),
            "durable_grants=\"sometimes\" is neither on nor off"
        );
    }

    #[test]
    fn unknown_options_list_the_known_ones() {
        assert_eq!(
            unknown(
                "sqlite://",
                "mode",
                &["busy_timeout", "synchronous", "poll_interval"]
            )
            .message(),
            "unknown sqlite:// option \"mode\"; the options are busy_timeout, synchronous and poll_interval"
        );
        assert_eq!(list(&[]), "");
        assert_eq!(list(&["a"]), "a");
        assert_eq!(list(&["a", "b"]), "a and b");
    }

    #[test]
    fn errors_in_a_url_keep_their_kind() {
        let e = in_url("redis://:***@h", Error::unsupported("no TLS"));
        assert_eq!(e.kind(), ErrorKind::Unsupported);
        assert_eq!(e.message(), "store URL \"redis://:***@h\": no TLS");
    }
}
