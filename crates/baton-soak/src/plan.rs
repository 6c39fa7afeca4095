//! The fault schedule: which fault, when, for how long, derived from the seed alone.
//!
//! [`Plan::new`] deals the faults a store can suffer from a shuffled deck (every kind once
//! before any kind twice), with gaps and durations drawn from a ChaCha8 generator seeded
//! with the seed. Nothing else goes in — no clock, no process id — so the same store, seed,
//! length and worker count always give the same plan, printed at the start of every run
//! ([`Plan::render`]) and by `soak --plan-only`.
//!
//! The nemesis applies the faults one at a time, in order; a fault that takes longer than
//! planned (a slow server restart) delays the ones after it, never reorders them.

use std::fmt;
use std::time::Duration;

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use crate::workload::{LEASE_KEYS, LOCK_KEYS, SEM_KEY};

/// No fault in the first seconds of a run: every worker is connected and contending first.
pub const WARMUP: Duration = Duration::from_secs(2);

/// No fault in the last seconds of a run: the last fault has healed, so every worker can
/// release what it holds and write its history before the end.
pub const COOLDOWN: Duration = Duration::from_secs(3);

/// The store under test.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, serde::Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    /// A private `redis-server`, without persistence, behind the fault proxy.
    Redis,
    /// A private PostgreSQL server behind the fault proxy.
    Postgres,
    /// An SQLite file shared by the worker processes.
    Sqlite,
    /// A private Redis primary, a replica and three sentinels (no persistence), reached
    /// through a `redis+sentinel://` URL; the primary is killed and the replica promoted.
    #[serde(rename = "redis-sentinel")]
    RedisSentinel,
    /// A private Redis Cluster of three masters and three replicas (no persistence), reached
    /// through a `redis+cluster://` URL; a master is killed and its replica takes over, and
    /// the slot of a contended key is moved, live, to another master.
    #[serde(rename = "redis-cluster")]
    RedisCluster,
    /// A private three-member etcd cluster, reached through an `etcd://` URL; the leader is
    /// killed and restarted, and members are paused. Its data survives every fault.
    Etcd,
}

impl StoreKind {
    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            StoreKind::Redis => "redis",
            StoreKind::Postgres => "postgres",
            StoreKind::Sqlite => "sqlite",
            StoreKind::RedisSentinel => "redis-sentinel",
            StoreKind::RedisCluster => "redis-cluster",
            StoreKind::Etcd => "etcd",
        }
    }

    /// Every store the soak runs, in the order of the documentation.
    pub const ALL: [StoreKind; 6] = [
        StoreKind::Redis,
        StoreKind::Postgres,
        StoreKind::Sqlite,
        StoreKind::RedisSentinel,
        StoreKind::RedisCluster,
        StoreKind::Etcd,
    ];

    /// Whether the store keeps rate limits: etcd answers `Unsupported` (see
    /// `baton_core::Capability`), so its workers run no rate contenders and its runs no
    /// rate checker. Every store keeps idempotency records.
    pub fn keeps_budgets(self) -> bool {
        !matches!(self, StoreKind::Etcd)
    }

    /// The kinds of fault this store is subjected to: the faults of its server, of the
    /// worker and supervisor processes, of the fault proxy in front of the server, and those
    /// only this store knows, in that order (the order the plan's deck is dealt from).
    pub fn fault_kinds(self) -> Vec<FaultKind> {
        use FaultKind::*;
        let server: &[FaultKind] = match self {
            StoreKind::Redis | StoreKind::Postgres => &[ServerRestart],
            StoreKind::Sqlite => &[],
            StoreKind::RedisSentinel => &[PromoteReplica],
            StoreKind::RedisCluster => &[KillMaster, Reshard],
            StoreKind::Etcd => &[KillLeader, PauseLeader, PauseFollower],
        };
        let processes = [PauseWorker, KillWorker, KillSupervisor];
        // No fault proxy for SQLite (no server), Sentinel (the workers follow the primary
        // the sentinels name, so they connect to the servers directly), the Redis Cluster
        // (the workers follow the slot map the nodes announce) and etcd (the workers talk to
        // every member).
        let proxy: &[FaultKind] = match self {
            StoreKind::Redis | StoreKind::Postgres => {
                &[Latency, Blackhole, Reset, DropReplies, KillConnections]
            }
            StoreKind::Sqlite
            | StoreKind::RedisSentinel
            | StoreKind::RedisCluster
            | StoreKind::Etcd => &[],
        };
        let own: &[FaultKind] = match self {
            StoreKind::Redis | StoreKind::RedisSentinel | StoreKind::RedisCluster => {
                &[ScriptFlush, ClientKill]
            }
            StoreKind::Postgres => &[TerminateBackends],
            StoreKind::Sqlite | StoreKind::Etcd => &[],
        };
        [server, &processes, proxy, own].concat()
    }
}

