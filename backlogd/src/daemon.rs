//! `backlogd run`: load the probes, follow the kernel's events, serve what they say.

use std::{
    net::SocketAddr,
    path::PathBuf,
    sync::{Arc, RwLock, RwLockReadGuard},
};

use anyhow::Context as _;
use aya::maps::{MapData, RingBuf};
use backlogd_common::ListenerEvent;
use tokio::io::{Interest, unix::AsyncFd};

use crate::{
    exporter::{http, metrics::Metrics},
    listeners::ListenerTable,
    loader::{self, LoadOptions},
};

/// State the event loop writes and the exporters read.
#[derive(Debug, Default)]
pub struct Shared {
    listeners: RwLock<ListenerTable>,
}

impl Shared {
    pub fn listeners(&self) -> RwLockReadGuard<'_, ListenerTable> {
        // A panic while holding the lock cannot leave the table half-updated (apply is a
        // single insert/remove), so a poisoned lock is still good to read.
        self.listeners.read().unwrap_or_else(|e| e.into_inner())
    }
}

pub struct RunConfig {
    pub listen: SocketAddr,
    pub btf: PathBuf,
}

pub async fn run(config: RunConfig) -> anyhow::Result<()> {
    // Bind first: a taken port should fail before anything touches the kernel.
    let socket = http::bind(config.listen).await?;
    let probes = loader::load(&LoadOptions { btf: config.btf }).context("cannot start")?;
    tracing::info!("probes attached: listener lifecycle via tracepoints");

    let shared = Arc::new(Shared::default());
    let events = tokio::spawn(follow_listener_events(
        probes.listener_events,
        shared.clone(),
    ));
    let metrics = Metrics::new(shared.clone(), probes.listener_events_lost);
    let addr = socket.local_addr()?;
    tracing::info!("serving metrics on http://{addr}/metrics");
    let server = axum::serve(socket, http::router(metrics, shared))
        .with_graceful_shutdown(shutdown_signal());
    tokio::select! {
        served = server => served.context("HTTP server failed")?,
        followed = events => followed.context("event loop panicked")?.context("event loop failed")?,
    }
    tracing::info!("shutting down");
    Ok(())
}

async fn follow_listener_events(ring: RingBuf<MapData>, shared: Arc<Shared>) -> anyhow::Result<()> {
    // SAFETY: the RingBuf owns its map fd, which stays open and unchanged while the
    // AsyncFd owns the RingBuf.
    let mut fd = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
        .map_err(|e| e.into_parts().1)
        .context("polling the listener event ring buffer")?;
    loop {
        let mut guard = fd.readable_mut().await?;
        {
            let ring = guard.get_inner_mut();
            let mut table = shared.listeners.write().unwrap_or_else(|e| e.into_inner());
            while let Some(item) = ring.next() {
                match parse_event(&item) {
                    Some(event) => table.apply(&event),
                    None => tracing::warn!(len = item.len(), "short listener event"),
                }
            }
        }
        guard.clear_ready();
    }
}

fn parse_event(bytes: &[u8]) -> Option<ListenerEvent> {
    if bytes.len() < size_of::<ListenerEvent>() {
        return None;
    }
    // SAFETY: ListenerEvent is repr(C) plain data and `bytes` holds at least one.
    Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<ListenerEvent>()) })
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("installing SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
