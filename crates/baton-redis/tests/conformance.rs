//! The conformance suite against the Redis store, each test on its own private redis-server.
//!
//! `reopen` is a new `RedisStore` (new connections) on the same server; `evict` deletes the
//! grant and its fence counter with a raw connection, as an operator in `redis-cli` would.

mod common;

baton_core::conformance_tests!(common::harness());
