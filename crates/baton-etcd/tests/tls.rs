//! `etcds://` end to end: a private three-member cluster whose members serve TLS with a
//! certificate from a private CA made for the test (with the `openssl` tool).
//!
//! With the CA as `ca_file`, locks are acquired and released over TLS, by address and by
//! name; another CA, or the platform's roots, refuse the members' certificate with an error
//! that says to check the TLS files. A cluster that demands client certificates refuses a
//! client without one and serves one with `cert_file` and `key_file`.

use std::path::Path;
use std::time::Duration;

use baton::lock::LockOptions;
use baton_core::ErrorKind;
use baton_etcd::EtcdStore;
use baton_testkit::etcd::{EtcdCluster, EtcdTls};

const TIMEOUTS: &str = "connect_timeout=2s&response_timeout=5s";

async fn tls_cluster(certs: &Path, client_certificates: bool) -> EtcdCluster {
    let tls = EtcdTls {
        cert_file: certs.join("server.crt"),
        key_file: certs.join("server.key"),
        client_ca_file: client_certificates.then(|| certs.join("ca.crt")),
    };
    tokio::task::spawn_blocking(move || {
        EtcdCluster::start_tls(tls).expect("a private three-member etcd cluster with TLS")
    })
    .await
    .unwrap()
}

fn file(dir: &Path, name: &str) -> String {
    dir.join(name).display().to_string()
}

/// A lock acquired and released through the facade on `url`; its fence.
async fn lock_round_trip(url: &str) -> u64 {
    let baton = baton::connect(url).await.expect("etcds:// opens");
    let guard = baton
        .locks()
        .acquire("tls", &LockOptions::new(Duration::from_secs(10)))
        .await
        .expect("acquired over TLS");
    let fence = guard.fence().get();
    assert_eq!(guard.release().await, baton::lock::ReleaseOutcome::Released);
    fence
}

fn assert_refused_handshake(e: &baton_core::Error, url: &str) {
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{url}: {e}");
    assert!(
        e.message()
            .contains("the TLS handshake with the members failed"),
        "{url}: {e}"
    );
    assert!(e.message().contains("check that ca_file"), "{url}: {e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcds_locks_with_the_ca_file_and_refuses_another_ca() {
    let certs = tempfile::tempdir().unwrap();
    baton_testkit::tls::certificates(certs.path());
    let other = tempfile::tempdir().unwrap();
    baton_testkit::tls::certificates(other.path());
    let cluster = tls_cluster(certs.path(), false).await;
    let tls_url = cluster.tls_url();
    assert!(tls_url.starts_with("etcds://127.0.0.1:"), "{tls_url}");

    let trusted = format!(
        "{tls_url}?ca_file={}&{TIMEOUTS}",
        file(certs.path(), "ca.crt")
    );
    let first = lock_round_trip(&trusted).await;
    // The certificate names localhost too; the fences keep increasing over TLS.
    let by_name = trusted.replace("127.0.0.1", "localhost");
    assert!(lock_round_trip(&by_name).await > first);

    // Another CA does not trust the members' certificate: refused at connect, with what to
    // check, within the timeouts.
    let wrong = format!(
        "{tls_url}?ca_file={}&{TIMEOUTS}",
        file(other.path(), "ca.crt")
    );
    let e = EtcdStore::connect(&wrong).await.unwrap_err();
    assert_refused_handshake(&e, &wrong);
    // So do the platform's roots.
    let platform = format!("{tls_url}?{TIMEOUTS}");
    let e = EtcdStore::connect(&platform).await.unwrap_err();
    assert_refused_handshake(&e, &platform);
    // Plain gRPC to a TLS port gets no answer that passes for the cluster's.
    let plain = format!("{}?{TIMEOUTS}", tls_url.replace("etcds://", "etcd://"));
    let e = EtcdStore::connect(&plain).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    // A CA file that is missing is bad input, named, before any I/O.
    let missing = format!("{tls_url}?ca_file={}", file(certs.path(), "missing.crt"));
    let e = EtcdStore::connect(&missing).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    assert!(e.message().contains("ca_file"), "{e}");
    assert!(e.message().contains("missing.crt"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_that_demand_a_client_certificate_get_it_from_cert_file_and_key_file() {
    let certs = tempfile::tempdir().unwrap();
    baton_testkit::tls::certificates(certs.path());
    let cluster = tls_cluster(certs.path(), true).await;
    let ca = file(certs.path(), "ca.crt");
    let without = format!("{}?ca_file={ca}&{TIMEOUTS}", cluster.tls_url());
    let e = EtcdStore::connect(&without).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{without}: {e}");

    // The test CA's certificate serves as the client's too (it has no usage restriction).
    let with = format!(
        "{without}&cert_file={}&key_file={}",
        file(certs.path(), "server.crt"),
        file(certs.path(), "server.key")
    );
    lock_round_trip(&with).await;
}
