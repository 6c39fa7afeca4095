//! `baton status --listen ADDR`: a read-only web page of held locks and leases and of this
//! process's recent events, reloading itself, and the same data as JSON.
//!
//! | path | what |
//! |---|---|
//! | `/` | the page: locks (key, holder, fence, remaining), leases (the same and the reason), semaphores (key, holders/N, each holder's fence and remaining time) and reader-writer locks (key, writer, its fence, readers) for stores that keep semaphores, elections (name, leader, value, term, remaining), queues (for stores with claimable work), recent events; `<meta http-equiv="refresh">` reloads it every `--refresh` |
//! | `/status.json` | the same snapshot as one JSON document |
//!
//! The page has no script at all (its content security policy forbids any) and loads
//! nothing from elsewhere: the style sheet is embedded. Every value from the store is HTML
//! escaped. The store is listed at most once per [`SNAPSHOT_TTL`], however many clients
//! poll.
//!
//! Recent events are the last ones *this* process emitted ([`baton::telemetry::recent_events`]),
//! such as its own store connection losing Redis pub/sub; events of other processes are in
//! their logs and metrics.
//!
//! Semaphores and reader-writer locks: for a store that keeps semaphores (every store the CLI
//! opens today), the snapshot has `semaphores` and `rwlocks` sections, the same rows as
//! `baton lock status` shows; a store without them has neither field, and the page neither
//! section, as for queues below. A semaphore's N is the one its most recent grant was claimed
//! with (`?` when that permit was granted by a baton that did not record it): N belongs to
//! each client, so clients that disagree show the latest one's. A reader-writer lock's writer
//! is its gate's holder while a write permit is live; a gate held without one is shown as
//! `(gate: HOLDER)`, a writer waiting for its readers to leave (or, for a moment, a reader on
//! its way in). `--limit` counts keys: a listed semaphore has all its holders.
//!
//! Elections: every store keeps them; one row per election with a leader.
//!
//! Queues: for a store with claimable work (`sqlite://`, `postgres://`, `memory://`) the
//! snapshot has a `queues` section — one row per queue with items (ready, scheduled,
//! running, expired, dead, oldest due), the same rows as `baton queue stats --json` — shown
//! between the leases and the events. A store without claimable work (Redis) has no
//! `queues` field at all, and the page no section, so a missing section means "this store
//! keeps no queues", never "the queues are empty".

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use baton::election::{Election, Leader};
use baton::lease::LeaseInfo;
use baton::rwlock::{RwLock, RwLockInfo};
use baton::semaphore::{Semaphore, SemaphoreInfo};
use baton::store::HolderInfo;
use baton::telemetry::{self, Alarm, RecentEvent};
use clap::Args;
use serde::Serialize;
use tokio::sync::Mutex;

use super::LazyStore;
use super::alerts::prometheus_duration;
use super::http;
use super::{serve_at, unix_ms, utc};
use crate::args::{self, DEFAULT_LIST_LIMIT};
use crate::cli::GlobalArgs;
use crate::exit::Failure;
use crate::lease_cmd::{LeaseRow, lease_row};
use crate::lock_cmd::{
    ElectionRow, LockRow, RwLockRow, SemaphoreRow, election_row, lock_row, rwlock_row,
    semaphore_row,
};
use crate::output::{Kind, Row, millis, title_words};
use crate::queue_cmd::{StatsRow, list_queues, url_keeps_work};

/// How long one listing of the store serves every request.
pub(crate) const SNAPSHOT_TTL: Duration = Duration::from_secs(1);

/// The embedded style sheet.
const STYLE: &str = include_str!("../../assets/status.css");

/// `baton status`.
#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    /// Where to listen: IP:PORT (127.0.0.1:8080; port 0 picks a free one). The page shows
    /// key names and holders: bind to loopback unless others should see them.
    #[arg(long, value_name = "ADDR", value_parser = args::listen)]
    pub(crate) listen: SocketAddr,

    /// How often the page reloads itself: whole seconds, 1s to 1h.
    #[arg(long, value_name = "DUR", default_value = "5s", value_parser = args::refresh)]
    pub(crate) refresh: Duration,

    /// Only keys that start with this prefix.
    #[arg(long, value_name = "P", default_value = "", value_parser = args::prefix)]
    pub(crate) prefix: String,

    /// At most this many locks, leases, semaphores, reader-writer locks, elections and
    /// queues (each).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_LIST_LIMIT)]
    pub(crate) limit: usize,
}

