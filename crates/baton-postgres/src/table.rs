//! [`TableLeases`]: leases kept in columns of a table of your own, each atom one
//! conditional `UPDATE` of that table.
//!
//! Use it for the storage model of stream locks: the lock of a `(stream, perspective)` pair
//! lives in the row that already tracks that pair (a projection cursor, say), in three
//! nullable columns — who holds it, until when, and why — so that no separate lock table is
//! needed, an operator sees the lock beside the data it protects, and `DELETE`ing the row
//! deletes its lock. The rows must exist: a lease on a missing row is an error, not a new
//! row. Use [`Leases`] over a [`PostgresStore`] instead when there is no such row.
//!
//! The table and column names are given once, checked (plain identifiers: letters, digits
//! and `_`, not starting with a digit, at most 63 bytes; the table may be `schema.table`),
//! quoted with `"` (so they match exactly, case included) and looked up in the catalog
//! before the first statement is built: the holder, expiry and reason columns must allow
//! `NULL` (it means unlocked), the expiry must be `timestamptz`, the optional fence
//! `bigint`, and the key columns must be the table's primary key or a unique index, so a key
//! names one row. Values are always bind parameters, cast to their column's type.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use baton_core::signals::ReleaseHub;
use baton_core::store::{Claim, HolderInfo, LeaseRequest, LeaseStore, Release, Renewal, Wakeups};
use baton_core::{
    ClaimResult, Error, Fence, Holder, KeptClaim, Key, LeaseInfo, LeaseKeepAlive, LeaseOptions,
    Leases, RemoveResult, Result, StoreKey, Ttl,
};
use sqlx::Row;
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::query::Query;

use crate::connection::Db;
use crate::error::{sql_error, unexpected};
use crate::locks::PostgresStore;

/// Longest identifier PostgreSQL keeps, in bytes.
const MAX_IDENTIFIER_BYTES: usize = 63;

/// How often a claim or release is run again when the row changed between its statement's
/// snapshot and its write.
const MAX_RERUNS: usize = 64;

/// How often a statement that found no row is run again before the row is declared
/// missing (once more, in case it was inserted after the first statement's snapshot).
const MISSING_TRIES: usize = 2;

/// Which table and columns hold the leases of a [`TableLeases`]. The holder and expiry
/// columns are required; the reason and fence columns are optional.
///
/// # Examples
/// ```
/// use baton_postgres::TableLeaseColumns;
///
/// let columns = TableLeaseColumns::new("wh_perspective_cursors")
///     .key_columns(["stream_id", "perspective_name"])
///     .holder_column("stream_lock_instance_id")
///     .expiry_column("stream_lock_expiry")
///     .reason_column("stream_lock_reason")
///     .fence_column("stream_lock_fence");
/// # let _ = columns;
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "columns do nothing until passed to TableLeases::new"]
pub struct TableLeaseColumns {
    table: String,
    key_columns: Vec<String>,
    holder: Option<String>,
    expiry: Option<String>,
    reason: Option<String>,
    fence: Option<String>,
}

impl TableLeaseColumns {
    /// Leases in `table` (`name` or `schema.name`).
    pub fn new(table: impl Into<String>) -> Self {
        TableLeaseColumns {
            table: table.into(),
            key_columns: Vec::new(),
            holder: None,
            expiry: None,
            reason: None,
            fence: None,
        }
    }

    /// The columns whose values name a row (its primary key or a unique index), in the order
    /// a key's parts are given.
    pub fn key_columns<I, S>(mut self, columns: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.key_columns = columns.into_iter().map(Into::into).collect();
        self
    }

    /// The column of the holder (`text`, `varchar` or `uuid`; `NULL` when unlocked).
    pub fn holder_column(mut self, column: impl Into<String>) -> Self {
        self.holder = Some(column.into());
        self
    }

    /// The column of the expiry (`timestamptz`; `NULL` when unlocked), written from the
    /// database's `clock_timestamp()`.
    pub fn expiry_column(mut self, column: impl Into<String>) -> Self {
        self.expiry = Some(column.into());
        self
    }

    /// The column of the reason (`text` or `varchar`; `NULL` when unlocked). Without it,
    /// reasons are not kept.
    pub fn reason_column(mut self, column: impl Into<String>) -> Self {
        self.reason = Some(column.into());
        self
    }

