//! Election failover benchmark: how long an election stays without a leader when its leader
//! is SIGKILLed, against the leadership's TTL and one round trip to the store, in one run
//! (DESIGN §9). The target is a failover of at most TTL + one round trip.
//!
//! ```text
//! cargo bench -p baton --bench election              # full run (about a minute)
//! cargo bench -p baton --bench election -- --quick   # short run (or BATON_BENCH_QUICK=1)
//! cargo bench -p baton --bench election -- --only redis   # or sqlite, postgres
//! ```
//!
//! Each round starts a leader process (campaign with `TTL`, keep-alive every `TTL / 3`) and
//! a follower process that campaigns behind it, kills the leader with SIGKILL at a random
//! point of its renewal cycle, and measures from the kill to the follower's election (both
//! readings on the monotonic clock every process shares). A leader that dies just after a
//! renewal leaves a whole TTL on the store; one that dies just before leaves two thirds of
//! it. The round trip is the median of `Election::leader` reads in the same run. Benchmarks
//! are not tests: nothing here asserts.

use std::fs;
use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use baton::lock::LockOptions;
use baton_testkit::MonoTime;
use baton_testkit::postgres::PostgresServer;
use baton_testkit::process;
use baton_testkit::redis::RedisServer;
use baton_testkit::stats::{BenchArgs, median, ms};

/// The leadership's TTL.
const TTL: Duration = Duration::from_secs(1);
/// The election's name.
const NAME: &str = "failover";

fn main() {
    let args = BenchArgs::from_env();
    if let Some(child_args) = args.after("--child") {
        child(child_args);
        return;
    }
    let rounds = if args.quick() { 3 } else { 9 };
    let only = args.value("--only");
    let wanted = |store: &str| only.as_deref().is_none_or(|o| o == store);
    let dir = tempfile::tempdir().expect("a temp dir");
    let postgres =
        wanted("postgres").then(|| PostgresServer::start().expect("a private PostgreSQL server"));
    let redis = wanted("redis").then(|| RedisServer::start().expect("a private Redis server"));
    let mut stores = Vec::new();
    if wanted("sqlite") {
        stores.push((
            "SQLite",
            format!("sqlite://{}", dir.path().join("bench.db").display()),
        ));
    }
    if let Some(server) = &redis {
        stores.push(("Redis", server.url()));
    }
    if let Some(server) = &postgres {
        stores.push(("PostgreSQL", server.url()));
    }
    println!(
        "election failover: leader SIGKILLed, TTL {TTL:?}, keep-alive every {:?}, {rounds} rounds per store; load average {}",
        TTL / 3,
        load_average()
    );
    println!();
    println!(
        "| store | failover median | min | max | round trip | TTL + round trip | max / (TTL + round trip) |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (name, url) in stores {
        let mut failovers = Vec::new();
        let mut early = 0;
        for round in 0..rounds {
            match failover(&url, dir.path(), round) {
                Some(failover) => failovers.push(failover),
                None => early += 1,
            }
        }
        if early > 0 {
            eprintln!(
                "{name}: in {early} of {rounds} rounds the leader lost its leadership before it was killed (renewals late: is the machine busy?)"
            );
        }
        let trip = round_trip(&url);
        let secs: Vec<f64> = failovers.iter().map(Duration::as_secs_f64).collect();
        let min = failovers.iter().min().copied().unwrap_or_default();
        let max = failovers.iter().max().copied().unwrap_or_default();
        let bound = TTL + trip;
        println!(
            "| {name} | {} | {} | {} | {} | {} | {:.3} |",
            ms(Duration::from_secs_f64(median(&secs))),
            ms(min),
            ms(max),
            ms(trip),
            ms(bound),
            max.as_secs_f64() / bound.as_secs_f64()
        );
    }
}

