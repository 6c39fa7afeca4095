//! How data is printed: aligned tables for people, one JSON document for programs.
//!
//! Data goes to stdout; diagnostics go to stderr. JSON durations are whole milliseconds in
//! fields named `*_ms`; table durations are rounded for reading (`27.5s`, `4m30s`).
//!
//! Every command prints its data through [`Output`], which chooses between the two by
//! `--json`; a kind of row (a held lock, a live lease, a queue's counts) is defined once, as
//! a [`Row`], and printed by the list commands, the status commands and the status page
//! alike.

use std::io::{self, Write};
use std::time::{Duration, SystemTime};

use serde::Serialize;

use crate::exit::{BROKEN_PIPE, Failure, INTERNAL};

/// Prints one diagnostic line to stderr with a single write (the `say!` macro's body).
/// `eprintln!` writes each piece of its format separately, so a line could be cut by the
/// output of COMMAND, which shares stderr (`baton: lost the Terminated\nlock "job"`); one
/// write of a line this short is never interleaved with another process's. A failed write
/// is ignored, as `eprintln!` would have panicked on it with nowhere to report.
pub(crate) fn say(args: std::fmt::Arguments<'_>) {
    let mut line = args.to_string();
    line.push('\n');
    let _ = io::stderr().lock().write_all(line.as_bytes());
}

/// Where a command's data goes: lines and tables for people, or one JSON document on
/// stdout with `--json`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Output {
    json: bool,
}

impl Output {
    /// JSON when `json` (the `--json` option), else text.
    pub(crate) fn new(json: bool) -> Output {
        Output { json }
    }

    /// Whether data is printed as JSON.
    pub(crate) fn is_json(self) -> bool {
        self.json
    }

    /// One answer: `value` as JSON, or `text()` written as it is (several lines, or none).
    pub(crate) fn text<T: Serialize>(
        self,
        value: &T,
        text: impl FnOnce() -> String,
    ) -> Result<(), Failure> {
        if self.json {
            print_json(value)
        } else {
            io::stdout().lock().write_all(text().as_bytes())
        }
        .map_err(write_failure)
    }

    /// One answer: `value` as JSON, or `line()` on a line of its own.
    pub(crate) fn line<T: Serialize>(
        self,
        value: &T,
        line: impl FnOnce() -> String,
    ) -> Result<(), Failure> {
        self.text(value, || format!("{}\n", line()))
    }

    /// `rows` as one JSON array, or as a table under their header.
    pub(crate) fn rows<R: Row>(self, rows: &[R]) -> Result<(), Failure> {
        if self.json {
            print_json(&rows)
        } else {
            print_table(R::HEADER, &rows.iter().map(text_cells).collect::<Vec<_>>())
        }
        .map_err(write_failure)
    }

    /// One row: a JSON object, or a table of one row.
    pub(crate) fn row<R: Row>(self, row: &R) -> Result<(), Failure> {
        if self.json {
            print_json(row)
        } else {
            print_table(R::HEADER, &[text_cells(row)])
        }
        .map_err(write_failure)
    }

