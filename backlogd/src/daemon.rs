//! `backlogd run`: load the probes, follow the kernel's events, serve what they say.

use std::{
    collections::HashSet,
    net::SocketAddr,
    sync::{Arc, Mutex, RwLock},
    time::Duration,
};

use anyhow::Context as _;
use aya::maps::{MapData, RingBuf};
use backlogd_common::ListenerEvent;
use tokio::{
    io::{Interest, unix::AsyncFd},
    sync::watch,
};

use crate::{
    config::{self, Config},
    exporter::{
        http,
        server::{self, HttpSettings},
    },
    kernel_maps::{self, SharedMaps},
    loader::{self, LoadOptions},
    names, programs,
    queues::QueueWindows,
    sampling::{self, tcpext},
    service::{self, health::Heartbeats, notify},
    state::{Live, Shared, recent},
};

pub struct RunConfig {
    /// Told the bound address once the probes are attached and the socket is serving.
    pub ready: Option<std::sync::mpsc::Sender<SocketAddr>>,
    pub config: Config,
    /// Where the settings came from, read again on SIGHUP (None: nothing to reload).
    pub source: Option<config::Source>,
    /// Applies a new log filter on reload (None where the process's logging is not ours).
    pub set_log_filter: Option<LogFilterSetter>,
    /// Give up the capabilities only loading needs once the probes are attached: the
    /// daemon does; tools running the probes in-process (`top --standalone`) need not.
    pub drop_privileges: bool,
    pub worker_threads: usize,
}

pub type LogFilterFn = dyn Fn(&str) -> anyhow::Result<()> + Send + Sync;
pub type LogFilterSetter = Box<LogFilterFn>;

