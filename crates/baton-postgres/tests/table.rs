//! Stream locks kept in columns of the user's own table ([`TableLeases`]), on a table these
//! tests create the way the stream-locking document describes it: a cursor row per
//! (stream, perspective) with nullable holder, expiry and reason columns (and, here, a
//! fence column).

mod common;

use std::sync::Arc;
use std::time::Duration;

use baton_core::{ClaimResult, ErrorKind, LeaseOptions, RemoveResult, Renewal};
use baton_postgres::{PostgresStore, TableLeaseColumns, TableLeases};
use sqlx::Row;
use tokio::sync::Barrier;

use common::*;

const STREAM: &str = "0b9e4a1c-5f3d-4c1e-9d8a-2f6b7c8d9e0f";
const OTHER_STREAM: &str = "1c0f5b2d-6a4e-4d2f-8e9b-3a7c8d9e0f1a";
const INSTANCE_A: &str = "6f1c2d3e-4b5a-4978-8a6b-5c4d3e2f1a0b";
const INSTANCE_B: &str = "7a2d3e4f-5c6b-4a89-9b7c-6d5e4f3a2b1c";

const CURSORS: &str = "\
CREATE TABLE wh_perspective_cursors (
    stream_id               uuid        NOT NULL,
    perspective_name        text        NOT NULL,
    last_event_id           bigint,
    stream_lock_instance_id uuid,
    stream_lock_expiry      timestamptz,
    stream_lock_reason      varchar(50),
    stream_lock_fence       bigint,
    PRIMARY KEY (stream_id, perspective_name)
)";

/// A database of this test's own with the cursor table and two rows in it, and a store on
/// it.
async fn setup(name: &str) -> (String, PostgresStore) {
    let server = shared().await;
    let name = format!("{name}_{:08x}", rand::random::<u32>());
    let url = blocking(move || server.create_database(&name))
        .await
        .expect("a database of the test's own");
    let mut conn = raw(&url).await;
    sqlx::query(CURSORS).execute(&mut conn).await.unwrap();
    for stream in [STREAM, OTHER_STREAM] {
        sqlx::query(
            "INSERT INTO wh_perspective_cursors (stream_id, perspective_name) VALUES ($1::uuid, 'OrderPerspective')",
        )
        .bind(stream)
        .execute(&mut conn)
        .await
        .unwrap();
    }
    let store = connect(&url).await;
    (url, store)
}

fn columns() -> TableLeaseColumns {
    TableLeaseColumns::new("public.wh_perspective_cursors")
        .key_columns(["stream_id", "perspective_name"])
        .holder_column("stream_lock_instance_id")
        .expiry_column("stream_lock_expiry")
        .reason_column("stream_lock_reason")
        .fence_column("stream_lock_fence")
}

const KEY: [&str; 2] = [STREAM, "OrderPerspective"];

/// The lock columns of the row, as text: holder, reason, fence, and whether the expiry is
/// in the future.
async fn row(url: &str) -> (Option<String>, Option<String>, Option<i64>, Option<bool>) {
    let mut conn = raw(url).await;
    let row = sqlx::query(
        "SELECT stream_lock_instance_id::text AS holder, stream_lock_reason::text AS reason, stream_lock_fence AS fence,
                stream_lock_expiry > clock_timestamp() AS live
         FROM wh_perspective_cursors WHERE stream_id = $1::uuid AND perspective_name = 'OrderPerspective'",
    )
    .bind(STREAM)
    .fetch_one(&mut conn)
    .await
    .unwrap();
    (
        row.get("holder"),
        row.get("reason"),
        row.get("fence"),
        row.get("live"),
    )
}

fn claimed(result: ClaimResult) -> baton_core::Fence {
    match result {
        ClaimResult::Claimed { fence, .. } => fence,
        other => panic!("expected the lock, got {other:?}"),
    }
}

