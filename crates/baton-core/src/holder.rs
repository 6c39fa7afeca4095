//! Holder identities: who a lease or lock is granted to.
//!
//! A lock's holder is a fresh random 128-bit token per acquisition ([`Holder::random`]), so
//! locks are non-reentrant and a stale handle can never release a newer grant. A lease's
//! holder is chosen by the caller and stable (an instance id), so re-claiming is idempotent.

use std::fmt;

use crate::error::Result;
use crate::key::check_text;

/// Longest holder id, in bytes of UTF-8.
pub const MAX_HOLDER_BYTES: usize = 256;

/// A validated holder id: non-empty, at most [`MAX_HOLDER_BYTES`] bytes, no control characters.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Holder(String);

impl Holder {
    /// Validates a caller-chosen holder id.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) naming the rule broken.
    pub fn new(holder: impl Into<String>) -> Result<Self> {
        let holder = holder.into();
        check_text("holder", &holder, MAX_HOLDER_BYTES)?;
        Ok(Holder(holder))
    }

    /// A fresh random 128-bit token, as 32 lower-case hex digits.
    pub fn random() -> Self {
        Holder(format!("{:032x}", rand::random::<u128>()))
    }

    /// Wraps a holder id a store read back from its own storage.
    pub fn from_stored(holder: String) -> Self {
        Holder(holder)
    }

    /// The holder id.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holder_rules() {
        assert!(Holder::new("worker-1").is_ok());
        assert!(Holder::new("").is_err());
        assert!(Holder::new("h".repeat(257)).is_err());
        assert!(Holder::new("h".repeat(256)).is_ok());
        assert!(Holder::new("a\rb").is_err());
    }

    #[test]
    fn random_holders_are_128_bit_and_distinct() {
        let a = Holder::random();
        let b = Holder::random();
        assert_eq!(a.as_str().len(), 32);
        assert!(a.as_str().chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
