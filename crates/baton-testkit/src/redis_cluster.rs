//! A private Redis Cluster for tests: three masters and three replicas of `redis-server` in
//! cluster mode, all on loopback ports of their own.
//!
//! [`RedisCluster::start`] starts six [`RedisServer`]s with `--cluster-enabled yes`, each in
//! its own temporary directory with its own `cluster-config-file` and cluster bus port
//! (`--cluster-port`, a free port, so the bus never needs `port + 10000`), joins them with
//! `redis-cli --cluster create ... --cluster-replicas 1 --cluster-yes`, and returns once every
//! node answers `CLUSTER INFO` with `cluster_state:ok` and all 16384 slots served, and every
//! replica is in sync with its master (so a failover can start at once).
//! [`RedisCluster::shared`] starts one cluster per test binary, for tests that only read and
//! write; tests that kill or fail over nodes start a cluster of their own.
//!
//! A missing `redis-server` or `redis-cli` binary is an error that names the fix (`apt-get
//! install redis-server`, which installs both), never a reason to skip.
//!
//! ```no_run
//! use std::time::Duration;
//! use baton_testkit::redis_cluster::RedisCluster;
//!
//! let cluster = RedisCluster::start().unwrap();
//! let url = cluster.url(); // redis+cluster://127.0.0.1:p1,127.0.0.1:p2,...
//! let master = cluster.master_for("{app:lock:job}").unwrap();
//! let replica = cluster.replica_of(master).unwrap();
//! cluster.failover(replica, Duration::from_secs(30)).unwrap(); // CLUSTER FAILOVER
//! assert_eq!(cluster.master_for("{app:lock:job}").unwrap(), replica);
//! # let _ = url;
//! ```
//!
//! ## Behavior
//! - Dropping a [`RedisCluster`] kills every node (SIGKILL) and removes their directories; the
//!   [shared](RedisCluster::shared) cluster is killed by a watchdog when the test process
//!   exits.
//! - The nodes keep the testkit's defaults (no persistence), with `cluster-node-timeout`
//!   [`NODE_TIMEOUT`]: a killed master's replica is promoted a second or two later.
//! - A killed node's port stays bound by a listener that never answers until
//!   [`RedisCluster::restart`], so no other test's server takes it while the cluster still
//!   lists it.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::io;
use std::net::{Ipv4Addr, TcpListener};
use std::ops::ControlFlow;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::redis::{RedisOptions, RedisServer, Resp};
use crate::server::{Watchdog, free_port, poll_until, retry};

/// The environment variable that names the `redis-cli` binary, when it is not `redis-cli`
/// on `PATH`.
pub const REDIS_CLI_ENV: &str = "BATON_REDIS_CLI";

/// The one-line fix for a machine without `redis-cli`.
pub const INSTALL_HINT: &str = "install it with `apt-get install redis-server` (Debian/Ubuntu; it brings redis-cli), or name the binary in BATON_REDIS_CLI";

/// How many masters the cluster has; each has one replica.
pub const MASTERS: usize = 3;

/// The nodes' `cluster-node-timeout`: how long a master may be silent before the others
/// consider it failed and its replica takes over.
pub const NODE_TIMEOUT: Duration = Duration::from_millis(1000);

/// The number of hash slots of a Redis Cluster.
pub const SLOTS: u16 = 16384;

/// How long the cluster may take to start and agree on its topology.
const STARTUP: Duration = Duration::from_secs(60);

/// How many times a node is started with a fresh bus port before its error is final.
const BUS_PORT_ATTEMPTS: u32 = 5;

/// Three masters with one replica each. See the [module docs](self).
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    /// Each node's TLS port, in the order of `nodes`, for a cluster started with
    /// [`RedisCluster::start_tls`]; empty otherwise.
    tls_ports: Vec<u16>,
    /// Listeners holding the ports of killed nodes (see [`RedisCluster::kill`]).
    reserved: Mutex<Vec<TcpListener>>,
    /// Kills the shared cluster's nodes when the test process exits.
    watchdog: Option<Watchdog>,
}

