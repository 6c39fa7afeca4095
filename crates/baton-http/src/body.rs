//! [`IdempotentBody`]: the response body of an [`IdempotencyService`](crate::IdempotencyService).
//!
//! A response passes through unchanged, is replayed from the store, or is the guarded
//! response whose first bytes were read to be stored (and whose remainder, when it was
//! larger than the limit, still streams from the handler's body).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

/// The error type of [`IdempotentBody`]: the inner body's error, boxed.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

pin_project! {
    /// The response body of an [`IdempotencyService`](crate::IdempotencyService): the
    /// handler's body (passed through, or read in part to be stored), or bytes replayed
    /// from the store.
    pub struct IdempotentBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        // The handler's body, untouched.
        Inner { #[pin] body: B },
        // Bytes in memory: a replay, a guarded response read in full, or an error reply.
        Buffered { data: Option<Bytes> },
        // The bytes read so far, then the rest of the handler's body.
        Prefixed { prefix: Option<Bytes>, rest: Pin<Box<B>> },
        // The bytes read before the handler's body failed, then its error.
        Failed { prefix: Option<Bytes>, error: Option<BoxError> },
    }
}

impl<B> IdempotentBody<B> {
    pub(crate) fn inner(body: B) -> Self {
        IdempotentBody {
            kind: Kind::Inner { body },
        }
    }

    pub(crate) fn buffered(data: Bytes) -> Self {
        IdempotentBody {
            kind: Kind::Buffered {
                data: (!data.is_empty()).then_some(data),
            },
        }
    }

    pub(crate) fn prefixed(prefix: Bytes, rest: Pin<Box<B>>) -> Self {
        IdempotentBody {
            kind: Kind::Prefixed {
                prefix: (!prefix.is_empty()).then_some(prefix),
                rest,
            },
        }
    }

    pub(crate) fn failed(prefix: Bytes, error: BoxError) -> Self {
        IdempotentBody {
            kind: Kind::Failed {
                prefix: (!prefix.is_empty()).then_some(prefix),
                error: Some(error),
            },
        }
    }
}

impl<B> Body for IdempotentBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.project().kind.project() {
            KindProj::Inner { body } => body.poll_frame(cx).map_err(Into::into),
            KindProj::Buffered { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            KindProj::Prefixed { prefix, rest } => match prefix.take() {
                Some(p) => Poll::Ready(Some(Ok(Frame::data(p)))),
                None => rest.as_mut().poll_frame(cx).map_err(Into::into),
            },
            KindProj::Failed { prefix, error } => Poll::Ready(match prefix.take() {
                Some(p) => Some(Ok(Frame::data(p))),
                None => error.take().map(Err),
            }),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Buffered { data } => data.is_none(),
            Kind::Prefixed { prefix, rest } => prefix.is_none() && rest.is_end_stream(),
            Kind::Failed { prefix, error } => prefix.is_none() && error.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Buffered { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            Kind::Prefixed { prefix, rest } => {
                let extra = prefix.as_ref().map_or(0, |p| p.len() as u64);
                let inner = rest.size_hint();
                let mut hint = SizeHint::new();
                hint.set_lower(inner.lower() + extra);
                if let Some(upper) = inner.upper() {
                    hint.set_upper(upper + extra);
                }
                hint
            }
            Kind::Failed { .. } => SizeHint::default(),
        }
    }
}

impl<B> std::fmt::Debug for IdempotentBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.kind {
            Kind::Inner { .. } => "inner",
            Kind::Buffered { .. } => "buffered",
            Kind::Prefixed { .. } => "prefixed",
            Kind::Failed { .. } => "failed",
        };
        f.debug_struct("IdempotentBody")
            .field("kind", &kind)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Full};

    #[tokio::test]
    async fn every_kind_yields_its_bytes() {
        let inner = IdempotentBody::inner(Full::new(Bytes::from_static(b"abc")));
        assert_eq!(inner.collect().await.unwrap().to_bytes(), "abc");
        let buffered = IdempotentBody::<Full<Bytes>>::buffered(Bytes::from_static(b"xyz"));
        assert_eq!(buffered.size_hint().exact(), Some(3));
        assert_eq!(buffered.collect().await.unwrap().to_bytes(), "xyz");
        let empty = IdempotentBody::<Full<Bytes>>::buffered(Bytes::new());
        assert!(empty.is_end_stream());
        let prefixed = IdempotentBody::prefixed(
            Bytes::from_static(b"12"),
            Box::pin(Full::new(Bytes::from_static(b"345"))),
        );
        assert_eq!(prefixed.size_hint().exact(), Some(5));
        assert_eq!(prefixed.collect().await.unwrap().to_bytes(), "12345");
        let failed =
            IdempotentBody::<Full<Bytes>>::failed(Bytes::from_static(b"12"), "boom".into());
        let err = failed.collect().await.unwrap_err();
        assert_eq!(err.to_string(), "boom");
    }
}
