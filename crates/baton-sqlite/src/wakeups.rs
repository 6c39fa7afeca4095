//! One release hub per database file per process.
//!
//! Every [`SqliteStore`](crate::SqliteStore) on the same file in one process shares one
//! [`ReleaseHub`], found by the file's canonical path, so a release through one store wakes
//! the waiters of every other store on that file at once. Releases by other processes are
//! not pushed; waiters find them by polling.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use baton_core::signals::ReleaseHub;

fn registry() -> &'static Mutex<HashMap<PathBuf, Weak<ReleaseHub>>> {
    static HUBS: OnceLock<Mutex<HashMap<PathBuf, Weak<ReleaseHub>>>> = OnceLock::new();
    HUBS.get_or_init(Default::default)
}

/// The hub of the file at `canonical` (a path from `std::fs::canonicalize`).
pub(crate) fn hub_for(canonical: &Path) -> Arc<ReleaseHub> {
    let mut hubs = registry().lock().unwrap_or_else(|p| p.into_inner());
    if let Some(hub) = hubs.get(canonical).and_then(Weak::upgrade) {
        return hub;
    }
    hubs.retain(|_, hub| hub.strong_count() > 0);
    let hub = Arc::new(ReleaseHub::new());
    hubs.insert(canonical.to_owned(), Arc::downgrade(&hub));
    hub
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_hub_per_path_while_in_use() {
        let a = hub_for(Path::new("/hubs-test/a.db"));
        let again = hub_for(Path::new("/hubs-test/a.db"));
        assert!(Arc::ptr_eq(&a, &again));
        let b = hub_for(Path::new("/hubs-test/b.db"));
        assert!(!Arc::ptr_eq(&a, &b));
        drop((a, again));
        let fresh = hub_for(Path::new("/hubs-test/c.db"));
        let hubs = registry().lock().unwrap();
        assert!(
            !hubs.contains_key(Path::new("/hubs-test/a.db")),
            "unused hubs are dropped"
        );
        drop((hubs, b, fresh));
    }
}