impl fmt::Debug for RedisCluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisCluster")
            .field("ports", &self.ports())
            .field("watchdog", &self.watchdog.is_some())
            .finish()
    }
}

/// One line of `CLUSTER NODES`: a node as the cluster sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct NodeLine {
    id: String,
    port: u16,
    master: bool,
    /// Marked failing (`fail` or `fail?`).
    failing: bool,
    /// The master's id, for a replica.
    master_id: Option<String>,
    /// The slot ranges it serves, inclusive.
    slots: Vec<(u16, u16)>,
}

impl RedisCluster {
    /// Starts six nodes and joins them into a cluster of three masters, each with one
    /// replica, and waits until it serves every slot and every replica is in sync.
    ///
    /// # Errors
    /// When `redis-server` or `redis-cli` is missing (the message says how to install it), a
    /// node does not start, `redis-cli --cluster create` fails, or the cluster is not
    /// healthy in time (the messages quote what was seen).
    pub fn start() -> io::Result<RedisCluster> {
        RedisCluster::start_nodes(None)
    }

    /// [`RedisCluster::start`], each node also taking TLS clients on a port of its own with
    /// the certificate and key in `certificates` (`server.crt`, `server.key`, signed by
    /// `ca.crt`, as [`crate::tls::certificates`] makes them), and the cluster bus on TLS
    /// and replication (`tls-cluster yes`, `tls-replication yes`), so that the nodes tell a
    /// TLS client the TLS ports of the others and a plain client, such as the testkit's own,
    /// the plain ones. Clients need no
    /// certificate of their own. [`RedisCluster::tls_url`] names the TLS ports.
    ///
    /// # Errors
    /// As [`RedisCluster::start`].
    pub fn start_tls(certificates: &Path) -> io::Result<RedisCluster> {
        RedisCluster::start_nodes(Some(certificates))
    }

    fn start_nodes(certificates: Option<&Path>) -> io::Result<RedisCluster> {
        let mut nodes = Vec::with_capacity(2 * MASTERS);
        let mut tls_ports = Vec::new();
        for _ in 0..2 * MASTERS {
            let tls = match certificates {
                Some(dir) => {
                    let port = free_port()?;
                    tls_ports.push(port);
                    tls_args(dir, port)
                }
                None => Vec::new(),
            };
            nodes.push(start_node(&tls)?);
        }
        let cluster = RedisCluster {
            nodes,
            tls_ports,
            reserved: Mutex::new(Vec::new()),
            watchdog: None,
        };
        cluster.create()?;
        cluster.wait_healthy(STARTUP)?;
        Ok(cluster)
    }

