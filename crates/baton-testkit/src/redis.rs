//! Private `redis-server` processes for tests that may kill, pause and restart them.
//!
//! [`RedisServer::start`] runs a `redis-server` of its own on a free loopback port, in a
//! temporary directory, without persistence (`--save '' --appendonly no`) unless the
//! [`RedisOptions`] add arguments, and returns once it answers `PING`. It never touches the
//! machine's own Redis on port 6379. [`RedisServer::command`] sends one command over plain
//! TCP (RESP), for the administrative commands fault tests need (`SCRIPT FLUSH`,
//! `CLIENT KILL`, `INFO commandstats`) without going through the store under test.
//!
//! A missing `redis-server` binary is an error that names the fix (`apt-get install
//! redis-server`), never a reason to skip: a Redis test that cannot run fails.
//!
//! ```no_run
//! use baton_testkit::redis::{RedisOptions, RedisServer};
//!
//! let server = RedisServer::start().unwrap();
//! let url = server.url(); // redis://127.0.0.1:<port>
//! server.pause().unwrap(); // SIGSTOP: connected clients time out
//! server.resume().unwrap();
//! server.kill(); // SIGKILL: the data is gone (no persistence)
//! server.restart().unwrap(); // same port, same directory
//!
//! let lru = RedisServer::start_with(RedisOptions::new().args(["--maxmemory-policy", "allkeys-lru"]))
//!     .unwrap();
//! # let _ = (url, lru);
//! ```
//!
//! ## Behavior
//! - Dropping a [`RedisServer`] kills the process (SIGKILL) and removes its directory. A
//!   test process that is itself SIGKILLed leaves its server running; it listens on
//!   loopback only.
//! - Every wait is bounded: startup by [`RedisOptions::startup_timeout`], each admin
//!   command by a 5 s socket timeout.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::{self, BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::server::{ServerProcess, free_port, on_a_free_port, poll_until, retry};

/// The environment variable that names the `redis-server` binary to run, when it is not
/// `redis-server` on `PATH`.
pub const REDIS_SERVER_ENV: &str = "BATON_REDIS_SERVER";

/// The one-line fix for a machine without Redis.
pub const INSTALL_HINT: &str = "install it with `apt-get install redis-server` (Debian/Ubuntu), or name the binary in BATON_REDIS_SERVER";

/// How long one admin command may take.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);

/// How to start a [`RedisServer`].
#[derive(Debug, Clone)]
#[must_use = "options do nothing until passed to RedisServer::start_with"]
pub struct RedisOptions {
    args: Vec<OsString>,
    startup_timeout: Duration,
}

impl Default for RedisOptions {
    fn default() -> Self {
        RedisOptions {
            args: Vec::new(),
            startup_timeout: Duration::from_secs(30),
        }
    }
}

impl RedisOptions {
    /// No extra arguments; 30 s to answer `PING`.
    pub fn new() -> Self {
        RedisOptions::default()
    }

    /// Adds one command-line argument, after the defaults, so it overrides them
    /// (`--appendonly yes`).
    pub fn arg(mut self, arg: impl Into<OsString>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Adds command-line arguments, after the defaults:
    /// `.args(["--maxmemory-policy", "allkeys-lru"])`.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// How long a start or restart may take until the server answers `PING` (default 30 s,
    /// generous for a loaded machine and for loading an append-only file).
    pub fn startup_timeout(mut self, timeout: Duration) -> Self {
        self.startup_timeout = timeout;
        self
    }
}

/// A private `redis-server` on a loopback port. See the [module docs](self).
#[derive(Debug)]
pub struct RedisServer {
    options: RedisOptions,
    binary: OsString,
    /// Killed, and its directory removed, when the server is dropped.
    process: ServerProcess,
}

impl RedisServer {
    /// Starts a server with the default options.
    ///
    /// # Errors
    /// When `redis-server` is not installed (the message says how to install it), or the
    /// server does not answer `PING` in time (the message quotes its log).
    pub fn start() -> io::Result<RedisServer> {
        RedisServer::start_with(RedisOptions::new())
    }

    /// Starts a server with `options`.
    ///
    /// # Errors
    /// As [`RedisServer::start`].
    pub fn start_with(options: RedisOptions) -> io::Result<RedisServer> {
        let binary = std::env::var_os(REDIS_SERVER_ENV)
            .filter(|b| !b.is_empty())
            .unwrap_or_else(|| OsString::from("redis-server"));
        on_a_free_port(|port| {
            let server = RedisServer::unstarted(options.clone(), binary.clone(), port)?;
            server.launch()?;
            Ok(server)
        })
    }

