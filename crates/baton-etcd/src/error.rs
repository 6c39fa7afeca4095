//! How etcd client failures become [`baton_core::Error`]s.
//!
//! Every client error is wrapped: the message names the operation and the cluster (the
//! URL, password redacted), the kind says what a caller can do, and the client's error is
//! kept as the `source`. No etcd-client type appears in the API.
//!
//! - Anything that may pass is `Unavailable`: I/O, a refused or dropped connection, no
//!   leader, a timeout, a member that is stopping, refused credentials.
//! - A malformed endpoint is `InvalidInput` (the URL parser normally rejects it first), and
//!   so is a request larger than the cluster accepts (`--max-request-bytes`): sending it
//!   again cannot help.
//! - An answer baton did not expect is `Internal`.

use std::time::Duration;

use baton_core::time::format_duration;
use baton_core::{Error, ErrorKind};
use etcd_client::Error as EtcdError;

/// The error a caller sees: `<cluster>: <what> failed: <why>`.
pub(crate) fn etcd_error(e: EtcdError, what: &str, cluster: &str) -> Error {
    hinted(e, what, cluster, None)
}

/// [`etcd_error`], followed by what to check when there is a `hint`.
pub(crate) fn hinted(e: EtcdError, what: &str, cluster: &str, hint: Option<&str>) -> Error {
    let kind = match &e {
        EtcdError::InvalidArgs(_) | EtcdError::InvalidUri(_) => ErrorKind::InvalidInput,
        EtcdError::Utf8Error(_) => ErrorKind::Internal,
        _ if is_too_large(&e) => ErrorKind::InvalidInput,
        _ => ErrorKind::Unavailable,
    };
    let hint = hint.or_else(|| is_too_large(&e).then_some(TOO_LARGE));
    let message = match hint {
        Some(hint) => format!("{cluster}: {what} failed: {e}; {hint}"),
        None => format!("{cluster}: {what} failed: {e}"),
    };
    Error::new(kind, message).with_source(e)
}

/// What to do about a request larger than the cluster accepts.
const TOO_LARGE: &str = "the request is larger than the cluster accepts in one request (etcd's --max-request-bytes, 1.5 MiB by default); store a smaller value, or raise the limit on every member";

/// Whether `e` is etcd's refusal of a request larger than `--max-request-bytes`: its own
/// answer, or its gRPC server's for a message beyond that limit plus its slack.
fn is_too_large(e: &EtcdError) -> bool {
    matches!(e, EtcdError::GRpcStatus(status)
        if status.message().contains("request is too large")
            || status.message().contains("received message larger than max"))
}

/// `what` got no answer within `after`.
pub(crate) fn timed_out(what: &str, cluster: &str, after: Duration) -> Error {
    Error::unavailable(format!(
        "{cluster}: {what} failed: no answer within {}",
        format_duration(after)
    ))
}

/// The cluster answered with something baton never writes or asks for.
pub(crate) fn unexpected(what: &str, cluster: &str, detail: impl std::fmt::Display) -> Error {
    Error::internal(format!("{cluster}: {what}: unexpected answer: {detail}"))
}

/// Whether `e` says the lease does not exist (expired or revoked): the client's own
/// keep-alive error, or etcd's `requested lease not found`.
pub(crate) fn is_lease_not_found(e: &EtcdError) -> bool {
    match e {
        EtcdError::LeaseKeepAliveError(message) => message.contains("not found"),
        EtcdError::GRpcStatus(status) => status.message().contains("lease not found"),
        _ => false,
    }
}