/// Claim, skip when held, idempotent re-claim, renew, release, and a new grant with a larger
/// fence: each one conditional `UPDATE` of the user's row, with the same answers as
/// `Leases`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_lives_in_the_users_row() {
    let (url, store) = setup("rows").await;
    let locks = TableLeases::new(&store, columns()).await.unwrap();
    let statements = locks.statements();
    for statement in [&statements.claim, &statements.renew, &statements.release] {
        assert_eq!(statement.matches("UPDATE").count(), 1, "{statement}");
        assert!(statement.contains("\"public\".\"wh_perspective_cursors\""));
        assert!(!statement.contains("now()"), "{statement}");
    }
    let ttl = Duration::from_secs(30);

    let fence = claimed(
        locks
            .claim(&KEY, INSTANCE_A, &LeaseOptions::new(ttl).reason("rewind"))
            .await
            .unwrap(),
    );
    assert!(fence.get() > 0);
    let (holder, reason, stored_fence, live) = row(&url).await;
    assert_eq!(holder.as_deref(), Some(INSTANCE_A));
    assert_eq!(reason.as_deref(), Some("rewind"));
    assert_eq!(stored_fence, Some(fence.get() as i64));
    assert_eq!(live, Some(true));

    match locks
        .claim(
            &KEY,
            INSTANCE_B,
            &LeaseOptions::new(ttl).reason("bootstrap"),
        )
        .await
        .unwrap()
    {
        ClaimResult::HeldBy { holder, .. } => assert_eq!(holder, INSTANCE_A),
        other => panic!("instance B must skip the stream: {other:?}"),
    }
    // The same instance again: idempotent, same fence (upper-case uuid text is the same
    // uuid).
    let again = claimed(
        locks
            .claim(
                &KEY,
                &INSTANCE_A.to_uppercase(),
                &LeaseOptions::new(ttl).reason("rewind"),
            )
            .await
            .unwrap(),
    );
    assert_eq!(again, fence);
    assert_eq!(
        locks.renew(&KEY, INSTANCE_A, ttl).await.unwrap(),
        Renewal::Renewed
    );
    assert_eq!(
        locks.renew(&KEY, INSTANCE_B, ttl).await.unwrap(),
        Renewal::NotHeld
    );
    let info = locks.inspect(&KEY).await.unwrap().expect("locked");
    assert_eq!(info.holder, INSTANCE_A);
    assert_eq!(info.reason, "rewind");
    assert_eq!(info.fence, fence);
    assert!(info.remaining > Duration::from_secs(20));
    // The other row is untouched and free.
    assert!(
        locks
            .inspect(&[OTHER_STREAM, "OrderPerspective"])
            .await
            .unwrap()
            .is_none()
    );

    // Only the holder releases; releasing clears the columns.
    assert_eq!(
        locks.release(&KEY, INSTANCE_B).await.unwrap(),
        RemoveResult::Reclaimed {
            by: INSTANCE_A.into()
        }
    );
    assert_eq!(
        locks.release(&KEY, INSTANCE_A).await.unwrap(),
        RemoveResult::Removed {
            holder: INSTANCE_A.into()
        }
    );
    let (holder, reason, stored_fence, live) = row(&url).await;
    assert_eq!((holder, reason, live), (None, None, None));
    assert_eq!(stored_fence, Some(fence.get() as i64), "the fence is kept");
    assert_eq!(
        locks.release(&KEY, INSTANCE_A).await.unwrap(),
        RemoveResult::NoHolder
    );
    assert!(locks.inspect(&KEY).await.unwrap().is_none());

    let next = claimed(
        locks
            .claim(&KEY, INSTANCE_B, &LeaseOptions::new(ttl).reason("purge"))
            .await
            .unwrap(),
    );
    assert!(next > fence, "{next} after {fence}");
}

/// An expired lock is taken by the next instance, with a larger fence; the late holder's
/// renewal finds it gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_lock_is_taken_over() {
    let (_url, store) = setup("expiry").await;
    let locks = TableLeases::new(&store, columns()).await.unwrap();
    let first = claimed(
        locks
            .claim(
                &KEY,
                INSTANCE_A,
                &LeaseOptions::new(Duration::from_millis(200)).reason("rewind"),
            )
            .await
            .unwrap(),
    );
    eventually("the lock to expire", || async {
        locks.inspect(&KEY).await.unwrap().is_none().then_some(())
    })
    .await;
    let second = claimed(
        locks
            .claim(
                &KEY,
                INSTANCE_B,
                &LeaseOptions::new(Duration::from_secs(30)).reason("bootstrap"),
            )
            .await
            .unwrap(),
    );
    assert!(second > first);
    assert_eq!(
        locks
            .renew(&KEY, INSTANCE_A, Duration::from_secs(30))
            .await
            .unwrap(),
        Renewal::NotHeld
    );
}

