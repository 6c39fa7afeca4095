//! `sslmode` against a private PostgreSQL server that serves TLS with a certificate this
//! test makes (with the `openssl` tool): `verify-full` with the test CA as `sslrootcert`
//! connects, over TLS; `verify-full` without it refuses the untrusted certificate;
//! `require` encrypts without checking.

mod common;

use std::sync::Arc;
use std::time::Duration;

use baton_core::{ClaimResult, ErrorKind, LeaseOptions, Leases};
use baton_postgres::PostgresStore;
use baton_testkit::postgres::{PostgresOptions, PostgresServer};

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sslmodes_verify_the_certificate_or_refuse_it() {
    let certs = tempfile::tempdir().unwrap();
    baton_testkit::tls::certificates(certs.path());
    let (cert, key) = (
        certs.path().join("server.crt"),
        certs.path().join("server.key"),
    );
    let server = blocking(move || {
        PostgresServer::start_with(PostgresOptions::new().tls(cert, key))
            .expect("a private PostgreSQL server with TLS")
    })
    .await;
    let ca = certs.path().join("ca.crt");
    let verified = format!(
        "{}?sslmode=verify-full&sslrootcert={}",
        server.url(),
        ca.display()
    );

    let store = connect(&verified).await;
    let leases = Leases::new(Arc::new(store));
    assert!(matches!(
        leases
            .claim("k", "a", &LeaseOptions::new(Duration::from_secs(5)))
            .await
            .unwrap(),
        ClaimResult::Claimed { .. }
    ));
    let mut conn = raw(&verified).await;
    let encrypted: bool =
        sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
            .fetch_one(&mut conn)
            .await
            .unwrap();
    assert!(encrypted, "the connection is encrypted");

    // The platform's roots do not trust the test CA.
    let err = PostgresStore::connect(&with_timeouts(&format!(
        "{}?sslmode=verify-full",
        server.url()
    )))
    .await
    .expect_err("an untrusted certificate");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");

    // `require` encrypts without checking the certificate.
    connect(&format!("{}?sslmode=require", server.url())).await;
}
