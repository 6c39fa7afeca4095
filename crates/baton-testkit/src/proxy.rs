//! [`FaultProxy`]: a TCP proxy on a loopback port that injects network faults between a
//! client and a server.
//!
//! Point the client at [`FaultProxy::addr`] instead of the server, then switch faults on
//! and off while the test runs:
//!
//! | call | what the client sees |
//! |---|---|
//! | [`set_latency(d)`](FaultProxy::set_latency) | every chunk of bytes delayed by `d` in each direction (a round trip by `2d`) |
//! | [`blackhole`](FaultProxy::blackhole) | silence: connections (also new ones) stay open, nothing is forwarded either way; bytes are held, not lost, and delivered late by [`heal`](FaultProxy::heal), as TCP delivers them after a partition |
//! | [`drop_replies`](FaultProxy::drop_replies) | requests reach the server, its replies are swallowed; `heal` then resets each connection that lost bytes |
//! | [`reset`](FaultProxy::reset) | every connection, and every new one until `heal`, closed with a TCP RST |
//! | [`kill_connections`](FaultProxy::kill_connections) | the current connections closed with a TCP RST, once; new ones work |
//! | [`strand_connections`](FaultProxy::strand_connections) | the current connections go silent for good, without a reset (as when a middlebox drops their state, or the peer's host vanishes); new ones work |
//!
//! Why `drop_replies` ends in a reset: a TCP stream never loses bytes in the middle, so a
//! reply is only ever lost together with its connection. A client such as a pipelining Redis
//! connection matches replies to requests by order, and would match every later reply to
//! the wrong request if the stream went on after a gap. So the proxy keeps the connection
//! silent while the fault lasts (the client sees a response timeout, not knowing whether its
//! request ran: the hard case) and breaks it when the fault is healed. To drop "the reply to
//! a release", switch the mode on around that one call:
//!
//! ```no_run
//! # fn demo(server: std::net::SocketAddr) -> std::io::Result<()> {
//! use baton_testkit::proxy::FaultProxy;
//!
//! let proxy = FaultProxy::start(server)?;
//! let url = format!("redis://{}", proxy.addr());
//! // ... connect the store to `url`, acquire ...
//! proxy.drop_replies();
//! // ... release: it reaches the server, its answer does not come back ...
//! proxy.heal();
//! # let _ = url; Ok(()) }
//! ```
//!
//! ## Behavior
//! - Only loopback addresses: the proxy listens on `127.0.0.1` and refuses a non-loopback
//!   upstream.
//! - Every thread stops by itself: each blocking call has a timeout of at most
//!   [`TICK`], after which it re-reads the switches; dropping the proxy closes every
//!   connection and joins every thread.
//! - A connection whose upstream cannot be reached is closed with a reset, as a refused
//!   connection would be.

use std::collections::VecDeque;
use std::fmt;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use socket2::SockRef;

/// The longest any proxy thread blocks before it looks at the switches again.
pub const TICK: Duration = Duration::from_millis(5);

/// How long the proxy waits for the upstream to accept a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// What the proxy currently does to the bytes it forwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Forward everything (after the configured latency).
    None,
    /// Forward nothing, either way; hold the bytes until healed.
    Blackhole,
    /// Forward requests; swallow the server's replies. Healing resets the connections
    /// that lost bytes.
    DropReplies,
    /// Close every connection, current and new, with a TCP RST.
    Reset,
}

