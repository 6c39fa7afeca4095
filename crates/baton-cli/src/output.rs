//! How data is printed: aligned tables for people, one JSON document for programs.
//!
//! Data goes to stdout; diagnostics go to stderr. JSON durations are whole milliseconds in
//! fields named `*_ms`; table durations are rounded for reading (`27.5s`, `4m30s`).

use std::io::{self, Write};
use std::time::{Duration, SystemTime};

use serde::Serialize;

use crate::exit::{BROKEN_PIPE, Failure, INTERNAL};

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

/// With `--json`, prints `value` as JSON; otherwise prints `line`, for people.
pub(crate) fn print_json_or_line<T: Serialize>(
    json: bool,
    value: &T,
    line: &str,
) -> Result<(), Failure> {
    if json {
        print_json(value)
    } else {
        print_line(line)
    }
    .map_err(write_failure)
}

/// With `--json`, prints `rows` as one JSON array; otherwise prints their `cells` as a table
/// under `header`.
pub(crate) fn print_rows<R: Serialize>(
    json: bool,
    header: &[&str],
    rows: &[R],
    cells: impl Fn(&R) -> Vec<String>,
) -> Result<(), Failure> {
    if json {
        print_json(&rows)
    } else {
        print_table(header, &rows.iter().map(cells).collect::<Vec<_>>())
    }
    .map_err(write_failure)
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
