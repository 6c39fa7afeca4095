//! A private three-member etcd cluster on loopback, for tests that may kill, pause and
//! restart its members.
//!
//! [`EtcdCluster::start`] runs three `etcd` processes of its own (members `m1`, `m2`, `m3`),
//! each on two free loopback ports (client and peer) and in a temporary directory of its
//! own, and returns once every member reports itself healthy (`GET /health`, which needs a
//! leader) and one of them is the leader. It never touches an etcd the machine runs.
//!
//! The members use a short heartbeat (50ms) and election timeout (500ms), so a failover
//! takes about a second and the cluster's smallest lease TTL is 1s.
//!
//! [`EtcdCluster::start_tls`] starts the same cluster with a second client port per member
//! that serves TLS with the certificate it is given (and, when asked, demands a client
//! certificate signed by a given CA); [`EtcdCluster::tls_url`] names those ports. The plain
//! client ports stay for the testkit's own health checks and for operator clients.
//!
//! A missing `etcd` binary is an error that names the fix (`apt-get install etcd-server`),
//! never a reason to skip.
//!
//! ## Members behind fault proxies
//! [`EtcdCluster::start_behind_proxies`] puts two [`FaultProxy`]s in front of each member:
//! one on its client port and one on its peer port, and makes the member advertise the
//! proxies' addresses (`--advertise-client-urls`, `--initial-advertise-peer-urls`,
//! `--initial-cluster`), so the clients of [`EtcdCluster::url`] and the other members reach it
//! only through them. etcd sends every Raft message over a connection that its *receiver*
//! opened to the sender's peer URL (the sender's stream writers; only snapshots go the other
//! way), so blackholing a member's peer proxy silences everything it says to the others,
//! while what they say to it still arrives. [`EtcdCluster::partition`] does that and
//! blackholes its client proxy too: the member can then neither answer a client, nor lead,
//! nor commit, nor serve a linearizable read (each needs its messages to reach a quorum),
//! which is what a member cut off by the network shows from outside.
//! [`EtcdCluster::heal`] ends it; the held bytes are delivered late, as TCP would.
//! [`EtcdCluster::client_proxy`] gives the other faults (latency, `kill_connections`).
//!
//! ```no_run
//! use baton_testkit::etcd::EtcdCluster;
//!
//! let cluster = EtcdCluster::start_behind_proxies().unwrap();
//! let url = cluster.url(); // the client proxies' addresses
//! let leader = cluster.leader().unwrap(); // asked of the members directly
//! cluster.partition(leader); // the others elect a new leader
//! cluster.heal(leader);
//! cluster.client_proxy(0).unwrap().kill_connections(); // the clients' connections reset
//! # let _ = url;
//! ```
//!
//! ```no_run
//! use baton_testkit::etcd::EtcdCluster;
//!
//! let cluster = EtcdCluster::start().unwrap();
//! let url = cluster.url(); // etcd://127.0.0.1:<p1>,127.0.0.1:<p2>,127.0.0.1:<p3>
//! let leader = cluster.leader().unwrap(); // 0, 1 or 2
//! cluster.kill(leader); // SIGKILL: the others elect a new leader
//! cluster.restart(leader).unwrap(); // same ports, same data directory
//! cluster.pause(1).unwrap(); // SIGSTOP
//! cluster.resume(1).unwrap(); // SIGCONT
//! # let _ = url;
//! ```
//!
//! ## Behavior
//! - Dropping an [`EtcdCluster`] kills every member (SIGKILL) and removes their
//!   directories. A cluster kept in a `static` (shared by the tests of one binary) is
//!   cleaned up by a watchdog process when the test process exits.
//! - Every wait is bounded: startup and restart by [`STARTUP_TIMEOUT`], each health check
//!   by a 1s socket timeout.

use std::ffi::{OsStr, OsString};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::proxy::FaultProxy;
use crate::server::{ServerProcess, Watchdog, free_port, poll_until, retry};