    /// A server of `binary` on `port`, in a new directory, not started yet.
    fn unstarted(options: RedisOptions, binary: OsString, port: u16) -> io::Result<RedisServer> {
        Ok(RedisServer {
            options,
            binary,
            process: ServerProcess::new("redis-server", INSTALL_HINT, port, Some("redis.log"))?,
        })
    }

    /// Starts a replica of `primary` (`--replicaof 127.0.0.1 <port>`) with `options`, and
    /// returns once it has synchronized (`master_link_status:up`).
    ///
    /// # Errors
    /// As [`RedisServer::start`], and when the replica does not synchronize within the
    /// startup timeout.
    pub fn start_replica_of(
        primary: &RedisServer,
        options: RedisOptions,
    ) -> io::Result<RedisServer> {
        let timeout = options.startup_timeout;
        // The primary starts a full synchronization at once, not after the default 5 s
        // wait for more replicas.
        primary.command_ok(&["CONFIG", "SET", "repl-diskless-sync-delay", "0"])?;
        let replica = RedisServer::start_with(options.args([
            "--replicaof".to_owned(),
            "127.0.0.1".to_owned(),
            primary.port().to_string(),
        ]))?;
        replica.wait_replicating(timeout)?;
        // The primary counts the replica for WAIT once it lists it online.
        let online = format!("port={},state=online", replica.port());
        primary.wait_for_info(
            "replication",
            timeout,
            &format!("list the replica on port {} online", replica.port()),
            |info| info.contains(&online),
        )?;
        Ok(replica)
    }

    /// Waits until this server is a replica whose link to its primary is up.
    ///
    /// # Errors
    /// When the link is not up within `timeout` (the message quotes `INFO replication`).
    pub fn wait_replicating(&self, timeout: Duration) -> io::Result<()> {
        self.wait_for_info(
            "replication",
            timeout,
            "synchronize with its primary",
            |info| info.lines().any(|l| l.trim() == "master_link_status:up"),
        )
    }

    /// Waits until `INFO <section>` shows what `holds` looks for; `what` names it in the
    /// error, which quotes the section.
    fn wait_for_info(
        &self,
        section: &str,
        timeout: Duration,
        what: &str,
        holds: impl Fn(&str) -> bool,
    ) -> io::Result<()> {
        poll_until(
            timeout,
            Duration::from_millis(20),
            || {
                let info = self.info(section)?;
                Ok(if holds(&info) {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(info)
                })
            },
            |info| format!("{} did not {what} within {timeout:?}: {info}", self.process),
        )
    }

    /// Cuts this replica off from its primary, keeping the data it has: it is pointed at a
    /// port nobody listens on, so it stops receiving writes, as a replica behind a broken
    /// network link does.
    ///
    /// # Errors
    /// As [`RedisServer::command_ok`].
    pub fn cut_off_replication(&self) -> io::Result<()> {
        let nowhere = free_port()?.to_string();
        self.command_ok(&["REPLICAOF", "127.0.0.1", nowhere.as_str()])
            .map(drop)
    }

    /// Promotes this replica to a primary (`REPLICAOF NO ONE`), keeping its data.
    ///
    /// # Errors
    /// As [`RedisServer::command_ok`].
    pub fn promote(&self) -> io::Result<()> {
        self.command_ok(&["REPLICAOF", "NO", "ONE"]).map(drop)
    }

    /// Waits until `replicas` replicas have acknowledged every write made so far
    /// (`WAIT replicas timeout`), and returns how many did.
    ///
    /// # Errors
    /// As [`RedisServer::command_ok`].
    pub fn wait_for_replicas(&self, replicas: u32, timeout: Duration) -> io::Result<i64> {
        let reply = self.command_ok(&[
            "WAIT".to_owned(),
            replicas.to_string(),
            timeout.as_millis().to_string(),
        ])?;
        reply
            .as_integer()
            .ok_or_else(|| io::Error::other(format!("WAIT answered {reply:?}")))
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port())
    }