/// One recent event.
#[derive(Debug, Clone, Serialize)]
struct EventRow {
    seq: u64,
    at_unix_ms: u64,
    level: String,
    event: &'static str,
    key: String,
    detail: String,
    alarm: String,
    help: &'static str,
}

/// What the page and `/status.json` show.
#[derive(Debug, Clone, Serialize)]
struct Snapshot {
    store: String,
    namespace: String,
    prefix: String,
    pid: u32,
    generated_at_unix_ms: u64,
    refresh_ms: u64,
    /// Why the store could not be listed, when it could not.
    store_error: Option<String>,
    locks: Vec<LockRow>,
    /// `locks` stopped at `--limit`.
    locks_truncated: bool,
    leases: Vec<LeaseRow>,
    /// `leases` stopped at `--limit`.
    leases_truncated: bool,
    /// The semaphores with live permits, for a store that keeps semaphores; absent for the
    /// others.
    #[serde(skip_serializing_if = "Option::is_none")]
    semaphores: Option<Vec<SemaphoreRow>>,
    /// `semaphores` stopped at `--limit`; absent with `semaphores`.
    #[serde(skip_serializing_if = "Option::is_none")]
    semaphores_truncated: Option<bool>,
    /// The held reader-writer locks, for a store that keeps semaphores; absent for the
    /// others.
    #[serde(skip_serializing_if = "Option::is_none")]
    rwlocks: Option<Vec<RwLockRow>>,
    /// `rwlocks` stopped at `--limit`; absent with `rwlocks`.
    #[serde(skip_serializing_if = "Option::is_none")]
    rwlocks_truncated: Option<bool>,
    /// The elections with a leader.
    elections: Vec<ElectionRow>,
    /// `elections` stopped at `--limit`.
    elections_truncated: bool,
    /// The queues with items, for a store with claimable work; absent for the others.
    #[serde(skip_serializing_if = "Option::is_none")]
    queues: Option<Vec<StatsRow>>,
    /// `queues` stopped at `--limit`; absent with `queues`.
    #[serde(skip_serializing_if = "Option::is_none")]
    queues_truncated: Option<bool>,
    /// This process's recent events, newest first.
    events: Vec<EventRow>,
}

struct Page {
    store: LazyStore,
    refresh: Duration,
    prefix: String,
    limit: usize,
    cached: Mutex<Option<(Instant, Arc<Snapshot>)>>,
}

/// Runs `baton status` until SIGINT or SIGTERM.
pub(crate) async fn run(global: &GlobalArgs, args: &StatusArgs) -> Result<u8, Failure> {
    if !args.prefix.is_empty() {
        baton::Key::new(&args.prefix)
            .map_err(|e| Failure::usage(format!("--prefix {:?}: {}", args.prefix, e.message())))?;
    }
    let page = Arc::new(Page {
        store: LazyStore::open(global).await?,
        refresh: args.refresh,
        prefix: args.prefix.clone(),
        limit: args.limit,
        cached: Mutex::new(None),
    });
    let announce = |local| say!("baton status: serving http://{local}/ (JSON at /status.json)");
    let router = Router::new()
        .route("/", get(page_html))
        .route("/index.html", get(page_html))
        .route("/status.json", get(page_json))
        .fallback(|| async { http::not_found(&["/", "/status.json"]) })
        .with_state(page);
    serve_at(args.listen, announce, router).await
}

async fn page_html(State(page): State<Arc<Page>>) -> Html<String> {
    Html(render(&*page.snapshot().await))
}

async fn page_json(State(page): State<Arc<Page>>) -> Response {
    match serde_json::to_vec(&*page.snapshot().await) {
        Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response(),
    }
}

