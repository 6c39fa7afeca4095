//! A private Redis Sentinel topology for failover tests: one primary, one replica and three
//! `redis-sentinel` processes, all on loopback ports of their own.
//!
//! [`SentinelTopology::start`] starts the primary and a synchronized replica
//! ([`RedisServer`]), then three sentinels monitoring the primary as [`MASTER_NAME`] with
//! quorum 2, `down-after-milliseconds` [`DOWN_AFTER`] and `failover-timeout`
//! [`FAILOVER_TIMEOUT`], each announcing `127.0.0.1` and its own port, and returns once every
//! sentinel knows the replica and the two other sentinels (so a failover can be agreed on).
//! Killing the primary ([`SentinelTopology::kill`]) makes the sentinels promote the replica
//! within a couple of seconds;
//! [`SentinelTopology::wait_for_failover`] waits until they name another primary.
//!
//! A missing `redis-sentinel` binary is an error that names the fix (`apt-get install
//! redis-sentinel`), never a reason to skip.
//!
//! ```no_run
//! use baton_testkit::sentinel::SentinelTopology;
//!
//! let topology = SentinelTopology::start().unwrap();
//! let url = topology.url(); // redis+sentinel://127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3/baton
//! let old = topology.primary_port().unwrap();
//! topology.kill(old).unwrap(); // SIGKILL, and the port stays taken
//! let new = topology.wait_for_failover(old, std::time::Duration::from_secs(30)).unwrap();
//! # let _ = (url, new);
//! ```
//!
//! ## Behavior
//! - Dropping the topology kills every process (SIGKILL) and removes their directories.
//! - The servers keep the testkit's defaults (no persistence); the replica announces
//!   `127.0.0.1` and its port, so the sentinels name loopback addresses only.

use std::ffi::OsString;
use std::fmt;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::redis::{RedisOptions, RedisServer, Resp, command};

/// The environment variable that names the `redis-sentinel` binary, when it is not
/// `redis-sentinel` on `PATH`.
pub const REDIS_SENTINEL_ENV: &str = "BATON_REDIS_SENTINEL";

/// The one-line fix for a machine without Sentinel.
pub const INSTALL_HINT: &str = "install it with `apt-get install redis-sentinel` (Debian/Ubuntu), or name the binary in BATON_REDIS_SENTINEL";

/// The name the sentinels monitor the primary by.
pub const MASTER_NAME: &str = "baton";

/// How long the primary may be silent before a sentinel considers it down.
pub const DOWN_AFTER: Duration = Duration::from_millis(1000);

/// The sentinels' `failover-timeout`.
pub const FAILOVER_TIMEOUT: Duration = Duration::from_millis(3000);

/// How long a sentinel may take to start and to learn the topology.
const STARTUP: Duration = Duration::from_secs(30);

/// One primary, one replica and three sentinels. See the [module docs](self).
pub struct SentinelTopology {
    servers: Vec<RedisServer>,
    sentinels: Vec<Sentinel>,
    /// Listeners holding the ports of killed servers, so that no other test's server binds
    /// one while these sentinels still watch it (they would take it for the old primary).
    reserved: Mutex<Vec<TcpListener>>,
}

impl fmt::Debug for SentinelTopology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SentinelTopology")
            .field(
                "servers",
                &self
                    .servers
                    .iter()
                    .map(RedisServer::port)
                    .collect::<Vec<_>>(),
            )
            .field(
                "sentinels",
                &self.sentinels.iter().map(|s| s.port).collect::<Vec<_>>(),
            )
            .finish()
    }
}

struct Sentinel {
    port: u16,
    dir: TempDir,
    child: Mutex<Option<Child>>,
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let mut child = self.child.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(mut child) = child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl SentinelTopology {
    /// Starts the primary, the replica and three sentinels, and waits until the sentinels
    /// know each other and the replica.
    ///
    /// # Errors
    /// When a binary is missing (the message says how to install it), or a process does not
    /// start or the sentinels do not learn the topology in time (the message quotes a log).
    pub fn start() -> io::Result<SentinelTopology> {
        let primary = RedisServer::start_with(
            RedisOptions::new().args(["--replica-announce-ip", "127.0.0.1"]),
        )?;
        let replica = RedisServer::start_replica_of(
            &primary,
            RedisOptions::new().args(["--replica-announce-ip", "127.0.0.1"]),
        )?;
        let binary = std::env::var_os(REDIS_SENTINEL_ENV)
            .filter(|b| !b.is_empty())
            .unwrap_or_else(|| OsString::from("redis-sentinel"));
        let mut sentinels = Vec::new();
        for _ in 0..3 {
            sentinels.push(Sentinel::start(&binary, primary.port())?);
        }
        let topology = SentinelTopology {
            servers: vec![primary, replica],
            sentinels,
            reserved: Mutex::new(Vec::new()),
        };
        topology.wait_until_known()?;
        Ok(topology)
    }

    /// `redis+sentinel://127.0.0.1:<p1>,127.0.0.1:<p2>,127.0.0.1:<p3>/baton`.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect();
        format!("redis+sentinel://{}/{MASTER_NAME}", hosts.join(","))
    }