/// The environment variable that names the `etcd` binary to run, when it is not `etcd` on
/// `PATH`.
pub const ETCD_ENV: &str = "BATON_ETCD";

/// The one-line fix for a machine without etcd.
pub const INSTALL_HINT: &str = "install it with `apt-get install etcd-server` (Debian/Ubuntu), or name the binary in BATON_ETCD";

/// How long a start or a restart may take until the members are healthy.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);

/// How long one health or status request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(1);

/// How many times the whole cluster is started on fresh ports before its error is final.
const START_ATTEMPTS: u32 = 3;

/// The members' names, in order.
const NAMES: [&str; 3] = ["m1", "m2", "m3"];

/// One member: its process (on its client port), its peer port, its TLS client port when
/// the cluster serves TLS, and the proxies in front of both plain ports, when it has them.
#[derive(Debug)]
struct Member {
    name: &'static str,
    peer_port: u16,
    tls_port: Option<u16>,
    process: ServerProcess,
    proxies: Option<Proxies>,
}

/// The fault proxies in front of one member: its clients' way in and its peers'.
#[derive(Debug)]
struct Proxies {
    client: FaultProxy,
    peer: FaultProxy,
}

impl Member {
    /// The client URL the member advertises and clients use: its client proxy's, if any.
    fn client_url(&self) -> String {
        let addr = match &self.proxies {
            Some(proxies) => proxies.client.addr(),
            None => self.process.addr(),
        };
        format!("http://{addr}")
    }

    /// The peer URL the member advertises and the others use: its peer proxy's, if any.
    fn peer_url(&self) -> String {
        match &self.proxies {
            Some(proxies) => format!("http://{}", proxies.peer.addr()),
            None => format!("http://127.0.0.1:{}", self.peer_port),
        }
    }
}

/// The certificate the members of [`EtcdCluster::start_tls`] serve TLS with (PEM files, as
/// [`crate::tls::certificates`] makes them).
#[derive(Debug, Clone)]
pub struct EtcdTls {
    /// The members' certificate (`--cert-file`); it must name 127.0.0.1.
    pub cert_file: PathBuf,
    /// Its private key (`--key-file`).
    pub key_file: PathBuf,
    /// When set, the TLS ports demand a client certificate signed by this CA
    /// (`--client-cert-auth --trusted-ca-file`).
    pub client_ca_file: Option<PathBuf>,
}

/// A private three-member etcd cluster on loopback. See the [module docs](self).
#[derive(Debug)]
pub struct EtcdCluster {
    binary: OsString,
    members: Vec<Member>,
    tls: Option<EtcdTls>,
    /// Cleans up after the members if this process exits without dropping the cluster.
    _watchdog: Watchdog,
}

impl EtcdCluster {
    /// Starts the three members and waits until they are healthy with a leader.
    ///
    /// # Errors
    /// When `etcd` is not installed (the message says how to install it), or the cluster
    /// does not become healthy in time (the message quotes the members' logs).
    pub fn start() -> io::Result<EtcdCluster> {
        EtcdCluster::start_with(None, false)
    }

    /// Starts the three members as [`EtcdCluster::start`] does, each with one more client
    /// port that serves TLS with `tls`'s certificate; [`EtcdCluster::tls_url`] names them.
    ///
    /// # Errors
    /// As [`EtcdCluster::start`].
    pub fn start_tls(tls: EtcdTls) -> io::Result<EtcdCluster> {
        EtcdCluster::start_with(Some(tls), false)
    }

    /// Starts the three members, each behind a client and a peer [`FaultProxy`] (see the
    /// [module docs](self#members-behind-fault-proxies)), and waits until they are healthy
    /// with a leader.
    ///
    /// # Errors
    /// As [`EtcdCluster::start`], and when a proxy cannot bind a port.
    pub fn start_behind_proxies() -> io::Result<EtcdCluster> {
        EtcdCluster::start_with(None, true)
    }

