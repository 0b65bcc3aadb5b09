//! The HTTP server loop, hardened so that no client can stall a scrape or the shutdown:
//!
//! - every connection has a deadline for its request head (and TLS handshake), a read
//!   idle timeout and a write stall timeout, so slowloris and slow readers are cut;
//! - request heads are bounded (431 past `max_header_bytes`);
//! - at most `max_connections` are open; a new connection past that evicts the oldest one
//!   with no request in flight, so a flood of idle or slow connections cannot lock a
//!   scraper out (it would if new connections were refused instead);
//! - on shutdown open connections get `shutdown_timeout` to finish, then are cut.
//!
//! Settings come through a watch channel, so SIGHUP changes limits, TLS and users for
//! new connections without dropping the listening socket.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    pin::Pin,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use axum::{
    Router,
    extract::{Request, State},
    http::{HeaderValue, StatusCode, header},
    middleware::Next,
    response::{IntoResponse, Response},
};
use hyper_util::{rt::TokioIo, service::TowerToHyperService};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::{TcpListener, TcpStream},
    sync::watch,
    task::{AbortHandle, JoinSet},
};
use tokio_io_timeout::TimeoutStream;

use super::webconfig::WebConfig;
use crate::config::HttpConfig;

/// What the server works with; replaced whole on reload.
#[derive(Debug, Clone)]
pub struct HttpSettings {
    pub limits: HttpConfig,
    pub web: WebConfig,
}

impl HttpSettings {
    pub fn load(limits: &HttpConfig) -> Result<Self, super::webconfig::WebConfigError> {
        let web = match &limits.web_config_file {
            Some(path) => WebConfig::load(path)?,
            None => WebConfig::default(),
        };
        Ok(Self {
            limits: limits.clone(),
            web,
        })
    }
}

pub type Settings = watch::Receiver<Arc<HttpSettings>>;

/// Adds basic auth (when the web config has users) in front of every route.
pub fn with_auth(router: Router, settings: Settings) -> Router {
    router.layer(axum::middleware::from_fn_with_state(settings, require_auth))
}

async fn require_auth(State(settings): State<Settings>, req: Request, next: Next) -> Response {
    let auth = settings.borrow().web.auth.clone();
    if let Some(auth) = auth {
        let header = req
            .headers()
            .get(header::AUTHORIZATION)
            .map(HeaderValue::as_bytes);
        if !auth.allows(header).await {
            return (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Basic realm=\"backlogd\"")],
                "unauthorized\n",
            )
                .into_response();
        }
    }
    next.run(req).await
}

/// One open connection, as the eviction policy sees it.
struct Conn {
    /// Requests being answered right now; 0 means idle, a slow header, or a TLS handshake.
    busy: Arc<AtomicUsize>,
    abort: AbortHandle,
}

#[derive(Default)]
struct Conns {
    next_id: u64,
    /// By id, which grows with accept time: the first idle entry is the oldest idle one.
    open: BTreeMap<u64, Conn>,
}

/// Removes its connection from the table however the task ends (done, failed, aborted).
struct Registration {
    conns: Arc<Mutex<Conns>>,
    id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        lock(&self.conns).open.remove(&self.id);
    }
}

fn lock(conns: &Mutex<Conns>) -> std::sync::MutexGuard<'_, Conns> {
    conns.lock().unwrap_or_else(|e| e.into_inner())
}

