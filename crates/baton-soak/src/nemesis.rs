//! The nemesis: applies a [`Plan`]'s faults, one at a time, at their planned times, and
//! records what it did and when.
//!
//! Every fault ends by itself (a pause is resumed, a killed worker replaced, a stopped
//! server started again, the proxy healed, a killed master or member back in its cluster, a
//! moved slot announced) before the next one begins, so faults never pile up, and the run
//! ends with every fault healed. A Redis restart, and a replica promoted without
//! `min_replicas` (by the sentinels, or by a Redis Cluster whose master was killed), is
//! recorded as a [`DataLoss`]: the window the checkers report findings in as documented, not
//! as violations. A reshard and every etcd fault lose nothing: no window.

use std::io::Write;
use std::time::Duration;

use baton_testkit::MonoTime;
use baton_testkit::proxy::FaultProxy;
use serde::{Deserialize, Serialize};

use crate::check::{DataLoss, LossCause};
use crate::cluster::Cluster;
use crate::plan::{Fault, FaultKind, Plan};
use crate::supervisors::Supervisors;
use crate::workers::Workers;

/// One fault as it was applied.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Applied {
    /// The kind.
    pub kind: FaultKind,
    /// The fault as planned, in words, and what happened.
    pub text: String,
    /// When it began.
    pub start: MonoTime,
    /// When it was healed.
    pub end: MonoTime,
}

/// What the nemesis did.
#[derive(Debug, Clone, Default)]
pub struct NemesisLog {
    /// The faults applied, in order.
    pub applied: Vec<Applied>,
    /// The data losses (Redis restarts, promotions and cluster master failovers).
    pub losses: Vec<DataLoss>,
    /// Faults that could not be applied or healed, in words.
    pub errors: Vec<String>,
}

/// Applies `plan`'s faults, counted from `start`, printing each to `out` as it begins.
pub fn run(
    plan: &Plan,
    start: MonoTime,
    cluster: &Cluster,
    workers: &mut Workers,
    supervisors: &Supervisors,
    out: &mut dyn Write,
) -> NemesisLog {
    let mut log = NemesisLog::default();
    for (i, scheduled) in plan.faults.iter().enumerate() {
        sleep_until(start + scheduled.at);
        let began = MonoTime::now();
        let _ = writeln!(
            out,
            "[+{:>8.3}s] #{:<3} {}",
            began.saturating_since(start).as_secs_f64(),
            i + 1,
            scheduled.fault
        );
        let _ = out.flush();
        match apply(&scheduled.fault, cluster, workers, supervisors, &mut log) {
            Ok(note) => {
                let end = MonoTime::now();
                let mut text = scheduled.fault.to_string();
                if !note.is_empty() {
                    text.push_str(&format!(" ({note})"));
                }
                log.applied.push(Applied {
                    kind: scheduled.fault.kind(),
                    text,
                    start: began,
                    end,
                });
            }
            Err(e) => {
                let message = format!("fault #{} {}: {e}", i + 1, scheduled.fault);
                let _ = writeln!(out, "    failed: {e}");
                log.errors.push(message);
                // Leave nothing half-applied.
                cluster.heal();
                workers.resume_all();
            }
        }
    }
    cluster.heal();
    workers.resume_all();
    log
}

fn sleep_until(t: MonoTime) {
    let now = MonoTime::now();
    if t > now {
        std::thread::sleep(t.saturating_since(now));
    }
}

