//! The store under test: a private server (or an SQLite file), the fault proxy in front of
//! a network server, and the faults that act on them.
//!
//! Workers reach Redis and PostgreSQL only through the [`FaultProxy`]; the parent's own
//! administrative commands (`SCRIPT FLUSH`, `CLIENT KILL`, `pg_terminate_backend`) and the
//! final audit go to the server directly. Store timeouts are short (Redis 500 ms,
//! PostgreSQL 1 s, SQLite's busy timeout 1 s), well below the workload's TTLs, so faults
//! show up as failed calls rather than as stalls.
//!
//! The Sentinel topology has no proxy: the workers follow the primary the sentinels name
//! (`redis+sentinel://`), and its faults act on the servers themselves (a primary killed and
//! a replica promoted, `SCRIPT FLUSH` and `CLIENT KILL` on whichever server is the primary).
//!
//! Nor do the Redis Cluster and etcd topologies: the workers follow the slot map the nodes
//! announce (`redis+cluster://` with every node as a seed) or talk to every member
//! (`etcd://`), and the faults act on the nodes and members themselves (a master killed and
//! its replica taking over, a slot moved between masters; the etcd leader killed, a member
//! paused).

use std::io;
use std::path::PathBuf;
use std::time::Duration;

use baton_testkit::etcd::EtcdCluster;
use baton_testkit::postgres::{PostgresServer, Stop};
use baton_testkit::proxy::FaultProxy;
use baton_testkit::redis::RedisServer;
use baton_testkit::redis_cluster::RedisCluster;
use baton_testkit::sentinel::SentinelTopology;

use crate::plan::StoreKind;

/// The `application_name` of the workers' PostgreSQL connections, for
/// `pg_terminate_backend`.
pub const PG_APPLICATION: &str = "baton-soak";

/// The application names whose backends a `terminate-backends` fault ends: the workers'
/// pools and the stores' `LISTEN` connections.
const PG_TERMINATED: [&str; 2] = [PG_APPLICATION, "baton-listen"];

enum Server {
    Redis(RedisServer),
    Postgres(PostgresServer),
    Sqlite(PathBuf),
    Sentinel(SentinelTopology),
    RedisCluster(RedisCluster),
    Etcd(EtcdCluster),
}

/// How long the sentinels may take to promote the replica, and the old primary to
/// synchronize as a replica of the new one, on a loaded machine.
const FAILOVER_PATIENCE: Duration = Duration::from_secs(60);

/// What a promotion did, for the nemesis's log.
#[derive(Debug, Clone, Copy)]
pub struct Promotion {
    /// The old primary's port.
    pub old: u16,
    /// The promoted replica's port.
    pub new: u16,
    /// When the sentinels named the promoted replica.
    pub promoted: baton_testkit::MonoTime,
}

/// What a killed Redis Cluster master left, for the nemesis's log.
#[derive(Debug, Clone)]
pub struct MasterKill {
    /// The killed master's port.
    pub old: u16,
    /// The port of its replica, which serves the key's slot now.
    pub new: u16,
    /// When a node named the replica as the slot's master.
    pub promoted: baton_testkit::MonoTime,
    /// The history keys (`lock:lock-0`, `sem:sem-0`, ...) of the contended keys whose slots
    /// other masters served at the kill: the loss spared them.
    pub spared: Vec<String>,
}

/// What a reshard did, for the nemesis's log.
#[derive(Debug, Clone, Copy)]
pub struct Reshard {
    /// The slot that moved.
    pub slot: u16,
    /// The master it left.
    pub from: u16,
    /// The master it went to.
    pub to: u16,
    /// How many of its keys went over.
    pub keys: usize,
    /// Whether the key was held when the move began.
    pub held: bool,
}

/// How long a reshard waits for its key to be held before it moves the slot anyway.
const HELD_PATIENCE: Duration = Duration::from_secs(2);

/// The store under test and what stands in front of it.
pub struct Cluster {
    server: Server,
    proxy: Option<FaultProxy>,
}