    /// The column of the fence (`bigint`). Without it, grants carry fence 0, which fences
    /// nothing: add one when the lock protects writes that a paused holder could make late.
    pub fn fence_column(mut self, column: impl Into<String>) -> Self {
        self.fence = Some(column.into());
        self
    }
}

/// The statements a [`TableLeases`] runs, for operators and tests. Parameters: the key
/// columns' values are `$1..$n`, then the holder `$n+1`, the TTL in milliseconds `$n+2` and
/// the reason `$n+3` where a statement takes them.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TableStatements {
    /// Claim: one conditional `UPDATE` (free, expired, or the same holder), and the current
    /// holder when it changed nothing. Parameters: keys, holder, ttl, reason.
    pub claim: String,
    /// Renew: one conditional `UPDATE`. Parameters: keys, holder, ttl.
    pub renew: String,
    /// Release: one conditional `UPDATE` that sets the columns to `NULL`, and the current
    /// holder when it changed nothing. Parameters: keys, holder.
    pub release: String,
    /// Inspect: the live lease. Parameters: keys.
    pub inspect: String,
}

/// Leases whose state lives in columns of your own table: the storage model of stream
/// locks. See the [module docs](self) for what the table must look like.
///
/// Claim, renew and release answer exactly as [`Leases`] does (the same result types), and
/// [`keep_alive`](Self::keep_alive) keeps a lease alive with the same validation (interval
/// less than `ttl / 2`) and lost signal. A key is one value per key column, given as text
/// and cast to the column's type by PostgreSQL.
///
/// # Examples
/// ```no_run
/// # async fn example(store: &baton_postgres::PostgresStore) -> baton_core::Result<()> {
/// use std::time::Duration;
/// use baton_core::{KeptClaim, LeaseOptions};
/// use baton_postgres::{TableLeaseColumns, TableLeases};
///
/// let locks = TableLeases::new(
///     store,
///     TableLeaseColumns::new("wh_perspective_cursors")
///         .key_columns(["stream_id", "perspective_name"])
///         .holder_column("stream_lock_instance_id")
///         .expiry_column("stream_lock_expiry")
///         .reason_column("stream_lock_reason"),
/// )
/// .await?;
/// let key = ["0b9e4a1c-5f3d-4c1e-9d8a-2f6b7c8d9e0f", "OrderPerspective"];
/// let instance = "6f1c2d3e-4b5a-4978-8a6b-5c4d3e2f1a0b";
/// let options = LeaseOptions::new(Duration::from_secs(30)).reason("rewind").keep_alive(Duration::from_secs(10));
/// match locks.claim_and_keep(&key, instance, &options).await? {
///     KeptClaim::Kept { keep_alive, .. } => {
///         // ... rewind, selecting on keep_alive.lost() ...
///         drop(keep_alive);
///         locks.release(&key, instance).await?;
///     }
///     KeptClaim::HeldBy { .. } => { /* another instance has it: skip, retry next cycle */ }
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct TableLeases {
    leases: Leases,
    store: Arc<TableStore>,
}

impl fmt::Debug for TableLeases {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TableLeases")
            .field("table", &self.store.table)
            .field("server", &self.store.db.server)
            .finish()
    }
}

impl TableLeases {
    /// Checks `columns` (before any I/O), looks the table up in the catalog, and builds the
    /// statements. The leases use `store`'s connections and its fence sequence.
    ///
    /// # Errors
    /// `InvalidInput` for a name that is not a plain identifier, a missing table or column,
    /// a column of the wrong type or `NOT NULL`, or key columns that are not unique;
    /// `Unavailable` when the database cannot be reached.
    pub async fn new(store: &PostgresStore, columns: TableLeaseColumns) -> Result<Self> {
        let names = Names::check(&columns)?;
        let db = store.db.clone();
        let catalog = Catalog::read(&db, &names).await?;
        let sql = statements(&names, &catalog);
        let table = Arc::new(TableStore {
            db,
            table: columns.table.clone(),
            keys: names.keys.len(),
            sql,
            hub: Arc::new(ReleaseHub::new()),
        });
        Ok(TableLeases {
            leases: Leases::new(Arc::clone(&table) as Arc<dyn LeaseStore>),
            store: table,
        })
    }

    /// The statements this runs.
    pub fn statements(&self) -> &TableStatements {
        &self.store.sql
    }

