//! `backlogd run`: load the probes, follow the kernel's events, serve what they say.

use std::{
    collections::{HashMap, HashSet},
    net::SocketAddr,
    path::PathBuf,
    sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard},
    time::Duration,
};

use anyhow::Context as _;
use aya::maps::{MapData, RingBuf};
use backlogd_common::ListenerEvent;
use tokio::io::{Interest, unix::AsyncFd};

use crate::{
    exporter::{
        http,
        metrics::{KernelMaps, Metrics, SharedMaps},
    },
    listeners::ListenerTable,
    loader::{self, LoadOptions, modes::HookModeArg},
    queues::QueueWindows,
    sampling::{self, tcpext},
};

/// State the event loop writes and the exporters read.
#[derive(Debug, Default)]
pub struct Shared {
    listeners: RwLock<ListenerTable>,
    /// How to read each network namespace's TcpExt counters, by netns inode.
    netns_sources: Mutex<HashMap<u32, tcpext::Source>>,
}

impl Shared {
    /// The table, read-locked. Never hold one guard while taking another on the same
    /// thread: std's RwLock deadlocks then if a writer is waiting in between.
    pub fn listeners(&self) -> RwLockReadGuard<'_, ListenerTable> {
        // A panic while holding the lock cannot leave the table half-updated (apply is a
        // single insert/remove), so a poisoned lock is still good to read.
        self.listeners.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write_listeners(&self) -> RwLockWriteGuard<'_, ListenerTable> {
        self.listeners.write().unwrap_or_else(|e| e.into_inner())
    }

    /// TcpExt counters of every namespace that has listeners. A namespace whose known
    /// source no longer leads to it is skipped until the next scan finds another.
    pub fn netns_counters(&self) -> Vec<(u32, HashMap<String, u64>)> {
        let wanted: HashSet<u32> = self.listeners().iter().map(|l| l.netns).collect();
        let sources = self.netns_sources.lock().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<(u32, HashMap<String, u64>)> = wanted
            .into_iter()
            .filter_map(|ns| Some((ns, sources.get(&ns)?.read(ns)?)))
            .collect();
        out.sort_by_key(|(ns, _)| *ns);
        out
    }

    /// Listen sysctls of every namespace that has listeners.
    pub fn netns_sysctls(&self) -> Vec<(u32, tcpext::ListenSysctls)> {
        let wanted: HashSet<u32> = self.listeners().iter().map(|l| l.netns).collect();
        let sources = self.netns_sources.lock().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<(u32, tcpext::ListenSysctls)> = wanted
            .into_iter()
            .filter_map(|ns| Some((ns, sources.get(&ns)?.sysctls(ns)?)))
            .collect();
        out.sort_by_key(|(ns, _)| *ns);
        out
    }

    fn note_netns(&self, netns: u32, source: tcpext::Source) {
        self.netns_sources
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(netns, source);
    }
}

pub struct RunConfig {
    /// Told the bound address once the probes are attached and the socket is serving.
    pub ready: Option<std::sync::mpsc::Sender<SocketAddr>>,
    pub listen: SocketAddr,
    pub btf: PathBuf,
    pub rescan_interval: Duration,
    pub hwm_window: Duration,
    pub hook_mode: HookModeArg,
    pub pin_dir: Option<PathBuf>,
}

pub async fn run(config: RunConfig) -> anyhow::Result<()> {
    // Bind first: a taken port should fail before anything touches the kernel.
    let socket = http::bind(config.listen).await?;
    let probes = loader::load(&LoadOptions {
        btf: config.btf,
        hook_mode: config.hook_mode,
        pin_dir: config.pin_dir,
    })
    .context("cannot start")?;
    tracing::info!(
        mode = probes.mode.name(),
        kernel_fentry = probes.kernel.fentry,
        kernel_kprobe = probes.kernel.kprobe,
        adopted = probes.adopted,
        "probes attached: listener lifecycle via tracepoints; SYN path in {} mode",
        probes.mode.name()
    );

    let shared = Arc::new(Shared::default());
    let events = tokio::spawn(follow_listener_events(
        probes.listener_events,
        shared.clone(),
    ));
    // Events are flowing, so a listener cannot slip between the scan and them; after this
    // first scan the table also holds what was listening before we started.
    rescan(&shared).await;
    let rescans = tokio::spawn(rescan_periodically(shared.clone(), config.rescan_interval));
    let maps = Arc::new(Mutex::new(KernelMaps {
        events_lost: probes.listener_events_lost,
        listener_stats: probes.listener_stats,
        listener_stats_full: probes.listener_stats_full,
        listener_queues: probes.listener_queues,
        queue_epoch: probes.queue_epoch,
        programs: probes.programs,
    }));
    let windows = Arc::new(Mutex::new(QueueWindows::new(config.hwm_window)));
    let sampler = tokio::spawn(sample_queues(maps.clone(), windows.clone()));
    let metrics = Metrics::new(
        shared.clone(),
        maps,
        windows,
        probes.mode,
        probes.kernel,
        probes.enqueue_events,
    );
    let addr = socket.local_addr()?;
    tracing::info!("serving metrics on http://{addr}/metrics");
    if let Some(ready) = &config.ready {
        let _ = ready.send(addr);
    }
    let server = axum::serve(socket, http::router(metrics, shared))
        .with_graceful_shutdown(shutdown_signal());
    tokio::select! {
        served = server => served.context("HTTP server failed")?,
        followed = events => followed.context("event loop panicked")?.context("event loop failed")?,
    }
    rescans.abort();
    sampler.abort();
    tracing::info!("shutting down");
    Ok(())
}

