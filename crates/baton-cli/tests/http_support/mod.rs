//! Helpers for the tests of baton's HTTP servers (`baton status`, `baton serve-metrics`):
//! start one and learn its address, and make one request over a fresh connection.

#![allow(dead_code, unreachable_pub)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

use crate::common::{Running, eventually};

/// What `baton status` prints on stderr before its address.
pub const STATUS: &str = "baton status: serving http://";
/// What `baton serve-metrics` prints on stderr before its address.
pub const METRICS: &str = "baton serve-metrics: serving http://";

/// Starts `command` and waits for the address it prints on stderr after `prefix`.
pub fn serve(command: Command, prefix: &str) -> (Running, String) {
    let mut running = Running::spawn(command);
    let mut addr = String::new();
    eventually("the server's address on stderr", || {
        assert!(running.is_running(), "it exited:\n{}", running.stderr());
        match running
            .stderr()
            .lines()
            .find_map(|l| l.strip_prefix(prefix))
        {
            // The address is whole once the `/` after it has arrived: a line read while
            // it is being written may end in the middle of the port.
            Some(rest) => match rest.split_once('/') {
                Some((whole, _)) => {
                    addr = whole.to_owned();
                    true
                }
                None => false,
            },
            None => false,
        }
    });
    (running, addr)
}

/// A request over a fresh connection: `(status, head, body)`.
pub fn request(addr: &str, method: &str, path: &str) -> (u16, String, String) {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    write!(stream, "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("read the answer");
    let (head, body) = answer.split_once("\r\n\r\n").expect("a head");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status");
    (status, head.to_owned(), body.to_owned())
}

/// `GET path`: `(status, head, body)`.
pub fn get(addr: &str, path: &str) -> (u16, String, String) {
    request(addr, "GET", path)
}
