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

use std::ffi::OsStr;
use std::io::{self, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use crate::postgres::{PostgresServer, give_to, server_owner};
use crate::server::{ServerProcess, Watchdog, on_a_free_port};

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
#[derive(Debug)]
pub struct PgBouncer {
    options: PgBouncerOptions,
    server_port: u16,
    /// Killed, and its directory removed, when the pooler is dropped.
    process: ServerProcess,
    watchdog: Option<Watchdog>,
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
        let mut pooler = PgBouncer {
            options,
            server_port: server.port(),
            process: ServerProcess::new("pgbouncer", INSTALL_HINT, 0, Some("pgbouncer.log"))?,
            watchdog: None,
        };
        give_to(owner, pooler.process.dir())?;
        on_a_free_port(|port| {
            pooler.process.set_port(port);
            pooler.launch(&binary, owner)
        })?;
        pooler.watchdog = Some(pooler.spawn_watchdog()?);
        Ok(pooler)
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
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port())
    }

    /// The loopback address the pooler listens on.
    pub fn addr(&self) -> SocketAddr {
        self.process.addr()
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.process.port()
    }

    /// The pooling mode.
    pub fn mode(&self) -> PoolMode {
        self.options.mode
    }

    /// The pooler's log.
    pub fn log_path(&self) -> PathBuf {
        self.process.log_path()
    }

    fn config(&self) -> String {
        let dir = self.process.dir().display();
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
            port = self.port(),
            mode = self.options.mode.as_str(),
            pool = self.options.pool_size,
        )
    }

    fn launch(&self, binary: &Path, owner: Option<(u32, u32)>) -> io::Result<()> {
        let config = self.process.dir().join("pgbouncer.ini");
        let users = self.process.dir().join("userlist.txt");
        std::fs::File::create(&users)?.write_all(b"\"postgres\" \"\"\n")?;
        std::fs::write(&config, self.config())?;
        give_to(owner, &config)?;
        give_to(owner, &users)?;
        let mut command = Command::new(binary);
        if let Some((uid, gid)) = owner {
            command.uid(uid).gid(gid);
        }
        command.arg(&config).current_dir(self.process.dir());
        self.process.start(
            &mut command,
            self.options.startup_timeout,
            "accept connections",
            || {
                TcpStream::connect_timeout(&self.addr(), Duration::from_millis(200))
                    .map(drop)
                    .map_err(|e| e.to_string())
            },
        )
    }

    /// Kills the pooler and removes its directory when this process exits without dropping
    /// it.
    fn spawn_watchdog(&self) -> io::Result<Watchdog> {
        let pid = self.process.running_pid()?.to_string();
        Watchdog::spawn(
            "baton-pgbouncer-watchdog",
            r#"kill -KILL "$2" 2>/dev/null
rm -rf "$3""#,
            &[OsStr::new(&pid), self.process.dir().as_os_str()],
        )
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
