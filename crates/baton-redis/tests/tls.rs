//! `rediss://` and `rediss+cluster://` end to end: a private redis-server (and a private
//! Redis Cluster) with TLS ports and a certificate from a private CA made for the test.
//!
//! The store trusts the platform's root certificates, which honour `SSL_CERT_FILE`; the
//! client half runs in a child process started with `SSL_CERT_FILE` pointing at the test CA
//! (the parent's environment is left alone). The parent, without that variable, must be
//! refused: certificate verification is on.

use std::path::Path;
use std::time::Duration;

use baton_core::ErrorKind;
use baton_core::store::{Claim, LeaseRequest, LeaseStore, Release};
use baton_core::{Holder, Key, KeyKind, Namespace, StoreKey, Ttl};
use baton_redis::{RedisClusterStore, RedisStore};
use baton_testkit::process::{self, ChildTest};
use baton_testkit::redis::{RedisOptions as ServerOptions, RedisServer};
use baton_testkit::redis_cluster::RedisCluster;

const URL_ENV: &str = "BATON_TEST_REDISS_URL";

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_connects_with_a_trusted_certificate_and_refuses_an_untrusted_one() {
    if process::role().is_some() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    baton_testkit::tls::certificates(dir.path());
    let path = |name: &str| dir.path().join(name).to_string_lossy().into_owned();
    // The plain port is what the testkit waits on; the TLS port is the one under test.
    let tls_port = free_port().to_string();
    let server = tokio::task::spawn_blocking({
        let args = vec![
            "--tls-port".to_owned(),
            tls_port.clone(),
            "--tls-cert-file".to_owned(),
            path("server.crt"),
            "--tls-key-file".to_owned(),
            path("server.key"),
            "--tls-auth-clients".to_owned(),
            "no".to_owned(),
        ];
        move || RedisServer::start_with(ServerOptions::new().args(args))
    })
    .await
    .unwrap()
    .expect("a private redis-server with a TLS port");
    let url = format!("rediss://127.0.0.1:{tls_port}/0?connect_timeout=2s&response_timeout=2s");

    // Without the CA, the certificate is not trusted.
    let err = RedisStore::connect(&url).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");

    run_client_trusting(dir.path(), "tls_client", URL_ENV, &url).await;
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the client half of rediss_connects_with_a_trusted_certificate_and_refuses_an_untrusted_one"]
async fn tls_client() {
    if process::role().is_none() {
        return;
    }
    let url = std::env::var(URL_ENV).unwrap();
    let store = RedisStore::connect(&url).await.expect("rediss:// connects");
    let key = Namespace::new("tls")
        .unwrap()
        .qualify(KeyKind::Lock, &Key::new("k").unwrap());
    let other = RedisStore::connect(&url).await.expect("rediss:// connects");
    hands_over_by_push(&store, &other, &key).await;
    // The certificate names localhost too.
    let by_name = url.replace("127.0.0.1", "localhost");
    RedisStore::connect(&by_name)
        .await
        .expect("rediss://localhost connects");
}

const CLUSTER_URL_ENV: &str = "BATON_TEST_REDISS_CLUSTER_URL";

/// `rediss+cluster://` end to end: a private cluster (three masters, three replicas) whose
/// nodes take TLS clients and talk TLS on the cluster bus. Without the CA the seed nodes'
/// certificate is not trusted; with it (the child), the store follows the slot map to every
/// master over TLS, and a release wakes a waiter of another store over sharded pub/sub on TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_cluster_connects_with_a_trusted_certificate_and_refuses_an_untrusted_one() {
    if process::role().is_some() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    baton_testkit::tls::certificates(dir.path());
    let cluster = tokio::task::spawn_blocking({
        let certificates = dir.path().to_owned();
        move || RedisCluster::start_tls(&certificates)
    })
    .await
    .unwrap()
    .expect("a private Redis Cluster with TLS ports");
    let url = format!(
        "{}?connect_timeout=2s&response_timeout=2s",
        cluster.tls_url().expect("TLS ports")
    );

    // Without the CA, the certificate is not trusted.
    let err = RedisClusterStore::connect(&url).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");

    run_client_trusting(dir.path(), "tls_cluster_client", CLUSTER_URL_ENV, &url).await;
    drop(cluster);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the client half of rediss_cluster_connects_with_a_trusted_certificate_and_refuses_an_untrusted_one"]
async fn tls_cluster_client() {
    if process::role().is_none() {
        return;
    }
    let url = std::env::var(CLUSTER_URL_ENV).unwrap();
    let store = RedisClusterStore::connect(&url)
        .await
        .expect("rediss+cluster:// connects");
    let other = RedisClusterStore::connect(&url)
        .await
        .expect("rediss+cluster:// connects");
    let ttl = Ttl::new(Duration::from_secs(10)).unwrap();
    let namespace = Namespace::new("tls").unwrap();
    // Keys on every master: a grant and its release on each, over TLS.
    for n in 0..12 {
        let key = namespace.qualify(KeyKind::Lock, &Key::new(format!("k{n}")).unwrap());
        let holder = Holder::random();
        assert!(matches!(
            store
                .claim(&key, LeaseRequest::new(&holder, ttl))
                .await
                .unwrap(),
            Claim::Granted { .. }
        ));
        assert_eq!(
            store.release(&key, &holder).await.unwrap(),
            Release::Removed
        );
    }
    // A waiter of another store queues; the release hands it the key with a wake-up that
    // arrives over that store's sharded pub/sub connection, on TLS.
    let key = namespace.qualify(KeyKind::Lock, &Key::new("handed").unwrap());
    hands_over_by_push(&store, &other, &key).await;
}

/// Runs the client half `test` in a child process that trusts the CA in `certificates`
/// (`SSL_CERT_FILE`), given `url` in `url_env`, and waits for it to pass.
async fn run_client_trusting(certificates: &Path, test: &str, url_env: &str, url: &str) {
    let mut child = ChildTest::new(test, "client")
        .env(
            "SSL_CERT_FILE",
            certificates.join("ca.crt").to_string_lossy().into_owned(),
        )
        .env(url_env, url)
        .spawn()
        .unwrap();
    let waited = tokio::task::spawn_blocking(move || child.wait_success(Duration::from_secs(60)))
        .await
        .unwrap();
    waited.unwrap_or_else(|e| panic!("{e}"));
}

/// `store` holds `key`; a waiter of `other` queues for it, and `store`'s release hands it
/// the key with a wake-up that arrives over `other`'s pub/sub connection, on TLS.
async fn hands_over_by_push(store: &dyn LeaseStore, other: &dyn LeaseStore, key: &StoreKey) {
    let ttl = Ttl::new(Duration::from_secs(10)).unwrap();
    let holder = Holder::random();
    assert!(matches!(
        store
            .claim(key, LeaseRequest::new(&holder, ttl))
            .await
            .unwrap(),
        Claim::Granted { .. }
    ));
    let mut released = other.wakeups().hub.subscribe(key);
    assert!(matches!(
        other
            .claim(key, LeaseRequest::new(&Holder::random(), ttl))
            .await
            .unwrap(),
        Claim::Held { .. }
    ));
    assert_eq!(store.release(key, &holder).await.unwrap(), Release::Removed);
    tokio::time::timeout(Duration::from_secs(5), released.released())
        .await
        .expect("the wake-up came over TLS pub/sub");
}
