//! `baton publish` and `baton subscribe` against a private redis-server: one JSON line per
//! event; SQLite cannot broadcast and says which stores can.

mod common;

use baton_testkit::redis::RedisServer;
use common::*;

#[test]
fn subscribe_prints_one_json_line_per_message() {
    let server =
        RedisServer::start().expect("a private redis-server (apt-get install redis-server)");
    let url = server.url();
    let baton = |args: &[&str]| {
        let mut command = bare_baton();
        command.arg("--store").arg(&url).args(args);
        command
    };
    let subscriber = Running::spawn(baton(&["subscribe", "invalidate", "--count", "2"]));
    eventually("the subscriber to subscribe", || {
        subscriber.stderr().contains("subscribed to invalidate")
    });
    for message in [r#"{"org":42}"#, r#""all""#] {
        let out = Running::spawn(baton(&["publish", "invalidate", message])).finish();
        out.assert_status(0);
        assert!(
            out.stdout
                .starts_with("Published invalidate seq=1 publisher="),
            "{}",
            out.stdout
        );
    }
    let out = subscriber.finish();
    out.assert_status(0);
    let lines: Vec<serde_json::Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(lines.len(), 2, "{}", out.stdout);
    assert_eq!(lines[0]["event"], "message");
    assert_eq!(lines[0]["payload"], serde_json::json!({"org": 42}));
    assert_eq!(lines[0]["seq"], 1);
    assert_eq!(lines[1]["payload"], "all");
    assert_ne!(
        lines[0]["publisher"], lines[1]["publisher"],
        "two processes, two publishers"
    );

    let out = Running::spawn(baton(&["publish", "invalidate", "not json"])).finish();
    out.assert_status(USAGE);
}

#[test]
fn sqlite_cannot_broadcast_and_says_which_stores_can() {
    let env = Env::new();
    for args in [&["publish", "c", "1"][..], &["subscribe", "c"]] {
        let out = env.run(args);
        out.assert_status(USAGE);
        assert!(out.stderr.contains("redis://"), "{}", out.stderr);
    }
}
