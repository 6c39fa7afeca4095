//! How PostgreSQL failures become [`baton_core::Error`]s.
//!
//! Every sqlx error is wrapped: the kind says what a caller can do (`Unavailable` for
//! anything that may pass — I/O, timeouts, a refused, dropped or terminated connection, a
//! server shutting down, starting or out of connections, a standby that cannot write, a
//! refused password or missing privilege, a serialization failure; `InvalidInput` for a
//! value the user's table rejects (a holder that is not a uuid, a reason longer than the
//! column); `Internal` for an answer baton did not expect), the message names the operation
//! and the server (password redacted), and the sqlx error is kept as the `source`. No sqlx
//! type appears in the API.

use std::fmt;
use std::time::Duration;

use baton_core::time::format_duration;
use baton_core::{Error, ErrorKind};

/// The error a caller sees: `<server>: <what> failed: <why>`, `server` being the redacted
/// URL.
pub(crate) fn sql_error(e: sqlx::Error, what: &str, server: &str) -> Error {
    let (kind, why) = classify(&e);
    Error::new(kind, format!("{server}: {what} failed: {why}")).with_source(e)
}

/// `what` got no answer within `after`.
pub(crate) fn timed_out(what: &str, server: &str, after: Duration) -> Error {
    Error::unavailable(format!(
        "{server}: {what} failed: no answer within {}",
        format_duration(after)
    ))
}

/// `what` found every connection of the store's pool busy for `waited`.
pub(crate) fn exhausted(what: &str, server: &str, max: u32, waited: Duration) -> Error {
    Error::unavailable(format!(
        "{server}: {what} failed: connection pool exhausted: all {max} of the store's connections stayed busy for connect_timeout ({}); raise max_connections, or look for calls that hold connections",
        format_duration(waited)
    ))
}

/// The server answered with something the statements never return.
pub(crate) fn unexpected(what: &str, server: &str, detail: impl fmt::Display) -> Error {
    Error::internal(format!("{server}: {what}: unexpected answer: {detail}"))
}

/// Whether `e` means the connection broke, so that the statement may not have reached the
/// server and a new connection may succeed.
pub(crate) fn is_broken_connection(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) | sqlx::Error::Protocol(_) => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|code| {
            code.starts_with("08") || matches!(&*code, "57P01" | "57P02" | "57P03")
        }),
        _ => false,
    }
}

fn classify(e: &sqlx::Error) -> (ErrorKind, Why) {
    match e {
        sqlx::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
            (ErrorKind::Unavailable, Why::Refused)
        }
        sqlx::Error::Io(_) => (ErrorKind::Unavailable, Why::Io),
        sqlx::Error::Tls(_) => (ErrorKind::Unavailable, Why::Tls),
        sqlx::Error::Protocol(_) => (ErrorKind::Unavailable, Why::Dropped),
        sqlx::Error::PoolTimedOut => (ErrorKind::Unavailable, Why::PoolTimedOut),
        sqlx::Error::PoolClosed | sqlx::Error::WorkerCrashed => {
            (ErrorKind::Unavailable, Why::Closed)
        }
        sqlx::Error::Configuration(_) | sqlx::Error::InvalidArgument(_) => {
            (ErrorKind::InvalidInput, Why::Config)
        }
        sqlx::Error::Database(db) => classify_code(db.code().as_deref().unwrap_or("")),
        _ => (ErrorKind::Internal, Why::Unexpected),
    }
}