    /// One cluster for the whole test binary, started on first use and killed by a watchdog
    /// when the test process exits. Tests on it must not kill, pause or fail over its nodes
    /// (start a cluster of their own for that), and should use keys of their own.
    ///
    /// # Panics
    /// When it cannot be started: every test that needs it must fail, loudly.
    pub fn shared() -> &'static RedisCluster {
        static SHARED: OnceLock<RedisCluster> = OnceLock::new();
        SHARED.get_or_init(|| {
            let mut cluster =
                RedisCluster::start().unwrap_or_else(|e| panic!("a private Redis Cluster: {e}"));
            cluster.watchdog = Some(
                cluster
                    .spawn_watchdog()
                    .unwrap_or_else(|e| panic!("the Redis Cluster's watchdog: {e}")),
            );
            cluster
        })
    }

    /// `redis+cluster://127.0.0.1:<p1>,127.0.0.1:<p2>,...`: every node as a seed.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .ports()
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!("redis+cluster://{}", hosts.join(","))
    }

    /// `rediss+cluster://127.0.0.1:<t1>,...`: every node's TLS port as a seed, for a cluster
    /// started with [`RedisCluster::start_tls`]; `None` for a plain one.
    pub fn tls_url(&self) -> Option<String> {
        if self.tls_ports.is_empty() {
            return None;
        }
        let hosts: Vec<String> = self
            .tls_ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        Some(format!("rediss+cluster://{}", hosts.join(",")))
    }

    /// Every node, masters and replicas (roles change with failovers).
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The ports of the nodes.
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(RedisServer::port).collect()
    }

    /// The node listening on `port`.
    pub fn node(&self, port: u16) -> Option<&RedisServer> {
        self.nodes.iter().find(|n| n.port() == port)
    }

    /// The hash slot of `key` (`CLUSTER KEYSLOT`, so the server's own hash-tag rule).
    ///
    /// # Errors
    /// When no running node answers.
    pub fn slot_of(&self, key: &str) -> io::Result<u16> {
        let reply = self.ask_any(&["CLUSTER", "KEYSLOT", key])?;
        reply
            .as_integer()
            .and_then(|n| u16::try_from(n).ok())
            .ok_or_else(|| io::Error::other(format!("CLUSTER KEYSLOT answered {reply:?}")))
    }

    /// The port of the master that serves `key`'s slot, as a running node sees it.
    ///
    /// # Errors
    /// When no running node answers, or none names a master for the slot.
    pub fn master_for(&self, key: &str) -> io::Result<u16> {
        let slot = self.slot_of(key)?;
        self.master_of_slot(slot)
    }

    /// The port of the master that serves `slot`, as a running node sees it.
    ///
    /// # Errors
    /// As [`RedisCluster::master_for`].
    pub fn master_of_slot(&self, slot: u16) -> io::Result<u16> {
        let nodes = self.cluster_nodes()?;
        nodes
            .iter()
            .find(|n| {
                n.master && !n.failing && n.slots.iter().any(|&(a, b)| a <= slot && slot <= b)
            })
            .map(|n| n.port)
            .ok_or_else(|| io::Error::other(format!("no master serves slot {slot}: {nodes:?}")))
    }

    /// The port of a replica of the master on `master`.
    ///
    /// # Errors
    /// When no running node answers, or the master has no replica.
    pub fn replica_of(&self, master: u16) -> io::Result<u16> {
        let nodes = self.cluster_nodes()?;
        let id = nodes
            .iter()
            .find(|n| n.port == master)
            .map(|n| n.id.clone())
            .ok_or_else(|| io::Error::other(format!("no node on port {master}: {nodes:?}")))?;
        nodes
            .iter()
            .find(|n| !n.master && !n.failing && n.master_id.as_deref() == Some(id.as_str()))
            .map(|n| n.port)
            .ok_or_else(|| io::Error::other(format!("port {master} has no replica: {nodes:?}")))
    }

    /// Kills the node on `port` (SIGKILL) and keeps its port bound by a listener that
    /// accepts and never answers, until [`RedisCluster::restart`]. A killed master's replica
    /// is promoted about [`NODE_TIMEOUT`] later; [`RedisCluster::wait_healthy`] waits for it.
    ///
    /// # Errors
    /// When no node of the cluster listens on `port`.
    pub fn kill(&self, port: u16) -> io::Result<()> {
        let node = self
            .node(port)
            .ok_or_else(|| io::Error::other(format!("no node on port {port}")))?;
        node.kill();
        let listener = retry(Duration::from_secs(5), Duration::from_millis(10), || {
            TcpListener::bind((Ipv4Addr::LOCALHOST, port))
        })?;
        self.reserved
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(listener);
        Ok(())
    }

    /// Frees the port that [`RedisCluster::kill`] held and starts the node on it again, with
    /// its directory and `nodes.conf`: it rejoins the cluster as the node it was (a replica of
    /// its successor, when it was a master that lost its slots meanwhile), with no data.
    ///
    /// # Errors
    /// As [`RedisServer::restart`].
    pub fn restart(&self, port: u16) -> io::Result<()> {
        let node = self
            .node(port)
            .ok_or_else(|| io::Error::other(format!("no node on port {port}")))?;
        self.reserved
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|l| l.local_addr().map(|a| a.port()).ok() != Some(port));
        node.restart()
    }

    /// Has the replica on `replica` take over from its master (`CLUSTER FAILOVER`, the
    /// coordinated kind: the master stops taking writes, the replica catches up, then takes
    /// the slots), and waits until it is a master and the cluster is healthy again.
    ///
    /// # Errors
    /// When no node listens on `replica`, it refuses the command (it is not a replica), or
    /// the failover does not finish within `timeout`.
    pub fn failover(&self, replica: u16, timeout: Duration) -> io::Result<()> {
        let node = self
            .node(replica)
            .ok_or_else(|| io::Error::other(format!("no node on port {replica}")))?;
        node.command_ok(&["CLUSTER", "FAILOVER"])?;
        let deadline = Instant::now() + timeout;
        poll_until(
            timeout,
            Duration::from_millis(20),
            || {
                let nodes = self.cluster_nodes_of(node)?;
                Ok(match nodes.iter().find(|n| n.port == replica && n.master) {
                    Some(_) => ControlFlow::Break(()),
                    None => ControlFlow::Continue(nodes),
                })
            },
            |nodes| format!("port {replica} is not a master after CLUSTER FAILOVER: {nodes:?}"),
        )?;
        self.wait_healthy(deadline.saturating_duration_since(Instant::now()))
    }

    /// Moves `slot` to the master on `to`, live, as `redis-cli --cluster reshard` moves each
    /// slot: the target imports it, the source marks it migrating, its keys go over with
    /// `MIGRATE` one at a time (meanwhile a command on a key already moved is answered
    /// `ASK`, one on keys split between the two `TRYAGAIN`), and then every master is told
    /// the target owns it. Returns once the cluster is healthy again. `pause` is waited
    /// after each key, so that clients meet the slot half moved. Answers how many keys
    /// went over.
    ///
    /// # Errors
    /// When `to` is not a master, a node refuses a step (the message quotes it), or the
    /// cluster is not healthy within `timeout` afterwards.
    pub fn migrate_slot(
        &self,
        slot: u16,
        to: u16,
        pause: Duration,
        timeout: Duration,
    ) -> io::Result<usize> {
        let nodes = self.cluster_nodes()?;
        let from = self.master_of_slot(slot)?;
        if from == to {
            return Ok(0);
        }
        let id = |port: u16| {
            nodes
                .iter()
                .find(|n| n.port == port && n.master)
                .map(|n| n.id.clone())
                .ok_or_else(|| io::Error::other(format!("no master on port {port}: {nodes:?}")))
        };
        let (from_id, to_id) = (id(from)?, id(to)?);
        let node = |port: u16| {
            self.node(port)
                .ok_or_else(|| io::Error::other(format!("no node on port {port}")))
        };
        let (source, target) = (node(from)?, node(to)?);
        let slot_text = slot.to_string();
        target.command_ok(&["CLUSTER", "SETSLOT", &slot_text, "IMPORTING", &from_id])?;
        source.command_ok(&["CLUSTER", "SETSLOT", &slot_text, "MIGRATING", &to_id])?;
        let mut moved = 0;
        loop {
            let keys = source
                .command_ok(&["CLUSTER", "GETKEYSINSLOT", &slot_text, "1"])?
                .as_texts()
                .unwrap_or_default();
            if keys.is_empty() {
                break;
            }
            let to_port = to.to_string();
            let mut migrate = vec!["MIGRATE", "127.0.0.1", &to_port, "", "0", "5000", "KEYS"];
            migrate.extend(keys.iter().map(String::as_str));
            source.command_ok(&migrate)?;
            moved += keys.len();
            std::thread::sleep(pause);
        }
        // The target first, then the source, then everyone else (as redis-cli does).
        target.command_ok(&["CLUSTER", "SETSLOT", &slot_text, "NODE", &to_id])?;
        source.command_ok(&["CLUSTER", "SETSLOT", &slot_text, "NODE", &to_id])?;
        for other in nodes
            .iter()
            .filter(|n| n.master && n.port != from && n.port != to)
        {
            if let Some(server) = self.node(other.port).filter(|s| s.is_running()) {
                server.command_ok(&["CLUSTER", "SETSLOT", &slot_text, "NODE", &to_id])?;
            }
        }
        self.wait_healthy(timeout)?;
        Ok(moved)
    }

    /// Waits until every running node says `cluster_state:ok` with all slots served, agrees
    /// on which master serves each slot, and every replica's link to its master is up.
    ///
    /// # Errors
    /// When that does not happen within `timeout` (the message quotes what was seen).
    pub fn wait_healthy(&self, timeout: Duration) -> io::Result<()> {
        poll_until(
            timeout,
            Duration::from_millis(50),
            || Ok(self.health()),
            |seen| {
                format!(
                    "the Redis Cluster {:?} is not healthy after {timeout:?}: {seen}",
                    self.ports()
                )
            },
        )
    }

    /// `Break` when healthy, else what is missing.
    fn health(&self) -> ControlFlow<(), String> {
        let mut owners: Option<Vec<(u16, u16, u16)>> = None;
        for node in self.nodes.iter().filter(|n| n.is_running()) {
            let info = match node.command_ok(&["CLUSTER", "INFO"]).map(|r| r.as_text()) {
                Ok(Some(info)) => info,
                other => return ControlFlow::Continue(format!("{}: {other:?}", node.port())),
            };
            let field = |name: &str| {
                info.lines()
                    .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                    .map(|v| v.trim().to_owned())
            };
            if field("cluster_state").as_deref() != Some("ok")
                || field("cluster_slots_ok") != Some(SLOTS.to_string())
            {
                return ControlFlow::Continue(format!("{}: {info}", node.port()));
            }
            let nodes = match self.cluster_nodes_of(node) {
                Ok(nodes) => nodes,
                Err(e) => return ControlFlow::Continue(format!("{}: {e}", node.port())),
            };
            let mut mine: Vec<(u16, u16, u16)> = nodes
                .iter()
                .filter(|n| n.master && !n.failing)
                .flat_map(|n| n.slots.iter().map(|&(a, b)| (a, b, n.port)))
                .collect();
            mine.sort_unstable();
            match &owners {
                None => owners = Some(mine),
                Some(first) if *first != mine => {
                    return ControlFlow::Continue(format!(
                        "nodes disagree on slot owners: {first:?} vs {mine:?} (node {})",
                        node.port()
                    ));
                }
                Some(_) => {}
            }
            // A running node that another node still takes for failed, or a master without
            // slots (a restarted master that has not yet heard that its replica took over),
            // is not part of the cluster yet.
            let running = |port: u16| self.node(port).is_some_and(RedisServer::is_running);
            if let Some(n) = nodes
                .iter()
                .find(|n| running(n.port) && (n.failing || (n.master && n.slots.is_empty())))
            {
                return ControlFlow::Continue(format!("node {} sees {n:?}", node.port()));
            }
            let replica = nodes.iter().any(|n| n.port == node.port() && !n.master);
            if replica {
                match node.info("replication") {
                    Ok(info) if info.lines().any(|l| l.trim() == "master_link_status:up") => {}
                    other => {
                        return ControlFlow::Continue(format!(
                            "replica {} is not in sync: {other:?}",
                            node.port()
                        ));
                    }
                }
            }
        }
        ControlFlow::Break(())
    }

    /// Joins the nodes: `redis-cli --cluster create ... --cluster-replicas 1 --cluster-yes`.
    fn create(&self) -> io::Result<()> {
        let binary = std::env::var_os(REDIS_CLI_ENV)
            .filter(|b| !b.is_empty())
            .unwrap_or_else(|| OsString::from("redis-cli"));
        let mut command = Command::new(&binary);
        command.arg("--cluster").arg("create");
        for port in self.ports() {
            command.arg(format!("127.0.0.1:{port}"));
        }
        command
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null());
        let output = command
            .output()
            .map_err(|e| crate::server::spawn_error(e, &binary, INSTALL_HINT))?;
        if !output.status.success() {
            return Err(io::Error::other(format!(
                "redis-cli --cluster create failed ({}): {}{}",
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            )));
        }
        Ok(())
    }

    /// `CLUSTER NODES` of the first running node that answers.
    fn cluster_nodes(&self) -> io::Result<Vec<NodeLine>> {
        let mut last = None;
        for node in self.nodes.iter().filter(|n| n.is_running()) {
            match self.cluster_nodes_of(node) {
                Ok(nodes) => return Ok(nodes),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("no node of the cluster runs")))
    }

    /// `CLUSTER NODES` as `node` sees the cluster.
    fn cluster_nodes_of(&self, node: &RedisServer) -> io::Result<Vec<NodeLine>> {
        let reply = node.command_ok(&["CLUSTER", "NODES"])?;
        let text = reply
            .as_text()
            .ok_or_else(|| io::Error::other(format!("CLUSTER NODES answered {reply:?}")))?;
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(parse_node_line)
            .collect()
    }

    /// The reply of the first running node that answers `args`.
    fn ask_any(&self, args: &[&str]) -> io::Result<Resp> {
        let mut last = None;
        for node in self.nodes.iter().filter(|n| n.is_running()) {
            match node.command_ok(args) {
                Ok(reply) => return Ok(reply),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("no node of the cluster runs")))
    }

    /// Kills the nodes and removes their directories when this process exits without
    /// dropping the cluster.
    fn spawn_watchdog(&self) -> io::Result<Watchdog> {
        let mut args: Vec<OsString> = Vec::new();
        for node in &self.nodes {
            if let Some(pid) = node.pid() {
                args.push(OsString::from(pid.to_string()));
            }
        }
        let pids = args.len();
        args.extend(self.nodes.iter().map(|n| n.dir().as_os_str().to_owned()));
        let refs: Vec<&OsStr> = args.iter().map(OsString::as_os_str).collect();
        Watchdog::spawn(
            "baton-redis-cluster-watchdog",
            &format!(
                r#"shift
i=0
for arg in "$@"; do
  if [ "$i" -lt {pids} ]; then kill -KILL "$arg" 2>/dev/null; else rm -rf "$arg"; fi
  i=$((i+1))
done"#
            ),
            &refs,
        )
    }
}