    /// What `lease status KEY` prints: `{"key", "held", ...fields}` as JSON; a table of one
    /// row, or `KEY: free`, for people. `permits`, the live permits of the semaphore of the
    /// same key, follow as a table, or as the `permits` array (left out when there are none).
    pub(crate) fn held<F: Fields, P: Row>(
        self,
        key: &str,
        held: Option<Keyed<F>>,
        permits: &[P],
    ) -> Result<(), Failure> {
        /// The permits, left out when there are none.
        #[derive(Serialize)]
        struct Permits<'a, P> {
            #[serde(skip_serializing_if = "<[P]>::is_empty")]
            permits: &'a [P],
        }
        self.held_with(key, held, &Permits { permits }, || {
            self.permits(key, permits)
        })
    }

    /// The live permits of semaphore `key` under a line that counts them, as `lock status`
    /// prints them after the lock; nothing when there are none.
    pub(crate) fn permits<P: Row>(self, key: &str, permits: &[P]) -> Result<(), Failure> {
        if permits.is_empty() {
            return Ok(());
        }
        print_line(&format!("semaphore {key}: {} permits held", permits.len()))
            .map_err(write_failure)?;
        self.rows(permits)
    }

    /// What `lock status KEY` prints: [`Output::held`] with `related` (what else of KEY is
    /// held) flattened into the JSON object after the fields, or printed by `related_text`
    /// after the row for people.
    pub(crate) fn held_with<F: Fields, X: Serialize>(
        self,
        key: &str,
        held: Option<Keyed<F>>,
        related: &X,
        related_text: impl FnOnce() -> Result<(), Failure>,
    ) -> Result<(), Failure> {
        /// `held`, and the fields when held.
        #[derive(Serialize)]
        struct Status<'a, F, X> {
            key: &'a str,
            held: bool,
            #[serde(flatten)]
            fields: Option<F>,
            #[serde(flatten)]
            related: &'a X,
        }
        match (self.json, held) {
            (true, held) => {
                return print_json(&Status {
                    key,
                    held: held.is_some(),
                    fields: held.map(|row| row.of),
                    related,
                })
                .map_err(write_failure);
            }
            (false, Some(row)) => self.row(&row)?,
            (false, None) => print_line(&format!("{key}: free")).map_err(write_failure)?,
        }
        related_text()
    }
}

/// How a cell reads on the status page: text, code (a holder), a key, or a number
/// (right-aligned). The terminal prints them all as text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Text,
    Code,
    Key,
    Number,
}

/// One cell of a row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Cell {
    pub(crate) text: String,
    pub(crate) kind: Kind,
}

impl Cell {
    pub(crate) fn new(kind: Kind, text: impl Into<String>) -> Cell {
        Cell {
            text: text.into(),
            kind,
        }
    }
}

/// A kind of row: its JSON (`Serialize`), its column titles and its cells, in one place.
pub(crate) trait Row: Serialize {
    /// The column titles as the terminal prints them (`KEY`, `OLDEST_DUE`); the status page
    /// writes them as words (`Key`, `Oldest due`).
    const HEADER: &'static [&'static str];
    /// The cells, one per title.
    fn cells(&self) -> Vec<Cell>;
}

/// The fields of something held under a key (a lock's holder, fence and remaining time),
/// as the part of a [`Keyed`] row after its key.
pub(crate) trait Fields: Serialize {
    /// The column titles of the whole row, `KEY` first.
    const HEADER: &'static [&'static str];
    /// The cells after the key's.
    fn cells(&self) -> Vec<Cell>;
}

/// A row of something held under a key: `key`, then its fields (flattened in JSON).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Keyed<F> {
    pub(crate) key: String,
    #[serde(flatten)]
    pub(crate) of: F,
}

impl<F: Fields> Row for Keyed<F> {
    const HEADER: &'static [&'static str] = F::HEADER;

    fn cells(&self) -> Vec<Cell> {
        let mut cells = vec![Cell::new(Kind::Key, self.key.clone())];
        cells.extend(self.of.cells());
        cells
    }
}

fn text_cells<R: Row>(row: &R) -> Vec<String> {
    row.cells().into_iter().map(|cell| cell.text).collect()
}

/// A column title as words, for a page: `OLDEST_DUE` → `Oldest due`.
pub(crate) fn title_words(title: &str) -> String {
    let lower = title.replace('_', " ").to_lowercase();
    let mut chars = lower.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// Prints `value` as one line of JSON on stdout.
pub(crate) fn print_json<T: Serialize>(value: &T) -> io::Result<()> {
    let mut out = io::stdout().lock();
    serde_json::to_writer(&mut out, value).map_err(io::Error::other)?;
    writeln!(out)
}

/// Prints one line on stdout.
pub(crate) fn print_line(line: &str) -> io::Result<()> {
    writeln!(io::stdout().lock(), "{line}")
}

/// The failure for output that could not be written.
///
/// A reader that closed the pipe (`baton lease list | head`) has all it wanted: the
/// command ends quietly with status 141, as if SIGPIPE had ended it the way it ends other
/// tools (Rust ignores SIGPIPE, so baton sees the error instead). Any other write error
/// is reported.
pub(crate) fn write_failure(error: io::Error) -> Failure {
    if error.kind() == io::ErrorKind::BrokenPipe {
        return Failure::quiet(BROKEN_PIPE);
    }
    Failure::new(INTERNAL, format!("cannot write to stdout: {error}"))
}

/// Prints `rows` under `header` with columns padded to their widest cell.
pub(crate) fn print_table(header: &[&str], rows: &[Vec<String>]) -> io::Result<()> {
    let mut out = io::stdout().lock();
    out.write_all(render_table(header, rows).as_bytes())
}

fn render_table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut text = String::new();
    let header: Vec<String> = header.iter().map(|h| (*h).to_owned()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let mut line = String::new();
        for (i, (cell, width)) in row.iter().zip(&widths).enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<width$}  "));
            }
        }
        text.push_str(line.trim_end());
        text.push('\n');
    }
    text
}

