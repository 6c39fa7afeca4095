//! Private PostgreSQL servers for tests that may restart them and kill their connections.
//!
//! [`PostgresServer::start`] runs `initdb` into a temporary directory and a `postgres` of its
//! own on a free loopback port, with its unix socket in that directory, and returns once the
//! server is ready. It never touches the machine's own PostgreSQL on port 5432. Tests that
//! only need *a* server share one per test binary through [`PostgresServer::shared`] (each
//! test then works in a fresh namespace or a database of its own); tests that restart the
//! server start their own.
//!
//! When the tests run as root, `initdb` and `postgres` run as the `postgres` OS user (which
//! the Debian package creates), since PostgreSQL refuses to run as root; the temporary
//! directory is handed to that user.
//!
//! The binaries are found, in this order: the directory named in [`PG_BIN_ENV`]; the
//! directory of `initdb` on `PATH`; the newest `/usr/lib/postgresql/<version>/bin`, where
//! Debian's `postgresql` package puts them without adding them to `PATH`. A missing server is
//! an error that names the fix, never a reason to skip: a PostgreSQL test that cannot run
//! fails.
//!
//! ```no_run
//! use baton_testkit::postgres::{PostgresServer, Stop};
//!
//! let server = PostgresServer::start().unwrap();
//! let url = server.url(); // postgres://postgres@127.0.0.1:<port>/postgres
//! server.sql("CREATE TABLE t (id int)").unwrap();
//! server.restart(Stop::Immediate).unwrap(); // a crash: WAL recovery on the way back up
//! let other = server.create_database("other").unwrap();
//! # let _ = (url, other);
//! ```
//!
//! ## Behavior
//! - The server trusts every local and loopback connection (`initdb --auth=trust`); the user
//!   is `postgres`.
//! - By default it runs with `fsync=off`: data survives a killed or restarted server (the
//!   operating system keeps the files), not a crash of the machine, which tests never cause.
//!   [`PostgresOptions::durable`] turns `fsync` back on, for benchmarks.
//! - [`PostgresOptions::tls`] serves TLS with a certificate the test made.
//! - Dropping a [`PostgresServer`] stops the server at once (immediate shutdown) and removes
//!   its directory. A watchdog process does the same when the test process exits without
//!   dropping it (a [`shared`](PostgresServer::shared) server, or a test process that was
//!   killed).
//! - Every wait is bounded: startup and shutdown by [`PostgresOptions::startup_timeout`],
//!   each [`sql`](PostgresServer::sql) call by `psql`'s own connect timeout.

use std::ffi::OsString;
use std::io;
use std::net::SocketAddr;
use std::ops::ControlFlow;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::server::{ServerProcess, Watchdog, on_a_free_port, poll_until, retry, spawn_error};

/// The environment variable that names the directory holding `initdb`, `postgres` and
/// `psql`, when they should not be looked up on `PATH` and under `/usr/lib/postgresql`.
pub const PG_BIN_ENV: &str = "BATON_PG_BIN";

/// The one-line fix for a machine without PostgreSQL.
pub const INSTALL_HINT: &str = "install it with `apt-get install postgresql` (Debian/Ubuntu), or name the directory of initdb and postgres in BATON_PG_BIN";

/// Where Debian's packages put the server binaries, one directory per major version.
const DEBIAN_PG_LIB: &str = "/usr/lib/postgresql";

/// How to start a [`PostgresServer`].
#[derive(Debug, Clone)]
#[must_use = "options do nothing until passed to PostgresServer::start_with"]
pub struct PostgresOptions {
    settings: Vec<(String, String)>,
    startup_timeout: Duration,
    tls: Option<(PathBuf, PathBuf)>,
}

impl Default for PostgresOptions {
    fn default() -> Self {
        PostgresOptions {
            settings: vec![("fsync".into(), "off".into())],
            startup_timeout: Duration::from_secs(60),
            tls: None,
        }
    }
}

impl PostgresOptions {
    /// `fsync=off`, 60 s to start.
    pub fn new() -> Self {
        PostgresOptions::default()
    }