/// Starts one cluster node on a free port with a free cluster bus port.
/// The arguments that give a node a TLS port and put the cluster bus on TLS.
fn tls_args(certificates: &Path, port: u16) -> Vec<OsString> {
    let file = |name: &str| certificates.join(name).into_os_string();
    vec![
        "--tls-port".into(),
        port.to_string().into(),
        "--tls-cert-file".into(),
        file("server.crt"),
        "--tls-key-file".into(),
        file("server.key"),
        "--tls-ca-cert-file".into(),
        file("ca.crt"),
        "--tls-auth-clients".into(),
        "no".into(),
        "--tls-cluster".into(),
        "yes".into(),
        // A replica learns its master's TLS port from the cluster, so it replicates on TLS.
        "--tls-replication".into(),
        "yes".into(),
    ]
}

/// Starts one node in cluster mode, with `extra` arguments (TLS).
fn start_node(extra: &[OsString]) -> io::Result<RedisServer> {
    let mut attempt = 1;
    loop {
        let bus = free_port()?.to_string();
        let options = RedisOptions::new().args([
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            &NODE_TIMEOUT.as_millis().to_string(),
            "--cluster-port",
            &bus,
            "--cluster-announce-ip",
            "127.0.0.1",
            // A replica stays with its master, so the topology is the one the tests set up.
            "--cluster-allow-replica-migration",
            "no",
            // A replica synchronizes at once, not after the default wait for more replicas.
            "--repl-diskless-sync-delay",
            "0",
        ]);
        match RedisServer::start_with(options.args(extra)) {
            Ok(node) => return Ok(node),
            Err(e) if e.kind() == io::ErrorKind::NotFound || attempt == BUS_PORT_ATTEMPTS => {
                return Err(e);
            }
            Err(_) => attempt += 1,
        }
    }
}