/// Loads and attaches the probes, then serves until SIGTERM/SIGINT. Synchronous on
/// purpose: capabilities are per thread, so they are dropped here, after attaching and
/// before the async runtime starts any thread, and every thread it starts inherits the
/// reduced set.
pub fn run(config: RunConfig) -> anyhow::Result<()> {
    return_large_blocks_at_once();
    // Bind first: a taken port should fail before anything touches the kernel. The web
    // config too: a typo in it should not cost a probe load.
    let socket = http::bind(config.config.listen)?;
    let http_settings = HttpSettings::load(&config.config.http)?;
    let probes = loader::load(&LoadOptions {
        btf: config.config.btf.clone(),
        hook_mode: config.config.hook_mode,
        pin_dir: config.config.pin_dir.clone(),
        // validate() bounds it by MAX_LISTENERS_LIMIT, far below u32::MAX.
        max_listeners: u32::try_from(config.config.max_listeners).unwrap_or(u32::MAX),
        impact: backlogd_common::ImpactSettings {
            horizon_ns: config.config.client_impact_horizon * 1_000_000_000,
        },
        // validate() bounds it by MAX_ATTEMPTS.
        attempts: u32::try_from(config.config.client_impact_attempts).unwrap_or(u32::MAX),
    })
    .context("cannot start")?;
    release_freed_memory();
    tracing::info!(
        mode = probes.mode.name(),
        kernel_fentry = probes.kernel.fentry,
        kernel_kprobe = probes.kernel.kprobe,
        adopted = probes.adopted,
        pinned = probes.pinned,
        "probes attached: listener lifecycle via tracepoints; SYN path in {} mode",
        probes.mode.name()
    );
    if config.drop_privileges {
        let kept = service::caps::drop_to_runtime_set()?;
        tracing::info!(
            kept = ?kept.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "dropped every capability the running daemon does not need \
             (kept: setns for rescans and BPF map access, /proc of other users); the \
             bounding set is cut to the same and no_new_privs is set, so none returns"
        );
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(config.worker_threads)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let served = runtime.block_on(serve(config, socket, http_settings, probes));
    // A sock_diag scan on the blocking pool finishes in milliseconds; never wait long.
    runtime.shutdown_timeout(Duration::from_secs(1));
    served
}

async fn serve(
    config: RunConfig,
    socket: std::net::TcpListener,
    http_settings: HttpSettings,
    probes: loader::Probes,
) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut sigterm = signal(SignalKind::terminate()).context("installing a SIGTERM handler")?;
    let mut sigint = signal(SignalKind::interrupt()).context("installing a SIGINT handler")?;
    // Only a daemon with a config takes SIGHUP: an in-process daemon (`top --standalone`)
    // leaves it alone, so a closed terminal still ends the program.
    let mut sighup = match config.source {
        Some(_) => Some(signal(SignalKind::hangup()).context("installing a SIGHUP handler")?),
        None => None,
    };
    let mut current = config.config.clone();
    let web = http_settings.web.describe();
    let scheme = if http_settings.web.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let (http_tx, http_rx) = watch::channel(Arc::new(http_settings));
    let (rescan_tx, rescan_rx) = watch::channel(Duration::from_secs(current.rescan_interval));

    let shared = Arc::new(Shared::default());
    let mut events = tokio::spawn(follow_listener_events(
        probes.listener_events,
        shared.clone(),
    ));
    let maps = Arc::new(Mutex::new(probes.maps));
    // Events are flowing, so a listener cannot slip between the scan and them; after this
    // first scan the table also holds what was listening before we started.
    rescan(&shared, &maps).await;
    let heartbeats = Arc::new(Heartbeats::new());
    let rescans = tokio::spawn(rescan_periodically(
        shared.clone(),
        maps.clone(),
        rescan_rx,
        heartbeats.clone(),
    ));
    let windows = Arc::new(Mutex::new(QueueWindows::new(Duration::from_secs(
        current.hwm_window,
    ))));
    let live = Live::new(
        shared.clone(),
        maps.clone(),
        windows.clone(),
        probes.mode,
        probes.kernel,
        probes.pinned,
    );
    // The recent figures start from what the maps hold now: counts a pinned map kept
    // from before this daemon are not recent. (Attempts whose horizon passed while no
    // daemon ran are, like the abandoned counter: this daemon's sweeps count them.)
    record_impact(&maps, &live.recent);
    let sampler = tokio::spawn(sample_queues(
        maps,
        windows.clone(),
        live.recent.clone(),
        heartbeats.clone(),
        current.max_listeners,
        current.client_impact_horizon * 1_000_000_000,
    ));
    *live
        .accept_wait_buckets
        .write()
        .unwrap_or_else(|e| e.into_inner()) = current.accept_wait_buckets.clone();
    let accept_wait_buckets = live.accept_wait_buckets.clone();
    let listener =
        tokio::net::TcpListener::from_std(socket).context("registering the HTTP socket")?;
    let addr = listener.local_addr()?;
    let router = server::with_auth(http::router(live), http_rx.clone());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let mut server = tokio::spawn(server::serve(listener, router, http_rx, async move {
        let _ = stop_rx.await;
    }));
    // The socket has been listening since bind (connections queue in the kernel) and the
    // accept loop now runs: this is the moment a scrape gets an answer.
    tracing::info!("serving metrics on {scheme}://{addr}/metrics ({web})");
    notify::ready();
    if let Some(ready) = &config.ready {
        let _ = ready.send(addr);
    }
    let watchdog = notify::watchdog_interval().map(|every| {
        tracing::info!(
            "systemd watchdog on: pinging every {every:?} while the queue sampler and the \
             rescans keep finishing"
        );
        tokio::spawn(watchdog(every, heartbeats, rescan_tx.subscribe()))
    });
    let targets = ReloadTargets {
        set_log_filter: config.set_log_filter.as_deref(),
        http: &http_tx,
        rescan: &rescan_tx,
        windows: &windows,
        accept_wait_buckets: &accept_wait_buckets,
    };
    let outcome = loop {
        tokio::select! {
            _ = sigterm.recv() => break Ok("SIGTERM"),
            _ = sigint.recv() => break Ok("SIGINT"),
            Some(_) = recv_opt(&mut sighup) => {
                reload(config.source.as_ref(), &mut current, &targets)
            }
            followed = &mut events => break match followed {
                Ok(Ok(())) => Err(anyhow::anyhow!("the event loop stopped")),
                Ok(Err(e)) => Err(e.context("event loop failed")),
                Err(e) => Err(anyhow::Error::from(e).context("event loop panicked")),
            },
            served = &mut server => break Err(anyhow::anyhow!("the HTTP server stopped: {served:?}")),
        }
    };
    notify::stopping();
    match &outcome {
        Ok(signal) => tracing::info!("{signal}: shutting down"),
        Err(e) => tracing::error!("shutting down: {e:#}"),
    }
    let _ = stop_tx.send(());
    // server::serve bounds its own wait by the shutdown timeout; this is a backstop.
    let grace = Duration::from_secs(current.http.shutdown_timeout + 1);
    if tokio::time::timeout(grace, &mut server).await.is_err() {
        server.abort();
    }
    for task in [rescans, sampler] {
        task.abort();
    }
    events.abort();
    if let Some(w) = watchdog {
        w.abort();
    }
    outcome.map(|_| ())
}

