//! Health checks of a store's deployment, for `baton doctor` and for services that want the
//! same checks at start-up: [`diagnose`] returns a [`Report`] of [`Check`]s.
//!
//! Each check is `Ok`, a `Note` (worth knowing, nothing to fix: what no persistence means
//! for fences) or a `Finding` (something to fix, with the fix). A store that cannot be
//! reached is a finding too, so a report is always an answer; only a malformed URL or a
//! store this build lacks is an error.
//!
//! | store | checks |
//! |---|---|
//! | `redis://` | connect and round trip; server version, role and cluster mode; server clock against this host's; `maxmemory-policy`; persistence (`appendonly`, `appendfsync`, `save`) and what it means for exclusion and fences |
//! | `sqlite://` | the file, its file system and permissions; header and schema version; the claimable-work tables (`work-schema`: present or not, since SQLite keeps no version of them); WAL mode; whether this user can take the write lock; `synchronous`; the clock (the host's: nothing to compare) |
//! | `postgres://` | connect and round trip; version, standby or read-only; server clock against this host's; baton schema version; claimable-work schema version (`work-schema`, `baton_work_schema`); whether grants are flushed before they answer (`durable-grants`: the URL's `durable_grants`, the server's `synchronous_commit` and `fsync`); a transaction-pooling proxy in front without `pooler=transaction` (a finding whatever `listen` says), or with it but without `listen_url` (a note); the pool size against the server's `max_connections` (`connections`) |
//! | `memory://` | one finding: it is process-local |
//!
//! Checking never changes the store: Redis and PostgreSQL get read commands only, and the
//! SQLite file is neither created nor written (see `baton_sqlite::doctor`). For Redis the store itself is
//! opened too, as an application would, so script loading and the release-message
//! subscription are checked (and the store's own eviction-policy event is emitted).
//!
//! # Examples
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> baton::Result<()> {
//! let report = baton::doctor::diagnose("memory://").await?;
//! assert!(!report.is_healthy());
//! for check in report.findings() {
//!     eprintln!("{}: {} (fix: {})", check.name, check.detail, check.fix.as_deref().unwrap_or("-"));
//! }
//! # Ok(()) }
//! ```

use std::fmt;
use std::time::Duration;
#[cfg(feature = "redis")]
use std::time::Instant;

use baton_core::{Error, Result};

/// A server clock further than this from the local one (beyond the measurement's
/// uncertainty) is a finding.
pub const CLOCK_TOLERANCE: Duration = Duration::from_secs(1);

/// What a check concluded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Verdict {
    /// As it should be.
    Ok,
    /// Worth knowing; nothing to fix.
    Note,
    /// Something to fix; the check's `fix` says how.
    Finding,
}

impl Verdict {
    /// `ok`, `note` or `finding`.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Note => "note",
            Verdict::Finding => "finding",
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One check: what was looked at, what was found, and for findings how to fix it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Check {
    /// What was checked: `connect`, `clock`, `maxmemory-policy`, `persistence`, `file`,
    /// `permissions`, ... (stable; scripts may match on it).
    pub name: &'static str,
    /// The verdict.
    pub verdict: Verdict,
    /// What was found, in one sentence.
    pub detail: String,
    /// How to fix it (every finding has one; some notes do).
    pub fix: Option<String>,
}

impl Check {
    fn ok(name: &'static str, detail: impl Into<String>) -> Check {
        Check {
            name,
            verdict: Verdict::Ok,
            detail: detail.into(),
            fix: None,
        }
    }

    fn note(name: &'static str, detail: impl Into<String>, fix: Option<String>) -> Check {
        Check {
            name,
            verdict: Verdict::Note,
            detail: detail.into(),
            fix,
        }
    }

    fn finding(name: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Check {
        Check {
            name,
            verdict: Verdict::Finding,
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }
}

/// The checks of one store.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Report {
    /// The store, as a URL without its password.
    pub store: String,
    /// Whether the store's server could be reached at all (always, for a local file:
    /// whatever is wrong with it is a finding).
    pub reachable: bool,
    /// Every check, in the order they ran.
    pub checks: Vec<Check>,
}

impl Report {
    /// The checks that found something to fix.
    pub fn findings(&self) -> impl Iterator<Item = &Check> {
        self.checks.iter().filter(|c| c.verdict == Verdict::Finding)
    }