    fn start_with(tls: Option<EtcdTls>, proxied: bool) -> io::Result<EtcdCluster> {
        let binary = std::env::var_os(ETCD_ENV)
            .filter(|b| !b.is_empty())
            .unwrap_or_else(|| OsString::from("etcd"));
        let mut attempt = 1;
        loop {
            match EtcdCluster::start_once(&binary, tls.as_ref(), proxied) {
                Ok(cluster) => return Ok(cluster),
                Err(e) if e.kind() == io::ErrorKind::NotFound || attempt == START_ATTEMPTS => {
                    return Err(e);
                }
                Err(_) => attempt += 1,
            }
        }
    }

    fn start_once(binary: &OsStr, tls: Option<&EtcdTls>, proxied: bool) -> io::Result<EtcdCluster> {
        let mut members = Vec::new();
        for name in NAMES {
            let peer_port = free_port()?;
            let process = ServerProcess::new("etcd", INSTALL_HINT, free_port()?, None)?;
            let proxies = if proxied {
                Some(Proxies {
                    client: FaultProxy::start(process.addr())?,
                    peer: FaultProxy::start(SocketAddr::from(([127, 0, 0, 1], peer_port)))?,
                })
            } else {
                None
            };
            members.push(Member {
                name,
                peer_port,
                tls_port: tls.map(|_| free_port()).transpose()?,
                process,
                proxies,
            });
        }
        let dirs: Vec<&OsStr> = members
            .iter()
            .map(|m| m.process.dir().as_os_str())
            .collect();
        let watchdog = Watchdog::spawn(
            "baton-etcd-watchdog",
            r#"shift
for dir in "$@"; do kill -KILL "$(cat "$dir/etcd.pid" 2>/dev/null)" 2>/dev/null; done
rm -rf "$@""#,
            &dirs,
        )?;
        let cluster = EtcdCluster {
            binary: binary.to_owned(),
            members,
            tls: tls.cloned(),
            _watchdog: watchdog,
        };
        for index in 0..NAMES.len() {
            cluster.spawn(index)?;
        }
        for index in 0..NAMES.len() {
            cluster.wait_healthy(index, STARTUP_TIMEOUT)?;
        }
        cluster.wait_for_leader(STARTUP_TIMEOUT)?;
        Ok(cluster)
    }

    /// `etcd://127.0.0.1:<p1>,127.0.0.1:<p2>,127.0.0.1:<p3>`: every member (through its
    /// client proxy, when the members are behind proxies).
    pub fn url(&self) -> String {
        let members: Vec<String> = self
            .members
            .iter()
            .map(|m| m.client_url().replacen("http://", "", 1))
            .collect();
        format!("etcd://{}", members.join(","))
    }

    /// `etcds://127.0.0.1:<t1>,127.0.0.1:<t2>,127.0.0.1:<t3>`: every member's TLS client
    /// port.
    ///
    /// # Panics
    /// When the cluster was started without TLS ([`EtcdCluster::start`]).
    pub fn tls_url(&self) -> String {
        let members: Vec<String> = self
            .members
            .iter()
            .map(|m| {
                let port = m
                    .tls_port
                    .expect("tls_url of a cluster started without TLS");
                format!("127.0.0.1:{port}")
            })
            .collect();
        format!("etcds://{}", members.join(","))
    }

    /// `etcd://127.0.0.1:<port>`: member `index` alone (through its client proxy, when the
    /// members are behind proxies).
    pub fn member_url(&self, index: usize) -> String {
        self.members[index]
            .client_url()
            .replacen("http://", "etcd://", 1)
    }

    /// The client address of member `index` itself, never a proxy's: what the cluster's own
    /// health checks use, and an operator's tool would.
    pub fn client_addr(&self, index: usize) -> SocketAddr {
        self.members[index].process.addr()
    }

    /// The fault proxy in front of member `index`'s client port, when the members are behind
    /// proxies ([`EtcdCluster::start_behind_proxies`]).
    pub fn client_proxy(&self, index: usize) -> Option<&FaultProxy> {
        self.members[index].proxies.as_ref().map(|p| &p.client)
    }

