//! Leases: [`Baton::leases`](crate::Baton::leases) and the types it hands out (re-exported
//! from `baton-core`).
//!
//! A lease has a caller-chosen stable [`Holder`] (an instance id), so a re-claim by the same
//! holder extends it. Stream locks are leases keyed by [`stream_key`] with a reason checked
//! by [`check_reason`]. See `docs/locks-and-leases.md`.

pub use baton_core::{
    ClaimResult, Holder, KeptClaim, LeaseInfo, LeaseKeepAlive, LeaseOptions, Leases,
    MAX_HOLDER_BYTES, MAX_REASON_BYTES, RemoveResult, Renewal, check_reason, stream_key,
};
#[cfg(feature = "postgres")]
pub use baton_postgres::{TableLeaseColumns, TableLeases, TableStatements};

#[cfg(feature = "postgres")]
impl crate::Baton {
    /// Leases kept in columns of a PostgreSQL table of your own (the storage model of stream
    /// locks: the lock of a row lives in that row), over this connection's store. The table
    /// and columns are checked against the catalog before this returns. See [`TableLeases`].
    ///
    /// # Errors
    /// `Unsupported` when the store is not PostgreSQL; `InvalidInput` for bad table or column
    /// names, or columns of the wrong type or nullability; `Unavailable` when the catalog
    /// cannot be read.
    ///
    /// # Examples
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> baton::Result<()> {
    /// use std::time::Duration;
    /// use baton::lease::{ClaimResult, LeaseOptions, TableLeaseColumns};
    ///
    /// let baton = baton::connect("postgres://app@db/app").await?;
    /// let streams = baton
    ///     .table_leases(
    ///         TableLeaseColumns::new("wh_perspective_cursors")
    ///             .key_columns(["stream_id", "perspective_name"])
    ///             .holder_column("stream_lock_instance_id")
    ///             .expiry_column("stream_lock_expiry"),
    ///     )
    ///     .await?;
    /// let key = ["0b9e4a1c-5f3d-4c1e-9d8a-2f6b7c8d9e0f", "OrderPerspective"];
    /// if let ClaimResult::Claimed { fence, .. } =
    ///     streams.claim(&key, "instance-a", &LeaseOptions::new(Duration::from_secs(30)).reason("rewind")).await?
    /// {
    ///     println!("rewinding under fence {fence}");
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn table_leases(&self, columns: TableLeaseColumns) -> crate::Result<TableLeases> {
        let Some(store) = self.store_as::<crate::store::PostgresStore>() else {
            return Err(crate::Error::unsupported(format!(
                "the {} store keeps no leases in tables of your own: table leases are conditional UPDATEs of a PostgreSQL table; connect with postgres://",
                self.store().name()
            )));
        };
        TableLeases::new(&store, columns).await
    }
}

#[cfg(all(test, feature = "postgres"))]
mod tests {
    #[tokio::test]
    async fn table_leases_need_postgres() {
        let baton = crate::connect("memory://").await.unwrap();
        let e = baton
            .table_leases(super::TableLeaseColumns::new("t"))
            .await
            .unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Unsupported, "{e}");
        assert!(e.message().contains("the memory store"), "{e}");
        assert!(e.message().contains("postgres://"), "{e}");
    }
}
