//! Parsing of `etcd://` and `etcds://` store URLs.
//!
//! ```text
//! etcd://[user:password@]host[:port][,host[:port]...][/][?option=value&...]
//! etcds://...   (the same, over TLS)
//! ```
//!
//! The hosts are the cluster's members (their client URLs); the client spreads requests
//! over them and moves to another when one fails. The port defaults to 2379. The user and
//! password are percent-decoded and used for etcd's authentication; both or neither must be
//! given. The query holds [`EtcdOptions`], `name=value` joined by `&`; the TLS files
//! (`ca_file`, `cert_file`, `key_file`) only with `etcds://`. Anything else (an unknown or
//! repeated option, a TLS file on `etcd://`, a path, a fragment, an empty host, a bad port) is
//! rejected before any I/O, and no error message ever shows the password.

use std::fmt;

use baton_core::{Error, Result, redact_url};

use crate::options::EtcdOptions;

/// The client port of an etcd member when the URL names none.
pub(crate) const DEFAULT_PORT: u16 = 2379;

/// The form of the URL, for error messages.
const FORM: &str = "write etcd://[user:password@]host[:port][,host[:port]...][?options]";

/// A parsed store URL.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Target {
    /// The members, as `host:port` (an IPv6 address in brackets), in the URL's order.
    pub(crate) endpoints: Vec<String>,
    /// The URL with the password replaced by `***`, for messages.
    pub(crate) redacted: String,
    /// Whether the URL asks for TLS (`etcds://`).
    pub(crate) tls: bool,
    /// The user and password for etcd's authentication, percent-decoded.
    pub(crate) credentials: Option<(String, String)>,
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted)
    }
}

/// Splits a store URL into the members to connect to and validated options.
///
/// # Errors
/// `InvalidInput` naming the problem (with the password redacted).
pub(crate) fn parse(text: &str) -> Result<(Target, EtcdOptions)> {
    let redacted = redact_url(text);
    let (tls, rest) = if let Some(rest) = text.strip_prefix("etcd://") {
        (false, rest)
    } else if let Some(rest) = text.strip_prefix("etcds://") {
        (true, rest)
    } else {
        return Err(Error::invalid_input(format!(
            "store URL {redacted:?} is not an etcd:// or etcds:// URL; {FORM}"
        )));
    };
    let bad = |what: String| Error::invalid_input(format!("store URL {redacted:?}: {what}"));
    // The credentials end at the last '@' (a password may hold '@' only percent-encoded, but
    // a stray one must not leak the rest of the password into a host name).
    let host_start = rest.rfind('@').map_or(0, |at| at + 1);
    let (userinfo, after) = rest.split_at(host_start);
    let userinfo = userinfo.strip_suffix('@').unwrap_or(userinfo);
    if after.contains('#') {
        return Err(bad(
            "has a fragment (#...); options go in the query, e.g. ?connect_timeout=1s".into(),
        ));
    }
    let (authority_and_path, query) = match after.split_once('?') {
        Some((before, query)) => (before, query),
        None => (after, ""),
    };
    let hosts_text = match authority_and_path.split_once('/') {
        Some((hosts, "")) => hosts,
        Some((_, path)) => {
            return Err(bad(format!(
                "has a path {:?}; an etcd store URL names only its members, {FORM}",
                format!("/{path}")
            )));
        }
        None => authority_and_path,
    };
    if hosts_text.split(',').all(|h| h.trim().is_empty()) {
        return Err(bad(format!("has no host; {FORM}")));
    }
    let endpoints = hosts_text
        .split(',')
        .map(|host| endpoint(host, &bad))
        .collect::<Result<Vec<_>>>()?;
    let credentials = credentials(userinfo, host_start > 0, &bad)?;
    let options = baton_core::options::from_query::<EtcdOptions>(query, &bad)?;
    if !tls && options.names_tls_files() {
        return Err(bad(
            "names a TLS file (ca_file, cert_file or key_file) but is not TLS; write etcds://"
                .into(),
        ));
    }
    Ok((
        Target {
            endpoints,
            redacted,
            tls,
            credentials,
        },
        options,
    ))
}

/// One `host[:port]` (`[v6]:port` for an IPv6 address), as `host:port`.
fn endpoint(text: &str, bad: &impl Fn(String) -> Error) -> Result<String> {
    let text = text.trim();
    if text.is_empty() {
        return Err(bad(
            "has an empty host in its list of members (two commas, or a comma at an end)".into(),
        ));
    }
    let (host, port) = if let Some(v6) = text.strip_prefix('[') {
        match v6.split_once(']') {
            Some((host, "")) => (host, None),
            Some((host, port)) if port.starts_with(':') => (host, Some(&port[1..])),
            _ => return Err(bad(format!("member {text:?} is not host:port"))),
        }
    } else {
        match text.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (text, None),
        }
    };
    if host.is_empty()
        || host.contains(['/', '@', ' ', '[', ']'])
        || (!text.starts_with('[') && host.contains(':'))
    {
        return Err(bad(format!("member {text:?} is not host:port")));
    }
    let port = match port {
        None => DEFAULT_PORT,
        Some(port) => port.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(|| {
            bad(format!(
                "member {text:?} has a port that is not a number from 1 to 65535"
            ))
        })?,
    };
    Ok(if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    })
}

