//! One soak run, from the plan to the summary.
//!
//! 1. The plan is derived from the seed and printed (`--plan-only` stops here).
//! 2. The store starts ([`Cluster`]); the workers start, connect and say they are ready.
//! 3. The parent writes the go file (start, deadline) and the nemesis applies the plan.
//! 4. At the deadline the workers finish, release what they hold and exit.
//! 5. The parent reads every journal, asks the store (directly, not through the proxy)
//!    for the final state of every acknowledged idempotency record, runs the checkers and
//!    prints the [`Summary`]. The exit status is 0 when nothing was violated and the run
//!    went through, 1 for violations, 2 when the run itself failed.
//!
//! The run directory keeps `run.json` ([`RunRecord`]) beside the journals, so `soak
//! --recheck DIR` can check a kept run again without running it.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use baton_testkit::MonoTime;
use serde::{Deserialize, Serialize};

use crate::check::{self, Audit, CheckReport, CheckRow, DataLoss, Finding, Losses};
use crate::cluster::Cluster;
use crate::journal::{Events, Op, Phase};
use crate::nemesis::{self, Applied, NemesisLog};
use crate::plan::{Plan, StoreKind};
use crate::supervisors::{self, SupervisorCommand, Supervisors};
use crate::workers::{WorkerCommand, Workers};
use crate::workload::{RunDir, idem_scope};

/// Exit status: no violation.
pub const EXIT_PASS: i32 = 0;
/// Exit status: violations found.
pub const EXIT_VIOLATIONS: i32 = 1;
/// Exit status: the run itself failed (a server did not start, a worker crashed, a fault
/// could not be applied).
pub const EXIT_ERROR: i32 = 2;

/// How long the workers may take to connect.
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// How long the workers may take to finish after the deadline.
const FINISH_TIMEOUT: Duration = Duration::from_secs(60);

/// What to run.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The store.
    pub store: StoreKind,
    /// The length of the run.
    pub seconds: u64,
    /// The seed of the fault schedule and of the workers' choices.
    pub seed: u64,
    /// How many worker processes.
    pub workers: u32,
    /// Only print the plan.
    pub plan_only: bool,
    /// The run directory; a temporary one (removed unless the run fails or `keep`) if
    /// `None`.
    pub dir: Option<PathBuf>,
    /// Keep the temporary run directory.
    pub keep: bool,
    /// Where to write the summary as JSON.
    pub summary_json: Option<PathBuf>,
    /// The `baton` binary the supervisors run; `None`: the one beside the `soak` binary.
    pub baton: Option<PathBuf>,
}

/// One row of the operations table.
#[derive(Debug, Clone, Default, Serialize)]
pub struct OpRow {
    /// The operation.
    pub op: &'static str,
    /// Invoked (effects: happened).
    pub invoked: u64,
    /// Completed ok.
    pub ok: u64,
    /// Completed, certainly without effect.
    pub fail: u64,
    /// Indeterminate: faulted or never completed.
    pub indeterminate: u64,
}

/// One row of the checks table.
#[derive(Debug, Clone, Serialize)]
pub struct CheckLine {
    /// The checker.
    pub checker: &'static str,
    /// What it checked.
    pub checked: String,
    /// Violations.
    pub violations: usize,
    /// Findings in documented unsafe windows.
    pub documented: usize,
}

/// A documented unsafe window, in seconds from the start.
#[derive(Debug, Clone, Serialize)]
pub struct Window {
    /// What it is.
    pub what: String,
    /// When it began.
    pub from: f64,
    /// When the store was back.
    pub back: f64,
}