    /// Claims the row `key` for `holder` for `ttl`, recording `reason`: granted when the row
    /// is unlocked or its lease expired, extended (idempotently) when `holder` holds it,
    /// otherwise `HeldBy` the current holder — skip the row and try again later.
    ///
    /// # Errors
    /// `InvalidInput` for a bad key, holder, TTL or reason (before any I/O), for a row that
    /// does not exist, and for a value the column rejects (a holder that is not a uuid for
    /// a `uuid` column, a reason longer than a `varchar`); `Unavailable` when the database
    /// faulted.
    pub async fn claim(
        &self,
        key: &[&str],
        holder: &str,
        options: &LeaseOptions,
    ) -> Result<ClaimResult> {
        self.leases.claim(&self.join(key)?, holder, options).await
    }

    /// Extends `holder`'s lease of row `key` to `ttl` from now. Never revives a lapsed lease.
    ///
    /// # Errors
    /// As [`claim`](Self::claim).
    pub async fn renew(&self, key: &[&str], holder: &str, ttl: Duration) -> Result<Renewal> {
        self.leases.renew(&self.join(key)?, holder, ttl).await
    }

    /// Releases row `key` if `holder` holds it (setting the columns to `NULL`), and says
    /// whether it did.
    ///
    /// # Errors
    /// As [`claim`](Self::claim); a fault means the caller cannot know whether it still
    /// owned the lease.
    pub async fn release(&self, key: &[&str], holder: &str) -> Result<RemoveResult> {
        self.leases.release(&self.join(key)?, holder).await
    }

    /// Claims row `key` for `holder` and keeps it alive, in one call (TTL, reason and
    /// interval from `options`, checked before any I/O). See [`Leases::claim_and_keep`].
    ///
    /// # Errors
    /// As [`claim`](Self::claim); also `InvalidInput` for an interval that is zero or not
    /// less than `ttl / 2`.
    pub async fn claim_and_keep(
        &self,
        key: &[&str],
        holder: &str,
        options: &LeaseOptions,
    ) -> Result<KeptClaim> {
        self.leases
            .claim_and_keep(&self.join(key)?, holder, options)
            .await
    }

    /// Keeps `holder`'s lease of row `key`, claimed earlier, alive with `options` until the
    /// handle is dropped; `None` when `holder` does not hold it. Its `lost()` signal fires
    /// when a renewal finds another holder or the TTL passes without a successful renewal.
    /// See [`Leases::keep_alive`].
    ///
    /// # Errors
    /// `InvalidInput` before any I/O; `Unavailable` when the first renewal faulted.
    pub async fn keep_alive(
        &self,
        key: &[&str],
        holder: &str,
        options: &LeaseOptions,
    ) -> Result<Option<LeaseKeepAlive>> {
        self.leases
            .keep_alive(&self.join(key)?, holder, options)
            .await
    }

    /// The live lease of row `key`, if any; its `key` is the parts joined with `/`.
    ///
    /// # Errors
    /// As [`claim`](Self::claim).
    pub async fn inspect(&self, key: &[&str]) -> Result<Option<LeaseInfo>> {
        self.leases.inspect(&self.join(key)?).await
    }

    /// The parts of a key joined with `/`, checked so that the join splits back
    /// unambiguously: one part per key column, none empty, and no `/` in any but the last.
    fn join(&self, key: &[&str]) -> Result<String> {
        let columns = self.store.keys;
        if key.len() != columns {
            return Err(Error::invalid_input(format!(
                "a key of {} has {columns} part(s), one per key column; got {}",
                self.store.table,
                key.len()
            )));
        }
        for (i, part) in key.iter().enumerate() {
            if part.is_empty() {
                return Err(Error::invalid_input(format!(
                    "part {} of the key is empty",
                    i + 1
                )));
            }
            if i + 1 < columns && part.contains('/') {
                return Err(Error::invalid_input(format!(
                    "part {} of the key ({part:?}) contains '/'; only the last part may",
                    i + 1
                )));
            }
        }
        let joined = key.join("/");
        Key::new(joined.clone())?;
        Ok(joined)
    }
}

/// The checked, quoted names.
struct Names {
    /// `"schema"."table"` or `"table"`.
    table: String,
    keys: Vec<Column>,
    holder: Column,
    expiry: Column,
    reason: Option<Column>,
    fence: Option<Column>,
}

struct Column {
    name: String,
    quoted: String,
}

