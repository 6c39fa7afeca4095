//! [`Scope`]: what one idempotency record deduplicates, `(org, domain, key)`, validated.
//!
//! A scope is the unit "don't run this side effect twice for": the organisation (tenant,
//! account or user) it belongs to, the domain of the operation (`charges`, `webhooks.stripe`,
//! `notifications.new-booking`), and the caller's idempotency key (an event id, a booking id,
//! an `Idempotency-Key` header). Two scopes that differ in any part never see each other's
//! records.

use std::fmt;

use crate::error::{Error, Result};
use crate::key::{Key, KeyKind, MAX_KEY_BYTES, Namespace, StoreKey, check_text};

/// Longest organisation, in bytes of UTF-8.
pub const MAX_ORG_BYTES: usize = 120;
/// Longest domain, in bytes of UTF-8.
pub const MAX_DOMAIN_BYTES: usize = 120;
/// Longest idempotency key, in bytes of UTF-8 (the common limit of HTTP APIs' keys).
pub const MAX_IDEMPOTENCY_KEY_BYTES: usize = 255;

/// The `(org, domain, key)` a record deduplicates. Validated when built, so a `Scope` that
/// exists is valid and no store sees a bad one.
///
/// Every part is non-empty, without control characters, and within its limit
/// ([`MAX_ORG_BYTES`], [`MAX_DOMAIN_BYTES`], [`MAX_IDEMPOTENCY_KEY_BYTES`]). `org` and
/// `domain` may not contain `:`, which separates the parts in the stored key
/// `<namespace>:idempotency:<org>:<domain>:<key>`; the key may contain anything else.
///
/// # Examples
/// ```
/// use baton_core::idempotency::Scope;
///
/// let scope = Scope::new("org-42", "charges", "7f1c9a9e-card-retry")?;
/// assert_eq!(scope.key(), "7f1c9a9e-card-retry");
/// assert!(Scope::new("org:42", "charges", "k").is_err()); // ':' in org
/// # Ok::<(), baton_core::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Scope {
    org: String,
    domain: String,
    key: String,
}

impl Scope {
    /// Validates the three parts.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) naming the part and the
    /// rule it breaks.
    pub fn new(
        org: impl Into<String>,
        domain: impl Into<String>,
        key: impl Into<String>,
    ) -> Result<Self> {
        let (org, domain, key) = (org.into(), domain.into(), key.into());
        check_segment("org", &org, MAX_ORG_BYTES)?;
        check_segment("domain", &domain, MAX_DOMAIN_BYTES)?;
        check_text("idempotency key", &key, MAX_IDEMPOTENCY_KEY_BYTES)?;
        Ok(Scope { org, domain, key })
    }

    /// The organisation.
    pub fn org(&self) -> &str {
        &self.org
    }

    /// The domain.
    pub fn domain(&self) -> &str {
        &self.domain
    }

    /// The idempotency key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The stored key `<namespace>:idempotency:<org>:<domain>:<key>`.
    pub(crate) fn qualify(&self, namespace: &Namespace) -> StoreKey {
        // The parts' limits keep the joined key within MAX_KEY_BYTES, and each part passed
        // the key rules, so this cannot fail.
        let joined = Key::new(format!("{}:{}:{}", self.org, self.domain, self.key))
            .expect("a valid scope is a valid key");
        namespace.qualify(KeyKind::Idempotency, &joined)
    }
}

// The joined parts always fit in a key.
const _: () =
    assert!(MAX_ORG_BYTES + MAX_DOMAIN_BYTES + MAX_IDEMPOTENCY_KEY_BYTES + 2 <= MAX_KEY_BYTES);

/// The rules of `org` and `domain`: the key rules, a limit, and no `:`.
fn check_segment(field: &str, value: &str, max: usize) -> Result<()> {
    check_text(field, value, max)?;
    if value.contains(':') {
        return Err(Error::invalid_input(format!(
            "{field} {value:?} contains ':'; it separates the parts of the stored key, so only the idempotency key may contain it"
        )));
    }
    Ok(())
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.org, self.domain, self.key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scope_rules() {
        assert!(Scope::new("o", "d", "k").is_ok());
        assert!(Scope::new("o", "d", "a:b:c").is_ok(), "keys may hold ':'");
        for (org, domain, key, says) in [
            ("", "d", "k", "org is empty"),
            ("o", "", "k", "domain is empty"),
            ("o", "d", "", "idempotency key is empty"),
            ("o:x", "d", "k", "':'"),
            ("o", "d:x", "k", "':'"),
            ("o", "d", "k\n", "control character"),
        ] {
            let e = Scope::new(org, domain, key).unwrap_err();
            assert!(e.is_invalid_input(), "{e}");
            assert!(e.message().contains(says), "{e}");
        }
        assert!(Scope::new("o".repeat(121), "d", "k").is_err());
        assert!(Scope::new("o", "d".repeat(121), "k").is_err());
        assert!(Scope::new("o", "d", "k".repeat(256)).is_err());
    }

    #[test]
    fn the_longest_scope_is_a_valid_key() {
        let scope = Scope::new("o".repeat(120), "d".repeat(120), "k".repeat(255)).unwrap();
        let q = scope.qualify(&Namespace::default());
        assert!(q.as_str().starts_with("baton:idempotency:ooo"));
    }

    #[test]
    fn parts_cannot_run_into_each_other() {
        let ns = Namespace::default();
        let a = Scope::new("a", "b", "c:d").unwrap().qualify(&ns);
        let b = Scope::new("a", "b", "c").unwrap().qualify(&ns);
        assert_ne!(a, b);
        assert_eq!(a.as_str(), "baton:idempotency:a:b:c:d");
    }
}
