//! How a response is kept in an idempotency record, and rebuilt for a replay.
//!
//! The record's metadata holds one encoded [`StoredResponse`]: the status, the replay-safe
//! headers, and the body when it was at most the configured size. The format is a small
//! length-prefixed binary (`BHR1`, status, flags, headers, body), so binary bodies and any
//! header bytes survive unchanged. Empty metadata means the request ended without a
//! response (the handler returned an error or panicked).

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

const MAGIC: &[u8; 4] = b"BHR1";
const BODY_OMITTED: u8 = 1;

/// A response as stored for replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StoredResponse {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    /// `None` when the body was larger than the configured limit and was not stored.
    pub(crate) body: Option<Bytes>,
}

impl StoredResponse {
    /// The encoded form.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let body = self.body.as_deref().unwrap_or_default();
        let mut out = Vec::with_capacity(16 + body.len() + 64 * self.headers.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&self.status.as_u16().to_be_bytes());
        out.push(if self.body.is_none() { BODY_OMITTED } else { 0 });
        out.extend_from_slice(&(self.headers.len() as u32).to_be_bytes());
        for (name, value) in &self.headers {
            let name = name.as_str().as_bytes();
            out.extend_from_slice(&(name.len() as u32).to_be_bytes());
            out.extend_from_slice(name);
            out.extend_from_slice(&(value.len() as u32).to_be_bytes());
            out.extend_from_slice(value.as_bytes());
        }
        out.extend_from_slice(body);
        out
    }

    /// Reads what [`encode`](Self::encode) wrote; `None` for anything else.
    pub(crate) fn decode(bytes: &[u8]) -> Option<StoredResponse> {
        let mut r = Reader(bytes);
        if r.take(4)? != MAGIC {
            return None;
        }
        let status = StatusCode::from_u16(u16::from_be_bytes(r.array()?)).ok()?;
        let flags = r.take(1)?[0];
        let count = u32::from_be_bytes(r.array()?);
        let mut headers = HeaderMap::new();
        for _ in 0..count {
            let len = u32::from_be_bytes(r.array()?) as usize;
            let name = HeaderName::from_bytes(r.take(len)?).ok()?;
            let len = u32::from_be_bytes(r.array()?) as usize;
            let value = HeaderValue::from_bytes(r.take(len)?).ok()?;
            headers.append(name, value);
        }
        let body = (flags & BODY_OMITTED == 0).then(|| Bytes::copy_from_slice(r.0));
        Some(StoredResponse {
            status,
            headers,
            body,
        })
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Some(head)
    }

    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        headers.append("x-multi", HeaderValue::from_static("a"));
        headers.append("x-multi", HeaderValue::from_static("b"));
        headers.insert("x-bytes", HeaderValue::from_bytes(b"\xff\x80 ok").unwrap());
        for body in [
            None,
            Some(Bytes::new()),
            Some(Bytes::from_static(b"\x00\x01{\"id\":1}")),
        ] {
            let stored = StoredResponse {
                status: StatusCode::CREATED,
                headers: headers.clone(),
                body,
            };
            assert_eq!(StoredResponse::decode(&stored.encode()), Some(stored));
        }
    }

    #[test]
    fn rejects_what_it_did_not_write() {
        assert_eq!(StoredResponse::decode(b""), None);
        assert_eq!(StoredResponse::decode(b"BHR1"), None);
        assert_eq!(
            StoredResponse::decode(b"XXXX\x00\xc8\x00\x00\x00\x00\x00"),
            None
        );
        let ok = StoredResponse {
            status: StatusCode::OK,
            headers: HeaderMap::new(),
            body: Some(Bytes::new()),
        }
        .encode();
        assert!(StoredResponse::decode(&ok).is_some());
        let mut truncated = StoredResponse {
            status: StatusCode::OK,
            headers: [(http::header::ETAG, HeaderValue::from_static("\"v1\""))]
                .into_iter()
                .collect(),
            body: None,
        }
        .encode();
        truncated.truncate(truncated.len() - 2);
        assert_eq!(StoredResponse::decode(&truncated), None);
    }
}
