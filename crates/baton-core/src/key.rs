//! Validated keys and namespaces, and the qualified key a store sees.
//!
//! Every key a store holds is `<namespace>:<kind>:<key>`, so one shared Redis or database
//! never mixes locks with caches, or one application's keys with another's. Validation
//! happens here, before any I/O: a [`Key`] or [`Namespace`] that exists is valid.

use std::fmt;

use crate::error::{Error, Result};

/// Longest key, in bytes of UTF-8.
pub const MAX_KEY_BYTES: usize = 512;
/// Longest namespace, in bytes of UTF-8.
pub const MAX_NAMESPACE_BYTES: usize = 64;
/// The namespace used when none is configured.
pub const DEFAULT_NAMESPACE: &str = "baton";

/// Checks the rules shared by keys, namespaces and holder ids: non-empty, at most `max`
/// bytes, no control characters. `field` names the input in the error.
pub(crate) fn check_text(field: &str, value: &str, max: usize) -> Result<()> {
    if value.is_empty() {
        return Err(Error::invalid_input(format!("{field} is empty")));
    }
    if value.len() > max {
        return Err(Error::invalid_input(format!(
            "{field} is {} bytes long; the limit is {max} bytes",
            value.len()
        )));
    }
    if let Some((at, c)) = value.char_indices().find(|(_, c)| c.is_control()) {
        return Err(Error::invalid_input(format!(
            "{field} contains the control character {:?} at byte {at}; control characters are not allowed",
            c
        )));
    }
    Ok(())
}

/// A user's key: non-empty, at most [`MAX_KEY_BYTES`] bytes, no control characters.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(String);

impl Key {
    /// Validates `key`.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) naming the rule broken.
    pub fn new(key: impl Into<String>) -> Result<Self> {
        let key = key.into();
        check_text("key", &key, MAX_KEY_BYTES)?;
        Ok(Key(key))
    }

    /// The key as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A namespace: like a key, but at most [`MAX_NAMESPACE_BYTES`] bytes and without `:`.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Namespace(String);

impl Namespace {
    /// Validates `namespace`.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) naming the rule broken.
    pub fn new(namespace: impl Into<String>) -> Result<Self> {
        let namespace = namespace.into();
        check_text("namespace", &namespace, MAX_NAMESPACE_BYTES)?;
        if namespace.contains(':') {
            return Err(Error::invalid_input(format!(
                "namespace {namespace:?} contains ':'; the namespace is the first segment of every stored key and may not contain the separator"
            )));
        }
        Ok(Namespace(namespace))
    }

    /// The namespace as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The qualified key `<namespace>:<kind>:<key>`.
    pub fn qualify(&self, kind: KeyKind, key: &Key) -> StoreKey {
        StoreKey(format!("{}:{}:{}", self.0, kind.as_str(), key.as_str()))
    }

    /// The qualified prefix `<namespace>:<kind>:<prefix>` for listing. `prefix` may be empty;
    /// otherwise it follows the key rules.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) for a prefix a key could not start with.
    pub fn qualify_prefix(&self, kind: KeyKind, prefix: &str) -> Result<String> {
        if !prefix.is_empty() {
            check_text("prefix", prefix, MAX_KEY_BYTES)?;
        }
        Ok(format!("{}:{}:{}", self.0, kind.as_str(), prefix))
    }
}

impl Default for Namespace {
    fn default() -> Self {
        Namespace(DEFAULT_NAMESPACE.to_owned())
    }
}

impl fmt::Debug for Namespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for Namespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The smallest string greater than every string that starts with `prefix`, in code point
/// order (byte order of UTF-8: PostgreSQL's `COLLATE "C"`, SQLite's binary collation), or
/// `None` when there is none. SQL stores turn a prefix listing into the index range
/// `key >= prefix AND key < bound`.
pub fn prefix_upper_bound(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        let next = match last as u32 {
            // The surrogates are not chars: the next one after U+D7FF is U+E000.
            0xD7FF => Some('\u{E000}'),
            n => char::from_u32(n + 1),
        };
        if let Some(next) = next {
            chars.push(next);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

/// Which primitive a stored key belongs to; the middle segment of a qualified key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum KeyKind {
    /// [`Locks`](crate::Locks).
    Lock,
    /// [`Leases`](crate::Leases).
    Lease,
    /// [`IdempotencyLog`](crate::idempotency::IdempotencyLog) records.
    Idempotency,
    /// [`RateLimiter`](crate::RateLimiter).
    Limit,
    /// [`Cache`](crate::Cache).
    Cache,
    /// [`Broadcast`](crate::Broadcast) channels.
    Broadcast,
    /// [`Queue`](crate::work::Queue)s of claimable work items.
    Queue,
    /// [`Scheduler`](crate::work::Scheduler) entries.
    Schedule,
    /// [`Migrations`](crate::work::Migrations) sets.
    Migration,
    /// [`Semaphore`](crate::Semaphore)s.
    Semaphore,
    /// [`Election`](crate::Election)s.
    Election,
    /// The permits of [`RwLock`](crate::RwLock)s: one per reader, one for the writer.
    RwLock,
    /// The gates of [`RwLock`](crate::RwLock)s: the lock a writer holds to keep new readers out.
    RwGate,
}

impl KeyKind {
    /// The segment as stored.
    pub fn as_str(self) -> &'static str {
        match self {
            KeyKind::Lock => "lock",
            KeyKind::Lease => "lease",
            KeyKind::Idempotency => "idempotency",
            KeyKind::Limit => "limit",
            KeyKind::Cache => "cache",
            KeyKind::Broadcast => "broadcast",
            KeyKind::Queue => "queue",
            KeyKind::Schedule => "schedule",
            KeyKind::Migration => "migration",
            KeyKind::Semaphore => "semaphore",
            KeyKind::Election => "election",
            KeyKind::RwLock => "rwlock",
            KeyKind::RwGate => "rwgate",
        }
    }
}

/// A fully qualified key, `<namespace>:<kind>:<key>`: what stores read and write.
///
/// Only [`Namespace::qualify`] makes one (and stores, when they read keys back), so a
/// store never sees an unvalidated key.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StoreKey(String);

impl StoreKey {
    /// Wraps a key a store read back from its own storage. It was validated when written.
    pub fn from_stored(qualified: String) -> Self {
        StoreKey(qualified)
    }

