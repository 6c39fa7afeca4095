//! The read-only HTTP server of `baton status` and `baton serve-metrics`: an axum
//! [`Router`] served over hyper's HTTP/1.1 connections.
//!
//! The callers route; this module adds what every answer of a read-only operator page must
//! have, and bounds what a client can hold. No request bodies, no TLS: put it behind a
//! reverse proxy if it must be reachable beyond the host, and bind it to loopback otherwise.
//!
//! ## Behavior
//! - `GET` and `HEAD` only (a `HEAD` is answered like the `GET` without its body); any other
//!   method is answered 405 with `Allow: GET, HEAD`, whatever the path, before routing.
//! - One request per connection (`Connection: close`).
//! - A request head must arrive within [`Limits::head_timeout`] of the connection's start
//!   and fit in [`Limits::max_head`] bytes (else 431); a connection that does not send one
//!   in time is closed. A connection lives at most [`Limits::connection_deadline`], which
//!   bounds writing the answer to a client that does not read it.
//! - At most [`Limits::max_connections`] connections are open at once, idle ones included;
//!   further ones wait in the listen backlog. The limit is far above what one operator's
//!   browser and a Prometheus server open, so clients that connect and send nothing (port
//!   scanners, half-open connections of a crashed client, a load balancer's spare
//!   connections) do not delay an answer: each costs a small task until its head timeout
//!   closes it, and a request that arrives meanwhile is answered at once.
//! - Every response carries `Cache-Control: no-store` and `X-Content-Type-Options:
//!   nosniff`; HTML pages also carry a content security policy that allows no script, and
//!   `Referrer-Policy: no-referrer`.
//! - When `stop` resolves, the listener closes, requests in flight get
//!   [`Limits::shutdown_grace`] to finish, and connections still open then are dropped.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// What one client may hold, and for how long (see the module docs).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// How long a client has, from connecting, to send its request head.
    pub(crate) head_timeout: Duration,
    /// The longest a connection stays open, answer included.
    pub(crate) connection_deadline: Duration,
    /// The largest request head accepted, in bytes.
    pub(crate) max_head: usize,
    /// Connections open at once, idle ones included.
    pub(crate) max_connections: usize,
    /// How long requests in flight may take to finish once the server is told to stop.
    pub(crate) shutdown_grace: Duration,
}

impl Limits {
    /// The limits of `baton status` and `baton serve-metrics`.
    pub(crate) const OPERATOR: Limits = Limits {
        head_timeout: Duration::from_secs(10),
        connection_deadline: Duration::from_secs(40),
        max_head: 8 * 1024,
        max_connections: 512,
        shutdown_grace: Duration::from_secs(5),
    };
}

/// The content security policy of HTML pages: styles inline, nothing else.
const PAGE_POLICY: &str = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// Binds `addr`.
///
/// # Errors
/// When the address cannot be bound (in use, not local, no permission).
pub(crate) async fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// `router`, refusing every method but `GET` and `HEAD` and adding the headers every answer
/// carries (its routes and its fallback alike).
fn read_only(router: Router) -> Router {
    router.layer(middleware::from_fn(guard))
}

/// A fallback answer: 404 naming the paths that exist.
pub(crate) fn not_found(paths: &[&str]) -> Response {
    (
        StatusCode::NOT_FOUND,
        format!("not found; try {}\n", paths.join(", ")),
    )
        .into_response()
}

async fn guard(request: Request, next: Next) -> Response {
    let mut response = if request.method() == Method::GET || request.method() == Method::HEAD {
        next.run(request).await
    } else {
        (
            StatusCode::METHOD_NOT_ALLOWED,
            [(header::ALLOW, "GET, HEAD")],
            "this server is read-only: GET and HEAD only\n",
        )
            .into_response()
    };
    let is_page = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|t| t.to_str().ok())
        .is_some_and(|t| t.starts_with("text/html"));
    let headers = response.headers_mut();
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    if is_page {
        headers.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(PAGE_POLICY),
        );
        headers.insert(
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        );
    }
    response
}

/// Serves `router` ([`read_only`] is applied here) on `listener` until `stop` resolves
/// (then `Ok`, once the requests in flight are answered) or accepting fails (`Err`).
///
/// # Errors
/// The error that stopped the accept loop.
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    stop: impl Future<Output = ()>,
) -> io::Result<()> {
    let service = TowerToHyperService::new(read_only(router));
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.head_timeout)
        .max_header_size(limits.max_head)
        .keep_alive(false)
        // Header names as most servers write them (`Content-Type`), for people reading
        // answers with curl -i.
        .title_case_headers(true);
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let graceful = GracefulShutdown::new();
    let mut stop = std::pin::pin!(stop);
    loop {
        let slot = tokio::select! {
            slot = Arc::clone(&slots).acquire_owned() => match slot {
                Ok(slot) => slot,
                // Never closed: the semaphore lives in this function.
                Err(_) => break,
            },
            () = &mut stop => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                // A client that reset before we accepted it, or a momentary lack of file
                // descriptors: keep serving.
                Err(e) if is_transient(&e) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
                Err(e) => return Err(e),
            },
            () = &mut stop => break,
        };
        let connection =
            graceful.watch(http.serve_connection(TokioIo::new(stream), service.clone()));
        tokio::spawn(async move {
            let _slot = slot;
            match tokio::time::timeout(limits.connection_deadline, connection).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::debug!(error = %e, "http connection ended with an error"),
                Err(_) => tracing::debug!("closed an http connection open past its deadline"),
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(limits.shutdown_grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::debug!("dropped http connections still open at shutdown");
    }
    Ok(())
}

/// Resolves at the first SIGINT or SIGTERM.
///
/// # Errors
/// When the signal handlers cannot be installed.
pub(crate) fn stop_signal() -> io::Result<impl Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    Ok(async move {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
    })
}

