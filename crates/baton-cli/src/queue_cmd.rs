//! `baton queue enqueue|stats`: put work items into a queue and count them, from a shell
//! script. Workers (`baton worker`, or [`baton::work::Worker`] in a service) claim them.
//!
//! What each prints and how it exits (a duplicate exits 0, a Redis store 64 before any
//! connection) is in docs/cli.md ("Claimable work"), once. The payload is kept byte for byte
//! as given, after [`crate::args::check_json`] found it one JSON document within the limit.

use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

use baton::Baton;
use baton::work::{EnqueueOptions, MAX_PAYLOAD_BYTES, Queue, QueueStats, QueueStore, WorkStore};
use clap::{Args, Subcommand};
use serde::Serialize;

use crate::args;
use crate::cli::GlobalArgs;
use crate::exit::{Failure, SUCCESS};
use crate::output::{Cell, Kind, Row, human_duration, millis};
use crate::store;

/// `baton queue ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum QueueCommand {
    /// Add one item (a JSON document) to QUEUE: prints `Added QUEUE item=ID`, or
    /// `Duplicate QUEUE item=ID dedup=ID` when --dedup ID was enqueued within its window
    /// (nothing added; status 0 for both).
    Enqueue(EnqueueArgs),
    /// Count the items of QUEUE, or of every queue of the namespace: ready, scheduled
    /// (delayed or backing off), running, expired (lease lapsed), dead, and how long the
    /// oldest claimable item has waited.
    Stats(StatsArgs),
}

/// `baton queue enqueue`.
#[derive(Debug, Args)]
pub(crate) struct EnqueueArgs {
    /// The queue's name.
    #[arg(value_name = "QUEUE", value_parser = args::queue)]
    pub(crate) queue: String,

    /// The payload: one JSON document ('{"to":"ada@example.com"}', '"text"', 42), stored as
    /// given and handed to the worker's COMMAND on stdin; `-` reads it from stdin. At most
    /// 1 MiB.
    #[arg(value_name = "JSON", value_parser = parse_payload, allow_hyphen_values = true)]
    pub(crate) payload: Payload,

    /// A de-duplication id: another item with this id within the window is not added.
    #[arg(long = "dedup", value_name = "ID", value_parser = args::dedup_id)]
    pub(crate) dedup: Option<String>,

    /// How long --dedup ID is remembered (10ms to 30d) [default: the queue's, 24h].
    #[arg(long, value_name = "DUR", requires = "dedup", value_parser = args::dedup_window)]
    pub(crate) dedup_window: Option<Duration>,

    /// How long after now the item becomes claimable (at most 30d).
    #[arg(long, value_name = "DUR", default_value = "0s", value_parser = args::delay)]
    pub(crate) delay: Duration,

    /// The claims after which a failure dead-letters the item (1 to 1000) [default: 5].
    #[arg(long, value_name = "N", value_parser = parse_max_attempts)]
    pub(crate) max_attempts: Option<u32>,
}

/// A payload from the command line, or `-` for stdin.
#[derive(Debug, Clone)]
pub(crate) enum Payload {
    /// The JSON text given, already checked.
    Text(String),
    /// Read from stdin (checked after reading, still before the store is opened).
    Stdin,
}

/// `baton queue stats`.
#[derive(Debug, Args)]
pub(crate) struct StatsArgs {
    /// One queue (its counts are zeros when it has no items) [default: every queue of the
    /// namespace that has items].
    #[arg(value_name = "QUEUE", value_parser = args::queue)]
    pub(crate) queue: Option<String>,

    /// Without QUEUE: only queues whose name starts with this prefix.
    #[arg(long, value_name = "P", default_value = "", conflicts_with = "queue", value_parser = args::name_prefix)]
    pub(crate) prefix: String,
}

/// `baton queue enqueue --json`.
#[derive(Debug, Serialize)]
#[serde(tag = "result")]
enum Enqueued<'a> {
    Added {
        queue: &'a str,
        item: i64,
        #[serde(skip_serializing_if = "Option::is_none")]
        dedup: Option<&'a str>,
    },
    Duplicate {
        queue: &'a str,
        item: i64,
        dedup: &'a str,
    },
}

/// One queue's counts, as printed (and as the status page shows them).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct StatsRow {
    pub(crate) queue: String,
    pub(crate) ready: u64,
    pub(crate) scheduled: u64,
    pub(crate) running: u64,
    pub(crate) expired: u64,
    pub(crate) dead: u64,
    /// How long the oldest claimable item has waited; `null` when none is claimable.
    pub(crate) oldest_due_ms: Option<u64>,
}