    /// Sets a server parameter (`-c name=value`), after the defaults, so it overrides them:
    /// `.setting("synchronous_commit", "off")`.
    pub fn setting(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.settings.push((name.into(), value.into()));
        self
    }

    /// `fsync=on`, as a production server runs: for benchmarks.
    pub fn durable(self) -> Self {
        self.setting("fsync", "on")
    }

    /// Serves TLS (`ssl=on`) with the certificate chain and private key in these PEM files,
    /// which are copied into the server's directory (the key readable by the server's owner
    /// only, as PostgreSQL requires). Plain connections are still accepted.
    pub fn tls(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.tls = Some((cert.into(), key.into()));
        self
    }

    /// How long `initdb`, a start or a stop may take (default 60 s, generous for a loaded
    /// machine and for crash recovery).
    pub fn startup_timeout(mut self, timeout: Duration) -> Self {
        self.startup_timeout = timeout;
        self
    }
}

/// How [`PostgresServer::stop`] shuts the server down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// `SIGINT`: connections are terminated, a checkpoint is written, the server exits.
    Fast,
    /// `SIGQUIT`: every process exits at once, as in a crash; the next start replays the WAL.
    Immediate,
}

/// A private PostgreSQL server on a loopback port. See the [module docs](self).
#[derive(Debug)]
pub struct PostgresServer {
    options: PostgresOptions,
    bin: PathBuf,
    /// The uid and gid the server runs as, when it is not this process's.
    owner: Option<(u32, u32)>,
    watchdog: Option<Watchdog>,
    /// Its directory is removed when the server is dropped, after [`Drop`] has stopped it.
    process: ServerProcess,
}

impl PostgresServer {
    /// Starts a server with the default options.
    ///
    /// # Errors
    /// When PostgreSQL is not installed (the message says how to install it), when the tests
    /// run as root and there is no `postgres` user, or when the server does not become ready
    /// in time (the message quotes its log).
    pub fn start() -> io::Result<PostgresServer> {
        PostgresServer::start_with(PostgresOptions::new())
    }

    /// Starts a server with `options`.
    ///
    /// # Errors
    /// As [`PostgresServer::start`].
    pub fn start_with(options: PostgresOptions) -> io::Result<PostgresServer> {
        let mut server = PostgresServer {
            options,
            bin: find_bin_dir()?,
            owner: server_owner()?,
            watchdog: None,
            process: ServerProcess::new("postgres", INSTALL_HINT, 0, None)?,
        };
        give_to(server.owner, server.dir())?;
        server.initdb()?;
        server.install_tls()?;
        server.watchdog = Some(server.spawn_watchdog()?);
        on_a_free_port(|port| {
            server.process.set_port(port);
            server.launch()
        })?;
        Ok(server)
    }