    /// No findings (notes are fine).
    pub fn is_healthy(&self) -> bool {
        self.findings().next().is_none()
    }
}

/// Checks the store named by `url` (see the [module docs](self)).
///
/// # Errors
/// `InvalidInput` for a malformed URL or an unknown scheme; `Unsupported` for a scheme this
/// build lacks. A store that cannot be reached is not an error: the report says so.
pub async fn diagnose(url: &str) -> Result<Report> {
    let scheme = url.split_once("://").map(|(s, _)| s).unwrap_or("");
    match scheme {
        "memory" => {
            crate::connect(url).await?;
            Ok(Report {
                store: url.to_owned(),
                reachable: true,
                checks: vec![Check::finding(
                    "store",
                    "memory:// is process-local: it excludes only within one process, so nothing in another process (this check included) can see its locks",
                    "configure a shared store: sqlite:///path/to/file.db for the processes of one host, redis://host for several hosts",
                )],
            })
        }
        #[cfg(feature = "sqlite")]
        "sqlite" => sqlite::diagnose(url).await,
        #[cfg(feature = "redis")]
        "redis" | "rediss" | "redis+sentinel" | "rediss+sentinel" => redis::diagnose(url).await,
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => postgres::diagnose(url).await,
        // A store without checks of its own (or a scheme this build lacks, which
        // `connect` names) gets the generic ones. A new store adds an arm above and a
        // module below, reading facts from its crate's `doctor` module.
        _ => generic(url).await,
    }
}

/// Connect and round trip, for a store without checks of its own.
async fn generic(url: &str) -> Result<Report> {
    let started = std::time::Instant::now();
    let baton = match crate::connect(url).await {
        Ok(baton) => baton,
        Err(e) if is_usage(&e) => return Err(e),
        Err(e) => return Ok(unreachable(url.to_owned(), &e)),
    };
    let opened = started.elapsed();
    let started = std::time::Instant::now();
    let mut checks = Vec::new();
    match baton.locks().inspect("baton-doctor-probe").await {
        Ok(_) => checks.push(Check::ok(
            "connect",
            format!(
                "opened in {}; one read took {}",
                millis(opened),
                millis(started.elapsed())
            ),
        )),
        Err(e) => checks.push(Check::finding(
            "connect",
            format!("opened, but a read failed: {e}"),
            "check the store's health and credentials",
        )),
    }
    checks.push(Check::note(
        "store",
        format!(
            "{} stores have no checks of their own in this version of baton",
            baton.store().name()
        ),
        None,
    ));
    Ok(Report {
        store: url.to_owned(),
        reachable: true,
        checks,
    })
}

fn is_usage(e: &Error) -> bool {
    matches!(
        e.kind(),
        baton_core::ErrorKind::InvalidInput | baton_core::ErrorKind::Unsupported
    )
}

/// The report of a store that could not be reached.
fn unreachable(store: String, error: &Error) -> Report {
    Report {
        store,
        reachable: false,
        checks: vec![Check::finding(
            "connect",
            format!("cannot reach the store: {error}"),
            "check that the server runs and the URL, credentials and network path are right",
        )],
    }
}

/// A duration for reading: `0.42ms`, `12.3ms`, `1.50s`.
fn millis(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1000.0;
    if ms < 10.0 {
        format!("{ms:.2}ms")
    } else if ms < 1000.0 {
        format!("{ms:.1}ms")
    } else {
        format!("{:.2}s", d.as_secs_f64())
    }
}

#[cfg(feature = "redis")]
mod redis {
    //! The checks of a Redis server.

    use baton_redis::doctor::{ServerFacts, inspect};

    use super::*;

    pub(super) async fn diagnose(url: &str) -> Result<Report> {
        let started = Instant::now();
        // Opening the store as an application does checks script loading and the
        // subscription to release messages too.
        let store = match baton_redis::RedisStore::connect(url).await {
            Ok(store) => store,
            Err(e) if is_usage(&e) => return Err(e),
            Err(e) => return Ok(unreachable(baton_core::redact_url(url), &e)),
        };
        let opened = started.elapsed();
        drop(store);
        let facts = match inspect(url).await {
            Ok(facts) => facts,
            Err(e) if is_usage(&e) => return Err(e),
            Err(e) => return Ok(unreachable(baton_core::redact_url(url), &e)),
        };
        Ok(Report {
            store: facts.server.clone(),
            reachable: true,
            checks: checks(&facts, opened),
        })
    }

    pub(super) fn checks(facts: &ServerFacts, opened: Duration) -> Vec<Check> {
        let mut checks = vec![
            round_trip(
                format!(
                    "opened the store in {} (scripts loaded, subscribed to release messages); PING",
                    millis(opened)
                ),
                &facts.round_trips,
                facts.response_timeout,
            ),
            server(facts),
        ];
        checks.push(clock(facts));
        checks.push(replication(facts));
        checks.push(eviction(facts));
        checks.extend(persistence(facts));
        checks
    }

    fn server(facts: &ServerFacts) -> Check {
        let version = facts.version.as_deref().unwrap_or("unknown");
        let role = facts.role.as_deref().unwrap_or("unknown");
        let detail = format!(
            "Redis {version}, role {role}, cluster mode {}",
            match facts.cluster_enabled {
                Some(true) => "on",
                Some(false) => "off",
                None => "unknown",
            }
        );
        let major: Option<u32> = facts
            .version
            .as_deref()
            .and_then(|v| v.split('.').next())
            .and_then(|m| m.parse().ok());
        if facts.cluster_enabled == Some(true) {
            Check::finding(
                "server",
                format!("{detail}: baton supports a single primary, not Redis Cluster"),
                "use a standalone primary (with replicas and Sentinel if you need failover)",
            )
        } else if facts.role.as_deref().is_some_and(|r| r != "master") {
            Check::finding(
                "server",
                format!("{detail}: a replica refuses writes (READONLY), so no lock can be taken"),
                "point the store URL at the primary",
            )
        } else if major.is_some_and(|m| m < 5) {
            Check::finding(
                "server",
                format!(
                    "{detail}: baton needs Redis 5 or newer (scripts that replicate their effects)"
                ),
                "upgrade Redis",
            )
        } else {
            Check::ok("server", detail)
        }
    }

