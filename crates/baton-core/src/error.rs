//! The one error type of baton.
//!
//! Contention is not an error: "held by someone else" is a variant of an acquire or claim
//! result. An [`Error`] means the request could not be answered (the store is down, the
//! input was invalid, the store cannot do this at all). Match on [`Error::kind`]; the
//! representation is private so that store client types never leak into the API.

use std::error::Error as StdError;
use std::fmt;

/// What went wrong, in terms a caller can act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The input was rejected before any I/O; nothing was written. Not retryable.
    InvalidInput,
    /// The store could not be reached or did not answer in time. Retryable.
    Unavailable,
    /// The store cannot offer this capability. Not retryable.
    Unsupported,
    /// A bounded wait or deadline elapsed. Retryable.
    Timeout,
    /// The store answered with something baton did not expect (a corrupt row, a schema
    /// from a newer version). Not retryable without intervention.
    Internal,
}

impl ErrorKind {
    /// A short lower-case name, stable for logs and JSON output.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::InvalidInput => "invalid_input",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Internal => "internal",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The error of every fallible baton call.
pub struct Error {
    inner: Box<Inner>,
}

struct Inner {
    kind: ErrorKind,
    message: String,
    source: Option<Box<dyn StdError + Send + Sync + 'static>>,
}

/// `Result<T, baton_core::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An error of `kind` with a message that names the problem.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            inner: Box::new(Inner {
                kind,
                message: message.into(),
                source: None,
            }),
        }
    }

    /// Attaches the underlying cause (a store client's error). The cause is reachable through
    /// [`std::error::Error::source`] but never part of baton's API.
    pub fn with_source(mut self, source: impl StdError + Send + Sync + 'static) -> Self {
        self.inner.source = Some(Box::new(source));
        self
    }

    /// An [`ErrorKind::InvalidInput`] error.
    pub fn invalid_input(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::InvalidInput, message)
    }

    /// An [`ErrorKind::Unavailable`] error.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Unavailable, message)
    }

    /// An [`ErrorKind::Unsupported`] error.
    pub fn unsupported(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Unsupported, message)
    }

    /// An [`ErrorKind::Internal`] error.
    pub fn internal(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Internal, message)
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        self.inner.kind
    }

    /// The message, without the kind prefix.
    pub fn message(&self) -> &str {
        &self.inner.message
    }

    /// Whether the same call may succeed if tried again later.
    pub fn is_retryable(&self) -> bool {
        matches!(self.kind(), ErrorKind::Unavailable | ErrorKind::Timeout)
    }

    /// Shorthand for `kind() == ErrorKind::InvalidInput`.
    pub fn is_invalid_input(&self) -> bool {
        self.kind() == ErrorKind::InvalidInput
    }

    /// Shorthand for `kind() == ErrorKind::Unavailable`.
    pub fn is_unavailable(&self) -> bool {
        self.kind() == ErrorKind::Unavailable
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Error");
        d.field("kind", &self.inner.kind)
            .field("message", &self.inner.message);
        if let Some(source) = &self.inner.source {
            d.field("source", source);
        }
        d.finish()
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.inner.kind, self.inner.message)?;
        if let Some(source) = &self.inner.source {
            write!(f, ": {source}")?;
        }
        Ok(())
    }
}

impl StdError for Error {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.inner
            .source
            .as_deref()
            .map(|s| s as &(dyn StdError + 'static))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_kind_message_and_source() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let err = Error::unavailable("redis at 127.0.0.1:1 did not answer").with_source(io);
        assert_eq!(
            err.to_string(),
            "unavailable: redis at 127.0.0.1:1 did not answer: refused"
        );
        assert!(err.is_retryable());
        assert!(StdError::source(&err).is_some());
    }

    #[test]
    fn invalid_input_is_not_retryable() {
        assert!(!Error::invalid_input("key is empty").is_retryable());
        assert!(!Error::unsupported("no").is_retryable());
        assert!(Error::new(ErrorKind::Timeout, "t").is_retryable());
    }
}
