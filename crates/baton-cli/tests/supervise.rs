//! Process supervision by `baton run` and `baton worker`, on a private SQLite file per test:
//! a supervisor killed with SIGKILL takes COMMAND with it (the parent-death signal), and
//! the processes COMMAND leaves in its process group are terminated before the lock or
//! the item is let go (at COMMAND's exit, and under a lost lock).
//!
//! The parent-death signal is Linux's; on other platforms these promises are documented as
//! not kept, and this file does not run.

#![cfg(target_os = "linux")]

mod common;

use std::time::{Duration, Instant};

use common::*;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// How soon a COMMAND must be gone after its supervisor was killed: the parent-death signal
/// is delivered by the kernel as the supervisor exits.
const DEATH_DEADLINE: Duration = Duration::from_secs(1);

/// Whether `pid` is a process that can still run: it exists and is not a zombie (an exited
/// process whose parent has not reaped it yet, which does no work).
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // `pid (comm) STATE ...`; comm may hold spaces and parentheses.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// The pid of the one child of `parent` whose program is `comm`, once there is one.
fn child_running(parent: Pid, comm: &str) -> i32 {
    let mut found = None;
    eventually(&format!("a child {comm:?} of {parent}"), || {
        found = children(parent).into_iter().find(|&pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == comm)
        });
        found.is_some()
    });
    found.expect("found")
}

/// The children of `parent`, from every one of its threads.
fn children(parent: Pid) -> Vec<i32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{parent}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("children")).ok())
        .flat_map(|list| {
            list.split_whitespace()
                .filter_map(|pid| pid.parse().ok())
                .collect::<Vec<i32>>()
        })
        .collect()
}

