//! The cache on the PostgreSQL store (an UNLOGGED table): the conformance rules, on the test
//! binary's shared server, each rule in a namespace of its own.

mod common;

use common::*;

baton_core::cache_conformance_tests!(harness());