    fn clock(facts: &ServerFacts) -> Check {
        let Some(offset) = facts.clock_offset_micros else {
            return Check::finding(
                "clock",
                "TIME was refused; the claim script reads TIME to seed fences, so claims will fail too",
                "allow +time for baton's user in the server's ACL (see docs/redis.md, Permissions)",
            );
        };
        let (offset, far) = clock_offset(offset, facts.clock_uncertainty);
        let detail = format!(
            "{offset}; expiry is decided by Redis alone, and fences are seeded from the server clock"
        );
        if far {
            Check::finding(
                "clock",
                format!(
                    "{detail}: clocks this far apart mean one is not synchronized, and a server clock that steps back after the server loses its data (a restart without persistence, a failover) can hand out smaller fences than before, which fenced resources reject"
                ),
                "synchronize the clocks of the server and of this host with NTP (chrony, systemd-timesyncd)",
            )
        } else {
            Check::ok("clock", detail)
        }
    }

    /// The primary's replicas, their lag, and what a promotion would mean for grants and
    /// fences.
    fn replication(facts: &ServerFacts) -> Check {
        let via = match &facts.sentinel_master {
            Some(master) => format!(
                "primary of {master:?} (through Sentinel) at {}",
                facts.address
            ),
            None => format!("server at {}", facts.address),
        };
        let fences = "fences never fall below the server clock, so a promoted replica keeps them increasing as long as its clock is not behind this server's by more than the time since the last grant it received";
        let online = facts
            .replicas
            .iter()
            .filter(|r| r.state == "online")
            .count();
        let listed = facts
            .replicas
            .iter()
            .map(|r| {
                let lag = r.lag_seconds.map_or("unknown".into(), |l| format!("{l}s"));
                let behind = r
                    .behind_bytes
                    .map_or("unknown".into(), |b| format!("{b} bytes"));
                format!("{} {} (lag {lag}, behind {behind})", r.address, r.state)
            })
            .collect::<Vec<_>>()
            .join(", ");
        let Some(connected) = facts.connected_replicas else {
            return Check::note(
                "replication",
                format!("{via}: the replication state could not be read (INFO was refused)"),
                Some("check the replicas where the servers are configured".into()),
            );
        };
        let min = facts.min_replicas;
        if min > 0 && online < min as usize {
            return Check::finding(
                "replication",
                format!(
                    "{via}: min_replicas={min}, but {online} of {connected} replicas are online ({}): every claim, renewal and release waits out the response timeout and is Unavailable",
                    if listed.is_empty() {
                        "none".into()
                    } else {
                        listed
                    }
                ),
                "bring the replicas back, or lower min_replicas in the store URL",
            );
        }
        if connected == 0 {
            return Check::ok(
                "replication",
                format!(
                    "{via}: role master, no replicas; grants live on this server alone (see persistence), and {fences}"
                ),
            );
        }
        let grants = if min > 0 {
            format!(
                "min_replicas={min}: every acknowledged grant is on {min} replica(s) too, so a promoted one has it"
            )
        } else {
            "min_replicas=0: replication is asynchronous, so a replica promoted after this server is lost misses the grants it had not received, and their keys can be granted again beside the old holders".into()
        };
        Check::ok(
            "replication",
            format!("{via}: role master, {connected} replica(s): {listed}; {grants}; {fences}"),
        )
    }

    fn eviction(facts: &ServerFacts) -> Check {
        let limit = match facts.maxmemory {
            Some(0) => " (maxmemory is 0: no limit is set, so eviction starts only once one is)",
            _ => "",
        };
        match facts.maxmemory_policy.as_deref() {
            Some("noeviction") => Check::ok(
                "maxmemory-policy",
                "maxmemory-policy is noeviction: lock keys are never evicted",
            ),
            Some(policy) => Check::finding(
                "maxmemory-policy",
                format!(
                    "maxmemory-policy is {policy}{limit}: under memory pressure Redis may evict lock keys and hand a held lock to a second holder"
                ),
                "set maxmemory-policy noeviction (CONFIG SET maxmemory-policy noeviction, and in redis.conf or the provider's parameter group so it survives a restart), or give baton a Redis of its own",
            ),
            None => Check::note(
                "maxmemory-policy",
                format!(
                    "maxmemory-policy could not be read (CONFIG GET was refused: {})",
                    facts.config_refused.as_deref().unwrap_or("no answer")
                ),
                Some(
                    "confirm in the provider's settings that maxmemory-policy is noeviction".into(),
                ),
            ),
        }
    }

