//! `backlogd run`: load the probes, follow the kernel's events, serve what they say.
//!
//! This file starts the daemon (bind, load, drop capabilities, start the loops, serve) and
//! waits for a signal; each background loop is a file of its own:
//! - [`events`]: the kernel's listener lifecycle events into the table;
//! - [`identify`]: each listener's program, unit, container and pod;
//! - [`rescans`]: the table reconciled with sock_diag, orphaned map entries removed;
//! - [`sampler`]: queue high-water marks, the attempts sweep, recent client impact;
//! - [`watchdog`]: the systemd watchdog;
//! - [`reload`]: on SIGHUP, the configuration read again and applied.
//!
//! The loops write the live state (`crate::state`); the HTTP server reads it.

mod events;
mod identify;
mod reload;
mod rescans;
mod sampler;
mod watchdog;

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::Context as _;
use tokio::sync::watch;

use self::reload::{LogFilterSetter, ReloadTargets};
use crate::{
    config::{self, Config},
    exporter::{
        http,
        server::{self, HttpSettings},
    },
    loader::{self, LoadOptions},
    queues::QueueWindows,
    sampling::{self, iterator::LiveScan},
    service::{self, health::Heartbeats, notify},
    state::{Live, Shared},
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

/// What `config` asks of the loader; `hand_over` for the load step (`backlogd load`).
fn load_options(config: &Config, hand_over: bool) -> LoadOptions {
    LoadOptions {
        btf: config.btf.clone(),
        hook_mode: config.hook_mode,
        pin_dir: config.pin_dir.clone(),
        // validate() bounds it by MAX_LISTENERS_LIMIT, far below u32::MAX.
        max_listeners: u32::try_from(config.max_listeners).unwrap_or(u32::MAX),
        impact: backlogd_common::ImpactSettings {
            horizon_ns: config.client_impact_horizon * 1_000_000_000,
        },
        // validate() bounds it by MAX_ATTEMPTS.
        attempts: u32::try_from(config.client_impact_attempts).unwrap_or(u32::MAX),
        accept_wait: config.accept_wait,
        syscall_hook: config.syscall_hook,
        source_prefixes: backlogd_common::SourcePrefixes {
            v4: config.drop_source_prefix_v4,
            v6: config.drop_source_prefix_v6,
            _pad: [0; 6],
        },
        // validate() bounds it by MAX_DROP_SOURCES.
        drop_sources: u32::try_from(config.drop_source_entries).unwrap_or(u32::MAX),
        hand_over,
    }
}

/// `backlogd load`: loads and attaches the programs as `run` would, pins them with what a
/// daemon without loading capabilities needs beside them, and exits: the shipped unit
/// runs it as root before the daemon (ExecStartPre=+), so the daemon itself never holds
/// CAP_PERFMON or CAP_NET_ADMIN. A state already pinned by this build is kept, counting.
pub fn load_and_hand_over(config: &Config) -> anyhow::Result<()> {
    let probes = loader::load(&load_options(config, true)).context("cannot load")?;
    let state = config
        .pin_dir
        .as_deref()
        .unwrap_or(std::path::Path::new(""))
        .display();
    if probes.adopted {
        tracing::info!(
            mode = probes.mode.name(),
            "{state} already holds this build's programs, attached and counting: kept"
        );
    } else {
        tracing::info!(
            mode = probes.mode.name(),
            "loaded, attached and pinned under {state}: the daemon adopts them"
        );
    }
    Ok(())
}

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
    let probes = loader::load(&load_options(&config.config, false)).context("cannot start")?;
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
    if let Err(reason) = &probes.scan {
        tracing::warn!(
            reason,
            "no scan iterator: backlogd_listen_syn_queue_length (the SYN queues' length \
             now) is not served, and backlogd_listen_accept_queue_length is the length the \
             programs saw at the listener's last enqueue, which accept() lowers unseen (no \
             program looks at the queues on accept: the scan pass reads them); every other \
             figure is served"
        );
    }
    if config.drop_privileges {
        let lists = probes.scan.as_ref().is_ok_and(|s| s.reads_sysctls);
        let listing = if lists && sampling::in_initial_pid_namespace() {
            service::caps::Listing::Iterator
        } else {
            service::caps::Listing::EachNamespace
        };
        let bpf = service::caps::bpf_access(&probes.maps.listener_stats)?;
        let kept = service::caps::drop_to_runtime_set(listing, bpf)?;
        tracing::info!(
            kept = ?kept.iter().map(ToString::to_string).collect::<Vec<_>>(),
            ?listing,
            ?bpf,
            "dropped every capability the running daemon does not need \
             (kept: BPF map access where this kernel gates bpf(2) behind a capability, \
             and setns only where rescans join namespaces; /proc and the configuration \
             files of other users' programs); the bounding set is \
             cut to the same and no_new_privs is set, so none returns"
        );
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(config.worker_threads)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let served = runtime.block_on(serve(config, socket, http_settings, probes));
    // A rescan on the blocking pool finishes in milliseconds; never wait long.
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
    let mut events = tokio::spawn(events::follow_listener_events(
        probes.listener_events,
        shared.clone(),
    ));
    let maps = Arc::new(Mutex::new(probes.maps));
    let scan = probes.scan.ok().map(|i| Arc::new(LiveScan::new(i)));
    let windows = Arc::new(Mutex::new(QueueWindows::new(Duration::from_secs(
        current.hwm_window,
    ))));
    let lister = rescans::Lister {
        iterator: scan.clone(),
        windows: windows.clone(),
    };
    // Events are flowing, so a listener cannot slip between the scan and them; after this
    // first scan the table also holds what was listening before we started.
    rescans::rescan(&shared, &maps, &lister).await;
    let heartbeats = Arc::new(Heartbeats::new());
    let rescan_soon = Arc::new(tokio::sync::Notify::new());
    let rescans = tokio::spawn(rescans::rescan_periodically(
        shared.clone(),
        maps.clone(),
        lister,
        rescan_rx,
        heartbeats.clone(),
        rescan_soon.clone(),
    ));
    let mut live = Live::new(
        shared.clone(),
        maps.clone(),
        windows.clone(),
        probes.mode,
        probes.kernel,
        probes.pinned,
        scan,
    );
    // The recent figures start from what the maps hold now: counts a pinned map kept
    // from before this daemon are not recent. (Attempts whose horizon passed while no
    // daemon ran are, like the abandoned counter: this daemon's sweeps count them.)
    let retention_ns = current.drop_source_retention * 1_000_000_000;
    let recorder = sampler::Recorder {
        maps: maps.clone(),
        shared: shared.clone(),
        history: live.recent.clone(),
        retention_ns,
    };
    sampler::record_recent(&recorder);
    let sampler = tokio::spawn(sampler::sample_queues(
        maps,
        windows.clone(),
        recorder,
        heartbeats.clone(),
        current.max_listeners,
        current.client_impact_horizon * 1_000_000_000,
        rescan_soon,
    ));
    live.accepts = loader::hooks::sees_accepts(live.mode, current.syscall_hook);
    live.accept_wait = current.accept_wait && live.accepts;
    if live.scan.is_some() {
        windows
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take_accept_lengths_from_scans();
    }
    if !live.accepts {
        tracing::info!(
            "syscall_hook = false: no program runs per syscall; accepts, accept waits and \
             the backlog listen() asked for are not served, and a new listener is listed by \
             a rescan within a second of its first segment. Every other figure is served"
        );
    }
    live.drop_source_addresses_remote = current.drop_source_addresses_remote;
    // validate() bounds it by MAX_TOP_SERIES.
    live.drop_source_top_series = usize::try_from(current.drop_source_top_series).unwrap_or(0);
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
        tokio::spawn(watchdog::watchdog(every, heartbeats, rescan_tx.subscribe()))
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
                reload::reload(config.source.as_ref(), &mut current, &targets)
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
