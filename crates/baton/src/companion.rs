//! State that the memory lease store has no room for, kept beside it.
//!
//! `memory://` hands out one [`MemoryStore`] per connection; capabilities whose memory
//! implementation is a separate type (idempotency records, claimable work) keep one instance
//! per memory store here, so every client handed out for one connection sees the same data
//! and another connection sees none of it.

use std::any::Any;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use baton_core::MemoryStore;

/// The `T` of `store`, made with `T::default()` on first use and shared by every later call
/// for the same store.
///
/// Entries sit beside a weak reference to the store they belong to (which also keeps its
/// address from being reused) and are dropped at the next lookup once that store is gone.
pub(crate) fn memory_companion<T>(store: &Arc<MemoryStore>) -> Arc<T>
where
    T: Default + Send + Sync + 'static,
{
    type Shared = Vec<(Weak<MemoryStore>, Arc<dyn Any + Send + Sync>)>;
    static SHARED: Mutex<Shared> = Mutex::new(Vec::new());
    let mut shared = SHARED.lock().unwrap_or_else(PoisonError::into_inner);
    shared.retain(|(owner, _)| owner.strong_count() > 0);
    let target = Arc::downgrade(store);
    let found = shared
        .iter()
        .filter(|(owner, _)| owner.ptr_eq(&target))
        .find_map(|(_, value)| value.clone().downcast::<T>().ok());
    if let Some(value) = found {
        return value;
    }
    let value = Arc::new(T::default());
    shared.push((target, value.clone()));
    value
}
