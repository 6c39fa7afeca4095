//! The cache conformance rules against the in-memory store.

use baton_core::MemoryStore;
use baton_testkit::harness::Kept;

baton_core::cache_conformance_tests!(async { Kept::new(MemoryStore::new()) });