/// Keep-alive holds the lock across several TTLs, and fires `lost` when someone else
/// overwrites the row's lock columns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_holds_and_reports_loss() {
    let (url, store) = setup("keepalive").await;
    let locks = TableLeases::new(&store, columns()).await.unwrap();
    let ttl = Duration::from_millis(1500);
    claimed(
        locks
            .claim(&KEY, INSTANCE_A, &LeaseOptions::new(ttl).reason("rewind"))
            .await
            .unwrap(),
    );
    let invalid = locks
        .keep_alive(
            &KEY,
            INSTANCE_A,
            &LeaseOptions::new(ttl).keep_alive(Duration::from_millis(750)),
        )
        .await
        .unwrap_err();
    assert!(
        invalid.is_invalid_input(),
        "interval must be < ttl / 2: {invalid}"
    );
    let keep = locks
        .keep_alive(
            &KEY,
            INSTANCE_A,
            &LeaseOptions::new(ttl).keep_alive(Duration::from_millis(250)),
        )
        .await
        .unwrap()
        .expect("the lease is held");
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(!keep.is_lost(), "renewed across TTLs");
    assert!(matches!(
        locks
            .claim(&KEY, INSTANCE_B, &LeaseOptions::new(ttl))
            .await
            .unwrap(),
        ClaimResult::HeldBy { .. }
    ));

    let mut conn = raw(&url).await;
    sqlx::query(
        "UPDATE wh_perspective_cursors SET stream_lock_instance_id = $1::uuid WHERE stream_id = $2::uuid",
    )
    .bind(INSTANCE_B)
    .bind(STREAM)
    .execute(&mut conn)
    .await
    .unwrap();
    within("lost", keep.lost()).await;
}

/// Exactly one of many instances claiming one row at the same moment gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_claims_of_one_row_grant_one() {
    let (_url, store) = setup("race").await;
    let locks = Arc::new(TableLeases::new(&store, columns()).await.unwrap());
    const CLAIMERS: usize = 16;
    let barrier = Arc::new(Barrier::new(CLAIMERS));
    let tasks: Vec<_> = (0..CLAIMERS)
        .map(|i| {
            let (locks, barrier) = (Arc::clone(&locks), Arc::clone(&barrier));
            tokio::spawn(async move {
                let instance = format!("00000000-0000-4000-8000-{i:012}");
                barrier.wait().await;
                locks
                    .claim(
                        &KEY,
                        &instance,
                        &LeaseOptions::new(Duration::from_secs(30)).reason("rewind"),
                    )
                    .await
            })
        })
        .collect();
    let mut winners = 0;
    for task in tasks {
        if let ClaimResult::Claimed { .. } = within("a claim", task).await.unwrap().unwrap() {
            winners += 1;
        }
    }
    assert_eq!(winners, 1);
}

/// Without reason and fence columns the lock still works; grants carry fence 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reason_and_fence_columns_are_optional() {
    let (_url, store) = setup("minimal").await;
    let locks = TableLeases::new(
        &store,
        TableLeaseColumns::new("wh_perspective_cursors")
            .key_columns(["perspective_name", "stream_id"])
            .holder_column("stream_lock_instance_id")
            .expiry_column("stream_lock_expiry"),
    )
    .await
    .unwrap();
    let key = ["OrderPerspective", STREAM];
    let fence = claimed(
        locks
            .claim(
                &key,
                INSTANCE_A,
                &LeaseOptions::new(Duration::from_secs(30)).reason("rewind"),
            )
            .await
            .unwrap(),
    );
    assert_eq!(fence.get(), 0, "no fence column, no fence");
    let info = locks.inspect(&key).await.unwrap().unwrap();
    assert_eq!(info.reason, "");
    assert!(matches!(
        locks.release(&key, INSTANCE_A).await.unwrap(),
        RemoveResult::Removed { .. }
    ));
}

