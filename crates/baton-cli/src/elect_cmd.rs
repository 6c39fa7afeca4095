//! `baton elect NAME --id ID -- COMMAND`: run COMMAND while this process is the leader of
//! the election NAME; `baton leader NAME`: who leads it, and with `--watch`, every change.
//!
//! `elect` is `baton run` with a campaign instead of an acquire: the same environment for
//! COMMAND, the same signals, the same lost-leadership handling ([`run::supervise`]) and the
//! same exit statuses ([`run::finish`]); it waits as long as needed unless `--wait` is given.

use std::time::Duration;

use clap::Args;
use serde::Serialize;

use baton::election::{Election, Leader, Leadership};
use baton::lock::LockOptions;

use crate::args;
use crate::child::Child;
use crate::cli::GlobalArgs;
use crate::exit::{CONTENDED, Failure, INTERNAL, SIGNAL_BASE, SUCCESS, UNAVAILABLE};
use crate::lock_cmd::held_election;
use crate::output::{Output, human_duration, millis};
use crate::run::{self, Ended, Held, OnLost, keep_alive_interval};
use crate::signals::Forwarded;
use crate::store;

/// `baton elect`.
#[derive(Debug, Args)]
pub(crate) struct ElectArgs {
    /// This candidate's id, shown by `baton leader` (a host or instance name; at most 200
    /// bytes, no control characters).
    #[arg(long, value_name = "ID", value_parser = args::candidate)]
    pub(crate) id: String,

    /// The value this leader proclaims, shown by `baton leader` (its address, say; at most
    /// 1024 bytes, no control characters).
    #[arg(long, value_name = "TEXT", default_value = "", value_parser = args::leader_value)]
    pub(crate) value: String,

    /// How long the leadership survives without a renewal (10ms to 30d); renewed every
    /// ttl / 3 while COMMAND runs. It is how long the election stays without a leader after
    /// this machine dies.
    #[arg(long, value_name = "DUR", default_value = args::DEFAULT_TTL, value_parser = args::ttl)]
    pub(crate) ttl: Duration,

    /// How long to campaign before giving up with status 75 (at most 1d; 0s is one attempt).
    /// Without it, campaign until elected.
    #[arg(long, value_name = "DUR", value_parser = args::wait)]
    pub(crate) wait: Option<Duration>,

    /// What to do to COMMAND when the leadership is lost while it runs: term (SIGTERM, then
    /// SIGKILL after --grace), kill (SIGKILL at once), ignore (let it finish; baton still
    /// exits 79).
    #[arg(long, value_name = "ACTION", value_enum, default_value_t = OnLost::Term)]
    pub(crate) on_lost: OnLost,

    /// With --on-lost term: how long COMMAND has between SIGTERM and SIGKILL (at most 1h).
    #[arg(long, value_name = "DUR", default_value = args::DEFAULT_GRACE, value_parser = args::grace)]
    pub(crate) grace: Duration,

    /// The election's name.
    #[arg(value_name = "NAME", value_parser = args::key)]
    pub(crate) name: String,

    #[command(flatten)]
    pub(crate) command: args::CommandLine,
}

/// `baton leader`.
#[derive(Debug, Args)]
pub(crate) struct LeaderArgs {
    /// Keep printing: the leader now, then every change (a new leader, a new value, no
    /// leader) on a line of its own, until stopped.
    #[arg(long)]
    pub(crate) watch: bool,

    /// The election's name.
    #[arg(value_name = "NAME", value_parser = args::key)]
    pub(crate) name: String,
}

/// Runs `baton elect`; returns baton's exit status.
pub(crate) async fn elect(global: &GlobalArgs, args: &ElectArgs) -> Result<u8, Failure> {
    let options = LockOptions::new(args.ttl).keep_alive(keep_alive_interval(args.ttl));
    options.validate()?;
    let mut signals = Forwarded::install()
        .map_err(|e| Failure::new(INTERNAL, format!("cannot install signal handlers: {e}")))?;
    let what = format!("leadership of {:?}", args.name);
    let campaign = async {
        let baton = store::connect(global).await?;
        let election = baton.election(&args.name)?;
        campaign(&election, args, &options).await
    };
    let leadership = tokio::select! {
        leadership = campaign => leadership?,
        signal = signals.recv() => {
            return Err(Failure::new(
                SIGNAL_BASE + signal as u8,
                format!("{signal} received while campaigning for the {what}; COMMAND did not run"),
            ));
        }
    };
    let term = leadership.term();
    let env = [
        ("BATON_KEY", args.name.clone()),
        ("BATON_FENCE", term.to_string()),
        ("BATON_LEADER_ID", args.id.clone()),
    ];
    let child = match Child::spawn(&args.command.argv, &env, args.grace).await {
        Ok(child) => child,
        Err(failure) => {
            leadership.resign().await;
            return Err(failure);
        }
    };
    tracing::debug!(election = %args.name, term = %term, command = child.name(), "leading");
    let held = Held {
        what,
        ttl: args.ttl,
        on_lost: args.on_lost,
        grace: args.grace,
    };
    let ran = run::supervise(child, &mut signals, leadership.lost_token(), term, &held).await;
    let ended = Ended::Released(leadership.resign().await);
    run::finish(&held, term, ran, ended)
}

