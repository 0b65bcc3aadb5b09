//! The HTTP server loop, hardened so that no client can stall a scrape or the shutdown:
//!
//! - every connection has a deadline for its request head (a new connection: TLS handshake
//!   and first head within `read_header_timeout` of connecting; a kept-alive one: within
//!   `read_header_timeout` of the head's first byte), a read idle timeout and a write stall
//!   timeout, so slowloris and slow readers are cut;
//! - request heads are bounded (431 past `max_header_bytes`);
//! - at most `max_connections` are open; a new connection past that evicts an idle one
//!   (one that never sent a request first, then the oldest kept-alive one), so a flood of
//!   idle or slow connections cannot lock a scraper out (it would if new connections were
//!   refused instead). A connection whose response is not yet fully handed to the kernel
//!   is never idle, so an eviction cannot truncate a scrape;
//! - on shutdown open connections get `shutdown_timeout` to finish, then are cut.
//!
//! Settings come through a watch channel, so SIGHUP changes limits, TLS and users for
//! new connections without dropping the listening socket.

use std::{
    collections::BTreeMap,
    io,
    net::SocketAddr,
    os::fd::{AsRawFd as _, RawFd},
    pin::Pin,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use axum::{
    Router,
    body::{Body, Bytes, HttpBody},
    extract::{Request, State},
    http::{HeaderValue, StatusCode, header},
    middleware::Next,
    response::{IntoResponse, Response},
};
use hyper_util::{rt::TokioIo, service::TowerToHyperService};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
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
    state: Arc<ConnState>,
    abort: AbortHandle,
    /// The socket, to ask the kernel whether a request is waiting unread. (The task closes
    /// it a moment before its entry leaves the table, so a reused number can answer for
    /// another socket in that moment: that only changes which idle connection goes.)
    fd: RawFd,
    accepted: std::time::Instant,
}

impl Conn {
    /// Idle, and nothing waiting in the socket: a request that arrived but was not read
    /// yet (a scraper's, on a fresh connection, behind a burst of accepts) makes the
    /// connection busy, and closing it then would also reset it.
    fn evictable(&self) -> bool {
        self.state.idle() && !self.state.head_arriving(now_ms()) && !unread_bytes(self.fd)
    }
}

/// Whether the kernel holds received bytes nobody has read on socket `fd`.
fn unread_bytes(fd: RawFd) -> bool {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int; `fd` is a socket number (see `Conn::fd`).
    let rc = unsafe { libc::ioctl(fd, libc::FIONREAD, &raw mut n) };
    rc == 0 && n > 0
}

/// What the eviction policy and the request-head deadline know of a connection.
#[derive(Default)]
struct ConnState {
    /// Requests whose head was read, answered or not.
    requests: AtomicU64,
    /// Requests whose response is not yet wholly handed to the kernel: from the moment the
    /// head was read until the write after the body's end was flushed. Closing the socket
    /// earlier would truncate the response; later, the kernel still delivers what it has.
    in_flight: AtomicUsize,
    /// Responses whose body ended but whose last bytes may still sit in hyper's buffer:
    /// they leave `in_flight` at the next completed flush.
    ended_unflushed: AtomicUsize,
    /// The last answer on this connection was 401: a client without valid credentials.
    unauthorized: AtomicBool,
    /// When ([`now_ms`]) the first bytes of a request arrived while idle, 0: none since the
    /// last request began. The socket no longer holds them (`unread_bytes` says nothing)
    /// and hyper has not yet parsed a whole head (not in flight yet): without this, an
    /// eviction in that moment closed a scraper's connection with its request unanswered
    /// (seen under a wrong-password flood on a loaded machine).
    head_since_ms: AtomicU64,
}

impl ConnState {
    fn idle(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) == 0
    }

    /// A request's head is arriving (at `now`, [`now_ms`]) and has for less than
    /// [`NEW_CONNECTION_GRACE`]: the connection is not idle for eviction. A head that
    /// trickles for longer (a slowloris) is evictable again, and cut at
    /// `read_header_timeout` anyway.
    fn head_arriving(&self, now: u64) -> bool {
        let since = self.head_since_ms.load(Ordering::Acquire);
        since != 0 && now.saturating_sub(since) < NEW_CONNECTION_GRACE.as_millis() as u64
    }
}