/// Serves `router` on `listener` until `shutdown` resolves, then lets open connections
/// finish for up to the configured shutdown timeout and cuts the rest.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    settings: Settings,
    shutdown: impl Future<Output = ()>,
) {
    let conns = Arc::new(Mutex::new(Conns::default()));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let current = settings.borrow().clone();
                    if !make_room(&conns, current.limits.max_connections) {
                        tracing::debug!(%peer, "connection refused: every slot has a request in flight");
                        continue;
                    }
                    let busy = Arc::new(AtomicUsize::new(0));
                    let id = {
                        let mut c = lock(&conns);
                        c.next_id += 1;
                        c.next_id
                    };
                    let registration = Registration { conns: conns.clone(), id };
                    let abort = tasks.spawn(connection(
                        stream,
                        peer,
                        current,
                        router.clone(),
                        busy.clone(),
                        stop_rx.clone(),
                        registration,
                    ));
                    lock(&conns).open.insert(id, Conn { busy, abort });
                }
                Err(e) => {
                    // Out of fds or memory: back off instead of spinning on accept.
                    tracing::warn!(error = %e, "accepting an HTTP connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
    }
    drop(listener);
    let grace = Duration::from_secs(settings.borrow().limits.shutdown_timeout);
    let _ = stop_tx.send(true);
    let open = tasks.len();
    let finished =
        tokio::time::timeout(grace, async { while tasks.join_next().await.is_some() {} }).await;
    if finished.is_err() {
        tracing::info!(
            open,
            left = tasks.len(),
            "cutting HTTP connections still open {grace:?} after shutdown began"
        );
        tasks.shutdown().await;
    }
}

/// Ensures a slot for one more connection: evicts the oldest idle connection when full.
/// False when every open connection is in the middle of a request.
fn make_room(conns: &Mutex<Conns>, max: u64) -> bool {
    let mut c = lock(conns);
    if (c.open.len() as u64) < max {
        return true;
    }
    let victim = c
        .open
        .iter()
        .find(|(_, conn)| conn.busy.load(Ordering::Relaxed) == 0)
        .map(|(id, _)| *id);
    match victim {
        Some(id) => {
            if let Some(conn) = c.open.remove(&id) {
                conn.abort.abort();
            }
            tracing::debug!(
                max,
                "connection limit reached: closed the oldest idle connection"
            );
            true
        }
        None => false,
    }
}

async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    settings: Arc<HttpSettings>,
    router: Router,
    busy: Arc<AtomicUsize>,
    stop: watch::Receiver<bool>,
    _registration: Registration,
) {
    let limits = &settings.limits;
    let _ = stream.set_nodelay(true);
    let mut io = TimeoutStream::new(stream);
    io.set_read_timeout(Some(Duration::from_secs(limits.idle_timeout)));
    io.set_write_timeout(Some(Duration::from_secs(limits.write_timeout)));
    let io = Box::pin(io);
    match &settings.web.tls {
        Some(tls) => {
            let handshake = Duration::from_secs(limits.read_header_timeout);
            match tokio::time::timeout(handshake, tls.accept(io)).await {
                Ok(Ok(tls_stream)) => {
                    serve_connection(tls_stream, &settings, router, busy, stop).await
                }
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
            }
        }
        None => serve_connection(io, &settings, router, busy, stop).await,
    }
}

async fn serve_connection<I>(
    io: I,
    settings: &HttpSettings,
    router: Router,
    busy: Arc<AtomicUsize>,
    mut stop: watch::Receiver<bool>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let limits = &settings.limits;
    let max_head = usize::try_from(limits.max_header_bytes).unwrap_or(usize::MAX);
    let tower = TowerToHyperService::new(router);
    let service = hyper::service::service_fn(move |req| {
        let guard = BusyGuard::new(busy.clone());
        let call = hyper::service::Service::call(&tower, req);
        async move {
            let response = call.await;
            drop(guard);
            response
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(Duration::from_secs(limits.read_header_timeout))
        .max_header_size(max_head)
        .max_buf_size(max_head.max(8192))
        .keep_alive(true);
    let conn = builder.serve_connection(TokioIo::new(io), service);
    let mut conn: Pin<&mut _> = std::pin::pin!(conn);
    tokio::select! {
        result = conn.as_mut() => {
            if let Err(e) = result {
                tracing::debug!(error = %e, "HTTP connection ended with an error");
            }
        }
        _ = async { stop.wait_for(|stop| *stop).await.is_ok() } => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}

/// Marks a connection busy while one of its requests is being answered.
struct BusyGuard(Arc<AtomicUsize>);

impl BusyGuard {
    fn new(busy: Arc<AtomicUsize>) -> Self {
        busy.fetch_add(1, Ordering::Relaxed);
        Self(busy)
    }
}

impl Drop for BusyGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}
