//! Elections on the SQLite store: the conformance rules.

mod common;

baton_core::election_conformance_tests!(common::harness());