    /// The fault proxy in front of member `index`'s peer port, when the members are behind
    /// proxies: what the other members send it, and receive from it, goes through it.
    pub fn peer_proxy(&self, index: usize) -> Option<&FaultProxy> {
        self.members[index].proxies.as_ref().map(|p| &p.peer)
    }

    /// Cuts member `index` off: blackholes its client and peer proxies, so nothing it says
    /// reaches a client or another member (see the [module
    /// docs](self#members-behind-fault-proxies)). Bytes are held until
    /// [`EtcdCluster::heal`].
    ///
    /// # Panics
    /// When the members are not behind proxies.
    pub fn partition(&self, index: usize) {
        let proxies = self.proxies(index);
        proxies.peer.blackhole();
        proxies.client.blackhole();
    }

    /// Ends every proxy fault of member `index` (latency stays).
    ///
    /// # Panics
    /// When the members are not behind proxies.
    pub fn heal(&self, index: usize) {
        let proxies = self.proxies(index);
        proxies.peer.heal();
        proxies.client.heal();
    }

    fn proxies(&self, index: usize) -> &Proxies {
        self.members[index]
            .proxies
            .as_ref()
            .expect("the members are behind proxies: start with EtcdCluster::start_behind_proxies")
    }

    /// How many members the cluster has (3).
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Always false: a cluster has members.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The process id of member `index`, while it runs.
    pub fn pid(&self, index: usize) -> Option<u32> {
        self.members[index].process.pid()
    }

    /// Whether member `index` runs (a paused member runs).
    pub fn is_running(&self, index: usize) -> bool {
        self.members[index].process.is_running()
    }

    /// The index of the member that leads now, as the members that answer say.
    ///
    /// # Errors
    /// When no member that answers names a leader among the members.
    pub fn leader(&self) -> io::Result<usize> {
        let mut seen = Vec::new();
        for index in 0..self.members.len() {
            match self.status(index) {
                Ok((member, leader)) if member == leader && leader != 0 => return Ok(index),
                Ok(status) => seen.push(format!("{}: {status:?}", self.members[index].name)),
                Err(e) => seen.push(format!("{}: {e}", self.members[index].name)),
            }
        }
        Err(io::Error::other(format!(
            "no member says it leads: {}",
            seen.join("; ")
        )))
    }

    /// Waits until some member leads, and returns its index.
    ///
    /// # Errors
    /// When none does within `timeout`.
    pub fn wait_for_leader(&self, timeout: Duration) -> io::Result<usize> {
        poll_until(
            timeout,
            Duration::from_millis(50),
            || {
                Ok(match self.leader() {
                    Ok(index) => ControlFlow::Break(index),
                    Err(e) => ControlFlow::Continue(e.to_string()),
                })
            },
            |seen| format!("the etcd cluster elected no leader within {timeout:?}: {seen}"),
        )
    }

    /// Kills member `index` (SIGKILL) and reaps it; its data directory stays for
    /// [`EtcdCluster::restart`]. Nothing happens if it is not running.
    pub fn kill(&self, index: usize) {
        self.members[index].process.kill();
    }

    /// Suspends member `index` (SIGSTOP): its connections stay open and nothing is answered.
    ///
    /// # Errors
    /// When it is not running or the signal cannot be sent.
    pub fn pause(&self, index: usize) -> io::Result<()> {
        crate::process::pause(self.members[index].process.running_pid()?).map_err(io::Error::from)
    }

    /// Resumes a paused member (SIGCONT).
    ///
    /// # Errors
    /// As [`EtcdCluster::pause`].
    pub fn resume(&self, index: usize) -> io::Result<()> {
        crate::process::resume(self.members[index].process.running_pid()?).map_err(io::Error::from)
    }

    /// Kills member `index` if it runs, then starts it again on the same ports with the same
    /// data directory, and waits until it is healthy.
    ///
    /// # Errors
    /// When it does not come back in time.
    pub fn restart(&self, index: usize) -> io::Result<()> {
        self.kill(index);
        // A lingering socket of the old process can delay the bind briefly.
        retry(STARTUP_TIMEOUT, Duration::from_millis(100), || {
            self.spawn(index)?;
            self.wait_healthy(index, STARTUP_TIMEOUT)
                .inspect_err(|_| self.kill(index))
        })
    }