    /// One server for the whole test binary, started on first use and stopped (by the
    /// watchdog) when the test process exits. Use a fresh namespace or
    /// [`create_database`](Self::create_database) per test; never restart it.
    ///
    /// # Panics
    /// When the server cannot be started: every test that needs it must fail, loudly.
    pub fn shared() -> &'static PostgresServer {
        static SHARED: OnceLock<PostgresServer> = OnceLock::new();
        SHARED.get_or_init(|| {
            PostgresServer::start().unwrap_or_else(|e| panic!("a private PostgreSQL server: {e}"))
        })
    }

    /// `postgres://postgres@127.0.0.1:<port>/postgres`.
    pub fn url(&self) -> String {
        self.url_for("postgres")
    }

    /// The URL of database `database` on this server.
    pub fn url_for(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port())
    }

    /// The loopback address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.process.addr()
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.process.port()
    }

    /// The server's directory: the data directory, the unix socket and the log are in it.
    pub fn dir(&self) -> &Path {
        self.process.dir()
    }

    /// The data directory.
    pub fn data_dir(&self) -> PathBuf {
        self.dir().join("data")
    }

    /// The directory of the unix socket (`.s.PGSQL.<port>`).
    pub fn socket_dir(&self) -> &Path {
        self.dir()
    }

    /// The server's log (its stderr).
    pub fn log_path(&self) -> PathBuf {
        self.process.log_path()
    }

    /// The directory the binaries were taken from.
    pub fn bin_dir(&self) -> &Path {
        &self.bin
    }

    /// The postmaster's process id, while the server runs.
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// Whether the server process is running.
    pub fn is_running(&self) -> bool {
        self.process.is_running()
    }

    /// Stops the server and waits until it has exited. Nothing happens if it is not running.
    ///
    /// # Errors
    /// When it does not exit within the startup timeout (it is then killed).
    pub fn stop(&self, how: Stop) -> io::Result<()> {
        let Some(mut child) = self.process.take() else {
            return Ok(());
        };
        let signal = match how {
            Stop::Fast => Signal::SIGINT,
            Stop::Immediate => Signal::SIGQUIT,
        };
        let _ = kill(Pid::from_raw(child.id() as i32), signal);
        let timeout = self.options.startup_timeout;
        poll_until(
            timeout,
            Duration::from_millis(10),
            || {
                Ok(match child.try_wait()? {
                    Some(_) => ControlFlow::Break(()),
                    None => ControlFlow::Continue(()),
                })
            },
            |()| {
                format!(
                    "{} did not stop within {timeout:?}; {}",
                    self.process,
                    self.process.diagnostics()
                )
            },
        )
        .inspect_err(|_| {
            let _ = child.kill();
            let _ = child.wait();
        })
    }

    /// Starts the stopped server again on the same port, with the same data, and waits until
    /// it is ready.
    ///
    /// # Errors
    /// When it is running already, or does not become ready in time.
    pub fn start_again(&self) -> io::Result<()> {
        if self.is_running() {
            return Err(io::Error::other("postgres is running already"));
        }
        // A socket of the old process can delay the bind briefly.
        retry(
            self.options.startup_timeout,
            Duration::from_millis(100),
            || self.launch(),
        )
    }

    /// [`stop`](Self::stop)s the server, then [`start_again`](Self::start_again)s it.
    ///
    /// # Errors
    /// As those two.
    pub fn restart(&self, how: Stop) -> io::Result<()> {
        self.stop(how)?;
        self.start_again()
    }

    /// Runs `sql` in database `postgres` with `psql` and returns its output: unaligned,
    /// tuples only, one row per line, columns separated by `|`.
    ///
    /// # Errors
    /// When `psql` cannot run or the statement fails (the message quotes `psql`'s stderr).
    pub fn sql(&self, sql: &str) -> io::Result<String> {
        self.sql_in("postgres", sql)
    }

    /// [`sql`](Self::sql) in database `database`.
    ///
    /// # Errors
    /// As [`sql`](Self::sql).
    pub fn sql_in(&self, database: &str, sql: &str) -> io::Result<String> {
        run(
            Command::new(self.tool("psql"))
                .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"])
                .args(["-h", "127.0.0.1", "-U", "postgres"])
                .arg("-p")
                .arg(self.port().to_string())
                .arg("-d")
                .arg(database)
                .arg("-c")
                .arg(sql)
                .env("PGCONNECT_TIMEOUT", "10"),
            &format!("psql on port {} running {sql:?}", self.port()),
        )
    }

    /// Creates database `name` (a plain identifier) and returns its URL.
    ///
    /// # Errors
    /// As [`sql`](Self::sql), also when it exists.
    pub fn create_database(&self, name: &str) -> io::Result<String> {
        assert!(
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
            "database names in tests are plain lower-case identifiers, got {name:?}"
        );
        self.sql(&format!("CREATE DATABASE {name}"))?;
        Ok(self.url_for(name))
    }

    /// Terminates (`pg_terminate_backend`) every backend whose `application_name` is
    /// `application`, and returns how many there were.
    ///
    /// # Errors
    /// As [`sql`](Self::sql).
    pub fn terminate_backends(&self, application: &str) -> io::Result<u64> {
        let quoted = application.replace('\'', "''");
        let out = self.sql(&format!(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = '{quoted}' AND pid <> pg_backend_pid()"
        ))?;
        out.trim()
            .parse()
            .map_err(|_| io::Error::other(format!("unexpected count {out:?}")))
    }

    pub(crate) fn tool(&self, name: &str) -> PathBuf {
        let in_bin = self.bin.join(name);
        if in_bin.exists() {
            in_bin
        } else {
            PathBuf::from(name)
        }
    }

    /// A command that runs as the server's owner.
    fn as_owner(&self, program: &Path) -> Command {
        let mut command = Command::new(program);
        if let Some((uid, gid)) = self.owner {
            command.uid(uid).gid(gid);
        }
        command
            .current_dir(self.dir())
            .stdin(Stdio::null())
            .env_remove("PGDATA");
        command
    }

    fn initdb(&self) -> io::Result<()> {
        let initdb = self.bin.join("initdb");
        run(
            self.as_owner(&initdb)
                .arg("-D")
                .arg(self.data_dir())
                .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"])
                .args(["--locale=C"]),
            &initdb.display().to_string(),
        )
        .map(drop)
    }

    /// Copies the TLS certificate and key into the server's directory, owned by the server's
    /// owner, the key with mode 0600.
    fn install_tls(&self) -> io::Result<()> {
        let Some((cert, key)) = &self.options.tls else {
            return Ok(());
        };
        for (from, to) in [(cert, "server.crt"), (key, "server.key")] {
            let to = self.dir().join(to);
            std::fs::copy(from, &to)?;
            std::fs::set_permissions(&to, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
            give_to(self.owner, &to)?;
        }
        Ok(())
    }

    /// Stops the server and removes the directory when this process exits without dropping
    /// the server.
    fn spawn_watchdog(&self) -> io::Result<Watchdog> {
        let cleanup = r#"pid=$(head -n 1 "$2/postmaster.pid" 2>/dev/null) && kill -QUIT "$pid" 2>/dev/null
for _ in 1 2 3 4 5 6 7 8 9 10; do [ -e "$2/postmaster.pid" ] || break; sleep 0.5; done
rm -rf "$3""#;
        Watchdog::spawn(
            "baton-pg-watchdog",
            cleanup,
            &[self.data_dir().as_os_str(), self.dir().as_os_str()],
        )
    }

    /// Starts the postmaster and waits until it is ready.
    fn launch(&self) -> io::Result<()> {
        let mut command = self.as_owner(&self.bin.join("postgres"));
        command
            .arg("-D")
            .arg(self.data_dir())
            .arg("-p")
            .arg(self.port().to_string())
            .arg("-c")
            .arg("listen_addresses=127.0.0.1")
            .arg("-c")
            .arg(format!("unix_socket_directories={}", self.dir().display()))
            .args(["-c", "max_connections=200", "-c", "shared_buffers=32MB"])
            .args(["-c", "dynamic_shared_memory_type=mmap"]);
        if self.options.tls.is_some() {
            let dir = self.dir().display();
            command
                .args(["-c", "ssl=on"])
                .arg("-c")
                .arg(format!("ssl_cert_file={dir}/server.crt"))
                .arg("-c")
                .arg(format!("ssl_key_file={dir}/server.key"));
        }
        for (name, value) in &self.options.settings {
            command.arg("-c").arg(format!("{name}={value}"));
        }
        self.process.spawn(&mut command)?;
        let pid_file = self.data_dir().join("postmaster.pid");
        self.process
            .wait_ready(self.options.startup_timeout, "become ready", || {
                // Line 1 of postmaster.pid is the postmaster's pid, line 8 the server's
                // status: "ready" once it accepts connections.
                let text = std::fs::read_to_string(&pid_file).unwrap_or_default();
                let lines: Vec<&str> = text.lines().map(str::trim).collect();
                let pid = self.pid().map(|p| p.to_string());
                if lines.first().copied() == pid.as_deref() && lines.get(7) == Some(&"ready") {
                    Ok(())
                } else {
                    Err(format!("postmaster.pid {lines:?}"))
                }
            })
            .inspect_err(|_| {
                let _ = self.stop(Stop::Immediate);
            })
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        let _ = self.stop(Stop::Immediate);
    }
}

