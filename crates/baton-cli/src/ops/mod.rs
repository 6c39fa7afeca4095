//! The operator commands: `baton doctor`, `baton alerts`, `baton serve-metrics` and
//! `baton status`. The guide is `docs/operations.md`.
//!
//! - [`doctor`]: checks the store's deployment and prints one line per check;
//! - [`alerts`]: Prometheus alerting rules generated from the event registry;
//! - [`metrics_cmd`]: a Prometheus endpoint, rendered by `metrics-exporter-prometheus`;
//! - [`status`]: a read-only web page (and JSON) of held locks, leases and recent events;
//! - [`http`]: the read-only HTTP server (axum on hyper) the last two share.

pub(crate) mod alerts;
pub(crate) mod doctor;
pub(crate) mod http;
pub(crate) mod metrics_cmd;
pub(crate) mod status;

use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use baton::{Baton, ErrorKind};
use tokio::sync::Mutex;

use crate::cli::GlobalArgs;
use crate::exit::{Failure, INTERNAL, SUCCESS, UNAVAILABLE};

/// The store of a long-running command (`status`, `serve-metrics`): opened at start if it
/// can be, else at the next request that needs it, so the server starts, and says so, while
/// the store is down.
#[derive(Debug)]
pub(crate) struct LazyStore {
    url: String,
    namespace: baton::Namespace,
    baton: Mutex<Option<Baton>>,
}

impl LazyStore {
    /// Opens the store the global options name, or remembers to try again later when it is
    /// unavailable.
    ///
    /// # Errors
    /// Status 64 for a malformed URL or a store this build does not support.
    pub(crate) async fn open(global: &GlobalArgs) -> Result<LazyStore, Failure> {
        let url = match &global.store {
            Some(url) => url.clone(),
            None => baton::store::default_url()?,
        };
        let baton = match baton::connect_with(&url, global.namespace.clone()).await {
            Ok(baton) => Some(baton),
            Err(e) if matches!(e.kind(), ErrorKind::InvalidInput | ErrorKind::Unsupported) => {
                return Err(e.into());
            }
            Err(e) => {
                say!(
                    "baton: the store is unavailable ({e}); serving anyway, and trying again at each request"
                );
                None
            }
        };
        Ok(LazyStore {
            url,
            namespace: global.namespace.clone(),
            baton: Mutex::new(baton),
        })
    }

    /// The store, opening it first if it is not open yet.
    ///
    /// # Errors
    /// When it cannot be opened.
    pub(crate) async fn get(&self) -> baton::Result<Baton> {
        let mut slot = self.baton.lock().await;
        if let Some(baton) = slot.as_ref() {
            return Ok(baton.clone());
        }
        let baton = baton::connect_with(&self.url, self.namespace.clone()).await?;
        *slot = Some(baton.clone());
        Ok(baton)
    }

    /// The URL without its password.
    pub(crate) fn display_url(&self) -> String {
        baton::store::redact_url(&self.url)
    }

    /// The namespace.
    pub(crate) fn namespace(&self) -> &str {
        self.namespace.as_str()
    }
}

/// Serves `router` at `listen` until SIGINT or SIGTERM, once `announce` has said on stderr
/// where (it gets the bound address: with port 0, the one the system chose).
///
/// # Errors
/// Status 69 when `listen` cannot be bound or serving fails.
pub(crate) async fn serve_at(
    listen: SocketAddr,
    announce: impl FnOnce(SocketAddr),
    router: Router,
) -> Result<u8, Failure> {
    let stop = http::stop_signal()
        .map_err(|e| Failure::new(INTERNAL, format!("cannot install signal handlers: {e}")))?;
    let listener = http::bind(listen)
        .await
        .map_err(|e| Failure::new(UNAVAILABLE, format!("cannot listen on {listen}: {e}")))?;
    let local = listener
        .local_addr()
        .map_err(|e| Failure::new(INTERNAL, e.to_string()))?;
    announce(local);
    http::serve(listener, router, http::Limits::OPERATOR, stop)
        .await
        .map_err(|e| Failure::new(UNAVAILABLE, format!("serving on {local} failed: {e}")))?;
    Ok(SUCCESS)
}

/// Milliseconds since the Unix epoch (0 for times before it).
pub(crate) fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// `2026-11-30 16:40:05 UTC`.
pub(crate) fn utc(at: SystemTime) -> String {
    let secs = at
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_secs();
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`, for non-negative days).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        assert_eq!(utc(UNIX_EPOCH), "1970-01-01 00:00:00 UTC");
        let t = UNIX_EPOCH + Duration::from_secs(1_796_057_405);
        assert_eq!(utc(t), "2026-11-30 16:50:05 UTC");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(utc(leap), "2000-02-29 00:00:00 UTC");
    }
}
