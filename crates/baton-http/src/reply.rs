//! The answers the layer gives itself: problems as small JSON documents, and replays.
//!
//! Every problem body is `{"error": "<code>", "message": "<what happened and what to do>"}`
//! with `Content-Type: application/json`; the codes are stable, the messages are for people.

use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderName, HeaderValue, Response, StatusCode};

use crate::stored::StoredResponse;

/// The header a replay carries when its stored body was too large to keep.
pub const BODY_OMITTED_HEADER: &str = "idempotent-body-omitted";

/// A JSON problem response.
pub(crate) fn problem(status: StatusCode, code: &str, message: &str) -> Response<Bytes> {
    let body = format!(
        "{{\"error\":{},\"message\":{}}}",
        json_string(code),
        json_string(message)
    );
    let mut response = Response::new(Bytes::from(body));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// `problem` with a `Retry-After` of `after`, in whole seconds (at least 1).
pub(crate) fn retry_later(
    status: StatusCode,
    code: &str,
    message: &str,
    after: Duration,
) -> Response<Bytes> {
    let mut response = problem(status, code, message);
    let seconds = after.as_secs() + u64::from(after.subsec_nanos() > 0);
    response
        .headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from(seconds.max(1)));
    response
}

/// The stored response of a record, marked with `replayed`; a 500 problem when the record
/// holds no response (the original request ended with an error or a panic).
pub(crate) fn replay(metadata: &[u8], replayed: &HeaderName) -> Response<Bytes> {
    let mut response = match StoredResponse::decode(metadata) {
        Some(stored) => {
            let omitted = stored.body.is_none();
            let mut response = Response::new(stored.body.unwrap_or_default());
            *response.status_mut() = stored.status;
            *response.headers_mut() = stored.headers;
            if omitted {
                response
                    .headers_mut()
                    .insert(BODY_OMITTED_HEADER, HeaderValue::from_static("true"));
            }
            response
        }
        None => problem(
            StatusCode::INTERNAL_SERVER_ERROR,
            "idempotent_request_failed",
            "the first request with this idempotency key ended without a response; send the request again with a new idempotency key",
        ),
    };
    response
        .headers_mut()
        .insert(replayed.clone(), HeaderValue::from_static("true"));
    response
}

/// `text` as a JSON string literal.
fn json_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problems_are_json() {
        let r = problem(StatusCode::BAD_REQUEST, "x", "say \"hi\"\n\u{1}");
        assert_eq!(r.status(), StatusCode::BAD_REQUEST);
        assert_eq!(r.headers()[CONTENT_TYPE], "application/json");
        assert_eq!(
            r.body(),
            "{\"error\":\"x\",\"message\":\"say \\\"hi\\\"\\n\\u0001\"}"
        );
        let later = retry_later(StatusCode::CONFLICT, "c", "m", Duration::from_millis(1500));
        assert_eq!(later.headers()[RETRY_AFTER], "2");
        let soon = retry_later(StatusCode::CONFLICT, "c", "m", Duration::ZERO);
        assert_eq!(soon.headers()[RETRY_AFTER], "1");
    }

    #[test]
    fn replays_mark_themselves() {
        let marker = HeaderName::from_static("idempotent-replayed");
        let stored = StoredResponse {
            status: StatusCode::CREATED,
            headers: [(CONTENT_TYPE, HeaderValue::from_static("text/plain"))]
                .into_iter()
                .collect(),
            body: None,
        };
        let r = replay(&stored.encode(), &marker);
        assert_eq!(r.status(), StatusCode::CREATED);
        assert_eq!(r.headers()[&marker], "true");
        assert_eq!(r.headers()[BODY_OMITTED_HEADER], "true");
        assert!(r.body().is_empty());
        let none = replay(b"", &marker);
        assert_eq!(none.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(none.headers()[&marker], "true");
    }
}
