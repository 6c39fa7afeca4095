//! Private PgBouncer poolers in front of a private PostgreSQL server, in transaction or
//! session pooling mode, for tests of the store behind the proxy users deploy.
//!
//! [`PgBouncer::start`] writes a configuration into a temporary directory and runs a
//! `pgbouncer` of its own on a free loopback port, forwarding every database to the given
//! [`PostgresServer`], and returns once it accepts connections. It never touches a pooler of
//! the machine. [`PgBouncer::shared`] starts one per pooling mode per test binary, in front
//! of [`PostgresServer::shared`].
//!
//! ```no_run
//! use baton_testkit::pgbouncer::{PgBouncer, PoolMode};
//! use baton_testkit::postgres::PostgresServer;
//!
//! let server = PostgresServer::start().unwrap();
//! let pooler = PgBouncer::start(&server, PoolMode::Transaction).unwrap();
//! let url = pooler.url(); // postgres://postgres@127.0.0.1:<port>/postgres
//! # let _ = url;
//! ```
//!
//! ## Behavior
//! - Clients are trusted (`auth_type = trust`, the user `postgres` in its `auth_file`), as
//!   the private server trusts loopback connections.
//! - No `ignore_startup_parameters`: a client that sends a startup parameter PgBouncer does
//!   not know is refused, as by a default production configuration.
//! - [`PgBouncerOptions::pool_size`] is the number of server connections per database and
//!   user (`default_pool_size`, default 20); clients beyond it wait for one.
//! - When the tests run as root it runs as the `postgres` OS user (PgBouncer refuses root).
//! - Dropping a [`PgBouncer`] kills it (SIGKILL) and removes its directory; a watchdog does
//!   the same when the test process exits without dropping it.
//!
//! The binary is `pgbouncer` on `PATH`, else `/usr/sbin/pgbouncer` (Debian's package), else
//! the file named in [`PGBOUNCER_ENV`]. A missing binary is an error that names the fix.

use std::fmt;
use std::io::{self, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::postgres::{PostgresServer, free_port, server_owner};

/// The environment variable that names the `pgbouncer` binary to run.
pub const PGBOUNCER_ENV: &str = "BATON_PGBOUNCER";

/// The one-line fix for a machine without PgBouncer.
pub const INSTALL_HINT: &str = "install it with `apt-get install pgbouncer` (Debian/Ubuntu), or name the binary in BATON_PGBOUNCER";

/// Where Debian's package puts the binary, outside a normal user's `PATH`.
const DEBIAN_PGBOUNCER: &str = "/usr/sbin/pgbouncer";

/// How the pooler shares server connections between clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolMode {
    /// A server connection belongs to a client for one transaction (`pool_mode =
    /// transaction`): no session state survives between transactions.
    Transaction,
    /// A server connection belongs to a client for its whole session (`pool_mode =
    /// session`).
    Session,
}

impl PoolMode {
    fn as_str(self) -> &'static str {
        match self {
            PoolMode::Transaction => "transaction",
            PoolMode::Session => "session",
        }
    }
}

/// How to start a [`PgBouncer`].
#[derive(Debug, Clone)]
#[must_use = "options do nothing until passed to PgBouncer::start_with"]
pub struct PgBouncerOptions {
    mode: PoolMode,
    pool_size: u32,
    startup_timeout: Duration,
}

impl PgBouncerOptions {
    /// `mode`, 20 server connections per database and user, 30 s to start.
    pub fn new(mode: PoolMode) -> Self {
        PgBouncerOptions {
            mode,
            pool_size: 20,
            startup_timeout: Duration::from_secs(30),
        }
    }

    /// Server connections per database and user (`default_pool_size`).
    pub fn pool_size(mut self, size: u32) -> Self {
        self.pool_size = size.max(1);
        self
    }
}

/// A private PgBouncer on a loopback port. See the [module docs](self).
pub struct PgBouncer {
    options: PgBouncerOptions,
    port: u16,
    server_port: u16,
    dir: TempDir,
    child: Mutex<Option<Child>>,
    watchdog: Mutex<Option<Child>>,
}

