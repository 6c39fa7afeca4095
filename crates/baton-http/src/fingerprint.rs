//! The request fingerprint: what makes a retry "the same request".
//!
//! A retry must repeat the method, the path with its query, and the body byte for byte. The
//! fingerprint is the SHA-256 of those three (each length-prefixed, so no two different
//! requests can run together into the same input), as 64 hex digits. Headers are not part
//! of it: clients legitimately change `Date`, tracing and authentication headers between
//! retries.

use bytes::Bytes;
use http::request::Parts;
use sha2::{Digest, Sha256};

/// The fingerprint of a request with `parts` and a fully read `body`.
pub(crate) fn fingerprint(parts: &Parts, body: &Bytes) -> String {
    let target = parts
        .uri
        .path_and_query()
        .map_or(parts.uri.path(), |p| p.as_str());
    let mut hash = Sha256::new();
    for part in [parts.method.as_str().as_bytes(), target.as_bytes(), body] {
        hash.update((part.len() as u64).to_be_bytes());
        hash.update(part);
    }
    hash.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(method: &str, uri: &str) -> Parts {
        http::Request::builder()
            .method(method)
            .uri(uri)
            .body(())
            .unwrap()
            .into_parts()
            .0
    }

    #[test]
    fn method_target_and_body_count_headers_do_not() {
        let body = Bytes::from_static(b"{\"amount\":10}");
        let base = fingerprint(&parts("POST", "/charges"), &body);
        assert_eq!(base.len(), 64);
        assert_eq!(
            base,
            fingerprint(&parts("POST", "http://other.host/charges"), &body)
        );
        assert_ne!(base, fingerprint(&parts("PATCH", "/charges"), &body));
        assert_ne!(base, fingerprint(&parts("POST", "/charges?x=1"), &body));
        assert_ne!(base, fingerprint(&parts("POST", "/charge"), &body));
        assert_ne!(
            base,
            fingerprint(
                &parts("POST", "/charges"),
                &Bytes::from_static(b"{\"amount\":11}")
            )
        );
        let mut with_header = parts("POST", "/charges");
        with_header
            .headers
            .insert("x-trace", http::HeaderValue::from_static("1"));
        assert_eq!(base, fingerprint(&with_header, &body));
    }
}