impl Names {
    fn check(columns: &TableLeaseColumns) -> Result<Self> {
        let parts: Vec<&str> = columns.table.split('.').collect();
        if parts.len() > 2 {
            return Err(Error::invalid_input(format!(
                "table {:?} has more than one '.'; write table or schema.table",
                columns.table
            )));
        }
        let table = parts
            .iter()
            .map(|part| quote(part, "table"))
            .collect::<Result<Vec<_>>>()?
            .join(".");
        let column = |name: &str, what: &str| -> Result<Column> {
            Ok(Column {
                quoted: quote(name, what)?,
                name: name.to_owned(),
            })
        };
        if columns.key_columns.is_empty() {
            return Err(Error::invalid_input(
                "no key columns; name the columns whose values name a row",
            ));
        }
        let keys = columns
            .key_columns
            .iter()
            .map(|c| column(c, "key column"))
            .collect::<Result<Vec<_>>>()?;
        let required = |value: &Option<String>, what: &str, setter: &str| -> Result<Column> {
            match value {
                Some(name) => column(name, what),
                None => Err(Error::invalid_input(format!(
                    "no {what}; name it with TableLeaseColumns::{setter}"
                ))),
            }
        };
        let names = Names {
            table,
            keys,
            holder: required(&columns.holder, "holder column", "holder_column")?,
            expiry: required(&columns.expiry, "expiry column", "expiry_column")?,
            reason: columns
                .reason
                .as_deref()
                .map(|c| column(c, "reason column"))
                .transpose()?,
            fence: columns
                .fence
                .as_deref()
                .map(|c| column(c, "fence column"))
                .transpose()?,
        };
        let mut all: Vec<&str> = names.all().map(|c| c.name.as_str()).collect();
        all.sort_unstable();
        if let Some(pair) = all.windows(2).find(|w| w[0] == w[1]) {
            return Err(Error::invalid_input(format!(
                "column {:?} is named for two roles; key, holder, expiry, reason and fence columns must differ",
                pair[0]
            )));
        }
        Ok(names)
    }

    fn all(&self) -> impl Iterator<Item = &Column> {
        self.keys
            .iter()
            .chain([&self.holder, &self.expiry])
            .chain(self.reason.iter())
            .chain(self.fence.iter())
    }
}

/// `"name"` after checking that `name` is a plain identifier.
fn quote(name: &str, what: &str) -> Result<String> {
    let mut chars = name.chars();
    let plain = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !plain || name.len() > MAX_IDENTIFIER_BYTES {
        return Err(Error::invalid_input(format!(
            "{what} {name:?} is not a plain identifier: letters, digits and '_', not starting with a digit, at most {MAX_IDENTIFIER_BYTES} bytes"
        )));
    }
    Ok(format!("\"{name}\""))
}

/// What the catalog says about the configured columns: each one's type, as
/// `format_type` writes it.
struct Catalog {
    key_types: Vec<String>,
    holder_type: String,
}

/// The table's columns: `name`, `type`, `not_null`. Parameters: `$1` the quoted table name.
const COLUMNS: &str = "\
SELECT a.attname::text AS name, format_type(a.atttypid, a.atttypmod) AS type, a.attnotnull AS not_null
FROM pg_attribute AS a
WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped";

/// Whether the columns `$2` are exactly the key columns of a unique index (or the primary
/// key) of table `$1`.
const UNIQUE_KEY: &str = "\
SELECT EXISTS (
    SELECT 1 FROM pg_index AS i
    CROSS JOIN LATERAL (
        SELECT array_agg(a.attname::text) AS names FROM pg_attribute AS a
        WHERE a.attrelid = i.indrelid AND a.attnum = ANY ((i.indkey::int2[])[0:i.indnkeyatts - 1])
    ) AS k
    WHERE i.indrelid = to_regclass($1) AND i.indisunique AND i.indpred IS NULL AND i.indexprs IS NULL
      AND k.names @> $2::text[] AND k.names <@ $2::text[]
)";

/// Whether `$1` names a table.
const TABLE_EXISTS: &str = "SELECT to_regclass($1) IS NOT NULL";

