//! Elections on the Redis store (on the test binary's shared server, each rule in a namespace of its own): the conformance rules.

mod common;

baton_core::election_conformance_tests!(common::harness());