/// By SQLSTATE (PostgreSQL's appendix A).
fn classify_code(code: &str) -> (ErrorKind, Why) {
    match code {
        "57P01" | "57P02" => (ErrorKind::Unavailable, Why::Terminated),
        "57P03" => (ErrorKind::Unavailable, Why::Starting),
        "57014" => (ErrorKind::Unavailable, Why::Cancelled),
        "25006" => (ErrorKind::Unavailable, Why::ReadOnly),
        "42501" => (ErrorKind::Unavailable, Why::Privilege),
        "3D000" => (ErrorKind::Unavailable, Why::NoDatabase),
        "53300" => (ErrorKind::Unavailable, Why::TooManyConnections),
        // A prepared statement that exists already, or is missing, on this server connection:
        // only when connections are shared between clients.
        "42P05" | "26000" => (ErrorKind::Unavailable, Why::SessionState),
        "40001" | "40P01" | "55P03" => (ErrorKind::Unavailable, Why::Conflict),
        _ if code.starts_with("08") => (ErrorKind::Unavailable, Why::Dropped),
        _ if code.starts_with("28") => (ErrorKind::Unavailable, Why::Denied),
        _ if code.starts_with("53") => (ErrorKind::Unavailable, Why::Resources),
        _ if code.starts_with("22") || code == "23502" => (ErrorKind::InvalidInput, Why::Value),
        _ => (ErrorKind::Internal, Why::Unexpected),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Why {
    Refused,
    Io,
    Tls,
    Dropped,
    PoolTimedOut,
    Closed,
    Config,
    Terminated,
    Starting,
    Cancelled,
    ReadOnly,
    Privilege,
    NoDatabase,
    Conflict,
    Denied,
    Resources,
    TooManyConnections,
    SessionState,
    Value,
    Unexpected,
}

impl fmt::Display for Why {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Why::Refused => "connection refused",
            Why::Io => "I/O error",
            Why::Tls => "the TLS handshake failed; check sslmode and sslrootcert",
            Why::Dropped => "the connection was lost",
            Why::PoolTimedOut => {
                "no connection within connect_timeout (the server is unreachable, or every pooled connection is busy)"
            }
            Why::Closed => "the store's connection pool is closed",
            Why::Config => "the connection configuration was rejected",
            Why::Terminated => "the server terminated the connection (shutdown or pg_terminate_backend)",
            Why::Starting => "the server is starting up or shutting down",
            Why::Cancelled => "the statement was cancelled (statement_timeout, or a cancel request)",
            Why::ReadOnly => {
                "the server is read-only (a hot standby); connect to the primary"
            }
            Why::Privilege => {
                "permission denied; the user needs CREATE on the schema the first time, then SELECT, INSERT, UPDATE and DELETE on baton's tables and USAGE on its sequence"
            }
            Why::NoDatabase => "the database does not exist",
            Why::Conflict => "a transaction conflict (serialization failure or deadlock)",
            Why::Denied => "the server refused the credentials; check the user and password in the URL",
            Why::Resources => "the server is out of resources (memory or disk)",
            Why::TooManyConnections => {
                "server refused: too many connections (every connection slot of the server is taken; see its max_connections, and each client's pool size)"
            }
            Why::SessionState => {
                "the server connection is shared with other clients (a transaction pooler such as PgBouncer in pool_mode=transaction): add pooler=transaction to the store URL"
            }
            Why::Value => "the table rejected a value",
            Why::Unexpected => "unexpected error",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes() {
        for (code, kind) in [
            ("57P01", ErrorKind::Unavailable),
            ("57P03", ErrorKind::Unavailable),
            ("08006", ErrorKind::Unavailable),
            ("28P01", ErrorKind::Unavailable),
            ("53300", ErrorKind::Unavailable),
            ("25006", ErrorKind::Unavailable),
            ("42501", ErrorKind::Unavailable),
            ("40001", ErrorKind::Unavailable),
            ("42P05", ErrorKind::Unavailable),
            ("26000", ErrorKind::Unavailable),
            ("22P02", ErrorKind::InvalidInput),
            ("22001", ErrorKind::InvalidInput),
            ("42P01", ErrorKind::Internal),
            ("", ErrorKind::Internal),
        ] {
            assert_eq!(classify_code(code).0, kind, "{code}");
        }
        assert!(
            classify_code("42P05")
                .1
                .to_string()
                .contains("pooler=transaction"),
            "a named statement colliding means a transaction pooler"
        );
        assert!(
            classify_code("53300")
                .1
                .to_string()
                .contains("server refused: too many connections")
        );
    }

    #[test]
    fn io_errors_are_unavailable_and_keep_their_source() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let e = sql_error(
            sqlx::Error::Io(refused),
            "claim of a:lock:k",
            "postgres://h/d",
        );
        assert_eq!(e.kind(), ErrorKind::Unavailable);
        assert_eq!(
            e.message(),
            "postgres://h/d: claim of a:lock:k failed: connection refused"
        );
        assert!(std::error::Error::source(&e).is_some());
        assert!(is_broken_connection(&sqlx::Error::Io(
            std::io::Error::from(std::io::ErrorKind::UnexpectedEof)
        )));
        assert!(!is_broken_connection(&sqlx::Error::PoolTimedOut));
        let t = timed_out("renew of k", "postgres://h/d", Duration::from_millis(1500));
        assert_eq!(t.kind(), ErrorKind::Unavailable);
        assert!(t.message().ends_with("no answer within 1500ms"), "{t}");
        assert_eq!(
            unexpected("inspect", "s", "a fence of 0").kind(),
            ErrorKind::Internal
        );
    }
}