    /// The loopback address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.process.addr()
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.process.port()
    }

    /// The server's working directory (its log, and its append-only file when enabled).
    pub fn dir(&self) -> &Path {
        self.process.dir()
    }

    /// The server's log file.
    pub fn log_path(&self) -> PathBuf {
        self.process.log_path()
    }

    /// The process id, while the server runs.
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// Whether the process is running (a paused process is running).
    pub fn is_running(&self) -> bool {
        self.process.is_running()
    }

    /// Kills the server (SIGKILL) and reaps it. Without persistence its data is gone.
    /// Nothing happens if it is not running.
    pub fn kill(&self) {
        self.process.kill();
    }

    /// Suspends the server (SIGSTOP): connections stay open and nothing is answered.
    ///
    /// # Errors
    /// When the server is not running or the signal cannot be sent.
    pub fn pause(&self) -> io::Result<()> {
        crate::process::pause(self.process.running_pid()?).map_err(io::Error::from)
    }

    /// Resumes a paused server (SIGCONT).
    ///
    /// # Errors
    /// As [`RedisServer::pause`].
    pub fn resume(&self) -> io::Result<()> {
        crate::process::resume(self.process.running_pid()?).map_err(io::Error::from)
    }

    /// Kills the server if it runs, then starts it again on the same port, in the same
    /// directory and with the same options, and waits until it answers `PING`.
    ///
    /// # Errors
    /// When it does not come back in time.
    pub fn restart(&self) -> io::Result<()> {
        self.kill();
        // The port is ours until someone else binds it; a lingering socket of the old
        // process can delay the bind briefly.
        retry(
            self.options.startup_timeout,
            Duration::from_millis(100),
            || self.launch(),
        )
    }

    /// Sends one command (`["SCRIPT", "FLUSH"]`) on a new connection and returns the reply.
    /// A Redis error reply is `Ok(Resp::Error(..))`.
    ///
    /// # Errors
    /// When the server cannot be reached within 5 s or answers something that is not RESP.
    pub fn command<S: AsRef<[u8]>>(&self, args: &[S]) -> io::Result<Resp> {
        command(self.addr(), args, COMMAND_TIMEOUT)
    }

    /// [`RedisServer::command`] for a command that must succeed: a Redis error reply is an
    /// error too.
    ///
    /// # Errors
    /// As [`RedisServer::command`], and for an error reply.
    pub fn command_ok<S: AsRef<[u8]>>(&self, args: &[S]) -> io::Result<Resp> {
        match self.command(args)? {
            Resp::Error(message) => Err(io::Error::other(format!(
                "redis answered {:?} with an error: {message}",
                args.iter()
                    .map(|a| String::from_utf8_lossy(a.as_ref()).into_owned())
                    .collect::<Vec<_>>()
            ))),
            reply => Ok(reply),
        }
    }

    /// `INFO <section>` as text.
    ///
    /// # Errors
    /// As [`RedisServer::command_ok`].
    pub fn info(&self, section: &str) -> io::Result<String> {
        let reply = self.command_ok(&["INFO", section])?;
        reply
            .as_text()
            .ok_or_else(|| io::Error::other(format!("INFO answered {reply:?}")))
    }

    /// How often each command has been called since the server started or `CONFIG
    /// RESETSTAT`, from `INFO commandstats`, keyed by lower-case command name
    /// (`evalsha`, `publish`, `client|kill`). Commands that scripts call are counted too.
    ///
    /// # Errors
    /// As [`RedisServer::command_ok`].
    pub fn command_calls(&self) -> io::Result<BTreeMap<String, u64>> {
        Ok(parse_commandstats(&self.info("commandstats")?))
    }

    /// What `step` made the server run, by command (those the scripts call too, `INFO`
    /// aside): how a test pins the calls a script makes on a path.
    ///
    /// # Panics
    /// When the server does not answer `INFO`.
    pub async fn commands_during<T>(
        self: &std::sync::Arc<Self>,
        step: impl std::future::Future<Output = T>,
    ) -> (T, BTreeMap<String, u64>) {
        let calls = |server: std::sync::Arc<RedisServer>| async move {
            tokio::task::spawn_blocking(move || server.command_calls().expect("INFO commandstats"))
                .await
                .expect("the INFO task")
        };
        let before = calls(std::sync::Arc::clone(self)).await;
        let answer = step.await;
        let after = calls(std::sync::Arc::clone(self)).await;
        let ran = after
            .into_iter()
            .filter(|(name, _)| name != "info")
            .map(|(name, n)| (n - before.get(&name).copied().unwrap_or(0), name))
            .filter(|(n, _)| *n > 0)
            .map(|(n, name)| (name, n))
            .collect();
        (answer, ran)
    }

    /// Starts the process and waits until it answers `PING`.
    fn launch(&self) -> io::Result<()> {
        let mut command = Command::new(&self.binary);
        command
            .arg("--port")
            .arg(self.port().to_string())
            .args(["--bind", "127.0.0.1"])
            .arg("--dir")
            .arg(self.dir())
            .arg("--logfile")
            .arg(self.log_path())
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .args(&self.options.args);
        self.process.start(
            &mut command,
            self.options.startup_timeout,
            "answer PING",
            || ping(self.addr()),
        )
    }
}