    /// Starts member `index`'s process, and records its pid for the watchdog.
    fn spawn(&self, index: usize) -> io::Result<()> {
        let member = &self.members[index];
        let peer = format!("http://127.0.0.1:{}", member.peer_port);
        let mut client = format!("http://127.0.0.1:{}", member.process.port());
        if let Some(port) = member.tls_port {
            client.push_str(&format!(",https://127.0.0.1:{port}"));
        }
        let initial: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer_url()))
            .collect();
        let mut command = Command::new(&self.binary);
        command
            .arg("--name")
            .arg(member.name)
            .arg("--data-dir")
            .arg(member.process.dir().join("data"))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &member.client_url()])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &member.peer_url()])
            .args(["--initial-cluster", &initial.join(",")])
            .args(["--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", "baton-test"])
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            // No metrics or debugging listeners beyond the client and peer ports.
            .args(["--enable-pprof=false"]);
        if let Some(tls) = &self.tls {
            command
                .arg("--cert-file")
                .arg(&tls.cert_file)
                .arg("--key-file")
                .arg(&tls.key_file);
            if let Some(ca) = &tls.client_ca_file {
                command
                    .arg("--client-cert-auth")
                    .arg("--trusted-ca-file")
                    .arg(ca);
            }
        }
        member.process.spawn(&mut command)?;
        if let Some(pid) = member.process.pid() {
            std::fs::write(member.process.dir().join("etcd.pid"), pid.to_string())?;
        }
        Ok(())
    }

    /// Waits until member `index` answers `GET /health` with `"health":"true"`.
    fn wait_healthy(&self, index: usize, timeout: Duration) -> io::Result<()> {
        let addr = self.client_addr(index);
        self.members[index]
            .process
            .wait_ready(timeout, "report itself healthy", || {
                match http(addr, "GET", "/health", "") {
                    Ok(body) if body.contains("\"health\":\"true\"") => Ok(()),
                    Ok(body) => Err(body),
                    Err(e) => Err(e.to_string()),
                }
            })
    }

    /// `(member id, leader id)` as member `index` reports them.
    fn status(&self, index: usize) -> io::Result<(u64, u64)> {
        let body = http(
            self.client_addr(index),
            "POST",
            "/v3/maintenance/status",
            "{}",
        )?;
        let status: serde_json::Value = serde_json::from_str(&body)
            .map_err(|e| io::Error::other(format!("status is not JSON ({e}): {body}")))?;
        let id = |value: &serde_json::Value| -> Option<u64> { value.as_str()?.parse().ok() };
        let member = id(&status["header"]["member_id"]);
        let leader = id(&status["leader"]);
        match (member, leader) {
            (Some(member), Some(leader)) => Ok((member, leader)),
            _ => Err(io::Error::other(format!("status without ids: {body}"))),
        }
    }
}

