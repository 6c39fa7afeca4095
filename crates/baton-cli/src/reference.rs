//! docs/cli.md's reference blocks, generated from the grammar, so that the help and the
//! guide cannot drift apart.
//!
//! Every command (`baton run`, `baton lease claim`, ...) has one block in docs/cli.md,
//!
//! ```text
//! <!-- reference: baton run -->
//! ...its usage line and a table of its options, rendered from the clap definitions...
//! <!-- end reference -->
//! ```
//!
//! and the test below fails when a block differs from what the grammar renders, when a
//! command has no block, or when a block names no command. Run it with `BATON_BLESS=1` to
//! rewrite the blocks after changing the grammar (the prose around them is left alone).

use std::fmt::Write as _;
use std::path::Path;

use clap::{Arg, ArgAction, Command, CommandFactory};

use crate::cli::Cli;

const BEGIN: &str = "<!-- reference: ";
const END: &str = "<!-- end reference -->";

/// Every command with its path (`baton`, `baton lease claim`), depth first, the command
/// groups (`baton lease`) left out: they have no options of their own.
fn commands() -> Vec<(String, Command)> {
    fn walk(path: &str, command: &Command, out: &mut Vec<(String, Command)>) {
        let mut leaves = command
            .get_subcommands()
            .filter(|sub| sub.get_name() != "help")
            .peekable();
        if leaves.peek().is_none() || path == "baton" {
            out.push((path.to_owned(), command.clone()));
        }
        for sub in leaves {
            walk(&format!("{path} {}", sub.get_name()), sub, out);
        }
    }
    let mut command = Cli::command();
    command.build();
    let mut out = Vec::new();
    walk("baton", &command, &mut out);
    out
}

/// The block of one command: its usage and its options (the global options for `baton`).
fn render(path: &str, command: &Command) -> String {
    let mut text = String::new();
    let top = path == "baton";
    if !top {
        let usage = command.clone().render_usage().to_string();
        let usage = usage.trim_start_matches("Usage: ").trim();
        let _ = writeln!(
            text,
            "```text\n{}\n```\n",
            usage.replace("<", "").replace(">", "")
        );
    }
    let args: Vec<&Arg> = command
        .get_arguments()
        .filter(|arg| !arg.is_hide_set())
        .filter(|arg| !matches!(arg.get_action(), ArgAction::Help | ArgAction::Version))
        .filter(|arg| arg.is_global_set() == top)
        .collect();
    let options: Vec<&&Arg> = args.iter().filter(|arg| !arg.is_positional()).collect();
    let positionals: Vec<&&Arg> = args.iter().filter(|arg| arg.is_positional()).collect();
    if !positionals.is_empty() {
        text.push_str("| argument | what |\n|---|---|\n");
        for arg in positionals {
            let name = value_name(arg);
            let _ = writeln!(text, "| `{name}` | {} |", help(arg));
        }
        text.push('\n');
    }
    if !options.is_empty() {
        text.push_str("| option | environment | default | what |\n|---|---|---|---|\n");
        for arg in options {
            let long = arg.get_long().map(|l| format!("--{l}")).unwrap_or_default();
            let flag = if arg.get_action().takes_values() {
                format!("`{long} {}`", value_name(arg))
            } else {
                format!("`{long}`")
            };
            let env = arg
                .get_env()
                .map(|e| format!("`{}`", e.to_string_lossy()))
                .unwrap_or_default();
            let defaults: Vec<String> = arg
                .get_default_values()
                .iter()
                .map(|v| v.to_string_lossy().into_owned())
                .filter(|v| !v.is_empty() && arg.get_action().takes_values())
                .map(|v| format!("`{v}`"))
                .collect();
            let _ = writeln!(
                text,
                "| {flag} | {env} | {} | {} |",
                defaults.join(", "),
                help(arg)
            );
        }
        text.push('\n');
    }
    text
}

fn value_name(arg: &Arg) -> String {
    arg.get_value_names()
        .map(|names| names.join(" "))
        .unwrap_or_else(|| arg.get_id().to_string().to_uppercase())
}

/// An argument's help as one table cell: its long help, lines joined, pipes escaped.
fn help(arg: &Arg) -> String {
    let help = arg
        .get_long_help()
        .or_else(|| arg.get_help())
        .map(|h| h.to_string())
        .unwrap_or_default();
    let mut cell = help.split_whitespace().collect::<Vec<_>>().join(" ");
    if !cell.is_empty() && !cell.ends_with(['.', ']', ')']) {
        cell.push('.');
    }
    let values: Vec<String> = arg
        .get_possible_values()
        .iter()
        .filter(|v| !v.is_hide_set())
        .map(|v| format!("`{}`", v.get_name()))
        .collect();
    if !values.is_empty() && arg.get_action().takes_values() {
        let _ = write!(cell, " One of {}.", values.join(", "));
    }
    cell.replace('|', "\\|")
}