/// Kills `supervisor` with SIGKILL (as the OOM killer would) and asserts that `command`
/// is gone within [`DEATH_DEADLINE`].
fn kill_9_and_expect_gone(supervisor: Running, command: i32) {
    supervisor.signal(Signal::SIGKILL);
    let killed = Instant::now();
    drop(supervisor.finish());
    while alive(command) {
        assert!(
            killed.elapsed() < DEATH_DEADLINE,
            "COMMAND (pid {command}) still runs {DEATH_DEADLINE:?} after its supervisor was killed"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A shell script that records, in the file `verdict`, whether process `pid` still runs.
fn check_gone_script(pid: i32) -> String {
    format!(
        r#"if [ -e /proc/{pid} ] && [ "$(cut -d' ' -f3 /proc/{pid}/stat)" != Z ]; then echo "overlap $BATON_FENCE$BATON_ATTEMPT" > verdict; else echo "clear $BATON_FENCE$BATON_ATTEMPT" > verdict; fi"#
    )
}

/// Reads the pid a COMMAND wrote to `name`.
fn pid_in(env: &Env, name: &str) -> i32 {
    let mut pid = None;
    eventually(&format!("a pid in {name}"), || {
        pid = env.read(name).trim().parse().ok();
        pid.is_some()
    });
    pid.expect("pid")
}

/// Starts a job that ignores SIGTERM and writes its pid to `bg`; the shell goes on only once
/// the job's trap is in place, so that a SIGTERM sent when the shell exits always finds it
/// set (a job still starting would die of it).
const IGNORES_TERM: &str = r#"sh -c 'trap "" TERM; echo $$ > bg.new && mv bg.new bg; exec sleep 30' & until [ -s bg ]; do sleep 0.01; done"#;

/// Starts `baton run ARGS job -- sh -c SCRIPT`, where SCRIPT writes its background job's
/// pid to `bg`; returns baton and the job's pid.
fn start_with_job(env: &Env, args: &[&str], script: &str) -> (Running, i32) {
    let holder = Running::spawn(
        env.baton(
            ["run"]
                .iter()
                .chain(args)
                .chain(&["job", "--"])
                .copied()
                .chain(sh(script)),
        ),
    );
    (holder, pid_in(env, "bg"))
}

/// Loses `holder`'s lock: stops it past its TTL, lets another run take and release the
/// lock, and resumes it. Then `holder` must exit 79 and its `job` must be gone.
#[track_caller]
fn lose_the_lock_and_expect_the_job_gone(env: &Env, holder: Running, job: i32) {
    holder.signal(Signal::SIGSTOP);
    eventually("the stopped holder's lock to expire", || {
        env.lock_status("job")["held"] == false
    });
    env.run(["run", "job", "--", "true"]).assert_status(0);
    holder.signal(Signal::SIGCONT);
    let out = holder.finish();
    out.assert_status(LOCK_LOST);
    assert!(!alive(job), "the job outlived the lost lock");
}

#[test]
fn kill_9_of_baton_run_kills_command_at_once() {
    let env = Env::new();
    let holder = Running::spawn(env.baton(["run", "--ttl", "2s", "job", "--", "sleep", "30"]));
    let command = child_running(holder.pid(), "sleep");
    let fence = env.lock_status("job")["fence"].as_u64().expect("fence");
    kill_9_and_expect_gone(holder, command);

    // The lock stays held until its TTL lapses; the next holder never runs beside COMMAND.
    let next = env.run(
        ["run", "--wait", "1m", "job", "--"]
            .into_iter()
            .chain(sh(&check_gone_script(command))),
    );
    next.assert_status(0);
    let verdict = env.read("verdict");
    let (word, next_fence) = verdict.trim().split_once(' ').expect("verdict");
    assert_eq!(word, "clear", "the next holder ran beside COMMAND");
    assert!(next_fence.parse::<u64>().expect("fence") > fence);
}

#[test]
fn kill_9_of_baton_run_kills_the_jobs_command_started() {
    let env = Env::new();
    let script = "sleep 30 & echo $! > bg; echo $$ > sh; wait";
    let (holder, job) = start_with_job(&env, &["--ttl", "2s"], script);
    let shell = pid_in(&env, "sh");
    kill_9_and_expect_gone(holder, shell);
    let killed = Instant::now();
    while alive(job) {
        assert!(
            killed.elapsed() < DEATH_DEADLINE,
            "COMMAND's background job (pid {job}) still runs {DEATH_DEADLINE:?} after baton was killed"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn kill_9_of_baton_worker_kills_command_at_once() {
    let env = Env::new();
    env.run(["queue", "enqueue", "q", "1"]).assert_status(0);
    let worker = Running::spawn(env.baton(["worker", "q", "--lease", "2s", "--", "sleep", "30"]));
    let command = child_running(worker.pid(), "sleep");
    kill_9_and_expect_gone(worker, command);

    // The item is claimed again once its lease lapses, as attempt 2, never beside COMMAND.
    let next = Running::spawn(
        env.baton(
            ["worker", "q", "--lease", "2s", "--"]
                .into_iter()
                .chain(sh(&check_gone_script(command))),
        ),
    );
    eventually("the second attempt", || !env.read("verdict").is_empty());
    next.signal(Signal::SIGTERM);
    next.finish().assert_status(0);
    assert_eq!(
        env.read("verdict").trim(),
        "clear 2",
        "the second attempt ran beside COMMAND"
    );
}

#[test]
fn a_background_job_left_by_command_is_terminated_before_the_lock_is_released() {
    let env = Env::new();
    // `sh` exits at once; the job it started in the background runs on in its group.
    let mut command = env.baton(
        ["run", "--grace", "1m", "job", "--"]
            .into_iter()
            .chain(sh("sleep 30 & echo $! > bg")),
    );
    command.env("BATON_LOG", "info");
    let out = Running::spawn(command).finish();
    out.assert_status(0);
    let job = pid_in(&env, "bg");
    assert!(!alive(job), "the background job outlived the lock");
    assert_eq!(env.lock_status("job")["held"], false);
    assert!(
        out.stderr
            .contains("baton.supervisor.group_outlived_command"),
        "the leftover group is reported as an event: {}",
        out.stderr
    );
}

#[test]
fn a_job_that_ignores_sigterm_is_killed_after_grace_and_holds_the_lock_until_then() {
    let env = Env::new();
    // COMMAND is killed; its background job ignores SIGTERM.
    let script = format!("{IGNORES_TERM}; echo $$ > sh; wait");
    let (holder, job) = start_with_job(&env, &["--ttl", "10s", "--grace", "1s"], &script);
    let shell = pid_in(&env, "sh");
    kill(Pid::from_raw(shell), Signal::SIGKILL).expect("kill sh");
    let out = holder.finish();
    out.assert_status(128 + 9);
    assert!(!alive(job), "the job outlived the lock");
    assert!(out.stderr.contains("SIGKILL"), "{}", out.stderr);
    assert_eq!(env.lock_status("job")["held"], false);
}

#[test]
fn the_lock_stays_held_while_a_background_job_runs_after_command_exited() {
    let env = Env::new();
    let script = IGNORES_TERM;
    let (holder, job) = start_with_job(&env, &["--ttl", "10s", "--grace", "5s"], script);
    // sh has exited; the job ignores the SIGTERM it got and keeps the lock held.
    assert_eq!(env.lock_status("job")["held"], true);
    let out = holder.finish();
    out.assert_status(0);
    assert!(!alive(job), "the job outlived the lock");
    assert_eq!(env.lock_status("job")["held"], false);
}

#[test]
fn a_lost_lock_reaches_the_jobs_command_left_behind() {
    let env = Env::new();
    // `wait` keeps sh running; the job ignores SIGTERM; the lock is lost while both run.
    let script = format!("{IGNORES_TERM}; sleep 30 & wait");
    let args = ["--ttl", "2s", "--grace", "1s", "--on-lost", "term"];
    let (holder, job) = start_with_job(&env, &args, &script);
    lose_the_lock_and_expect_the_job_gone(&env, holder, job);
}

#[test]
fn a_lost_lock_after_command_exited_kills_the_jobs_it_left() {
    let env = Env::new();
    // sh exits at once; its job ignores SIGTERM and keeps the lock; the lock is then lost.
    let script = IGNORES_TERM;
    let args = ["--ttl", "2s", "--grace", "1m", "--on-lost", "kill"];
    let (holder, job) = start_with_job(&env, &args, script);
    eventually("the lock to be held", || {
        env.lock_status("job")["held"] == true
    });
    lose_the_lock_and_expect_the_job_gone(&env, holder, job);
}

#[test]
fn a_worker_item_settles_only_once_its_group_is_empty() {
    let env = Env::new();
    env.run(["queue", "enqueue", "q", "1"]).assert_status(0);
    let script = IGNORES_TERM;
    let out = env.run(worker_until_empty("q", &["--grace", "1s"], script));
    out.assert_status(0);
    let job = pid_in(&env, "bg");
    assert!(!alive(job), "the job outlived its item");
    assert!(out.stdout.contains("completed=1"), "{}", out.stdout);
}
