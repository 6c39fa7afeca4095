//! A small, read-only HTTP/1.1 server for `baton status` and `baton serve-metrics`.
//!
//! It answers `GET` and `HEAD`, one request per connection (`Connection: close`), and
//! nothing else (405). It is deliberately small: no keep-alive, no request bodies, no TLS.
//! Put it behind a reverse proxy if it must be reachable beyond the host, and bind it to
//! loopback otherwise.
//!
//! ## Behavior
//! - A request head must arrive within [`READ_TIMEOUT`] and fit in [`MAX_HEAD`] bytes
//!   (else 408 or 431); a response must be written within [`WRITE_TIMEOUT`].
//! - At most [`MAX_CONNECTIONS`] connections are open at once, idle ones included; further
//!   ones wait in the listen backlog. The limit is far above what one operator's browser
//!   and a Prometheus server open, so that clients that connect and send nothing (port
//!   scanners, half-open connections of a crashed client, a load balancer's spare
//!   connections) do not delay an answer: each costs a small task until its
//!   [`READ_TIMEOUT`] closes it, and a request that arrives meanwhile is answered at once.
//! - Every response carries `Cache-Control: no-store` and `X-Content-Type-Options:
//!   nosniff`; pages also carry a content security policy that allows no script.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::timeout;

/// How long a client has to send its request head.
pub(crate) const READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long writing a response may take.
pub(crate) const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// The largest request head accepted.
pub(crate) const MAX_HEAD: usize = 8 * 1024;
/// Connections open at once, idle ones included (see the module docs).
pub(crate) const MAX_CONNECTIONS: usize = 512;

/// The content security policy of HTML pages: styles inline, nothing else.
const PAGE_POLICY: &str = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// A parsed request line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Request {
    /// `GET` or `HEAD` (others never reach a handler).
    pub(crate) method: String,
    /// The path, without the query.
    pub(crate) path: String,
}

/// A response to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Response {
    status: u16,
    content_type: &'static str,
    body: Vec<u8>,
}

impl Response {
    /// 200 with an HTML page.
    pub(crate) fn html(body: String) -> Self {
        Response::ok("text/html; charset=utf-8", body.into_bytes())
    }

    /// 200 with a JSON document.
    pub(crate) fn json(body: Vec<u8>) -> Self {
        Response::ok("application/json", body)
    }

    /// 200 with `content_type`.
    pub(crate) fn ok(content_type: &'static str, body: Vec<u8>) -> Self {
        Response {
            status: 200,
            content_type,
            body,
        }
    }

    /// 404 naming the paths that exist.
    pub(crate) fn not_found(paths: &[&str]) -> Self {
        Response::error(404, &format!("not found; try {}", paths.join(", ")))
    }

    /// A plain-text error response.
    pub(crate) fn error(status: u16, message: &str) -> Self {
        Response {
            status,
            content_type: "text/plain; charset=utf-8",
            body: format!("{message}\n").into_bytes(),
        }
    }

    fn head(&self) -> String {
        let mut head = format!(
            "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nCache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\nConnection: close\r\n",
            self.status,
            reason(self.status),
            self.content_type,
            self.body.len()
        );
        if self.content_type.starts_with("text/html") {
            head.push_str(&format!(
                "Content-Security-Policy: {PAGE_POLICY}\r\nReferrer-Policy: no-referrer\r\n"
            ));
        }
        if self.status == 405 {
            head.push_str("Allow: GET, HEAD\r\n");
        }
        head.push_str("\r\n");
        head
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "Internal Server Error",
    }
}

/// Binds `addr`.
///
/// # Errors
/// When the address cannot be bound (in use, not local, no permission).
pub(crate) async fn bind(addr: std::net::SocketAddr) -> io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Serves connections from `listener` with `handler` until accepting fails.
///
/// # Errors
/// The error that stopped the accept loop.
pub(crate) async fn serve<H, F>(listener: TcpListener, handler: H) -> io::Error
where
    H: Fn(Request) -> F + Send + Sync + 'static,
    F: Future<Output = Response> + Send + 'static,
{
    let handler = Arc::new(handler);
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            return io::Error::other("connection limiter closed");
        };
        let (stream, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            // A client that reset before we accepted it, or a momentary lack of file
            // descriptors: keep serving.
            Err(e) if is_transient(&e) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            Err(e) => return e,
        };
        let handler = Arc::clone(&handler);
        tokio::spawn(async move {
            let _slot = slot;
            if let Err(e) = connection(stream, handler.as_ref()).await {
                tracing::debug!(error = %e, "http connection ended with an error");
            }
        });
    }
}