/// Applies and heals one fault; answers a note on what happened.
fn apply(
    fault: &Fault,
    cluster: &Cluster,
    workers: &mut Workers,
    supervisors: &Supervisors,
    log: &mut NemesisLog,
) -> std::io::Result<String> {
    let hold = |d: Duration| std::thread::sleep(d);
    // A proxy fault that lasts until the proxy is healed.
    let proxied = |start: fn(&FaultProxy), lasts: Duration| -> std::io::Result<String> {
        start(cluster.proxy()?);
        hold(lasts);
        cluster.heal();
        Ok(String::new())
    };
    Ok(match *fault {
        Fault::ServerRestart { down, crash } => {
            let from = MonoTime::now();
            cluster.stop_server(crash)?;
            let to = MonoTime::now();
            hold(down);
            cluster.start_server()?;
            let back = MonoTime::now();
            if cluster.restart_loses_data() {
                log.losses.push(DataLoss {
                    from,
                    to,
                    back,
                    cause: LossCause::Restart,
                    spared: Vec::new(),
                });
                "data lost".to_owned()
            } else {
                String::new()
            }
        }
        Fault::PromoteReplica { down } => {
            let from = MonoTime::now();
            let promotion = cluster.kill_primary()?;
            // The workers' store gives a grant to nobody between the kill and the
            // promotion: what the replica lacks was granted before `from`, and may be
            // granted again once the promoted replica answers.
            log.losses.push(DataLoss {
                from,
                to: promotion.promoted,
                back: promotion.promoted,
                cause: LossCause::Promotion,
                spared: Vec::new(),
            });
            hold(down);
            cluster.rejoin(&promotion)?;
            format!(
                "{} promoted in {:.2}s; {} rejoined as its replica",
                promotion.new,
                promotion.promoted.saturating_since(from).as_secs_f64(),
                promotion.old
            )
        }
        Fault::KillMaster { key, down } => {
            let from = MonoTime::now();
            let kill = cluster.kill_master(key)?;
            // As for a promotion: the slot is served by nobody between the kill and the
            // takeover; what the replica lacks was granted before `from`.
            log.losses.push(DataLoss {
                from,
                to: kill.promoted,
                back: kill.promoted,
                cause: LossCause::MasterFailover,
                spared: kill.spared.clone(),
            });
            hold(down);
            cluster.rejoin_master(&kill)?;
            format!(
                "{} killed, its replica {} took over in {:.2}s; {} rejoined as a replica",
                kill.old,
                kill.new,
                kill.promoted.saturating_since(from).as_secs_f64(),
                kill.old
            )
        }
        Fault::Reshard { key, pause } => {
            let moved = cluster.reshard(key, pause)?;
            format!(
                "slot {} moved from {} to {} with {} keys, {}",
                moved.slot,
                moved.from,
                moved.to,
                moved.keys,
                if moved.held { "held" } else { "not held" }
            )
        }
        Fault::KillLeader { down } => {
            let (killed, next) = cluster.kill_leader(down)?;
            format!("member {killed} killed, member {next} elected, member {killed} restarted")
        }
        Fault::PauseMember { leader, pause } => {
            let member = cluster.pause_member(leader, pause)?;
            format!("member {member}")
        }
        Fault::PauseWorker { worker, pause } => {
            let pid = workers.pid(worker).unwrap_or_default();
            workers.pause(worker)?;
            hold(pause);
            workers.resume(worker)?;
            format!("pid {pid}")
        }
        Fault::KillWorker { worker, down } => {
            let pid = workers.kill(worker)?;
            hold(down);
            let new = workers.replace(worker)?;
            format!("pid {pid} killed, pid {new} started")
        }
        Fault::KillSupervisor { supervisor } => supervisors.kill(supervisor)?,
        Fault::Latency { delay, lasts } => {
            let proxy = cluster.proxy()?;
            proxy.set_latency(delay);
            hold(lasts);
            proxy.set_latency(Duration::ZERO);
            String::new()
        }
        Fault::Blackhole { lasts } => proxied(FaultProxy::blackhole, lasts)?,
        Fault::Reset { lasts } => proxied(FaultProxy::reset, lasts)?,
        Fault::DropReplies { lasts } => proxied(FaultProxy::drop_replies, lasts)?,
        Fault::KillConnections => {
            cluster.proxy()?.kill_connections();
            String::new()
        }
        Fault::ScriptFlush => {
            cluster.script_flush()?;
            String::new()
        }
        Fault::ClientKill => format!("{} connections closed", cluster.client_kill()?),
        Fault::TerminateBackends => {
            format!("{} backends terminated", cluster.terminate_backends()?)
        }
    })
}