impl Cluster {
    /// Starts the store: a private `redis-server` or PostgreSQL behind a fault proxy, or
    /// names an SQLite file in `dir`.
    ///
    /// # Errors
    /// When the server binary is missing (the message says how to install it) or the
    /// server does not start.
    pub fn start(store: StoreKind, dir: &std::path::Path) -> io::Result<Cluster> {
        let server = match store {
            StoreKind::Redis => Server::Redis(RedisServer::start()?),
            StoreKind::Postgres => Server::Postgres(PostgresServer::start()?),
            StoreKind::Sqlite => Server::Sqlite(dir.join("baton.db")),
            StoreKind::RedisSentinel => Server::Sentinel(SentinelTopology::start()?),
            StoreKind::RedisCluster => Server::RedisCluster(RedisCluster::start()?),
            StoreKind::Etcd => Server::Etcd(EtcdCluster::start()?),
        };
        let proxy = match &server {
            Server::Redis(s) => Some(FaultProxy::start(s.addr())?),
            Server::Postgres(s) => Some(FaultProxy::start(s.addr())?),
            Server::Sqlite(_) | Server::Sentinel(_) | Server::RedisCluster(_) | Server::Etcd(_) => {
                None
            }
        };
        Ok(Cluster { server, proxy })
    }

    /// One line on what runs where.
    pub fn describe(&self) -> String {
        let via = |p: &Option<FaultProxy>| {
            p.as_ref()
                .map(|p| format!(" via fault proxy {}", p.addr()))
                .unwrap_or_default()
        };
        match &self.server {
            Server::Redis(s) => format!(
                "redis-server (no persistence) on {}{}",
                s.addr(),
                via(&self.proxy)
            ),
            Server::Postgres(s) => format!("postgres on {}{}", s.addr(), via(&self.proxy)),
            Server::Sqlite(path) => format!("sqlite file {}", path.display()),
            Server::Sentinel(t) => format!(
                "redis primary and replica (no persistence) on ports {:?}, sentinels on {:?}",
                t.servers()
                    .iter()
                    .map(RedisServer::port)
                    .collect::<Vec<_>>(),
                t.sentinel_ports()
            ),
            Server::RedisCluster(c) => format!(
                "redis cluster of three masters and three replicas (no persistence) on ports {:?}",
                c.ports()
            ),
            Server::Etcd(e) => format!("etcd cluster of three members at {}", e.url()),
        }
    }

    /// The URL the workers use: through the proxy, with short timeouts.
    pub fn worker_url(&self) -> String {
        let proxy = self.proxy.as_ref().map(|p| p.addr());
        match (&self.server, proxy) {
            (Server::Redis(_), Some(addr)) => {
                format!("redis://{addr}/0?connect_timeout=500ms&response_timeout=500ms")
            }
            (Server::Postgres(_), Some(addr)) => format!(
                "postgres://postgres@{addr}/postgres?application_name={PG_APPLICATION}&connect_timeout=1s&response_timeout=1s"
            ),
            (Server::Sqlite(path), _) => format!("sqlite://{}?busy_timeout=1s", path.display()),
            (Server::Sentinel(t), _) => {
                format!("{}?connect_timeout=500ms&response_timeout=500ms", t.url())
            }
            (Server::RedisCluster(c), _) => {
                format!("{}?connect_timeout=500ms&response_timeout=500ms", c.url())
            }
            (Server::Etcd(e), _) => {
                format!("{}?connect_timeout=500ms&response_timeout=500ms", e.url())
            }
            _ => unreachable!("network stores always have a proxy"),
        }
    }

    /// The URL of the server itself, for the final audit.
    pub fn direct_url(&self) -> String {
        match &self.server {
            Server::Redis(s) => s.url(),
            Server::Postgres(s) => s.url(),
            Server::Sqlite(path) => format!("sqlite://{}", path.display()),
            Server::Sentinel(t) => t.url(),
            Server::RedisCluster(c) => c.url(),
            Server::Etcd(e) => e.url(),
        }
    }

    /// The fault proxy between the workers and the server.
    ///
    /// # Errors
    /// When this store has none (SQLite, Sentinel, Redis Cluster, etcd).
    pub fn proxy(&self) -> io::Result<&FaultProxy> {
        self.proxy
            .as_ref()
            .ok_or_else(|| io::Error::other("this store has no fault proxy"))
    }