/// Milliseconds on a clock of this process, from 1 (0 means "never" in [`ConnState`]).
fn now_ms() -> u64 {
    static BASE: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    BASE.get_or_init(std::time::Instant::now)
        .elapsed()
        .as_millis() as u64
        + 1
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
                    if !wait_for_room(&conns, current.limits.max_connections).await {
                        tracing::debug!(%peer, "connection refused: every slot has a request in flight");
                        continue;
                    }
                    let state = Arc::new(ConnState::default());
                    let fd = stream.as_raw_fd();
                    // The table stays locked until the entry is in: a task that ends at
                    // once removes its entry only after it was inserted, never before
                    // (which would leave a stale entry holding a slot).
                    let mut table = lock(&conns);
                    table.next_id += 1;
                    let id = table.next_id;
                    let registration = Registration { conns: conns.clone(), id };
                    let abort = tasks.spawn(connection(
                        stream,
                        peer,
                        current,
                        router.clone(),
                        state.clone(),
                        stop_rx.clone(),
                        registration,
                    ));
                    table.open.insert(
                        id,
                        Conn {
                            state,
                            abort,
                            fd,
                            accepted: std::time::Instant::now(),
                        },
                    );
                    drop(table);
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

/// How long a new connection may wait for a slot while every open one is busy, and how
/// often it looks. Most busy connections are a moment from done (a 401 from the refusal
/// cache takes microseconds, and makes its connection the first to go); refusing at once
/// would reset a scraper whose connection arrived in that moment. New connections wait in
/// the kernel's accept queue meanwhile.
const ROOM_WAIT: Duration = Duration::from_millis(100);
const ROOM_WAIT_STEP: Duration = Duration::from_millis(2);

/// [`make_room`], retried for up to [`ROOM_WAIT`] while every connection is busy.
async fn wait_for_room(conns: &Mutex<Conns>, max: u64) -> bool {
    let deadline = tokio::time::Instant::now() + ROOM_WAIT;
    loop {
        if make_room(conns, max) {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(ROOM_WAIT_STEP).await;
    }
}

/// How long a new connection that has not sent its request yet is spared while other
/// candidates exist: a scraper's request (after a TLS handshake, over a long path) takes
/// a round trip or three to arrive.
const NEW_CONNECTION_GRACE: Duration = Duration::from_secs(1);

/// Ensures a slot for one more connection when all are taken. In order: the oldest idle
/// connection that never sent a request, open for over [`NEW_CONNECTION_GRACE`] (a
/// flood, a slowloris, a port scan); the oldest whose last answer was 401, busy or not (a
/// client without valid credentials, e.g. a wrong-password flood, must not hold slots a
/// scraper needs); a newer one that never sent a request; the oldest idle kept-alive one
/// (a scraper that reconnects loses least). "Idle" includes nothing waiting unread (see
/// [`Conn::evictable`]). False when every open connection is busy.
fn make_room(conns: &Mutex<Conns>, max: u64) -> bool {
    let mut c = lock(conns);
    if (c.open.len() as u64) < max {
        return true;
    }
    let never_asked = |settled: bool| {
        c.open.iter().find(move |(_, conn)| {
            conn.state.requests.load(Ordering::Acquire) == 0
                && conn.evictable()
                && (!settled || conn.accepted.elapsed() >= NEW_CONNECTION_GRACE)
        })
    };
    let refused = || {
        c.open
            .iter()
            .find(|(_, conn)| conn.state.unauthorized.load(Ordering::Acquire))
    };
    let victim = never_asked(true)
        .or_else(refused)
        .or_else(|| never_asked(false))
        .or_else(|| c.open.iter().find(|(_, conn)| conn.evictable()))
        .map(|(id, _)| *id);
    match victim {
        Some(id) => {
            if let Some(conn) = c.open.remove(&id) {
                conn.abort.abort();
            }
            tracing::debug!(max, "connection limit reached: closed an idle connection");
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
    state: Arc<ConnState>,
    stop: watch::Receiver<bool>,
    _registration: Registration,
) {
    let limits = &settings.limits;
    let _ = stream.set_nodelay(true);
    let stream = Tracked::new(
        stream,
        state.clone(),
        Duration::from_secs(limits.read_header_timeout),
    );
    let mut io = TimeoutStream::new(stream);
    io.set_read_timeout(Some(Duration::from_secs(limits.idle_timeout)));
    io.set_write_timeout(Some(Duration::from_secs(limits.write_timeout)));
    let io = Box::pin(io);
    match &settings.web.tls {
        Some(tls) => {
            let handshake = Duration::from_secs(limits.read_header_timeout);
            match tokio::time::timeout(handshake, tls.accept(io)).await {
                Ok(Ok(tls_stream)) => {
                    serve_connection(tls_stream, peer, &settings, router, state, stop).await
                }
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
            }
        }
        None => serve_connection(io, peer, &settings, router, state, stop).await,
    }
}

async fn serve_connection<I>(
    io: I,
    peer: SocketAddr,
    settings: &HttpSettings,
    router: Router,
    state: Arc<ConnState>,
    mut stop: watch::Receiver<bool>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let limits = &settings.limits;
    let max_head = usize::try_from(limits.max_header_bytes).unwrap_or(usize::MAX);
    let tower = TowerToHyperService::new(router);
    let service = hyper::service::service_fn(move |mut req: hyper::Request<_>| {
        // The handlers see who asks: client addresses go only to readers on this host
        // unless the operator opted in (`drop_source_addresses_remote`).
        req.extensions_mut().insert(Peer(peer));
        let guard = InFlight::begin(state.clone());
        let call = hyper::service::Service::call(&tower, req);
        let state = state.clone();
        async move {
            let response: Response = call.await?;
            state.unauthorized.store(
                response.status() == StatusCode::UNAUTHORIZED,
                Ordering::Release,
            );
            Ok::<_, std::convert::Infallible>(response.map(|body| {
                Body::new(UntilFlushed {
                    body,
                    _guard: guard,
                })
            }))
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    // The request-head deadline is `Tracked`'s: hyper's own header timer also runs while
    // a kept-alive connection waits for its next request, which would cut every idle
    // connection after `read_header_timeout` and make `idle_timeout` meaningless.
    builder
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(None)
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

/// The address a request came from.
#[derive(Debug, Clone, Copy)]
pub struct Peer(pub SocketAddr);

impl Peer {
    /// The request came from this host: a loopback address (IPv4-mapped included).
    pub fn is_local(&self) -> bool {
        match self.0.ip() {
            std::net::IpAddr::V4(a) => a.is_loopback(),
            std::net::IpAddr::V6(a) => {
                a.is_loopback() || a.to_ipv4_mapped().is_some_and(|a| a.is_loopback())
            }
        }
    }
}

/// One request in flight on a connection, from its head until its response was flushed.
struct InFlight(Arc<ConnState>);

impl InFlight {
    fn begin(state: Arc<ConnState>) -> Self {
        state.requests.fetch_add(1, Ordering::AcqRel);
        state.in_flight.fetch_add(1, Ordering::AcqRel);
        state.head_since_ms.store(0, Ordering::Release);
        Self(state)
    }
}

impl Drop for InFlight {
    /// The body ended (or was dropped unsent): what is left is hyper's buffer, which the
    /// next completed flush hands to the kernel.
    fn drop(&mut self) {
        self.0.ended_unflushed.fetch_add(1, Ordering::AcqRel);
    }
}

/// A response body that keeps its request in flight until hyper drops it.
struct UntilFlushed {
    body: Body,
    /// Held for its drop.
    _guard: InFlight,
}

impl HttpBody for UntilFlushed {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// The connection's socket, watched: request-head deadline and flush tracking.
struct Tracked<S> {
    inner: S,
    state: Arc<ConnState>,
    head_timeout: Duration,
    /// Set while a request head is due: from accept for a new connection, from the first
    /// byte read while idle for a kept-alive one; cleared once a request begins.
    head_deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    /// `requests` when the deadline was set: a different count means that head arrived.
    deadline_for: u64,
}

impl<S> Tracked<S> {
    fn new(inner: S, state: Arc<ConnState>, head_timeout: Duration) -> Self {
        Self {
            inner,
            state,
            head_timeout,
            head_deadline: Some(Box::pin(tokio::time::sleep(head_timeout))),
            deadline_for: 0,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Tracked<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let requests = this.state.requests.load(Ordering::Acquire);
        let idle = this.state.idle();
        if this.head_deadline.is_some() && (!idle || requests != this.deadline_for) {
            this.head_deadline = None;
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if idle && buf.filled().len() > before {
                    let _ = this.state.head_since_ms.compare_exchange(
                        0,
                        now_ms(),
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    );
                }
                if idle && this.head_deadline.is_none() && buf.filled().len() > before {
                    this.head_deadline = Some(Box::pin(tokio::time::sleep(this.head_timeout)));
                    this.deadline_for = requests;
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending => {
                let expired = this
                    .head_deadline
                    .as_mut()
                    .is_some_and(|deadline| deadline.as_mut().poll(cx).is_ready());
                if expired {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "request head not complete within read_header_timeout",
                    )));
                }
                Poll::Pending
            }
            other => other,
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Tracked<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    /// hyper flushes after writing out its whole buffer, so a completed flush means every
    /// response whose body had ended is now the kernel's to deliver.
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let flushed = Pin::new(&mut self.inner).poll_flush(cx);
        if let Poll::Ready(Ok(())) = flushed {
            let done = self.state.ended_unflushed.swap(0, Ordering::AcqRel);
            if done > 0 {
                self.state.in_flight.fetch_sub(done, Ordering::AcqRel);
            }
        }
        flushed
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request whose bytes hyper has read but whose head it has not finished keeps its
    /// connection from eviction for the grace, not longer; a request that began clears it.
    #[test]
    fn a_head_arriving_is_not_idle_for_the_grace_only() {
        let state = ConnState::default();
        assert!(!state.head_arriving(now_ms()), "nothing read yet");
        state.head_since_ms.store(1000, Ordering::Release);
        assert!(state.head_arriving(1000));
        assert!(state.head_arriving(1999));
        assert!(
            !state.head_arriving(2000),
            "a slowloris is evictable after the grace"
        );
        let state = Arc::new(state);
        let _in_flight = InFlight::begin(state.clone());
        assert!(!state.head_arriving(1500), "the request began");
    }
}