impl Page {
    /// The current snapshot, listing the store at most once per [`SNAPSHOT_TTL`].
    async fn snapshot(&self) -> Arc<Snapshot> {
        let mut cached = self.cached.lock().await;
        if let Some((taken, snapshot)) = cached.as_ref()
            && taken.elapsed() < SNAPSHOT_TTL
        {
            return Arc::clone(snapshot);
        }
        let snapshot = Arc::new(self.take().await);
        *cached = Some((Instant::now(), Arc::clone(&snapshot)));
        snapshot
    }

    async fn take(&self) -> Snapshot {
        let listed = async {
            let baton = self.store.get().await?;
            // One more than shown, to know whether there are more.
            let ask = self.limit.saturating_add(1);
            let (prefix, namespace) = (self.prefix.as_str(), baton.namespace());
            let locks = baton.locks().list(prefix, ask).await?;
            let leases = baton.leases().list(prefix, ask).await?;
            let lease_store = baton.locks().store();
            // Only a store that keeps semaphores has semaphores and reader-writer locks.
            let (semaphores, rwlocks) = match Arc::clone(baton.store()).semaphore_store() {
                Ok(store) => (
                    Some(Semaphore::list(&*store, namespace, prefix, ask).await?),
                    Some(RwLock::list(&**lease_store, &*store, namespace, prefix, ask).await?),
                ),
                Err(_) => (None, None),
            };
            let elections = Election::list(&**lease_store, namespace, prefix, ask).await?;
            // Only a store with claimable work has queues.
            let queues = match baton.work_store() {
                Ok(store) => Some(list_queues(&baton, &store, prefix).await?),
                Err(_) => None,
            };
            Ok::<_, baton::Error>(Listed {
                locks,
                leases,
                semaphores,
                rwlocks,
                elections,
                queues,
            })
        }
        .await;
        let (listed, store_error) = match listed {
            Ok(listed) => (listed, None),
            Err(e) => {
                // Unreachable now, but the sections stay for a store that keeps them (every
                // store the CLI opens keeps semaphores).
                let queues = url_keeps_work(&self.store.display_url()).then(Vec::new);
                let listed = Listed {
                    locks: Vec::new(),
                    leases: Vec::new(),
                    semaphores: Some(Vec::new()),
                    rwlocks: Some(Vec::new()),
                    elections: Vec::new(),
                    queues,
                };
                (listed, Some(e.to_string()))
            }
        };
        let limit = self.limit;
        let (locks, locks_truncated) = cut(listed.locks, limit);
        let (leases, leases_truncated) = cut(listed.leases, limit);
        let (elections, elections_truncated) = cut(listed.elections, limit);
        let (semaphores, semaphores_truncated) = cut_some(listed.semaphores, limit);
        let (rwlocks, rwlocks_truncated) = cut_some(listed.rwlocks, limit);
        let (queues, queues_truncated) = cut_some(listed.queues, limit);
        Snapshot {
            store: self.store.display_url(),
            namespace: self.store.namespace().to_owned(),
            prefix: self.prefix.clone(),
            pid: std::process::id(),
            generated_at_unix_ms: unix_ms(SystemTime::now()),
            refresh_ms: millis(self.refresh),
            store_error,
            locks_truncated,
            leases_truncated,
            locks: locks.into_iter().map(lock_row).collect(),
            leases: leases.into_iter().map(lease_row).collect(),
            semaphores: semaphores.map(|s| s.into_iter().map(semaphore_row).collect()),
            semaphores_truncated,
            rwlocks: rwlocks.map(|r| r.into_iter().map(rwlock_row).collect()),
            rwlocks_truncated,
            elections: elections.into_iter().map(election_row).collect(),
            elections_truncated,
            queues,
            queues_truncated,
            events: telemetry::recent_events()
                .into_iter()
                .rev()
                .map(event_row)
                .collect(),
        }
    }
}

/// What one listing of the store found, before `--limit` is applied.
struct Listed {
    locks: Vec<HolderInfo>,
    leases: Vec<LeaseInfo>,
    semaphores: Option<Vec<SemaphoreInfo>>,
    rwlocks: Option<Vec<RwLockInfo>>,
    elections: Vec<(String, Leader)>,
    queues: Option<Vec<StatsRow>>,
}

