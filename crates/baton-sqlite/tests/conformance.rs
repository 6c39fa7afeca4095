//! The conformance suite against the SQLite store, each test on its own temporary file.

mod common;

baton_core::conformance_tests!(async {
    baton_testkit::harness::Stores::new(common::TempFile::new("state/baton.db"))
});
