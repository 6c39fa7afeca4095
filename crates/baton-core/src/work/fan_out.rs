//! [`Queue::fan_out`]: turn a scan's records into one queue item each, de-duplicated by the
//! record's id — the cron-tickle + fan-out pattern.
//!
//! A schedule runs the scan on one replica per tick ([`Scheduler`](super::Scheduler)); the
//! scan hands the eligible records to `fan_out`, which enqueues them in chunks without
//! holding any lock; [`Worker`](super::Worker)s on every replica process the items. Because
//! every item's de-duplication id is its record's id, a record found again by the next scan
//! (or by a scan that ran twice) within the queue's window is not enqueued again — even
//! after it was processed, so a scan that still finds a processed record does not redo it
//! within the window.
//!
//! ## Behavior
//! - All records are validated before the first chunk is written.
//! - Chunks of [`FAN_OUT_CHUNK`] records are written by
//!   [`enqueue_many`](super::Queue::enqueue_many), each in one transaction.
//! - A store fault stops the fan-out and emits
//!   [`baton.fanout.enqueue_failed`](crate::telemetry::events::FANOUT_ENQUEUE_FAILED); the
//!   chunks written before it stay, and running the scan again enqueues the rest (the
//!   written ones come back as duplicates).

use crate::error::{Error, Result};
use crate::telemetry::{self, events};

use super::options::{EnqueueOptions, check_payload};
use super::queue::Queue;

/// How many records one transaction of a fan-out writes.
pub const FAN_OUT_CHUNK: usize = 500;

/// What a [`Queue::fan_out`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FanOut {
    /// Records enqueued as new items.
    pub added: u64,
    /// Records whose id was enqueued within the window already: not enqueued again.
    pub duplicates: u64,
}

impl Queue {
    /// Enqueues one item per `(record id, payload)`, with the record id as the
    /// de-duplication id (so within the queue's de-duplication window a record is enqueued
    /// once, however many scans find it), and reports how many were added.
    ///
    /// # Errors
    /// `InvalidInput` before any I/O for a record id that is not a valid de-duplication id
    /// or a payload over the limit; `Unavailable` when the store faulted (the message says
    /// how many records were enqueued before).
    ///
    /// # Examples
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), baton_core::Error> {
    /// use std::sync::Arc;
    /// use baton_core::MemoryStore;
    /// use baton_core::work::{Queue};
    ///
    /// let queue = Queue::new(Arc::new(MemoryStore::new()), "invoice-retries")?;
    /// let pending = vec![("invoice-7", b"7".to_vec()), ("invoice-9", b"9".to_vec())];
    /// let first = queue.fan_out(pending.clone()).await?;
    /// let again = queue.fan_out(pending).await?;
    /// assert_eq!((first.added, again.duplicates), (2, 2));
    /// # Ok(()) }
    /// ```
    pub async fn fan_out<I, K, P>(&self, records: I) -> Result<FanOut>
    where
        I: IntoIterator<Item = (K, P)>,
        K: Into<String>,
        P: AsRef<[u8]>,
    {
        let records: Vec<(P, EnqueueOptions)> = records
            .into_iter()
            .map(|(id, payload)| (payload, EnqueueOptions::dedup(id)))
            .collect();
        for (payload, options) in &records {
            check_payload(payload.as_ref())?;
            options.validate()?;
        }
        let mut report = FanOut::default();
        for chunk in records.chunks(FAN_OUT_CHUNK) {
            let answers = match self.enqueue_many(chunk).await {
                Ok(answers) => answers,
                Err(error) => {
                    telemetry::emit(
                        &events::FANOUT_ENQUEUE_FAILED,
                        Some(self.key().as_str()),
                        format_args!(
                            "fan-out stopped after {} of {} records ({} added, {} duplicates): {error}",
                            report.added + report.duplicates,
                            records.len(),
                            report.added,
                            report.duplicates
                        ),
                    );
                    return Err(Error::new(
                        error.kind(),
                        format!(
                            "fan-out stopped after {} of {} records: {}",
                            report.added + report.duplicates,
                            records.len(),
                            error.message()
                        ),
                    )
                    .with_source(error));
                }
            };
            for answer in answers {
                if answer.is_added() {
                    report.added += 1;
                } else {
                    report.duplicates += 1;
                }
            }
        }
        Ok(report)
    }
}