/// Runs `command` to its end and returns its stdout, trimmed.
///
/// # Errors
/// When it cannot run, or fails: the message names it `what` and quotes its stderr.
fn run(command: &mut Command, what: &str) -> io::Result<String> {
    let output = command
        .stdin(Stdio::null())
        .output()
        .map_err(|e| spawn_error(e, command.get_program(), INSTALL_HINT))?;
    if !output.status.success() {
        return Err(io::Error::other(format!(
            "{what} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

/// The directory of `initdb` and `postgres`: [`PG_BIN_ENV`], else `initdb` on `PATH`, else
/// the newest Debian `/usr/lib/postgresql/<version>/bin`.
fn find_bin_dir() -> io::Result<PathBuf> {
    find_bin_dir_in(
        std::env::var_os(PG_BIN_ENV).filter(|v| !v.is_empty()),
        std::env::var_os("PATH"),
        Path::new(DEBIAN_PG_LIB),
    )
}

fn find_bin_dir_in(
    env: Option<OsString>,
    path: Option<OsString>,
    debian: &Path,
) -> io::Result<PathBuf> {
    let has_server = |dir: &Path| dir.join("initdb").is_file() && dir.join("postgres").is_file();
    if let Some(dir) = env {
        let dir = PathBuf::from(dir);
        if has_server(&dir) {
            return Ok(dir);
        }
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "{PG_BIN_ENV}={} has no initdb and postgres; {INSTALL_HINT}",
                dir.display()
            ),
        ));
    }
    for dir in std::env::split_paths(&path.unwrap_or_default()) {
        if has_server(&dir) {
            return Ok(dir);
        }
    }
    let mut versions: Vec<(Vec<u32>, PathBuf)> = std::fs::read_dir(debian)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let version: Vec<u32> = name
                .split('.')
                .map(str::parse)
                .collect::<Result<_, _>>()
                .ok()?;
            let bin = entry.path().join("bin");
            has_server(&bin).then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "no PostgreSQL server found (no initdb on PATH, none under {}); PostgreSQL tests are never skipped: {INSTALL_HINT}",
                debian.display()
            ),
        )
    })
}