/// The outcome of a run.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// The store.
    pub store: StoreKind,
    /// The seed.
    pub seed: u64,
    /// The planned length, in seconds.
    pub seconds: u64,
    /// Worker processes.
    pub workers: u32,
    /// Operations by kind and outcome.
    pub operations: Vec<OpRow>,
    /// Faults applied, by kind.
    pub faults: BTreeMap<String, u64>,
    /// Faults planned.
    pub faults_planned: usize,
    /// The checks.
    pub checks: Vec<CheckLine>,
    /// Every finding, violations and documented ones.
    pub findings: Vec<Finding>,
    /// The documented unsafe windows of the run.
    pub unsafe_windows: Vec<Window>,
    /// Other numbers.
    pub stats: BTreeMap<String, u64>,
    /// Errors of the run itself (faults that failed, workers that crashed).
    pub errors: Vec<String>,
    /// Violations over every checker.
    pub violations: usize,
    /// Documented findings over every checker.
    pub documented: usize,
    /// Journal lines cut short by a kill.
    pub torn_lines: usize,
    /// Whether the run passed: no violation and no error.
    pub passed: bool,
    /// The run directory, when it was kept.
    pub dir: Option<PathBuf>,
}

/// What a run leaves for the checkers besides the journals, kept as `run.json` in the run
/// directory so that `soak --recheck DIR` can check a finished run again.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunRecord {
    /// The store.
    pub store: StoreKind,
    /// The seed.
    pub seed: u64,
    /// The planned length, in seconds.
    pub seconds: u64,
    /// Worker processes.
    pub workers: u32,
    /// When the run started.
    pub start: MonoTime,
    /// Faults planned.
    pub faults_planned: usize,
    /// Faults applied, by kind.
    pub faults: BTreeMap<String, u64>,
    /// Every fault as it was applied, with when it began and was healed.
    pub applied: Vec<Applied>,
    /// The data losses.
    pub losses: Vec<DataLoss>,
    /// The final state of the acknowledged idempotency records.
    pub audit: Audit,
    /// Errors of the run itself.
    pub errors: Vec<String>,
}

/// Runs the soak described by `options`, writing progress and the summary to `out`, and
/// answers the exit status.
pub fn run(options: &RunOptions, out: &mut dyn Write) -> i32 {
    let plan = Plan::new(
        options.store,
        options.seed,
        Duration::from_secs(options.seconds),
        options.workers,
    );
    let _ = write!(out, "{}", plan.render());
    if options.plan_only {
        return EXIT_PASS;
    }
    match soak(options, &plan, out) {
        Ok(summary) => {
            let _ = write!(out, "{}", render(&summary));
            let json = serde_json::to_string_pretty(&summary).expect("a summary serializes");
            if let Some(dir) = &summary.dir {
                let _ = std::fs::write(dir.join("summary.json"), &json);
            }
            if let Some(path) = &options.summary_json
                && let Err(e) = std::fs::write(path, json)
            {
                let _ = writeln!(out, "cannot write {}: {e}", path.display());
                return EXIT_ERROR;
            }
            exit_status(&summary)
        }
        Err(e) => {
            let _ = writeln!(out, "soak failed: {e}");
            EXIT_ERROR
        }
    }
}