impl Catalog {
    async fn read(db: &Db, names: &Names) -> Result<Self> {
        let what = || format!("reading the catalog entry of {}", names.table);
        let exists: bool = db
            .call(
                what,
                || {
                    sqlx::query_scalar(TABLE_EXISTS)
                        .bind(&names.table)
                        .fetch_one(db.exec())
                },
                |_| true,
            )
            .await?;
        if !exists {
            return Err(Error::invalid_input(format!(
                "table {} does not exist (in the search_path of the store's connections)",
                names.table
            )));
        }
        let rows = db
            .call(
                what,
                || sqlx::query(COLUMNS).bind(&names.table).fetch_all(db.exec()),
                |_| true,
            )
            .await?;
        let mut found: Vec<(String, String, bool)> = Vec::with_capacity(rows.len());
        for row in &rows {
            let read = || -> Result<(String, String, bool), sqlx::Error> {
                Ok((
                    row.try_get("name")?,
                    row.try_get("type")?,
                    row.try_get("not_null")?,
                ))
            };
            found.push(read().map_err(|e| sql_error(e, &what(), &db.server))?);
        }
        let lookup = |column: &Column, role: &str| -> Result<(String, bool)> {
            found
                .iter()
                .find(|(name, _, _)| *name == column.name)
                .map(|(_, ty, not_null)| (ty.clone(), *not_null))
                .ok_or_else(|| {
                    Error::invalid_input(format!(
                        "table {} has no column {} (the {role})",
                        names.table, column.quoted
                    ))
                })
        };
        let nullable = |column: &Column, role: &str| -> Result<String> {
            let (ty, not_null) = lookup(column, role)?;
            if not_null {
                return Err(Error::invalid_input(format!(
                    "column {} of {} (the {role}) is NOT NULL; it must allow NULL, which means unlocked",
                    column.quoted, names.table
                )));
            }
            Ok(ty)
        };
        let key_types = names
            .keys
            .iter()
            .map(|c| lookup(c, "key column").map(|(ty, _)| ty))
            .collect::<Result<Vec<_>>>()?;
        let holder_type = nullable(&names.holder, "holder column")?;
        let expiry_type = nullable(&names.expiry, "expiry column")?;
        if expiry_type != "timestamp with time zone" {
            return Err(Error::invalid_input(format!(
                "column {} of {} (the expiry column) is {expiry_type}; it must be timestamptz (timestamp with time zone)",
                names.expiry.quoted, names.table
            )));
        }
        if let Some(reason) = &names.reason {
            nullable(reason, "reason column")?;
        }
        if let Some(fence) = &names.fence {
            let (ty, _) = lookup(fence, "fence column")?;
            if ty != "bigint" {
                return Err(Error::invalid_input(format!(
                    "column {} of {} (the fence column) is {ty}; it must be bigint",
                    fence.quoted, names.table
                )));
            }
        }
        let key_names: Vec<String> = names.keys.iter().map(|c| c.name.clone()).collect();
        let unique: bool = db
            .call(
                what,
                || {
                    sqlx::query_scalar(UNIQUE_KEY)
                        .bind(&names.table)
                        .bind(&key_names)
                        .fetch_one(db.exec())
                },
                |_| true,
            )
            .await?;
        if !unique {
            return Err(Error::invalid_input(format!(
                "the key columns ({}) of {} are not its primary key or a unique index, so a key could name several rows; name the columns of one",
                key_names.join(", "),
                names.table
            )));
        }
        Ok(Catalog {
            key_types,
            holder_type,
        })
    }
}

