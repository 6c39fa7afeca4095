//! How Redis failures become [`baton_core::Error`]s.
//!
//! Every redis client error is wrapped: the kind says what a caller can do (`Unavailable`
//! for anything that may pass — I/O, timeouts, a refused or dropped connection, a server
//! that is loading, read-only after a failover, out of memory, busy with a script, or
//! refusing the credentials; `Internal` for an answer baton did not expect), the message
//! names the operation and the server (password redacted), and the redis error is kept as
//! the `source`. No redis type appears in the API.

use std::fmt;
use std::time::Duration;

use baton_core::time::format_duration;
use baton_core::{Error, ErrorKind};
use redis::{ErrorKind as RedisKind, RedisError, ServerErrorKind};

/// The error a caller sees: `<server>: <what> failed: <why>`, `server` being the redacted
/// URL.
pub(crate) fn redis_error(e: RedisError, what: &str, server: &str) -> Error {
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

/// The server answered with something the scripts never return.
pub(crate) fn unexpected(what: &str, server: &str, detail: impl fmt::Display) -> Error {
    Error::internal(format!("{server}: {what}: unexpected answer: {detail}"))
}

fn classify(e: &RedisError) -> (ErrorKind, Why) {
    match e.kind() {
        RedisKind::Io => {
            if e.is_timeout() {
                (ErrorKind::Unavailable, Why::Timeout)
            } else if e.is_connection_refusal() {
                (ErrorKind::Unavailable, Why::Refused)
            } else if e.is_connection_dropped() {
                (ErrorKind::Unavailable, Why::Dropped)
            } else {
                (ErrorKind::Unavailable, Why::Io)
            }
        }
        RedisKind::AuthenticationFailed | RedisKind::Server(ServerErrorKind::NoPerm) => {
            (ErrorKind::Unavailable, Why::Denied)
        }
        RedisKind::Server(
            ServerErrorKind::BusyLoading
            | ServerErrorKind::TryAgain
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::MasterDown
            | ServerErrorKind::ReadOnly,
        ) => (ErrorKind::Unavailable, Why::NotServing),
        RedisKind::Server(ServerErrorKind::Moved | ServerErrorKind::Ask) => {
            (ErrorKind::Unsupported, Why::Cluster)
        }
        RedisKind::InvalidClientConfig => (ErrorKind::InvalidInput, Why::Config),
        RedisKind::RESP3NotSupported => (ErrorKind::Unsupported, Why::Config),
        RedisKind::Extension => match e.code() {
            Some("NOAUTH" | "WRONGPASS") => (ErrorKind::Unavailable, Why::Denied),
            Some("OOM") => (ErrorKind::Unavailable, Why::OutOfMemory),
            Some("BUSY") => (ErrorKind::Unavailable, Why::Busy),
            Some("LOADING" | "MASTERDOWN" | "READONLY") => {
                (ErrorKind::Unavailable, Why::NotServing)
            }
            _ => (ErrorKind::Internal, Why::Unexpected),
        },
        _ => (ErrorKind::Internal, Why::Unexpected),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Why {
    Timeout,
    Refused,
    Dropped,
    Io,
    Denied,
    NotServing,
    Cluster,
    Config,
    OutOfMemory,
    Busy,
    Unexpected,
}

impl fmt::Display for Why {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Why::Timeout => "timed out",
            Why::Refused => "connection refused",
            Why::Dropped => "the connection was lost",
            Why::Io => "I/O error",
            Why::Denied => {
                "the server refused the credentials or the command; check the user and password in the URL and the user's ACL"
            }
            Why::NotServing => {
                "the server is not serving writes (loading, a replica, or failing over)"
            }
            Why::Cluster => {
                "the server is a Redis Cluster node, which this store does not support; connect to a single primary"
            }
            Why::Config => "the client configuration was rejected",
            Why::OutOfMemory => {
                "the server is out of memory (maxmemory reached under noeviction)"
            }
            Why::Busy => "the server is busy running a script",
            Why::Unexpected => "unexpected error",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn io(kind: std::io::ErrorKind) -> RedisError {
        RedisError::from(std::io::Error::from(kind))
    }

    #[test]
    fn kinds() {
        let refused = redis_error(
            io(std::io::ErrorKind::ConnectionRefused),
            "claim of a:lock:k",
            "redis://h:1/0",
        );
        assert_eq!(refused.kind(), ErrorKind::Unavailable);
        assert_eq!(
            refused.message(),
            "redis://h:1/0: claim of a:lock:k failed: connection refused"
        );
        assert!(std::error::Error::source(&refused).is_some());
        for kind in [
            std::io::ErrorKind::TimedOut,
            std::io::ErrorKind::ConnectionReset,
            std::io::ErrorKind::BrokenPipe,
            std::io::ErrorKind::Other,
        ] {
            let e = redis_error(io(kind), "renew", "s");
            assert_eq!(e.kind(), ErrorKind::Unavailable, "{kind:?}: {e}");
        }
        let parsed = |text: &[u8]| redis::parse_redis_value(text).unwrap().extract_error();
        for (reply, kind) in [
            (
                &b"-LOADING Redis is loading\r\n"[..],
                ErrorKind::Unavailable,
            ),
            (
                b"-READONLY You can't write against a read only replica.\r\n",
                ErrorKind::Unavailable,
            ),
            (b"-OOM command not allowed\r\n", ErrorKind::Unavailable),
            (
                b"-BUSY Redis is busy running a script\r\n",
                ErrorKind::Unavailable,
            ),
            (b"-NOPERM no permissions\r\n", ErrorKind::Unavailable),
            (
                b"-WRONGPASS invalid username-password pair\r\n",
                ErrorKind::Unavailable,
            ),
            (b"-MOVED 3999 127.0.0.1:6381\r\n", ErrorKind::Unsupported),
            (
                b"-WRONGTYPE Operation against a key\r\n",
                ErrorKind::Internal,
            ),
            (b"-ERR user_script:1: oops\r\n", ErrorKind::Internal),
            (
                b"-BATONCORRUPT fence counter is not a number\r\n",
                ErrorKind::Internal,
            ),
        ] {
            let e = redis_error(parsed(reply).unwrap_err(), "claim", "s");
            assert_eq!(e.kind(), kind, "{}: {e}", String::from_utf8_lossy(reply));
        }
        let t = timed_out("release of k", "redis://h:1/0", Duration::from_millis(1500));
        assert_eq!(t.kind(), ErrorKind::Unavailable);
        assert!(t.message().ends_with("no answer within 1500ms"), "{t}");
        assert_eq!(
            unexpected("inspect", "s", "nil").kind(),
            ErrorKind::Internal
        );
    }
}
