//! The observability contract: every event the source emits is registered, and every
//! registered event is emitted somewhere.
//!
//! Events are typed constants (`telemetry::events::NAME`), so an unregistered constant cannot
//! be emitted by accident; this test closes the remaining gaps by reading the workspace's
//! source: a constant declared but missing from `REGISTRY`, a registered event that nothing
//! emits, and an event-shaped string literal (`"baton.<area>.<what>"`) used outside the
//! registry.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use baton_core::telemetry::REGISTRY;

fn workspace_crates() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("crates/")
        .to_path_buf()
}

fn rust_sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `NAME -> key` for every `pub const NAME: Event = Event { key: "..."` in telemetry.rs.
fn declared_events(telemetry: &str) -> BTreeMap<String, String> {
    let mut declared = BTreeMap::new();
    let mut pending: Option<String> = None;
    for line in telemetry.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("pub const ") {
            if let Some((name, ty)) = rest.split_once(':')
                && ty.trim_start().starts_with("Event =")
            {
                pending = Some(name.trim().to_owned());
            }
        } else if let (Some(name), Some(rest)) = (&pending, line.strip_prefix("key: \"")) {
            let key = rest.split('"').next().unwrap_or_default().to_owned();
            declared.insert(name.clone(), key);
            pending = None;
        }
    }
    declared
}

/// Identifiers following `events::` in `text`.
fn referenced_events(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for (at, _) in text.match_indices("events::") {
        let name: String = text[at + "events::".len()..]
            .chars()
            .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
            .collect();
        if !name.is_empty() {
            found.insert(name);
        }
    }
    found
}

/// String literals shaped like event keys: `"baton.<a>.<b>"`.
fn event_shaped_literals(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for (at, _) in text.match_indices("\"baton.") {
        let body: String = text[at + 1..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || *c == '.' || *c == '_')
            .collect();
        let closes = text[at + 1 + body.len()..].starts_with('"');
        if closes && body.matches('.').count() >= 2 {
            found.insert(body);
        }
    }
    found
}

#[test]
fn every_emitted_event_is_registered_and_every_registered_event_is_emitted() {
    let crates = workspace_crates();
    let telemetry_path = crates.join("baton-core/src/telemetry.rs");
    let telemetry = fs::read_to_string(&telemetry_path).expect("read telemetry.rs");
    let declared = declared_events(&telemetry);
    let registered: BTreeSet<&str> = REGISTRY.iter().map(|e| e.key).collect();
    assert_eq!(
        declared
            .values()
            .map(String::as_str)
            .collect::<BTreeSet<_>>(),
        registered,
        "every declared event constant must be listed in REGISTRY, and only those"
    );
    assert_eq!(
        registered.len(),
        REGISTRY.len(),
        "REGISTRY lists a key twice"
    );

    let mut sources = Vec::new();
    rust_sources(&crates, &mut sources);
    let mut used = BTreeSet::new();
    let mut stray = Vec::new();
    for path in &sources {
        let this_test = path.ends_with("baton-core/tests/telemetry_contract.rs");
        if this_test
            || path == &telemetry_path
            || path.components().any(|c| c.as_os_str() == "target")
        {
            continue;
        }
        let text = fs::read_to_string(path).expect("read source");
        for name in referenced_events(&text) {
            assert!(
                declared.contains_key(&name),
                "{} uses events::{name}, which is not a registered event",
                path.display()
            );
            // Tests reference events to assert on them; only emits outside tests count.
            if !path.components().any(|c| c.as_os_str() == "tests") {
                used.insert(name);
            }
        }
        for literal in event_shaped_literals(&text) {
            if !registered.contains(literal.as_str())
                && !literal.starts_with("baton.lock.wait_seconds")
                && !literal.starts_with("baton.lock.hold_seconds")
            {
                stray.push(format!("{}: {literal}", path.display()));
            }
        }
    }
    let unused: Vec<_> = declared
        .keys()
        .filter(|name| !used.contains(*name))
        .collect();
    assert!(
        unused.is_empty(),
        "registered events that nothing emits: {unused:?}"
    );
    assert!(
        stray.is_empty(),
        "event-shaped keys that are not registered: {stray:?}"
    );
}

#[test]
fn the_scanner_sees_what_it_should() {
    let sample = "pub const FOO: Event = Event {\n    key: \"baton.foo.bar\",\n";
    assert_eq!(
        declared_events(sample).get("FOO").map(String::as_str),
        Some("baton.foo.bar")
    );
    assert!(referenced_events("emit(&events::LOCK_LOST, None").contains("LOCK_LOST"));
    assert!(event_shaped_literals("x(\"baton.a.b\")").contains("baton.a.b"));
    assert!(event_shaped_literals("\"baton.db\"").is_empty());
}
