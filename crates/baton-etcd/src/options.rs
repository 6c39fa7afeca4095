//! How an etcd store connects: [`EtcdOptions`].
//!
//! Start from [`EtcdOptions::new`] (the defaults suit most uses) and change what you need;
//! the same options can be given in an `etcd://` URL's query
//! (`?connect_timeout=1s&response_timeout=500ms`, `etcds://...?ca_file=/etc/baton/ca.pem`).
//! Values are checked when the store is opened, before any I/O.

use std::path::{Path, PathBuf};
use std::time::Duration;

use baton_core::options::{self, check_range};
use baton_core::{Error, Result};

/// Default of [`EtcdOptions::connect_timeout`].
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Default of [`EtcdOptions::response_timeout`].
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);

const MIN_TIMEOUT: Duration = Duration::from_millis(1);
const MAX_TIMEOUT: Duration = Duration::from_secs(300);

/// The option names a URL query may hold, for error messages.
const KNOWN_OPTIONS: &[&str] = &[
    "connect_timeout",
    "response_timeout",
    "ca_file",
    "cert_file",
    "key_file",
];

/// Options of an etcd store. Every value has a default; see each setter.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use baton_etcd::EtcdOptions;
///
/// let options = EtcdOptions::new().response_timeout(Duration::from_millis(500));
/// assert_eq!(options.get_connect_timeout(), Duration::from_secs(2));
/// assert_eq!(options.get_response_timeout(), Duration::from_millis(500));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "options do nothing until passed to EtcdStore::open"]
pub struct EtcdOptions {
    connect_timeout: Duration,
    response_timeout: Duration,
    ca_file: Option<PathBuf>,
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
}

impl Default for EtcdOptions {
    fn default() -> Self {
        EtcdOptions {
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            response_timeout: DEFAULT_RESPONSE_TIMEOUT,
            ca_file: None,
            cert_file: None,
            key_file: None,
        }
    }
}

impl EtcdOptions {
    /// The defaults: 2s connect timeout, 2s response timeout.
    pub fn new() -> Self {
        EtcdOptions::default()
    }

    /// How long one attempt to open a connection to a member may take (default 2s; 1ms to
    /// 5m). Opening the store waits at most `connect_timeout + response_timeout` for the
    /// cluster's first answer, then fails with `Unavailable`.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long one request (a transaction, a lease grant or keep-alive, a read) may wait
    /// for its answer before it fails with `Unavailable` (default 2s; 1ms to 5m). Keep it
    /// well below your lock TTLs: a renewal that waits longer than the TTL cannot save the
    /// grant.
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// `etcds://` only: a PEM file of the certificate authorities that signed the members'
    /// certificates (etcd's `--trusted-ca-file`). Without it, the platform's root
    /// certificates are trusted (they honour `SSL_CERT_FILE` and `SSL_CERT_DIR`). The file
    /// is read when the store is opened; a missing file, or one without a PEM certificate, is
    /// `InvalidInput`.
    pub fn ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.ca_file = Some(path.into());
        self
    }

    /// `etcds://` only: a client certificate and its private key (PEM files), for members
    /// that ask clients for one (etcd's `--client-cert-auth`). Both or neither; read when the
    /// store is opened.
    pub fn client_certificate(
        mut self,
        cert_file: impl Into<PathBuf>,
        key_file: impl Into<PathBuf>,
    ) -> Self {
        self.cert_file = Some(cert_file.into());
        self.key_file = Some(key_file.into());
        self
    }

    /// The CA file, if one was given.
    pub fn get_ca_file(&self) -> Option<&Path> {
        self.ca_file.as_deref()
    }

    /// The client certificate and key files, if given: `(cert_file, key_file)`.
    pub fn get_client_certificate(&self) -> (Option<&Path>, Option<&Path>) {
        (self.cert_file.as_deref(), self.key_file.as_deref())
    }

    /// Whether any TLS file was given (they need `etcds://`).
    pub(crate) fn names_tls_files(&self) -> bool {
        self.ca_file.is_some() || self.cert_file.is_some() || self.key_file.is_some()
    }

    /// The connect timeout.
    pub fn get_connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// The response timeout.
    pub fn get_response_timeout(&self) -> Duration {
        self.response_timeout
    }

    /// The longest any one store call may take: a reconnect plus a request.
    pub(crate) fn call_deadline(&self) -> Duration {
        self.connect_timeout + self.response_timeout
    }

    /// Sets the option `name` from its URL text.
    pub(crate) fn set(mut self, name: &str, value: &str) -> Result<Self> {
        match name {
            "connect_timeout" => Ok(self.connect_timeout(options::duration_in(
                name,
                value,
                MIN_TIMEOUT,
                MAX_TIMEOUT,
            )?)),
            "response_timeout" => Ok(self.response_timeout(options::duration_in(
                name,
                value,
                MIN_TIMEOUT,
                MAX_TIMEOUT,
            )?)),
            "ca_file" => {
                self.ca_file = Some(file(name, value)?);
                Ok(self)
            }
            "cert_file" => {
                self.cert_file = Some(file(name, value)?);
                Ok(self)
            }
            "key_file" => {
                self.key_file = Some(file(name, value)?);
                Ok(self)
            }
            _ => Err(options::unknown("etcd://", name, KNOWN_OPTIONS)),
        }
    }

    /// Checks every value against its range.
    ///
    /// # Errors
    /// `InvalidInput` naming the option and its range.
    pub(crate) fn validate(&self) -> Result<()> {
        match (&self.cert_file, &self.key_file) {
            (Some(_), None) => {
                return Err(Error::invalid_input(
                    "cert_file is given without key_file; a client certificate needs both",
                ));
            }
            (None, Some(_)) => {
                return Err(Error::invalid_input(
                    "key_file is given without cert_file; a client certificate needs both",
                ));
            }
            _ => {}
        }
        check_range(
            "connect_timeout",
            self.connect_timeout,
            MIN_TIMEOUT,
            MAX_TIMEOUT,
        )?;
        check_range(
            "response_timeout",
            self.response_timeout,
            MIN_TIMEOUT,
            MAX_TIMEOUT,
        )
    }
}