impl fmt::Display for StoreKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A kind of fault, without its parameters.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// The server is killed and started again on the same port. Redis runs without
    /// persistence, so it loses every grant, record and budget: a documented unsafe window.
    /// PostgreSQL is stopped fast or immediately (a crash, then WAL recovery).
    ServerRestart,
    /// A worker process is suspended (SIGSTOP) and later resumed (SIGCONT), sometimes for
    /// longer than the TTLs, so its grants expire under it.
    PauseWorker,
    /// A worker process is killed (SIGKILL) with whatever it holds, and a new one starts in
    /// its place.
    KillWorker,
    /// A `baton run` supervisor is killed (SIGKILL) while its COMMAND runs, and COMMAND's
    /// end is watched for (see [`crate::supervisors`]).
    KillSupervisor,
    /// The proxy delays every chunk of bytes, each way.
    Latency,
    /// The proxy forwards nothing, either way, and delivers the held bytes late.
    Blackhole,
    /// The proxy closes every connection, and every new one, with a TCP RST.
    Reset,
    /// Requests reach the server, replies are swallowed; the connections are reset at the
    /// end.
    DropReplies,
    /// The proxy closes the current connections with a TCP RST, once.
    KillConnections,
    /// `SCRIPT FLUSH`: every loaded Lua script is gone (Redis).
    ScriptFlush,
    /// `CLIENT KILL TYPE normal` and `CLIENT KILL TYPE pubsub` (Redis).
    ClientKill,
    /// `pg_terminate_backend` of every store connection, including the listeners
    /// (PostgreSQL).
    TerminateBackends,
    /// The primary is killed (SIGKILL), the sentinels promote the replica, and the old
    /// primary is started again (empty: no persistence) and rejoins as the new primary's
    /// replica (Redis Sentinel). Grants the replica had not received when the primary died
    /// are lost without `min_replicas`: a documented unsafe window.
    PromoteReplica,
    /// The Redis Cluster master serving a contended key is killed (SIGKILL), its replica
    /// takes over, and the killed node is started again (empty) and rejoins as the new
    /// master's replica. What the replica had not received is lost (replication is
    /// asynchronous and the cluster store offers no `min_replicas`): a documented unsafe
    /// window.
    KillMaster,
    /// The slot of a contended key moves, live, to another Redis Cluster master, one key at
    /// a time (`MIGRATE`), while the key is held and contended. Nothing may be lost.
    Reshard,
    /// The etcd member that leads is killed (SIGKILL), the others elect a new leader, and
    /// the member is started again with its data. Nothing may be lost.
    KillLeader,
    /// The etcd member that leads is suspended (SIGSTOP) and resumed (SIGCONT); past the
    /// election timeout the others elect a new leader, and it steps down when resumed.
    /// Nothing may be lost.
    PauseLeader,
    /// An etcd follower is suspended (SIGSTOP) and resumed (SIGCONT), and catches up.
    /// Nothing may be lost.
    PauseFollower,
}