impl StatsRow {
    /// The row of one queue's counts.
    pub(crate) fn of(stats: QueueStats) -> Self {
        StatsRow {
            queue: stats.queue().to_owned(),
            ready: stats.ready,
            scheduled: stats.scheduled,
            running: stats.running,
            expired: stats.expired,
            dead: stats.dead,
            oldest_due_ms: stats.oldest_due.map(millis),
        }
    }

    /// The oldest due, rounded for reading; `-` when nothing is claimable.
    pub(crate) fn oldest_due(&self) -> String {
        self.oldest_due_ms.map_or_else(
            || "-".to_owned(),
            |ms| human_duration(Duration::from_millis(ms)),
        )
    }
}

impl Row for StatsRow {
    const HEADER: &'static [&'static str] = &[
        "QUEUE",
        "READY",
        "SCHEDULED",
        "RUNNING",
        "EXPIRED",
        "DEAD",
        "OLDEST_DUE",
    ];

    fn cells(&self) -> Vec<Cell> {
        let number = |n: u64| Cell::new(Kind::Number, n.to_string());
        vec![
            Cell::new(Kind::Key, self.queue.clone()),
            number(self.ready),
            number(self.scheduled),
            number(self.running),
            number(self.expired),
            number(self.dead),
            Cell::new(Kind::Number, self.oldest_due()),
        ]
    }
}

/// Runs `baton queue ...`; returns baton's exit status.
pub(crate) async fn run(global: &GlobalArgs, command: &QueueCommand) -> Result<u8, Failure> {
    match command {
        QueueCommand::Enqueue(args) => enqueue(global, args).await,
        QueueCommand::Stats(args) => stats(global, args).await,
    }
}

async fn enqueue(global: &GlobalArgs, args: &EnqueueArgs) -> Result<u8, Failure> {
    let payload = match &args.payload {
        Payload::Text(text) => text.clone(),
        Payload::Stdin => read_stdin_payload()?,
    };
    let mut options = EnqueueOptions::new().delay(args.delay);
    if let Some(id) = &args.dedup {
        options = options.dedup_id(id.clone());
    }
    if let Some(window) = args.dedup_window {
        options = options.dedup_window(window);
    }
    if let Some(n) = args.max_attempts {
        options = options.max_attempts(n);
    }
    options.validate()?;

    let (baton, _) = connect_work(global).await?;
    let queue = baton.queue(&args.queue)?;
    let answer = queue.enqueue(payload.as_bytes(), options).await?;
    let name = args.queue.as_str();
    let item = answer.id().0;
    let output = global.output();
    match (answer.is_added(), args.dedup.as_deref()) {
        (true, dedup) => output.line(
            &Enqueued::Added {
                queue: name,
                item,
                dedup,
            },
            || format!("Added {name} item={item}"),
        )?,
        (false, dedup) => {
            let dedup = dedup.unwrap_or_default();
            output.line(
                &Enqueued::Duplicate {
                    queue: name,
                    item,
                    dedup,
                },
                || format!("Duplicate {name} item={item} dedup={dedup}"),
            )?;
        }
    }
    Ok(SUCCESS)
}

async fn stats(global: &GlobalArgs, args: &StatsArgs) -> Result<u8, Failure> {
    let (baton, store) = connect_work(global).await?;
    match &args.queue {
        Some(name) => {
            let row = StatsRow::of(baton.queue(name)?.stats().await?);
            global.output().row(&row)?;
        }
        None => {
            let rows = list_queues(&baton, &store, &args.prefix).await?;
            global.output().rows(&rows)?;
        }
    }
    Ok(SUCCESS)
}

/// The counts of every queue of `baton`'s namespace whose name starts with `prefix`, ordered
/// by name (queues without items are not listed).
///
/// # Errors
/// `InvalidInput` for a bad prefix; `Unavailable` when the store faulted.
pub(crate) async fn list_queues(
    baton: &Baton,
    store: &Arc<dyn WorkStore>,
    prefix: &str,
) -> baton::Result<Vec<StatsRow>> {
    let queues: &dyn QueueStore = &**store;
    Ok(Queue::list(queues, baton.namespace(), prefix)
        .await?
        .into_iter()
        .map(StatsRow::of)
        .collect())
}