impl fmt::Debug for PgBouncer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgBouncer")
            .field("mode", &self.options.mode)
            .field("port", &self.port)
            .field("server_port", &self.server_port)
            .field("dir", &self.dir.path())
            .finish()
    }
}

impl PgBouncer {
    /// Starts a pooler in `mode` in front of `server`.
    ///
    /// # Errors
    /// When `pgbouncer` is not installed (the message says how to install it), or does not
    /// accept connections in time (the message quotes its log).
    pub fn start(server: &PostgresServer, mode: PoolMode) -> io::Result<PgBouncer> {
        PgBouncer::start_with(server, PgBouncerOptions::new(mode))
    }

    /// Starts a pooler with `options` in front of `server`.
    ///
    /// # Errors
    /// As [`PgBouncer::start`].
    pub fn start_with(server: &PostgresServer, options: PgBouncerOptions) -> io::Result<PgBouncer> {
        let binary = find_binary()?;
        let owner = server_owner()?;
        let dir = tempfile::Builder::new().prefix("baton-pgb-").tempdir()?;
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid))?;
        }
        let mut pooler = PgBouncer {
            options,
            port: 0,
            server_port: server.port(),
            dir,
            child: Mutex::new(None),
            watchdog: Mutex::new(None),
        };
        let mut last_error = None;
        for _ in 0..5 {
            pooler.port = free_port()?;
            match pooler.launch(&binary, owner) {
                Ok(()) => {
                    pooler.spawn_watchdog()?;
                    return Ok(pooler);
                }
                Err(e) => last_error = Some(e),
            }
        }
        Err(last_error.unwrap_or_else(|| io::Error::other("pgbouncer did not start")))
    }

    /// One pooler per mode for the whole test binary, in front of
    /// [`PostgresServer::shared`], started on first use and stopped by its watchdog when the
    /// test process exits.
    ///
    /// # Panics
    /// When it cannot be started: every test that needs it must fail, loudly.
    pub fn shared(mode: PoolMode) -> &'static PgBouncer {
        static TRANSACTION: OnceLock<PgBouncer> = OnceLock::new();
        static SESSION: OnceLock<PgBouncer> = OnceLock::new();
        let cell = match mode {
            PoolMode::Transaction => &TRANSACTION,
            PoolMode::Session => &SESSION,
        };
        cell.get_or_init(|| {
            PgBouncer::start(PostgresServer::shared(), mode)
                .unwrap_or_else(|e| panic!("a private PgBouncer: {e}"))
        })
    }

    /// `postgres://postgres@127.0.0.1:<port>/postgres`: database `postgres` through the
    /// pooler.
    pub fn url(&self) -> String {
        self.url_for("postgres")
    }

    /// The URL of database `database` through the pooler.
    pub fn url_for(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// The loopback address the pooler listens on.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The pooling mode.
    pub fn mode(&self) -> PoolMode {
        self.options.mode
    }

    /// The pooler's log.
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("pgbouncer.log")
    }

    fn config(&self) -> String {
        let dir = self.dir.path().display();
        format!(
            "[databases]\n\
             * = host=127.0.0.1 port={server}\n\
             [pgbouncer]\n\
             listen_addr = 127.0.0.1\n\
             listen_port = {port}\n\
             unix_socket_dir =\n\
             auth_type = trust\n\
             auth_file = {dir}/userlist.txt\n\
             admin_users = postgres\n\
             pool_mode = {mode}\n\
             default_pool_size = {pool}\n\
             max_client_conn = 2000\n\
             logfile = {dir}/pgbouncer.log\n\
             pidfile = {dir}/pgbouncer.pid\n",
            server = self.server_port,
            port = self.port,
            mode = self.options.mode.as_str(),
            pool = self.options.pool_size,
        )
    }

    fn launch(&self, binary: &Path, owner: Option<(u32, u32)>) -> io::Result<()> {
        let config = self.dir.path().join("pgbouncer.ini");
        let users = self.dir.path().join("userlist.txt");
        std::fs::File::create(&users)?.write_all(b"\"postgres\" \"\"\n")?;
        std::fs::write(&config, self.config())?;
        for file in [&config, &users] {
            if let Some((uid, gid)) = owner {
                std::os::unix::fs::chown(file, Some(uid), Some(gid))?;
            }
        }
        let mut command = Command::new(binary);
        if let Some((uid, gid)) = owner {
            command.uid(uid).gid(gid);
        }
        let child = command
            .arg(&config)
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| not_found_hint(e, binary))?;
        *self.child.lock().unwrap_or_else(|p| p.into_inner()) = Some(child);
        let deadline = Instant::now() + self.options.startup_timeout;
        loop {
            if let Some(status) = self.exited() {
                return Err(io::Error::other(format!(
                    "pgbouncer on port {} exited with {status} during startup; {}",
                    self.port,
                    self.diagnostics()
                )));
            }
            if TcpStream::connect_timeout(&self.addr(), Duration::from_millis(200)).is_ok() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                self.kill();
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "pgbouncer on port {} did not accept connections within {:?}; {}",
                        self.port,
                        self.options.startup_timeout,
                        self.diagnostics()
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn exited(&self) -> Option<String> {
        let mut slot = self.child.lock().unwrap_or_else(|p| p.into_inner());
        let child = slot.as_mut()?;
        match child.try_wait() {
            Ok(Some(status)) => {
                *slot = None;
                Some(status.to_string())
            }
            _ => None,
        }
    }

    fn kill(&self) {
        if let Some(mut child) = self.child.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills the pooler and removes its directory when this process exits without dropping
    /// it.
    fn spawn_watchdog(&self) -> io::Result<()> {
        let Some(pid) = self
            .child
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(Child::id)
        else {
            return Ok(());
        };
        let script = r#"while kill -0 "$1" 2>/dev/null; do sleep 0.5; done
kill -KILL "$2" 2>/dev/null
rm -rf "$3""#;
        let child = Command::new("sh")
            .arg("-c")
            .arg(script)
            .arg("baton-pgbouncer-watchdog")
            .arg(std::process::id().to_string())
            .arg(pid.to_string())
            .arg(self.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        *self.watchdog.lock().unwrap_or_else(|p| p.into_inner()) = Some(child);
        Ok(())
    }

    fn diagnostics(&self) -> String {
        let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(15).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        format!(
            "its log ({}):\n{}",
            self.log_path().display(),
            tail.join("\n")
        )
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        self.kill();
        if let Some(mut watchdog) = self
            .watchdog
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            let _ = watchdog.kill();
            let _ = watchdog.wait();
        }
    }
}

fn find_binary() -> io::Result<PathBuf> {
    if let Some(path) = std::env::var_os(PGBOUNCER_ENV).filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(path));
    }
    for dir in std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()) {
        let candidate = dir.join("pgbouncer");
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    let debian = PathBuf::from(DEBIAN_PGBOUNCER);
    if debian.is_file() {
        return Ok(debian);
    }
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        format!(
            "pgbouncer was not found; PgBouncer tests need it and are never skipped: {INSTALL_HINT}"
        ),
    ))
}

