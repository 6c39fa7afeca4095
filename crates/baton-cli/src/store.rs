//! Which store a command talks to: `--store`, else `BATON_STORE`, else the default SQLite
//! file under the user's state directory (`baton::store::default_url`), which the SQLite store
//! creates, with its directories, on first use.

use baton::Baton;

use crate::cli::GlobalArgs;
use crate::exit::Failure;

/// Opens the store the global options name.
///
/// # Errors
/// Status 64 for a malformed URL, an unknown scheme or one this build does not support, or
/// no default location (neither `XDG_STATE_HOME` nor `HOME` set); status 69 when the store
/// cannot be opened.
pub(crate) async fn connect(global: &GlobalArgs) -> Result<Baton, Failure> {
    let url = match &global.store {
        Some(url) => url.clone(),
        None => baton::store::default_url()?,
    };
    // A PostgreSQL server's connection slots are shared by every process: one CLI process
    // takes one, and a second only while it waits for a lock, unless the URL asks for more.
    let url = baton::store::PostgresStore::url_for_short_lived_process(&url);
    tracing::debug!(store = %baton::store::redact_url(&url), namespace = %global.namespace, "opening store");
    Ok(baton::connect_with(&url, global.namespace.clone()).await?)
}