fn soak(options: &RunOptions, plan: &Plan, out: &mut dyn Write) -> Result<Summary, String> {
    let (dir, temp) = match &options.dir {
        Some(dir) => (RunDir::new(dir), None),
        None => {
            let temp = tempfile::Builder::new()
                .prefix(&format!("baton-soak-{}-", options.store))
                .tempdir()
                .map_err(|e| format!("cannot make a run directory: {e}"))?;
            (RunDir::new(temp.path()), Some(temp))
        }
    };
    dir.create()
        .map_err(|e| format!("cannot make the run directory: {e}"))?;
    let _ = writeln!(out, "run directory: {}", dir.root().display());

    let cluster = Cluster::start(options.store, dir.root())
        .map_err(|e| format!("the {} store did not start: {e}", options.store))?;
    let _ = writeln!(out, "store: {}", cluster.describe());
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the soak binary: {e}"))?;
    let baton = options
        .baton
        .clone()
        .unwrap_or_else(|| exe.with_file_name("baton"));
    let supervised = SupervisorCommand {
        baton,
        soak: exe.clone(),
        url: cluster.direct_url(),
        root: dir.root().to_path_buf(),
    };
    let record_ttl = Duration::from_secs(3_600.max(options.seconds + 600));
    let mut workers = Workers::start(
        WorkerCommand {
            exe,
            store: options.store,
            url: cluster.worker_url(),
            dir: dir.clone(),
            seed: options.seed,
            record_ttl,
        },
        options.workers,
    )
    .map_err(|e| format!("cannot start the workers: {e}"))?;
    workers.wait_ready(READY_TIMEOUT)?;

    let start = MonoTime::now();
    let deadline = start + Duration::from_secs(options.seconds);
    let go =
        serde_json::to_string(&crate::workload::Go { start, deadline }).expect("go serializes");
    let tmp = dir.root().join("go.json.tmp");
    std::fs::write(&tmp, go)
        .and_then(|()| std::fs::rename(&tmp, dir.go()))
        .map_err(|e| format!("cannot write the go file: {e}"))?;
    let supervisors = Supervisors::start(supervised, deadline)?;
    let _ = writeln!(
        out,
        "{} workers and {} supervisors running for {}s; faults as they happen:",
        options.workers,
        supervisors::SUPERVISORS,
        options.seconds
    );

    let nemesis = nemesis::run(plan, start, &cluster, &mut workers, &supervisors, out);
    let now = MonoTime::now();
    if deadline > now {
        std::thread::sleep(deadline.saturating_since(now));
    }
    let exits = workers.wait_all(FINISH_TIMEOUT);
    let mut errors = nemesis.errors.clone();
    errors.extend(workers.failures(&exits));
    errors.extend(supervisors.wait_all());

    let events =
        Events::read_dir(&dir.journals()).map_err(|e| format!("cannot read the journals: {e}"))?;
    let audit = audit(&cluster.direct_url(), &events)?;
    drop(workers);
    drop(cluster);
    let record = RunRecord {
        store: options.store,
        seed: options.seed,
        seconds: options.seconds,
        workers: options.workers,
        start,
        faults_planned: plan.faults.len(),
        faults: applied_kinds(&nemesis),
        applied: nemesis.applied.clone(),
        losses: nemesis.losses.clone(),
        audit,
        errors,
    };
    let json = serde_json::to_string_pretty(&record).expect("a run record serializes");
    std::fs::write(dir.root().join("run.json"), json)
        .map_err(|e| format!("cannot write run.json: {e}"))?;
    let report = check_record(&record, &events, dir.root());

    let failed = !record.errors.is_empty() || report.violations() > 0;
    let kept = match temp {
        Some(temp) if failed || options.keep => Some(temp.keep()),
        Some(_) => None,
        None => Some(dir.root().to_path_buf()),
    };
    Ok(summarize(record, &events, report, kept))
}

fn exit_status(summary: &Summary) -> i32 {
    if !summary.errors.is_empty() {
        EXIT_ERROR
    } else if summary.violations > 0 {
        EXIT_VIOLATIONS
    } else {
        EXIT_PASS
    }
}

fn applied_kinds(nemesis: &NemesisLog) -> BTreeMap<String, u64> {
    let mut faults: BTreeMap<String, u64> = BTreeMap::new();
    for applied in &nemesis.applied {
        *faults.entry(applied.kind.name().to_owned()).or_default() += 1;
    }
    faults
}

fn check_record(record: &RunRecord, events: &Events, root: &std::path::Path) -> CheckReport {
    let losses = Losses {
        losses: record.losses.clone(),
        start: record.start,
    };
    let mut report = check::check_all(record.store, events, &losses, &record.audit);
    supervisors::check(root, &losses, &mut report);
    report
}