/// Builds the statements from checked, quoted names and catalog types (which PostgreSQL
/// wrote, quoted where needed).
fn statements(names: &Names, catalog: &Catalog) -> TableStatements {
    let n = names.keys.len();
    let table = &names.table;
    let keys = names
        .keys
        .iter()
        .zip(&catalog.key_types)
        .enumerate()
        .map(|(i, (c, ty))| format!("t.{} = CAST(${} AS {ty})", c.quoted, i + 1))
        .collect::<Vec<_>>()
        .join(" AND ");
    let holder = &names.holder.quoted;
    let expiry = &names.expiry.quoted;
    let me = format!("CAST(${} AS {})", n + 1, catalog.holder_type);
    let ttl = format!("${}", n + 2);
    let remaining = format!(
        "CASE WHEN t.{expiry} IS NULL THEN 0::bigint ELSE greatest(0, floor(extract(epoch FROM t.{expiry} - c.now) * 1000000))::bigint END"
    );
    let (set_reason, clear_reason, read_reason) = match &names.reason {
        Some(r) => (
            format!(", {} = ${}", r.quoted, n + 3),
            format!(", {} = NULL", r.quoted),
            format!("coalesce(t.{}::text, '')", r.quoted),
        ),
        None => (String::new(), String::new(), "''::text".to_owned()),
    };
    let (set_fence, read_fence) = match &names.fence {
        Some(f) => (
            format!(
                ", {f} = CASE WHEN t.{holder} = {me} AND t.{expiry} > c.now THEN t.{f} ELSE greatest(nextval('baton_fence'), coalesce(t.{f}, 0) + 1) END",
                f = f.quoted
            ),
            format!("t.{}", f.quoted),
        ),
        None => (String::new(), "0::bigint".to_owned()),
    };
    let claim = format!(
        "WITH c AS (SELECT clock_timestamp() AS now),
claimed AS (
    UPDATE {table} AS t SET {holder} = {me}, {expiry} = c.now + {ttl} * interval '1 millisecond'{set_reason}{set_fence}
    FROM c
    WHERE {keys}
      AND (t.{holder} IS NULL OR t.{expiry} IS NULL OR t.{expiry} <= c.now OR t.{holder} = {me})
    RETURNING {read_fence} AS fence
)
SELECT true AS claimed, fence, NULL::text AS holder, false AS mine, 0::bigint AS remaining_us FROM claimed
UNION ALL
SELECT false, 0::bigint, t.{holder}::text, coalesce(t.{holder} = {me}, false), {remaining}
FROM {table} AS t, c
WHERE {keys} AND NOT EXISTS (SELECT 1 FROM claimed)"
    );
    let renew = format!(
        "UPDATE {table} AS t SET {expiry} = c.now + {ttl} * interval '1 millisecond'
FROM (SELECT clock_timestamp() AS now) AS c
WHERE {keys} AND t.{holder} = {me} AND t.{expiry} > c.now"
    );
    let release = format!(
        "WITH c AS (SELECT clock_timestamp() AS now),
released AS (
    UPDATE {table} AS t SET {holder} = NULL, {expiry} = NULL{clear_reason}
    FROM c
    WHERE {keys} AND t.{holder} = {me} AND t.{expiry} > c.now
    RETURNING 1
)
SELECT (SELECT count(*) FROM released) AS removed,
       t.{holder}::text AS current, coalesce(t.{holder} = {me}, false) AS mine,
       t.{holder} IS NOT NULL AND t.{expiry} > c.now AS live
FROM {table} AS t, c
WHERE {keys}"
    );
    let inspect = format!(
        "SELECT t.{holder}::text AS holder, {read_fence} AS fence, {remaining} AS remaining_us, {read_reason} AS reason
FROM {table} AS t, (SELECT clock_timestamp() AS now) AS c
WHERE {keys} AND t.{holder} IS NOT NULL AND t.{expiry} > c.now"
    );
    TableStatements {
        claim,
        renew,
        release,
        inspect,
    }
}

/// The [`LeaseStore`] over the user's table that [`TableLeases`] drives through [`Leases`].
struct TableStore {
    db: Db,
    table: String,
    keys: usize,
    sql: TableStatements,
    hub: Arc<ReleaseHub>,
}

impl fmt::Debug for TableStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TableStore")
            .field("table", &self.table)
            .finish()
    }
}

impl TableStore {
    /// The key's parts, as [`TableLeases::join`] joined them.
    fn parts<'k>(&self, key: &'k StoreKey) -> Vec<&'k str> {
        key.user_key().splitn(self.keys, '/').collect()
    }

    fn bind_keys<'q>(
        &self,
        mut query: Query<'q, sqlx::Postgres, PgArguments>,
        parts: &[&'q str],
    ) -> Query<'q, sqlx::Postgres, PgArguments> {
        for part in parts {
            query = query.bind(*part);
        }
        query
    }

    fn missing_row(&self, key: &StoreKey) -> Error {
        Error::invalid_input(format!(
            "no row of {} has the key {:?}; table leases lock existing rows",
            self.table,
            key.user_key()
        ))
    }

    fn changing(&self, key: &StoreKey) -> Error {
        Error::unavailable(format!(
            "{}: the row {:?} of {} changed hands during each of {MAX_RERUNS} attempts in a row",
            self.db.server,
            key.user_key(),
            self.table
        ))
    }

    fn decode<T>(&self, what: &str, decoded: Result<T, sqlx::Error>) -> Result<T> {
        decoded.map_err(|e| sql_error(e, what, &self.db.server))
    }
}

fn ttl_millis(ttl: Ttl) -> i64 {
    ttl.as_millis() as i64
}