/// The next signal, or never when there is no handler.
async fn recv_opt(signal: &mut Option<tokio::signal::unix::Signal>) -> Option<()> {
    match signal {
        Some(s) => s.recv().await,
        None => std::future::pending().await,
    }
}

/// What a reload can change while running.
struct ReloadTargets<'a> {
    set_log_filter: Option<&'a LogFilterFn>,
    http: &'a watch::Sender<Arc<HttpSettings>>,
    rescan: &'a watch::Sender<Duration>,
    windows: &'a Arc<Mutex<QueueWindows>>,
    accept_wait_buckets: &'a Arc<RwLock<config::AcceptWaitBuckets>>,
}

/// SIGHUP: reads the config again and applies what can change without reattaching. Any
/// error keeps the running configuration whole (nothing is half-applied: everything is
/// checked before anything changes).
fn reload(source: Option<&config::Source>, current: &mut Config, to: &ReloadTargets<'_>) {
    notify::reloading();
    match source {
        None => tracing::info!("SIGHUP: no config file to reload"),
        Some(source) => match prepare_reload(source) {
            Err(e) => tracing::error!(
                "SIGHUP: config reload failed, keeping the running configuration: {e:#}"
            ),
            Ok((new, http)) => apply_reload(source, current, new, http, to),
        },
    }
    notify::ready();
}

fn prepare_reload(source: &config::Source) -> anyhow::Result<(Config, HttpSettings)> {
    let new = source.resolve()?;
    let http = HttpSettings::load(&new.http)?;
    Ok((new, http))
}

fn apply_reload(
    source: &config::Source,
    current: &mut Config,
    mut new: Config,
    http: HttpSettings,
    to: &ReloadTargets<'_>,
) {
    for (key, old, wanted) in current.restart_only_changes(&new) {
        tracing::warn!(
            "SIGHUP: `{key}` changed from {old} to {wanted}: it takes effect only after a \
             restart (`systemctl restart backlogd`); still using {old}"
        );
    }
    new.keep_restart_only(current);
    let mut changed = Vec::new();
    if new.log != current.log {
        match to.set_log_filter {
            Some(set) => match set(&new.log) {
                Ok(()) => changed.push(format!("log {:?} -> {:?}", current.log, new.log)),
                Err(e) => {
                    tracing::error!("SIGHUP: cannot apply log filter {:?}: {e:#}", new.log);
                    new.log = current.log.clone();
                }
            },
            None => new.log = current.log.clone(),
        }
    }
    if new.rescan_interval != current.rescan_interval {
        to.rescan
            .send_replace(Duration::from_secs(new.rescan_interval));
        changed.push(format!(
            "rescan_interval {} -> {}",
            current.rescan_interval, new.rescan_interval
        ));
    }
    if new.hwm_window != current.hwm_window {
        to.windows
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .set_window(Duration::from_secs(new.hwm_window));
        changed.push(format!(
            "hwm_window {} -> {}",
            current.hwm_window, new.hwm_window
        ));
    }
    if new.accept_wait_buckets != current.accept_wait_buckets {
        *to.accept_wait_buckets
            .write()
            .unwrap_or_else(|e| e.into_inner()) = new.accept_wait_buckets.clone();
        let show = |b: &config::AcceptWaitBuckets| {
            if b.is_all() {
                "all".to_owned()
            } else {
                let bounds: Vec<String> = b.seconds().iter().map(f64::to_string).collect();
                format!("[{}]", bounds.join(", "))
            }
        };
        changed.push(format!(
            "accept_wait_buckets {} -> {} (the histogram's exported buckets)",
            show(&current.accept_wait_buckets),
            show(&new.accept_wait_buckets)
        ));
    }
    if new.http != current.http {
        changed.push("http (limits, TLS, users: for new connections)".into());
    }
    // The web config file can change under the same path (an emptied or truncated file
    // turns TLS and auth off): say what it now does, loudly if it dropped a protection.
    let (was_tls, was_auth, was) = {
        let old = &to.http.borrow().web;
        (old.tls.is_some(), old.auth.is_some(), old.describe())
    };
    let now = http.web.describe();
    if was != now {
        changed.push(format!("web config: {was} -> {now}"));
        if (was_tls && http.web.tls.is_none()) || (was_auth && http.web.auth.is_none()) {
            tracing::warn!(
                "SIGHUP: the web config now turns protection off ({was} -> {now}): /metrics \
                 and the API are served without it from now on. If that is not intended, \
                 restore the web config file and send SIGHUP again"
            );
        }
    }
    // Always replaced: the web config file may have changed even if its path did not
    // (new certificate, new users).
    to.http.send_replace(Arc::new(http));
    *current = new;
    let file = source
        .file_in_use()
        .map_or("defaults (no config file)".to_owned(), |p| {
            p.display().to_string()
        });
    tracing::info!(
        "SIGHUP: configuration reloaded from {file}; changed: {}",
        if changed.is_empty() {
            "nothing".to_owned()
        } else {
            changed.join(", ")
        }
    );
}