/// A TCP fault proxy. See the [module docs](self).
pub struct FaultProxy {
    addr: SocketAddr,
    upstream: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

#[derive(Default)]
struct Shared {
    switches: Mutex<Switches>,
    connections: Mutex<Vec<Weak<Connection>>>,
    pumps: Mutex<Vec<JoinHandle<()>>>,
    stopping: AtomicBool,
    accepted: AtomicU64,
    dropped_bytes: AtomicU64,
    /// Bytes read from one side and not yet written to the other.
    pending_bytes: AtomicU64,
}

#[derive(Debug, Clone, Copy)]
struct Switches {
    latency: Duration,
    fault: Fault,
}

impl Default for Switches {
    fn default() -> Self {
        Switches {
            latency: Duration::ZERO,
            fault: Fault::None,
        }
    }
}

/// One proxied connection: the client's socket and ours to the server.
struct Connection {
    client: TcpStream,
    server: TcpStream,
    /// Set by a reset: both pumps stop and the sockets close with RST.
    aborted: AtomicBool,
    /// Set by [`FaultProxy::strand_connections`]: nothing is forwarded any more, either way,
    /// and the sockets stay open.
    stranded: AtomicBool,
    /// Server bytes were swallowed: the stream can no longer go on.
    lost_bytes: AtomicBool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    /// Client to server: requests.
    Up,
    /// Server to client: replies.
    Down,
}

impl FaultProxy {
    /// Starts a proxy on a free loopback port, forwarding to `upstream`.
    ///
    /// # Errors
    /// `InvalidInput` for a non-loopback upstream; an I/O error when no port can be bound.
    pub fn start(upstream: SocketAddr) -> io::Result<FaultProxy> {
        if !upstream.ip().is_loopback() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("the fault proxy forwards to loopback addresses only, not {upstream}"),
            ));
        }
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared::default());
        let acceptor = std::thread::Builder::new()
            .name(format!("fault-proxy-{}", addr.port()))
            .spawn({
                let shared = Arc::clone(&shared);
                move || accept_loop(&listener, upstream, &shared)
            })?;
        Ok(FaultProxy {
            addr,
            upstream,
            shared,
            acceptor: Some(acceptor),
        })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The server the proxy forwards to.
    pub fn upstream(&self) -> SocketAddr {
        self.upstream
    }

    /// The fault in force.
    pub fn fault(&self) -> Fault {
        self.shared.switches().fault
    }

    /// Delays every chunk of bytes by `latency` in each direction (zero for none). Applies
    /// to bytes read from now on; kept across [`FaultProxy::heal`].
    pub fn set_latency(&self, latency: Duration) {
        self.shared.switches().latency = latency;
    }

    /// Stops forwarding, both ways, on every connection, also ones accepted from now on.
    /// Bytes are held and delivered, late, after [`FaultProxy::heal`].
    pub fn blackhole(&self) {
        self.set_fault(Fault::Blackhole);
    }

    /// Forwards the clients' bytes but swallows the server's, until [`FaultProxy::heal`],
    /// which resets every connection that lost bytes (see the [module docs](self) for why).
    pub fn drop_replies(&self) {
        self.set_fault(Fault::DropReplies);
    }

    /// Closes every connection with a TCP RST, and every new one until
    /// [`FaultProxy::heal`], as a server that crashes and refuses would.
    pub fn reset(&self) {
        self.set_fault(Fault::Reset);
        self.kill_connections();
    }

    /// Ends the fault in force (latency stays): held bytes are delivered, and connections
    /// that lost bytes to [`FaultProxy::drop_replies`] are reset.
    pub fn heal(&self) {
        // After this, no pump can drop another reply, and every connection that lost one
        // is marked (see `pump`).
        self.set_fault(Fault::None);
        for connection in self.shared.live_connections() {
            if connection.lost_bytes.load(Ordering::SeqCst) {
                connection.abort();
            }
        }
    }

    /// Closes every current connection with a TCP RST, once; new connections are
    /// forwarded as usual.
    pub fn kill_connections(&self) {
        for connection in self.shared.live_connections() {
            connection.abort();
        }
    }

    /// Silences every current connection for good: nothing more is forwarded either way,
    /// and the sockets stay open, so the client waits for replies that never come (until its
    /// own timeouts). New connections are forwarded as usual; [`FaultProxy::heal`] does not
    /// revive stranded ones. This is a pooled connection whose path died without a word: a
    /// NAT or load balancer that dropped its state, a peer host that vanished.
    pub fn strand_connections(&self) {
        for connection in self.shared.live_connections() {
            connection.stranded.store(true, Ordering::SeqCst);
        }
    }

    /// How many connections the proxy has accepted.
    pub fn accepted(&self) -> u64 {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// How many connections are open.
    pub fn open_connections(&self) -> usize {
        self.shared.live_connections().len()
    }

    /// How many bytes the proxy has read and not yet delivered (held by a blackhole or
    /// delayed by latency). After [`FaultProxy::heal`], zero means every held request has
    /// been handed to the server.
    pub fn pending_bytes(&self) -> u64 {
        self.shared.pending_bytes.load(Ordering::SeqCst)
    }

    /// How many reply bytes [`FaultProxy::drop_replies`] has swallowed.
    pub fn dropped_bytes(&self) -> u64 {
        self.shared.dropped_bytes.load(Ordering::SeqCst)
    }

    fn set_fault(&self, fault: Fault) {
        self.shared.switches().fault = fault;
    }
}