/// Serves until SIGINT or SIGTERM (then `Ok`) or until accepting fails (`Err`).
///
/// # Errors
/// When the signal handlers cannot be installed, or accepting fails.
pub(crate) async fn serve_until_stopped<H, F>(listener: TcpListener, handler: H) -> io::Result<()>
where
    H: Fn(Request) -> F + Send + Sync + 'static,
    F: Future<Output = Response> + Send + 'static,
{
    use tokio::signal::unix::{SignalKind, signal};
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    tokio::select! {
        error = serve(listener, handler) => Err(error),
        _ = interrupt.recv() => Ok(()),
        _ = terminate.recv() => Ok(()),
    }
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

async fn connection<H, F>(mut stream: TcpStream, handler: &H) -> io::Result<()>
where
    H: Fn(Request) -> F,
    F: Future<Output = Response>,
{
    let (response, head_only) = match timeout(READ_TIMEOUT, read_head(&mut stream)).await {
        Err(_) => (
            Response::error(408, "request head not received in time"),
            false,
        ),
        Ok(Err(e)) => return Err(e),
        Ok(Ok(Head::TooLarge)) => (Response::error(431, "request head too large"), false),
        Ok(Ok(Head::Closed)) => return Ok(()),
        Ok(Ok(Head::Complete(text))) => match parse(&text) {
            None => (Response::error(400, "malformed request"), false),
            Some(request) if request.method == "GET" || request.method == "HEAD" => {
                let head_only = request.method == "HEAD";
                (handler(request).await, head_only)
            }
            Some(_) => (
                Response::error(405, "this server is read-only: GET and HEAD only"),
                false,
            ),
        },
    };
    let write = async {
        stream.write_all(response.head().as_bytes()).await?;
        if !head_only {
            stream.write_all(&response.body).await?;
        }
        stream.shutdown().await
    };
    timeout(WRITE_TIMEOUT, write)
        .await
        .unwrap_or_else(|_| Err(io::Error::new(io::ErrorKind::TimedOut, "write timed out")))
}

enum Head {
    Complete(String),
    TooLarge,
    Closed,
}

async fn read_head(stream: &mut TcpStream) -> io::Result<Head> {
    let mut buffer = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(Head::Closed);
        }
        buffer.extend_from_slice(&chunk[..n]);
        if let Some(end) = find(&buffer, b"\r\n\r\n") {
            return Ok(Head::Complete(
                String::from_utf8_lossy(&buffer[..end]).into_owned(),
            ));
        }
        if buffer.len() > MAX_HEAD {
            return Ok(Head::TooLarge);
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The method and path of a request head (`GET /status.json?x=1 HTTP/1.1`).
fn parse(head: &str) -> Option<Request> {
    let line = head.lines().next()?;
    let mut parts = line.split(' ');
    let (method, target, version) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || !version.starts_with("HTTP/1.") || !target.starts_with('/') {
        return None;
    }
    let path = target.split(['?', '#']).next().unwrap_or("/");
    Some(Request {
        method: method.to_owned(),
        path: path.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_lines() {
        assert_eq!(
            parse("GET /status.json?x=1 HTTP/1.1\r\nHost: a"),
            Some(Request {
                method: "GET".into(),
                path: "/status.json".into()
            })
        );
        assert_eq!(parse("GET / HTTP/1.0").unwrap().path, "/");
        assert_eq!(parse("GET http://x/ HTTP/1.1"), None);
        assert_eq!(parse("GET /"), None);
        assert_eq!(parse("GET / SPDY/3"), None);
        assert_eq!(parse(""), None);
    }

    #[test]
    fn response_heads() {
        let page = Response::html("<p>hi</p>".into()).head();
        assert!(page.starts_with("HTTP/1.1 200 OK\r\n"), "{page}");
        assert!(page.contains("Content-Length: 9\r\n"));
        assert!(page.contains("Content-Security-Policy: default-src 'none'"));
        let refused = Response::error(405, "no").head();
        assert!(refused.contains("Allow: GET, HEAD\r\n"));
        assert!(!refused.contains("Content-Security-Policy"));
    }

    #[tokio::test]
    async fn serves_get_and_refuses_writes() {
        let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(serve(listener, |request: Request| async move {
            Response::ok("text/plain", request.path.into_bytes())
        }));
        let ask = |request: &'static str| async move {
            let mut stream = TcpStream::connect(addr).await.unwrap();
            stream.write_all(request.as_bytes()).await.unwrap();
            let mut answer = String::new();
            stream.read_to_string(&mut answer).await.unwrap();
            answer
        };
        let got = ask("GET /hello?x HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(got.starts_with("HTTP/1.1 200 OK"), "{got}");
        assert!(got.ends_with("\r\n\r\n/hello"), "{got}");
        let head = ask("HEAD /hello HTTP/1.1\r\n\r\n").await;
        assert!(head.ends_with("\r\n\r\n"), "{head}");
        assert!(
            ask("POST / HTTP/1.1\r\n\r\n")
                .await
                .starts_with("HTTP/1.1 405")
        );
        assert!(ask("nonsense\r\n\r\n").await.starts_with("HTTP/1.1 400"));
        server.abort();
    }
}
