//! Collapsing concurrent fetches of one key within a process ("single flight").
//!
//! Callers of [`Cache::get_or_fetch`](crate::Cache::get_or_fetch) for the same store and key
//! join one [`Flight`]: they take its gate one at a time. The first finds the slot empty,
//! reads the store and, on a miss, fetches, then leaves the value's JSON in the slot; the
//! others find it there and neither read the store nor fetch. A fetch that fails leaves the
//! slot empty, so the next caller tries on its own (errors are not shared: the caller's
//! error type need not be `Clone`).
//!
//! Flights are registered process-wide by store and qualified key, so every [`Cache`]
//! handle on one store collapses with every other, and a flight is forgotten when its last
//! caller leaves.
//!
//! [`Cache`]: crate::Cache

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, Weak};

use tokio::sync::Mutex as AsyncMutex;

use crate::key::StoreKey;

/// A store's identity: the address of its shared allocation, which cannot be reused while a
/// caller in a flight holds the store.
pub(crate) type StoreId = usize;

type Registry = Mutex<HashMap<(StoreId, StoreKey), Weak<Flight>>>;

static FLIGHTS: LazyLock<Registry> = LazyLock::new(|| Mutex::new(HashMap::new()));

fn registry() -> std::sync::MutexGuard<'static, HashMap<(StoreId, StoreKey), Weak<Flight>>> {
    FLIGHTS.lock().unwrap_or_else(|p| p.into_inner())
}

/// One key's fetch, shared by the callers waiting on it.
#[derive(Debug, Default)]
pub(crate) struct Flight {
    /// The value's JSON once someone fetched (or read) it.
    pub(crate) slot: AsyncMutex<Option<Vec<u8>>>,
}

/// A caller's membership in a flight; leaving forgets the flight when nobody else is in it.
#[derive(Debug)]
pub(crate) struct Ticket {
    flight: Arc<Flight>,
    id: (StoreId, StoreKey),
}

impl Ticket {
    /// Joins the flight of `key` on `store`, starting one if there is none.
    pub(crate) fn join(store: StoreId, key: &StoreKey) -> Ticket {
        let id = (store, key.clone());
        let mut flights = registry();
        let flight = match flights.get(&id).and_then(Weak::upgrade) {
            Some(flight) => flight,
            None => {
                let flight = Arc::new(Flight::default());
                flights.insert(id.clone(), Arc::downgrade(&flight));
                flight
            }
        };
        Ticket { flight, id }
    }

    pub(crate) fn flight(&self) -> &Flight {
        &self.flight
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut flights = registry();
        // Joining upgrades under the same lock, so nobody can join between this check and
        // the removal.
        if Arc::strong_count(&self.flight) == 1
            && flights
                .get(&self.id)
                .is_some_and(|w| Weak::ptr_eq(w, &Arc::downgrade(&self.flight)))
        {
            flights.remove(&self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> StoreKey {
        StoreKey::from_stored(s.to_owned())
    }

    #[test]
    fn callers_share_a_flight_until_the_last_leaves() {
        let a = Ticket::join(1, &key("flight-test:a"));
        let b = Ticket::join(1, &key("flight-test:a"));
        assert!(Arc::ptr_eq(&a.flight, &b.flight));
        let other_store = Ticket::join(2, &key("flight-test:a"));
        assert!(!Arc::ptr_eq(&a.flight, &other_store.flight));
        drop(a);
        assert!(registry().contains_key(&(1, key("flight-test:a"))));
        drop(b);
        assert!(!registry().contains_key(&(1, key("flight-test:a"))));
        drop(other_store);
        assert!(!registry().contains_key(&(2, key("flight-test:a"))));
    }
}