/// A duration rounded down for reading: `850ms`, `30s`, `27.5s`, `4m30s`, `5m`, `2h5m`,
/// `3d4h`.
pub(crate) fn human_duration(d: Duration) -> String {
    let ms = d.as_millis();
    let s = d.as_secs();
    match s {
        _ if ms < 1_000 => format!("{ms}ms"),
        0..60 if ms.is_multiple_of(1_000) => format!("{s}s"),
        0..60 => format!("{}.{}s", s, ms / 100 % 10),
        60..3_600 => two_units(s / 60, "m", s % 60, "s"),
        3_600..86_400 => two_units(s / 3_600, "h", s % 3_600 / 60, "m"),
        _ => two_units(s / 86_400, "d", s % 86_400 / 3_600, "h"),
    }
}

/// `4m30s`, or `4m` when the smaller unit is zero.
fn two_units(big: u64, big_unit: &str, small: u64, small_unit: &str) -> String {
    if small == 0 {
        format!("{big}{big_unit}")
    } else {
        format!("{big}{big_unit}{small}{small_unit}")
    }
}

/// A time in UTC as one token for a table cell: `2026-11-30T16:40:05Z` (whole seconds).
pub(crate) fn utc_token(at: SystemTime) -> String {
    // `ops::utc` writes `2026-11-30 16:40:05 UTC` for pages; a table cell wants no spaces.
    let text = crate::ops::utc(at);
    match text.strip_suffix(" UTC") {
        Some(time) => format!("{}Z", time.replacen(' ', "T", 1)),
        None => text,
    }
}

/// A duration as whole milliseconds, for JSON.
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_well() {
        let ms = Duration::from_millis;
        assert_eq!(human_duration(ms(0)), "0ms");
        assert_eq!(human_duration(ms(850)), "850ms");
        assert_eq!(human_duration(ms(27_500)), "27.5s");
        assert_eq!(human_duration(ms(30_000)), "30s");
        assert_eq!(human_duration(ms(59_999)), "59.9s");
        assert_eq!(human_duration(ms(270_000)), "4m30s");
        assert_eq!(human_duration(ms(300_000)), "5m");
        assert_eq!(human_duration(ms(3_600_000)), "1h");
        assert_eq!(human_duration(ms(7_500_000)), "2h5m");
        assert_eq!(human_duration(ms(273_600_000)), "3d4h");
    }

    #[test]
    fn times_are_one_token() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_057_405);
        assert_eq!(utc_token(at), "2026-11-30T16:50:05Z");
    }

    #[test]
    fn titles_read_as_words() {
        assert_eq!(title_words("OLDEST_DUE"), "Oldest due");
        assert_eq!(title_words("KEY"), "Key");
    }

    #[test]
    fn tables_align() {
        let rows = vec![
            vec!["a".to_owned(), "holder-1".to_owned(), "7".to_owned()],
            vec!["longer-key".to_owned(), "h".to_owned(), "12".to_owned()],
        ];
        assert_eq!(
            render_table(&["KEY", "HOLDER", "FENCE"], &rows),
            "KEY         HOLDER    FENCE\n\
             a           holder-1  7\n\
             longer-key  h         12\n"
        );
    }
}