    /// Kills the server (Redis: SIGKILL, the data is gone; PostgreSQL: an immediate or a
    /// fast shutdown). Nothing for SQLite.
    ///
    /// # Errors
    /// When PostgreSQL does not stop in time.
    pub fn stop_server(&self, crash: bool) -> io::Result<()> {
        match &self.server {
            Server::Redis(s) => {
                s.kill();
                Ok(())
            }
            Server::Postgres(s) => s.stop(if crash { Stop::Immediate } else { Stop::Fast }),
            Server::Sqlite(_) => Err(io::Error::other("sqlite has no server")),
            Server::Sentinel(_) | Server::RedisCluster(_) | Server::Etcd(_) => Err(
                io::Error::other("this topology's servers are killed by faults of their own"),
            ),
        }
    }

    /// Starts the stopped server again, on the same port, and waits until it answers.
    ///
    /// # Errors
    /// When it does not come back in time.
    pub fn start_server(&self) -> io::Result<()> {
        match &self.server {
            Server::Redis(s) => s.restart(),
            Server::Postgres(s) => s.start_again(),
            Server::Sqlite(_) => Err(io::Error::other("sqlite has no server")),
            Server::Sentinel(_) | Server::RedisCluster(_) | Server::Etcd(_) => Err(
                io::Error::other("this topology's servers are restarted by faults of their own"),
            ),
        }
    }

    /// Whether a server restart loses the store's data (Redis without persistence).
    pub fn restart_loses_data(&self) -> bool {
        matches!(self.server, Server::Redis(_))
    }

    /// Kills the primary (SIGKILL) and waits until the sentinels promoted the replica.
    ///
    /// # Errors
    /// On another store, or when the sentinels name no new primary in time.
    pub fn kill_primary(&self) -> io::Result<Promotion> {
        let Server::Sentinel(t) = &self.server else {
            return Err(io::Error::other("only the sentinel topology has a replica"));
        };
        let old = t.primary_port()?;
        t.kill(old)?;
        let new = t.wait_for_failover(old, FAILOVER_PATIENCE)?;
        Ok(Promotion {
            old,
            new,
            promoted: baton_testkit::MonoTime::now(),
        })
    }

    /// Starts the old primary of `promotion` again (empty: no persistence), makes it a
    /// replica of the new primary and waits until it is synchronized, so that the next
    /// promotion has a replica to promote.
    ///
    /// The sentinels would convert it by themselves, but only once they next ask it for
    /// `INFO` (every ten seconds): `REPLICAOF` does what they would, at once, as an
    /// operator bringing a server back does.
    ///
    /// # Errors
    /// On another store, or when it does not start or synchronize in time.
    pub fn rejoin(&self, promotion: &Promotion) -> io::Result<()> {
        let Server::Sentinel(t) = &self.server else {
            return Err(io::Error::other("only the sentinel topology has a replica"));
        };
        t.restart(promotion.old)?;
        let server = t
            .server(promotion.old)
            .ok_or_else(|| io::Error::other("the old primary is gone"))?;
        server.command_ok(&["REPLICAOF", "127.0.0.1", &promotion.new.to_string()])?;
        server.wait_replicating(FAILOVER_PATIENCE)
    }

    /// The servers the Redis commands of the nemesis go to: the only one, the primary the
    /// sentinels name now, or every running node of the cluster (each master keeps its own
    /// scripts and clients; a replica's own clients and scripts go too, which the workers
    /// never use).
    fn redis_targets(&self) -> io::Result<Vec<&RedisServer>> {
        match &self.server {
            Server::Redis(s) => Ok(vec![s]),
            Server::Sentinel(t) => {
                let port = t.primary_port()?;
                let primary = t
                    .server(port)
                    .ok_or_else(|| io::Error::other(format!("no server on port {port}")))?;
                Ok(vec![primary])
            }
            Server::RedisCluster(c) => Ok(c.nodes().iter().filter(|n| n.is_running()).collect()),
            _ => Err(io::Error::other("not a Redis store")),
        }
    }

    fn redis_cluster(&self) -> io::Result<&RedisCluster> {
        match &self.server {
            Server::RedisCluster(c) => Ok(c),
            _ => Err(io::Error::other(
                "only the redis-cluster topology has masters",
            )),
        }
    }

    fn etcd(&self) -> io::Result<&EtcdCluster> {
        match &self.server {
            Server::Etcd(e) => Ok(e),
            _ => Err(io::Error::other("only the etcd topology has members")),
        }
    }