    fn persistence(facts: &ServerFacts) -> Vec<Check> {
        let mut checks = Vec::new();
        if let Some(error) = &facts.persistence_error {
            checks.push(Check::finding(
                "persistence",
                format!("the last persistence write failed ({error}); by default Redis then refuses writes, so no lock can be taken"),
                "check the server's disk space and log, and its dir and permissions",
            ));
        }
        let aof = match (facts.appendonly.as_deref(), facts.aof_enabled) {
            (Some(v), _) => Some(v == "yes"),
            (None, known) => known,
        };
        let save = facts.save.as_deref().map(str::trim);
        let fences =
            "fences keep increasing across restarts either way (never below the server clock)";
        let check = match (aof, facts.appendfsync.as_deref(), save) {
            (Some(true), Some("always"), _) => Check::ok(
                "persistence",
                format!("appendonly yes, appendfsync always: grants survive a restart of this primary; {fences}"),
            ),
            (Some(true), fsync, _) => Check::note(
                "persistence",
                format!(
                    "appendonly yes, appendfsync {}: a crash loses up to the last second of grants, whose holders keep running beside the next holders until their own TTL; {fences}",
                    fsync.unwrap_or("unknown")
                ),
                Some("for exclusion across restarts set appendfsync always; either way pass fences to what you protect".into()),
            ),
            (Some(false), _, Some(schedule)) if !schedule.is_empty() => Check::note(
                "persistence",
                format!(
                    "appendonly no, RDB snapshots (save \"{schedule}\"): a restart loses every grant made since the last snapshot, and their holders keep running beside the next holders until their own TTL; {fences}"
                ),
                Some("enable appendonly with appendfsync always, or keep a restarted server out of service for longer than your longest lock TTL".into()),
            ),
            (Some(false), _, Some(_)) => Check::note(
                "persistence",
                format!(
                    "no persistence (appendonly no, save \"\"): a restart frees every lock at once while its holders keep running until their own TTL; {fences}"
                ),
                Some("keep a restarted server out of service for longer than your longest lock TTL, or enable appendonly with appendfsync always; pass fences to what you protect".into()),
            ),
            _ => Check::note(
                "persistence",
                "the persistence settings could not be read (CONFIG GET was refused)",
                Some("check appendonly, appendfsync and save in the provider's settings; docs/redis.md says what each means for exclusion".into()),
            ),
        };
        checks.push(check);
        checks
    }
}

/// The round-trip check shared by the server stores: the slowest of a few requests
/// against the response timeout.
#[cfg(any(feature = "redis", feature = "postgres"))]
fn round_trip(opened: String, round_trips: &[Duration], response_timeout: Duration) -> Check {
    let mut sorted = round_trips.to_vec();
    sorted.sort();
    let (Some(min), Some(max)) = (sorted.first(), sorted.last()) else {
        return Check::ok("connect", opened);
    };
    let median = sorted[sorted.len() / 2];
    let detail = format!(
        "{opened}; round trip min {}, median {}, max {} over {}",
        millis(*min),
        millis(median),
        millis(*max),
        sorted.len()
    );
    if *max > response_timeout / 2 {
        Check::finding(
            "connect",
            format!(
                "{detail}: the slowest is more than half the response timeout ({}), so calls may fail with Unavailable",
                millis(response_timeout)
            ),
            "run baton closer to the server, or raise response_timeout in the store URL (?response_timeout=2s)",
        )
    } else {
        Check::ok("connect", detail)
    }
}

/// `0.06ms ahead of`, and whether that is beyond [`CLOCK_TOLERANCE`] plus the uncertainty.
#[cfg(any(feature = "redis", feature = "postgres"))]
fn clock_offset(offset_micros: i64, uncertainty: Duration) -> (String, bool) {
    let magnitude = Duration::from_micros(offset_micros.unsigned_abs());
    let direction = if offset_micros >= 0 {
        "ahead of"
    } else {
        "behind"
    };
    (
        format!(
            "the server clock is {} {direction} this host's (± {})",
            millis(magnitude),
            millis(uncertainty)
        ),
        magnitude > CLOCK_TOLERANCE + uncertainty,
    )
}

#[cfg(feature = "postgres")]
mod postgres {
    //! The checks of a PostgreSQL server.

    use baton_postgres::doctor::{SchemaState, ServerFacts, inspect};
    use baton_postgres::sql::SCHEMA_VERSION;
    use baton_postgres::work::sql::SCHEMA_VERSION as WORK_SCHEMA_VERSION;

    use super::*;

    pub(super) async fn diagnose(url: &str) -> Result<Report> {
        let started = std::time::Instant::now();
        // Opening the store as an application does would create or migrate the schema;
        // the doctor changes nothing, so it only reads.
        let facts = match inspect(url).await {
            Ok(facts) => facts,
            Err(e) if is_usage(&e) => return Err(e),
            Err(e) => return Ok(unreachable(baton_core::redact_url(url), &e)),
        };
        let opened = started.elapsed();
        Ok(Report {
            store: facts.server.clone(),
            reachable: true,
            checks: checks(&facts, opened),
        })
    }

    pub(super) fn checks(facts: &ServerFacts, opened: Duration) -> Vec<Check> {
        vec![
            round_trip(
                format!(
                    "connected and read the facts over two connections in {}; SELECT 1",
                    millis(opened)
                ),
                &facts.round_trips,
                facts.response_timeout,
            ),
            server(facts),
            clock(facts),
            schema(facts),
            work_schema(facts),
            durable_grants(facts),
            pooling(facts),
            connections(facts),
        ]
    }

    fn server(facts: &ServerFacts) -> Check {
        let role = if facts.in_recovery {
            "a standby"
        } else {
            "a primary"
        };
        let detail = format!("PostgreSQL {}, {role}", facts.version);
        if facts.in_recovery {
            Check::finding(
                "server",
                format!("{detail}: a standby refuses writes, so no lock can be taken"),
                "point the store URL at the primary (or at a name that follows failover)",
            )
        } else if facts.read_only {
            Check::finding(
                "server",
                format!("{detail}, with default_transaction_read_only on: every claim would fail"),
                "turn default_transaction_read_only off for baton's user or database (ALTER ROLE ... SET default_transaction_read_only = off)",
            )
        } else {
            Check::ok("server", detail)
        }
    }

    fn clock(facts: &ServerFacts) -> Check {
        let (offset, far) = clock_offset(facts.clock_offset_micros, facts.clock_uncertainty);
        let detail = format!(
            "{offset}; expiry is decided by the server's clock_timestamp() alone, fences come from a sequence"
        );
        if far {
            Check::finding(
                "clock",
                format!(
                    "{detail}: clocks this far apart mean one is not synchronized, and when the server's is corrected a forward step expires grants early, while their holders still count their TTL"
                ),
                "synchronize the clocks of the server and of this host with NTP, slewing rather than stepping (chrony, systemd-timesyncd)",
            )
        } else {
            Check::ok("clock", detail)
        }
    }