/// The first `limit` of `rows` (listed with one more), and whether there were more.
fn cut<T>(mut rows: Vec<T>, limit: usize) -> (Vec<T>, bool) {
    let truncated = rows.len() > limit;
    rows.truncate(limit);
    (rows, truncated)
}

/// [`cut`] of a section that only some stores have.
fn cut_some<T>(rows: Option<Vec<T>>, limit: usize) -> (Option<Vec<T>>, Option<bool>) {
    match rows {
        Some(rows) => {
            let (rows, truncated) = cut(rows, limit);
            (Some(rows), Some(truncated))
        }
        None => (None, None),
    }
}

fn event_row(recent: RecentEvent) -> EventRow {
    let event = recent.event;
    EventRow {
        seq: recent.seq,
        at_unix_ms: unix_ms(recent.at),
        level: event.level.to_string().to_ascii_lowercase(),
        event: event.key,
        key: recent.key,
        detail: recent.detail,
        alarm: match event.alarm {
            Alarm::AtLeast { count, within } => {
                format!("alerts at {count} in {}", prometheus_duration(within))
            }
            Alarm::Unmonitored { .. } => "unmonitored".to_owned(),
        },
        help: event.help,
    }
}

/// Escapes text for HTML element content and attribute values.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The page.
fn render(s: &Snapshot) -> String {
    let at = SystemTime::UNIX_EPOCH + Duration::from_millis(s.generated_at_unix_ms);
    let refresh = s.refresh_ms / 1000;
    let mut html = String::with_capacity(8 * 1024);
    let _ = write!(
        html,
        "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta http-equiv=\"refresh\" content=\"{refresh}\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>baton status: {ns}</title>\n<style>\n{STYLE}</style>\n</head>\n<body>\n",
        ns = escape(&s.namespace)
    );
    let _ = write!(
        html,
        "<header>\n<h1><span class=\"dot{down}\"></span>baton status</h1>\n\
         <p class=\"meta\">store <code>{store}</code> · namespace <code>{ns}</code>{prefix} · \
         updated {at} · reloads every {refresh}s · <a href=\"/status.json\">JSON</a></p>\n</header>\n",
        down = if s.store_error.is_some() { " down" } else { "" },
        store = escape(&s.store),
        ns = escape(&s.namespace),
        prefix = if s.prefix.is_empty() {
            String::new()
        } else {
            format!(" · prefix <code>{}</code>", escape(&s.prefix))
        },
        at = utc(at),
    );
    if let Some(error) = &s.store_error {
        let _ = writeln!(
            html,
            "<div class=\"banner\"><strong>The store could not be listed.</strong> {}</div>",
            escape(error)
        );
    }
    let queued = s.queues.as_ref().map_or_else(String::new, |queues| {
        let items: u64 = queues
            .iter()
            .map(|q| q.ready + q.scheduled + q.running + q.expired)
            .sum();
        tile_u64(items, s.queues_truncated.unwrap_or(false), "items queued")
    });
    let permits = s
        .semaphores
        .as_ref()
        .map_or_else(String::new, |semaphores| {
            let held: usize = semaphores.iter().map(|s| s.of.holders).sum();
            tile(
                held,
                s.semaphores_truncated.unwrap_or(false),
                "semaphore permits held",
            )
        });
    let _ = write!(
        html,
        "<div class=\"summary\">\n{}{}{permits}{}{queued}{}</div>\n",
        tile(s.locks.len(), s.locks_truncated, "locks held"),
        tile(s.leases.len(), s.leases_truncated, "leases held"),
        tile(s.elections.len(), s.elections_truncated, "elections led"),
        tile(s.events.len(), false, "recent events"),
    );

    Section {
        heading: "Locks".to_owned(),
        empty: "No lock is held.",
        head: row_head::<LockRow>(),
        rows: s.locks.iter().map(row_tr).collect(),
        cut: s.locks_truncated.then_some("locks"),
    }
    .render(&mut html);
    Section {
        heading: "Leases".to_owned(),
        empty: "No lease is held.",
        head: row_head::<LeaseRow>(),
        rows: s.leases.iter().map(row_tr).collect(),
        cut: s.leases_truncated.then_some("leases"),
    }
    .render(&mut html);

    if let Some(semaphores) = &s.semaphores {
        Section {
            heading: "Semaphores".to_owned(),
            empty: "No semaphore permit is held.",
            head: row_head::<SemaphoreRow>(),
            rows: semaphores.iter().map(row_tr).collect(),
            cut: s
                .semaphores_truncated
                .unwrap_or(false)
                .then_some("semaphores"),
        }
        .render(&mut html);
    }
    if let Some(rwlocks) = &s.rwlocks {
        Section {
            heading: "Reader-writer locks".to_owned(),
            empty: "No reader-writer lock is held.",
            head: row_head::<RwLockRow>(),
            rows: rwlocks.iter().map(row_tr).collect(),
            cut: s
                .rwlocks_truncated
                .unwrap_or(false)
                .then_some("reader-writer locks"),
        }
        .render(&mut html);
    }
    Section {
        heading: "Elections".to_owned(),
        empty: "No election has a leader.",
        head: row_head::<ElectionRow>(),
        rows: s.elections.iter().map(row_tr).collect(),
        cut: s.elections_truncated.then_some("elections"),
    }
    .render(&mut html);

    if let Some(queues) = &s.queues {
        render_queues(&mut html, queues, s.queues_truncated.unwrap_or(false));
    }

    Section {
        heading: format!(
            "Recent events<small>emitted by this baton process (pid {})</small>",
            s.pid
        ),
        empty: "No event since this process started.",
        head: "<th>Time</th><th>Level</th><th>Event</th><th>Key</th><th>Detail</th>".to_owned(),
        rows: s.events.iter().map(event_tr).collect(),
        cut: None,
    }
    .render(&mut html);
    let _ = write!(
        html,
        "<footer>Read-only. Served by <code>baton status</code> {}; see docs/operations.md.</footer>\n</body>\n</html>\n",
        env!("CARGO_PKG_VERSION")
    );
    html
}