/// Checks the finished run kept in `dir` again (its journals and `run.json`), writing the
/// summary to `out`, and answers the exit status: for a checker that changed since.
pub fn recheck(dir: &std::path::Path, out: &mut dyn Write) -> i32 {
    let result = (|| -> Result<Summary, String> {
        let text = std::fs::read_to_string(dir.join("run.json"))
            .map_err(|e| format!("cannot read {}/run.json: {e}", dir.display()))?;
        let record: RunRecord =
            serde_json::from_str(&text).map_err(|e| format!("run.json: {e}"))?;
        let events = Events::read_dir(&RunDir::new(dir).journals())
            .map_err(|e| format!("cannot read the journals: {e}"))?;
        let report = check_record(&record, &events, dir);
        Ok(summarize(record, &events, report, Some(dir.to_path_buf())))
    })();
    match result {
        Ok(summary) => {
            let _ = write!(out, "{}", render(&summary));
            exit_status(&summary)
        }
        Err(e) => {
            let _ = writeln!(out, "recheck failed: {e}");
            EXIT_ERROR
        }
    }
}

/// Reads, straight from the store, the record of every scope whose completion a worker saw
/// acknowledged.
fn audit(url: &str, events: &Events) -> Result<Audit, String> {
    let keys = check::idem::acknowledged(&events.operations());
    if keys.is_empty() {
        // Nothing to read back (a store without idempotency records: no need to ask it).
        return Ok(Audit::new());
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start a runtime: {e}"))?;
    runtime.block_on(async {
        let baton = baton::connect(url)
            .await
            .map_err(|e| format!("the audit cannot connect to {url}: {e}"))?;
        let log = baton
            .idempotency()
            .map_err(|e| format!("the audit has no idempotency log: {e}"))?;
        let mut audit = Audit::new();
        for key in keys {
            let record = log
                .get(&idem_scope(&key))
                .await
                .map_err(|e| format!("the audit cannot read {key}: {e}"))?;
            audit.insert(
                key,
                record.map(|r| (r.status().as_str().to_owned(), r.attempt())),
            );
        }
        Ok(audit)
    })
}

fn summarize(
    record: RunRecord,
    events: &Events,
    report: CheckReport,
    dir: Option<PathBuf>,
) -> Summary {
    let mut rows: BTreeMap<Op, OpRow> = Op::ALL
        .iter()
        .map(|op| {
            (
                *op,
                OpRow {
                    op: op.name(),
                    ..OpRow::default()
                },
            )
        })
        .collect();
    for operation in events.operations() {
        let row = rows
            .get_mut(&operation.any().op)
            .expect("every op has a row");
        row.invoked += 1;
        match operation.phase() {
            Phase::Ok => row.ok += 1,
            Phase::Fail => row.fail += 1,
            Phase::Info | Phase::Invoke => row.indeterminate += 1,
        }
    }
    // No rows for the operations the store's workers do not run (etcd: rate limits), unless
    // some ran anyway.
    rows.retain(|op, row| record.store.keeps_budgets() || !op.needs_budgets() || row.invoked > 0);
    let start = record.start;
    let unsafe_windows = record
        .losses
        .iter()
        .map(|l| Window {
            what: l.cause.describe().to_owned(),
            from: check::secs(l.from, start),
            back: check::secs(l.back, start),
        })
        .collect();
    let violations = report.violations();
    let documented = report.documented();
    let checks = report
        .rows
        .iter()
        .map(
            |(
                name,
                CheckRow {
                    checked,
                    violations,
                    documented,
                },
            )| CheckLine {
                checker: name,
                checked: checked.clone(),
                violations: *violations,
                documented: *documented,
            },
        )
        .collect();
    Summary {
        store: record.store,
        seed: record.seed,
        seconds: record.seconds,
        workers: record.workers,
        operations: rows.into_values().collect(),
        faults: record.faults,
        faults_planned: record.faults_planned,
        checks,
        findings: report.findings,
        unsafe_windows,
        stats: report.stats,
        passed: record.errors.is_empty() && violations == 0,
        errors: record.errors,
        violations,
        documented,
        torn_lines: events.torn_lines,
        dir,
    }
}

/// The summary as text tables.
pub fn render(s: &Summary) -> String {
    let mut out = String::new();
    let line = "-".repeat(78);
    out.push_str(&format!(
        "\n{line}\nsoak summary: store {} seed {} {}s, {} workers\n{line}\n",
        s.store, s.seed, s.seconds, s.workers
    ));
    out.push_str(&format!(
        "{:<16}{:>10}{:>10}{:>10}{:>15}\n",
        "operation", "invoked", "ok", "fail", "indeterminate"
    ));
    let mut total = OpRow::default();
    for row in &s.operations {
        out.push_str(&format!(
            "{:<16}{:>10}{:>10}{:>10}{:>15}\n",
            row.op, row.invoked, row.ok, row.fail, row.indeterminate
        ));
        total.invoked += row.invoked;
        total.ok += row.ok;
        total.fail += row.fail;
        total.indeterminate += row.indeterminate;
    }
    out.push_str(&format!(
        "{:<16}{:>10}{:>10}{:>10}{:>15}\n\n",
        "total", total.invoked, total.ok, total.fail, total.indeterminate
    ));

    let applied: u64 = s.faults.values().sum();
    out.push_str(&format!(
        "{:<24}{:>8}   ({} planned)\n",
        "fault", "applied", s.faults_planned
    ));
    for (kind, n) in &s.faults {
        out.push_str(&format!("{kind:<24}{n:>8}\n"));
    }
    out.push_str(&format!("{:<24}{applied:>8}\n\n", "total"));

    out.push_str(&format!(
        "{:<20}{:>11}{:>11}   {}\n",
        "check", "violations", "documented", "checked"
    ));
    for c in &s.checks {
        out.push_str(&format!(
            "{:<20}{:>11}{:>11}   {}\n",
            c.checker, c.violations, c.documented, c.checked
        ));
    }
    out.push_str(&format!(
        "{:<20}{:>11}{:>11}\n\n",
        "total", s.violations, s.documented
    ));

    if !s.stats.is_empty() {
        for (name, n) in &s.stats {
            out.push_str(&format!("  {name}: {n}\n"));
        }
        out.push('\n');
    }
    if s.unsafe_windows.is_empty() {
        out.push_str("documented unsafe windows: none\n");
    } else {
        out.push_str("documented unsafe windows:\n");
        for w in &s.unsafe_windows {
            out.push_str(&format!(
                "  +{:.3}s .. back at +{:.3}s: {}\n",
                w.from, w.back, w.what
            ));
        }
    }
    if s.torn_lines > 0 {
        out.push_str(&format!(
            "journal lines cut short by a kill: {}\n",
            s.torn_lines
        ));
    }
    let violations: Vec<&Finding> = s
        .findings
        .iter()
        .filter(|f| f.documented.is_none())
        .collect();
    let documented: Vec<&Finding> = s
        .findings
        .iter()
        .filter(|f| f.documented.is_some())
        .collect();
    for (title, list, limit) in [
        ("violations", &violations, 30),
        ("documented findings", &documented, 5),
    ] {
        if list.is_empty() {
            continue;
        }
        out.push_str(&format!("\n{title}:\n"));
        for f in list.iter().take(limit) {
            let why = f
                .documented
                .as_deref()
                .map(|w| format!(" [{w}]"))
                .unwrap_or_default();
            out.push_str(&format!(
                "  {} on {}{why}: {}\n",
                f.checker, f.key, f.detail
            ));
        }
        if list.len() > limit {
            out.push_str(&format!(
                "  ... and {} more (all in summary.json)\n",
                list.len() - limit
            ));
        }
    }
    for e in &s.errors {
        out.push_str(&format!("\nERROR: {e}\n"));
    }
    if let Some(dir) = &s.dir {
        out.push_str(&format!("\nrun directory kept: {}\n", dir.display()));
    }
    out.push_str(&format!(
        "\nresult: {} ({} violations, {} documented, {} faults applied, {} operations ok)\n",
        if s.passed { "PASS" } else { "FAIL" },
        s.violations,
        s.documented,
        applied,
        total.ok
    ));
    out
}
