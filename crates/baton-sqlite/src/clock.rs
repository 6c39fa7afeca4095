//! The clock that decides expiry: the host's monotonic clock (`CLOCK_MONOTONIC`).
//!
//! Every process of one host reads the same `CLOCK_MONOTONIC`, so it can be compared across
//! the processes that share a file, and it never steps: setting the date, an NTP step or a
//! leap second changes nothing about when a grant expires. It is also the clock that
//! `std::time::Instant` (and so tokio's) reads on Linux, which gives the store's expiry and
//! a guard's `valid_until` one time line: a guard's `valid_until` (the TTL counted from just
//! *before* its request was sent) is never later than the expiry the store wrote (the TTL
//! counted from a clock read *inside* the transaction).
//!
//! A wall clock (`SystemTime`, SQLite's `'now'`) would survive reboots, but a forward step
//! would expire every grant early in the store while each holder's guard still counts its
//! TTL: two holders at once. Locks are about exclusion, so the store takes the monotonic
//! clock and handles its one weakness, reboots, explicitly:
//!
//! - The clock restarts at boot, so times stored before a reboot mean nothing after it. All
//!   their holders died with the old boot, so the first store opened after a reboot frees
//!   every grant (keeping the fences). On Linux the boot is identified by
//!   `/proc/sys/kernel/random/boot_id`; where that cannot be read, a grant written *later*
//!   than the current time must be from an earlier boot and is freed, and any other lingers
//!   at most its TTL.
//! - A file is only meaningful on one host (as SQLite's locking is anyway): do not share it
//!   over a network file system, nor between containers in different time namespaces.
//!
//! On macOS `CLOCK_MONOTONIC` also advances while the machine sleeps, and `Instant` does
//! not: after a sleep the store may have expired a grant whose guard still looks valid (as
//! after a paused process); keep-alive notices at its next renewal.
//!
//! Platforms without `CLOCK_MONOTONIC` (not unix) are refused at open with `Unsupported`.

/// The host's monotonic clock in nanoseconds: the `now` every statement in
/// [`sql`](crate::sql) takes.
#[cfg(unix)]
pub fn now() -> i64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec
        .saturating_mul(1_000_000_000)
        .saturating_add(t.tv_nsec)
}

/// The host's monotonic clock in nanoseconds. Not available on this platform: the store
/// refuses to open, so this is never called by it.
#[cfg(not(unix))]
pub fn now() -> i64 {
    0
}

/// The wall clock in microseconds since the Unix epoch (0 before it): the floor of every
/// fence [`sql::GRANT`](crate::sql::GRANT) hands out.
///
/// Fences are the one thing the store takes from the wall clock, and only as a floor: a key
/// whose row is gone with its file (deleted, replaced, restored from an old backup) starts
/// again from the time, above every fence handed out before, as long as the host's wall
/// clock has not stepped back since. A fence advances by one per grant otherwise, and grants
/// of one key take more than a microsecond each, so it never runs ahead of this clock.
/// Expiry never reads it.
pub fn wall_micros() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Whether this platform has a monotonic clock that all processes share.
pub(crate) const SUPPORTED: bool = cfg!(unix);

/// An identifier of the current boot, where the platform has one.
pub(crate) fn boot_id() -> Option<String> {
    #[cfg(target_os = "linux")]
    {
        let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
        let id = id.trim();
        (!id.is_empty()).then(|| id.to_owned())
    }
    #[cfg(not(target_os = "linux"))]
    {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(unix)]
    #[test]
    fn now_is_monotonic_and_in_nanoseconds() {
        let a = now();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = now();
        assert!(a > 0);
        assert!(b - a >= 2_000_000, "{a} then {b}");
    }

    /// The guard's `valid_until` is an `Instant`; the store's expiry must be on the same time
    /// line. std prints a Linux `Instant` as its `CLOCK_MONOTONIC` reading.
    #[cfg(target_os = "linux")]
    #[test]
    fn now_is_the_clock_of_instant() {
        let before = now();
        let text = format!("{:?}", std::time::Instant::now());
        let after = now();
        let field = |name: &str| -> i64 {
            let start = text.find(name).expect(&text) + name.len();
            let digits: String = text[start..]
                .chars()
                .skip_while(|c| !c.is_ascii_digit())
                .take_while(char::is_ascii_digit)
                .collect();
            digits.parse().expect(&text)
        };
        let instant = field("tv_sec") * 1_000_000_000 + field("tv_nsec");
        assert!(
            before <= instant && instant <= after,
            "{before} <= {text} <= {after}"
        );
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn boot_id_is_stable() {
        let id = boot_id().expect("linux has a boot id");
        assert_eq!(boot_id(), Some(id));
    }
}
