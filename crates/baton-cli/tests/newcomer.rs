//! A newcomer's test: every command README.md and docs/cli.md show is run, in order, as a
//! newcomer would paste it, and must exit as documented, so the documented commands keep
//! working.
//!
//! What runs: every line of a ```sh block (comments and blank lines aside; a crontab line
//! runs its command), and every `$ ` line of a transcript block. The commands run with `sh`
//! in a scratch directory that is also their `$HOME`, so the default store is a fresh file
//! there; `baton` on `PATH` is the binary under test, and `cargo run -q -p baton-cli --`
//! stands for it. The programs the examples hand to baton as COMMAND (`./report.sh`,
//! `pg_dump`, `/app/sync`, ...) are stand-ins that read their input and exit 0, and the
//! absolute paths the examples name (`/backups`, `/var/lib/baton`) are moved under the
//! scratch directory. A `baton worker` without `--exit-when-empty` serves until stopped: it
//! must still be running after a moment, then exit 0 on SIGTERM. `./scripts/test` is the
//! suite itself: instead of running it, the test checks that CI runs it.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// Longest one documented command may take.
const TIMEOUT: Duration = Duration::from_secs(60);
/// How long a serving command must keep running before it is stopped.
const SERVING: Duration = Duration::from_secs(2);

/// The programs the examples give baton as COMMAND, or call inside it.
const STAND_INS: &[&str] = &[
    "report.sh",
    "reindex",
    "hourly-report.sh",
    "invoices.sh",
    "send-email",
    "send-email.sh",
    "scheduler",
    "pg_dump",
    "jq",
];

/// Absolute paths the examples name, moved under the scratch directory.
const MOVED_ROOTS: &[&str] = &["/app/", "/backups/", "/var/lib/baton/"];

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The commands of `file`'s examples, with the line each starts on.
fn documented_commands(file: &str) -> Vec<(usize, String)> {
    let text = fs::read_to_string(repository().join(file)).expect(file);
    let mut commands = Vec::new();
    let mut block: Option<String> = None;
    for (n, line) in text.lines().enumerate() {
        let line_no = n + 1;
        if let Some(rest) = line.strip_prefix("```") {
            block = match block {
                Some(_) => None,
                None => Some(rest.trim().to_owned()),
            };
            continue;
        }
        let Some(kind) = &block else { continue };
        let command = match kind.as_str() {
            "sh" => {
                let line = line.trim();
                if line.is_empty() || line.starts_with('#') {
                    continue;
                }
                cron_command(line).unwrap_or(line).to_owned()
            }
            // A transcript: `$ COMMAND`, then its output.
            "" | "text" | "console" => match line.strip_prefix("$ ") {
                Some(command) => command.to_owned(),
                None => continue,
            },
            _ => continue,
        };
        commands.push((line_no, command));
    }
    commands
}

/// The command of a crontab line (`0 2 * * *  baton run ...`), if `line` is one.
fn cron_command(line: &str) -> Option<&str> {
    let mut rest = line;
    for _ in 0..5 {
        let field_end = rest.find(char::is_whitespace)?;
        let field = &rest[..field_end];
        if !field
            .chars()
            .all(|c| c.is_ascii_digit() || "*/,-".contains(c))
        {
            return None;
        }
        rest = rest[field_end..].trim_start();
    }
    Some(rest)
}

/// The scratch directory: stand-ins, `baton` on PATH, the moved roots.
struct Scratch {
    dir: tempfile::TempDir,
    bin: PathBuf,
}

impl Scratch {
    fn new() -> Scratch {
        let dir = tempfile::Builder::new()
            .prefix("baton-newcomer-")
            .tempdir()
            .expect("temp dir");
        let bin = dir.path().join("bin");
        fs::create_dir_all(&bin).unwrap();
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_baton"), bin.join("baton")).unwrap();
        let stand_in = "#!/bin/sh\ncat > /dev/null\nexit 0\n";
        let mut places: Vec<PathBuf> = STAND_INS
            .iter()
            .flat_map(|name| [bin.join(name), dir.path().join(name)])
            .collect();
        places.push(dir.path().join("app/sync"));
        for place in places {
            fs::create_dir_all(place.parent().unwrap()).unwrap();
            fs::write(&place, stand_in).unwrap();
            fs::set_permissions(&place, fs::Permissions::from_mode(0o755)).unwrap();
        }
        for root in MOVED_ROOTS {
            fs::create_dir_all(dir.path().join(root.trim_matches('/'))).unwrap();
        }
        Scratch { dir, bin }
    }