    /// Kills (SIGKILL) the Redis Cluster master that serves the slot of the contended key
    /// `key` (of [`crate::plan::CLUSTER_TARGETS`]) and waits until a node names another
    /// master for the slot: the killed master's replica, promoted once the others deem the
    /// master failed (`cluster-node-timeout`, [`baton_testkit::redis_cluster::NODE_TIMEOUT`]).
    ///
    /// # Errors
    /// On another store, or when no replica takes over in time.
    pub fn kill_master(&self, key: &str) -> io::Result<MasterKill> {
        let c = self.redis_cluster()?;
        let slot = c.slot_of(&cluster_key(key))?;
        let old = c.master_of_slot(slot)?;
        let mut spared = Vec::new();
        for target in crate::plan::CLUSTER_TARGETS {
            let slot = c.slot_of(&cluster_key(target))?;
            if c.master_of_slot(slot)? != old {
                spared.push(history_key(target));
            }
        }
        c.kill(old)?;
        let mut new = None;
        baton_testkit::process::wait_until(
            "the killed master's replica takes over",
            FAILOVER_PATIENCE,
            || {
                new = c.master_of_slot(slot).ok().filter(|&p| p != old);
                new.is_some()
            },
        )
        .map_err(|e| io::Error::other(e.to_string()))?;
        Ok(MasterKill {
            old,
            new: new.expect("the wait ended with a new master"),
            promoted: baton_testkit::MonoTime::now(),
            spared,
        })
    }

    /// Starts the killed master of `kill` again, with its `nodes.conf` and no data: it learns
    /// that its replica took its slots over and rejoins as that replica's replica. Waits until
    /// the cluster is healthy, every replica synchronized, so that the next kill has a
    /// replica to promote.
    ///
    /// # Errors
    /// On another store, or when it does not rejoin in time.
    pub fn rejoin_master(&self, kill: &MasterKill) -> io::Result<()> {
        let c = self.redis_cluster()?;
        c.restart(kill.old)?;
        c.wait_healthy(FAILOVER_PATIENCE)
    }

    /// Moves the slot of the contended key `key`, live, to the next master (in port order)
    /// after the one that serves it, waiting `pause` after each of its keys went over, and
    /// waits until the cluster agrees on the new owner. It starts once the key is held (its
    /// grant, or a permit, is on its master), or after 2 s if it is not.
    ///
    /// # Errors
    /// On another store, or when a step is refused or the cluster is not healthy in time.
    pub fn reshard(&self, key: &str, pause: Duration) -> io::Result<Reshard> {
        let c = self.redis_cluster()?;
        let slot = c.slot_of(&cluster_key(key))?;
        let from = c.master_of_slot(slot)?;
        let grant = held_key(key);
        let master = c
            .node(from)
            .ok_or_else(|| io::Error::other(format!("no node on port {from}")))?;
        let held = baton_testkit::process::wait_until("the key held", HELD_PATIENCE, || {
            master
                .command_ok(&["EXISTS", &grant])
                .ok()
                .and_then(|r| r.as_integer())
                == Some(1)
        })
        .is_ok();
        let mut ports = c.ports();
        ports.sort_unstable();
        // A master is a node with a replica (every master has one once the cluster is
        // healthy, and a replica has none).
        let masters: Vec<u16> = ports
            .into_iter()
            .filter(|&p| p == from || c.replica_of(p).is_ok())
            .collect();
        let at = masters.iter().position(|&p| p == from).unwrap_or_default();
        let to = masters[(at + 1) % masters.len()];
        if to == from {
            return Err(io::Error::other(format!(
                "no other master to move slot {slot} to: {masters:?}"
            )));
        }
        let keys = c.migrate_slot(slot, to, pause, FAILOVER_PATIENCE)?;
        Ok(Reshard {
            slot,
            from,
            to,
            keys,
            held,
        })
    }

    /// Kills (SIGKILL) the etcd member that leads, waits until the others elect a new
    /// leader, waits `down`, and starts the member again with its data; answers the killed
    /// member and the new leader.
    ///
    /// # Errors
    /// On another store, or when no leader is elected or the member does not come back.
    pub fn kill_leader(&self, down: Duration) -> io::Result<(usize, usize)> {
        let e = self.etcd()?;
        // Waiting, not asking once: on a loaded host the members may be between leaders.
        let leader = e.wait_for_leader(FAILOVER_PATIENCE)?;
        e.kill(leader);
        let next = e.wait_for_leader(FAILOVER_PATIENCE)?;
        std::thread::sleep(down);
        e.restart(leader)?;
        Ok((leader, next))
    }

