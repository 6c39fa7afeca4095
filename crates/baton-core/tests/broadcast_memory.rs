//! The broadcast conformance rules against the in-memory store (an in-process bus).

use baton_core::MemoryStore;
use baton_testkit::harness::Kept;

baton_core::broadcast_conformance_tests!(async { Kept::new(MemoryStore::new()) });