/// `text` with every block replaced by what the grammar renders; the paths of the blocks
/// found, in order.
fn regenerate(text: &str, blocks: &[(String, String)]) -> Result<(String, Vec<String>), String> {
    let mut out = String::with_capacity(text.len());
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(BEGIN) {
        let header_end = rest[start..]
            .find("-->")
            .map(|i| start + i + 3)
            .ok_or("an unterminated reference marker")?;
        let path = rest[start + BEGIN.len()..header_end - 3].trim().to_owned();
        let end = rest[header_end..]
            .find(END)
            .map(|i| header_end + i)
            .ok_or_else(|| format!("the reference block of {path:?} has no end marker"))?;
        let body = blocks
            .iter()
            .find(|(p, _)| *p == path)
            .map(|(_, body)| body)
            .ok_or_else(|| {
                format!("docs/cli.md has a reference block for {path:?}, which is no command")
            })?;
        out.push_str(&rest[..header_end]);
        out.push_str("\n\n");
        out.push_str(body);
        found.push(path);
        rest = &rest[end..];
    }
    out.push_str(rest);
    Ok((out, found))
}

#[test]
fn docs_cli_md_has_the_grammar_s_reference_of_every_command() {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/cli.md");
    let text = std::fs::read_to_string(&file).expect("docs/cli.md");
    let blocks: Vec<(String, String)> = commands()
        .iter()
        .map(|(path, command)| (path.clone(), render(path, command)))
        .collect();
    let (regenerated, found) = regenerate(&text, &blocks).unwrap();
    if std::env::var_os("BATON_BLESS").is_some() {
        std::fs::write(&file, &regenerated).expect("write docs/cli.md");
    }
    let missing: Vec<&String> = blocks
        .iter()
        .map(|(path, _)| path)
        .filter(|path| !found.contains(path))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/cli.md has no reference block for {missing:?}: add `{BEGIN}PATH -->` and `{END}` where the command is described, then run `BATON_BLESS=1 cargo test -p baton-cli reference`"
    );
    let mut seen = found.clone();
    seen.sort();
    seen.dedup();
    assert_eq!(
        seen.len(),
        found.len(),
        "a command has two reference blocks: {found:?}"
    );
    assert!(
        regenerated == text,
        "docs/cli.md's reference blocks differ from the grammar (clap's help): run `BATON_BLESS=1 cargo test -p baton-cli reference` and review the diff"
    );
}

#[test]
fn every_option_docs_cli_md_names_exists() {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/cli.md");
    let text = std::fs::read_to_string(&file).expect("docs/cli.md");
    let mut longs: Vec<String> = vec!["--help".into(), "--version".into()];
    for (_, command) in commands() {
        for arg in command.get_arguments() {
            if let Some(long) = arg.get_long() {
                longs.push(format!("--{long}"));
            }
        }
    }
    // `--` followed by a lowercase word, as an option is written; the options of other
    // programs in the examples (COMMAND's, cargo's) are listed here as what they are.
    let others = ["--full", "--dry-run", "--path"];
    let mut unknown = Vec::new();
    for (i, _) in text.match_indices("--") {
        let word: String = text[i + 2..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-')
            .collect();
        let before = text[..i].chars().next_back();
        let starts_a_word = word.starts_with(|c: char| c.is_ascii_lowercase());
        if !starts_a_word || before.is_some_and(|c| c.is_alphanumeric() || c == '-') {
            continue;
        }
        let option = format!("--{word}");
        if !longs.contains(&option) && !others.contains(&option.as_str()) {
            unknown.push(option);
        }
    }
    unknown.sort();
    unknown.dedup();
    assert!(
        unknown.is_empty(),
        "docs/cli.md names options no command has: {unknown:?}"
    );
}

#[test]
fn every_command_is_found() {
    let paths: Vec<String> = commands().into_iter().map(|(path, _)| path).collect();
    for path in [
        "baton",
        "baton run",
        "baton lease claim",
        "baton doctor",
        "baton worker",
    ] {
        assert!(paths.iter().any(|p| p == path), "{path} in {paths:?}");
    }
    assert!(!paths.iter().any(|p| p == "baton lease"), "{paths:?}");
}
