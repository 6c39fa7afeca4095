//! Parsing of `redis://`, `rediss://` and Sentinel store URLs.
//!
//! ```text
//! redis://[[user]:password@]host[:port][/db][?option=value&...]
//! rediss://...   (the same, over TLS)
//! redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/MASTER_NAME[/db][?option=value&...]
//! rediss+sentinel://...   (the same, over TLS to the sentinels and the servers)
//! redis+cluster://[[user]:password@]host[:port][,host[:port]...][?option=value&...]
//! rediss+cluster://...   (the same, over TLS to every node)
//! ```
//!
//! The user and password are percent-decoded and sent with `AUTH` (an ACL user when a user
//! is given); the database number is sent with `SELECT`; the port defaults to 6379 (26379
//! for a sentinel). In a Sentinel URL the hosts are the sentinels, asked for the primary of
//! `MASTER_NAME`; the credentials and the database are those of the Redis servers (the
//! sentinels are asked without credentials). In a Cluster URL the hosts are seed nodes, any
//! nodes of the cluster (the client discovers the rest), and there is no database (a cluster
//! has only database 0); it is parsed by [`parse_cluster`], and [`parse`] refuses it with
//! advice. The query holds [`RedisOptions`], `name=value`
//! joined by `&`. Anything else (an unknown or repeated option, a database that is not a
//! number, a fragment, a path after the database, a Sentinel URL without a master name or
//! without hosts, a Cluster URL with a path) is rejected before any I/O, and no error message ever shows the password.

use baton_core::{Error, Result, redact_url};
use url::Url;

use crate::options::RedisOptions;

/// The port of a sentinel when the URL names none.
const SENTINEL_PORT: u16 = 26379;

/// The port of a cluster node when the URL names none.
const NODE_PORT: u16 = 6379;

/// A parsed `redis+cluster://` URL: the seed nodes to discover the cluster from.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct ClusterTarget {
    /// The seed nodes, in the URL's order: host (an IPv6 address without brackets), port.
    pub(crate) seeds: Vec<(String, u16)>,
    /// The URL with the password replaced by `***`, for messages.
    pub(crate) redacted: String,
    /// Whether the connections use TLS (`rediss+cluster://`).
    pub(crate) tls: bool,
    /// The user, if one is given.
    pub(crate) user: Option<String>,
    /// `user:password@` as written in the URL (percent-encoded), or empty.
    credentials: String,
}

impl ClusterTarget {
    /// The seed nodes' URLs for the redis client, with the store's credentials.
    pub(crate) fn seed_urls(&self) -> Vec<String> {
        self.seeds
            .iter()
            .map(|(host, port)| self.node_url(host, *port))
            .collect()
    }

    /// The `redis://` (or `rediss://`) URL of one node of the cluster, with the store's
    /// credentials.
    pub(crate) fn node_url(&self, host: &str, port: u16) -> String {
        let scheme = if self.tls { "rediss" } else { "redis" };
        format!("{scheme}://{}{}", self.credentials, host_port(host, port))
    }
}

impl std::fmt::Debug for ClusterTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.redacted)
    }
}

/// A parsed store URL.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Target {
    /// The URL for the redis client: the store URL without baton's options. For a Sentinel
    /// URL, the servers' URLs are made from [`Sentinels::server_url`] instead.
    pub(crate) client_url: String,
    /// The URL with the password replaced by `***`, for messages.
    pub(crate) redacted: String,
    /// Whether the connection uses TLS (`rediss://`, `rediss+sentinel://`).
    pub(crate) tls: bool,
    /// The database number.
    pub(crate) db: i64,
    /// The user, if one is given.
    pub(crate) user: Option<String>,
    /// The sentinels to ask for the primary, for a Sentinel URL.
    pub(crate) sentinels: Option<Sentinels>,
}

/// The Sentinel part of a Sentinel URL.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Sentinels {
    /// The sentinels, in the URL's order: host (an IPv6 address without brackets), port.
    pub(crate) hosts: Vec<(String, u16)>,
    /// The name the sentinels monitor the primary by.
    pub(crate) master: String,
    /// `user:password@` as written in the URL (percent-encoded), or empty.
    credentials: String,
}