/// The queues section: one row per queue with items.
fn render_queues(html: &mut String, queues: &[StatsRow], truncated: bool) {
    Section {
        heading: "Queues".to_owned(),
        empty: "No queue has items.",
        head: row_head::<StatsRow>(),
        rows: queues.iter().map(queue_tr).collect(),
        cut: truncated.then_some("queues"),
    }
    .render(html);
}

/// The `<th>` cells of a kind of row: its titles as words.
fn row_head<R: Row>() -> String {
    R::HEADER
        .iter()
        .map(|title| format!("<th>{}</th>", escape(&title_words(title))))
        .collect()
}

/// A row's `<td>` cells, each styled by its kind.
fn row_tds<R: Row>(row: &R) -> Vec<String> {
    row.cells()
        .into_iter()
        .map(|cell| {
            let text = escape(&cell.text);
            match cell.kind {
                Kind::Text => format!("<td>{text}</td>"),
                Kind::Code => format!("<td><code>{text}</code></td>"),
                Kind::Key => format!("<td class=\"key\"><code>{text}</code></td>"),
                Kind::Number => format!("<td class=\"num\">{text}</td>"),
            }
        })
        .collect()
}

/// A row's `<tr>`.
fn row_tr<R: Row>(row: &R) -> String {
    format!("<tr>{}</tr>", row_tds(row).concat())
}

/// A recent event's `<tr>`.
fn event_tr(event: &EventRow) -> String {
    let at = SystemTime::UNIX_EPOCH + Duration::from_millis(event.at_unix_ms);
    format!(
        "<tr><td class=\"num\">{}</td><td><span class=\"level {level}\">{level}</span></td><td title=\"{help} ({alarm})\"><code>{}</code></td><td class=\"key\"><code>{}</code></td><td class=\"detail\">{}</td></tr>",
        utc(at),
        escape(event.event),
        if event.key.is_empty() {
            "—".to_owned()
        } else {
            escape(&event.key)
        },
        escape(&event.detail),
        level = escape(&event.level),
        help = escape(event.help),
        alarm = escape(&event.alarm),
    )
}

