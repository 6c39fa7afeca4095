//! `baton publish CHANNEL JSON` and `baton subscribe CHANNEL`: broadcast from a shell.
//!
//! `publish` sends one JSON message to every subscriber of CHANNEL and prints its sequence
//! number. `subscribe` prints one JSON line per event until it is stopped (SIGINT,
//! SIGTERM: status 0) or has printed `--count` messages:
//!
//! ```text
//! {"event":"message","publisher":"1f0c...","seq":7,"payload":{"org":42}}
//! {"event":"missed","publisher":"1f0c...","count":2}
//! {"event":"lagged","dropped":10}
//! {"event":"gap","gap_ms":1830,"since_ms":1764512345678}
//! {"event":"resubscribed"}
//! ```
//!
//! Once subscribed it says so on stderr (`baton: subscribed to CHANNEL`): messages published
//! after that line reach it. Delivery is at most once (see `docs/broadcast.md`). A store
//! that cannot broadcast (SQLite) exits 64 naming the stores that can; a store fault 69.

use std::time::UNIX_EPOCH;

use baton::broadcast::Event;
use clap::Args;
use serde::Serialize;
use serde_json::Value;

use crate::args;
use crate::cli::GlobalArgs;
use crate::exit::{Failure, INTERNAL, SUCCESS, UNAVAILABLE};
use crate::output::{print_json, write_failure};
use crate::store;

/// `baton publish`.
#[derive(Debug, Args)]
pub(crate) struct PublishArgs {
    /// The channel.
    #[arg(value_name = "CHANNEL", value_parser = args::channel)]
    pub(crate) channel: String,
    /// The message, as JSON: '{"org":42}', '"text"', 7.
    #[arg(value_name = "JSON", value_parser = args::json)]
    pub(crate) message: Box<serde_json::value::RawValue>,
}

/// `baton subscribe`.
#[derive(Debug, Args)]
pub(crate) struct SubscribeArgs {
    /// The channel.
    #[arg(value_name = "CHANNEL", value_parser = args::channel)]
    pub(crate) channel: String,
    /// Exit 0 after this many messages (other events do not count).
    #[arg(long, value_name = "N")]
    pub(crate) count: Option<u64>,
}

/// `baton publish --json`.
#[derive(Debug, Serialize)]
struct Published<'a> {
    channel: &'a str,
    publisher: String,
    seq: u64,
}

/// One line of `baton subscribe`.
#[derive(Debug, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
enum Line {
    Message {
        publisher: String,
        seq: u64,
        payload: Value,
    },
    Missed {
        publisher: String,
        count: u64,
    },
    Lagged {
        dropped: u64,
    },
    Gap {
        gap_ms: u64,
        since_ms: u64,
    },
    Resubscribed,
}

impl Line {
    fn from_event(event: Event<Value>) -> Option<Line> {
        Some(match event {
            Event::Message(m) => Line::Message {
                publisher: m.publisher.to_string(),
                seq: m.seq,
                payload: m.payload,
            },
            Event::Missed { publisher, count } => Line::Missed {
                publisher: publisher.to_string(),
                count,
            },
            Event::Lagged { dropped } => Line::Lagged { dropped },
            Event::Gap { since, gap_ms } => Line::Gap {
                gap_ms,
                since_ms: since
                    .duration_since(UNIX_EPOCH)
                    .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
                    .unwrap_or(0),
            },
            Event::Resubscribed => Line::Resubscribed,
            // Events added in later versions are not printed by this one.
            _ => return None,
        })
    }
}

/// Runs `baton publish`; returns baton's exit status.
pub(crate) async fn publish(global: &GlobalArgs, args: &PublishArgs) -> Result<u8, Failure> {
    let baton = store::connect(global).await?;
    let broadcast = baton.broadcast()?;
    let seq = broadcast.publish(&args.channel, &args.message).await?;
    let publisher = broadcast.publisher().to_string();
    let line = format!("Published {} seq={seq} publisher={publisher}", args.channel);
    let published = Published {
        channel: &args.channel,
        publisher,
        seq,
    };
    global.output().line(&published, || line)?;
    Ok(SUCCESS)
}

/// Runs `baton subscribe`; returns baton's exit status.
pub(crate) async fn subscribe(global: &GlobalArgs, args: &SubscribeArgs) -> Result<u8, Failure> {
    use tokio::signal::unix::{SignalKind, signal};
    let installed = signal(SignalKind::interrupt()).and_then(|interrupt| {
        signal(SignalKind::terminate()).map(|terminate| (interrupt, terminate))
    });
    let (mut interrupt, mut terminate) = installed
        .map_err(|e| Failure::new(INTERNAL, format!("cannot install signal handlers: {e}")))?;
    let baton = store::connect(global).await?;
    let broadcast = baton.broadcast()?;
    let mut subscription = broadcast.subscribe::<Value>(&args.channel).await?;
    say!("baton: subscribed to {}", args.channel);
    let mut messages = 0u64;
    if args.count == Some(0) {
        return Ok(SUCCESS);
    }
    loop {
        let event = tokio::select! {
            event = subscription.next() => event,
            _ = interrupt.recv() => return Ok(SUCCESS),
            _ = terminate.recv() => return Ok(SUCCESS),
        };
        let Some(event) = event else {
            return Err(Failure::new(
                UNAVAILABLE,
                format!(
                    "the subscription to {} ended: the store closed",
                    args.channel
                ),
            ));
        };
        let is_message = matches!(event, Event::Message(_));
        if let Some(line) = Line::from_event(event) {
            print_json(&line).map_err(write_failure)?;
        }
        if is_message {
            messages += 1;
            if args.count.is_some_and(|count| messages >= count) {
                return Ok(SUCCESS);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_tagged_by_event() {
        let line = Line::Missed {
            publisher: "00000000000000ab".into(),
            count: 2,
        };
        assert_eq!(
            serde_json::to_string(&line).unwrap(),
            r#"{"event":"missed","publisher":"00000000000000ab","count":2}"#
        );
        assert_eq!(
            serde_json::to_string(&Line::Resubscribed).unwrap(),
            r#"{"event":"resubscribed"}"#
        );
    }
}