fn remaining(micros: i64) -> Duration {
    Duration::from_micros(micros.max(0) as u64)
}

fn read_claim(row: &PgRow) -> Result<(bool, i64, Option<String>, bool, i64), sqlx::Error> {
    Ok((
        row.try_get("claimed")?,
        row.try_get("fence")?,
        row.try_get("holder")?,
        row.try_get("mine")?,
        row.try_get("remaining_us")?,
    ))
}

fn read_release(row: &PgRow) -> Result<(i64, Option<String>, bool, bool), sqlx::Error> {
    Ok((
        row.try_get("removed")?,
        row.try_get("current")?,
        row.try_get("mine")?,
        row.try_get("live")?,
    ))
}

#[async_trait]
impl LeaseStore for TableStore {
    async fn claim(&self, key: &StoreKey, request: LeaseRequest<'_>) -> Result<Claim> {
        let (holder, ttl, reason) = (request.holder, request.ttl, request.reason);
        let parts = self.parts(key);
        let what = || format!("claim of {} in {}", key.user_key(), self.table);
        let mut missing = 0;
        for _ in 0..MAX_RERUNS {
            let row = self
                .db
                .call(
                    what,
                    || {
                        self.bind_keys(sqlx::query(&self.sql.claim), &parts)
                            .bind(holder.as_str())
                            .bind(ttl_millis(ttl))
                            .bind(reason)
                            .fetch_optional(self.db.exec())
                    },
                    |_| true,
                )
                .await?;
            // No row: it does not exist, or was inserted after the statement's snapshot.
            let Some(row) = row else {
                missing += 1;
                if missing >= MISSING_TRIES {
                    return Err(self.missing_row(key));
                }
                continue;
            };
            let (claimed, fence, current, mine, remaining_us) =
                self.decode(&what(), read_claim(&row))?;
            if claimed {
                if fence < 0 {
                    return Err(unexpected(
                        &what(),
                        &self.db.server,
                        format!("the fence column holds {fence}"),
                    ));
                }
                return Ok(Claim::Granted {
                    fence: Fence::new(fence as u64),
                });
            }
            match current {
                Some(current) if !mine && remaining_us > 0 => {
                    return Ok(Claim::Held {
                        holder: Holder::from_stored(current),
                        remaining: remaining(remaining_us),
                    });
                }
                // The row changed between the snapshot and the write: run it again.
                _ => continue,
            }
        }
        Err(self.changing(key))
    }

    async fn renew(&self, key: &StoreKey, holder: &Holder, ttl: Ttl) -> Result<Renewal> {
        let parts = self.parts(key);
        self.db
            .renew(
                || format!("renew of {} in {}", key.user_key(), self.table),
                || {
                    self.bind_keys(sqlx::query(&self.sql.renew), &parts)
                        .bind(holder.as_str())
                        .bind(ttl_millis(ttl))
                },
            )
            .await
    }

    async fn release(&self, key: &StoreKey, holder: &Holder) -> Result<Release> {
        let parts = self.parts(key);
        let what = || format!("release of {} in {}", key.user_key(), self.table);
        let mut missing = 0;
        for _ in 0..MAX_RERUNS {
            let row = self
                .db
                .call(
                    what,
                    || {
                        self.bind_keys(sqlx::query(&self.sql.release), &parts)
                            .bind(holder.as_str())
                            .fetch_optional(self.db.exec())
                    },
                    |row| {
                        row.as_ref().is_some_and(|row| {
                            read_release(row).is_ok_and(|(removed, _, mine, live)| {
                                removed == 1 || (live && !mine)
                            })
                        })
                    },
                )
                .await?;
            let Some(row) = row else {
                missing += 1;
                if missing >= MISSING_TRIES {
                    return Err(self.missing_row(key));
                }
                continue;
            };
            let (removed, current, mine, live) = self.decode(&what(), read_release(&row))?;
            if removed == 1 {
                return Ok(Release::Removed);
            }
            return Ok(match current {
                Some(by) if live && !mine => Release::Reclaimed {
                    by: Holder::from_stored(by),
                },
                Some(_) if live => continue,
                _ => Release::NoHolder,
            });
        }
        Err(self.changing(key))
    }