impl Sentinels {
    /// The URL of the Redis server at `host:port`, with the store's credentials and
    /// database.
    pub(crate) fn server_url(&self, tls: bool, host: &str, port: u16, db: i64) -> String {
        let scheme = if tls { "rediss" } else { "redis" };
        format!(
            "{scheme}://{}{}/{db}",
            self.credentials,
            host_port(host, port)
        )
    }

    /// The URL of the sentinel at `host:port` (no credentials, no database).
    pub(crate) fn sentinel_url(tls: bool, host: &str, port: u16) -> String {
        let scheme = if tls { "rediss" } else { "redis" };
        format!("{scheme}://{}", host_port(host, port))
    }
}

/// `host:port`, with an IPv6 address in brackets.
pub(crate) fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.redacted)
    }
}

/// Splits a store URL into where to connect and validated options.
///
/// # Errors
/// `InvalidInput` naming the problem (with the password redacted).
pub(crate) fn parse(text: &str) -> Result<(Target, RedisOptions)> {
    for (scheme, tls) in [("redis+sentinel://", false), ("rediss+sentinel://", true)] {
        if let Some(rest) = text.strip_prefix(scheme) {
            return parse_sentinel(text, rest, tls);
        }
    }
    if is_cluster(text) {
        return Err(Error::invalid_input(format!(
            "store URL {:?} names a Redis Cluster, which RedisStore does not open (it uses one server, or the primary Sentinel names); open it with RedisClusterStore, as baton::connect does",
            redact_url(text)
        )));
    }
    let scheme_ok = text.starts_with("redis://") || text.starts_with("rediss://");
    let url = Url::parse(text).ok().filter(|_| scheme_ok);
    let Some(mut url) = url else {
        return Err(Error::invalid_input(format!(
            "store URL {:?} is not a redis://, rediss://, redis+sentinel:// or redis+cluster:// URL; write redis://[[user]:password@]host[:port][/db]",
            redact_url(text)
        )));
    };
    let redacted = redact_url(text);
    let bad = |what: String| Error::invalid_input(format!("store URL {redacted:?}: {what}"));
    if url.host_str().is_none_or(str::is_empty) {
        return Err(bad("has no host; write redis://host[:port][/db]".into()));
    }
    if url.fragment().is_some() {
        return Err(bad(
            "has a fragment (#...); options go in the query, e.g. ?connect_timeout=1s".into(),
        ));
    }
    let db = database(url.path().trim_start_matches('/'), &bad)?;
    let options = baton_core::options::from_query::<RedisOptions>(url.query().unwrap_or(""), &bad)?;
    url.set_query(None);
    let user = (!url.username().is_empty()).then(|| url.username().to_owned());
    Ok((
        Target {
            tls: url.scheme() == "rediss",
            client_url: url.into(),
            redacted,
            db,
            user,
            sentinels: None,
        },
        options,
    ))
}

/// `redis+sentinel://[credentials@]hosts/MASTER[/db][?query]`, `rest` being the text after
/// the scheme.
fn parse_sentinel(text: &str, rest: &str, tls: bool) -> Result<(Target, RedisOptions)> {
    let redacted = redact_url(text);
    let bad = |what: String| Error::invalid_input(format!("store URL {redacted:?}: {what}"));
    const FORM: &str = "write redis+sentinel://host:26379[,host:26379...]/MASTER_NAME[/db]";
    let HostList {
        credentials,
        hosts: hosts_text,
        path,
        query,
    } = host_list(rest, &bad)?;
    if hosts_text.split(',').all(|h| h.trim().is_empty()) {
        return Err(bad(format!("has no Sentinel host; {FORM}")));
    }
    let hosts = hosts_text
        .split(',')
        .map(|host| sentinel_host(host, &bad))
        .collect::<Result<Vec<_>>>()?;
    let mut segments = path.split('/');
    let master = segments.next().unwrap_or("");
    if master.is_empty() {
        return Err(bad(format!("has no master name; {FORM}")));
    }
    if master.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(bad(format!(
            "the master name {master:?} holds a space or control character"
        )));
    }
    let db = database(&segments.collect::<Vec<_>>().join("/"), &bad)?;
    let options = baton_core::options::from_query::<RedisOptions>(query, &bad)?;
    // The credentials must read as a URL's; their user is the server's ACL user.
    let user = credentials_user(credentials, &bad)?;
    Ok((
        Target {
            client_url: String::new(),
            redacted,
            tls,
            db,
            user,
            sentinels: Some(Sentinels {
                hosts,
                master: master.to_owned(),
                credentials: credentials.to_owned(),
            }),
        },
        options,
    ))
}