impl FaultKind {
    /// The name in plans and reports.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::ServerRestart => "server-restart",
            FaultKind::PauseWorker => "pause-worker",
            FaultKind::KillWorker => "kill-worker",
            FaultKind::KillSupervisor => "kill-supervisor",
            FaultKind::Latency => "latency",
            FaultKind::Blackhole => "blackhole",
            FaultKind::Reset => "reset",
            FaultKind::DropReplies => "drop-replies",
            FaultKind::KillConnections => "kill-connections",
            FaultKind::ScriptFlush => "script-flush",
            FaultKind::ClientKill => "client-kill",
            FaultKind::TerminateBackends => "terminate-backends",
            FaultKind::PromoteReplica => "promote-replica",
            FaultKind::KillMaster => "kill-master",
            FaultKind::Reshard => "reshard",
            FaultKind::KillLeader => "kill-leader",
            FaultKind::PauseLeader => "pause-leader",
            FaultKind::PauseFollower => "pause-follower",
        }
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One fault with its parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "fault", rename_all = "kebab-case")]
pub enum Fault {
    /// See [`FaultKind::ServerRestart`]; `crash` picks PostgreSQL's immediate shutdown.
    ServerRestart {
        /// How long the server stays down before it is started again.
        down: Duration,
        /// PostgreSQL: immediate shutdown (a crash) rather than a fast one.
        crash: bool,
    },
    /// See [`FaultKind::PauseWorker`].
    PauseWorker {
        /// The worker slot.
        worker: u32,
        /// How long it stays suspended.
        pause: Duration,
    },
    /// See [`FaultKind::KillWorker`].
    KillWorker {
        /// The worker slot.
        worker: u32,
        /// How long until its replacement starts.
        down: Duration,
    },
    /// See [`FaultKind::KillSupervisor`].
    KillSupervisor {
        /// The supervisor slot.
        supervisor: u32,
    },
    /// See [`FaultKind::Latency`].
    Latency {
        /// The delay each way.
        delay: Duration,
        /// How long it lasts.
        lasts: Duration,
    },
    /// See [`FaultKind::Blackhole`].
    Blackhole {
        /// How long it lasts.
        lasts: Duration,
    },
    /// See [`FaultKind::Reset`].
    Reset {
        /// How long it lasts.
        lasts: Duration,
    },
    /// See [`FaultKind::DropReplies`].
    DropReplies {
        /// How long it lasts.
        lasts: Duration,
    },
    /// See [`FaultKind::KillConnections`].
    KillConnections,
    /// See [`FaultKind::ScriptFlush`].
    ScriptFlush,
    /// See [`FaultKind::ClientKill`].
    ClientKill,
    /// See [`FaultKind::TerminateBackends`].
    TerminateBackends,
    /// See [`FaultKind::PromoteReplica`].
    PromoteReplica {
        /// How long the old primary stays down once the replica was promoted.
        down: Duration,
    },
    /// See [`FaultKind::KillMaster`].
    KillMaster {
        /// The contended key (of [`CLUSTER_TARGETS`]) whose master is killed.
        key: &'static str,
        /// How long the old master stays down once its replica took over.
        down: Duration,
    },
    /// See [`FaultKind::Reshard`].
    Reshard {
        /// The contended key (of [`CLUSTER_TARGETS`]) whose slot moves.
        key: &'static str,
        /// How long the slot stays half moved after each of its keys went over.
        pause: Duration,
    },
    /// See [`FaultKind::KillLeader`].
    KillLeader {
        /// How long the member stays down.
        down: Duration,
    },
    /// See [`FaultKind::PauseLeader`] and [`FaultKind::PauseFollower`].
    PauseMember {
        /// The leader, or a follower.
        leader: bool,
        /// How long it stays suspended.
        pause: Duration,
    },
}

/// The contended keys whose Redis Cluster master is killed or whose slot moves: the lock
/// and lease keys (each a fenced register's key) and the semaphore.
pub const CLUSTER_TARGETS: [&str; 5] = [
    LOCK_KEYS[0],
    LOCK_KEYS[1],
    LEASE_KEYS[0],
    LEASE_KEYS[1],
    SEM_KEY,
];