    /// One of baton's version tracks in the database: the lease schema or the claimable-work
    /// tables.
    #[derive(Clone, Copy)]
    struct Track {
        /// The check's name.
        check: &'static str,
        /// The table that records the version.
        table: &'static str,
        /// How the detail names the schema.
        label: &'static str,
        /// What the store creates when the table is missing.
        creates: &'static str,
        /// The version this build understands.
        current: i32,
    }

    const LEASES: Track = Track {
        check: "schema",
        table: "baton_schema",
        label: "baton schema",
        creates: "the schema at first connect",
        current: SCHEMA_VERSION,
    };

    const WORK: Track = Track {
        check: "work-schema",
        table: "baton_work_schema",
        label: "baton work schema",
        creates: "the claimable-work tables (queues, schedules, migration records) at its next connect",
        current: WORK_SCHEMA_VERSION,
    };

    fn schema(facts: &ServerFacts) -> Check {
        version_track(&LEASES, facts.schema)
    }

    fn work_schema(facts: &ServerFacts) -> Check {
        version_track(&WORK, facts.work_schema)
    }

    /// Missing or older: a note (the store creates or migrates it); unrecorded, newer than
    /// this build or below 1 (which the store refuses): a finding.
    fn version_track(track: &Track, state: SchemaState) -> Check {
        let Track {
            check,
            table,
            label,
            creates,
            current,
        } = *track;
        match state {
            SchemaState::Missing => Check::note(
                check,
                format!(
                    "no {table} table in the search_path: the store creates {creates} (its user needs CREATE on the schema)"
                ),
                None,
            ),
            SchemaState::Unrecorded => Check::finding(
                check,
                format!(
                    "{table} exists but records no version: baton did not create it and will not use it"
                ),
                "point the store at another schema (?options=-csearch_path%3D<schema>), or drop the stray table",
            ),
            SchemaState::Version(v) if v > current => Check::finding(
                check,
                format!(
                    "the {label} is version {v}, newer than version {current} that this baton understands"
                ),
                "upgrade baton to the version that wrote the schema",
            ),
            SchemaState::Version(v) if v < 1 => Check::finding(
                check,
                format!(
                    "the {label} is version {v}, which no baton wrote: the store refuses to use it"
                ),
                "point the store at another schema (?options=-csearch_path%3D<schema>), or drop the stray table",
            ),
            SchemaState::Version(v) if v < current => Check::note(
                check,
                format!(
                    "the {label} is version {v}; this baton migrates it to {current} at its first connect"
                ),
                None,
            ),
            SchemaState::Version(v) => Check::ok(check, format!("{label} version {v}")),
            _ => Check::note(
                check,
                format!("the {check} state is unknown to this baton"),
                None,
            ),
        }
    }

    /// Whether an answered grant survives a crash: the URL's `durable_grants` and the
    /// server's `synchronous_commit` and `fsync` must all let a claim's commit reach the
    /// disk before it answers. Each is a choice someone made, so a note, as Redis
    /// persistence and SQLite's `synchronous=normal` are.
    fn durable_grants(facts: &ServerFacts) -> Check {
        let mut causes = Vec::new();
        let mut fixes = Vec::new();
        if !facts.durable_grants {
            causes.push("durable_grants=off in the store URL");
            fixes.push(
                "remove durable_grants=off from the store URL (durable_grants=on is the default)",
            );
        }
        if facts.synchronous_commit == "off" {
            causes.push("synchronous_commit is off for this user's sessions");
            fixes.push("turn synchronous_commit back on for baton's role or database (ALTER ROLE ... SET synchronous_commit = on)");
        }
        if !facts.fsync {
            causes.push("the server runs with fsync=off");
            fixes.push("set fsync = on in the server's configuration");
        }
        if causes.is_empty() {
            return Check::ok(
                "durable-grants",
                format!(
                    "durable_grants=on, synchronous_commit {}, fsync on: a claim or renewal answers only once its commit is flushed to the WAL, so an answered grant and its fence survive a server crash",
                    facts.synchronous_commit
                ),
            );
        }
        Check::note(
            "durable-grants",
            format!(
                "{}: claims and renewals answer before their commit is on disk, so a crash of the server or its host can lose an answered grant and hand the key, possibly with the same fence, to a second holder",
                causes.join(", and ")
            ),
            Some(format!(
                "{} to have grants flushed before they are returned",
                fixes.join("; ")
            )),
        )
    }

    fn pooling(facts: &ServerFacts) -> Check {
        use baton_postgres::Pooler;
        let pooled = facts.pooler == Pooler::Transaction;
        match (&facts.transaction_pooling, pooled) {
            (Some(evidence), false) => Check::finding(
                "pooling",
                format!(
                    "a transaction-pooling proxy is in front ({evidence}): statements prepared under a name on one server connection are looked up on another, so every command fails (prepared statement \"sqlx_s_1\" already exists), with listen on or off"
                ),
                "add pooler=transaction to the store URL (every statement then runs unnamed in a transaction of its own), and listen_url=<a direct postgres:// URL of the server, percent-encoded> for release wake-ups (without it waiters poll every poll_interval)",
            ),
            (Some(evidence), true) if facts.listen && !facts.listen_url => Check::note(
                "pooling",
                format!(
                    "a transaction-pooling proxy is in front ({evidence}) and the URL says pooler=transaction; with no listen_url, waiters poll every poll_interval and broadcast is refused"
                ),
                Some(
                    "add listen_url=<a direct postgres:// URL of the server, percent-encoded> for push wake-ups, or listen=off to say polling is meant".into(),
                ),
            ),
            (Some(evidence), true) => Check::ok(
                "pooling",
                format!(
                    "a transaction-pooling proxy is in front ({evidence}) and the URL says pooler=transaction"
                ),
            ),
            (None, true) => Check::note(
                "pooling",
                "the URL says pooler=transaction, but no transaction-pooling proxy was detected: every call pays three extra round trips (BEGIN, a separate prepare, COMMIT)",
                Some(
                    "remove pooler=transaction when baton connects directly or through session pooling".into(),
                ),
            ),
            (None, false) => Check::ok(
                "pooling",
                "no transaction-pooling proxy detected: two connections kept two server backends of their own",
            ),
        }
    }