/// One HTTP/1.0 request to `addr` (loopback only); the response's body.
fn http(addr: SocketAddr, method: &str, path: &str, body: &str) -> io::Result<String> {
    assert!(addr.ip().is_loopback(), "tests talk to loopback only");
    let mut stream = TcpStream::connect_timeout(&addr, REQUEST_TIMEOUT)?;
    stream.set_read_timeout(Some(REQUEST_TIMEOUT))?;
    stream.set_write_timeout(Some(REQUEST_TIMEOUT))?;
    write!(
        stream,
        "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    match response.split_once("\r\n\r\n") {
        Some((head, body)) if head.starts_with("HTTP/1.") => Ok(body.to_owned()),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("not an HTTP response: {response:?}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_binary_is_a_loud_error_with_the_install_hint() {
        let err =
            EtcdCluster::start_once(OsStr::new("/nonexistent/etcd"), None, false).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        assert!(
            err.to_string().contains("apt-get install etcd-server"),
            "{err}"
        );
    }

    #[test]
    fn members_elect_a_leader_survive_a_kill_and_a_pause_and_come_back() {
        let cluster = EtcdCluster::start().unwrap();
        assert_eq!(cluster.len(), 3);
        assert!(cluster.url().starts_with("etcd://127.0.0.1:"));
        assert_eq!(cluster.url().matches(',').count(), 2);
        let leader = cluster.leader().unwrap();

        cluster.kill(leader);
        assert!(!cluster.is_running(leader));
        let next = cluster.wait_for_leader(Duration::from_secs(30)).unwrap();
        assert_ne!(next, leader, "a killed member cannot lead");
        cluster.restart(leader).unwrap();
        assert!(cluster.is_running(leader));

        let follower = (next + 1) % 3;
        cluster.pause(follower).unwrap();
        assert!(http(cluster.client_addr(follower), "GET", "/health", "").is_err());
        cluster.resume(follower).unwrap();
        cluster
            .wait_healthy(follower, Duration::from_secs(30))
            .unwrap();
    }

    /// A linearizable put of `k`, sent to member `index` itself (not through a proxy).
    fn put(cluster: &EtcdCluster, index: usize) -> io::Result<String> {
        // `k` and `v` in base64, as the JSON gateway takes them.
        http(
            cluster.client_addr(index),
            "POST",
            "/v3/kv/put",
            r#"{"key":"aw==","value":"dg=="}"#,
        )
    }

    #[test]
    fn a_partitioned_member_neither_leads_nor_commits_until_healed() {
        let cluster = EtcdCluster::start_behind_proxies().unwrap();
        for index in 0..cluster.len() {
            let proxy = cluster.client_proxy(index).unwrap();
            assert_eq!(proxy.upstream(), cluster.client_addr(index));
            assert!(cluster.url().contains(&proxy.addr().to_string()));
        }
        let old = cluster.leader().unwrap();
        put(&cluster, old).expect("a put through the leader");
        // The peers reached each other through the proxies.
        assert!(cluster.peer_proxy(old).unwrap().accepted() > 0);

        cluster.partition(old);
        poll_until(
            Duration::from_secs(30),
            Duration::from_millis(50),
            || {
                let others = (0..3).filter(|&i| i != old);
                Ok(
                    match others.map(|i| cluster.status(i)).find_map(|s| {
                        let (member, leader) = s.ok()?;
                        (member == leader).then_some(member)
                    }) {
                        Some(id) => ControlFlow::Break(id),
                        None => ControlFlow::Continue(()),
                    },
                )
            },
            |()| "the majority elected no leader of its own".to_owned(),
        )
        .unwrap();
        // The cut-off member cannot commit (its messages reach nobody); the majority can.
        assert!(
            put(&cluster, old).is_err(),
            "a partitioned member committed"
        );
        put(&cluster, (old + 1) % 3).expect("a put through the majority");
        let mut through = TcpStream::connect(cluster.client_proxy(old).unwrap().addr()).unwrap();
        through.set_read_timeout(Some(REQUEST_TIMEOUT)).unwrap();
        write!(through, "GET /health HTTP/1.0\r\n\r\n").unwrap();
        assert!(
            through.read(&mut [0; 16]).is_err(),
            "its client proxy answered"
        );

        cluster.heal(old);
        cluster.wait_healthy(old, Duration::from_secs(30)).unwrap();
        retry(Duration::from_secs(30), Duration::from_millis(100), || {
            put(&cluster, old).map(drop)
        })
        .expect("the healed member commits again");
    }

    #[test]
    fn dropping_the_cluster_kills_every_member() {
        let cluster = EtcdCluster::start().unwrap();
        let addrs: Vec<SocketAddr> = (0..3).map(|i| cluster.client_addr(i)).collect();
        drop(cluster);
        for addr in addrs {
            assert!(
                http(addr, "GET", "/health", "").is_err(),
                "{addr} still answers"
            );
        }
    }
}
