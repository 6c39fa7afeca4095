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
//! every constant below is the complete text the server runs. The semaphore's permit scripts
//! also start with it (for the fence counter and the queue), followed by
//! `permit_prelude.lua`.

use std::sync::LazyLock;

use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, RedisError, RedisResult, Script, ServerErrorKind, ToRedisArgs, Value};

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

/// What the permit scripts share (the permit keys, expiry on the server clock, waking the
/// store that waited longest); each permit script is `LOCK_PRELUDE`, then this, then its own
/// text, so permits take their fences from the lock's `next_fence` and queue their stores with
/// the lock's `enqueue`.
pub const PERMIT_PRELUDE: &str = include_str!("../scripts/permit_prelude.lua");

/// Takes a permit of a semaphore: extends the holder's own, grants one below N, or reports the
/// permit that ends soonest and queues the store.
pub const PERMIT_CLAIM: &str = concat!(
    include_str!("../scripts/lock_prelude.lua"),
    include_str!("../scripts/permit_prelude.lua"),
    include_str!("../scripts/permit_claim.lua")
);
/// Restarts the TTL of a holder's live permit.
pub const PERMIT_RENEW: &str = concat!(
    include_str!("../scripts/lock_prelude.lua"),
    include_str!("../scripts/permit_prelude.lua"),
    include_str!("../scripts/permit_renew.lua")
);
/// Gives back a holder's permit and tells the store that waited longest.
pub const PERMIT_RELEASE: &str = concat!(
    include_str!("../scripts/lock_prelude.lua"),
    include_str!("../scripts/permit_prelude.lua"),
    include_str!("../scripts/permit_release.lua")
);
/// Reads the live permits of a semaphore with their fences and remaining times.
pub const PERMIT_LIST: &str = concat!(
    include_str!("../scripts/lock_prelude.lua"),
    include_str!("../scripts/permit_prelude.lua"),
    include_str!("../scripts/permit_list.lua")
);
/// Gives up a store's turn for a permit, which goes to the next store in line.
pub const PERMIT_PASS: &str = concat!(
    include_str!("../scripts/lock_prelude.lua"),
    include_str!("../scripts/permit_prelude.lua"),
    include_str!("../scripts/permit_pass.lua")
);

/// The scripts, hashed once per process.
pub(crate) struct Scripts {
    pub(crate) claim: Script,
    pub(crate) renew: Script,
    pub(crate) release: Script,
    pub(crate) inspect: Script,
    pub(crate) pass: Script,
    pub(crate) permit_claim: Script,
    pub(crate) permit_renew: Script,
    pub(crate) permit_release: Script,
    pub(crate) permit_list: Script,
    pub(crate) permit_pass: Script,
}

pub(crate) static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    claim: Script::new(CLAIM),
    renew: Script::new(RENEW),
    release: Script::new(RELEASE),
    inspect: Script::new(INSPECT),
    pass: Script::new(PASS),
    permit_claim: Script::new(PERMIT_CLAIM),
    permit_renew: Script::new(PERMIT_RENEW),
    permit_release: Script::new(PERMIT_RELEASE),
    permit_list: Script::new(PERMIT_LIST),
    permit_pass: Script::new(PERMIT_PASS),
});

impl Scripts {
    /// Every script, for loading them all at connect.
    pub(crate) fn all(&self) -> [&Script; 10] {
        [
            &self.claim,
            &self.renew,
            &self.release,
            &self.inspect,
            &self.pass,
            &self.permit_claim,
            &self.permit_renew,
            &self.permit_release,
            &self.permit_list,
            &self.permit_pass,
        ]
    }

    /// The text of one of the crate's scripts (these, the rate limit's, the idempotency
    /// log's), by its hash: what a Redis Cluster store loads on the master of a key's slot
    /// after `NOSCRIPT` there.
    pub(crate) fn text_of(&self, script: &Script) -> Option<&'static str> {
        const TEXTS: [&str; 10] = [
            CLAIM,
            RENEW,
            RELEASE,
            INSPECT,
            PASS,
            PERMIT_CLAIM,
            PERMIT_RENEW,
            PERMIT_RELEASE,
            PERMIT_LIST,
            PERMIT_PASS,
        ];
        self.all()
            .into_iter()
            .zip(TEXTS)
            .find(|(s, _)| s.get_hash() == script.get_hash())
            .map(|(_, text)| text)
            .or_else(|| {
                (script.get_hash() == crate::limit::script().get_hash())
                    .then_some(crate::limit::LIMIT)
            })
            .or_else(|| crate::idempotency::text_of(script))
    }
}

/// An `EVALSHA` of one of the store's scripts, its keys and arguments packed into one command
/// buffer as they are added. The atoms run on every acquire and release, so they avoid what a
/// [`redis::ScriptInvocation`] costs on top: a vector per key and argument, copied again into
/// the command at every send.
///
/// [`Evalsha::send`] sends it once; after `NOSCRIPT` (a restart or `SCRIPT FLUSH`),
/// [`Evalsha::load`] loads the script so that it can be sent again. A `NOSCRIPT` is never an
/// answer.
pub(crate) struct Evalsha<'a> {
    script: &'a Script,
    cmd: Cmd,
    /// `WAIT replicas millis`, sent in the same pipeline right after the call.
    confirm: Option<Cmd>,
}