    /// The store's pool (and its LISTEN connection) against the server's connection slots.
    fn connections(facts: &ServerFacts) -> Check {
        let per_process = facts.pool_size + u32::from(facts.listen);
        let slots = facts
            .server_max_connections
            .saturating_sub(facts.reserved_connections);
        let detail = format!(
            "each process of this store opens up to {per_process} connection(s) (max_connections={} in the URL{}); the server has max_connections={} ({} reserved for superusers), room for {} such processes at once",
            facts.pool_size,
            if facts.listen {
                ", plus one to LISTEN"
            } else {
                ""
            },
            facts.server_max_connections,
            facts.reserved_connections,
            slots / per_process.max(1)
        );
        if facts.transaction_pooling.is_some() {
            return Check::ok(
                "connections",
                format!(
                    "{detail}; behind the transaction pooler, the pooler's own pool size is what the server sees"
                ),
            );
        }
        if per_process > slots {
            return Check::finding(
                "connections",
                detail,
                "lower max_connections in the store URL, or raise the server's max_connections",
            );
        }
        Check::ok("connections", detail)
    }
}

#[cfg(feature = "sqlite")]
mod sqlite {
    //! The checks of an SQLite file.

    use baton_sqlite::Synchronous;
    use baton_sqlite::doctor::{
        DatabaseFacts, FileState, StoreFile, WORK_TABLES, WriteProbe, inspect,
    };
    use baton_sqlite::sql::{APPLICATION_ID, SCHEMA_VERSION};

    use super::*;

    /// File systems on which SQLite's locking and WAL shared memory are not reliable.
    const NETWORK_FILE_SYSTEMS: &[&str] = &[
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "9p",
        "ceph",
        "glusterfs",
        "lustre",
        "afs",
        "davfs",
        "fuse.sshfs",
        "fuse.glusterfs",
        "fuse.s3fs",
        "fuse.gcsfuse",
        "fuse.davfs2",
    ];

    pub(super) async fn diagnose(url: &str) -> Result<Report> {
        let facts = inspect(url).await?;
        // A local file is never "unreachable": whatever is wrong with it is a finding.
        Ok(Report {
            store: url.to_owned(),
            reachable: true,
            checks: checks(&facts),
        })
    }

    fn user(facts: &StoreFile) -> String {
        match facts.uid {
            Some(uid) => format!("this user (uid {uid})"),
            None => "this user".to_owned(),
        }
    }

    pub(super) fn checks(facts: &StoreFile) -> Vec<Check> {
        let path = facts.path.display();
        let on = facts
            .filesystem
            .as_deref()
            .map(|fs| format!(" on {fs}"))
            .unwrap_or_default();
        let mut checks = Vec::new();
        match &facts.state {
            FileState::Missing {
                existing_dir,
                cannot_create: None,
            } => checks.push(Check::note(
                "file",
                format!(
                    "{path} does not exist yet; baton creates it, and its directories, at first use, and {user} can create files in {}{on}",
                    existing_dir.display(),
                    user = user(facts)
                ),
                None,
            )),
            FileState::Missing {
                existing_dir,
                cannot_create: Some(error),
            } => checks.push(Check::finding(
                "file",
                format!(
                    "{path} does not exist and {} cannot create it in {}: {error}",
                    user(facts),
                    existing_dir.display()
                ),
                "create the directory and make it writable by the user baton runs as, or point --store/BATON_STORE at a writable place",
            )),
            FileState::NotAFile => checks.push(Check::finding(
                "file",
                format!("{path} is not a regular file"),
                format!("name a file, such as sqlite://{path}/baton.db"),
            )),
            FileState::Unreadable { error } => checks.push(Check::finding(
                "file",
                format!("{path} cannot be examined: {error}"),
                "make every directory on the path searchable (x) by the user baton runs as",
            )),
            FileState::Present {
                meta,
                cannot_write,
                cannot_create_beside,
                database,
            } => {
                checks.push(Check::ok(
                    "file",
                    format!(
                        "{path}: {} bytes, mode {:04o}, owner {}:{}{on}",
                        meta.size, meta.mode, meta.uid, meta.gid
                    ),
                ));
                if meta.mode & 0o002 != 0 {
                    checks.push(Check::note(
                        "permissions",
                        format!("{path} is writable by every user of the host (mode {:04o}): anyone can take or break its locks", meta.mode),
                        Some(format!("chmod o-w {path}, and share it through a group instead")),
                    ));
                }
                let owner = format!("mode {:04o}, owner {}:{}", meta.mode, meta.uid, meta.gid);
                let writable = cannot_write.is_none() && cannot_create_beside.is_none();
                if let Some(error) = cannot_write {
                    checks.push(Check::finding(
                        "permissions",
                        format!("{} cannot open {path} for writing ({owner}): {error}; every claim would fail", user(facts)),
                        PERMISSIONS_FIX,
                    ));
                }
                if let Some(error) = cannot_create_beside {
                    let dir = facts.path.parent().map(|d| d.display().to_string()).unwrap_or_default();
                    checks.push(Check::finding(
                        "permissions",
                        format!("{} cannot create files in the directory {dir:?}, where SQLite keeps the -wal and -shm files: {error}", user(facts)),
                        PERMISSIONS_FIX,
                    ));
                }
                checks.extend(database_checks(facts, database, &owner, writable));
            }
            other => checks.push(Check::note(
                "file",
                format!("{path}: {other:?}"),
                None,
            )),
        }
        if let Some(fs) = facts
            .filesystem
            .as_deref()
            .filter(|fs| NETWORK_FILE_SYSTEMS.contains(fs))
        {
            checks.push(Check::finding(
                "filesystem",
                format!("{path} is on {fs}, a network file system: SQLite's locking and WAL shared memory are not reliable there, and the stored times mean nothing on another host"),
                "put the file on a local disk; for processes on several hosts use redis://",
            ));
        }
        checks.push(match facts.options.get_synchronous() {
            Synchronous::Normal => Check::note(
                "durability",
                "synchronous=normal: commits reach the disk at checkpoints, so after a power loss or kernel crash the fences of the lost commits are handed out again",
                Some("use synchronous=full (the default) when fenced resources live on other hosts".into()),
            ),
            _ => Check::ok(
                "durability",
                "synchronous=full: every answered grant, and its fence, survives power loss",
            ),
        });
        checks.push(Check::ok(
            "clock",
            "expiry is decided by this host's monotonic clock (CLOCK_MONOTONIC), read inside each transaction: the store's clock is the host's, so there is no offset to measure, and wall-clock steps change nothing",
        ));
        checks
    }

