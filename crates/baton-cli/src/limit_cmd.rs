//! `baton limit KEY --max N --window DUR [--cost N] [--wait DUR]`: take units of a rate
//! limit shared by every process on the store, from a shell script.
//!
//! ```sh
//! baton limit "api:$TENANT" --max 60 --window 1s && curl ...
//! ```
//!
//! | answer | status | printed |
//! |---|---|---|
//! | `Admitted` | 0 | the units left in the window |
//! | `Denied` | 75 | the retry-after: how long until the cost fits (`retry_after_ms` in JSON, rounded up) |
//! | never | 64 | on stderr: the cost is above `--max` and can never be admitted |
//! | invalid argument | 64 | on stderr, before the store is opened |
//! | store unavailable | 69 | on stderr; nothing was admitted (the limiter fails closed) |
//!
//! `--wait DUR` waits up to DUR for the cost to fit (one attempt by default), and answers
//! `Denied` at once when the store says it cannot fit in time.

use std::time::Duration;

use baton::limit::{LimitError, Quota};
use clap::Args;
use serde::Serialize;

use crate::args;
use crate::cli::GlobalArgs;
use crate::exit::{CONTENDED, Failure, SUCCESS, USAGE};
use crate::output::human_duration;
use crate::store;

/// `baton limit`.
#[derive(Debug, Args)]
pub(crate) struct LimitArgs {
    /// The rate limit's key (one budget per key).
    #[arg(value_name = "KEY", value_parser = args::key)]
    pub(crate) key: String,

    /// Most units admitted in any window.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) max: u32,

    /// The window's length: 1s, 1m, 1d... (10ms to 30d).
    #[arg(long, value_name = "DUR", value_parser = args::window)]
    pub(crate) window: Duration,

    /// Units this call takes.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) cost: u32,

    /// How long to wait for the cost to fit; 0s is one attempt.
    #[arg(long, value_name = "DUR", default_value = "0s", value_parser = args::wait)]
    pub(crate) wait: Duration,
}

/// The answer, as printed.
#[derive(Debug, Serialize)]
#[serde(tag = "result")]
enum Answer {
    Admitted {
        key: String,
        cost: u32,
        remaining: u32,
    },
    Denied {
        key: String,
        cost: u32,
        remaining: u32,
        retry_after_ms: u64,
    },
}

impl Answer {
    fn status(&self) -> u8 {
        match self {
            Answer::Admitted { .. } => SUCCESS,
            Answer::Denied { .. } => CONTENDED,
        }
    }

    fn line(&self) -> String {
        match self {
            Answer::Admitted {
                key,
                cost,
                remaining,
            } => format!("Admitted {key} cost={cost} remaining={remaining}"),
            Answer::Denied {
                key,
                cost,
                remaining,
                retry_after_ms,
            } => format!(
                "Denied {key} cost={cost} remaining={remaining} retry_after={}",
                human_duration(Duration::from_millis(*retry_after_ms))
            ),
        }
    }
}

/// Whole milliseconds, rounded up: a script that sleeps this long finds the cost fits.
fn ceil_millis(d: Duration) -> u64 {
    u64::try_from(d.as_micros().div_ceil(1000)).unwrap_or(u64::MAX)
}

/// Runs `baton limit`; returns baton's exit status.
pub(crate) async fn run(global: &GlobalArgs, args: &LimitArgs) -> Result<u8, Failure> {
    // "Never" is an argument error: refuse it before opening the store.
    if args.cost > args.max {
        return Err(Failure::usage(format!(
            "--cost {} can never be admitted: the limit allows at most --max {} per window",
            args.cost, args.max
        )));
    }
    let quota = Quota::new(args.max, args.window)?;
    let baton = store::connect(global).await?;
    let limiter = baton.rate_limiter(quota)?;
    let answered = limiter.acquire(&args.key, args.cost, args.wait).await;
    let answer = match answered {
        Ok(decision) => Answer::Admitted {
            key: args.key.clone(),
            cost: args.cost,
            remaining: decision.remaining,
        },
        Err(LimitError::Denied {
            retry_after,
            remaining,
        }) => Answer::Denied {
            key: args.key.clone(),
            cost: args.cost,
            remaining,
            retry_after_ms: ceil_millis(retry_after),
        },
        Err(e @ LimitError::InsufficientCapacity { .. }) => {
            return Err(Failure::new(USAGE, e.to_string()));
        }
        Err(e) => return Err(baton::Error::from(e).into()),
    };
    global.output().line(&answer, || answer.line())?;
    Ok(answer.status())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_and_statuses() {
        let denied = Answer::Denied {
            key: "k".into(),
            cost: 2,
            remaining: 1,
            retry_after_ms: 1500,
        };
        assert_eq!(denied.status(), CONTENDED);
        assert_eq!(
            denied.line(),
            "Denied k cost=2 remaining=1 retry_after=1.5s"
        );
        let json = serde_json::to_value(&denied).unwrap();
        assert_eq!(json["result"], "Denied");
        assert_eq!(json["retry_after_ms"], 1500);
        let admitted = Answer::Admitted {
            key: "k".into(),
            cost: 1,
            remaining: 4,
        };
        assert_eq!(admitted.status(), SUCCESS);
        assert_eq!(admitted.line(), "Admitted k cost=1 remaining=4");
        assert_eq!(ceil_millis(Duration::from_micros(1001)), 2);
    }
}