fn is_transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
    ) || e.raw_os_error() == Some(24) // EMFILE
        || e.raw_os_error() == Some(23) // ENFILE
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::response::Html;
    use axum::routing::get;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;
    use tokio::sync::oneshot;

    /// A server of `/page` (HTML) and `/text` with `limits`; sending on the sender stops it.
    async fn start(
        limits: Limits,
    ) -> (
        SocketAddr,
        oneshot::Sender<()>,
        tokio::task::JoinHandle<io::Result<()>>,
    ) {
        let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let router = Router::new()
            .route("/page", get(|| async { Html("<p>hi</p>") }))
            .route("/text", get(|| async { "hello" }))
            .fallback(|| async { not_found(&["/page", "/text"]) });
        let (stop, stopped) = oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, router, limits, async move {
            let _ = stopped.await;
        }));
        (addr, stop, server)
    }

    async fn ask(addr: SocketAddr, request: &str) -> String {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.unwrap();
        answer
    }

    #[tokio::test]
    async fn serves_get_and_head_and_refuses_writes() {
        let (addr, stop, server) = start(Limits::OPERATOR).await;
        let page = ask(addr, "GET /page?x=1 HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(page.starts_with("HTTP/1.1 200 OK\r\n"), "{page}");
        assert!(
            page.contains("\r\nContent-Type: text/html; charset=utf-8\r\n"),
            "{page}"
        );
        assert!(
            page.contains("\r\nContent-Security-Policy: default-src 'none';"),
            "{page}"
        );
        assert!(
            page.contains("\r\nReferrer-Policy: no-referrer\r\n"),
            "{page}"
        );
        assert!(page.contains("\r\nCache-Control: no-store\r\n"), "{page}");
        assert!(
            page.contains("\r\nX-Content-Type-Options: nosniff\r\n"),
            "{page}"
        );
        assert!(page.contains("\r\nConnection: close\r\n"), "{page}");
        assert!(page.ends_with("\r\n\r\n<p>hi</p>"), "{page}");

        let text = ask(addr, "GET /text HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(text.ends_with("\r\n\r\nhello"), "{text}");
        assert!(!text.contains("Content-Security-Policy"), "{text}");
        assert!(text.contains("\r\nCache-Control: no-store\r\n"), "{text}");

        let head = ask(addr, "HEAD /text HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        assert!(head.ends_with("\r\n\r\n"), "{head}");

        for request in [
            "POST /text HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
            "DELETE /nowhere HTTP/1.1\r\nHost: x\r\n\r\n",
        ] {
            let refused = ask(addr, request).await;
            assert!(refused.starts_with("HTTP/1.1 405 "), "{refused}");
            assert!(refused.contains("\r\nAllow: GET, HEAD\r\n"), "{refused}");
            assert!(
                refused.contains("\r\nCache-Control: no-store\r\n"),
                "{refused}"
            );
        }
        let missing = ask(addr, "GET /nope HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(missing.starts_with("HTTP/1.1 404 "), "{missing}");
        assert!(
            missing.ends_with("not found; try /page, /text\n"),
            "{missing}"
        );
        assert!(
            missing.contains("\r\nX-Content-Type-Options: nosniff\r\n"),
            "{missing}"
        );

        assert!(
            ask(addr, "nonsense\r\n\r\n")
                .await
                .starts_with("HTTP/1.1 400 ")
        );
        let huge = format!(
            "GET /text HTTP/1.1\r\nHost: x\r\nX-Pad: {}\r\n\r\n",
            "a".repeat(16 * 1024)
        );
        assert!(ask(addr, &huge).await.starts_with("HTTP/1.1 431 "));

        stop.send(()).unwrap();
        server.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn quiet_connections_are_closed_at_the_head_timeout_and_delay_no_one() {
        let limits = Limits {
            head_timeout: Duration::from_millis(300),
            ..Limits::OPERATOR
        };
        let (addr, stop, server) = start(limits).await;
        let mut silent = TcpStream::connect(addr).await.unwrap();
        let mut half = TcpStream::connect(addr).await.unwrap();
        half.write_all(b"GET /text HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        let answer = ask(addr, "GET /text HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(answer.ends_with("hello"), "{answer}");
        for stream in [&mut silent, &mut half] {
            let mut rest = Vec::new();
            let closed =
                tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut rest)).await;
            assert!(
                closed.is_ok(),
                "a quiet connection outlived its head timeout"
            );
        }
        stop.send(()).unwrap();
        server.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn stopping_does_not_wait_for_quiet_connections() {
        let (addr, stop, server) = start(Limits::OPERATOR).await;
        let _silent = TcpStream::connect(addr).await.unwrap();
        // The connection is accepted before the stop.
        assert!(
            ask(addr, "GET /text HTTP/1.1\r\nHost: x\r\n\r\n")
                .await
                .ends_with("hello")
        );
        stop.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(3), server)
            .await
            .expect("the server stopped at once")
            .unwrap()
            .unwrap();
    }
}
