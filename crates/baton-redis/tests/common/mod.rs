//! Helpers shared by this crate's integration tests: private servers, a raw connection for
//! operator actions, and a capture of emitted telemetry events.

#![allow(dead_code, unreachable_pub)]

use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

use async_trait::async_trait;
use baton_core::StoreKey;
use baton_redis::RedisStore;
use baton_testkit::harness::{Evictor, Opener, Stores};
use baton_testkit::redis::{RedisOptions as ServerOptions, RedisServer};
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

/// Starts a private redis-server (never the machine's own), off the async worker.
pub async fn server() -> RedisServer {
    server_with(ServerOptions::new()).await
}

/// Starts a private redis-server with extra arguments.
pub async fn server_with(options: ServerOptions) -> RedisServer {
    tokio::task::spawn_blocking(move || RedisServer::start_with(options))
        .await
        .unwrap()
        .expect("a private redis-server")
}

/// Kills `server` (its port stays reserved for [`restart`]), off the async workers.
pub async fn kill(server: &Arc<RedisServer>) {
    let server = Arc::clone(server);
    tokio::task::spawn_blocking(move || server.kill())
        .await
        .unwrap();
}

/// Starts a killed `server` again on its port, off the async workers.
pub async fn restart(server: &Arc<RedisServer>) {
    let server = Arc::clone(server);
    tokio::task::spawn_blocking(move || server.restart())
        .await
        .unwrap()
        .expect("the server restarts on its port");
}

/// A store on `server` with short timeouts, so a failing test fails fast.
pub async fn store(server: &RedisServer) -> RedisStore {
    RedisStore::connect(&format!(
        "{}?connect_timeout=1s&response_timeout=1s",
        server.url()
    ))
    .await
    .expect("connect to the private server")
}

/// Locks in namespace `ns` over a store of their own (a new connection) on `server`, as
/// another process would have.
pub async fn locks(server: &RedisServer, ns: &str) -> baton_core::Locks {
    let ns = baton_core::Namespace::new(ns).expect("a valid namespace");
    baton_core::Locks::with_namespace(Arc::new(store(server).await), ns)
}

/// Opens stores (new connections) on a private server of the harness's own; evicts a grant
/// with an operator's `DEL` of the grant and its fence counter.
pub struct PrivateServer(pub RedisServer);

#[async_trait]
impl Opener for PrivateServer {
    type Store = RedisStore;

    async fn open(&self) -> RedisStore {
        store(&self.0).await
    }
}

#[async_trait]
impl Evictor for PrivateServer {
    async fn evict(&self, key: &StoreKey) {
        let grant = format!("{{{}}}", key.as_str());
        let counter = format!("{grant}:fence");
        let mut conn = raw(&self.0.url()).await;
        let deleted: i64 = redis::cmd("DEL")
            .arg(&grant)
            .arg(&counter)
            .query_async(&mut conn)
            .await
            .expect("operator DEL");
        assert!(deleted >= 1, "nothing to evict at {grant}");
    }
}

/// The conformance harness on a private server of its own.
pub async fn harness() -> Stores<PrivateServer> {
    Stores::new(PrivateServer(server().await))
}

/// A raw multiplexed connection, as an operator's `redis-cli` would have.
pub async fn raw(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("raw connection")
}

/// The telemetry events emitted by this test process, as `(event key, message)`.
///
/// One process-wide subscriber records them (thread-local subscribers lose events when tests
/// on other threads register the same call sites first), so tests that run at the same time
/// see each other's events: filter by something only yours contain, such as the server's
/// address, which every store message names.
pub struct Events;

/// `(event key, message)` of every event seen.
type Seen = Arc<Mutex<Vec<(String, String)>>>;

static SEEN: OnceLock<Seen> = OnceLock::new();

impl Events {
    pub fn capture() -> Events {
        SEEN.get_or_init(|| {
            let seen = Arc::new(Mutex::new(Vec::new()));
            let subscriber = tracing_subscriber::registry().with(Capture(Arc::clone(&seen)));
            tracing::subscriber::set_global_default(subscriber)
                .expect("no other global subscriber in this test binary");
            seen
        });
        Events
    }

    /// How many `key` events named `server` (e.g. `127.0.0.1:6380`) in their message.
    pub fn count(&self, key: &str, server: &str) -> usize {
        SEEN.get()
            .expect("capturing")
            .lock()
            .unwrap()
            .iter()
            .filter(|(k, message)| k == key && message.contains(server))
            .count()
    }

    pub fn all(&self) -> Vec<(String, String)> {
        SEEN.get().expect("capturing").lock().unwrap().clone()
    }
}

struct Capture(Seen);

impl<S: tracing::Subscriber> Layer<S> for Capture {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        #[derive(Default)]
        struct Fields {
            event: Option<String>,
            message: String,
        }
        impl Visit for Fields {
            fn record_str(&mut self, field: &Field, value: &str) {
                if field.name() == "event" {
                    self.event = Some(value.to_owned());
                }
            }
            fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
                if field.name() == "message" {
                    self.message = format!("{value:?}");
                }
            }
        }
        let mut fields = Fields::default();
        event.record(&mut fields);
        if let Some(key) = fields.event {
            self.0.lock().unwrap().push((key, fields.message));
        }
    }
}
