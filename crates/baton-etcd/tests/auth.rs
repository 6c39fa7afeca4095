//! etcd authentication end to end: a private three-member cluster with auth enabled (a
//! `root` user with a password that needs percent-encoding) serves a store whose URL carries
//! the user and password, and refuses one without them or with a wrong password. The
//! password never shows: not in the store's `Debug`, not in any error, not in any log line
//! at any level (every `tracing` event of this test binary, TRACE included, is recorded and
//! searched).

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton::lock::LockOptions;
use baton_core::ErrorKind;
use baton_etcd::EtcdStore;

const PASSWORD: &str = "s3cr@t:pw";
const ENCODED: &str = "s3cr%40t%3Apw";

/// Everything logged, at every level.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<u8>>>);

impl Write for Log {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn assert_secret_free(what: &str, text: &str) {
    for secret in [PASSWORD, ENCODED, "s3cr"] {
        assert!(!text.contains(secret), "{what} shows the password: {text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_and_password_are_used_and_never_shown() {
    let log = Log::default();
    let writer = log.clone();
    tracing::subscriber::set_global_default(
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_writer(move || writer.clone())
            .finish(),
    )
    .expect("the only subscriber of this test binary");

    let cluster = common::private_cluster().await;
    let mut admin = common::raw(&cluster).await;
    admin.user_add("root", PASSWORD, None).await.unwrap();
    admin.user_grant_role("root", "root").await.unwrap();
    admin.auth_enable().await.unwrap();
    let members = cluster.url().replace("etcd://", "");
    let timeouts = "connect_timeout=2s&response_timeout=5s";

    let url = format!("etcd://root:{ENCODED}@{members}?{timeouts}");
    let store = EtcdStore::connect(&url).await.expect("the right password");
    assert_secret_free("the store's Debug", &format!("{store:?}"));
    assert_secret_free("the store's cluster", store.cluster());
    assert!(
        store.cluster().starts_with("etcd://root:***@"),
        "{}",
        store.cluster()
    );
    let baton = baton::connect(&url).await.expect("through the facade");
    assert_secret_free("the facade's Debug", &format!("{baton:?}"));
    let guard = baton
        .locks()
        .acquire("auth", &LockOptions::new(Duration::from_secs(10)))
        .await
        .expect("a lock under etcd auth");
    assert_eq!(guard.release().await, baton::lock::ReleaseOutcome::Released);

    let wrong = format!("etcd://root:wrong-{ENCODED}@{members}?{timeouts}");
    let e = EtcdStore::connect(&wrong).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(e.message().contains("authentication failed"), "{e}");
    assert_secret_free("the error of a wrong password", &format!("{e} {e:?}"));

    let anonymous = format!("{}?{timeouts}", cluster.url());
    let e = EtcdStore::connect(&anonymous).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(e.message().contains("user name is empty"), "{e}");

    drop((store, baton));
    let logged = String::from_utf8_lossy(&log.0.lock().unwrap()).into_owned();
    assert!(!logged.is_empty(), "the subscriber records the test's logs");
    assert_secret_free("the log", &logged);
}