/// Runs the daemon on a background thread serving on a loopback port (for tools that
/// need one when none is running); returns the address once it serves.
pub fn spawn_standalone() -> anyhow::Result<SocketAddr> {
    let (tx, rx) = std::sync::mpsc::channel();
    let config = RunConfig {
        ready: Some(tx),
        listen: "127.0.0.1:0".parse().expect("literal address"),
        btf: crate::loader::btf::KERNEL_BTF.into(),
        rescan_interval: Duration::from_secs(30),
        hwm_window: Duration::from_secs(60),
        hook_mode: HookModeArg::Auto,
        pin_dir: None,
    };
    let (err_tx, err_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let result = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .map_err(anyhow::Error::from)
            .and_then(|rt| rt.block_on(run(config)));
        if let Err(e) = result {
            let _ = err_tx.send(e);
        }
    });
    match rx.recv() {
        Ok(addr) => Ok(addr),
        Err(_) => Err(err_rx
            .recv()
            .unwrap_or_else(|_| anyhow::anyhow!("the standalone daemon stopped"))),
    }
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
            let mut table = shared.write_listeners();
            while let Some(item) = ring.next() {
                match parse_event(&item) {
                    Some(event) => {
                        if event.kind == backlogd_common::event_kind::LISTEN {
                            // The listening thread is in the socket's namespace: a cheap
                            // way to read that namespace's counters until a scan.
                            shared.note_netns(
                                event.netns,
                                tcpext::Source::Task {
                                    pid: event.tgid,
                                    tid: event.pid,
                                },
                            );
                        }
                        table.apply(&event)
                    }
                    None => tracing::warn!(len = item.len(), "short listener event"),
                }
            }
        }
        guard.clear_ready();
    }
}

/// Reconciles the table with the kernel's own list of listeners.
async fn rescan(shared: &Arc<Shared>) {
    let generation = shared.write_listeners().begin_scan();
    let Ok(scan) = tokio::task::spawn_blocking(sampling::scan).await else {
        tracing::warn!("sock_diag scan panicked");
        return;
    };
    {
        // Scan results replace older sources; sources noted from events for namespaces
        // the scan did not see stay while listeners live there.
        let in_use: HashSet<u32> = shared.listeners().iter().map(|l| l.netns).collect();
        let scanned: HashSet<u32> = scan.netns.iter().map(|(ns, _)| *ns).collect();
        let mut sources = shared
            .netns_sources
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        sources.retain(|ns, _| scanned.contains(ns) || in_use.contains(ns));
        sources.extend(scan.netns);
    }
    let found = scan.listeners;
    let listed = scan.listed;
    let unknown: HashSet<u64> = {
        let table = shared.listeners();
        found
            .iter()
            .map(|d| d.inode)
            .filter(|&i| !table.contains(i))
            .collect()
    };
    let owners = tokio::task::spawn_blocking(move || sampling::owners::find(&unknown))
        .await
        .unwrap_or_default();
    let (added, removed) = shared
        .write_listeners()
        .finish_scan(generation, &found, &listed, &owners);
    if added + removed > 0 {
        tracing::info!(
            added,
            removed,
            listeners = found.len(),
            "sock_diag scan reconciled listeners"
        );
    }
}

/// Every second, moves the kernel's queue maxima into the high-water-mark windows.
async fn sample_queues(maps: SharedMaps, windows: Arc<Mutex<QueueWindows>>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let mut maps = maps.lock().unwrap_or_else(|e| e.into_inner());
        let mut windows = windows.lock().unwrap_or_else(|e| e.into_inner());
        let maps = &mut *maps;
        windows.sample(
            &maps.listener_queues,
            &mut maps.queue_epoch,
            std::time::Instant::now(),
        );
    }
}

async fn rescan_periodically(shared: Arc<Shared>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        rescan(&shared).await;
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