/// A scrape of thousands of listeners builds a page of tens of MiB and frees it. glibc
/// raises its mmap threshold after the first such free and from then on keeps those
/// blocks in the heap, so a daemon that served one big scrape would hold its size for
/// good (measured with 10k listeners: RSS 85 MiB after scrapes, 48 MiB with this). Fixed
/// thresholds make large blocks mmap'd and returned when freed.
fn return_large_blocks_at_once() {
    const LARGE: libc::c_int = 128 * 1024;
    // SAFETY: mallopt only changes allocator tunables; called before any other thread.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, LARGE);
        libc::mallopt(libc::M_TRIM_THRESHOLD, LARGE);
    }
}

/// Loading parses the kernel's BTF (tens of MiB) and frees it again; glibc keeps freed
/// heap for reuse unless asked, which would leave a long-running daemon at several times
/// the memory it uses.
fn release_freed_memory() {
    // SAFETY: malloc_trim only returns free heap pages to the kernel.
    unsafe { libc::malloc_trim(0) };
}

/// Runs the daemon on a background thread serving on a loopback port (for tools that
/// need one when none is running); returns the address once it serves.
pub fn spawn_standalone() -> anyhow::Result<SocketAddr> {
    let (tx, rx) = std::sync::mpsc::channel();
    let config = RunConfig {
        ready: Some(tx),
        config: Config {
            listen: "127.0.0.1:0".parse().expect("literal address"),
            ..Config::default()
        },
        source: None,
        set_log_filter: None,
        drop_privileges: false,
        worker_threads: 1,
    };
    let (err_tx, err_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        if let Err(e) = run(config) {
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
    // One identification pass at a time: a burst of listen() events in many batches asks
    // for one more pass, not one per batch (each pass looks at every listener not yet
    // identified, so overlapping passes repeat each other's work: with 10k churned
    // listeners under TCG they ran for tens of minutes).
    let identify = Arc::new(tokio::sync::Notify::new());
    // A JoinSet aborts its tasks when dropped: the worker ends with this function.
    let mut worker = tokio::task::JoinSet::new();
    worker.spawn({
        let (shared, identify) = (shared.clone(), identify.clone());
        async move {
            loop {
                identify.notified().await;
                // A pass over every listener only when a new one is in a container: an
                // event batch must not cost O(listeners) (10k churned listeners).
                if identify_programs(shared.clone()).await {
                    name_containers(&shared).await;
                }
            }
        }
    });
    loop {
        let mut guard = fd.readable_mut().await?;
        let mut listened = false;
        {
            let ring = guard.get_inner_mut();
            let mut table = shared.write_listeners();
            while let Some(item) = ring.next() {
                match parse_event(&item) {
                    Some(event) => {
                        if event.kind == backlogd_common::event_kind::LISTEN {
                            listened = true;
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
        if listened {
            // Off the event loop: it reads /proc and configuration files.
            identify.notify_one();
        }
    }
}

/// Looks up the program behind each listener not looked up yet (`programs/`) and its
/// owner's unit, container and pod (`names/`), one /proc read per process.
/// Whether a listener it identified is in a container.
async fn identify_programs(shared: Arc<Shared>) -> bool {
    let wanted = shared.listeners().unidentified();
    let mut in_container = false;
    if !wanted.is_empty() {
        let found = tokio::task::spawn_blocking(move || {
            let mut processes = std::collections::HashMap::new();
            // A process's program and configuration answer the same for every listener of
            // it on one port (a server can own thousands of sockets).
            let mut by_port = std::collections::HashMap::new();
            wanted
                .into_iter()
                .map(|(inode, pid, port)| {
                    let (process, names) = processes
                        .entry(pid)
                        .or_insert_with(|| (programs::Process::of(pid), names::of_process(pid)));
                    let known = by_port
                        .entry((pid, port))
                        .or_insert_with(|| {
                            process.as_ref().and_then(|p| programs::identify(p, port))
                        })
                        .clone();
                    (inode, pid, known, names.clone())
                })
                .collect::<Vec<_>>()
        })
        .await
        .unwrap_or_default();
        let mut table = shared.write_listeners();
        for (inode, pid, known, names) in found {
            in_container |= names.as_ref().is_some_and(|n| n.container.is_some());
            table.set_owner(inode, pid, known, names);
        }
    }
    in_container
}

/// Container and pod names from the runtimes (`names/runtime.rs`), for every listener in
/// a container; runs at each rescan and when an event brings a listener in a container.
async fn name_containers(shared: &Arc<Shared>) {
    let Ok(mut resolver) = shared.runtime_names.try_lock() else {
        return;
    };
    let wanted = shared.listeners().containers();
    resolver.refresh(&wanted).await;
    shared
        .write_listeners()
        .set_runtime_names(|id| resolver.get(id));
}

/// Reconciles the table with the kernel's own list of listeners.
async fn rescan(shared: &Arc<Shared>, maps: &SharedMaps) {
    let generation = shared.write_listeners().begin_scan();
    let Ok(scan) = tokio::task::spawn_blocking(sampling::scan).await else {
        tracing::warn!("sock_diag scan panicked");
        return;
    };
    shared.note_scanned_netns(scan.netns, scan.sysctls);
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
    // Listeners a daemon before this one saw listen() (the kernel keeps their events in a
    // pinned map): as exact as if this daemon had seen them.
    let seen = maps
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .listens_seen(&unknown);
    if !seen.is_empty() {
        let mut table = shared.write_listeners();
        for event in &seen {
            table.restore(event);
        }
    }
    let unknown: HashSet<u64> = unknown
        .into_iter()
        .filter(|ino| !seen.iter().any(|e| e.ino == *ino))
        .collect();
    let owners = tokio::task::spawn_blocking(move || sampling::owners::find(&unknown))
        .await
        .unwrap_or_default();
    let (added, removed) = shared
        .write_listeners()
        .finish_scan(generation, &found, &listed, &owners);
    identify_programs(shared.clone()).await;
    // Every rescan: names come once a runtime answers, and go with their containers.
    name_containers(shared).await;
    if added + removed > 0 {
        tracing::info!(
            added,
            removed,
            listeners = found.len(),
            "sock_diag scan reconciled listeners"
        );
    }
}

/// Records every listener's client-impact counters for the recent figures.
fn record_impact(maps: &SharedMaps, history: &Mutex<recent::ImpactHistory>) {
    // A Vec: the history looks nothing up by inode here, so no table is worth building.
    let stats: Vec<_> = maps
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .listener_stats();
    history.lock().unwrap_or_else(|e| e.into_inner()).record(
        std::time::Instant::now(),
        stats.iter().map(|(k, v)| (*k, v)),
    );
}

/// Every second, moves the kernel's queue maxima into the high-water-mark windows; every
/// [`sweep_every`] seconds, counts the connection attempts past the client-impact horizon
/// abandoned; about every [`recent::EVERY`], records the client-impact counters.
async fn sample_queues(
    maps: SharedMaps,
    windows: Arc<Mutex<QueueWindows>>,
    recent: Arc<Mutex<recent::ImpactHistory>>,
    heartbeats: Arc<Heartbeats>,
    max_listeners: u64,
    horizon_ns: u64,
) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut full_reported = false;
    let sweep_every = sweep_every(horizon_ns);
    let mut ticks: u64 = 0;
    loop {
        tick.tick().await;
        ticks += 1;
        {
            let mut maps = maps.lock().unwrap_or_else(|e| e.into_inner());
            let mut windows = windows.lock().unwrap_or_else(|e| e.into_inner());
            maps.sample_queues(&mut windows, std::time::Instant::now());
            // Once per run: a full map loses updates continuously while it stays full.
            if !full_reported && maps.stats_full() + maps.queues_full() > 0 {
                full_reported = true;
                tracing::warn!(
                    max_listeners,
                    "the kernel maps of listeners are full: counter updates and queue \
                     observations of listeners beyond {max_listeners} are lost (counted in \
                     backlogd_listener_stats_full_total and \
                     backlogd_listener_queue_observations_lost_total; said once). Fix: raise \
                     max_listeners (`--max-listeners`) and restart"
                );
            }
        }
        if ticks.is_multiple_of(sweep_every) {
            let maps = maps.clone();
            let swept =
                tokio::task::spawn_blocking(move || kernel_maps::sweep_attempts(&maps, horizon_ns))
                    .await
                    .unwrap_or_else(|e| {
                        tracing::error!(error = %e, "the sweep of the attempts map failed");
                        Default::default()
                    });
            if swept.abandoned > 0 {
                tracing::debug!(
                    abandoned = swept.abandoned,
                    of_closed_listeners = swept.gone,
                    tracked = swept.tracked,
                    "connection attempts past the client-impact horizon"
                );
            }
        }
        // By the clock, not by ticks: a sweep may hold the loop up.
        if recent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .due(std::time::Instant::now())
        {
            record_impact(&maps, &recent);
        }
        heartbeats.sampled();
    }
}

/// Seconds between sweeps of the attempts map: a sweep reads every tracked attempt (up to
/// client_impact_attempts of them under a SYN flood) and removes the expired ones, two
/// syscalls each, so not every second with the default 130 s horizon; an abandoned attempt
/// is counted within horizon / 26 (at most 5 s) of its horizon passing.
fn sweep_every(horizon_ns: u64) -> u64 {
    (horizon_ns / 1_000_000_000 / 26).clamp(1, 5)
}

/// Pings the systemd watchdog every `every` while the periodic jobs keep finishing; when
/// one stops, says which and stops pinging, so systemd restarts the daemon.
async fn watchdog(
    every: Duration,
    heartbeats: Arc<Heartbeats>,
    rescan_interval: watch::Receiver<Duration>,
) {
    let mut quiet = false;
    loop {
        match heartbeats.stalled(*rescan_interval.borrow()) {
            None => {
                if quiet {
                    tracing::info!("daemon healthy again: pinging the systemd watchdog");
                    quiet = false;
                }
                notify::watchdog();
            }
            Some(what) => {
                if !quiet {
                    tracing::error!(
                        "not pinging the systemd watchdog: {what}. The daemon is stuck; \
                         systemd restarts it when the watchdog period runs out"
                    );
                    quiet = true;
                }
            }
        }
        tokio::time::sleep(every).await;
    }
}

async fn rescan_periodically(
    shared: Arc<Shared>,
    maps: SharedMaps,
    mut every: watch::Receiver<Duration>,
    heartbeats: Arc<Heartbeats>,
) {
    // Map keys that had no live listener at the previous rescan.
    let mut orphans: HashSet<u64> = HashSet::new();
    loop {
        let period = *every.borrow_and_update();
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    rescan(&shared, &maps).await;
                    orphans = remove_orphans(&shared, &maps, orphans);
                    heartbeats.scanned();
                }
                // A reload changed the interval: start over with the new one.
                changed = every.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    // The watchdog judges the next scan by the new interval, counted
                    // from now, as the schedule is.
                    heartbeats.scanned();
                    break;
                }
            }
        }
    }
}

/// Removes the per-listener map entries that have had no live listener for a whole rescan
/// interval (`previous`: the keys without one at the last rescan); returns the keys without
/// one now, to be judged at the next. The kernel programs never create an entry for a
/// listener that has closed, but one that closes on one CPU while another CPU settles its
/// first segment can race past that check; such an entry would hold a slot of the bounded
/// map for good. A listener alive that long is in the table (its listen() event or a
/// scan), so only entries no listener can claim are removed.
fn remove_orphans(shared: &Shared, maps: &SharedMaps, previous: HashSet<u64>) -> HashSet<u64> {
    let live: HashSet<u64> = shared.listeners().iter().map(|l| l.inode).collect();
    let mut maps = maps.lock().unwrap_or_else(|e| e.into_inner());
    let now: HashSet<u64> = maps
        .keys()
        .into_iter()
        .filter(|k| !live.contains(k))
        .collect();
    let (gone, pending): (HashSet<u64>, HashSet<u64>) =
        now.into_iter().partition(|k| previous.contains(k));
    if !gone.is_empty() {
        let removed = maps.remove(&gone);
        shared
            .orphans_removed
            .fetch_add(removed, std::sync::atomic::Ordering::Relaxed);
        tracing::info!(
            removed,
            "removed kernel map entries of listeners that are gone"
        );
    }
    pending
}

fn parse_event(bytes: &[u8]) -> Option<ListenerEvent> {
    if bytes.len() < size_of::<ListenerEvent>() {
        return None;
    }
    // SAFETY: ListenerEvent is repr(C) plain data and `bytes` holds at least one.
    Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<ListenerEvent>()) })
}
