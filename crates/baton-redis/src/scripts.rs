//! The Lua scripts that make up the store's atoms, for operators and benchmarks.
//!
//! Each atom is one script, run with `EVALSHA` and loaded again by the client when the server
//! answers `NOSCRIPT` (after a restart or `SCRIPT FLUSH`); a `NOSCRIPT` is never read as an
//! answer. Keys and values travel only as `KEYS` and `ARGV`, never inside the script text, so
//! the scripts are loaded once per server whatever the keys. The key layout and the wake-up
//! protocol are in `docs/redis.md`.
//!
//! The lock scripts share their helpers (reading a grant, the queue of waiting stores, the
//! handoff) through `lock_prelude.lua`, which is put in front of each of them at build time:
//! every constant below is the complete text the server runs.

use std::sync::LazyLock;

use redis::Script;

/// The helpers every lock script starts with: the grant's string format, reading it, the
/// queue of waiting stores, and the handoff to the store that waited longest.
pub const LOCK_PRELUDE: &str = include_str!("../scripts/lock_prelude.lua");

/// Grants a free key (or one reserved for this store) with the next fence, extends the
/// holder's own grant, or reports the holder and its remaining time and queues the store.
pub const CLAIM: &str = concat!(
    include_str!("../scripts/lock_prelude.lua"),
    include_str!("../scripts/claim.lua")
);
/// Restarts the TTL of a grant only if the holder still holds it.
pub const RENEW: &str = concat!(
    include_str!("../scripts/lock_prelude.lua"),
    include_str!("../scripts/renew.lua")
);
/// Frees a grant only if the holder still holds it; hands it to the first queued store.
pub const RELEASE: &str = concat!(
    include_str!("../scripts/lock_prelude.lua"),
    include_str!("../scripts/release.lua")
);
/// Reads a live grant with its remaining time.
pub const INSPECT: &str = concat!(
    include_str!("../scripts/lock_prelude.lua"),
    include_str!("../scripts/inspect.lua")
);
/// Gives up a store's place in a key's queue, and a reservation made for it, when none of
/// its waiters wants the key any more.
pub const PASS: &str = concat!(
    include_str!("../scripts/lock_prelude.lua"),
    include_str!("../scripts/pass.lua")
);

/// The scripts, hashed once per process.
pub(crate) struct Scripts {
    pub(crate) claim: Script,
    pub(crate) renew: Script,
    pub(crate) release: Script,
    pub(crate) inspect: Script,
    pub(crate) pass: Script,
}

pub(crate) static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    claim: Script::new(CLAIM),
    renew: Script::new(RENEW),
    release: Script::new(RELEASE),
    inspect: Script::new(INSPECT),
    pass: Script::new(PASS),
});

impl Scripts {
    /// Every script, for loading them all at connect.
    pub(crate) fn all(&self) -> [&Script; 5] {
        [
            &self.claim,
            &self.renew,
            &self.release,
            &self.inspect,
            &self.pass,
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scripts_take_keys_and_values_only_as_arguments() {
        for text in [CLAIM, RENEW, RELEASE, INSPECT, PASS] {
            assert!(text.starts_with(LOCK_PRELUDE));
            let code: String = text
                .lines()
                .filter(|l| !l.trim_start().starts_with("--"))
                .collect();
            assert!(!code.contains("{{"), "no formatting placeholders");
            assert!(code.contains("KEYS[1]"));
        }
        // The protocol's durations are written into the prelude once; they must be the ones
        // the Rust side documents.
        for (name, duration) in [
            ("FENCE_RETENTION_MS", crate::FENCE_RETENTION),
            ("QUEUE_GRACE_MS", crate::pubsub::QUEUE_GRACE),
            ("HANDOFF_RESERVATION_MS", crate::pubsub::HANDOFF_RESERVATION),
        ] {
            let line = format!("local {name} = {} ", duration.as_millis());
            assert!(LOCK_PRELUDE.contains(&line), "{line}");
        }
        let hashes: std::collections::BTreeSet<_> = SCRIPTS
            .all()
            .iter()
            .map(|s| s.get_hash().to_owned())
            .collect();
        assert_eq!(hashes.len(), 5);
    }
}