fn not_found_hint(e: io::Error, binary: &Path) -> io::Error {
    if e.kind() == io::ErrorKind::NotFound {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("{} was not found: {INSTALL_HINT}", binary.display()),
        )
    } else {
        io::Error::new(e.kind(), format!("cannot run {}: {e}", binary.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pooler_forwards_to_the_server_and_cleans_up() {
        let server = PostgresServer::start().unwrap();
        let pooler = PgBouncer::start_with(
            &server,
            PgBouncerOptions::new(PoolMode::Transaction).pool_size(1),
        )
        .unwrap();
        assert_ne!(pooler.port(), server.port());
        let psql = |sql: &str| {
            let out = Command::new(server.tool("psql"))
                .args(["-X", "-q", "-A", "-t", "-h", "127.0.0.1", "-U", "postgres"])
                .arg("-p")
                .arg(pooler.port().to_string())
                .args(["-d", "postgres", "-c", sql])
                .env("PGCONNECT_TIMEOUT", "10")
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout).trim().to_owned()
        };
        // Two client sessions after one another, one server connection: the same backend.
        assert_eq!(
            psql("SELECT pg_backend_pid()"),
            psql("SELECT pg_backend_pid()")
        );
        let log = pooler.log_path();
        drop(pooler);
        assert!(!log.exists(), "the directory is removed");
    }
}