/// Whether the server at `addr` answers `PING` with `PONG`; `Err` with what it answered
/// instead.
pub(crate) fn ping(addr: SocketAddr) -> Result<(), String> {
    match command(addr, &["PING"], Duration::from_millis(500)) {
        Ok(Resp::Simple(pong)) if pong == "PONG" => Ok(()),
        reply => Err(format!("{reply:?}")),
    }
}

/// A RESP reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resp {
    /// `+OK`.
    Simple(String),
    /// `-ERR ...`: the command failed.
    Error(String),
    /// `:42`.
    Integer(i64),
    /// `$n` bytes, `None` for the null bulk string.
    Bulk(Option<Vec<u8>>),
    /// `*n` replies, `None` for the null array.
    Array(Option<Vec<Resp>>),
}

impl Resp {
    /// The reply as text, for simple and bulk strings.
    pub fn as_text(&self) -> Option<String> {
        match self {
            Resp::Simple(s) => Some(s.clone()),
            Resp::Bulk(Some(bytes)) => Some(String::from_utf8_lossy(bytes).into_owned()),
            _ => None,
        }
    }

    /// The texts of an array of strings (`CONFIG GET` answers), `None` for anything else.
    pub fn as_texts(&self) -> Option<Vec<String>> {
        match self {
            Resp::Array(Some(items)) => items.iter().map(Resp::as_text).collect(),
            _ => None,
        }
    }

    /// The reply as an integer.
    pub fn as_integer(&self) -> Option<i64> {
        match self {
            Resp::Integer(n) => Some(*n),
            _ => None,
        }
    }
}

/// Sends one command to `addr` on a new connection and reads one reply.
///
/// # Errors
/// When the connection fails, `timeout` passes, or the reply is not RESP.
pub fn command<S: AsRef<[u8]>>(
    addr: SocketAddr,
    args: &[S],
    timeout: Duration,
) -> io::Result<Resp> {
    assert!(addr.ip().is_loopback(), "tests talk to loopback only");
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    stream.write_all(&encode(args))?;
    read_reply(&mut BufReader::new(stream))
}

/// A command as a RESP array of bulk strings.
fn encode<S: AsRef<[u8]>>(args: &[S]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        let arg = arg.as_ref();
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
    out
}

fn read_reply(reader: &mut impl BufRead) -> io::Result<Resp> {
    let line = read_line(reader)?;
    let (kind, rest) = line
        .split_at_checked(1)
        .ok_or_else(|| bad_reply("empty line"))?;
    let number = |rest: &str| {
        rest.parse::<i64>()
            .map_err(|_| bad_reply(&format!("bad length or integer {rest:?}")))
    };
    Ok(match kind {
        "+" => Resp::Simple(rest.to_owned()),
        "-" => Resp::Error(rest.to_owned()),
        ":" => Resp::Integer(number(rest)?),
        "$" => match usize::try_from(number(rest)?) {
            Err(_) => Resp::Bulk(None),
            Ok(len) => {
                let mut bytes = vec![0; len + 2];
                reader.read_exact(&mut bytes)?;
                bytes.truncate(len);
                Resp::Bulk(Some(bytes))
            }
        },
        "*" => match usize::try_from(number(rest)?) {
            Err(_) => Resp::Array(None),
            Ok(len) => Resp::Array(Some(
                (0..len)
                    .map(|_| read_reply(reader))
                    .collect::<io::Result<_>>()?,
            )),
        },
        other => return Err(bad_reply(&format!("unknown reply type {other:?}"))),
    })
}

fn read_line(reader: &mut impl BufRead) -> io::Result<String> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "redis closed the connection",
        ));
    }
    Ok(line.trim_end_matches(['\r', '\n']).to_owned())
}

fn bad_reply(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("not RESP: {what}"))
}