    /// The claimable-work tables. SQLite keeps no version of their own (the store creates
    /// any that are missing every time it opens the file), so there is nothing newer to
    /// find: only which are there.
    fn work_schema(missing: &[&str]) -> Check {
        if missing.is_empty() {
            Check::ok(
                "work-schema",
                "the claimable-work tables are present (unversioned in SQLite: the store creates any that are missing each time it opens the file)",
            )
        } else if missing.len() == WORK_TABLES.len() {
            Check::note(
                "work-schema",
                "no claimable-work tables yet: the store creates them (queues, schedules, migration records) the next time it opens the file",
                None,
            )
        } else {
            Check::note(
                "work-schema",
                format!(
                    "the claimable-work tables {} are missing: the store creates them the next time it opens the file",
                    missing.join(", ")
                ),
                None,
            )
        }
    }

    /// The fix of every permission finding.
    const PERMISSIONS_FIX: &str = "give every user that runs baton write access to the file, its -wal and -shm files and its directory (one group for all of them: chgrp -R, chmod g+w on the files, chmod g+ws on the directory)";

    /// The checks SQLite answers; a permission problem found already (`writable` false) is
    /// not reported again.
    fn database_checks(
        facts: &StoreFile,
        database: &DatabaseFacts,
        owner: &str,
        writable: bool,
    ) -> Vec<Check> {
        let path = facts.path.display();
        let (
            read_time,
            application_id,
            schema_version,
            objects,
            missing_work_tables,
            journal_mode,
            write_lock,
        ) = match database {
            DatabaseFacts::Read {
                read_time,
                application_id,
                schema_version,
                objects,
                missing_work_tables,
                journal_mode,
                write_lock,
            } => (
                read_time,
                *application_id,
                *schema_version,
                *objects,
                missing_work_tables,
                journal_mode,
                write_lock,
            ),
            // The permission findings above already say why SQLite cannot open it.
            DatabaseFacts::Unreadable { .. } if !writable => return Vec::new(),
            DatabaseFacts::Unreadable { error } => {
                return vec![Check::finding(
                    "connect",
                    format!("SQLite cannot open {path}: {error}"),
                    "check that the user baton runs as can read and write the file, its -wal and -shm files and its directory; replace a corrupt file (grants are short-lived: an empty file is a valid store)",
                )];
            }
            _ => return Vec::new(),
        };
        let mut checks = vec![Check::ok(
            "connect",
            format!(
                "opened the file and read its header in {}",
                millis(*read_time)
            ),
        )];
        let fresh = application_id == 0 && schema_version == 0 && objects == 0;
        checks.push(if fresh {
            Check::note(
                "schema",
                "the file is empty: baton creates its schema at first use",
                None,
            )
        } else if application_id != APPLICATION_ID {
            Check::finding(
                "schema",
                format!("{path} is not a baton store (application_id {application_id:#x}): baton refuses to open another application's database"),
                "point the store URL at a new file",
            )
        } else if schema_version > SCHEMA_VERSION {
            Check::finding(
                "schema",
                format!("{path} has schema version {schema_version}, newer than version {SCHEMA_VERSION} that this baton understands"),
                "upgrade baton to the version that wrote the file",
            )
        } else {
            Check::ok(
                "schema",
                format!("a baton store, schema version {schema_version}"),
            )
        });
        if fresh || application_id == APPLICATION_ID {
            checks.push(work_schema(missing_work_tables));
        }
        if journal_mode == "wal" {
            checks.push(Check::ok("wal", "journal_mode is wal"));
        } else if !fresh {
            checks.push(Check::finding(
                "wal",
                format!("journal_mode is {journal_mode}, not wal: readers would block the writer, and baton refuses to open the file"),
                "open it once with baton on a local file system, which switches it to WAL; if it stays, the file system lacks the shared memory WAL needs",
            ));
        }
        if !writable {
            // Already reported above, with the cause.
            return checks;
        }
        checks.push(match write_lock {
            WriteProbe::Taken(took) => Check::ok(
                "permissions",
                format!("{} can take the write lock (took {})", user(facts), millis(*took)),
            ),
            WriteProbe::ReadOnly => Check::finding(
                "permissions",
                format!(
                    "SQLite opened {path} read-only for {} ({owner}): its -wal or -shm file is not writable, so every claim would fail",
                    user(facts)
                ),
                PERMISSIONS_FIX,
            ),
            WriteProbe::Busy => Check::finding(
                "permissions",
                format!(
                    "another connection held the write lock for longer than busy_timeout ({})",
                    millis(facts.options.get_busy_timeout())
                ),
                "find the process holding a long write transaction (an open sqlite3 shell, a backup with cp), or raise busy_timeout in the store URL",
            ),
            WriteProbe::Failed(error) => Check::finding(
                "permissions",
                format!("taking the write lock failed: {error}"),
                "check the file, its -wal and -shm files and the disk (space, read-only mount)",
            ),
            _ => Check::note("permissions", "the write lock was not probed", None),
        });
        checks
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn memory_is_a_finding() {
        let report = diagnose("memory://").await.unwrap();
        assert!(!report.is_healthy());
        assert_eq!(report.findings().count(), 1);
        assert!(report.checks[0].fix.is_some());
    }

    #[tokio::test]
    async fn bad_urls_are_errors() {
        for url in ["nonsense", "mysql://x", "sqlite://"] {
            assert!(diagnose(url).await.is_err(), "{url}");
        }
    }

    #[cfg(feature = "sqlite")]
    #[tokio::test]
    async fn a_fresh_sqlite_store_is_healthy() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/baton.db", dir.path().display());
        let report = diagnose(&url).await.unwrap();
        assert!(report.is_healthy(), "{report:#?}");
        drop(crate::connect(&url).await.unwrap());
        let report = diagnose(&url).await.unwrap();
        assert!(report.is_healthy(), "{report:#?}");
        let names: Vec<_> = report.checks.iter().map(|c| c.name).collect();
        for name in ["file", "connect", "schema", "wal", "permissions", "clock"] {
            assert!(names.contains(&name), "{name} missing from {names:?}");
        }
    }

