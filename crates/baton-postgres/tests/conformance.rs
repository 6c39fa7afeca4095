//! The conformance suite against the PostgreSQL store, on one private server per test
//! binary (every rule works in a fresh namespace).
//!
//! `reopen` is a new `PostgresStore` (new pool, new LISTEN connection) on the same
//! database; `evict` deletes the grant's row with a connection of its own, as an operator in
//! `psql` would (the fence sequence keeps the next grant's fence above it).

mod common;

baton_core::conformance_tests!(common::harness());
