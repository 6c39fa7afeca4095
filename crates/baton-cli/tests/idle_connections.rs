//! `baton status` and `baton serve-metrics` answer a request while 100 idle and half-open
//! connections are open: the answer comes while every one of those is still open, so it did
//! not wait for any of them to time out.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

use common::*;

/// Connections that connect and send nothing, and as many that send half a request head.
const IDLE: usize = 50;
const HALF_OPEN: usize = 50;

/// Starts `command` and waits for the address it prints on stderr after `prefix`.
fn serve(command: Command, prefix: &str) -> (Running, String) {
    let mut running = Running::spawn(command);
    let mut addr = String::new();
    eventually("the server's address on stderr", || {
        assert!(running.is_running(), "it exited:\n{}", running.stderr());
        match running
            .stderr()
            .lines()
            .find_map(|l| l.strip_prefix(prefix))
        {
            Some(rest) => {
                addr = rest.split('/').next().unwrap_or_default().to_owned();
                true
            }
            None => false,
        }
    });
    (running, addr)
}

fn status_line(addr: &str, path: &str) -> String {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("read the answer");
    answer.lines().next().unwrap_or_default().to_owned()
}

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
    assert_eq!(status_line(&addr, path), "HTTP/1.1 200 OK");
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
        "baton status: serving http://",
        "/status.json",
    );
}

#[test]
fn the_metrics_endpoint_answers_beside_100_quiet_connections() {
    let env = Env::new();
    answers_beside_idle_connections(
        env.baton(["serve-metrics", "--listen", "127.0.0.1:0"]),
        "baton serve-metrics: serving http://",
        "/metrics",
    );
}
