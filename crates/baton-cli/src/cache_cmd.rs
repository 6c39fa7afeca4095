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

use crate::args;
use crate::cli::GlobalArgs;
use crate::exit::{Failure, SUCCESS};
use crate::output::{human_duration, millis};
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
    #[arg(value_name = "KEY", value_parser = args::key)]
    pub(crate) key: String,
}

/// `baton cache set`.
#[derive(Debug, Args)]
pub(crate) struct SetArgs {
    /// The cache key.
    #[arg(value_name = "KEY", value_parser = args::key)]
    pub(crate) key: String,
    /// The value, as JSON: 42, true, '"text"', '{"name":"Ada"}'.
    #[arg(value_name = "VALUE", value_parser = args::json)]
    pub(crate) value: Box<RawValue>,
    /// How long the value is kept.
    #[arg(long, value_name = "DUR", default_value = DEFAULT_TTL, value_parser = args::ttl)]
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
    let output = global.output();
    match command {
        CacheCommand::Get(KeyArg { key }) => {
            // As text: a number beyond 64 bits would be rounded through `Value`.
            let value = cache.get::<Box<RawValue>>(key).await?;
            let got = Got {
                key,
                hit: value.is_some(),
                value: value.as_deref(),
            };
            // A miss prints nothing for people: the status says it.
            output.text(&got, || {
                value
                    .as_ref()
                    .map_or_else(String::new, |value| format!("{}\n", value.get()))
            })?;
            Ok(if value.is_some() { SUCCESS } else { MISS })
        }
        CacheCommand::Set(SetArgs { key, value, ttl }) => {
            cache.set(key, value, *ttl).await?;
            let answer = Changed::Set {
                key,
                ttl_ms: millis(*ttl),
            };
            output.line(&answer, || {
                format!("Set {key} ttl={}", human_duration(*ttl))
            })?;
            Ok(SUCCESS)
        }
        CacheCommand::Delete(KeyArg { key }) => {
            let answer = if cache.delete(key).await? {
                Changed::Deleted { key }
            } else {
                Changed::Absent { key }
            };
            output.line(&answer, || match answer {
                Changed::Deleted { key } => format!("Deleted {key}"),
                _ => format!("Absent {key}"),
            })?;
            Ok(SUCCESS)
        }
    }
}
