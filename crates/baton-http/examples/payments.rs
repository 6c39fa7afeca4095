//! A payment service whose charges run once per `Idempotency-Key`, however often clients
//! retry and whichever replica the retries reach.
//!
//! ```text
//! cargo run -p baton-http --example payments -- --listen 127.0.0.1:3000
//! curl -s -X POST localhost:3000/charges -H 'Idempotency-Key: 8e0f...' \
//!      -H 'Content-Type: application/json' -d '{"card": "4242", "amount": 1000}'
//! curl -s localhost:3000/cards/4242          # {"charged":1000}, however many retries
//! ```
//!
//! - `POST /charges` takes `{"card": "...", "amount": N}` and needs an `Idempotency-Key`
//!   header (`400` without one). It answers `201` with the charge.
//! - `GET /cards/{card}` answers `{"charged": TOTAL}`: what this replica charged the card.
//!
//! The store is `BATON_STORE` (`memory://`, `sqlite:///path.db`, `redis://host`), by
//! default the embedded SQLite file of `baton::store::default_url()`. Run two replicas on
//! one SQLite file or one Redis and send retries to both: each charge happens once.
//! `PAYMENTS_CHARGE_DELAY_MS` makes each charge take that long (to see retries wait).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use baton_http::{IdempotencyLayer, IdempotentRequest};
use serde::Deserialize;
use serde_json::{Value, json};

#[derive(Default)]
struct Ledger {
    charged: Mutex<HashMap<String, u64>>,
    charges: AtomicU64,
    delay: Duration,
}

#[derive(Deserialize)]
struct Charge {
    card: String,
    amount: u64,
}

async fn charge(
    State(ledger): State<Arc<Ledger>>,
    idempotency: Option<Extension<IdempotentRequest>>,
    Json(charge): Json<Charge>,
) -> (StatusCode, Json<Value>) {
    if charge.card.is_empty() || charge.amount == 0 {
        let error = json!({"error": "invalid_charge", "message": "card must be non-empty and amount positive"});
        return (StatusCode::BAD_REQUEST, Json(error));
    }
    // The "payment provider" call.
    tokio::time::sleep(ledger.delay).await;
    *ledger
        .charged
        .lock()
        .unwrap()
        .entry(charge.card.clone())
        .or_default() += charge.amount;
    let id = ledger.charges.fetch_add(1, Ordering::SeqCst) + 1;
    let attempt = idempotency.map_or(0, |Extension(r)| r.attempt);
    let body = json!({
        "id": format!("ch_{}_{id}", std::process::id()),
        "card": charge.card,
        "amount": charge.amount,
        "attempt": attempt,
    });
    (StatusCode::CREATED, Json(body))
}

async fn card(State(ledger): State<Arc<Ledger>>, Path(card): Path<String>) -> Json<Value> {
    let charged = ledger
        .charged
        .lock()
        .unwrap()
        .get(&card)
        .copied()
        .unwrap_or(0);
    Json(json!({ "charged": charged }))
}

/// Runs the service with command-line `args` (without the program name) until killed.
pub async fn run(args: Vec<String>) -> Result<(), Box<dyn std::error::Error>> {
    let listen: SocketAddr = match args.as_slice() {
        [flag, addr] if flag == "--listen" => addr.parse()?,
        [] => "127.0.0.1:3000".parse()?,
        _ => return Err("usage: payments [--listen ADDR]".into()),
    };
    let url = match std::env::var("BATON_STORE") {
        Ok(url) if !url.is_empty() => url,
        _ => baton::store::default_url()?,
    };
    let delay = match std::env::var("PAYMENTS_CHARGE_DELAY_MS") {
        Ok(ms) => Duration::from_millis(ms.parse()?),
        Err(_) => Duration::ZERO,
    };
    let baton = baton::connect(&url).await?;
    let idempotency = IdempotencyLayer::builder(baton.idempotency()?)
        .domain("payments")
        .require_key(true)
        .build()?;
    let ledger = Arc::new(Ledger {
        delay,
        ..Ledger::default()
    });
    let app = Router::new()
        .route("/charges", post(charge))
        .route("/cards/{card}", get(card))
        .layer(idempotency)
        .with_state(ledger);
    let listener = tokio::net::TcpListener::bind(listen).await?;
    // Tests read this line to find the port when listening on port 0.
    println!(
        "payments: listening on http://{} (store {})",
        listener.local_addr()?,
        baton.store().name()
    );
    axum::serve(listener, app).await?;
    Ok(())
}

#[tokio::main]
async fn main() {
    if let Err(e) = run(std::env::args().skip(1).collect()).await {
        eprintln!("payments: {e}");
        std::process::exit(1);
    }
}