/// Whether `text` is a `redis+cluster://` or `rediss+cluster://` URL.
pub(crate) fn is_cluster(text: &str) -> bool {
    text.starts_with("redis+cluster://") || text.starts_with("rediss+cluster://")
}

/// Parses a `redis+cluster://[credentials@]host[:port][,host[:port]...][?query]` URL.
///
/// # Errors
/// `InvalidInput` naming the problem (with the password redacted).
pub(crate) fn parse_cluster(text: &str) -> Result<(ClusterTarget, RedisOptions)> {
    let (rest, tls) = if let Some(rest) = text.strip_prefix("redis+cluster://") {
        (rest, false)
    } else if let Some(rest) = text.strip_prefix("rediss+cluster://") {
        (rest, true)
    } else {
        return Err(Error::invalid_input(format!(
            "store URL {:?} is not a redis+cluster:// or rediss+cluster:// URL",
            redact_url(text)
        )));
    };
    let redacted = redact_url(text);
    let bad = |what: String| Error::invalid_input(format!("store URL {redacted:?}: {what}"));
    const FORM: &str = "write redis+cluster://host:port[,host:port...]";
    let HostList {
        credentials,
        hosts: hosts_text,
        path,
        query,
    } = host_list(rest, &bad)?;
    if hosts_text.split(',').all(|h| h.trim().is_empty()) {
        return Err(bad(format!("has no seed node; {FORM}")));
    }
    if !path.is_empty() {
        return Err(bad(format!(
            "has a path {path:?}; a Redis Cluster has only database 0, so {FORM} with nothing after the hosts but the options"
        )));
    }
    let seeds = hosts_text
        .split(',')
        .map(|host| list_host(host, NODE_PORT, "seed node", "seed nodes", &bad))
        .collect::<Result<Vec<_>>>()?;
    let options = baton_core::options::from_query::<RedisOptions>(query, &bad)?;
    let user = credentials_user(credentials, &bad)?;
    Ok((
        ClusterTarget {
            seeds,
            redacted,
            tls,
            user,
            credentials: credentials.to_owned(),
        },
        options,
    ))
}

/// The parts of a URL that names a list of hosts (Sentinel, Cluster), `rest` being the
/// text after the scheme: `[credentials@]hosts[/path][?query]`.
struct HostList<'a> {
    /// `user:password@`, or empty.
    credentials: &'a str,
    /// The comma-separated hosts, not checked yet.
    hosts: &'a str,
    /// After the first `/` following the hosts, or empty.
    path: &'a str,
    /// After the `?`, or empty.
    query: &'a str,
}

/// Splits `rest` into its [`HostList`] parts. The credentials end at the last `@` before the
/// path (a password may hold `/` or `?` only percent-encoded, so the first `/` after it
/// starts the path).
///
/// # Errors
/// What `bad` makes of a fragment (`#...`).
fn host_list<'a>(rest: &'a str, bad: &impl Fn(String) -> Error) -> Result<HostList<'a>> {
    if rest.contains('#') {
        return Err(bad(
            "has a fragment (#...); options go in the query, e.g. ?connect_timeout=1s".into(),
        ));
    }
    let host_start = rest.rfind('@').map_or(0, |at| at + 1);
    let (credentials, after) = rest.split_at(host_start);
    let (authority_and_path, query) = after.split_once('?').unwrap_or((after, ""));
    let (hosts, path) = authority_and_path
        .split_once('/')
        .unwrap_or((authority_and_path, ""));
    Ok(HostList {
        credentials,
        hosts,
        path,
        query,
    })
}

/// The user of `user:password@` credentials, which must read as a URL's.
fn credentials_user(credentials: &str, bad: &impl Fn(String) -> Error) -> Result<Option<String>> {
    if credentials.is_empty() {
        return Ok(None);
    }
    let probe = Url::parse(&format!("redis://{credentials}h"))
        .map_err(|_| bad("has credentials that are not user:password@".into()))?;
    Ok((!probe.username().is_empty()).then(|| probe.username().to_owned()))
}

/// One `host[:port]` of a Sentinel URL (`[v6]:port` for an IPv6 address).
fn sentinel_host(text: &str, bad: &impl Fn(String) -> Error) -> Result<(String, u16)> {
    list_host(text, SENTINEL_PORT, "sentinel", "sentinels", bad)
}

