//! Where a grant lives in Redis: the key layout, its hash tag, and the wake-up channels.
//!
//! A qualified key `Q` (`<namespace>:<kind>:<key>`, see `baton::Namespace`) is stored as up
//! to four Redis keys that share one Redis Cluster slot:
//!
//! | Redis key | type | holds |
//! |---|---|---|
//! | `{Q}` | string, with a PX expiry | the live grant, `<fence>:<holder>[\n<reason>]`, or a handoff reservation `handoff:<store id>` |
//! | `{Q}:fence` | string, with a PX expiry | the fence counter |
//! | `{Q}:queue` | sorted set, with a PX expiry | the stores waiting for `Q`, oldest first |
//! | `{Q}:who` | hash, with a PX expiry | per queued store, the holder that waits and its TTL, `<ttl ms>:<holder>` |
//!
//! A semaphore's qualified key (kind `semaphore`, so never the same `Q` as a lock's) uses
//! `{Q}:fence` and `{Q}:queue` as a lock does, and instead of the grant string:
//!
//! | Redis key | type | holds |
//! |---|---|---|
//! | `{Q}:permits` | sorted set, with a PX expiry | the permits: member = holder, score = when it ends (server ms) |
//! | `{Q}:fences` | hash, with a PX expiry | the permits' fences: holder → fence; and the N each was claimed with: holder + `"\nn"` → N |
//!
//! All start with `{Q`, so Redis Cluster hashes them on the same tag: the text between the
//! first `{` and the first `}` after it. That is all of `Q` when `Q` contains no `}`, and
//! the part of `Q` before its first `}` otherwise; either way the keys of one grant share
//! it. Different qualified keys never map to the same Redis key: grant keys end in `}`,
//! counter keys in `:fence`, queue keys in `:queue`, waiting-holder keys in `:who`, permit keys in `:permits` and
//! permit-fence keys in `:fences`, and stripping the wrapping gives
//! back `Q`.
//!
//! Each store instance listens on a channel of its own, [`wake_channel`]; a release tells only
//! the store whose turn it is (see `docs/redis.md`).

use std::io::Write;

use baton_core::StoreKey;
use redis::{RedisWrite, ToRedisArgs, ToSingleRedisArg};

/// One of the Redis keys of a qualified key, written straight into a command's buffer (no
/// `String` per key per call): `{Q}` plus a suffix.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RedisKey<'a> {
    key: &'a StoreKey,
    suffix: &'static str,
}

impl RedisKey<'_> {
    /// The key as a `String`.
    #[cfg(test)]
    pub(crate) fn owned(self) -> String {
        format!("{{{}}}{}", self.key.as_str(), self.suffix)
    }
}

impl ToRedisArgs for RedisKey<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        let mut arg = out.writer_for_next_arg();
        // Writing into a command's buffer cannot fail.
        let _ = arg.write_all(b"{");
        let _ = arg.write_all(self.key.as_str().as_bytes());
        let _ = arg.write_all(b"}");
        let _ = arg.write_all(self.suffix.as_bytes());
    }
}

impl ToSingleRedisArg for RedisKey<'_> {}

/// The Redis key of `key`'s grant: `{Q}`.
pub(crate) fn grant(key: &StoreKey) -> RedisKey<'_> {
    RedisKey { key, suffix: "" }
}

/// The Redis key of `key`'s fence counter: `{Q}:fence`.
pub(crate) fn fence(key: &StoreKey) -> RedisKey<'_> {
    RedisKey {
        key,
        suffix: ":fence",
    }
}

/// The Redis key of the queue of stores waiting for `key`: `{Q}:queue`.
pub(crate) fn queue(key: &StoreKey) -> RedisKey<'_> {
    RedisKey {
        key,
        suffix: ":queue",
    }
}

/// The Redis key of the holders that wait in the queued stores of `key`: `{Q}:who`. The
/// release and pass scripts name it from the grant's key (see `lock_prelude.lua`).
pub(crate) fn who(key: &StoreKey) -> RedisKey<'_> {
    RedisKey {
        key,
        suffix: ":who",
    }
}

/// The Redis key of the live permits of semaphore `key`: `{Q}:permits` (a sorted set of
/// holders by when their permits end).
pub(crate) fn permits(key: &StoreKey) -> RedisKey<'_> {
    RedisKey {
        key,
        suffix: ":permits",
    }
}

/// The Redis key of the fences of the permits of semaphore `key`: `{Q}:fences` (a hash of
/// holder to fence).
pub(crate) fn fences(key: &StoreKey) -> RedisKey<'_> {
    RedisKey {
        key,
        suffix: ":fences",
    }
}

/// The qualified key of a grant's Redis key, or `None` for any other key.
pub(crate) fn from_grant_key(redis_key: &str) -> Option<StoreKey> {
    let inner = redis_key.strip_prefix('{')?.strip_suffix('}')?;
    (!inner.is_empty()).then(|| StoreKey::from_stored(inner.to_owned()))
}