    /// The qualified key.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The user's key: everything after `<namespace>:<kind>:`.
    pub fn user_key(&self) -> &str {
        let mut parts = self.0.splitn(3, ':');
        let _namespace = parts.next();
        let _kind = parts.next();
        parts.next().unwrap_or("")
    }
}

impl fmt::Debug for StoreKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for StoreKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn prefix_upper_bounds() {
        assert_eq!(
            prefix_upper_bound("ns:lock:a").as_deref(),
            Some("ns:lock:b")
        );
        assert_eq!(prefix_upper_bound(""), None);
        assert_eq!(
            prefix_upper_bound("a\u{D7FF}").as_deref(),
            Some("a\u{E000}")
        );
        assert_eq!(prefix_upper_bound("a\u{10FFFF}").as_deref(), Some("b"));
        assert_eq!(prefix_upper_bound("\u{10FFFF}\u{10FFFF}"), None);
        // Every string with the prefix sorts below the bound, in byte order too.
        let bound = prefix_upper_bound("ns:q\u{FFFF}").unwrap();
        for s in ["ns:q\u{FFFF}", "ns:q\u{FFFF}\u{10FFFF}", "ns:q\u{FFFF}zzz"] {
            assert!(s.as_bytes() < bound.as_bytes(), "{s:?} < {bound:?}");
        }
    }

    #[test]
    fn key_rules() {
        assert!(Key::new("orders:42").is_ok());
        assert!(Key::new("ключ").is_ok());
        let empty = Key::new("").unwrap_err();
        assert_eq!(empty.kind(), ErrorKind::InvalidInput);
        assert!(empty.message().contains("key is empty"));
        let long = Key::new("k".repeat(513)).unwrap_err();
        assert!(long.message().contains("513 bytes"), "{long}");
        assert!(long.message().contains("512"), "{long}");
        assert!(Key::new("k".repeat(512)).is_ok());
        // 171 three-byte characters = 513 bytes: the limit is bytes, not characters.
        assert!(Key::new("€".repeat(171)).is_err());
        let ctl = Key::new("a\nb").unwrap_err();
        assert!(ctl.message().contains("control character"), "{ctl}");
        assert!(Key::new("a\u{7f}b").is_err());
    }

    #[test]
    fn namespace_rules() {
        assert!(Namespace::new("billing").is_ok());
        assert!(Namespace::new("").is_err());
        assert!(Namespace::new("a".repeat(65)).is_err());
        assert!(Namespace::new("a".repeat(64)).is_ok());
        let colon = Namespace::new("a:b").unwrap_err();
        assert!(colon.message().contains("':'"), "{colon}");
        assert!(Namespace::new("a\tb").is_err());
    }

    #[test]
    fn qualified_keys() {
        let ns = Namespace::new("app").unwrap();
        let key = Key::new("jobs:nightly").unwrap();
        let q = ns.qualify(KeyKind::Lock, &key);
        assert_eq!(q.as_str(), "app:lock:jobs:nightly");
        assert_eq!(q.user_key(), "jobs:nightly");
        assert_eq!(ns.qualify_prefix(KeyKind::Lease, "").unwrap(), "app:lease:");
        assert!(ns.qualify_prefix(KeyKind::Lease, "a\u{0}").is_err());
    }
}