/// `cmdstat_<name>:calls=N,...` lines of `INFO commandstats` as `name -> N`.
fn parse_commandstats(info: &str) -> BTreeMap<String, u64> {
    info.lines()
        .filter_map(|line| {
            let (name, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = stats
                .split(',')
                .find_map(|field| field.strip_prefix("calls="))?
                .parse()
                .ok()?;
            Some((name.to_owned(), calls))
        })
        .collect()
}

/// Commands and counts as [`RedisServer::commands_during`] answers them: `calls(&[("evalsha",
/// 1), ("time", 1)])`.
pub fn calls(list: &[(&str, u64)]) -> BTreeMap<String, u64> {
    list.iter().map(|(c, n)| ((*c).to_owned(), *n)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resp_round_trip() {
        assert_eq!(encode(&["GET", "k"]), b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n");
        let input = b"*4\r\n+OK\r\n:-3\r\n$-1\r\n$5\r\nhe\r\no\r\n-ERR no\r\n";
        let mut reader = BufReader::new(&input[..]);
        assert_eq!(
            read_reply(&mut reader).unwrap(),
            Resp::Array(Some(vec![
                Resp::Simple("OK".into()),
                Resp::Integer(-3),
                Resp::Bulk(None),
                Resp::Bulk(Some(b"he\r\no".to_vec())),
            ]))
        );
        assert_eq!(
            read_reply(&mut reader).unwrap(),
            Resp::Error("ERR no".into())
        );
        assert!(read_reply(&mut reader).is_err());
    }

    #[test]
    fn commandstats_are_parsed() {
        let info = "# Commandstats\r\ncmdstat_evalsha:calls=12,usec=40,usec_per_call=3.33,rejected_calls=0,failed_calls=0\r\ncmdstat_client|kill:calls=1,usec=5\r\n";
        let calls = parse_commandstats(info);
        assert_eq!(calls.get("evalsha"), Some(&12));
        assert_eq!(calls.get("client|kill"), Some(&1));
        assert_eq!(calls.len(), 2);
    }

    #[test]
    fn a_missing_binary_is_a_loud_error_with_the_install_hint() {
        let server = RedisServer::unstarted(
            RedisOptions::new(),
            OsString::from("/nonexistent/redis-server"),
            free_port().unwrap(),
        )
        .unwrap();
        let err = server.launch().unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        assert!(
            err.to_string().contains("apt-get install redis-server"),
            "{err}"
        );
    }

    #[test]
    fn server_answers_survives_pause_and_comes_back_after_kill() {
        let server = RedisServer::start().unwrap();
        assert_ne!(server.port(), 6379, "the machine's own Redis");
        assert!(server.url().starts_with("redis://127.0.0.1:"));
        server.command_ok(&["SET", "k", "v"]).unwrap();
        assert_eq!(
            server.command(&["GET", "k"]).unwrap().as_text().as_deref(),
            Some("v")
        );
        assert_eq!(
            server
                .command(&["CONFIG", "GET", "appendonly"])
                .unwrap()
                .as_texts()
                .unwrap(),
            ["appendonly", "no"]
        );
        assert!(matches!(
            server.command(&["NOSUCHCOMMAND"]).unwrap(),
            Resp::Error(_)
        ));

        server.pause().unwrap();
        let paused = command(server.addr(), &["PING"], Duration::from_millis(200));
        assert!(paused.is_err(), "a paused server answered {paused:?}");
        server.resume().unwrap();
        assert_eq!(
            server.command(&["PING"]).unwrap(),
            Resp::Simple("PONG".into())
        );
        assert!(
            server
                .command_calls()
                .unwrap()
                .get("ping")
                .is_some_and(|&n| n >= 1)
        );

        let pid = server.pid().unwrap();
        server.kill();
        assert!(!server.is_running());
        assert!(server.command(&["PING"]).is_err());
        assert!(server.pause().is_err());
        server.restart().unwrap();
        assert_ne!(server.pid(), Some(pid));
        assert_eq!(
            server.command(&["GET", "k"]).unwrap(),
            Resp::Bulk(None),
            "no persistence by default"
        );
    }

    #[test]
    fn extra_arguments_override_the_defaults_and_persist_across_restart() {
        let server = RedisServer::start_with(
            RedisOptions::new()
                .args(["--appendonly", "yes"])
                .args(["--maxmemory-policy", "allkeys-lru"]),
        )
        .unwrap();
        let policy = server
            .command_ok(&["CONFIG", "GET", "maxmemory-policy"])
            .unwrap();
        assert_eq!(
            policy.as_texts().unwrap(),
            ["maxmemory-policy", "allkeys-lru"]
        );
        server.command_ok(&["SET", "k", "kept"]).unwrap();
        server.kill();
        server.restart().unwrap();
        assert_eq!(
            server.command(&["GET", "k"]).unwrap().as_text().as_deref(),
            Some("kept")
        );
    }

    #[test]
    fn dropping_the_server_kills_it() {
        let server = RedisServer::start().unwrap();
        let addr = server.addr();
        let dir = server.dir().to_path_buf();
        drop(server);
        assert!(command(addr, &["PING"], Duration::from_millis(500)).is_err());
        assert!(!dir.exists());
    }
}
