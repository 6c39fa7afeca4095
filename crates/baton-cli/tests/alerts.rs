//! `baton alerts` prints Prometheus alerting rules that parse as YAML and hold one rule per
//! alarmed event of the registry; `docs/operations.md` lists every registered event with
//! its level and alarm.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use baton::telemetry::{Alarm, Event, REGISTRY};
use common::*;
use serde_yaml::Value;

/// `5m`, `1h`: as the rules and the doc write windows.
fn window(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        _ if s.is_multiple_of(86_400) => format!("{}d", s / 86_400),
        _ if s.is_multiple_of(3_600) => format!("{}h", s / 3_600),
        _ if s.is_multiple_of(60) => format!("{}m", s / 60),
        _ => format!("{s}s"),
    }
}

fn alarmed() -> Vec<&'static Event> {
    REGISTRY
        .iter()
        .filter(|e| matches!(e.alarm, Alarm::AtLeast { .. }))
        .collect()
}

#[test]
fn the_rules_parse_and_hold_one_rule_per_alarmed_event() {
    let out = bare_baton_run(&["alerts"]);
    out.assert_status(0);
    let doc: Value = serde_yaml::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("not YAML ({e}):\n{}", out.stdout));
    let groups = doc["groups"].as_sequence().expect("groups");
    assert_eq!(groups.len(), 1);
    assert_eq!(groups[0]["name"].as_str(), Some("baton"));
    let rules = groups[0]["rules"].as_sequence().expect("rules");
    let alarmed = alarmed();
    assert_eq!(rules.len(), alarmed.len(), "one rule per alarmed event");

    let mut names = BTreeSet::new();
    for (rule, event) in rules.iter().zip(&alarmed) {
        let Alarm::AtLeast { count, within } = event.alarm else {
            unreachable!()
        };
        let name = rule["alert"].as_str().expect("alert");
        assert!(names.insert(name.to_owned()), "duplicate alert name {name}");
        assert!(name.starts_with("Baton") && name.chars().all(|c| c.is_ascii_alphanumeric()));
        let counter = format!("{}_total", event.key.replace('.', "_"));
        assert_eq!(
            rule["expr"].as_str(),
            Some(format!("increase({counter}[{}]) >= {count}", window(within)).as_str()),
            "{name}"
        );
        assert!(
            rule.get("for").is_none(),
            "{name}: an increase() window needs no `for`"
        );
        let summary = rule["annotations"]["summary"].as_str().expect("summary");
        assert!(summary.starts_with(event.key), "{summary}");
        assert_eq!(
            rule["annotations"]["description"].as_str(),
            Some(event.help)
        );
        assert_eq!(rule["labels"]["event"].as_str(), Some(event.key));
        let severity = rule["labels"]["severity"].as_str().expect("severity");
        assert!(
            ["critical", "warning", "info"].contains(&severity),
            "{severity}"
        );
    }
    // Unmonitored events get no rule, but are named with their reason.
    for event in REGISTRY.iter().filter(|e| !alarmed.contains(e)) {
        assert!(
            out.stdout.contains(&format!("#   {}: ", event.key)),
            "{} is not listed as unmonitored",
            event.key
        );
    }
}

#[test]
fn the_counter_suffix_can_be_changed() {
    let out = bare_baton_run(&["alerts", "--counter-suffix", "", "--group", "coordination"]);
    out.assert_status(0);
    let doc: Value = serde_yaml::from_str(&out.stdout).expect("YAML");
    assert_eq!(doc["groups"][0]["name"].as_str(), Some("coordination"));
    let expr = doc["groups"][0]["rules"][0]["expr"].as_str().unwrap();
    assert!(
        expr.starts_with("increase(baton_") && !expr.contains("_total["),
        "{expr}"
    );
}

/// The markers around the generated event table in `docs/operations.md`.
const BEGIN: &str = "<!-- events:begin (generated from the registry by tests/alerts.rs) -->";
const END: &str = "<!-- events:end -->";

/// The event table, as `docs/operations.md` must have it.
fn event_table() -> String {
    let mut table =
        String::from("| event | counter | level | alarm | meaning |\n|---|---|---|---|---|\n");
    for event in REGISTRY {
        let alarm = match event.alarm {
            Alarm::AtLeast { count, within } => format!("≥ {count} in {}", window(within)),
            Alarm::Unmonitored { why } => format!("none: {why}"),
        };
        table.push_str(&format!(
            "| `{}` | `{}` | {} | {} | {} |\n",
            event.key,
            event.prometheus_counter(),
            event.level.as_str().to_ascii_lowercase(),
            alarm.replace('|', "\\|"),
            event.help.replace('|', "\\|"),
        ));
    }
    table
}

/// `docs/operations.md` lists every registered event, with its counter, level, alarm and
/// meaning, and nothing else. `BATON_UPDATE_DOCS=1` rewrites the table instead of failing.
#[test]
fn the_operations_guide_lists_every_event() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/operations.md");
    let doc = std::fs::read_to_string(path).expect("docs/operations.md");
    let (Some(begin), Some(end)) = (doc.find(BEGIN), doc.find(END)) else {
        panic!("docs/operations.md has no {BEGIN} ... {END} section");
    };
    let current = doc[begin + BEGIN.len()..end].trim_matches('\n');
    let expected = event_table();
    if current == expected.trim_end() {
        return;
    }
    if std::env::var_os("BATON_UPDATE_DOCS").is_some_and(|v| v == "1") {
        let updated = format!("{}{BEGIN}\n{expected}{}", &doc[..begin], &doc[end..]);
        std::fs::write(path, updated).expect("write docs/operations.md");
        return;
    }
    panic!(
        "the event table in docs/operations.md is not the registry's; run \
         `BATON_UPDATE_DOCS=1 cargo test -p baton-cli --test alerts` to regenerate it. \
         Expected:\n{expected}"
    );
}

fn bare_baton_run(args: &[&str]) -> Finished {
    let mut command = bare_baton();
    command.args(args);
    Running::spawn(command).finish()
}