/// Campaigns until elected, or for `--wait`.
async fn campaign(
    election: &Election,
    args: &ElectArgs,
    options: &LockOptions,
) -> Result<Leadership, Failure> {
    let cannot = |e: baton::Error| {
        let mut failure = Failure::from(e);
        failure.message = format!(
            "cannot campaign for the leadership of {:?}: {}",
            args.name, failure.message
        );
        failure
    };
    let Some(wait) = args.wait else {
        return election
            .campaign(&args.id, &args.value, options)
            .await
            .map_err(cannot);
    };
    let options = options.clone().wait(wait);
    if let Some(leadership) = election
        .try_campaign(&args.id, &args.value, &options)
        .await
        .map_err(cannot)?
    {
        return Ok(leadership);
    }
    let led = match election.leader().await {
        Ok(Some(leader)) => format!(
            "is led by {} (term {}) for another {} unless renewed",
            leader.candidate,
            leader.term,
            human_duration(leader.remaining)
        ),
        _ => "has another leader".to_owned(),
    };
    let waited = run::gave_up(wait, "campaigning for");
    Err(Failure::new(
        CONTENDED,
        format!(
            "election {:?} {led}; {waited}; COMMAND did not run",
            args.name
        ),
    ))
}

/// A leader as `baton leader` prints it.
#[derive(Debug, Serialize)]
struct LeaderLine<'a> {
    election: &'a str,
    leader: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    candidate: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    value: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    term: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    remaining_ms: Option<u64>,
}

fn print_leader(output: Output, name: &str, leader: Option<&Leader>) -> Result<(), Failure> {
    let line = LeaderLine {
        election: name,
        leader: leader.is_some(),
        candidate: leader.map(|l| l.candidate.as_str()),
        value: leader.map(|l| l.value.as_str()),
        term: leader.map(|l| l.term.get()),
        remaining_ms: leader.map(|l| millis(l.remaining)),
    };
    output.line(&line, || match leader {
        None => format!("{name}: no leader"),
        Some(leader) => format!(
            "{name}: led by {}",
            held_election(leader.clone()).describe()
        ),
    })
}

/// Runs `baton leader`; returns baton's exit status.
pub(crate) async fn leader(global: &GlobalArgs, args: &LeaderArgs) -> Result<u8, Failure> {
    use tokio::signal::unix::{SignalKind, signal};
    let output = global.output();
    let baton = store::connect(global).await?;
    let election = baton.election(&args.name)?;
    if !args.watch {
        let leader = election.leader().await?;
        print_leader(output, &args.name, leader.as_ref())?;
        return Ok(SUCCESS);
    }
    let installed = signal(SignalKind::interrupt()).and_then(|interrupt| {
        signal(SignalKind::terminate()).map(|terminate| (interrupt, terminate))
    });
    let (mut interrupt, mut terminate) = installed
        .map_err(|e| Failure::new(INTERNAL, format!("cannot install signal handlers: {e}")))?;
    let mut observer = election.observe().await?;
    loop {
        let leader = tokio::select! {
            leader = observer.next() => leader,
            _ = interrupt.recv() => return Ok(SUCCESS),
            _ = terminate.recv() => return Ok(SUCCESS),
        };
        match leader {
            Ok(leader) => print_leader(output, &args.name, leader.as_ref())?,
            Err(e) if e.kind() == baton::ErrorKind::Unavailable => {
                say!(
                    "baton: cannot read the leader of {:?}: {e}; trying again",
                    args.name
                );
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => {
                return Err(Failure::new(UNAVAILABLE, e.to_string()));
            }
        }
    }
}