/// Bad keys and values are `InvalidInput` and change nothing: a key with the wrong number
/// of parts or a `/` where the join could not split it back, a row that does not exist, a
/// holder that is not a uuid for a uuid column, a reason longer than the column.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_keys_and_values_are_invalid_input() {
    let (url, store) = setup("values").await;
    let locks = TableLeases::new(&store, columns()).await.unwrap();
    let ttl = Duration::from_secs(30);
    for (key, needle) in [
        (vec![STREAM], "2 part(s)"),
        (vec![STREAM, "OrderPerspective", "x"], "2 part(s)"),
        (vec!["a/b", "OrderPerspective"], "contains '/'"),
        (vec![STREAM, ""], "empty"),
        (
            vec!["99999999-9999-4999-8999-999999999999", "OrderPerspective"],
            "no row",
        ),
    ] {
        let e = locks
            .claim(&key, INSTANCE_A, &LeaseOptions::new(ttl))
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{key:?}: {e}");
        assert!(e.message().contains(needle), "{key:?}: {e}");
    }
    let not_uuid = locks
        .claim(&KEY, "worker-1", &LeaseOptions::new(ttl))
        .await
        .unwrap_err();
    assert_eq!(not_uuid.kind(), ErrorKind::InvalidInput, "{not_uuid}");
    let long = locks
        .claim(
            &KEY,
            INSTANCE_A,
            &LeaseOptions::new(ttl).reason("r".repeat(60)),
        )
        .await
        .unwrap_err();
    assert_eq!(long.kind(), ErrorKind::InvalidInput, "{long}");
    assert_eq!(row(&url).await.0, None, "nothing was changed");
}

/// The table and columns are checked when the leases are built.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_table_is_checked_when_built() {
    let (url, store) = setup("catalog").await;
    let mut conn = raw(&url).await;
    sqlx::query(
        "CREATE TABLE loose (id text, holder text NOT NULL, expiry timestamp, fence integer, expiry_tz timestamptz, holder_ok text)",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    let loose = |holder: &str, expiry: &str| {
        TableLeaseColumns::new("loose")
            .key_columns(["id"])
            .holder_column(holder)
            .expiry_column(expiry)
    };
    for (columns, needle) in [
        (
            TableLeaseColumns::new("nope")
                .key_columns(["id"])
                .holder_column("h")
                .expiry_column("e"),
            "does not exist",
        ),
        (loose("holder_ok", "missing"), "has no column"),
        (loose("holder", "expiry_tz"), "NOT NULL"),
        (loose("holder_ok", "expiry"), "must be timestamptz"),
        (
            loose("holder_ok", "expiry_tz").fence_column("fence"),
            "must be bigint",
        ),
        (
            loose("holder_ok", "expiry_tz"),
            "not its primary key or a unique index",
        ),
        (
            columns().key_columns(["stream_id"]),
            "not its primary key or a unique index",
        ),
    ] {
        let e = TableLeases::new(&store, columns.clone()).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{columns:?}: {e}");
        assert!(e.message().contains(needle), "{needle}: {e}");
    }
}

/// `Baton::table_leases` reaches the leases of the user's table from a `baton::connect`ed
/// store, without naming this crate: the same rows, the same answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_facade_hands_out_table_leases() {
    let (url, _store) = setup("facade").await;
    let baton = baton::connect(&url).await.unwrap();
    let locks = baton
        .table_leases(
            baton::lease::TableLeaseColumns::new("public.wh_perspective_cursors")
                .key_columns(["stream_id", "perspective_name"])
                .holder_column("stream_lock_instance_id")
                .expiry_column("stream_lock_expiry")
                .reason_column("stream_lock_reason")
                .fence_column("stream_lock_fence"),
        )
        .await
        .unwrap();
    let ttl = Duration::from_secs(30);
    let fence = claimed(
        locks
            .claim(&KEY, INSTANCE_A, &LeaseOptions::new(ttl).reason("rewind"))
            .await
            .unwrap(),
    );
    let (holder, reason, stored_fence, live) = row(&url).await;
    assert_eq!(holder.as_deref(), Some(INSTANCE_A));
    assert_eq!(reason.as_deref(), Some("rewind"));
    assert_eq!(stored_fence, Some(fence.get() as i64));
    assert_eq!(live, Some(true));
    assert!(matches!(
        locks
            .claim(
                &KEY,
                INSTANCE_B,
                &LeaseOptions::new(ttl).reason("bootstrap")
            )
            .await
            .unwrap(),
        ClaimResult::HeldBy { .. }
    ));
    assert!(matches!(
        locks.release(&KEY, INSTANCE_A).await.unwrap(),
        RemoveResult::Removed { .. }
    ));
    // The columns are checked through the facade too.
    let e = baton
        .table_leases(
            columns()
                .fence_column("last_event_id")
                .holder_column("nope"),
        )
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
}