impl Fault {
    /// The kind.
    pub fn kind(&self) -> FaultKind {
        match self {
            Fault::ServerRestart { .. } => FaultKind::ServerRestart,
            Fault::PauseWorker { .. } => FaultKind::PauseWorker,
            Fault::KillWorker { .. } => FaultKind::KillWorker,
            Fault::KillSupervisor { .. } => FaultKind::KillSupervisor,
            Fault::Latency { .. } => FaultKind::Latency,
            Fault::Blackhole { .. } => FaultKind::Blackhole,
            Fault::Reset { .. } => FaultKind::Reset,
            Fault::DropReplies { .. } => FaultKind::DropReplies,
            Fault::KillConnections => FaultKind::KillConnections,
            Fault::ScriptFlush => FaultKind::ScriptFlush,
            Fault::ClientKill => FaultKind::ClientKill,
            Fault::TerminateBackends => FaultKind::TerminateBackends,
            Fault::PromoteReplica { .. } => FaultKind::PromoteReplica,
            Fault::KillMaster { .. } => FaultKind::KillMaster,
            Fault::Reshard { .. } => FaultKind::Reshard,
            Fault::KillLeader { .. } => FaultKind::KillLeader,
            Fault::PauseMember { leader: true, .. } => FaultKind::PauseLeader,
            Fault::PauseMember { leader: false, .. } => FaultKind::PauseFollower,
        }
    }

    /// How long the fault is planned to last (restarts: the time down plus an allowance
    /// for the start).
    pub fn lasts(&self, store: StoreKind) -> Duration {
        match *self {
            Fault::ServerRestart { down, .. } => {
                down + match store {
                    StoreKind::Postgres => Duration::from_secs(2),
                    _ => Duration::from_millis(200),
                }
            }
            // The sentinels' down-after time and their vote, the old primary's restart and
            // its full synchronization as a replica.
            Fault::PromoteReplica { down } => down + Duration::from_secs(4),
            // The cluster's node timeout (1 s) and the replica's election, the old master's
            // restart and its full synchronization as a replica.
            Fault::KillMaster { down, .. } => down + Duration::from_secs(4),
            // A few keys, each followed by the pause, then the slot's new owner announced.
            Fault::Reshard { pause, .. } => 5 * pause + Duration::from_millis(500),
            // The election (500 ms timeout) and the member's restart.
            Fault::KillLeader { down } => down + Duration::from_secs(2),
            // The member catching up (and, for a leader, the election it caused).
            Fault::PauseMember { pause, .. } => pause + Duration::from_secs(1),
            Fault::PauseWorker { pause, .. } => pause,
            Fault::KillWorker { down, .. } => down,
            // Waiting for the supervisor's COMMAND to run, the kill, COMMAND's end.
            Fault::KillSupervisor { .. } => Duration::from_millis(500),
            Fault::Latency { lasts, .. }
            | Fault::Blackhole { lasts }
            | Fault::Reset { lasts }
            | Fault::DropReplies { lasts } => lasts,
            Fault::KillConnections
            | Fault::ScriptFlush
            | Fault::ClientKill
            | Fault::TerminateBackends => Duration::ZERO,
        }
    }