/// Calls `call` until it succeeds, as a client goes on calling after a fault: every failure
/// must be `Unavailable` (anything else panics), and the failures are returned in order, so a
/// test can bound how many calls a fault cost. Panics, naming `what`, when no call has
/// succeeded after `limit`.
pub async fn failures_until_ok<T, F, Fut>(
    what: &str,
    limit: Duration,
    mut call: F,
) -> Vec<baton_core::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = baton_core::Result<T>>,
{
    let started = Instant::now();
    let mut failures = Vec::new();
    loop {
        match call().await {
            Ok(_) => return failures,
            Err(e) => {
                assert_eq!(e.kind(), baton_core::ErrorKind::Unavailable, "{e}");
                assert!(
                    started.elapsed() < limit,
                    "{what}: no call succeeded within {limit:?}; {} failed, the last: {e}",
                    failures.len() + 1
                );
                failures.push(e);
            }
        }
    }
}

impl fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let switches = *self.shared.switches();
        f.debug_struct("FaultProxy")
            .field("addr", &self.addr)
            .field("upstream", &self.upstream)
            .field("fault", &switches.fault)
            .field("latency", &switches.latency)
            .finish()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        self.kill_connections();
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
        let pumps = std::mem::take(&mut *lock(&self.shared.pumps));
        for pump in pumps {
            let _ = pump.join();
        }
    }
}

impl Shared {
    fn switches(&self) -> MutexGuard<'_, Switches> {
        lock(&self.switches)
    }

    fn live_connections(&self) -> Vec<Arc<Connection>> {
        let mut connections = lock(&self.connections);
        connections.retain(|c| c.strong_count() > 0);
        connections.iter().filter_map(Weak::upgrade).collect()
    }

    fn unpend(&self, n: usize) {
        self.pending_bytes.fetch_sub(n as u64, Ordering::SeqCst);
    }

    fn stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }
}

impl Connection {
    /// Stops both pumps; the sockets close with RST when the last pump lets go of them.
    fn abort(&self) {
        for socket in [&self.client, &self.server] {
            let _ = SockRef::from(socket).set_linger(Some(Duration::ZERO));
        }
        self.aborted.store(true, Ordering::SeqCst);
    }