/// A `SCAN MATCH` pattern for the grants whose qualified key starts with `prefix`.
pub(crate) fn grant_pattern(prefix: &str) -> String {
    let mut pattern = String::with_capacity(prefix.len() + 3);
    pattern.push('{');
    for c in prefix.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            pattern.push('\\');
        }
        pattern.push(c);
    }
    pattern.push_str("*}");
    pattern
}

/// The wake-up channel of the store with random id `id` on database `db`:
/// `baton:wake:<db>:<id>`. Pub/sub ignores database numbers, so the channel names the
/// database. The scripts also use it as the store's name in the queues.
pub(crate) fn wake_channel(db: i64, id: &str) -> String {
    format!("baton:wake:{db}:{id}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> StoreKey {
        StoreKey::from_stored(s.to_owned())
    }

    /// The hash slot Redis Cluster computes for a key: CRC16 (XMODEM) of its hash tag.
    fn slot(key: &str) -> u16 {
        let bytes = key.as_bytes();
        let tagged = match bytes.iter().position(|&b| b == b'{') {
            Some(open) => match bytes[open + 1..].iter().position(|&b| b == b'}') {
                Some(len) if len > 0 => &bytes[open + 1..open + 1 + len],
                _ => bytes,
            },
            None => bytes,
        };
        let mut crc: u16 = 0;
        for &b in tagged {
            crc ^= u16::from(b) << 8;
            for _ in 0..8 {
                crc = if crc & 0x8000 != 0 {
                    (crc << 1) ^ 0x1021
                } else {
                    crc << 1
                };
            }
        }
        crc % 16384
    }

    #[test]
    fn layout() {
        let key = q("app:lock:jobs:nightly");
        assert_eq!(grant(&key).owned(), "{app:lock:jobs:nightly}");
        assert_eq!(fence(&key).owned(), "{app:lock:jobs:nightly}:fence");
        assert_eq!(queue(&key).owned(), "{app:lock:jobs:nightly}:queue");
        assert_eq!(from_grant_key(&grant(&key).owned()), Some(key.clone()));
        assert_eq!(from_grant_key("{app:lock:x}:fence"), None);
        assert_eq!(from_grant_key("{app:lock:x}:queue"), None);
        assert_eq!(from_grant_key("{}"), None);
        assert_eq!(from_grant_key("plain"), None);
        assert_eq!(wake_channel(3, "ab12"), "baton:wake:3:ab12");
        // Written into a command, a key is the same bytes as its String.
        let mut cmd = redis::cmd("X");
        cmd.arg(grant(&key)).arg(fence(&key)).arg(queue(&key));
        let packed = String::from_utf8(cmd.get_packed_command()).unwrap();
        for expected in [
            grant(&key).owned(),
            fence(&key).owned(),
            queue(&key).owned(),
        ] {
            assert!(
                packed.contains(&format!("${}\r\n{expected}\r\n", expected.len())),
                "{packed:?}"
            );
        }
    }

    #[test]
    fn one_grant_shares_one_slot_whatever_braces_the_key_holds() {
        for user in ["plain", "a}b", "{x}", "}", "{", "a{b}c}d", "{}", "}}{{"] {
            let key = q(&format!("ns:lock:{user}"));
            let (g, f, q) = (
                grant(&key).owned(),
                fence(&key).owned(),
                queue(&key).owned(),
            );
            assert_eq!(slot(&g), slot(&f), "{user}");
            assert_eq!(slot(&g), slot(&q), "{user}");
            assert_eq!(slot(&g), slot(&permits(&key).owned()), "{user}");
            assert_eq!(slot(&g), slot(&fences(&key).owned()), "{user}");
            assert_eq!(from_grant_key(&g), Some(key), "{user}");
        }
        // The tag is the qualified key, so different keys spread over the slots.
        assert_ne!(
            slot(&grant(&q("ns:lock:a")).owned()),
            slot(&grant(&q("ns:lock:b")).owned())
        );
        // The reference value from the Redis Cluster specification.
        assert_eq!(slot("123456789"), 0x31C3);
    }

    #[test]
    fn grant_counter_and_queue_keys_never_collide() {
        let keys = [
            "ns:lock:a",
            "ns:lock:a}",
            "ns:lock:a}:fence",
            "ns:lock:a:fence",
            "ns:lock:a}:queue",
            "ns:lock:a:queue",
        ];
        let mut all: Vec<String> = keys.iter().map(|k| grant(&q(k)).owned()).collect();
        all.extend(keys.iter().map(|k| fence(&q(k)).owned()));
        all.extend(keys.iter().map(|k| queue(&q(k)).owned()));
        all.extend(keys.iter().map(|k| permits(&q(k)).owned()));
        all.extend(keys.iter().map(|k| fences(&q(k)).owned()));
        let unique: std::collections::BTreeSet<_> = all.iter().collect();
        assert_eq!(unique.len(), all.len(), "{all:?}");
    }

    #[test]
    fn patterns_escape_glob_characters() {
        assert_eq!(grant_pattern("ns:lock:"), "{ns:lock:*}");
        assert_eq!(
            grant_pattern("ns:lock:a*b?[c]\\"),
            "{ns:lock:a\\*b\\?\\[c\\]\\\\*}"
        );
    }
}
