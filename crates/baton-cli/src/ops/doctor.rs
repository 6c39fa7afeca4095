//! `baton doctor`: checks the store's deployment and prints one line per check.
//!
//! ```text
//! store  redis://cache:6379
//! ok       connect           opened the store in 3.10ms (...); PING round trip min 0.20ms, ...
//! finding  maxmemory-policy  maxmemory-policy is allkeys-lru: ...; fix: set maxmemory-policy noeviction ...
//! note     persistence       no persistence (...); consider: ...
//! 1 finding
//! ```
//!
//! The checks are `baton::doctor`'s (each store crate's own, in one report type). Exit status: 0 when there is no finding (notes are
//! fine), [`FINDINGS`] (78) when there is one, 69 when the store cannot be reached at all,
//! 64 for a malformed store URL. With `--json`, one document:
//! `{"store", "reachable", "healthy", "checks": [{"name", "verdict", "detail", "fix"}]}`.

use baton::doctor::{Check, Report, Verdict};
use serde::Serialize;

use crate::cli::GlobalArgs;
pub(crate) use crate::exit::FINDINGS;
use crate::exit::{Failure, SUCCESS, UNAVAILABLE};

/// `baton doctor --json`.
#[derive(Debug, Serialize)]
struct JsonReport<'a> {
    store: &'a str,
    reachable: bool,
    healthy: bool,
    checks: Vec<JsonCheck<'a>>,
}

#[derive(Debug, Serialize)]
struct JsonCheck<'a> {
    name: &'a str,
    verdict: &'a str,
    detail: &'a str,
    fix: Option<&'a str>,
}

/// Runs `baton doctor`; returns baton's exit status.
pub(crate) async fn run(global: &GlobalArgs) -> Result<u8, Failure> {
    let url = match &global.store {
        Some(url) => url.clone(),
        None => baton::store::default_url()?,
    };
    let report = baton::doctor::diagnose(&url).await?;
    let json = JsonReport {
        store: &report.store,
        reachable: report.reachable,
        healthy: report.is_healthy(),
        checks: report
            .checks
            .iter()
            .map(|c| JsonCheck {
                name: c.name,
                verdict: c.verdict.as_str(),
                detail: &c.detail,
                fix: c.fix.as_deref(),
            })
            .collect(),
    };
    global.output().text(&json, || render(&report))?;
    Ok(status(&report))
}

/// The exit status of a report.
fn status(report: &Report) -> u8 {
    if !report.reachable {
        UNAVAILABLE
    } else if report.is_healthy() {
        SUCCESS
    } else {
        FINDINGS
    }
}

/// The report for people: a `store` line, one line per check, and a count of findings.
fn render(report: &Report) -> String {
    let width = report
        .checks
        .iter()
        .map(|c| c.name.len())
        .max()
        .unwrap_or(0);
    let mut text = format!("store    {}\n", report.store);
    for check in &report.checks {
        text.push_str(&line(check, width));
        text.push('\n');
    }
    let findings = report.findings().count();
    text.push_str(&match findings {
        0 => "healthy: no findings\n".to_owned(),
        1 => "1 finding\n".to_owned(),
        n => format!("{n} findings\n"),
    });
    text
}

/// `finding  maxmemory-policy  <detail>; fix: <fix>`.
fn line(check: &Check, width: usize) -> String {
    let verdict = check.verdict.as_str();
    let mut line = format!("{verdict:<7}  {:<width$}  {}", check.name, check.detail);
    if let Some(fix) = &check.fix {
        line.push_str(if check.verdict == Verdict::Finding {
            "; fix: "
        } else {
            "; consider: "
        });
        line.push_str(fix);
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exit::{CONTENDED, INTERNAL, LOCK_LOST, USAGE};

    #[test]
    fn findings_have_their_own_status() {
        for other in [SUCCESS, USAGE, UNAVAILABLE, INTERNAL, CONTENDED, LOCK_LOST] {
            assert_ne!(FINDINGS, other);
        }
    }

    #[tokio::test]
    async fn a_finding_is_one_line_with_its_fix() {
        let report = baton::doctor::diagnose("memory://").await.unwrap();
        let text = render(&report);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(
            lines[1].starts_with("finding  store  memory:// is process-local"),
            "{text}"
        );
        assert!(
            lines[1].contains("; fix: configure a shared store"),
            "{text}"
        );
        assert_eq!(lines[2], "1 finding");
        assert_eq!(status(&report), FINDINGS);
    }
}
