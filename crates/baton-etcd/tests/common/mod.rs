//! Helpers shared by this crate's integration tests: one private three-member etcd cluster
//! per test binary, stores on it, and a raw client for operator actions.

#![allow(dead_code, unreachable_pub)]

use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use baton_core::StoreKey;
use baton_etcd::EtcdStore;
use baton_testkit::etcd::EtcdCluster;
use baton_testkit::harness::{Evictor, Opener, Stores};

static CLUSTER: OnceLock<Arc<EtcdCluster>> = OnceLock::new();

/// The cluster this test binary shares, started on first use (off the async workers).
pub async fn cluster() -> Arc<EtcdCluster> {
    if let Some(cluster) = CLUSTER.get() {
        return Arc::clone(cluster);
    }
    tokio::task::spawn_blocking(cluster_blocking).await.unwrap()
}

/// The cluster this test binary shares, for tests that are not async (started on first
/// use).
pub fn cluster_blocking() -> Arc<EtcdCluster> {
    Arc::clone(CLUSTER.get_or_init(|| {
        Arc::new(EtcdCluster::start().expect("a private three-member etcd cluster"))
    }))
}

/// A cluster of the caller's own, for tests that kill or pause members.
pub async fn private_cluster() -> Arc<EtcdCluster> {
    tokio::task::spawn_blocking(|| {
        Arc::new(EtcdCluster::start().expect("a private three-member etcd cluster"))
    })
    .await
    .unwrap()
}

/// A store on every member of `cluster`, with short timeouts so a failing test fails fast.
pub async fn store(cluster: &EtcdCluster) -> EtcdStore {
    EtcdStore::connect(&format!(
        "{}?connect_timeout=1s&response_timeout=2s",
        cluster.url()
    ))
    .await
    .expect("connect to the private cluster")
}

/// A raw client on every member, as an operator's `etcdctl` would have.
pub async fn raw(cluster: &EtcdCluster) -> etcd_client::Client {
    let endpoints: Vec<String> = (0..cluster.len())
        .map(|i| cluster.client_addr(i).to_string())
        .collect();
    etcd_client::Client::connect(endpoints, None)
        .await
        .expect("raw client")
}

/// Opens stores (new connections) on the shared cluster; evicts a grant with an operator's
/// delete of its key.
pub struct SharedCluster(pub Arc<EtcdCluster>);

#[async_trait]
impl Opener for SharedCluster {
    type Store = EtcdStore;

    async fn open(&self) -> EtcdStore {
        store(&self.0).await
    }
}

#[async_trait]
impl Evictor for SharedCluster {
    async fn evict(&self, key: &StoreKey) {
        let deleted = raw(&self.0)
            .await
            .delete(key.as_str(), None)
            .await
            .expect("operator delete")
            .deleted();
        assert_eq!(deleted, 1, "nothing to evict at {key}");
    }
}

/// The conformance harness on the shared cluster (each rule uses a namespace of its own).
pub async fn harness() -> Stores<SharedCluster> {
    Stores::new(SharedCluster(cluster().await))
}
