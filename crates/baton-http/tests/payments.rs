//! The example payment service, over real HTTP, on every store: concurrent retries of each
//! charge (the same `Idempotency-Key`, sent to every replica at once) charge the card once.
//!
//! Each replica is a child process running the example's own `run` (this test binary run
//! again with a role, see `baton_testkit::process`), with `BATON_STORE` naming the store and
//! a charge delay so that retries arrive while the first is still running. Memory runs one
//! replica; SQLite, Redis and PostgreSQL run two on one file or one private server. The
//! client is a plain HTTP/1.1 exchange over a TCP stream.

#[path = "../examples/payments.rs"]
#[allow(dead_code, unreachable_pub)]
mod payments;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use baton_testkit::postgres::PostgresServer;
use baton_testkit::process::{self, Child, ChildTest};
use baton_testkit::redis::RedisServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const STARTUP: Duration = Duration::from_secs(120);
/// How many clients retry each charge at once.
const CLIENTS: usize = 12;

#[test]
fn memory_store_charges_once() {
    charges_once("memory://", 1);
}

#[test]
fn sqlite_store_charges_once_across_two_replicas() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("payments.db").display());
    charges_once(&url, 2);
}

#[test]
fn redis_store_charges_once_across_two_replicas() {
    let server = RedisServer::start().expect("a private redis-server");
    charges_once(&server.url(), 2);
}

#[test]
fn postgres_store_charges_once_across_two_replicas() {
    let server = PostgresServer::start().expect("a private PostgreSQL server");
    charges_once(&server.url(), 2);
}

#[test]
#[ignore = "a child process of the tests above: one replica of the payment service"]
fn replica() {
    let Some(_role) = process::role() else { return };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime
        .block_on(payments::run(vec!["--listen".into(), "127.0.0.1:0".into()]))
        .unwrap();
}

/// Starts `replicas` services on `store`, then for each of 4 charges sends `CLIENTS`
/// concurrent requests with one key (spread over the replicas, retrying each 409), and
/// checks that every client got the same charge, one of them first-hand, and that the
/// cards were charged exactly once.
fn charges_once(store: &str, replicas: usize) {
    let mut children: Vec<Child> = (0..replicas)
        .map(|i| {
            ChildTest::new("replica", format!("replica-{i}"))
                .env("BATON_STORE", store)
                .env("PAYMENTS_CHARGE_DELAY_MS", "300")
                .spawn()
                .unwrap()
        })
        .collect();
    let addrs: Vec<SocketAddr> = children.iter().map(listening_on).collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let run = format!("{:x}", std::process::id());
    runtime.block_on(async {
        let mut charges = Vec::new();
        for i in 0..4u64 {
            let key = format!("charge-{run}-{i}");
            let card = format!("card-{run}-{i}");
            let body = format!("{{\"card\": \"{card}\", \"amount\": {}}}", 100 * (i + 1));
            charges.push(tokio::spawn(retry_concurrently(addrs.clone(), key, body)));
        }
        for (i, charge) in charges.into_iter().enumerate() {
            let replies = charge.await.unwrap();
            let first_hand = replies.iter().filter(|r| !r.replayed).count();
            assert_eq!(
                first_hand, 1,
                "one client got the charge first-hand: {replies:#?}"
            );
            for reply in &replies {
                assert_eq!(reply.status, 201, "{reply:?}");
                assert_eq!(
                    reply.body, replies[0].body,
                    "every client saw the same charge"
                );
            }
            let card = format!("card-{run}-{i}");
            let mut charged = 0;
            for addr in &addrs {
                let reply = http(*addr, "GET", &format!("/cards/{card}"), None, "").await;
                assert_eq!(reply.status, 200);
                let value: serde_json::Value = serde_json::from_str(&reply.body).unwrap();
                charged += value["charged"].as_u64().unwrap();
            }
            assert_eq!(
                charged,
                100 * (i as u64 + 1),
                "card {card} was charged exactly once"
            );
        }
        // The same key for a different charge is refused, and charges nothing.
        let key = format!("charge-{run}-0");
        let other = format!("{{\"card\": \"card-{run}-0\", \"amount\": 5}}");
        let reply = http(addrs[0], "POST", "/charges", Some(&key), &other).await;
        assert_eq!(reply.status, 422, "{reply:?}");
        // Without a key the charge endpoint refuses to run.
        let reply = http(addrs[0], "POST", "/charges", None, &other).await;
        assert_eq!(reply.status, 400, "{reply:?}");
    });
    for child in &mut children {
        let _ = child.kill();
    }
}

/// `CLIENTS` clients send the same request at once, round-robin over `addrs`, each
/// retrying after `Retry-After` while it gets 409; their final replies.
async fn retry_concurrently(addrs: Vec<SocketAddr>, key: String, body: String) -> Vec<Reply> {
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let (addr, key, body) = (addrs[i % addrs.len()], key.clone(), body.clone());
            tokio::spawn(async move {
                for _ in 0..60 {
                    let reply = http(addr, "POST", "/charges", Some(&key), &body).await;
                    if reply.status != 409 {
                        return reply;
                    }
                    let after: u64 = reply.headers["retry-after"].parse().unwrap();
                    tokio::time::sleep(Duration::from_secs(after)).await;
                }
                panic!("still 409 after 60 retries");
            })
        })
        .collect();
    let mut replies = Vec::new();
    for client in clients {
        replies.push(client.await.unwrap());
    }
    replies
}

/// Reads the address a replica printed, waiting for it to start.
fn listening_on(child: &Child) -> SocketAddr {
    const MARK: &str = "payments: listening on http://";
    process::wait_until("a replica to listen", STARTUP, || {
        child.output().contains(MARK)
    })
    .unwrap_or_else(|e| panic!("{e}; its output:\n{}", child.output()));
    let output = child.output();
    let at = output.find(MARK).unwrap() + MARK.len();
    output[at..]
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[derive(Debug)]
struct Reply {
    status: u16,
    headers: BTreeMap<String, String>,
    body: String,
    replayed: bool,
}

/// One HTTP/1.1 exchange on a new connection.
async fn http(addr: SocketAddr, method: &str, path: &str, key: Option<&str>, body: &str) -> Reply {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    if let Some(key) = key {
        request.push_str(&format!("Idempotency-Key: {key}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8(raw).unwrap();
    let (head, rest) = text.split_once("\r\n\r\n").expect("a complete response");
    let mut lines = head.lines();
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: BTreeMap<String, String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let body = if headers
        .get("transfer-encoding")
        .is_some_and(|v| v == "chunked")
    {
        dechunk(rest)
    } else {
        rest.to_owned()
    };
    let replayed = headers
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true");
    Reply {
        status,
        headers,
        body,
        replayed,
    }
}

fn dechunk(mut rest: &str) -> String {
    let mut body = String::new();
    while let Some((size, tail)) = rest.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).unwrap();
        if size == 0 {
            break;
        }
        body.push_str(&tail[..size]);
        rest = &tail[size + 2..];
    }
    body
}
