//! The lock and lease conformance suite against a private three-member etcd cluster,
//! through a URL that names all three members.
//!
//! `reopen` is a new `EtcdStore` (new connections) on the same cluster; `evict` deletes the
//! grant's key with a raw client, as an operator's `etcdctl del` would.
//!
//! Every rule runs except five that expect a grant of 30 or 50 milliseconds to be gone
//! within about 100 (`fences_increase_after_expiry`,
//! `release_after_expiry_is_expired_and_spares_the_new_holder`,
//! `lease_release_reports_ownership`, `late_renewal_never_revives`, `inspect_and_list`):
//! etcd leases are whole seconds, so such a grant lasts a second on etcd (its holder still
//! stops believing in it after its own TTL). `tests/expiry.rs` checks what those rules
//! check with one-second grants.

mod common;

baton_core::__conformance_rules!(baton_core::conformance; common::harness();
    grant_and_release,
    contended_reports_the_holder,
    two_holders_never_overlap,
    fences_increase_across_grants,
    fences_increase_after_reopen,
    double_release_is_harmless,
    reentrant_attempt_fails,
    wait_zero_makes_one_attempt,
    waiter_wakes_on_release,
    waiter_wakes_on_expiry,
    no_waiter_starves,
    lost_fires_when_key_is_deleted,
    lost_fires_when_renewal_is_impossible,
    lost_fires_at_valid_until_without_keep_alive,
    keep_alive_holds_across_ttls,
    max_hold_stops_renewal,
    kept_until_expiry_stays_held_quietly,
    kept_for_holds_for_the_new_ttl,
    store_faults_are_unavailable_not_contention,
    invalid_input_is_rejected_before_io,
    dropped_guard_is_released_in_background,
    cancelled_acquire_leaves_no_lock,
    cancelled_release_still_releases,
    lease_reclaim_is_idempotent_and_extends,
    lease_keep_alive_signals_loss,
);