/// Opens the store for a claimable-work command and hands back its work atoms.
///
/// A Redis URL is refused before any connection is made: Redis keeps no claimable work, and
/// a typo'd or unreachable Redis host should not turn a usage error into "unavailable".
///
/// # Errors
/// Status 64 for a Redis store (or another store without claimable work) and for the
/// errors of [`store::connect`]; 69 when the store cannot be opened.
pub(crate) async fn connect_work(
    global: &GlobalArgs,
) -> Result<(Baton, Arc<dyn WorkStore>), Failure> {
    if let Some(url) = &global.store {
        check_work_url(url)?;
    }
    let baton = store::connect(global).await?;
    let work = baton.work_store()?;
    Ok((baton, work))
}

/// Whether the store a URL names keeps claimable work, judged by its scheme alone (Redis
/// does not; unknown schemes are left for `connect` to refuse).
pub(crate) fn url_keeps_work(url: &str) -> bool {
    let scheme = url.split_once("://").map_or("", |(scheme, _)| scheme);
    !matches!(scheme, "redis" | "rediss")
}

/// Refuses store URLs whose store keeps no claimable work, without connecting.
fn check_work_url(url: &str) -> Result<(), Failure> {
    if !url_keeps_work(url) {
        let scheme = url.split_once("://").map_or("", |(scheme, _)| scheme);
        return Err(Failure::usage(format!(
            "the {scheme} store keeps no claimable work (queues, workers and schedules need rows that one statement claims; a Redis restart without persistence would lose queued items silently); use --store sqlite://... or postgres://..."
        )));
    }
    Ok(())
}

fn parse_payload(text: &str) -> Result<Payload, String> {
    if text == "-" {
        return Ok(Payload::Stdin);
    }
    check_payload(text).map(|()| Payload::Text(text.to_owned()))
}

/// Checks that `text` is one JSON document within the size limit.
fn check_payload(text: &str) -> Result<(), String> {
    args::check_json(text, "the payload", MAX_PAYLOAD_BYTES)
}

/// Reads the payload from stdin (at most one byte over the limit, to report it).
fn read_stdin_payload() -> Result<String, Failure> {
    let mut bytes = Vec::new();
    std::io::stdin()
        .lock()
        .take(MAX_PAYLOAD_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Failure::usage(format!("cannot read the payload from stdin: {e}")))?;
    let text = String::from_utf8(bytes)
        .map_err(|_| Failure::usage("the payload on stdin is not UTF-8, so it is not JSON"))?;
    check_payload(&text).map_err(Failure::usage)?;
    Ok(text)
}

/// `--max-attempts`: a number, then the library's rule.
fn parse_max_attempts(text: &str) -> Result<u32, String> {
    let n: u32 = args::number_in(text, 0, u32::MAX, "max_attempts")?;
    EnqueueOptions::new()
        .max_attempts(n)
        .validate()
        .map(|()| n)
        .map_err(|e| e.message().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_must_be_one_json_document() {
        assert!(matches!(parse_payload("42"), Ok(Payload::Text(t)) if t == "42"));
        assert!(matches!(parse_payload("-"), Ok(Payload::Stdin)));
        assert!(parse_payload(r#"{"to":"ada"}"#).is_ok());
        for bad in ["", "hello", "{", "1 2", r#"{"a":1}}"#] {
            let error = parse_payload(bad).unwrap_err();
            assert!(error.contains("not JSON"), "{bad:?}: {error}");
        }
        let big = format!("\"{}\"", "x".repeat(MAX_PAYLOAD_BYTES));
        assert!(
            parse_payload(&big)
                .unwrap_err()
                .contains("the limit is 1048576 bytes")
        );
    }

    #[test]
    fn names_and_options_follow_the_library() {
        assert!(args::queue("emails").is_ok());
        assert!(args::queue("").is_err());
        assert!(args::queue(&"q".repeat(201)).is_err());
        assert!(args::queue("a\tb").is_err());
        assert!(args::dedup_id("").is_err());
        assert!(args::dedup_id(&"d".repeat(257)).is_err());
        assert!(args::delay("31d").is_err());
        assert!(args::delay("30d").is_ok());
        assert!(args::dedup_window("0s").is_err());
        assert!(parse_max_attempts("0").is_err());
        assert!(parse_max_attempts("1001").is_err());
        assert_eq!(parse_max_attempts("3"), Ok(3));
    }

    #[test]
    fn redis_is_refused_without_connecting() {
        for url in ["redis://127.0.0.1:1", "rediss://cache.invalid:6380/0"] {
            let failure = check_work_url(url).unwrap_err();
            assert_eq!(failure.status, crate::exit::USAGE);
            assert!(failure.message.contains("no claimable work"), "{failure}");
        }
        assert!(check_work_url("sqlite:///tmp/x.db").is_ok());
        assert!(check_work_url("memory://").is_ok());
    }
}