    async fn inspect(&self, key: &StoreKey) -> Result<Option<HolderInfo>> {
        let parts = self.parts(key);
        let what = || format!("inspect of {} in {}", key.user_key(), self.table);
        let row = self
            .db
            .call(
                what,
                || {
                    self.bind_keys(sqlx::query(&self.sql.inspect), &parts)
                        .fetch_optional(self.db.exec())
                },
                |_| true,
            )
            .await?;
        let Some(row) = row else { return Ok(None) };
        let read = || -> Result<HolderInfo, sqlx::Error> {
            let fence: i64 = row.try_get("fence")?;
            Ok(HolderInfo {
                key: key.clone(),
                holder: Holder::from_stored(row.try_get("holder")?),
                fence: Fence::new(fence.max(0) as u64),
                remaining: remaining(row.try_get("remaining_us")?),
                reason: row.try_get("reason")?,
            })
        };
        self.decode(&what(), read()).map(Some)
    }

    async fn list(&self, _prefix: &str, _limit: usize) -> Result<Vec<HolderInfo>> {
        // TableLeases offers no listing; nothing calls this.
        Err(Error::unsupported(format!(
            "table leases on {} cannot be listed; query the table",
            self.table
        )))
    }

    fn wakeups(&self) -> Wakeups {
        Wakeups {
            hub: Arc::clone(&self.hub),
            poll: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn columns() -> TableLeaseColumns {
        TableLeaseColumns::new("app.cursors")
            .key_columns(["stream_id", "perspective"])
            .holder_column("lock_holder")
            .expiry_column("lock_expiry")
            .reason_column("lock_reason")
            .fence_column("lock_fence")
    }

    #[test]
    fn names_are_checked_and_quoted() {
        let names = Names::check(&columns()).unwrap();
        assert_eq!(names.table, "\"app\".\"cursors\"");
        assert_eq!(names.holder.quoted, "\"lock_holder\"");
        for (bad, needle) in [
            (
                TableLeaseColumns::new("a;drop table x"),
                "not a plain identifier",
            ),
            (TableLeaseColumns::new("a.b.c"), "more than one '.'"),
            (TableLeaseColumns::new("t"), "no key columns"),
            (
                TableLeaseColumns::new("t").key_columns(["k"]),
                "holder_column",
            ),
            (
                TableLeaseColumns::new("t")
                    .key_columns(["k"])
                    .holder_column("h"),
                "expiry_column",
            ),
            (
                TableLeaseColumns::new("t")
                    .key_columns(["k"])
                    .holder_column("h\"x")
                    .expiry_column("e"),
                "not a plain identifier",
            ),
            (
                TableLeaseColumns::new("t")
                    .key_columns(["k"])
                    .holder_column("h")
                    .expiry_column("h"),
                "two roles",
            ),
            (
                TableLeaseColumns::new("t")
                    .key_columns(["1k"])
                    .holder_column("h")
                    .expiry_column("e"),
                "not a plain identifier",
            ),
            (
                TableLeaseColumns::new("x".repeat(64))
                    .key_columns(["k"])
                    .holder_column("h")
                    .expiry_column("e"),
                "at most 63 bytes",
            ),
        ] {
            let Err(e) = Names::check(&bad) else {
                panic!("{bad:?} was accepted")
            };
            assert!(e.is_invalid_input(), "{e}");
            assert!(e.message().contains(needle), "{needle}: {e}");
        }
    }

    #[test]
    fn statements_bind_every_value_and_cast_to_the_column_types() {
        let names = Names::check(&columns()).unwrap();
        let catalog = Catalog {
            key_types: vec!["uuid".into(), "text".into()],
            holder_type: "uuid".into(),
        };
        let sql = statements(&names, &catalog);
        assert!(
            sql.claim.contains(
                "t.\"stream_id\" = CAST($1 AS uuid) AND t.\"perspective\" = CAST($2 AS text)"
            ),
            "{}",
            sql.claim
        );
        assert!(sql.claim.contains("\"lock_holder\" = CAST($3 AS uuid)"));
        assert!(sql.claim.contains("$4 * interval '1 millisecond'"));
        assert!(sql.claim.contains("\"lock_reason\" = $5"));
        assert!(sql.claim.contains("clock_timestamp()"));
        assert!(!sql.claim.contains("now()"), "{}", sql.claim);
        assert_eq!(sql.claim.matches("UPDATE").count(), 1);
        assert!(sql.release.contains("\"lock_reason\" = NULL"));
        assert!(sql.renew.starts_with("UPDATE \"app\".\"cursors\""));
    }
}