/// One line of `CLUSTER NODES`:
/// `<id> <ip:port@bus[,hostname]> <flags> <master|-> <ping> <pong> <epoch> <link> <slot>...`.
fn parse_node_line(line: &str) -> io::Result<NodeLine> {
    let bad = || {
        io::Error::other(format!(
            "a CLUSTER NODES line that does not parse: {line:?}"
        ))
    };
    let fields: Vec<&str> = line.split_whitespace().collect();
    if fields.len() < 8 {
        return Err(bad());
    }
    let address = fields[1].split(['@', ',']).next().ok_or_else(bad)?;
    let port = address
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .ok_or_else(bad)?;
    let flags: Vec<&str> = fields[2].split(',').collect();
    let mut slots = Vec::new();
    for range in &fields[8..] {
        // `[slot->-node]` and `[slot-<-node]`: a slot being migrated or imported.
        if range.starts_with('[') {
            continue;
        }
        let (a, b) = range.split_once('-').unwrap_or((range, range));
        slots.push((a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?));
    }
    Ok(NodeLine {
        id: fields[0].to_owned(),
        port,
        master: flags.contains(&"master"),
        failing: flags.iter().any(|f| f.starts_with("fail")),
        master_id: (fields[3] != "-").then(|| fields[3].to_owned()),
        slots,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_lines_are_parsed() {
        let master = parse_node_line(
            "07c3 127.0.0.1:30004@31004,host myself,master - 0 1426238317239 4 connected 0-5460 5462 [5463->-e7d1]",
        )
        .unwrap();
        assert_eq!(master.port, 30004);
        assert!(master.master && !master.failing);
        assert_eq!(master.master_id, None);
        assert_eq!(master.slots, [(0, 5460), (5462, 5462)]);
        let replica = parse_node_line(
            "e7d1 127.0.0.1:30002@31002 slave,fail? 07c3 0 1426238316232 2 connected",
        )
        .unwrap();
        assert!(!replica.master && replica.failing);
        assert_eq!(replica.master_id.as_deref(), Some("07c3"));
        assert!(replica.slots.is_empty());
        assert!(parse_node_line("garbage").is_err());
    }

    #[test]
    fn a_cluster_serves_every_slot_and_fails_over() {
        let cluster = RedisCluster::start().unwrap();
        let url = cluster.url();
        assert!(url.starts_with("redis+cluster://127.0.0.1:"), "{url}");
        assert_eq!(url.matches(',').count(), 2 * MASTERS - 1, "{url}");
        assert!(!cluster.ports().contains(&6379), "the machine's own Redis");
        // Three different masters serve the three thirds of the slots.
        let masters: std::collections::BTreeSet<u16> = [0, SLOTS / 2, SLOTS - 1]
            .into_iter()
            .map(|s| cluster.master_of_slot(s).unwrap())
            .collect();
        assert_eq!(masters.len(), MASTERS, "{masters:?}");
        // A write to a key's master is read back there.
        let key = "{baton:lock:testkit}";
        let master = cluster.master_for(key).unwrap();
        let node = cluster.node(master).unwrap();
        node.command_ok(&["SET", key, "v"]).unwrap();
        // A coordinated failover moves the slot to the replica, with the data.
        let replica = cluster.replica_of(master).unwrap();
        assert_ne!(replica, master);
        cluster.failover(replica, Duration::from_secs(30)).unwrap();
        assert_eq!(cluster.master_for(key).unwrap(), replica);
        assert_eq!(
            cluster
                .node(replica)
                .unwrap()
                .command(&["GET", key])
                .unwrap()
                .as_text()
                .as_deref(),
            Some("v")
        );
        // A killed master's replica (the old master) takes over.
        cluster.kill(replica).unwrap();
        poll_until(
            Duration::from_secs(30),
            Duration::from_millis(50),
            || {
                Ok(match cluster.master_for(key) {
                    Ok(port) if port == master => ControlFlow::Break(()),
                    seen => ControlFlow::Continue(seen),
                })
            },
            |seen| format!("the old master did not take over: {seen:?}"),
        )
        .unwrap();
        cluster.restart(replica).unwrap();
        cluster.wait_healthy(Duration::from_secs(30)).unwrap();
        assert_eq!(cluster.replica_of(master).unwrap(), replica);
    }
}