/// A file path from a URL query: percent-decoded, not empty.
fn file(name: &str, value: &str) -> Result<PathBuf> {
    let path = crate::url::percent_decode(value).ok_or_else(|| {
        Error::invalid_input(format!(
            "option {name}: {value:?} is not valid percent-encoded UTF-8"
        ))
    })?;
    if path.is_empty() {
        return Err(Error::invalid_input(format!(
            "option {name} is empty; give the path of a PEM file"
        )));
    }
    Ok(PathBuf::from(path))
}

impl baton_core::options::QueryOptions for EtcdOptions {
    fn set_option(self, name: &str, value: &str) -> Result<Self> {
        self.set(name, value)
    }

    fn check(&self) -> Result<()> {
        self.validate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_setters() {
        let options = EtcdOptions::new();
        assert_eq!(options.get_connect_timeout(), DEFAULT_CONNECT_TIMEOUT);
        assert_eq!(options.get_response_timeout(), DEFAULT_RESPONSE_TIMEOUT);
        let options = options
            .set("connect_timeout", "250ms")
            .unwrap()
            .set("response_timeout", "1s")
            .unwrap();
        assert_eq!(options.get_connect_timeout(), Duration::from_millis(250));
        assert_eq!(options.get_response_timeout(), Duration::from_secs(1));
        assert!(options.validate().is_ok());
    }

    #[test]
    fn bad_values_name_the_option() {
        let e = EtcdOptions::new().set("connect_timeout", "5").unwrap_err();
        assert!(e.is_invalid_input());
        assert!(e.message().contains("connect_timeout"), "{e}");
        let e = EtcdOptions::new().set("response_timeout", "0").unwrap_err();
        assert!(e.message().contains("out of range"), "{e}");
        let e = EtcdOptions::new().set("timeout", "1s").unwrap_err();
        assert!(
            e.message().contains("unknown etcd:// option \"timeout\""),
            "{e}"
        );
        let e = EtcdOptions::new()
            .response_timeout(Duration::ZERO)
            .validate()
            .unwrap_err();
        assert!(e.message().contains("response_timeout"), "{e}");
    }
}