    fn draw(kind: FaultKind, workers: u32, rng: &mut ChaCha8Rng) -> Fault {
        let ms = |rng: &mut ChaCha8Rng, low: u64, high: u64| {
            Duration::from_millis(rng.random_range(low..=high))
        };
        match kind {
            FaultKind::ServerRestart => Fault::ServerRestart {
                down: ms(rng, 200, 1_500),
                crash: rng.random_bool(0.5),
            },
            FaultKind::PauseWorker => {
                let worker = rng.random_range(0..workers);
                // Half of the pauses outlast every TTL of the workload, so the paused
                // process's grants expire and are taken over while it sleeps.
                let pause = if rng.random_bool(0.5) {
                    ms(rng, 200, 1_000)
                } else {
                    ms(rng, 2_000, 4_000)
                };
                Fault::PauseWorker { worker, pause }
            }
            FaultKind::KillWorker => Fault::KillWorker {
                worker: rng.random_range(0..workers),
                down: ms(rng, 200, 1_000),
            },
            FaultKind::KillSupervisor => Fault::KillSupervisor {
                supervisor: rng.random_range(0..crate::supervisors::SUPERVISORS),
            },
            FaultKind::Latency => Fault::Latency {
                delay: ms(rng, 20, 150),
                lasts: ms(rng, 1_000, 4_000),
            },
            FaultKind::Blackhole => Fault::Blackhole {
                lasts: ms(rng, 300, 2_500),
            },
            FaultKind::Reset => Fault::Reset {
                lasts: ms(rng, 200, 1_500),
            },
            FaultKind::DropReplies => Fault::DropReplies {
                lasts: ms(rng, 300, 2_000),
            },
            FaultKind::KillConnections => Fault::KillConnections,
            FaultKind::ScriptFlush => Fault::ScriptFlush,
            FaultKind::ClientKill => Fault::ClientKill,
            FaultKind::TerminateBackends => Fault::TerminateBackends,
            FaultKind::PromoteReplica => Fault::PromoteReplica {
                down: ms(rng, 200, 1_500),
            },
            FaultKind::KillMaster => Fault::KillMaster {
                key: CLUSTER_TARGETS[rng.random_range(0..CLUSTER_TARGETS.len())],
                down: ms(rng, 200, 1_500),
            },
            FaultKind::Reshard => Fault::Reshard {
                key: CLUSTER_TARGETS[rng.random_range(0..CLUSTER_TARGETS.len())],
                pause: ms(rng, 50, 300),
            },
            FaultKind::KillLeader => Fault::KillLeader {
                down: ms(rng, 200, 1_500),
            },
            // Most pauses outlast the members' election timeout (500 ms): a paused leader
            // is replaced, a paused follower falls behind.
            FaultKind::PauseLeader | FaultKind::PauseFollower => Fault::PauseMember {
                leader: kind == FaultKind::PauseLeader,
                pause: ms(rng, 300, 3_000),
            },
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = |d: &Duration| format!("{:.2}s", d.as_secs_f64());
        match self {
            Fault::ServerRestart { down, crash } => write!(
                f,
                "server-restart (down {}{})",
                s(down),
                if *crash { ", crash" } else { "" }
            ),
            Fault::PauseWorker { worker, pause } => {
                write!(f, "pause-worker w{worker} for {}", s(pause))
            }
            Fault::KillWorker { worker, down } => {
                write!(f, "kill-worker w{worker}, replaced after {}", s(down))
            }
            Fault::KillSupervisor { supervisor } => {
                write!(f, "kill-supervisor s{supervisor} (baton run, SIGKILL)")
            }
            Fault::Latency { delay, lasts } => write!(
                f,
                "latency {}ms each way for {}",
                delay.as_millis(),
                s(lasts)
            ),
            Fault::Blackhole { lasts } => write!(f, "blackhole for {}", s(lasts)),
            Fault::Reset { lasts } => write!(f, "reset for {}", s(lasts)),
            Fault::DropReplies { lasts } => write!(f, "drop-replies for {}", s(lasts)),
            Fault::PromoteReplica { down } => write!(
                f,
                "promote-replica (primary killed, old primary back after {})",
                s(down)
            ),
            Fault::KillMaster { key, down } => write!(
                f,
                "kill-master of {key} (SIGKILL, back as a replica after {})",
                s(down)
            ),
            Fault::Reshard { key, pause } => write!(
                f,
                "reshard the slot of {key} to another master ({}ms after each key)",
                pause.as_millis()
            ),
            Fault::KillLeader { down } => {
                write!(f, "kill-leader (SIGKILL, restarted after {})", s(down))
            }
            Fault::PauseMember { pause, .. } => write!(f, "{} for {}", self.kind(), s(pause)),
            other => f.write_str(other.kind().name()),
        }
    }
}

/// A fault and when it is due, counted from the start of the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Scheduled {
    /// When the fault is due.
    pub at: Duration,
    /// The fault.
    pub fault: Fault,
}