/// The uid and gid of the `postgres` user when this process runs as root (PostgreSQL
/// refuses to run as root), `None` otherwise.
pub(crate) fn server_owner() -> io::Result<Option<(u32, u32)>> {
    if std::fs::metadata("/proc/self")?.uid() != 0 {
        return Ok(None);
    }
    let passwd = std::fs::read_to_string("/etc/passwd")?;
    passwd_entry(&passwd, "postgres").map(Some).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            "the tests run as root, and PostgreSQL refuses to; there is no `postgres` user to run it as (the Debian package creates one: apt-get install postgresql)",
        )
    })
}

/// Makes `owner` (a uid and gid from [`server_owner`]), when there is one, the owner of
/// `path`.
pub(crate) fn give_to(owner: Option<(u32, u32)>, path: &Path) -> io::Result<()> {
    match owner {
        Some((uid, gid)) => std::os::unix::fs::chown(path, Some(uid), Some(gid)),
        None => Ok(()),
    }
}

/// The uid and gid of `user` in an `/etc/passwd` text.
fn passwd_entry(passwd: &str, user: &str) -> Option<(u32, u32)> {
    passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        if fields.next()? != user {
            return None;
        }
        let _password = fields.next()?;
        let uid = fields.next()?.parse().ok()?;
        let gid = fields.next()?.parse().ok()?;
        Some((uid, gid))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwd_lines_are_parsed() {
        let passwd = "root:x:0:0:root:/root:/bin/bash\npostgres:x:101:104:PostgreSQL administrator,,,:/var/lib/postgresql:/bin/bash\n";
        assert_eq!(passwd_entry(passwd, "postgres"), Some((101, 104)));
        assert_eq!(passwd_entry(passwd, "nobody"), None);
    }

    #[test]
    fn binaries_are_found_on_path_or_under_the_debian_directory() {
        let root = tempfile::tempdir().unwrap();
        let fake = |dir: &Path| {
            std::fs::create_dir_all(dir).unwrap();
            std::fs::write(dir.join("initdb"), "").unwrap();
            std::fs::write(dir.join("postgres"), "").unwrap();
        };
        let debian = root.path().join("lib");
        fake(&debian.join("13/bin"));
        fake(&debian.join("15/bin"));
        std::fs::create_dir_all(debian.join("16/bin")).unwrap(); // a client-only install
        let empty_path = Some(OsString::from(root.path().join("nothing")));
        assert_eq!(
            find_bin_dir_in(None, empty_path.clone(), &debian).unwrap(),
            debian.join("15/bin"),
            "the newest version with a server"
        );
        let on_path = root.path().join("usr-local-bin");
        fake(&on_path);
        assert_eq!(
            find_bin_dir_in(None, Some(on_path.clone().into_os_string()), &debian).unwrap(),
            on_path,
            "PATH first"
        );
        assert_eq!(
            find_bin_dir_in(Some(debian.join("13/bin").into()), None, &debian).unwrap(),
            debian.join("13/bin"),
            "the environment variable wins"
        );
        let missing = find_bin_dir_in(None, empty_path, &root.path().join("none")).unwrap_err();
        assert_eq!(missing.kind(), io::ErrorKind::NotFound);
        assert!(
            missing.to_string().contains("apt-get install postgresql"),
            "{missing}"
        );
        let bad_env = find_bin_dir_in(Some(root.path().into()), None, &debian).unwrap_err();
        assert!(bad_env.to_string().contains(PG_BIN_ENV), "{bad_env}");
    }

    #[test]
    fn server_starts_answers_restarts_and_keeps_its_data() {
        let server = PostgresServer::start().unwrap();
        assert_ne!(server.port(), 5432, "the machine's own PostgreSQL");
        assert!(server.url().starts_with("postgres://postgres@127.0.0.1:"));
        assert!(
            server
                .socket_dir()
                .join(format!(".s.PGSQL.{}", server.port()))
                .exists(),
            "the unix socket is in the server's directory"
        );
        server
            .sql("CREATE TABLE t (v text); INSERT INTO t VALUES ('kept')")
            .unwrap();
        assert_eq!(server.sql("SELECT v FROM t").unwrap(), "kept");
        assert!(server.sql("SELECT nonsense").is_err());

        let pid = server.pid().unwrap();
        server.restart(Stop::Immediate).unwrap();
        assert_ne!(server.pid(), Some(pid));
        assert_eq!(
            server.sql("SELECT v FROM t").unwrap(),
            "kept",
            "after crash recovery"
        );
        server.restart(Stop::Fast).unwrap();
        assert_eq!(server.sql("SELECT v FROM t").unwrap(), "kept");

        let url = server.create_database("second").unwrap();
        assert!(url.ends_with("/second"), "{url}");
        assert_eq!(server.sql_in("second", "SELECT 1").unwrap(), "1");

        server.stop(Stop::Fast).unwrap();
        assert!(!server.is_running());
        assert!(server.sql("SELECT 1").is_err());
        server.start_again().unwrap();
        assert_eq!(server.sql("SELECT 2").unwrap(), "2");
    }

    #[test]
    fn dropping_the_server_stops_it_and_removes_its_directory() {
        let server = PostgresServer::start().unwrap();
        let dir = server.dir().to_path_buf();
        let port = server.port();
        drop(server);
        assert!(!dir.exists());
        assert!(std::net::TcpStream::connect((std::net::Ipv4Addr::LOCALHOST, port)).is_err());
    }
}