/// The user and password of `user:password` (percent-encoded); `present` says whether the
/// URL had an `@` at all.
fn credentials(
    userinfo: &str,
    present: bool,
    bad: &impl Fn(String) -> Error,
) -> Result<Option<(String, String)>> {
    if !present {
        return Ok(None);
    }
    let Some((user, password)) = userinfo.split_once(':') else {
        return Err(bad(
            "has a user without a password; etcd authentication needs user:password@".into(),
        ));
    };
    let user = percent_decode(user)
        .ok_or_else(|| bad("has a user name that is not valid percent-encoded UTF-8".into()))?;
    let password = percent_decode(password)
        .ok_or_else(|| bad("has a password that is not valid percent-encoded UTF-8".into()))?;
    if user.is_empty() {
        return Err(bad(
            "has a password without a user; etcd authentication needs user:password@".into(),
        ));
    }
    if password.is_empty() {
        return Err(bad(
            "has an empty password; etcd authentication needs user:password@".into(),
        ));
    }
    Ok(Some((user, password)))
}

/// `text` with every `%XX` decoded; `None` for a bad escape or bytes that are not UTF-8.
pub(crate) fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn members_ports_and_options() {
        let (target, options) = parse("etcd://127.0.0.1:2380").unwrap();
        assert_eq!(target.endpoints, ["127.0.0.1:2380"]);
        assert_eq!((target.tls, target.credentials), (false, None));
        assert_eq!(options, EtcdOptions::new());

        let (target, _) = parse("etcd://a,b:3000,[::1]:4000,[fe80::1]/").unwrap();
        assert_eq!(
            target.endpoints,
            ["a:2379", "b:3000", "[::1]:4000", "[fe80::1]:2379"]
        );

        let (target, options) =
            parse("etcd://h1:2379,h2:2379?connect_timeout=250ms&response_timeout=1s").unwrap();
        assert_eq!(target.endpoints, ["h1:2379", "h2:2379"]);
        assert_eq!(options.get_connect_timeout(), Duration::from_millis(250));
        assert_eq!(options.get_response_timeout(), Duration::from_secs(1));

        let (target, _) = parse("etcds://h").unwrap();
        assert!(target.tls);

        let (target, options) =
            parse("etcds://h?ca_file=/etc/my%20ca.pem&cert_file=/c.pem&key_file=/k.pem").unwrap();
        assert!(target.tls);
        assert_eq!(
            options.get_ca_file(),
            Some(std::path::Path::new("/etc/my ca.pem"))
        );
        assert_eq!(
            options.get_client_certificate(),
            (
                Some(std::path::Path::new("/c.pem")),
                Some(std::path::Path::new("/k.pem"))
            )
        );
    }

    #[test]
    fn credentials_are_decoded_and_never_shown() {
        let (target, _) = parse("etcd://app:s%40cr%3Aet@h1,h2:2379").unwrap();
        assert_eq!(
            target.credentials,
            Some(("app".to_owned(), "s@cr:et".to_owned()))
        );
        assert_eq!(target.redacted, "etcd://app:***@h1,h2:2379");
        assert_eq!(format!("{target:?}"), "etcd://app:***@h1,h2:2379");
        assert!(!format!("{target:?}").contains("s%40"));
    }

    #[test]
    fn bad_urls_are_invalid_input_with_a_clear_message() {
        for (url, says) in [
            ("redis://h", "is not an etcd:// or etcds:// URL"),
            ("etcd:/h", "is not an etcd:// or etcds:// URL"),
            ("etcd://", "has no host"),
            ("etcd://?connect_timeout=1s", "has no host"),
            ("etcd://h1,,h2", "empty host"),
            ("etcd://h1,", "empty host"),
            ("etcd://h:0", "port that is not a number"),
            ("etcd://h:65536", "port that is not a number"),
            ("etcd://h:port", "port that is not a number"),
            ("etcd://::1", "is not host:port"),
            ("etcd://[::1", "is not host:port"),
            ("etcd://h/prefix", "has a path \"/prefix\""),
            ("etcd://h#frag", "has a fragment"),
            ("etcd://h?timeout=1s", "unknown etcd:// option \"timeout\""),
            (
                "etcd://h?connect_timeout=1s&connect_timeout=2s",
                "given twice",
            ),
            ("etcd://h?connect_timeout", "has no value"),
            ("etcd://h?response_timeout=0", "out of range"),
            ("etcd://h?response_timeout=soon", "response_timeout"),
            ("etcd://user@h", "a user without a password"),
            ("etcd://:pw@h", "a password without a user"),
            ("etcd://user:@h", "an empty password"),
            ("etcd://user:p%zz@h", "password that is not valid"),
            ("etcd://h?ca_file=/ca.pem", "is not TLS; write etcds://"),
            ("etcds://h?ca_file=", "option ca_file is empty"),
            ("etcds://h?ca_file=%zz", "ca_file"),
            (
                "etcds://h?cert_file=/c.pem",
                "cert_file is given without key_file",
            ),
            (
                "etcds://h?key_file=/k.pem",
                "key_file is given without cert_file",
            ),
        ] {
            let e = parse(url).unwrap_err();
            assert!(e.is_invalid_input(), "{url}: {e}");
            assert!(e.message().contains(says), "{url}: {e}");
        }
    }

    #[test]
    fn errors_never_show_the_password() {
        for url in [
            "etcd://u:hunter2@h:0",
            "etcd://u:hunter2@h/path",
            "etcd://u:hunter2@h?nope=1",
            "etcd://u:hun@ter2@h,,x",
            "etcd://u:hunter2@",
            "etcdx://u:hunter2@h",
        ] {
            let e = parse(url).unwrap_err();
            assert!(!e.message().contains("hunter2"), "{url}: {e}");
            assert!(!e.message().contains("ter2"), "{url}: {e}");
        }
    }
}