/// One round: a leader, a follower behind it, the leader killed; the time from the kill to
/// the follower's election, or `None` when the follower was elected before the kill.
fn failover(url: &str, dir: &Path, round: u32) -> Option<Duration> {
    let leader_out = dir.join(format!("leader-{round}"));
    let follower_out = dir.join(format!("follower-{round}"));
    // The files of the store measured before are not this round's.
    for out in [&leader_out, &follower_out] {
        let _ = fs::remove_file(out);
    }
    let mut leader = spawn("leader", url, &leader_out);
    wait_for_line(&leader_out, "elected");
    let follower = spawn("follower", url, &follower_out);
    wait_for_line(&follower_out, "campaigning");
    // Let the follower's campaign reach the store, then kill the leader at a point of its
    // renewal cycle that changes from round to round.
    let offset = Duration::from_millis(200 + u64::from(round * 37) % (TTL.as_millis() as u64 / 3));
    std::thread::sleep(offset);
    let killed = MonoTime::now().as_nanos();
    leader.kill().expect("SIGKILL the leader");
    let _ = leader.wait();
    let elected = wait_for_line(&follower_out, "elected");
    finish(follower);
    // A follower elected before the kill means the leader lost its leadership while alive
    // (a renewal that did not reach the store in time, as on a starved machine): no
    // failover to measure.
    if elected < killed && std::env::var_os("BATON_BENCH_DEBUG").is_some() {
        eprintln!(
            "round {round}: killed at {killed}, follower elected at {elected}; leader said {:?}",
            fs::read_to_string(&leader_out).unwrap_or_default()
        );
    }
    (elected > killed).then(|| Duration::from_nanos(elected - killed))
}

fn spawn(role: &str, url: &str, out: &Path) -> Child {
    Command::new(std::env::current_exe().expect("the bench binary"))
        .arg("--child")
        .arg(role)
        .arg(url)
        .arg(out)
        .stdin(Stdio::null())
        .spawn()
        .expect("start a candidate process")
}

fn finish(mut child: Child) {
    let status = child.wait().expect("wait for a candidate");
    assert!(status.success(), "a candidate failed: {status}");
}

/// Waits for the line `word READING` in `out`; returns the reading.
fn wait_for_line(out: &Path, word: &str) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let text = fs::read_to_string(out).unwrap_or_default();
        if let Some(reading) = text.lines().find_map(|line| {
            line.strip_prefix(word)
                .and_then(|rest| rest.trim().parse().ok())
        }) {
            return reading;
        }
        assert!(
            Instant::now() < deadline,
            "no {word:?} in {}",
            out.display()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The median of 200 reads of the leader: one round trip to the store.
fn round_trip(url: &str) -> Duration {
    let runtime = process::child_runtime();
    runtime.block_on(async {
        let baton = baton::connect(url).await.expect("the store");
        let election = baton.election(NAME).expect("an election");
        let mut trips = Vec::new();
        for _ in 0..200 {
            let sent = Instant::now();
            election.leader().await.expect("a read");
            trips.push(sent.elapsed().as_secs_f64());
        }
        Duration::from_secs_f64(median(&trips))
    })
}

/// A candidate process: `ROLE URL OUT`. The leader campaigns, says `elected`, and leads
/// until killed; the follower says `campaigning`, campaigns, says `elected` and resigns.
fn child(args: &[String]) {
    let [role, url, out] = args else {
        panic!("--child ROLE URL OUT, got {args:?}");
    };
    let runtime = process::child_runtime();
    runtime.block_on(async {
        let baton = baton::connect(url)
            .await
            .unwrap_or_else(|e| panic!("connect {url}: {e}"));
        let election = baton.election(NAME).expect("an election");
        let options = LockOptions::new(TTL).keep_alive(TTL / 3);
        let mut out = fs::File::create(out).expect("create OUT");
        if role == "follower" {
            writeln!(out, "campaigning {}", MonoTime::now().as_nanos()).expect("write");
        }
        let leadership = election
            .campaign(role, "", &options)
            .await
            .expect("elected");
        writeln!(out, "elected {}", MonoTime::now().as_nanos()).expect("write");
        out.flush().expect("flush");
        if role == "leader" {
            // Leads until killed; a leadership lost before that is said, with when.
            leadership.lost().await;
            writeln!(out, "lost {}", MonoTime::now().as_nanos()).expect("write");
            std::future::pending::<()>().await;
        }
        leadership.resign().await;
    });
}

fn load_average() -> String {
    fs::read_to_string("/proc/loadavg")
        .map(|l| l.split(' ').take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".to_owned())
}
