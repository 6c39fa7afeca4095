//! `baton status` and `baton serve-metrics` answer a request while 100 idle and half-open
//! connections are open: the answer comes while every one of those is still open, so it did
//! not wait for any of them to time out.

mod common;
mod http_support;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::process::Command;

use common::*;
use http_support::{METRICS, STATUS, serve};

/// Connections that connect and send nothing, and as many that send half a request head.
const IDLE: usize = 50;
const HALF_OPEN: usize = 50;

fn answers_beside_idle_connections(command: Command, prefix: &str, path: &str) {
    let (_server, addr) = serve(command, prefix);
    let mut quiet = Vec::new();
    for n in 0..IDLE + HALF_OPEN {
        let mut stream = TcpStream::connect(&addr).expect("connect an idle connection");
        if n >= IDLE {
            stream.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n").unwrap();
        }
        quiet.push(stream);
    }
    let (status, head, _) = http_support::get(&addr, path);
    assert_eq!(status, 200, "{head}");
    for (n, stream) in quiet.iter_mut().enumerate() {
        stream.set_nonblocking(true).unwrap();
        let mut byte = [0u8; 1];
        match stream.read(&mut byte) {
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            other => panic!(
                "quiet connection {n} was answered or closed ({other:?}) before the request was: the request waited for it"
            ),
        }
    }
}

#[test]
fn the_status_page_answers_beside_100_quiet_connections() {
    let env = Env::new();
    answers_beside_idle_connections(
        env.baton(["status", "--listen", "127.0.0.1:0"]),
        STATUS,
        "/status.json",
    );
}

#[test]
fn the_metrics_endpoint_answers_beside_100_quiet_connections() {
    let env = Env::new();
    answers_beside_idle_connections(
        env.baton(["serve-metrics", "--listen", "127.0.0.1:0"]),
        METRICS,
        "/metrics",
    );
}
