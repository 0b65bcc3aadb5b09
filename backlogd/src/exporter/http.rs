//! The HTTP endpoint: `/metrics`, `/healthz`, `/api/v1/listeners`.

use std::{
    net::SocketAddr,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use axum::{
    Json, Router,
    body::{Body, Bytes},
    extract::{Extension, State},
    http::header::CONTENT_TYPE,
    response::IntoResponse,
    routing::get,
};

use super::{figures, page::Page, server::Peer, text};
use crate::{
    api::Snapshot,
    diagnosis::{diagnose, finding::Finding},
    listeners::Listener,
    state::Live,
};

#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error(
        "cannot listen on {addr}: the address is already in use (another backlogd or \
         exporter is serving there). Fix: stop it, or pick another address with \
         `--listen HOST:PORT`"
    )]
    InUse { addr: SocketAddr },
    #[error(
        "cannot listen on {addr}: {source}. Fix: pick another address with `--listen HOST:PORT`"
    )]
    Other {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// Binds before the async runtime exists (the daemon drops capabilities before starting
/// its threads); `tokio::net::TcpListener::from_std` takes it over later.
pub fn bind(addr: SocketAddr) -> Result<std::net::TcpListener, BindError> {
    let map = |source: std::io::Error| match source.kind() {
        std::io::ErrorKind::AddrInUse => BindError::InUse { addr },
        _ => BindError::Other { addr, source },
    };
    let listener = std::net::TcpListener::bind(addr).map_err(map)?;
    listener.set_nonblocking(true).map_err(map)?;
    Ok(listener)
}

struct AppState {
    live: Live,
    page: Page,
}

/// The routes over the daemon's live state, which they only read.
pub fn router(live: Live) -> Router {
    Router::new()
        .route("/", get(index))
        .route("/metrics", get(serve_metrics))
        .route("/healthz", get(healthz))
        .route("/api/v1/listeners", get(serve_listeners))
        .route("/api/v1/snapshot", get(serve_snapshot))
        .route("/api/v1/findings", get(serve_findings))
        .with_state(Arc::new(AppState {
            live,
            page: Page::default(),
        }))
}

async fn index() -> &'static str {
    "backlogd: per-listener TCP listen-queue metrics\n\n/metrics           Prometheus metrics\n/healthz           liveness\n/api/v1/listeners  listening sockets as JSON\n/api/v1/snapshot   listeners with counters and queues, as JSON\n/api/v1/findings   what `backlogd doctor` reports, as JSON\n"
}

/// Rendered on the blocking pool and streamed (chunked encoding) while it is written: the
/// runtime's workers stay free, the client reads in parallel with the rendering, and the
/// page is never whole in memory.
async fn serve_metrics(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(4);
    tokio::task::spawn_blocking(move || {
        state.page.render_streamed(
            &state.live,
            Box::new(move |chunk| tx.blocking_send(chunk).is_ok()),
        );
    });
    (
        [(CONTENT_TYPE, text::CONTENT_TYPE)],
        Body::new(ChunkBody { rx, done: false }),
    )
}

/// The page's chunks as the renderer sends them, up to its empty end-of-page chunk. A
/// renderer that stopped without sending that (a panic) ends the body with an error, so
/// hyper cuts the connection without the final chunk and the client sees a truncated
/// response, not a short page.
struct ChunkBody {
    rx: tokio::sync::mpsc::Receiver<Bytes>,
    done: bool,
}

impl http_body::Body for ChunkBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        if self.done {
            return Poll::Ready(None);
        }
        self.rx.poll_recv(cx).map(|chunk| match chunk {
            Some(bytes) if bytes.is_empty() => {
                self.done = true;
                None
            }
            Some(bytes) => Some(Ok(http_body::Frame::data(bytes))),
            None => Some(Err(std::io::Error::other(
                "rendering /metrics stopped before the end of the page",
            ))),
        })
    }
}

/// Every listener with its counters and queue figures, plus the daemon's hook mode:
/// what `/metrics` shows, shaped for programs (`backlogd top`).
async fn serve_snapshot(
    State(state): State<Arc<AppState>>,
    peer: Option<Extension<Peer>>,
) -> Json<Snapshot> {
    Json(snapshot_for(&state, peer).await)
}

/// The snapshot as `peer` may read it. Client addresses are personal data: readers
/// elsewhere get the counts, not the prefixes, unless the operator said otherwise
/// (`drop_source_addresses_remote`).
async fn snapshot_for(state: &Arc<AppState>, peer: Option<Extension<Peer>>) -> Snapshot {
    let mut snapshot = snapshot_off_workers(state).await;
    let local = peer.is_some_and(|Extension(p)| p.is_local());
    if !local && !state.live.drop_source_addresses_remote {
        for l in &mut snapshot.listeners {
            if let Some(sources) = &mut l.drop_sources {
                sources.withhold();
            }
        }
    }
    snapshot
}

/// The snapshot, made on the blocking pool: it may wait for a scan pass (tens of ms on a
/// host with 100k open sockets) and reads every kernel map.
async fn snapshot_off_workers(state: &Arc<AppState>) -> Snapshot {
    let live = state.live.clone();
    tokio::task::spawn_blocking(move || figures::snapshot(&live))
        .await
        // As before it moved here: a panic while building it fails the request.
        .unwrap_or_else(|e| panic!("building the snapshot failed: {e}"))
}

/// What `backlogd doctor` would say, for automation and `top`.
async fn serve_findings(
    State(state): State<Arc<AppState>>,
    peer: Option<Extension<Peer>>,
) -> Json<Vec<Finding>> {
    // Made from what this reader may see: a finding quotes the largest source prefix.
    Json(diagnose(&snapshot_for(&state, peer).await))
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn serve_listeners(State(state): State<Arc<AppState>>) -> Json<Vec<Listener>> {
    let mut all: Vec<Listener> = state.live.shared.listeners().iter().cloned().collect();
    all.sort_by_key(|l| (l.netns, l.port, l.inode));
    Json(all)
}
