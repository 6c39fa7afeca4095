//! TLS for `etcds://` URLs: the client's TLS settings, made from the URL's files.
//!
//! The members' certificates are checked against the `ca_file` when the URL names one (etcd's
//! `--trusted-ca-file` on the members), else against the platform's root certificates; each
//! certificate must name the host the URL gives for its member. A client certificate
//! (`cert_file` and `key_file`) is sent to members that ask for one (`--client-cert-auth`).
//!
//! The files are read and checked when the store is opened, before any connection: a file
//! that cannot be read, or holds no PEM certificate (no PEM private key for `key_file`), is
//! `InvalidInput` naming the option and the path. No message ever shows a key's contents.
//! TLS goes through rustls with the ring provider (the `tls` feature, on by default);
//! without the feature, `etcds://` is `Unsupported`.

use baton_core::{Error, Result};

use crate::options::EtcdOptions;
use crate::url::Target;

/// The client's TLS settings for `target`: `None` for `etcd://`.
///
/// # Errors
/// `InvalidInput` for a TLS file that cannot be read or holds no PEM item of its kind;
/// `Unsupported` for `etcds://` in a build without the `tls` feature.
#[cfg(feature = "tls")]
pub(crate) fn settings(
    target: &Target,
    options: &EtcdOptions,
) -> Result<Option<etcd_client::TlsOptions>> {
    use etcd_client::{Certificate, Identity, TlsOptions};
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};

    if !target.tls {
        return Ok(None);
    }
    let bad =
        |what: String| Error::invalid_input(format!("store URL {:?}: {what}", target.redacted));
    let certificates = |option: &str, path: &std::path::Path| -> Result<Vec<u8>> {
        let pem = read(option, path, &bad)?;
        let count = CertificateDer::pem_slice_iter(&pem)
            .try_fold(0usize, |n, c| c.map(|_| n + 1))
            .map_err(|e| bad(format!("{option} {path:?} is not a valid PEM file: {e}")))?;
        if count == 0 {
            return Err(bad(format!(
                "{option} {path:?} holds no PEM certificate (-----BEGIN CERTIFICATE-----)"
            )));
        }
        Ok(pem)
    };
    let mut tls = TlsOptions::new();
    tls = match options.get_ca_file() {
        Some(path) => tls.ca_certificate(Certificate::from_pem(certificates("ca_file", path)?)),
        None => tls.with_native_roots(),
    };
    if let (Some(cert_path), Some(key_path)) = options.get_client_certificate() {
        let cert = certificates("cert_file", cert_path)?;
        let key = read("key_file", key_path, &bad)?;
        // The parser's error could quote a line of the key: it is not shown.
        if PrivateKeyDer::from_pem_slice(&key).is_err() {
            return Err(bad(format!(
                "key_file {key_path:?} holds no PEM private key (PKCS#8, PKCS#1 or SEC1)"
            )));
        }
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    Ok(Some(tls))
}

/// Without the `tls` feature: `etcds://` is `Unsupported`.
#[cfg(not(feature = "tls"))]
pub(crate) fn settings(target: &Target, _options: &EtcdOptions) -> Result<Option<()>> {
    if !target.tls {
        return Ok(None);
    }
    Err(Error::unsupported(format!(
        "store URL {:?}: etcds:// (TLS) needs baton-etcd's `tls` cargo feature, which this build leaves out",
        target.redacted
    )))
}

/// The bytes of the TLS file `path`, given as `option`.
#[cfg(feature = "tls")]
fn read(option: &str, path: &std::path::Path, bad: &impl Fn(String) -> Error) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| bad(format!("{option} {path:?} cannot be read: {e}")))
}

/// A hint for a failure to reach a TLS cluster whose cause looks like the TLS handshake.
pub(crate) fn handshake_hint(
    target: &Target,
    error: &(dyn std::error::Error + 'static),
) -> Option<&'static str> {
    if !target.tls {
        return None;
    }
    let mut cause = Some(error);
    while let Some(e) = cause {
        let text = e.to_string().to_ascii_lowercase();
        if text.contains("certificate") || text.contains("tls") || text.contains("handshake") {
            return Some(
                "the TLS handshake with the members failed; check that ca_file names the CA that signed the members' certificates, that each certificate names its member's host as the URL gives it, and cert_file/key_file if the members ask for a client certificate",
            );
        }
        cause = e.source();
    }
    None
}

#[cfg(all(test, feature = "tls"))]
mod tests {
    use super::*;
    use crate::url;

    fn parse(text: &str) -> (Target, EtcdOptions) {
        url::parse(text).unwrap()
    }

    #[test]
    fn plain_urls_have_no_tls_and_tls_urls_trust_the_platform_by_default() {
        let (target, options) = parse("etcd://h");
        assert!(settings(&target, &options).unwrap().is_none());
        let (target, options) = parse("etcds://h");
        assert!(settings(&target, &options).unwrap().is_some());
    }

    #[test]
    fn bad_files_are_invalid_input_naming_the_option_and_path() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "no pem here\n").unwrap();
        let key = dir.path().join("key.pem");
        std::fs::write(
            &key,
            "-----BEGIN PRIVATE KEY-----\nc2VjcmV0LWtleS1ieXRlcw==\n-----END PRIVATE KEY-----\n",
        )
        .unwrap();
        let bad_key = dir.path().join("bad-key.pem");
        std::fs::write(&bad_key, "secret-key-bytes\n").unwrap();
        let cert = dir.path().join("cert.pem");
        std::fs::write(
            &cert,
            "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let missing = dir.path().join("missing.pem");
        let show = |p: &std::path::Path| p.display().to_string();
        for (url, says) in [
            (
                format!("etcds://u:hunter2@h?ca_file={}", show(&missing)),
                "ca_file",
            ),
            (
                format!("etcds://u:hunter2@h?ca_file={}", show(&empty)),
                "holds no PEM certificate",
            ),
            (
                format!(
                    "etcds://u:hunter2@h?cert_file={}&key_file={}",
                    show(&empty),
                    show(&key)
                ),
                "cert_file",
            ),
            (
                format!(
                    "etcds://u:hunter2@h?cert_file={}&key_file={}",
                    show(&cert),
                    show(&bad_key)
                ),
                "holds no PEM private key",
            ),
        ] {
            let (target, options) = parse(&url);
            let e = settings(&target, &options).unwrap_err();
            assert!(e.is_invalid_input(), "{url}: {e}");
            assert!(e.message().contains(says), "{url}: {e}");
            assert!(!e.message().contains("hunter2"), "{url}: {e}");
            assert!(!e.message().contains("secret-key"), "{url}: {e}");
        }
        let (target, options) = parse(&format!("etcds://h?ca_file={}", show(&missing)));
        let e = settings(&target, &options).unwrap_err();
        assert!(e.message().contains("cannot be read"), "{e}");
        assert!(e.message().contains("missing.pem"), "{e}");
    }
}
