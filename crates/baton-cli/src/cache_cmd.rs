//! `baton cache get|set|delete KEY [VALUE] [--ttl DUR]`: the cache the library uses, from a
//! shell script. Values are JSON, exactly as `Cache::set` stores them.
//!
//! | command | prints | status |
//! |---|---|---|
//! | `get KEY` | the value, as one line of JSON | 0 hit, [`MISS`] (1) miss |
//! | `set KEY VALUE [--ttl DUR]` | `Set KEY ttl=DUR` | 0 |
//! | `delete KEY` | `Deleted KEY`, or `Absent KEY` when nothing live was there | 0 |
//!
//! A VALUE that is not JSON, like every invalid argument, exits 64 before the store is
//! opened; write strings quoted: `baton cache set greeting '"hello"'`. Values are kept as
//! JSON text, not as parsed numbers: `12345678901234567890123` and `0.1000000000000000055`
//! come back digit for digit (whitespace outside strings is dropped). A store fault exits
//! 69 (for `get`, a caller may treat it as a miss).

use std::time::Duration;

use clap::{Args, Subcommand};
use serde::Serialize;
use serde_json::value::RawValue;

use crate::cli::{GlobalArgs, parse_key, parse_ttl};
use crate::exit::{Failure, SUCCESS};
use crate::output::{human_duration, print_json, print_line, write_failure};
use crate::store;

/// `baton cache get` found nothing live under the key (as `grep` finding nothing).
pub(crate) use crate::exit::MISS;

/// Default `--ttl` of `baton cache set`.
const DEFAULT_TTL: &str = "1h";

/// `baton cache ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum CacheCommand {
    /// Print the value of KEY as JSON; exit 1 when nothing is cached.
    Get(KeyArg),
    /// Cache VALUE (JSON) under KEY for --ttl.
    Set(SetArgs),
    /// Remove KEY's value.
    Delete(KeyArg),
}

/// A cache key.
#[derive(Debug, Args)]
pub(crate) struct KeyArg {
    /// The cache key.
    #[arg(value_name = "KEY", value_parser = parse_key)]
    pub(crate) key: String,
}

/// `baton cache set`.
#[derive(Debug, Args)]
pub(crate) struct SetArgs {
    /// The cache key.
    #[arg(value_name = "KEY", value_parser = parse_key)]
    pub(crate) key: String,
    /// The value, as JSON: 42, true, '"text"', '{"name":"Ada"}'.
    #[arg(value_name = "VALUE", value_parser = parse_json)]
    pub(crate) value: Box<RawValue>,
    /// How long the value is kept.
    #[arg(long, value_name = "DUR", default_value = DEFAULT_TTL, value_parser = parse_ttl)]
    pub(crate) ttl: Duration,
}

/// `baton cache get --json`.
#[derive(Debug, Serialize)]
struct Got<'a> {
    key: &'a str,
    hit: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    value: Option<&'a RawValue>,
}

/// `baton cache set|delete --json`.
#[derive(Debug, Serialize)]
#[serde(tag = "result")]
enum Changed<'a> {
    Set { key: &'a str, ttl_ms: u64 },
    Deleted { key: &'a str },
    Absent { key: &'a str },
}

/// Runs `baton cache ...`; returns baton's exit status.
pub(crate) async fn run(global: &GlobalArgs, command: &CacheCommand) -> Result<u8, Failure> {
    let baton = store::connect(global).await?;
    let cache = baton.cache()?;
    let (printed, status) = match command {
        CacheCommand::Get(KeyArg { key }) => {
            // As text: a number beyond 64 bits would be rounded through `Value`.
            let value = cache.get::<Box<RawValue>>(key).await?;
            let printed = if global.json {
                print_json(&Got {
                    key,
                    hit: value.is_some(),
                    value: value.as_deref(),
                })
            } else {
                match &value {
                    Some(value) => print_line(value.get()),
                    None => Ok(()),
                }
            };
            (printed, if value.is_some() { SUCCESS } else { MISS })
        }
        CacheCommand::Set(SetArgs { key, value, ttl }) => {
            cache.set(key, value, *ttl).await?;
            let printed = if global.json {
                print_json(&Changed::Set {
                    key,
                    ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
                })
            } else {
                print_line(&format!("Set {key} ttl={}", human_duration(*ttl)))
            };
            (printed, SUCCESS)
        }
        CacheCommand::Delete(KeyArg { key }) => {
            let answer = if cache.delete(key).await? {
                Changed::Deleted { key }
            } else {
                Changed::Absent { key }
            };
            let printed = if global.json {
                print_json(&answer)
            } else {
                print_line(&match answer {
                    Changed::Deleted { key } => format!("Deleted {key}"),
                    _ => format!("Absent {key}"),
                })
            };
            (printed, SUCCESS)
        }
    };
    printed.map_err(write_failure)?;
    Ok(status)
}

/// Checks that `text` is one JSON value and keeps its text, without the whitespace outside
/// strings (so `{"a": 1}` is stored as `{"a":1}`, and every number digit for digit).
fn parse_json(text: &str) -> Result<Box<RawValue>, String> {
    let not_json =
        |e: serde_json::Error| format!("VALUE is not JSON ({e}); quote strings, e.g. '\"hello\"'");
    serde_json::from_str::<Box<RawValue>>(text).map_err(not_json)?;
    RawValue::from_string(compact(text)).map_err(not_json)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_must_be_json() {
        assert_eq!(parse_json("42").unwrap().get(), "42");
        assert_eq!(parse_json("\"hi\"").unwrap().get(), "\"hi\"");
        assert_eq!(
            parse_json(" {\"a b\": [1, 12345678901234567890123],\n \"c\": \"\\\" x\"} ")
                .unwrap()
                .get(),
            "{\"a b\":[1,12345678901234567890123],\"c\":\"\\\" x\"}"
        );
        assert!(parse_json("hi").unwrap_err().contains("quote strings"));
        assert!(parse_ttl("5ms").is_err());
        assert!(parse_ttl("1h").is_ok());
    }
}