    /// The Redis servers, the first started as the primary.
    pub fn servers(&self) -> &[RedisServer] {
        &self.servers
    }

    /// The server listening on `port`.
    pub fn server(&self, port: u16) -> Option<&RedisServer> {
        self.servers.iter().find(|s| s.port() == port)
    }

    /// Kills the server on `port` (SIGKILL) and keeps its port bound by a listener that
    /// accepts and never answers, until [`SentinelTopology::restart`]: the sentinels see a
    /// dead server, and no other test's server can take the port meanwhile.
    ///
    /// # Errors
    /// When no server of the topology listens on `port`.
    pub fn kill(&self, port: u16) -> io::Result<()> {
        let server = self
            .server(port)
            .ok_or_else(|| io::Error::other(format!("no server on port {port}")))?;
        server.kill();
        // The port is free now; take it before anyone else does.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match TcpListener::bind((Ipv4Addr::LOCALHOST, port)) {
                Ok(listener) => {
                    self.reserved
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(listener);
                    return Ok(());
                }
                Err(e) if Instant::now() >= deadline => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    }

    /// Frees the port that [`SentinelTopology::kill`] held and starts the server on it
    /// again (with its original arguments: the sentinels make it a replica of the new
    /// primary).
    ///
    /// # Errors
    /// As [`RedisServer::restart`].
    pub fn restart(&self, port: u16) -> io::Result<()> {
        let server = self
            .server(port)
            .ok_or_else(|| io::Error::other(format!("no server on port {port}")))?;
        self.reserved
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|l| l.local_addr().map(|a| a.port()).ok() != Some(port));
        server.restart()
    }

    /// The ports of the sentinels.
    pub fn sentinel_ports(&self) -> Vec<u16> {
        self.sentinels.iter().map(|s| s.port).collect()
    }

    /// The port of the primary the first sentinel that answers names.
    ///
    /// # Errors
    /// When no sentinel answers with an address.
    pub fn primary_port(&self) -> io::Result<u16> {
        let mut last = None;
        for sentinel in &self.sentinels {
            match sentinel.primary() {
                Ok(port) => return Ok(port),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("no sentinel")))
    }

    /// Waits until every sentinel names a primary other than `old` that answers as a
    /// primary (`role:master`), and returns its port.
    ///
    /// # Errors
    /// When that does not happen within `timeout` (the message quotes a sentinel's log).
    pub fn wait_for_failover(&self, old: u16, timeout: Duration) -> io::Result<u16> {
        let deadline = Instant::now() + timeout;
        loop {
            let named: Vec<Option<u16>> = self.sentinels.iter().map(|s| s.primary().ok()).collect();
            if let Some(Some(new)) = named.first()
                && *new != old
                && named.iter().all(|n| *n == Some(*new))
                && self
                    .server(*new)
                    .and_then(|s| s.info("replication").ok())
                    .is_some_and(|info| info.lines().any(|l| l.trim() == "role:master"))
            {
                return Ok(*new);
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "the sentinels named {named:?} (old primary {old}) after {timeout:?}; {}",
                        self.sentinels[0].diagnostics()
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until every sentinel knows the replica and the two other sentinels.
    fn wait_until_known(&self) -> io::Result<()> {
        let deadline = Instant::now() + STARTUP;
        for sentinel in &self.sentinels {
            loop {
                let replicas = sentinel.count(&["SENTINEL", "REPLICAS", MASTER_NAME]);
                let others = sentinel.count(&["SENTINEL", "SENTINELS", MASTER_NAME]);
                if replicas == Some(1) && others == Some(2) {
                    break;
                }
                if Instant::now() >= deadline {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!(
                            "sentinel on port {} knows {replicas:?} replicas and {others:?} other sentinels after {STARTUP:?}; {}",
                            sentinel.port,
                            sentinel.diagnostics()
                        ),
                    ));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(())
    }
}

impl Sentinel {
    fn start(binary: &OsString, primary: u16) -> io::Result<Sentinel> {
        let mut last = None;
        for _ in 0..5 {
            let port = crate::redis::free_port()?;
            let dir = tempfile::Builder::new()
                .prefix("baton-sentinel-")
                .tempdir()?;
            let config = dir.path().join("sentinel.conf");
            std::fs::write(
                &config,
                format!(
                    "port {port}\nbind 127.0.0.1\ndaemonize no\ndir {dir}\nlogfile {log}\n\
                     sentinel announce-ip 127.0.0.1\nsentinel announce-port {port}\n\
                     sentinel resolve-hostnames no\n\
                     sentinel monitor {MASTER_NAME} 127.0.0.1 {primary} 2\n\
                     sentinel down-after-milliseconds {MASTER_NAME} {down}\n\
                     sentinel failover-timeout {MASTER_NAME} {failover}\n\
                     sentinel parallel-syncs {MASTER_NAME} 1\n",
                    dir = dir.path().display(),
                    log = dir.path().join("sentinel.log").display(),
                    down = DOWN_AFTER.as_millis(),
                    failover = FAILOVER_TIMEOUT.as_millis(),
                ),
            )?;
            let child = Command::new(binary)
                .arg(&config)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(dir.path().join("sentinel.stderr"))?)
                .spawn()
                .map_err(|e| {
                    if e.kind() == io::ErrorKind::NotFound {
                        io::Error::new(
                            io::ErrorKind::NotFound,
                            format!(
                                "{} was not found; Sentinel tests need it and are never skipped: {INSTALL_HINT}",
                                binary.to_string_lossy()
                            ),
                        )
                    } else {
                        io::Error::new(e.kind(), format!("cannot start {}: {e}", binary.to_string_lossy()))
                    }
                })?;
            let sentinel = Sentinel {
                port,
                dir,
                child: Mutex::new(Some(child)),
            };
            match sentinel.wait_ready() {
                Ok(()) => return Ok(sentinel),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("redis-sentinel did not start")))
    }

    fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    fn wait_ready(&self) -> io::Result<()> {
        let deadline = Instant::now() + STARTUP;
        loop {
            let exited = {
                let mut child = self.child.lock().unwrap_or_else(|p| p.into_inner());
                child.as_mut().and_then(|c| c.try_wait().ok().flatten())
            };
            if let Some(status) = exited {
                return Err(io::Error::other(format!(
                    "redis-sentinel on port {} exited with {status}; {}",
                    self.port,
                    self.diagnostics()
                )));
            }
            if matches!(
                command(self.addr(), &["PING"], Duration::from_millis(500)),
                Ok(Resp::Simple(ref pong)) if pong == "PONG"
            ) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "redis-sentinel on port {} did not answer PING; {}",
                        self.port,
                        self.diagnostics()
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The port of the primary this sentinel names.
    fn primary(&self) -> io::Result<u16> {
        let reply = command(
            self.addr(),
            &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME],
            Duration::from_secs(2),
        )?;
        let texts = reply
            .as_texts()
            .ok_or_else(|| io::Error::other(format!("sentinel answered {reply:?}")))?;
        texts
            .get(1)
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| io::Error::other(format!("sentinel answered {texts:?}")))
    }

    /// The length of the array a `SENTINEL` command answers.
    fn count(&self, args: &[&str]) -> Option<usize> {
        match command(self.addr(), args, Duration::from_secs(2)).ok()? {
            Resp::Array(Some(items)) => Some(items.len()),
            _ => None,
        }
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("sentinel.log")
    }

    fn diagnostics(&self) -> String {
        let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(20).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        format!(
            "the log of sentinel {} ({}):\n{}",
            self.port,
            self.log_path().display(),
            tail.join("\n")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sentinels_promote_the_replica_when_the_primary_is_killed() {
        let topology = SentinelTopology::start().unwrap();
        let url = topology.url();
        assert!(url.starts_with("redis+sentinel://127.0.0.1:"), "{url}");
        assert!(url.ends_with("/baton"), "{url}");
        let old = topology.primary_port().unwrap();
        assert_eq!(old, topology.servers()[0].port());
        topology.kill(old).unwrap();
        let new = topology
            .wait_for_failover(old, Duration::from_secs(30))
            .unwrap();
        assert_eq!(new, topology.servers()[1].port());
    }
}