/// A queue's `<tr>`.
fn queue_tr(queue: &StatsRow) -> String {
    let mut tds = row_tds(queue);
    if queue.dead > 0 {
        // Dead letters stand out: they are the work nobody will do.
        tds[5] = format!(
            "<td class=\"num\"><span class=\"level error\">{}</span></td>",
            queue.dead
        );
    }
    format!("<tr>{}</tr>", tds.concat())
}

/// One section of the page: a table, or a note when it has no rows.
struct Section<'a> {
    /// The `<h2>` content (HTML).
    heading: String,
    /// Said instead of the table when there is no row.
    empty: &'a str,
    /// The `<th>` cells (HTML).
    head: String,
    /// One `<tr>` a row (HTML).
    rows: Vec<String>,
    /// What the rows are (`locks`), when `--limit` cut them.
    cut: Option<&'a str>,
}

impl Section<'_> {
    fn render(&self, html: &mut String) {
        let _ = writeln!(html, "<section>\n<h2>{}</h2>", self.heading);
        if self.rows.is_empty() {
            let _ = writeln!(html, "<p class=\"empty\">{}</p>", self.empty);
        } else {
            let _ = writeln!(
                html,
                "<table>\n<thead><tr>{}</tr></thead>\n<tbody>",
                self.head
            );
            for row in &self.rows {
                html.push_str(row);
                html.push('\n');
            }
            html.push_str("</tbody>\n</table>\n");
            if let Some(what) = self.cut {
                let _ = writeln!(
                    html,
                    "<p class=\"note\">Only the first {what} are shown (--limit).</p>"
                );
            }
        }
        html.push_str("</section>\n");
    }
}

fn tile_u64(n: u64, truncated: bool, label: &str) -> String {
    format!(
        "<div class=\"tile\"><div class=\"n\">{n}{}</div><div class=\"label\">{label}</div></div>\n",
        if truncated { "+" } else { "" }
    )
}