/// The whole schedule of one run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Plan {
    /// The store.
    pub store: StoreKind,
    /// The seed.
    pub seed: u64,
    /// The length of the run.
    pub run: Duration,
    /// How many worker processes run.
    pub workers: u32,
    /// The faults, in order.
    pub faults: Vec<Scheduled>,
}

impl Plan {
    /// The schedule for `store`, `seed`, a run of length `run` and `workers` workers.
    ///
    /// # Panics
    /// When `workers` is zero.
    pub fn new(store: StoreKind, seed: u64, run: Duration, workers: u32) -> Plan {
        assert!(workers > 0, "a run needs at least one worker");
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let kinds = store.fault_kinds();
        let mut deck: Vec<FaultKind> = Vec::new();
        let mut faults = Vec::new();
        let end = run.saturating_sub(COOLDOWN);
        let mut at = WARMUP;
        loop {
            if deck.is_empty() {
                deck = kinds.clone();
                deck.shuffle(&mut rng);
            }
            let kind = deck.pop().expect("the deck was just filled");
            let fault = Fault::draw(kind, workers, &mut rng);
            if at + fault.lasts(store) > end {
                break;
            }
            faults.push(Scheduled { at, fault });
            at += fault.lasts(store) + Duration::from_millis(rng.random_range(300..=1_500));
        }
        Plan {
            store,
            seed,
            run,
            workers,
            faults,
        }
    }

    /// The plan as text: a header line, then one line per fault.
    pub fn render(&self) -> String {
        let mut out = format!(
            "fault plan: store {} seed {} run {}s workers {}: {} faults\n",
            self.store,
            self.seed,
            self.run.as_secs(),
            self.workers,
            self.faults.len()
        );
        for (i, s) in self.faults.iter().enumerate() {
            out.push_str(&format!(
                "  #{:<3} +{:>8.3}s  {}\n",
                i + 1,
                s.at.as_secs_f64(),
                s.fault
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_plan_and_another_seed_another() {
        let run = Duration::from_secs(60);
        for store in StoreKind::ALL {
            let a = Plan::new(store, 7, run, 4);
            assert_eq!(a, Plan::new(store, 7, run, 4));
            assert_eq!(a.render(), Plan::new(store, 7, run, 4).render());
            assert_ne!(a.faults, Plan::new(store, 8, run, 4).faults, "{store}");
        }
    }

    #[test]
    fn faults_stay_inside_the_run_in_order_and_every_kind_comes_first_once() {
        for (store, seed) in StoreKind::ALL
            .into_iter()
            .flat_map(|store| (0..50).map(move |seed| (store, seed)))
        {
            let run = Duration::from_secs(90);
            let plan = Plan::new(store, seed, run, 3);
            let mut previous_end = Duration::ZERO;
            for s in &plan.faults {
                assert!(
                    s.at >= WARMUP && s.at >= previous_end,
                    "{store} seed {seed}: {s:?}"
                );
                previous_end = s.at + s.fault.lasts(plan.store);
                assert!(previous_end <= run - COOLDOWN, "{store} seed {seed}: {s:?}");
                if let Fault::PauseWorker { worker, .. } | Fault::KillWorker { worker, .. } =
                    s.fault
                {
                    assert!(worker < 3);
                }
            }
            let kinds = store.fault_kinds();
            let mut first: Vec<FaultKind> = plan.faults[..kinds.len()]
                .iter()
                .map(|s| s.fault.kind())
                .collect();
            first.sort();
            let mut all = kinds;
            all.sort();
            assert_eq!(
                first, all,
                "{store} seed {seed}: the first round deals every kind"
            );
        }
    }

    #[test]
    fn a_run_too_short_for_faults_has_none() {
        let plan = Plan::new(StoreKind::Sqlite, 1, Duration::from_secs(4), 2);
        assert!(plan.faults.is_empty());
        assert!(plan.render().contains(": 0 faults"));
    }
}
