//! Reader-writer locks on the in-memory store: the conformance rules.

use baton_core::MemoryStore;
use baton_testkit::harness::Kept;

baton_core::rwlock_conformance_tests!(async { Kept::new(MemoryStore::new()) });