/// One `host[:port]` of a URL's list of hosts (`[v6]:port` for an IPv6 address), `what` in
/// messages (one of `list`), `port` when it names none.
fn list_host(
    text: &str,
    default_port: u16,
    what: &str,
    list: &str,
    bad: &impl Fn(String) -> Error,
) -> Result<(String, u16)> {
    let text = text.trim();
    if text.is_empty() {
        return Err(bad(format!(
            "has an empty host in its list of {list} (two commas, or a comma at an end)"
        )));
    }
    let (host, port) = if let Some(v6) = text.strip_prefix('[') {
        match v6.split_once(']') {
            Some((host, "")) => (host, None),
            Some((host, port)) if port.starts_with(':') => (host, Some(&port[1..])),
            _ => return Err(bad(format!("{what} {text:?} is not host:port"))),
        }
    } else {
        match text.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (text, None),
        }
    };
    if host.is_empty() || host.contains(['/', '@', ' ']) {
        return Err(bad(format!("{what} {text:?} is not host:port")));
    }
    let port = match port {
        None => default_port,
        Some(port) => port.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(|| {
            bad(format!(
                "{what} {text:?} has a port that is not a number from 1 to 65535"
            ))
        })?,
    };
    Ok((host.to_owned(), port))
}

/// The database of a URL's path (`""` is 0).
fn database(path: &str, bad: &impl Fn(String) -> Error) -> Result<i64> {
    match path {
        "" => Ok(0),
        path => path.parse::<u32>().map(i64::from).map_err(|_| {
            bad(format!(
                "the database {path:?} is not a number; write the database as /0, /1, ... after the host"
            ))
        }),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn host_port_db_user_password() {
        let (target, options) = parse("redis://127.0.0.1:6380/2").unwrap();
        assert_eq!(target.client_url, "redis://127.0.0.1:6380/2");
        assert_eq!((target.db, target.tls, target.user), (2, false, None));
        assert_eq!(options, RedisOptions::new());

        let (target, _) = parse("redis://localhost").unwrap();
        assert_eq!(target.db, 0);
        let (target, _) = parse("redis://localhost/").unwrap();
        assert_eq!(target.db, 0);

        let (target, _) = parse("redis://app:s%40cret@cache.internal:6379/5").unwrap();
        assert_eq!(target.user.as_deref(), Some("app"));
        assert_eq!(target.db, 5);
        assert_eq!(target.redacted, "redis://app:***@cache.internal:6379/5");
        let info =
            redis::IntoConnectionInfo::into_connection_info(target.client_url.as_str()).unwrap();
        assert_eq!(info.redis_settings().username(), Some("app"));
        assert_eq!(
            info.redis_settings().password(),
            Some("s@cret"),
            "percent-decoded"
        );
        assert_eq!(info.redis_settings().db(), 5);

        let (target, _) = parse("redis://:only-password@h").unwrap();
        assert_eq!(target.user, None);
        assert_eq!(target.redacted, "redis://:***@h");
        let info =
            redis::IntoConnectionInfo::into_connection_info(target.client_url.as_str()).unwrap();
        assert_eq!(info.redis_settings().password(), Some("only-password"));

        let (target, _) = parse("redis://[::1]:7000").unwrap();
        assert_eq!(target.client_url, "redis://[::1]:7000");
    }

    #[test]
    fn tls() {
        let (target, _) = parse("rediss://user:pw@redis.example.com:6380/1").unwrap();
        assert!(target.tls);
        assert_eq!(target.db, 1);
        assert_eq!(
            target.redacted,
            "rediss://user:***@redis.example.com:6380/1"
        );
    }

    #[test]
    fn options_in_the_query() {
        let (target, options) =
            parse("redis://h:1/3?connect_timeout=250ms&response_timeout=1s").unwrap();
        assert_eq!(options.get_connect_timeout(), Duration::from_millis(250));
        assert_eq!(options.get_response_timeout(), Duration::from_secs(1));
        assert_eq!(
            target.client_url, "redis://h:1/3",
            "options are not sent on"
        );
        let (_, options) = parse("redis://h?").unwrap();
        assert_eq!(options, RedisOptions::new());
    }

    fn rejected(url: &str, needle: &str) {
        let err = parse(url).expect_err(url);
        assert!(err.is_invalid_input(), "{url}: {err}");
        assert!(
            err.message().contains(needle),
            "{url}: expected {needle:?} in {err}"
        );
        assert!(!err.message().contains("hunter2"), "password leaked: {err}");
    }

    #[test]
    fn bad_urls_name_the_problem() {
        rejected("redis://", "has no host");
        rejected("redis:///0", "has no host");
        rejected(
            "http://h",
            "not a redis://, rediss://, redis+sentinel:// or redis+cluster:// URL",
        );
        rejected(
            "redis:h",
            "not a redis://, rediss://, redis+sentinel:// or redis+cluster:// URL",
        );
        rejected("redis://u:hunter2@h:notaport", "not a redis://");
        rejected(
            "redis://u:hunter2@h/abc",
            "the database \"abc\" is not a number",
        );
        rejected("redis://u:hunter2@h/-1", "is not a number");
        rejected("redis://h/1/2", "is not a number");
        rejected("redis://u:hunter2@h/0#insecure", "has a fragment");
        rejected("redis://u:hunter2@h?db=1", "unknown redis:// option \"db\"");
        rejected(
            "redis://h?db=1",
            "connect_timeout, response_timeout and min_replicas",
        );
        rejected("redis://h?connect_timeout", "has no value");
        rejected("redis://h?connect_timeout=5", "duration \"5\"");
        rejected(
            "redis://h?response_timeout=0",
            "response_timeout 0ms is out of range",
        );
        rejected(
            "redis://h?connect_timeout=1s&connect_timeout=2s",
            "\"connect_timeout\" is given twice",
        );
    }

    #[test]
    fn unparsable_urls_do_not_show_the_password() {
        rejected("redis://u:hunter2@h:x/0", "redis://u:***@h:x/0");
    }

    #[test]
    fn sentinel_urls() {
        let (target, options) = parse(
            "redis+sentinel://app:s%40cret@10.0.0.1:26379,[::1]:26380,sentinel-c/mymaster/3?min_replicas=1",
        )
        .unwrap();
        let sentinels = target.sentinels.clone().unwrap();
        assert_eq!(
            sentinels.hosts,
            [
                ("10.0.0.1".to_owned(), 26379),
                ("::1".to_owned(), 26380),
                ("sentinel-c".to_owned(), 26379)
            ]
        );
        assert_eq!(sentinels.master, "mymaster");
        assert_eq!((target.db, target.tls), (3, false));
        assert_eq!(target.user.as_deref(), Some("app"));
        assert_eq!(options.get_min_replicas(), 1);
        assert_eq!(
            target.redacted,
            "redis+sentinel://app:***@10.0.0.1:26379,[::1]:26380,sentinel-c/mymaster/3?min_replicas=1"
        );
        let server = sentinels.server_url(false, "10.0.0.9", 6380, 3);
        assert_eq!(server, "redis://app:s%40cret@10.0.0.9:6380/3");
        let info = redis::IntoConnectionInfo::into_connection_info(server.as_str()).unwrap();
        assert_eq!(info.redis_settings().password(), Some("s@cret"));
        assert_eq!(
            Sentinels::sentinel_url(true, "::1", 26379),
            "rediss://[::1]:26379"
        );

        let (target, _) = parse("rediss+sentinel://h/m").unwrap();
        assert!(target.tls);
        assert_eq!(target.db, 0);
        assert_eq!(target.user, None);
        assert_eq!(target.sentinels.unwrap().hosts, [("h".to_owned(), 26379)]);
    }

    #[test]
    fn bad_sentinel_urls_name_the_problem() {
        rejected("redis+sentinel://u:hunter2@h:26379", "has no master name");
        rejected("redis+sentinel://u:hunter2@h:26379/", "has no master name");
        rejected(
            "redis+sentinel://u:hunter2@/mymaster",
            "has no Sentinel host",
        );
        rejected("redis+sentinel:///mymaster", "has no Sentinel host");
        rejected("redis+sentinel://,/mymaster", "has no Sentinel host");
        rejected("redis+sentinel://a,,b/mymaster", "an empty host");
        rejected("redis+sentinel://a:x/mymaster", "port that is not a number");
        rejected("redis+sentinel://a:0/mymaster", "port that is not a number");
        rejected(
            "redis+sentinel://u:hunter2@a/mymaster/x",
            "the database \"x\" is not a number",
        );
        rejected("redis+sentinel://a/mymaster/1/2", "is not a number");
        rejected(
            "redis+sentinel://u:hunter2@a/mymaster?sentinel=1",
            "unknown redis:// option \"sentinel\"",
        );
        rejected("redis+sentinel://a/m#x", "has a fragment");
        rejected("redis+sentinel://a/m?min_replicas=99", "between 0 and 32");
    }

    #[test]
    fn cluster_urls() {
        let (target, options) = parse_cluster(
            "redis+cluster://app:s%40cret@10.0.0.1:7000,[::1]:7001,node-c?response_timeout=500ms",
        )
        .unwrap();
        assert_eq!(
            target.seeds,
            [
                ("10.0.0.1".to_owned(), 7000),
                ("::1".to_owned(), 7001),
                ("node-c".to_owned(), 6379)
            ]
        );
        assert!(!target.tls);
        assert_eq!(target.user.as_deref(), Some("app"));
        assert_eq!(options.get_response_timeout(), Duration::from_millis(500));
        assert_eq!(
            target.redacted,
            "redis+cluster://app:***@10.0.0.1:7000,[::1]:7001,node-c?response_timeout=500ms"
        );
        assert_eq!(
            target.seed_urls(),
            [
                "redis://app:s%40cret@10.0.0.1:7000",
                "redis://app:s%40cret@[::1]:7001",
                "redis://app:s%40cret@node-c:6379"
            ]
        );
        let info = redis::IntoConnectionInfo::into_connection_info(target.seed_urls()[0].as_str())
            .unwrap();
        assert_eq!(info.redis_settings().password(), Some("s@cret"));
        assert_eq!(info.redis_settings().username(), Some("app"));

        let (target, options) = parse_cluster("rediss+cluster://h:7000").unwrap();
        assert!(target.tls);
        assert_eq!(target.user, None);
        assert_eq!(options, RedisOptions::new());
        assert_eq!(target.seed_urls(), ["rediss://h:7000"]);
        // A trailing slash names no database; a password alone has no user.
        let (target, _) = parse_cluster("redis+cluster://:only@h:1/?").unwrap();
        assert_eq!(target.user, None);
        assert_eq!(target.redacted, "redis+cluster://:***@h:1/?");
    }

    fn cluster_rejected(url: &str, needle: &str) {
        let err = parse_cluster(url).expect_err(url);
        assert!(err.is_invalid_input(), "{url}: {err}");
        assert!(
            err.message().contains(needle),
            "{url}: expected {needle:?} in {err}"
        );
        assert!(!err.message().contains("hunter2"), "password leaked: {err}");
    }

    #[test]
    fn bad_cluster_urls_name_the_problem() {
        cluster_rejected("redis+cluster://u:hunter2@", "has no seed node");
        cluster_rejected("redis+cluster://", "has no seed node");
        cluster_rejected("redis+cluster://,", "has no seed node");
        cluster_rejected(
            "redis+cluster://u:hunter2@a,,b",
            "an empty host in its list of seed nodes",
        );
        cluster_rejected(
            "redis+cluster://a,",
            "an empty host in its list of seed nodes",
        );
        cluster_rejected(
            "redis+cluster://u:hunter2@a:x",
            "seed node \"a:x\" has a port that is not a number",
        );
        cluster_rejected("redis+cluster://a:0", "port that is not a number");
        cluster_rejected("redis+cluster://a:70000", "port that is not a number");
        cluster_rejected(
            "redis+cluster://[::1",
            "seed node \"[::1\" is not host:port",
        );
        cluster_rejected("redis+cluster://u:hunter2@a:7000/0", "has a path \"0\"");
        cluster_rejected("redis+cluster://a:7000/1", "only database 0");
        cluster_rejected("redis+cluster://u:hunter2@a#x", "has a fragment");
        cluster_rejected(
            "redis+cluster://u:hunter2@a?db=1",
            "unknown redis:// option \"db\"",
        );
        cluster_rejected("redis+cluster://a?connect_timeout=5", "duration \"5\"");
        cluster_rejected("redis+cluster://a?min_replicas=99", "between 0 and 32");
        cluster_rejected("redis://u:hunter2@a", "not a redis+cluster://");
    }

    #[test]
    fn a_cluster_url_is_not_a_single_server() {
        rejected("redis+cluster://u:hunter2@a:7000", "names a Redis Cluster");
        rejected("rediss+cluster://a:7000", "open it with RedisClusterStore");
    }
}