    /// The one check named `name`.
    #[cfg(feature = "sqlite")]
    fn check<'a>(report: &'a Report, name: &str) -> &'a Check {
        let found: Vec<_> = report.checks.iter().filter(|c| c.name == name).collect();
        assert_eq!(found.len(), 1, "{name} in {report:#?}");
        found[0]
    }

    #[cfg(feature = "sqlite")]
    #[tokio::test]
    async fn sqlite_work_tables_absent_partial_and_present() {
        use baton_sqlite::doctor::WORK_TABLES;

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("baton.db");
        let url = format!("sqlite://{}", path.display());
        let tables = |path: &std::path::Path| -> Vec<String> {
            let conn = rusqlite::Connection::open(path).unwrap();
            let mut statement = conn
                .prepare("SELECT name FROM sqlite_schema WHERE type = 'table' AND name LIKE 'baton_work_%' ORDER BY name")
                .unwrap();
            statement
                .query_map([], |r| r.get(0))
                .unwrap()
                .collect::<rusqlite::Result<_>>()
                .unwrap()
        };

        // A store file from before the work tables: a note, and doctor creates none.
        drop(crate::connect(&url).await.unwrap());
        let conn = rusqlite::Connection::open(&path).unwrap();
        for table in WORK_TABLES {
            conn.execute_batch(&format!("DROP TABLE {table}")).unwrap();
        }
        drop(conn);
        let report = diagnose(&url).await.unwrap();
        let work = check(&report, "work-schema");
        assert_eq!(work.verdict, Verdict::Note, "{work:?}");
        assert!(
            work.detail.starts_with("no claimable-work tables"),
            "{work:?}"
        );
        assert!(report.is_healthy(), "{report:#?}");
        assert_eq!(tables(&path), Vec::<String>::new());

        // Opening a queue and enqueuing once: present.
        let baton = crate::connect(&url).await.unwrap();
        baton
            .queue("doctor-q")
            .unwrap()
            .enqueue(b"x", crate::work::EnqueueOptions::new())
            .await
            .unwrap();
        drop(baton);
        let report = diagnose(&url).await.unwrap();
        let work = check(&report, "work-schema");
        assert_eq!(work.verdict, Verdict::Ok, "{work:?}");
        assert!(work.detail.contains("present"), "{work:?}");
        assert_eq!(tables(&path).len(), WORK_TABLES.len());

        // One missing: a note that names it.
        rusqlite::Connection::open(&path)
            .unwrap()
            .execute_batch("DROP TABLE baton_work_schedule")
            .unwrap();
        let report = diagnose(&url).await.unwrap();
        let work = check(&report, "work-schema");
        assert_eq!(work.verdict, Verdict::Note, "{work:?}");
        assert!(
            work.detail
                .starts_with("the claimable-work tables baton_work_schedule are missing"),
            "{work:?}"
        );
    }

    #[test]
    fn durations_read_well() {
        assert_eq!(millis(Duration::from_micros(420)), "0.42ms");
        assert_eq!(millis(Duration::from_micros(12_340)), "12.3ms");
        assert_eq!(millis(Duration::from_millis(1500)), "1.50s");
    }
}
