//! The baseline of the SQLite figures: the store's round trips, done by hand.
//!
//! Same driver (rusqlite, the same build), same statements (`baton_sqlite::sql`), same
//! pragmas (`baton_sqlite::sql::pragmas`), same open flags and statement cache, same
//! transaction shape (`BEGIN IMMEDIATE`, a read of the store's clock, the statement,
//! `COMMIT`, each through the statement cache), and the same async-to-blocking hop (one
//! `spawn_blocking` per operation, with the connection taken from a mutex-guarded slot).
//! What it leaves out is what the store adds: its input types, its pool and semaphore,
//! error mapping, release signals and the `Claim` answer.

use std::path::Path;
use std::sync::{Arc, Mutex};

use baton_sqlite::{SqliteOptions, clock, sql};
use rusqlite::{Connection, OpenFlags, params};

/// One connection to a prepared baton file.
pub(crate) struct RawSqlite {
    conn: Arc<Mutex<Option<Connection>>>,
    key: Arc<str>,
}

impl RawSqlite {
    /// Opens `path`, which a `SqliteStore` has already created (schema and all), the way
    /// the store opens its connections.
    pub(crate) fn open(path: &Path, options: &SqliteOptions, key: &str) -> RawSqlite {
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(path, flags).expect("open the raw connection");
        conn.set_prepared_statement_cache_capacity(32);
        conn.execute_batch(&sql::pragmas(options))
            .expect("the store's pragmas");
        RawSqlite {
            conn: Arc::new(Mutex::new(Some(conn))),
            key: Arc::from(key),
        }
    }

    /// Runs `op` in one `BEGIN IMMEDIATE` transaction on a blocking thread.
    async fn transaction<T: Send + 'static>(
        &self,
        op: impl FnOnce(&Connection, &str, i64) -> T + Send + 'static,
    ) -> T {
        let (slot, key) = (Arc::clone(&self.conn), Arc::clone(&self.key));
        tokio::task::spawn_blocking(move || {
            let conn = slot
                .lock()
                .unwrap()
                .take()
                .expect("one operation at a time");
            conn.prepare_cached(sql::BEGIN_IMMEDIATE)
                .and_then(|mut s| s.execute([]))
                .expect("begin");
            let answer = op(&conn, &key, clock::now());
            conn.prepare_cached(sql::COMMIT)
                .and_then(|mut s| s.execute([]))
                .expect("commit");
            *slot.lock().unwrap() = Some(conn);
            answer
        })
        .await
        .expect("the blocking task")
    }

    /// One uncontended claim and release, as the store runs them: [`sql::GRANT`] returns
    /// the fence; [`sql::RELEASE`] changes one row.
    pub(crate) async fn pair(&self, holder: String, ttl_nanos: i64) {
        let claimant = holder.clone();
        let fence: i64 = self
            .transaction(move |conn, key, now| {
                conn.prepare_cached(sql::GRANT)
                    .and_then(|mut s| {
                        s.query_row(
                            params![
                                key,
                                claimant,
                                now,
                                ttl_nanos,
                                "",
                                clock::wall_micros(),
                                None::<String>
                            ],
                            |r| r.get(0),
                        )
                    })
                    .expect("an uncontended grant")
            })
            .await;
        assert!(fence > 0);
        let released = self
            .transaction(move |conn, key, now| {
                conn.prepare_cached(sql::RELEASE)
                    .and_then(|mut s| s.execute(params![key, holder, now]))
                    .expect("release")
            })
            .await;
        assert_eq!(released, 1, "the release freed the grant");
    }
}