    /// Suspends (SIGSTOP) the etcd leader, or a follower, for `pause`, resumes it (SIGCONT)
    /// and waits until the cluster has a leader; answers the member paused.
    ///
    /// # Errors
    /// On another store, when a signal cannot be sent, or no leader is elected in time.
    pub fn pause_member(&self, leader: bool, pause: Duration) -> io::Result<usize> {
        let e = self.etcd()?;
        let first = e.wait_for_leader(FAILOVER_PATIENCE)?;
        let member = if leader { first } else { (first + 1) % e.len() };
        e.pause(member)?;
        std::thread::sleep(pause);
        e.resume(member)?;
        e.wait_for_leader(FAILOVER_PATIENCE)?;
        Ok(member)
    }

    /// Ends the proxy's fault and its latency. Nothing without a proxy.
    pub fn heal(&self) {
        if let Some(proxy) = &self.proxy {
            proxy.heal();
            proxy.set_latency(Duration::ZERO);
        }
    }

    /// `SCRIPT FLUSH` (Redis).
    ///
    /// # Errors
    /// On another store, or when the server answers an error.
    pub fn script_flush(&self) -> io::Result<()> {
        for server in self.redis_targets()? {
            server.command_ok(&["SCRIPT", "FLUSH"])?;
        }
        Ok(())
    }

    /// `CLIENT KILL TYPE normal` and `CLIENT KILL TYPE pubsub` (Redis); answers how many
    /// connections were closed.
    ///
    /// # Errors
    /// On another store, or when the server answers an error.
    pub fn client_kill(&self) -> io::Result<u64> {
        let mut killed = 0;
        for s in self.redis_targets()? {
            for kind in ["normal", "pubsub"] {
                let reply = s.command_ok(&["CLIENT", "KILL", "TYPE", kind])?;
                killed += reply.as_integer().unwrap_or_default().max(0) as u64;
            }
        }
        Ok(killed)
    }

    /// `pg_terminate_backend` of every worker connection (PostgreSQL); answers how many.
    ///
    /// # Errors
    /// On another store, or when `psql` fails.
    pub fn terminate_backends(&self) -> io::Result<u64> {
        match &self.server {
            Server::Postgres(s) => {
                let mut ended = 0;
                for application in PG_TERMINATED {
                    ended += s.terminate_backends(application)?;
                }
                Ok(ended)
            }
            _ => Err(io::Error::other(
                "pg_terminate_backend is a PostgreSQL function",
            )),
        }
    }
}

/// The history key of the contended key `key`, as the checkers name it: `lock:lock-0`,
/// `lease:lease-0`, `sem:sem-0`.
fn history_key(key: &str) -> String {
    format!("{}:{key}", family(key).1)
}

/// The kind of the contended key `key` (`lock-*`, `lease-*`, or the semaphore), and its
/// family as the checkers name it.
fn family(key: &str) -> (baton::store::KeyKind, &'static str) {
    use baton::store::KeyKind;
    if key.starts_with("lock-") {
        (KeyKind::Lock, "lock")
    } else if key.starts_with("lease-") {
        (KeyKind::Lease, "lease")
    } else {
        (KeyKind::Semaphore, crate::check::locks::SEMAPHORE)
    }
}

/// The Redis key that exists while the contended key `key` is held: a lock's or lease's
/// grant `{Q}`, a semaphore's permits `{Q}:permits` (see the key layout in `baton-redis`).
fn held_key(key: &str) -> String {
    let grant = cluster_key(key);
    if key == crate::workload::SEM_KEY {
        format!("{grant}:permits")
    } else {
        grant
    }
}

/// The Redis key of the grant of the contended key `key` (`lock-*`, `lease-*`, or the
/// semaphore): `{Q}`, with `Q` the key qualified in the default namespace, as the store
/// writes it (its grant, fence counter and queue share that hash tag, so one slot).
fn cluster_key(key: &str) -> String {
    let kind = family(key).0;
    let key = baton::Key::new(key).expect("a contended key is a valid key");
    format!(
        "{{{}}}",
        baton::Namespace::default().qualify(kind, &key).as_str()
    )
}