    fn aborted(&self) -> bool {
        self.aborted.load(Ordering::SeqCst)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

fn accept_loop(listener: &TcpListener, upstream: SocketAddr, shared: &Arc<Shared>) {
    while !shared.stopping() {
        match listener.accept() {
            Ok((client, _)) => {
                shared.accepted.fetch_add(1, Ordering::SeqCst);
                if let Err(client) = open(client, upstream, shared) {
                    abort_socket(&client);
                }
            }
            Err(_) => std::thread::sleep(TICK / 5),
        }
        // Forget the threads of closed connections.
        lock(&shared.pumps).retain(|pump| !pump.is_finished());
    }
}

/// Connects `client` to the upstream and starts its two pumps; hands `client` back when
/// it should be refused.
fn open(client: TcpStream, upstream: SocketAddr, shared: &Arc<Shared>) -> Result<(), TcpStream> {
    if shared.switches().fault == Fault::Reset {
        return Err(client);
    }
    let Ok(server) = TcpStream::connect_timeout(&upstream, CONNECT_TIMEOUT) else {
        return Err(client);
    };
    let configured = client
        .set_nonblocking(false)
        .and_then(|()| client.set_nodelay(true))
        .and_then(|()| server.set_nodelay(true))
        .and_then(|()| client.set_write_timeout(Some(TICK)))
        .and_then(|()| server.set_write_timeout(Some(TICK)));
    if configured.is_err() {
        abort_socket(&server);
        return Err(client);
    }
    let connection = Arc::new(Connection {
        client,
        server,
        aborted: AtomicBool::new(false),
        stranded: AtomicBool::new(false),
        lost_bytes: AtomicBool::new(false),
    });
    lock(&shared.connections).push(Arc::downgrade(&connection));
    for direction in [Direction::Up, Direction::Down] {
        let (for_pump, shared_for_pump) = (Arc::clone(&connection), Arc::clone(shared));
        let spawned = std::thread::Builder::new()
            .name(format!("fault-proxy-pump-{direction:?}"))
            .spawn(move || pump(&shared_for_pump, &for_pump, direction));
        match spawned {
            Ok(handle) => lock(&shared.pumps).push(handle),
            Err(_) => connection.abort(),
        }
    }
    Ok(())
}

fn abort_socket(socket: &TcpStream) {
    let _ = SockRef::from(socket).set_linger(Some(Duration::ZERO));
}

/// Forwards one direction of `connection` until either side closes or the connection is
/// aborted.
fn pump(shared: &Shared, connection: &Connection, direction: Direction) {
    let (mut from, mut to) = match direction {
        Direction::Up => (&connection.client, &connection.server),
        Direction::Down => (&connection.server, &connection.client),
    };
    // Bytes read, with the instant they may be delivered.
    let mut queue: VecDeque<(Instant, Vec<u8>)> = VecDeque::new();
    let mut buffer = vec![0u8; 16 * 1024];
    let mut eof = false;
    let ended_cleanly = 'forward: loop {
        if shared.stopping() || connection.aborted() {
            break false;
        }
        if connection.stranded.load(Ordering::SeqCst) {
            // Neither read nor write: the bytes stay in the kernel's buffers, unanswered.
            std::thread::sleep(TICK);
            continue;
        }
        let fault = shared.switches().fault;
        if fault == Fault::Reset {
            connection.abort();
            break false;
        }
        if fault != Fault::Blackhole {
            let now = Instant::now();
            while queue.front().is_some_and(|(due, _)| *due <= now) {
                let (_, bytes) = queue.pop_front().expect("a due chunk");
                let written = write_fully(&mut to, &bytes, shared, connection);
                shared.unpend(bytes.len());
                if written.is_err() {
                    break 'forward false;
                }
            }
            if eof && queue.is_empty() {
                // Pass the half-close on; the other direction goes on until its own end.
                let _ = to.shutdown(Shutdown::Write);
                break true;
            }
        }
        // Wait for bytes, but no longer than until the next chunk is due.
        let wait = queue
            .front()
            .map_or(TICK, |(due, _)| {
                due.saturating_duration_since(Instant::now())
            })
            .clamp(Duration::from_millis(1), TICK);
        if eof {
            std::thread::sleep(wait);
            continue;
        }
        if from.set_read_timeout(Some(wait)).is_err() {
            break false;
        }
        match from.read(&mut buffer) {
            Ok(0) => eof = true,
            Ok(n) => {
                // Decided when the bytes arrive: a reply read during the fault is lost, and
                // the latency set by then applies, even to a read that began before. The
                // connection is marked under the switches' lock, so a `heal` that ends the
                // fault right now still sees the mark and resets the connection.
                let (dropped, latency) = {
                    let switches = shared.switches();
                    let drop = direction == Direction::Down && switches.fault == Fault::DropReplies;
                    if drop {
                        connection.lost_bytes.store(true, Ordering::SeqCst);
                    }
                    (drop, switches.latency)
                };
                if dropped {
                    shared.dropped_bytes.fetch_add(n as u64, Ordering::SeqCst);
                } else {
                    shared.pending_bytes.fetch_add(n as u64, Ordering::SeqCst);
                    queue.push_back((Instant::now() + latency, buffer[..n].to_vec()));
                }
            }
            Err(e) if is_timeout(&e) => {}
            Err(_) => break false,
        }
    };
    if !ended_cleanly {
        // One side failed or the connection was reset: take the other side down too.
        connection.abort();
    }
    // What was still held dies with the connection.
    for (_, bytes) in queue {
        shared.unpend(bytes.len());
    }
}

/// Writes all of `bytes`, re-checking the switches between attempts, so a peer that does
/// not read (a paused process) cannot hold the thread past an abort or the proxy's drop.
fn write_fully(
    to: &mut &TcpStream,
    mut bytes: &[u8],
    shared: &Shared,
    connection: &Connection,
) -> io::Result<()> {
    while !bytes.is_empty() {
        if shared.stopping() || connection.aborted() {
            return Err(io::Error::other("connection aborted"));
        }
        match to.write(bytes) {
            Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero)),
            Ok(n) => bytes = &bytes[n..],
            Err(e) if is_timeout(&e) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn is_timeout(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::atomic::AtomicUsize;

    const PATIENCE: Duration = Duration::from_secs(10);

    /// An echo server that counts the bytes it received; it stops when dropped.
    struct Echo {
        addr: SocketAddr,
        received: Arc<AtomicUsize>,
        stop: Arc<AtomicBool>,
        thread: Option<JoinHandle<()>>,
    }

    impl Echo {
        fn start() -> Echo {
            let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
            listener.set_nonblocking(true).unwrap();
            let addr = listener.local_addr().unwrap();
            let received = Arc::new(AtomicUsize::new(0));
            let stop = Arc::new(AtomicBool::new(false));
            let thread = std::thread::spawn({
                let (received, stop) = (Arc::clone(&received), Arc::clone(&stop));
                move || {
                    let mut handlers = Vec::new();
                    while !stop.load(Ordering::SeqCst) {
                        match listener.accept() {
                            Ok((stream, _)) => {
                                let (received, stop) = (Arc::clone(&received), Arc::clone(&stop));
                                handlers.push(std::thread::spawn(move || {
                                    echo(stream, &received, &stop);
                                }));
                            }
                            Err(_) => std::thread::sleep(Duration::from_millis(2)),
                        }
                    }
                    for handler in handlers {
                        let _ = handler.join();
                    }
                }
            });
            Echo {
                addr,
                received,
                stop,
                thread: Some(thread),
            }
        }
    }

    fn echo(mut stream: TcpStream, received: &AtomicUsize, stop: &AtomicBool) {
        stream.set_nonblocking(false).unwrap();
        stream.set_read_timeout(Some(TICK)).unwrap();
        let mut buffer = [0u8; 1024];
        while !stop.load(Ordering::SeqCst) {
            match stream.read(&mut buffer) {
                Ok(0) => return,
                Ok(n) => {
                    received.fetch_add(n, Ordering::SeqCst);
                    if stream.write_all(&buffer[..n]).is_err() {
                        return;
                    }
                }
                Err(e) if is_timeout(&e) => {}
                Err(_) => return,
            }
        }
    }

    impl Drop for Echo {
        fn drop(&mut self) {
            self.stop.store(true, Ordering::SeqCst);
            if let Some(thread) = self.thread.take() {
                let _ = thread.join();
            }
        }
    }

    fn client(proxy: &FaultProxy) -> TcpStream {
        let stream = TcpStream::connect(proxy.addr()).unwrap();
        stream.set_read_timeout(Some(PATIENCE)).unwrap();
        stream
    }

    /// An echo server, a proxy in front of it, and a client connection through the proxy
    /// that has carried one round trip of one byte.
    fn connected() -> (Echo, FaultProxy, TcpStream) {
        let echo = Echo::start();
        let proxy = FaultProxy::start(echo.addr).unwrap();
        let mut stream = client(&proxy);
        assert_eq!(round_trip(&mut stream, b"1"), b"1");
        (echo, proxy, stream)
    }

    fn round_trip(stream: &mut TcpStream, bytes: &[u8]) -> Vec<u8> {
        stream.write_all(bytes).unwrap();
        read_exactly(stream, bytes.len())
    }

    fn read_exactly(stream: &mut TcpStream, n: usize) -> Vec<u8> {
        let mut out = vec![0; n];
        stream.read_exact(&mut out).unwrap();
        out
    }

    /// Reads with a short timeout; `None` when nothing came.
    fn read_briefly(stream: &mut TcpStream, wait: Duration) -> Option<io::Result<usize>> {
        stream.set_read_timeout(Some(wait)).unwrap();
        let mut buffer = [0u8; 64];
        let result = stream.read(&mut buffer);
        stream.set_read_timeout(Some(PATIENCE)).unwrap();
        match result {
            Err(e) if is_timeout(&e) => None,
            other => Some(other),
        }
    }

    /// Writes `bytes` on `stream` and asserts that nothing comes back, and that the stream
    /// does not close, within `wait`.
    #[track_caller]
    fn assert_unanswered(stream: &mut TcpStream, bytes: &[u8], wait: Duration) {
        stream.write_all(bytes).unwrap();
        let read = read_briefly(stream, wait);
        assert!(read.is_none(), "answered: {read:?}");
    }

    /// Asserts that a new connection through `proxy` carries a round trip.
    #[track_caller]
    fn assert_new_connections_work(proxy: &FaultProxy) {
        let mut fresh = client(proxy);
        assert_eq!(round_trip(&mut fresh, b"new"), b"new");
    }

    /// Whether the stream was closed abruptly: a reset, or at least an end of stream.
    fn is_closed(result: Option<io::Result<usize>>) -> bool {
        matches!(result, Some(Ok(0)) | Some(Err(_)))
    }

    fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
        crate::process::wait_until(what, PATIENCE, &mut condition).unwrap();
    }

    #[test]
    fn bytes_pass_both_ways() {
        let (_echo, proxy, mut stream) = connected();
        assert_eq!(round_trip(&mut stream, b"hello"), b"hello");
        let big: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
        assert_eq!(round_trip(&mut stream, &big), big);
        assert_eq!(proxy.accepted(), 1);
        assert_eq!(proxy.open_connections(), 1);
        assert_eq!(proxy.fault(), Fault::None);
    }

    #[test]
    fn latency_delays_each_direction() {
        let (_echo, proxy, mut stream) = connected();
        proxy.set_latency(Duration::from_millis(60));
        let started = Instant::now();
        assert_eq!(round_trip(&mut stream, b"slow"), b"slow");
        // A lower bound only: a loaded machine may add, never subtract.
        assert!(started.elapsed() >= Duration::from_millis(120));
        proxy.set_latency(Duration::ZERO);
        assert_eq!(round_trip(&mut stream, b"fast"), b"fast");
    }

    #[test]
    fn blackhole_holds_bytes_until_healed() {
        let (echo, proxy, mut stream) = connected();
        proxy.blackhole();
        assert_unanswered(&mut stream, b"held", Duration::from_millis(200));
        assert_eq!(
            echo.received.load(Ordering::SeqCst),
            1,
            "the server got bytes"
        );
        assert_eq!(proxy.pending_bytes(), 4);
        // New connections are accepted, and silent too.
        let mut late = client(&proxy);
        assert_unanswered(&mut late, b"x", Duration::from_millis(100));
        proxy.heal();
        assert_eq!(read_exactly(&mut stream, 4), b"held");
        assert_eq!(read_exactly(&mut late, 1), b"x");
        wait_until("nothing to be held", || proxy.pending_bytes() == 0);
    }

    #[test]
    fn dropped_replies_are_lost_and_the_connection_reset_on_heal() {
        let (echo, proxy, mut stream) = connected();
        proxy.drop_replies();
        stream.write_all(b"lost").unwrap();
        // The byte of the first round trip, and the 4 of this request.
        wait_until("the request to reach the server", || {
            echo.received.load(Ordering::SeqCst) == 5
        });
        wait_until("the reply to be swallowed", || proxy.dropped_bytes() == 4);
        assert!(read_briefly(&mut stream, Duration::from_millis(100)).is_none());
        proxy.heal();
        assert!(
            is_closed(read_briefly(&mut stream, PATIENCE)),
            "a connection that lost a reply must not go on"
        );
        assert_new_connections_work(&proxy);
    }

    #[test]
    fn strand_connections_silences_current_connections_for_good_and_new_ones_work() {
        let (_echo, proxy, mut stream) = connected();
        proxy.strand_connections();
        // A stranded connection neither answers nor closes.
        assert_unanswered(&mut stream, b"2", Duration::from_millis(300));
        proxy.heal();
        assert!(
            read_briefly(&mut stream, Duration::from_millis(300)).is_none(),
            "healing does not revive a stranded connection"
        );
        assert_eq!(proxy.open_connections(), 1, "it stays open");
        assert_new_connections_work(&proxy);
    }

    #[test]
    fn kill_connections_resets_current_connections_only() {
        let (_echo, proxy, mut stream) = connected();
        proxy.kill_connections();
        match read_briefly(&mut stream, PATIENCE) {
            Some(Err(e)) => assert_eq!(e.kind(), io::ErrorKind::ConnectionReset, "{e}"),
            other => panic!("expected a reset, got {other:?}"),
        }
        wait_until("the connection to be gone", || {
            proxy.open_connections() == 0
        });
        assert_new_connections_work(&proxy);
    }

    #[test]
    fn reset_refuses_until_healed() {
        let (_echo, proxy, mut before) = connected();
        proxy.reset();
        assert!(is_closed(read_briefly(&mut before, PATIENCE)));
        let mut during = client(&proxy);
        let _ = during.write_all(b"x");
        assert!(is_closed(read_briefly(&mut during, PATIENCE)));
        proxy.heal();
        assert_new_connections_work(&proxy);
    }

    #[test]
    fn a_closed_upstream_resets_the_client() {
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .unwrap()
            .local_addr()
            .unwrap();
        let proxy = FaultProxy::start(port).unwrap();
        let mut stream = client(&proxy);
        assert!(is_closed(read_briefly(&mut stream, PATIENCE)));
    }

    #[test]
    fn half_close_is_passed_on() {
        let (_echo, _proxy, mut stream) = connected();
        stream.write_all(b"bye").unwrap();
        stream.shutdown(Shutdown::Write).unwrap();
        assert_eq!(read_exactly(&mut stream, 3), b"bye");
        assert!(matches!(read_briefly(&mut stream, PATIENCE), Some(Ok(0))));
    }

    #[test]
    fn only_loopback_upstreams() {
        let err = FaultProxy::start("192.0.2.1:6379".parse().unwrap()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn dropping_the_proxy_closes_its_connections() {
        let (_echo, proxy, mut stream) = connected();
        let addr = proxy.addr();
        drop(proxy);
        assert!(is_closed(read_briefly(&mut stream, PATIENCE)));
        assert!(TcpStream::connect(addr).is_err());
    }
}