impl<'a> Evalsha<'a> {
    /// A call of `script` with `keys` keys; `capacity` is the expected size of the keys and
    /// arguments in bytes (a hint).
    pub(crate) fn new(script: &'a Script, keys: usize, capacity: usize) -> Self {
        let mut cmd = Cmd::with_capacity(8, capacity + 48);
        cmd.arg("EVALSHA").arg(script.get_hash()).arg(keys);
        Evalsha {
            script,
            cmd,
            confirm: None,
        }
    }

    /// Has every send of the call followed, in the same pipeline on the same connection,
    /// by `WAIT replicas millis`: the answer then says how many replicas have the call's
    /// writes. Without it (`replicas == 0`) the call is sent alone.
    pub(crate) fn confirmed_by(&mut self, replicas: u32, millis: u64) -> &mut Self {
        self.confirm = (replicas > 0).then(|| {
            let mut wait = redis::cmd("WAIT");
            wait.arg(replicas).arg(millis);
            wait
        });
        self
    }

    /// Adds the next key or argument (keys first, as many as [`Evalsha::new`] was told).
    pub(crate) fn arg(&mut self, arg: impl ToRedisArgs) -> &mut Self {
        self.cmd.arg(arg);
        self
    }

    /// Sends the call once; answers the script's value and, when the call is
    /// [confirmed](Evalsha::confirmed_by), how many replicas acknowledged its writes.
    pub(crate) async fn send<C: ConnectionLike + Send>(&self, conn: &mut C) -> RedisResult<Sent> {
        let Some(wait) = &self.confirm else {
            let value = self.cmd.query_async::<Value>(conn).await?;
            return Ok(Sent {
                value,
                replicas: None,
            });
        };
        let mut pipe = redis::pipe();
        pipe.add_command(self.cmd.clone()).add_command(wait.clone());
        let (value, replicas) = pipe.query_async::<(Value, i64)>(conn).await?;
        Ok(Sent {
            value,
            replicas: Some(replicas),
        })
    }

    /// The script this call runs.
    pub(crate) fn script(&self) -> &Script {
        self.script
    }

    /// Loads the script (after `NOSCRIPT`).
    pub(crate) async fn load<C: ConnectionLike + Send>(&self, conn: &mut C) -> RedisResult<()> {
        self.script.load_async(conn).await.map(drop)
    }
}

/// The answer to one [`Evalsha::send`].
#[derive(Debug)]
pub(crate) struct Sent {
    /// What the script returned.
    pub(crate) value: Value,
    /// For a confirmed call, how many replicas acknowledged its writes (`WAIT`).
    pub(crate) replicas: Option<i64>,
}

/// Whether `e` is the server's `NOSCRIPT`: the script must be loaded and the call sent again.
pub(crate) fn is_noscript(e: &RedisError) -> bool {
    e.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scripts_take_keys_and_values_only_as_arguments() {
        for text in [
            CLAIM,
            RENEW,
            RELEASE,
            INSPECT,
            PASS,
            PERMIT_CLAIM,
            PERMIT_RENEW,
            PERMIT_RELEASE,
            PERMIT_LIST,
            PERMIT_PASS,
        ] {
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
            ("QUEUE_GRACE_MS", crate::wakeups::QUEUE_GRACE),
            (
                "HANDOFF_RESERVATION_MS",
                crate::wakeups::HANDOFF_RESERVATION,
            ),
        ] {
            let line = format!("local {name} = {} ", duration.as_millis());
            assert!(LOCK_PRELUDE.contains(&line), "{line}");
        }
        let hashes: std::collections::BTreeSet<_> = SCRIPTS
            .all()
            .iter()
            .map(|s| s.get_hash().to_owned())
            .collect();
        assert_eq!(hashes.len(), 10);
        let others = [crate::limit::script()]
            .into_iter()
            .chain(crate::idempotency::scripts());
        for script in SCRIPTS.all().into_iter().chain(others) {
            let text = SCRIPTS.text_of(script).expect("every script has its text");
            assert_eq!(Script::new(text).get_hash(), script.get_hash());
        }
        assert_eq!(SCRIPTS.text_of(&Script::new("return 1")), None);
        for text in [
            PERMIT_CLAIM,
            PERMIT_RENEW,
            PERMIT_RELEASE,
            PERMIT_LIST,
            PERMIT_PASS,
        ] {
            assert!(text[LOCK_PRELUDE.len()..].starts_with(PERMIT_PRELUDE));
        }
        let line = format!(
            "local PERMIT_RESERVATION_MS = {} ",
            crate::wakeups::HANDOFF_RESERVATION.as_millis()
        );
        assert!(PERMIT_PRELUDE.contains(&line), "{line}");
    }
}
