//! Where a grant lives in Redis: the key layout, its hash tag, and the wake-up channels.
//!
//! A qualified key `Q` (`<namespace>:<kind>:<key>`, see `baton::Namespace`) is stored as up
//! to three Redis keys that share one Redis Cluster slot:
//!
//! | Redis key | type | holds |
//! |---|---|---|
//! | `{Q}` | string, with a PX expiry | the live grant, `<fence>:<holder>[\n<reason>]`, or a handoff reservation `handoff:<store id>` |
//! | `{Q}:fence` | string, with a PX expiry | the fence counter |
//! | `{Q}:queue` | sorted set, with a PX expiry | the stores waiting for `Q`, oldest first |
//!
//! All start with `{Q`, so Redis Cluster hashes them on the same tag: the text between the
//! first `{` and the first `}` after it. That is all of `Q` when `Q` contains no `}`, and
//! the part of `Q` before its first `}` otherwise; either way the keys of one grant share
//! it. Different qualified keys never map to the same Redis key: grant keys end in `}`,
//! counter keys in `:fence` and queue keys in `:queue`, and stripping the wrapping gives
//! back `Q`.
//!
//! Each store instance listens on a channel of its own, [`wake_channel`]; a release tells only
//! the store whose turn it is (see `docs/redis.md`).

use baton_core::StoreKey;

/// The Redis key of `key`'s grant: `{Q}`.
pub(crate) fn grant_key(key: &StoreKey) -> String {
    format!("{{{}}}", key.as_str())
}

/// The Redis key of `key`'s fence counter: `{Q}:fence`.
pub(crate) fn fence_key(key: &StoreKey) -> String {
    format!("{{{}}}:fence", key.as_str())
}

/// The Redis key of the queue of stores waiting for `key`: `{Q}:queue`.
pub(crate) fn queue_key(key: &StoreKey) -> String {
    format!("{{{}}}:queue", key.as_str())
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
        assert_eq!(grant_key(&key), "{app:lock:jobs:nightly}");
        assert_eq!(fence_key(&key), "{app:lock:jobs:nightly}:fence");
        assert_eq!(queue_key(&key), "{app:lock:jobs:nightly}:queue");
        assert_eq!(from_grant_key(&grant_key(&key)), Some(key));
        assert_eq!(from_grant_key("{app:lock:x}:fence"), None);
        assert_eq!(from_grant_key("{app:lock:x}:queue"), None);
        assert_eq!(from_grant_key("{}"), None);
        assert_eq!(from_grant_key("plain"), None);
        assert_eq!(wake_channel(3, "ab12"), "baton:wake:3:ab12");
    }

    #[test]
    fn one_grant_shares_one_slot_whatever_braces_the_key_holds() {
        for user in ["plain", "a}b", "{x}", "}", "{", "a{b}c}d", "{}", "}}{{"] {
            let key = q(&format!("ns:lock:{user}"));
            let (grant, fence, queue) = (grant_key(&key), fence_key(&key), queue_key(&key));
            assert_eq!(slot(&grant), slot(&fence), "{user}");
            assert_eq!(slot(&grant), slot(&queue), "{user}");
            assert_eq!(from_grant_key(&grant), Some(key), "{user}");
        }
        // The tag is the qualified key, so different keys spread over the slots.
        assert_ne!(
            slot(&grant_key(&q("ns:lock:a"))),
            slot(&grant_key(&q("ns:lock:b")))
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
        let mut all: Vec<String> = keys.iter().map(|k| grant_key(&q(k))).collect();
        all.extend(keys.iter().map(|k| fence_key(&q(k))));
        all.extend(keys.iter().map(|k| queue_key(&q(k))));
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