fn tile(n: usize, truncated: bool, label: &str) -> String {
    format!(
        "<div class=\"tile\"><div class=\"n\">{n}{}</div><div class=\"label\">{label}</div></div>\n",
        if truncated { "+" } else { "" }
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease_cmd::HeldLease;
    use crate::lock_cmd::HeldLock;

    fn snapshot() -> Snapshot {
        Snapshot {
            store: "sqlite:///tmp/x.db".into(),
            namespace: "baton".into(),
            prefix: String::new(),
            pid: 42,
            generated_at_unix_ms: 0,
            refresh_ms: 5000,
            store_error: None,
            locks: vec![LockRow {
                key: "<script>alert(1)</script>".into(),
                of: HeldLock {
                    holder: "host:1:abc".into(),
                    fence: 7,
                    remaining_ms: 27_500,
                },
            }],
            locks_truncated: false,
            leases: vec![LeaseRow {
                key: "leader".into(),
                of: HeldLease {
                    held: HeldLock {
                        holder: "node-a".into(),
                        fence: 3,
                        remaining_ms: 270_000,
                    },
                    reason: "\"quoted\" & <b>".into(),
                },
            }],
            leases_truncated: false,
            semaphores: None,
            semaphores_truncated: None,
            rwlocks: None,
            rwlocks_truncated: None,
            elections: Vec::new(),
            elections_truncated: false,
            queues: None,
            queues_truncated: None,
            events: Vec::new(),
        }
    }

    #[test]
    fn the_page_escapes_store_values_and_reloads_itself() {
        let html = render(&snapshot());
        assert!(!html.contains("<script>"), "{html}");
        assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(html.contains("&quot;quoted&quot; &amp; &lt;b&gt;"));
        assert!(html.contains("<meta http-equiv=\"refresh\" content=\"5\">"));
        assert!(html.contains("<td class=\"num\">27.5s</td>"));
        assert!(html.contains("<td class=\"num\">4m30s</td>"));
        assert!(html.contains("No event since this process started."));
    }

    #[test]
    fn semaphores_and_rwlocks_show_only_for_stores_that_keep_them() {
        let without = snapshot();
        let html = render(&without);
        assert!(!html.contains("<h2>Semaphores</h2>"), "{html}");
        assert!(!html.contains("<h2>Reader-writer locks</h2>"), "{html}");
        assert!(!html.contains("semaphore permits held"), "{html}");
        assert!(
            html.contains("<h2>Elections</h2>") && html.contains("No election has a leader."),
            "every store keeps elections"
        );
        let json = serde_json::to_value(&without).unwrap();
        for field in [
            "semaphores",
            "semaphores_truncated",
            "rwlocks",
            "rwlocks_truncated",
        ] {
            assert!(json.get(field).is_none(), "{field}: {json}");
        }

        let mut with = snapshot();
        with.semaphores = Some(vec![SemaphoreRow {
            key: "<b>builders</b>".into(),
            of: crate::lock_cmd::HeldSemaphore {
                holders: 1,
                permits: None,
                held_by: vec![HeldLock {
                    holder: "h<1>".into(),
                    fence: 9,
                    remaining_ms: 1_500,
                }],
            },
        }]);
        with.semaphores_truncated = Some(true);
        with.rwlocks = Some(Vec::new());
        with.rwlocks_truncated = Some(false);
        let html = render(&with);
        assert!(html.contains("<h2>Semaphores</h2>"), "{html}");
        assert!(
            html.contains("<code>&lt;b&gt;builders&lt;/b&gt;</code>"),
            "{html}"
        );
        assert!(
            html.contains("<td class=\"num\">1/?</td>"),
            "an N not recorded: {html}"
        );
        assert!(html.contains("h&lt;1&gt; (fence 9, 1.5s)"), "{html}");
        assert!(
            html.contains("Only the first semaphores are shown"),
            "{html}"
        );
        assert!(
            html.contains("<h2>Reader-writer locks</h2>")
                && html.contains("No reader-writer lock is held."),
            "{html}"
        );
        let json = serde_json::to_value(&with).unwrap();
        assert_eq!(json["semaphores"][0]["holders"], 1);
        assert!(json["semaphores"][0].get("permits").is_none(), "{json}");
        assert_eq!(json["semaphores_truncated"], true);
        assert_eq!(json["rwlocks"], serde_json::json!([]));
    }

    #[test]
    fn queues_show_only_for_stores_that_keep_them() {
        let without = snapshot();
        let html = render(&without);
        assert!(!html.contains("<h2>Queues</h2>"), "{html}");
        let json = serde_json::to_value(&without).unwrap();
        assert!(json.get("queues").is_none() && json.get("queues_truncated").is_none());

        let mut with = snapshot();
        with.queues = Some(Vec::new());
        with.queues_truncated = Some(false);
        let html = render(&with);
        assert!(html.contains("<h2>Queues</h2>") && html.contains("No queue has items."));

        with.queues = Some(vec![StatsRow {
            queue: "<i>emails</i>".into(),
            ready: 3,
            scheduled: 1,
            running: 2,
            expired: 0,
            dead: 4,
            oldest_due_ms: Some(27_500),
        }]);
        let html = render(&with);
        assert!(
            html.contains("<code>&lt;i&gt;emails&lt;/i&gt;</code>"),
            "{html}"
        );
        assert!(
            html.contains("<span class=\"level error\">4</span>"),
            "{html}"
        );
        assert!(html.contains("<td class=\"num\">27.5s</td>"), "{html}");
        assert!(
            html.contains("<div class=\"n\">6</div><div class=\"label\">items queued</div>"),
            "{html}"
        );
        let events = html.find("Recent events").unwrap();
        let leases = html.find("<h2>Leases</h2>").unwrap();
        let queues = html.find("<h2>Queues</h2>").unwrap();
        assert!(
            leases < queues && queues < events,
            "queues go between leases and events"
        );
        let json = serde_json::to_value(&with).unwrap();
        assert_eq!(json["queues"][0]["ready"], 3);
        assert_eq!(json["queues"][0]["oldest_due_ms"], 27_500);
        assert_eq!(json["queues_truncated"], false);
    }
}
