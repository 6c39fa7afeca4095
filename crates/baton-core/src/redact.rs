//! Redaction of secrets in store URLs: the one function every message, log line, page and
//! report that names a store passes its URL through.
//!
//! A store URL may carry a password in its user part (`redis://:pw@host`,
//! `postgres://app:pw@db/coord`) or in its query (`?password=pw`, `?sslpassword=pw`,
//! `?token=...`). [`redact_url`] replaces each with `***` and leaves everything else as
//! written, so an operator still sees which server and which options were meant.
//!
//! It works on text, not on a parsed URL, so that a URL too malformed to parse
//! (`redis:/:pw@h`, `postgres//u:pw@h`) is redacted as well: everything between the scheme
//! and the last `@` before the path is credentials, whatever it looks like.

/// Query parameters whose value is a secret.
const SECRET_PARAMETERS: &[&str] = &[
    "password",
    "pass",
    "passwd",
    "pwd",
    "sslpassword",
    "token",
    "auth",
    "secret",
    "api_key",
    "apikey",
];

/// The text of a store URL with every password replaced by `***`: the password of the
/// user part (the user name is kept) and the value of each secret query parameter
/// (`password`, `sslpassword`, `token`, ...; names compared case-insensitively).
///
/// Text that is not a well-formed URL is redacted as well: anything before the last `@`
/// of its authority counts as credentials.
///
/// # Examples
/// ```
/// use baton_core::redact_url;
/// assert_eq!(redact_url("redis://:s3cret@cache:6379/0"), "redis://:***@cache:6379/0");
/// assert_eq!(
///     redact_url("postgres://app@db/coord?password=s3cret&sslmode=require"),
///     "postgres://app@db/coord?password=***&sslmode=require"
/// );
/// assert_eq!(redact_url("redis:/:pw@h"), "redis:/:***@h");
/// ```
#[must_use]
pub fn redact_url(text: &str) -> String {
    // The scheme and its separator (`redis://`, `redis:/`, `redis:`), kept as written.
    let prefix_end = match text.find(':') {
        Some(colon) if is_scheme(&text[..colon]) => {
            colon + 1 + text[colon + 1..].bytes().take_while(|&b| b == b'/').count()
        }
        _ => 0,
    };
    let (prefix, rest) = text.split_at(prefix_end);
    // `sqlite:///path` has an empty authority: an `@` in the path is no credential.
    let at = if prefix.ends_with(":///") {
        None
    } else {
        rest.rfind('@')
    };
    // The query starts at the first `?` after the credentials (a password may hold a `?`).
    let query_from = at.unwrap_or(0);
    let (body, query) = match rest[query_from..].find('?') {
        Some(q) => rest.split_at(query_from + q),
        None => (rest, ""),
    };
    let body = match at {
        Some(at) => {
            let (userinfo, host) = body.split_at(at);
            match userinfo.split_once(':') {
                Some((user, _password)) => format!("{user}:***{host}"),
                // `scheme://user@host` carries no password; in text that is not a well-formed
                // URL (`redis:pw@host`) what stands before the `@` may be one, so it is hidden.
                None if prefix.ends_with("://") && !userinfo.contains(['/', '?', '#']) => {
                    format!("{userinfo}{host}")
                }
                None => format!("***{host}"),
            }
        }
        None => body.to_owned(),
    };
    format!("{prefix}{body}{}", redact_query(query))
}

/// `scheme = ALPHA *( ALPHA / DIGIT / "+" / "-" / "." )`.
fn is_scheme(text: &str) -> bool {
    let mut chars = text.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

/// `?a=1&password=x#f` with each secret value replaced by `***`.
fn redact_query(query: &str) -> String {
    let Some(pairs) = query.strip_prefix('?') else {
        return query.to_owned();
    };
    let (pairs, fragment) = match pairs.find('#') {
        Some(hash) => pairs.split_at(hash),
        None => (pairs, ""),
    };
    let pairs: Vec<String> = pairs
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((name, _)) if is_secret_parameter(name) => format!("{name}=***"),
            _ => pair.to_owned(),
        })
        .collect();
    format!("?{}{fragment}", pairs.join("&"))
}

fn is_secret_parameter(name: &str) -> bool {
    let name = name.trim().to_ascii_lowercase();
    SECRET_PARAMETERS.contains(&name.as_str())
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn the_user_part_keeps_the_user_and_hides_the_password() {
        assert_eq!(
            redact_url("redis://app:s3cret@cache:6379/0"),
            "redis://app:***@cache:6379/0"
        );
        assert_eq!(redact_url("redis://:pw@cache"), "redis://:***@cache");
        assert_eq!(
            redact_url("postgres://app:s%40cret@db.internal:6543/coord?sslmode=disable"),
            "postgres://app:***@db.internal:6543/coord?sslmode=disable"
        );
        assert_eq!(
            redact_url("redis+sentinel://u:pw@h1:26379,h2:26379/mymaster/0"),
            "redis+sentinel://u:***@h1:26379,h2:26379/mymaster/0"
        );
    }

    #[test]
    fn secret_query_parameters_are_hidden() {
        assert_eq!(
            redact_url("postgres://db/coord?user=app&password=s3cret&sslmode=require"),
            "postgres://db/coord?user=app&password=***&sslmode=require"
        );
        assert_eq!(
            redact_url("postgres://db/c?PassWord=a&sslpassword=b&token=c#frag"),
            "postgres://db/c?PassWord=***&sslpassword=***&token=***#frag"
        );
        assert_eq!(
            redact_url("postgres://u:a@db/c?password=b"),
            "postgres://u:***@db/c?password=***"
        );
    }

    #[test]
    fn passwords_holding_url_punctuation_are_hidden_whole() {
        for url in [
            "redis://:pa/ss@host:6379",
            "redis://:pa?ss@host:6379",
            "redis://:pa@ss@host:6379",
            "redis://:pa#ss@host:6379",
        ] {
            let redacted = redact_url(url);
            assert!(!redacted.contains("pa"), "{url} -> {redacted}");
            assert!(redacted.ends_with("@host:6379"), "{url} -> {redacted}");
        }
    }

    #[test]
    fn malformed_urls_are_redacted_too() {
        assert_eq!(redact_url("redis:/:pw@h"), "redis:/:***@h");
        assert_eq!(redact_url("redis::pw@h"), "redis::***@h");
        assert_eq!(redact_url("postgres//u:pw@h/db"), "postgres//u:***@h/db");
        assert_eq!(redact_url(":pw@h"), ":***@h");
        assert_eq!(redact_url("redis:pw@h"), "redis:***@h");
        assert_eq!(redact_url("redis:pw@h://x"), "redis:***@h://x");
        assert_eq!(redact_url("no url at all"), "no url at all");
    }

    #[test]
    fn urls_without_secrets_are_left_as_written() {
        for url in [
            "memory://",
            "sqlite:///var/lib/baton/baton.db",
            "sqlite:///var/lib/a@b.db",
            "redis://cache:6379/0",
            "postgres://app@db/coord?sslmode=require",
            "",
        ] {
            assert_eq!(redact_url(url), url);
        }
    }
}
