//! Test-only helpers of baton.