    /// `command` as it runs here: baton for `cargo run`, the moved roots under the scratch
    /// directory.
    fn localize(&self, command: &str) -> String {
        let mut command = command.replace("cargo run -q -p baton-cli --", "baton");
        let root = self.dir.path().display().to_string();
        for moved in MOVED_ROOTS {
            command = command.replace(moved, &format!("{root}{moved}"));
        }
        command
    }

    fn spawn(&self, command: &str) -> Child {
        let path = format!(
            "{}:{}",
            self.bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut shell = Command::new("sh");
        shell
            .arg("-c")
            .arg(command)
            .current_dir(self.dir.path())
            .env("PATH", path)
            .env("HOME", self.dir.path())
            .env_remove("XDG_STATE_HOME")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("BATON_") {
                shell.env_remove(name);
            }
        }
        shell.spawn().expect("sh")
    }
}

/// Waits for `child` up to `limit`; `None` when it is still running.
fn wait_for(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

fn output_of(child: Child) -> String {
    let out = child.wait_with_output().expect("output");
    format!(
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn serves_until_stopped(command: &str) -> bool {
    command.contains("baton worker") && !command.contains("--exit-when-empty")
}

fn run_documented(file: &str) -> usize {
    let scratch = Scratch::new();
    let mut ran = 0;
    for (line, command) in documented_commands(file) {
        if command == "./scripts/test" {
            continue;
        }
        let serving = serves_until_stopped(&command);
        let local = scratch.localize(&command);
        // A serving command is stopped by a signal to baton itself, so the shell gives it its
        // own process.
        let local = if serving {
            format!("exec {local}")
        } else {
            local
        };
        let mut child = scratch.spawn(&local);
        if serving {
            assert!(
                wait_for(&mut child, SERVING).is_none(),
                "{file}:{line}: `{command}` should serve until stopped, but exited: {}",
                output_of(child)
            );
            kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
        }
        let status = wait_for(&mut child, TIMEOUT);
        let Some(status) = status else {
            let _ = child.kill();
            panic!("{file}:{line}: `{command}` did not finish within {TIMEOUT:?}");
        };
        let code = status.code();
        assert!(
            code == Some(0),
            "{file}:{line}: `{command}` exited {code:?}, documented to succeed\n{}",
            output_of(child)
        );
        ran += 1;
    }
    ran
}

#[test]
fn the_readme_s_commands_work_as_shown() {
    let ran = run_documented("README.md");
    // The main job and the command line tour; a README without them says nothing runnable.
    assert!(ran >= 2, "README.md: only {ran} commands ran");
    let commands = documented_commands("README.md");
    assert!(
        commands.iter().any(|(_, c)| c == "./scripts/test"),
        "README.md no longer names ./scripts/test"
    );
    let ci = fs::read_to_string(repository().join(".ci/run")).expect(".ci/run");
    assert!(
        ci.lines().any(|l| l.trim() == "exec ./scripts/test"),
        ".ci/run must run the README's test command, ./scripts/test"
    );
}

#[test]
fn the_cli_guide_s_commands_work_as_shown() {
    let ran = run_documented("docs/cli.md");
    assert!(ran >= 20, "docs/cli.md: only {ran} commands ran");
}

#[test]
fn crontab_lines_run_their_command() {
    assert_eq!(
        cron_command("0 2 * * *  baton run x -- y"),
        Some("baton run x -- y")
    );
    assert_eq!(cron_command("*/5 * * * * true"), Some("true"));
    assert_eq!(cron_command("baton run x -- y"), None);
}
