//! `backlogd run` settings: built-in defaults, then the TOML config file, then the
//! command line (each layer overrides the one before).
//!
//! One `Layer` type is both the file's schema and the command line's flags, so a setting
//! cannot exist in one and be forgotten in the other.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
};

use clap::{Args, ValueEnum as _};
use serde::{Deserialize, Serialize};

use backlogd_common::ACCEPT_WAIT_BUCKETS;

use crate::{
    api::AcceptWait,
    loader::{btf::KERNEL_BTF, modes::HookModeArg},
};

/// Where `backlogd run` looks for its config file when `--config` is not given. A missing
/// file there means built-in defaults; a missing file named by `--config` is an error.
pub const DEFAULT_PATH: &str = "/etc/backlogd/backlogd.toml";

/// One layer of settings: every field optional, so a layer says only what it changes.
#[derive(Debug, Clone, Default, Args, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Layer {
    /// Address to serve /metrics, /healthz and the JSON API on (port 0 picks a free one;
    /// the log says which) [default: 0.0.0.0:9851].
    #[arg(long, value_name = "HOST:PORT")]
    pub listen: Option<SocketAddr>,
    /// Raw BTF of the running kernel, for kernels that do not expose
    /// /sys/kernel/btf/vmlinux [default: /sys/kernel/btf/vmlinux].
    #[arg(long, value_name = "FILE")]
    pub btf: Option<PathBuf>,
    /// Seconds between rescans of every listener (the scan iterator; sock_diag in each
    /// network namespace where the iterator cannot see every process). Events report
    /// listeners as they come and go; the scan finds those that were listening before
    /// backlogd started and repairs the table if an event was ever lost [default: 30].
    #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..))]
    pub rescan_interval: Option<u64>,
    /// Seconds over which queue high-water marks are reported: a queue that filled for
    /// 50 ms stays visible in `*_max_length` for this long. Keep it at least as long as
    /// the scrape interval [default: 60].
    #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..))]
    pub hwm_window: Option<u64>,
    /// How the SYN path is hooked. `auto` picks the best mode the kernel and this build
    /// support and logs the choice; it is exported as backlogd_hook_mode [default: auto].
    #[arg(long, value_enum)]
    #[serde(default, with = "hook_mode_serde")]
    pub hook_mode: Option<HookModeArg>,
    /// Pin the programs' links and the counter maps under this bpffs directory (the
    /// shipped unit uses /sys/fs/bpf/backlogd): the programs keep counting while the
    /// daemon is down, and the next daemon of the same build continues the counters
    /// instead of starting from zero. Remove the pins with `backlogd unpin`
    /// [default: none: everything is detached at exit].
    #[arg(long, value_name = "DIR")]
    pub pin_dir: Option<PathBuf>,
    /// Listeners whose counters the kernel maps can hold at once. A listener beyond it is
    /// still listed, but its counter updates and queue observations are lost and counted
    /// (backlogd_listener_stats_full_total, backlogd_listener_queue_observations_lost_total;
    /// logged once). Each slot costs about 424 bytes per CPU, both maps together (a 400-byte
    /// counter set and a 24-byte queue state), plus about 100 bytes once for the listener's
    /// last listen() event [default: 16384].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=MAX_LISTENERS_LIMIT))]
    pub max_listeners: Option<u64>,
    /// Upper bounds, in seconds, of the backlogd_listen_accept_wait_seconds buckets /metrics
    /// exports, or `all`. The kernel counts waits in 24 buckets of 2^i µs (0.000001 to
    /// 8.388608 s); each bound must be one of those, and an exported bucket is the exact
    /// sum of the kernel buckets up to its bound. The default keeps the answers an alert
    /// needs: waits up to ~1 ms (the application keeps up with its queue) and up to ~1 s
    /// (a longer wait costs the client more than a dropped SYN, retransmitted after 1 s),
    /// with `+Inf`, `_sum` and `_count` 5 series per listener instead of 27. The JSON API
    /// (`top`, `doctor`) always has every bucket. On the command line: comma-separated
    /// [default: 0.001024,1.048576].
    #[arg(long, value_name = "SECONDS,...|all")]
    pub accept_wait_buckets: Option<AcceptWaitBuckets>,
    /// Time each connection's wait on the accept queue (backlogd_listen_accept_wait_seconds,
    /// the JSON API's accept_wait, top's WAIT column). Off, accept() reads no stamp and
    /// buckets no wait: about 290 fewer instructions per handshake in fentry mode (a tenth
    /// of what backlogd adds to one), and the histogram is not served. Every other figure
    /// stays [default: true].
    #[arg(long, value_name = "true|false", value_parser = clap::value_parser!(bool))]
    pub accept_wait: Option<bool>,
    /// Tracepoint and kprobe modes: run a program at the exit of every syscall on the host
    /// (the `sys_exit` tracepoint) to see accept() and listen() return. It is what counts
    /// accepts (backlogd_listen_accepted_total and its group and process sums), times accept
    /// waits, knows the backlog listen() asked for (backlogd_listen_backlog_requested) and
    /// lists a new listener at once. Its price falls on every syscall of every process,
    /// most of it the kernel's slower syscall path (docs/performance.md has the figures).
    /// Off: those figures are not served, a new listener is listed by the next rescan (its
    /// counts are kept from its first SYN meanwhile), and every other figure stays exact.
    /// fentry mode hooks accept and listen themselves and runs nothing per syscall: there
    /// this changes nothing [default: true].
    #[arg(long, value_name = "true|false", value_parser = clap::value_parser!(bool))]
    pub syscall_hook: Option<bool>,
    /// Seconds a connection attempt a listener dropped a segment of may take to complete.
    /// One that completes sooner is counted delayed (backlogd_listen_connections_delayed_total,
    /// with its delay); one that has not completed by then is counted abandoned
    /// (backlogd_listen_connections_abandoned_total) when the horizon passes. The default
    /// covers Linux clients' default SYN retries (tcp_syn_retries=6: the last SYN 63 s
    /// after the first, connect() fails at 127 s); a shorter horizon counts a client that
    /// is still retrying as abandoned [default: 130].
    #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..=MAX_HORIZON))]
    pub client_impact_horizon: Option<u64>,
    /// Connection attempts with a dropped segment the kernel map can track at once (about
    /// 150 bytes each). A drop of an attempt beyond it is counted in
    /// backlogd_client_impact_untracked_total, and that attempt is neither delayed nor
    /// abandoned in the figures [default: 16384].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=MAX_ATTEMPTS))]
    pub client_impact_attempts: Option<u64>,
    /// Bits of an IPv4 source address kept when a listener's dropped segments and syncookie
    /// answers are counted by source (the JSON API's drop_sources, `top`'s detail pane,
    /// `doctor`): 8 to 32. Sources are shown only at this length [default: 24].
    #[arg(long, value_name = "BITS", value_parser = clap::value_parser!(u8).range(8..=32))]
    pub drop_source_prefix_v4: Option<u8>,
    /// The same for IPv6 sources: 16 to 128 [default: 48].
    #[arg(long, value_name = "BITS", value_parser = clap::value_parser!(u8).range(16..=128))]
    pub drop_source_prefix_v6: Option<u8>,
    /// Listener and source-prefix pairs the kernel map counts at once (about 130 bytes
    /// each). A drop or syncookie from a prefix beyond it is counted untracked
    /// (backlogd_listen_drop_sources_untracked_total), never lost [default: 16384].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=MAX_DROP_SOURCES))]
    pub drop_source_entries: Option<u64>,
    /// Seconds a source prefix is kept after its newest drop or syncookie: then the daemon
    /// removes it from the kernel's map and adds its counts to the listener's expired
    /// counts (client addresses are personal data: kept for the recent figures' window and
    /// no longer by default). A shorter retention frees slots sooner; the top sources of the
    /// last five minutes then miss prefixes quiet for longer than it. Checked every 10 s,
    /// 10 to 86400 [default: 300].
    #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(MIN_RETENTION..=MAX_RETENTION))]
    pub drop_source_retention: Option<u64>,
    /// Serve, in /metrics, a series per source prefix for each listener's largest prefixes
    /// of the last five minutes (backlogd_listen_drop_source_recent_segments{prefix=...}),
    /// this many per listener, 0 to 10. The prefix label holds client addresses, which
    /// every scraper reads, and each prefix is a series of its own: off by default
    /// [default: 0].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(0..=MAX_TOP_SERIES))]
    pub drop_source_top_series: Option<u64>,
    /// Serve the source prefixes of drops (the JSON API's drop_sources.top) to readers
    /// that are not on this host. Client addresses are personal data in many
    /// jurisdictions: off, a reader of the JSON API not connecting over loopback gets the
    /// counts and shares but no prefix (/metrics serves prefixes only with
    /// drop_source_top_series, to every scraper) [default: false].
    #[arg(long, value_name = "true|false", value_parser = clap::value_parser!(bool))]
    pub drop_source_addresses_remote: Option<bool>,
    /// Log filter. On the command line this is the global `--log` flag (or BACKLOGD_LOG).
    #[arg(skip)]
    pub log: Option<String>,
    #[command(flatten)]
    #[serde(default)]
    pub http: HttpLayer,
}

/// The `[http]` table and its `--http-*` flags.
#[derive(Debug, Clone, Default, Args, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HttpLayer {
    /// TLS and basic-auth settings in the Prometheus exporter-toolkit web config format
    /// (YAML: `tls_server_config`, `basic_auth_users`) [default: none: plain HTTP, no auth].
    #[arg(long = "web-config-file", value_name = "FILE")]
    pub web_config_file: Option<PathBuf>,
    /// Most client connections served at once; past it, an idle connection is closed to
    /// make room (one that never sent a request first) [default: 64].
    #[arg(long = "http-max-connections", value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_connections: Option<u64>,
    /// Seconds a new connection has to finish its TLS handshake and send its first request
    /// head, and a later request head has from its first byte [default: 5].
    #[arg(long = "http-read-header-timeout", value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..))]
    pub read_header_timeout: Option<u64>,
    /// Seconds a kept-alive connection may stay silent before it is closed [default: 60].
    #[arg(long = "http-idle-timeout", value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..))]
    pub idle_timeout: Option<u64>,
    /// Seconds a response write may stall (a client not reading) before the connection is
    /// closed [default: 10].
    #[arg(long = "http-write-timeout", value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..))]
    pub write_timeout: Option<u64>,
    /// Largest request head (request line plus headers) in bytes; larger ones get 431
    /// [default: 16384, at least 8192].
    #[arg(long = "http-max-header-bytes", value_name = "BYTES", value_parser = clap::value_parser!(u64).range(8192..))]
    pub max_header_bytes: Option<u64>,
    /// Seconds open connections get to finish on SIGTERM before they are cut [default: 2].
    #[arg(long = "http-shutdown-timeout", value_name = "SECONDS")]
    pub shutdown_timeout: Option<u64>,
}

/// The settings in force: every field decided.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Config {
    pub listen: SocketAddr,
    pub btf: PathBuf,
    pub rescan_interval: u64,
    pub hwm_window: u64,
    #[serde(serialize_with = "hook_mode_serde::serialize_plain")]
    pub hook_mode: HookModeArg,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pin_dir: Option<PathBuf>,
    pub max_listeners: u64,
    pub accept_wait_buckets: AcceptWaitBuckets,
    pub accept_wait: bool,
    pub syscall_hook: bool,
    pub client_impact_horizon: u64,
    pub client_impact_attempts: u64,
    pub drop_source_prefix_v4: u8,
    pub drop_source_prefix_v6: u8,
    pub drop_source_entries: u64,
    pub drop_source_retention: u64,
    pub drop_source_top_series: u64,
    pub drop_source_addresses_remote: bool,
    pub log: String,
    pub http: HttpConfig,
}

/// Largest `max_listeners`: 2^20 slots are about 400 MiB of kernel memory per CPU.
pub const MAX_LISTENERS_LIMIT: u64 = 1 << 20;
/// Longest client-impact horizon: an hour, far beyond any client's connect retries.
pub const MAX_HORIZON: u64 = 3600;
/// Largest ATTEMPTS map: 2^20 entries are about 150 MiB of kernel memory.
pub const MAX_ATTEMPTS: u64 = 1 << 20;
/// Largest DROP_SOURCES map: 2^20 entries are about 130 MiB of kernel memory.
pub const MAX_DROP_SOURCES: u64 = 1 << 20;
/// Shortest and longest `drop_source_retention`: the expiry runs every 10 s; a day is
/// longer than any incident needs its sources kept.
pub const MIN_RETENTION: u64 = 10;
pub const MAX_RETENTION: u64 = 86_400;
/// Most `drop_source_top_series`: the JSON API's top list, a hard cap on the series a
/// listener adds.
pub const MAX_TOP_SERIES: u64 = crate::sources::TOP as u64;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HttpConfig {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub web_config_file: Option<PathBuf>,
    pub max_connections: u64,
    pub read_header_timeout: u64,
    pub idle_timeout: u64,
    pub write_timeout: u64,
    pub max_header_bytes: u64,
    pub shutdown_timeout: u64,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: "0.0.0.0:9851".parse().expect("literal address"),
            btf: KERNEL_BTF.into(),
            rescan_interval: 30,
            hwm_window: 60,
            hook_mode: HookModeArg::Auto,
            pin_dir: None,
            max_listeners: u64::from(backlogd_common::LISTENER_STATS_ENTRIES),
            accept_wait_buckets: AcceptWaitBuckets::default(),
            accept_wait: true,
            syscall_hook: true,
            client_impact_horizon: 130,
            client_impact_attempts: u64::from(backlogd_common::ATTEMPTS_ENTRIES),
            drop_source_prefix_v4: 24,
            drop_source_prefix_v6: 48,
            drop_source_entries: u64::from(backlogd_common::DROP_SOURCES_ENTRIES),
            drop_source_retention: 300,
            drop_source_top_series: 0,
            drop_source_addresses_remote: false,
            log: "info".into(),
            http: HttpConfig {
                web_config_file: None,
                max_connections: 64,
                read_header_timeout: 5,
                idle_timeout: 60,
                write_timeout: 10,
                max_header_bytes: 16384,
                shutdown_timeout: 2,
            },
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(
        "cannot read config file {path}: {error}. Fix: create it, or name another with \
         `--config FILE`"
    )]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error(
        "config file {path}: {message}\nFix: correct the key or value above; every key is \
         listed in docs/operations.md (\"Configuration\"), and `backlogd check-config --config {path}` \
         checks a file without starting anything"
    )]
    Parse { path: PathBuf, message: String },
    #[error("setting `{key}` = {value:?} ({origin}): {why}")]
    Invalid {
        key: &'static str,
        value: String,
        origin: String,
        why: String,
    },
}

/// Where the settings come from, kept so that SIGHUP can read them again.
#[derive(Debug, Clone)]
pub struct Source {
    /// The file to read, and whether the user named it (then it must exist).
    pub file: PathBuf,
    pub explicit: bool,
    /// What the command line said; it wins over the file on every reload too.
    pub cli: Layer,
}

impl Source {
    pub fn new(config: Option<PathBuf>, cli: Layer) -> Self {
        Self {
            explicit: config.is_some(),
            file: config.unwrap_or_else(|| DEFAULT_PATH.into()),
            cli,
        }
    }

    /// Reads the file (again) and merges: defaults, file, command line.
    pub fn resolve(&self) -> Result<Config, ConfigError> {
        let file = read_file(&self.file, self.explicit)?;
        let origin = |key_in_file: bool| {
            if key_in_file {
                format!("from {}", self.file.display())
            } else {
                "from the command line".to_owned()
            }
        };
        let merged = merge(file.as_ref(), &self.cli);
        validate(&merged, |key| {
            origin(file.as_ref().is_some_and(|f| f.sets(key)) && !self.cli.sets(key))
        })?;
        Ok(merged)
    }

    /// Whether the file in use exists (for logging where settings came from).
    pub fn file_in_use(&self) -> Option<&Path> {
        (self.explicit || self.file.exists()).then_some(self.file.as_path())
    }
}

fn read_file(path: &Path, explicit: bool) -> Result<Option<Layer>, ConfigError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !explicit => return Ok(None),
        Err(error) => {
            return Err(ConfigError::Read {
                path: path.to_owned(),
                error,
            });
        }
    };
    parse(&text)
        .map(Some)
        .map_err(|message| ConfigError::Parse {
            path: path.to_owned(),
            message,
        })
}

/// Parses config file text; the error names the line and the key.
pub fn parse(text: &str) -> Result<Layer, String> {
    toml::from_str(text).map_err(|e| e.to_string().trim_end().to_owned())
}

impl Layer {
    fn sets(&self, key: &str) -> bool {
        match key {
            "listen" => self.listen.is_some(),
            "btf" => self.btf.is_some(),
            "rescan_interval" => self.rescan_interval.is_some(),
            "hwm_window" => self.hwm_window.is_some(),
            "hook_mode" => self.hook_mode.is_some(),
            "pin_dir" => self.pin_dir.is_some(),
            "max_listeners" => self.max_listeners.is_some(),
            "accept_wait_buckets" => self.accept_wait_buckets.is_some(),
            "accept_wait" => self.accept_wait.is_some(),
            "syscall_hook" => self.syscall_hook.is_some(),
            "client_impact_horizon" => self.client_impact_horizon.is_some(),
            "client_impact_attempts" => self.client_impact_attempts.is_some(),
            "drop_source_prefix_v4" => self.drop_source_prefix_v4.is_some(),
            "drop_source_prefix_v6" => self.drop_source_prefix_v6.is_some(),
            "drop_source_entries" => self.drop_source_entries.is_some(),
            "drop_source_retention" => self.drop_source_retention.is_some(),
            "drop_source_top_series" => self.drop_source_top_series.is_some(),
            "drop_source_addresses_remote" => self.drop_source_addresses_remote.is_some(),
            "log" => self.log.is_some(),
            "http.web_config_file" => self.http.web_config_file.is_some(),
            "http.max_connections" => self.http.max_connections.is_some(),
            "http.read_header_timeout" => self.http.read_header_timeout.is_some(),
            "http.idle_timeout" => self.http.idle_timeout.is_some(),
            "http.write_timeout" => self.http.write_timeout.is_some(),
            "http.max_header_bytes" => self.http.max_header_bytes.is_some(),
            "http.shutdown_timeout" => self.http.shutdown_timeout.is_some(),
            _ => false,
        }
    }
}

/// Defaults, overridden by `file`, overridden by `cli`.
pub fn merge(file: Option<&Layer>, cli: &Layer) -> Config {
    let d = Config::default();
    let empty = Layer::default();
    let f = file.unwrap_or(&empty);
    macro_rules! pick {
        ($($field:ident).+, $default:expr) => {
            cli.$($field).+.clone().or_else(|| f.$($field).+.clone()).unwrap_or($default)
        };
    }
    Config {
        listen: pick!(listen, d.listen),
        btf: pick!(btf, d.btf),
        rescan_interval: pick!(rescan_interval, d.rescan_interval),
        hwm_window: pick!(hwm_window, d.hwm_window),
        hook_mode: pick!(hook_mode, d.hook_mode),
        pin_dir: cli.pin_dir.clone().or_else(|| f.pin_dir.clone()),
        max_listeners: pick!(max_listeners, d.max_listeners),
        accept_wait_buckets: pick!(accept_wait_buckets, d.accept_wait_buckets),
        accept_wait: pick!(accept_wait, d.accept_wait),
        syscall_hook: pick!(syscall_hook, d.syscall_hook),
        client_impact_horizon: pick!(client_impact_horizon, d.client_impact_horizon),
        client_impact_attempts: pick!(client_impact_attempts, d.client_impact_attempts),
        drop_source_prefix_v4: pick!(drop_source_prefix_v4, d.drop_source_prefix_v4),
        drop_source_prefix_v6: pick!(drop_source_prefix_v6, d.drop_source_prefix_v6),
        drop_source_entries: pick!(drop_source_entries, d.drop_source_entries),
        drop_source_retention: pick!(drop_source_retention, d.drop_source_retention),
        drop_source_top_series: pick!(drop_source_top_series, d.drop_source_top_series),
        drop_source_addresses_remote: pick!(
            drop_source_addresses_remote,
            d.drop_source_addresses_remote
        ),
        log: pick!(log, d.log),
        http: HttpConfig {
            web_config_file: cli
                .http
                .web_config_file
                .clone()
                .or_else(|| f.http.web_config_file.clone()),
            max_connections: pick!(http.max_connections, d.http.max_connections),
            read_header_timeout: pick!(http.read_header_timeout, d.http.read_header_timeout),
            idle_timeout: pick!(http.idle_timeout, d.http.idle_timeout),
            write_timeout: pick!(http.write_timeout, d.http.write_timeout),
            max_header_bytes: pick!(http.max_header_bytes, d.http.max_header_bytes),
            shutdown_timeout: pick!(http.shutdown_timeout, d.http.shutdown_timeout),
        },
    }
}

/// Checks what the types cannot: the command line's own parser already checked its
/// flags, but a file can say anything.
fn validate(c: &Config, origin: impl Fn(&str) -> String) -> Result<(), ConfigError> {
    let invalid = |key: &'static str, value: String, why: &str| ConfigError::Invalid {
        key,
        origin: origin(key),
        value,
        why: why.to_owned(),
    };
    let at_least_one = [
        ("rescan_interval", c.rescan_interval),
        ("hwm_window", c.hwm_window),
        ("max_listeners", c.max_listeners),
        ("client_impact_horizon", c.client_impact_horizon),
        ("client_impact_attempts", c.client_impact_attempts),
        ("drop_source_entries", c.drop_source_entries),
        ("http.max_connections", c.http.max_connections),
        ("http.read_header_timeout", c.http.read_header_timeout),
        ("http.idle_timeout", c.http.idle_timeout),
        ("http.write_timeout", c.http.write_timeout),
    ];
    for (key, value) in at_least_one {
        if value == 0 {
            return Err(invalid(
                key,
                "0".into(),
                "must be at least 1. Fix: set 1 or more",
            ));
        }
    }
    if c.max_listeners > MAX_LISTENERS_LIMIT {
        return Err(invalid(
            "max_listeners",
            c.max_listeners.to_string(),
            &format!("must be at most {MAX_LISTENERS_LIMIT}. Fix: set a smaller value"),
        ));
    }
    for (key, value, max) in [
        (
            "client_impact_horizon",
            c.client_impact_horizon,
            MAX_HORIZON,
        ),
        (
            "client_impact_attempts",
            c.client_impact_attempts,
            MAX_ATTEMPTS,
        ),
        (
            "drop_source_entries",
            c.drop_source_entries,
            MAX_DROP_SOURCES,
        ),
        (
            "drop_source_top_series",
            c.drop_source_top_series,
            MAX_TOP_SERIES,
        ),
    ] {
        if value > max {
            return Err(invalid(
                key,
                value.to_string(),
                &format!("must be at most {max}. Fix: set a smaller value"),
            ));
        }
    }
    for (key, value, range) in [
        ("drop_source_prefix_v4", c.drop_source_prefix_v4, 8..=32),
        ("drop_source_prefix_v6", c.drop_source_prefix_v6, 16..=128),
    ] {
        if !range.contains(&value) {
            return Err(invalid(
                key,
                value.to_string(),
                &format!(
                    "must be {} to {} bits. Fix: set a prefix length in that range",
                    range.start(),
                    range.end()
                ),
            ));
        }
    }
    if !(MIN_RETENTION..=MAX_RETENTION).contains(&c.drop_source_retention) {
        return Err(invalid(
            "drop_source_retention",
            c.drop_source_retention.to_string(),
            &format!(
                "must be {MIN_RETENTION} to {MAX_RETENTION} seconds. Fix: set a retention in \
                 that range"
            ),
        ));
    }
    if c.http.max_header_bytes < 8192 {
        return Err(invalid(
            "http.max_header_bytes",
            c.http.max_header_bytes.to_string(),
            "must be at least 8192 (the HTTP parser's smallest buffer). Fix: set 8192 or more",
        ));
    }
    if let Err(e) = tracing_subscriber::EnvFilter::try_new(&c.log) {
        return Err(invalid(
            "log",
            c.log.clone(),
            &format!(
                "not a valid log filter ({e}). Fix: use a level (`info`, `debug`) or \
                 `target=level` pairs, e.g. `backlogd=debug,info`"
            ),
        ));
    }
    Ok(())
}

impl Config {
    /// The settings as a config file would say them.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("Config serializes to TOML")
    }

    /// Settings that differ between `self` and `new` and only take effect after a
    /// restart (they decide what is bound or attached).
    pub fn restart_only_changes(&self, new: &Config) -> Vec<(&'static str, String, String)> {
        let mut out = Vec::new();
        if self.listen != new.listen {
            out.push(("listen", self.listen.to_string(), new.listen.to_string()));
        }
        if self.btf != new.btf {
            out.push((
                "btf",
                self.btf.display().to_string(),
                new.btf.display().to_string(),
            ));
        }
        if self.max_listeners != new.max_listeners {
            out.push((
                "max_listeners",
                self.max_listeners.to_string(),
                new.max_listeners.to_string(),
            ));
        }
        for (key, old, now) in [
            (
                "client_impact_horizon",
                self.client_impact_horizon,
                new.client_impact_horizon,
            ),
            (
                "client_impact_attempts",
                self.client_impact_attempts,
                new.client_impact_attempts,
            ),
            (
                "drop_source_prefix_v4",
                u64::from(self.drop_source_prefix_v4),
                u64::from(new.drop_source_prefix_v4),
            ),
            (
                "drop_source_prefix_v6",
                u64::from(self.drop_source_prefix_v6),
                u64::from(new.drop_source_prefix_v6),
            ),
            (
                "drop_source_entries",
                self.drop_source_entries,
                new.drop_source_entries,
            ),
            (
                "drop_source_retention",
                self.drop_source_retention,
                new.drop_source_retention,
            ),
            (
                "drop_source_top_series",
                self.drop_source_top_series,
                new.drop_source_top_series,
            ),
        ] {
            if old != now {
                out.push((key, old.to_string(), now.to_string()));
            }
        }
        if self.drop_source_addresses_remote != new.drop_source_addresses_remote {
            out.push((
                "drop_source_addresses_remote",
                self.drop_source_addresses_remote.to_string(),
                new.drop_source_addresses_remote.to_string(),
            ));
        }
        if self.accept_wait != new.accept_wait {
            out.push((
                "accept_wait",
                self.accept_wait.to_string(),
                new.accept_wait.to_string(),
            ));
        }
        if self.syscall_hook != new.syscall_hook {
            out.push((
                "syscall_hook",
                self.syscall_hook.to_string(),
                new.syscall_hook.to_string(),
            ));
        }
        if self.pin_dir != new.pin_dir {
            let show = |d: &Option<PathBuf>| {
                d.as_ref()
                    .map_or_else(|| "none".to_owned(), |d| d.display().to_string())
            };
            out.push(("pin_dir", show(&self.pin_dir), show(&new.pin_dir)));
        }
        if self.hook_mode != new.hook_mode {
            out.push((
                "hook_mode",
                hook_mode_serde::name(self.hook_mode).to_owned(),
                hook_mode_serde::name(new.hook_mode).to_owned(),
            ));
        }
        out
    }

    /// Puts back the running values of every setting [`Self::restart_only_changes`]
    /// reports, so a reload keeps using them and the next reload warns again.
    pub fn keep_restart_only(&mut self, running: &Config) {
        self.listen = running.listen;
        self.btf = running.btf.clone();
        self.pin_dir = running.pin_dir.clone();
        self.hook_mode = running.hook_mode;
        self.max_listeners = running.max_listeners;
        self.client_impact_horizon = running.client_impact_horizon;
        self.client_impact_attempts = running.client_impact_attempts;
        self.accept_wait = running.accept_wait;
        self.syscall_hook = running.syscall_hook;
        self.drop_source_prefix_v4 = running.drop_source_prefix_v4;
        self.drop_source_prefix_v6 = running.drop_source_prefix_v6;
        self.drop_source_entries = running.drop_source_entries;
        self.drop_source_retention = running.drop_source_retention;
        self.drop_source_top_series = running.drop_source_top_series;
        self.drop_source_addresses_remote = running.drop_source_addresses_remote;
    }
}

/// The accept-wait buckets /metrics exports: a set of the kernel's bucket bounds, so
/// every exported bucket is an exact sum of kernel buckets. Spelled `"all"` or as a list
/// of bounds in seconds (`[0.001024, 1.048576]`; on the command line `0.001024,1.048576`);
/// any other value is refused with the allowed ones listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcceptWaitBuckets {
    /// Indices of the exported bounds in [`AcceptWait::bounds`], ascending, no repeats.
    indices: Vec<usize>,
}

impl AcceptWaitBuckets {
    /// The default bounds: 2^10 µs (~1 ms) and 2^20 µs (~1 s).
    pub const DEFAULT: [usize; 2] = [10, 20];

    /// Every kernel bound (the whole histogram).
    pub fn all() -> Self {
        Self {
            indices: (0..ACCEPT_WAIT_BUCKETS).collect(),
        }
    }

    /// Indices of the exported bounds among the kernel's ([`AcceptWait::bounds`]),
    /// ascending.
    pub fn indices(&self) -> &[usize] {
        &self.indices
    }

    /// The exported bounds in seconds, ascending.
    pub fn seconds(&self) -> Vec<f64> {
        let bounds = AcceptWait::bounds();
        self.indices.iter().map(|&i| bounds[i]).collect()
    }

    pub fn is_all(&self) -> bool {
        self.indices.len() == ACCEPT_WAIT_BUCKETS
    }

    /// From bounds in seconds, in any order; an error naming the first that is not a
    /// kernel bound and listing those that are.
    pub fn from_seconds(values: &[f64]) -> Result<Self, String> {
        let bounds = AcceptWait::bounds();
        let mut indices = Vec::with_capacity(values.len());
        for &v in values {
            // Both sides are the double nearest the decimal bound; the tolerance only
            // forgives a value written with more digits than needed.
            match bounds.iter().position(|b| (b - v).abs() <= b * 1e-9) {
                Some(i) => indices.push(i),
                None => return Err(Self::not_a_bound(&v.to_string())),
            }
        }
        indices.sort_unstable();
        indices.dedup();
        Ok(Self { indices })
    }

    fn not_a_bound(value: &str) -> String {
        let allowed: Vec<String> = AcceptWait::bounds().iter().map(f64::to_string).collect();
        format!(
            "{value} is not one of the kernel's accept-wait bucket bounds \
             (2^i microseconds, i = 0..23). Fix: use bounds from {}, or \"all\" for every one",
            allowed.join(", ")
        )
    }
}

impl Default for AcceptWaitBuckets {
    fn default() -> Self {
        Self {
            indices: Self::DEFAULT.to_vec(),
        }
    }
}

impl std::str::FromStr for AcceptWaitBuckets {
    type Err = String;

    /// `all`, or bounds in seconds separated by commas.
    fn from_str(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if text.eq_ignore_ascii_case("all") {
            return Ok(Self::all());
        }
        let mut values = Vec::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            values.push(part.parse::<f64>().map_err(|_| Self::not_a_bound(part))?);
        }
        Self::from_seconds(&values)
    }
}

impl Serialize for AcceptWaitBuckets {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.is_all() {
            s.serialize_str("all")
        } else {
            self.seconds().serialize(s)
        }
    }
}

impl<'de> Deserialize<'de> for AcceptWaitBuckets {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = AcceptWaitBuckets;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("\"all\" or a list of bucket bounds in seconds")
            }

            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Self::Value, E> {
                if text.eq_ignore_ascii_case("all") {
                    Ok(AcceptWaitBuckets::all())
                } else {
                    Err(E::custom(AcceptWaitBuckets::not_a_bound(&format!(
                        "\"{text}\""
                    ))))
                }
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Self::Value, A::Error> {
                let mut values = Vec::new();
                while let Some(v) = seq.next_element::<f64>()? {
                    values.push(v);
                }
                AcceptWaitBuckets::from_seconds(&values).map_err(serde::de::Error::custom)
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// The hook mode in files is spelled as on the command line (`auto`, `fentry`, ...).
mod hook_mode_serde {
    use super::*;

    pub fn name(mode: HookModeArg) -> &'static str {
        match mode {
            HookModeArg::Auto => "auto",
            HookModeArg::Fentry => "fentry",
            HookModeArg::Kprobe => "kprobe",
            HookModeArg::Tracepoint => "tracepoint",
        }
    }

    pub fn serialize<S: serde::Serializer>(
        mode: &Option<HookModeArg>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match mode {
            Some(m) => s.serialize_some(name(*m)),
            None => s.serialize_none(),
        }
    }

    pub fn serialize_plain<S: serde::Serializer>(
        mode: &HookModeArg,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.serialize_str(name(*mode))
    }

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(
        d: D,
    ) -> Result<Option<HookModeArg>, D::Error> {
        let text = String::deserialize(d)?;
        HookModeArg::from_str(&text, true).map(Some).map_err(|_| {
            serde::de::Error::custom(format!(
                "unknown hook mode `{text}`, expected one of `auto`, `fentry`, `kprobe`, \
                 `tracepoint`"
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_line_beats_file_beats_defaults() {
        let file = parse(
            "listen = \"127.0.0.1:1\"\nrescan_interval = 5\nhook_mode = \"tracepoint\"\n\
             [http]\nmax_connections = 9\n",
        )
        .unwrap();
        let cli = Layer {
            listen: Some("127.0.0.1:2".parse().unwrap()),
            ..Layer::default()
        };
        let c = merge(Some(&file), &cli);
        assert_eq!(c.listen, "127.0.0.1:2".parse().unwrap());
        assert_eq!(c.rescan_interval, 5);
        assert_eq!(c.hook_mode, HookModeArg::Tracepoint);
        assert_eq!(c.http.max_connections, 9);
        assert_eq!(c.hwm_window, Config::default().hwm_window);
    }

    #[test]
    fn unknown_keys_are_named_with_their_line() {
        let err = parse("log = \"info\"\nrescan_intervall = 5\n").unwrap_err();
        assert!(err.contains("rescan_intervall"), "{err}");
        assert!(err.contains("line 2"), "{err}");
        let err = parse("[http]\nmax_conns = 5\n").unwrap_err();
        assert!(err.contains("max_conns") && err.contains("line 2"), "{err}");
    }

    #[test]
    fn bad_hook_mode_lists_the_choices() {
        let err = parse("hook_mode = \"ebpf\"\n").unwrap_err();
        assert!(err.contains("ebpf") && err.contains("tracepoint"), "{err}");
    }

    #[test]
    fn effective_config_round_trips_through_its_own_toml() {
        let c = Config::default();
        let again = merge(Some(&parse(&c.to_toml()).unwrap()), &Layer::default());
        assert_eq!(c, again);
    }

    #[test]
    fn accept_wait_buckets_default_all_and_lists() {
        let d = Config::default().accept_wait_buckets;
        assert_eq!(d.seconds(), [0.001024, 1.048576]);
        assert_eq!(d.indices(), [10, 20]);
        let all = parse("accept_wait_buckets = \"all\"\n").unwrap();
        let all = all.accept_wait_buckets.unwrap();
        assert_eq!(all.indices(), (0..24).collect::<Vec<_>>());
        assert_eq!(all.seconds()[23], 8.388608);
        // Any order, repeats once.
        let l = parse("accept_wait_buckets = [1.048576, 0.000001, 0.016384, 0.000001]\n")
            .unwrap()
            .accept_wait_buckets
            .unwrap();
        assert_eq!(l.indices(), [0, 14, 20]);
        assert_eq!(l.seconds(), [0.000001, 0.016384, 1.048576]);
        let none = parse("accept_wait_buckets = []\n").unwrap();
        assert_eq!(
            none.accept_wait_buckets.unwrap().indices(),
            [] as [usize; 0]
        );
        // The command line's spelling.
        assert_eq!("all".parse::<AcceptWaitBuckets>().unwrap(), all);
        assert_eq!(
            "0.016384, 1.048576,0.000001"
                .parse::<AcceptWaitBuckets>()
                .unwrap(),
            l
        );
        // What check-config prints reads back the same.
        for buckets in [d, all, l] {
            let c = Config {
                accept_wait_buckets: buckets,
                ..Config::default()
            };
            let again = merge(Some(&parse(&c.to_toml()).unwrap()), &Layer::default());
            assert_eq!(c, again, "{}", c.to_toml());
        }
    }

    #[test]
    fn accept_wait_bound_not_a_kernel_bound_lists_the_allowed_ones() {
        let allowed = "0.000001, 0.000002, 0.000004, 0.000008, 0.000016, 0.000032, \
                       0.000064, 0.000128, 0.000256, 0.000512, 0.001024, 0.002048, 0.004096, \
                       0.008192, 0.016384, 0.032768, 0.065536, 0.131072, 0.262144, 0.524288, \
                       1.048576, 2.097152, 4.194304, 8.388608";
        for (text, bad) in [
            ("accept_wait_buckets = [0.001024, 0.5]\n", "0.5 is not one"),
            (
                "accept_wait_buckets = [16.777216]\n",
                "16.777216 is not one",
            ),
            ("accept_wait_buckets = \"some\"\n", "\"some\" is not one"),
        ] {
            let err = parse(text).unwrap_err();
            assert!(err.contains("line 1"), "{err}");
            assert!(err.contains(bad), "{err}");
            assert!(err.contains(allowed), "{err}");
            assert!(err.contains("or \"all\""), "{err}");
        }
        let err = "0.001,1".parse::<AcceptWaitBuckets>().unwrap_err();
        assert!(
            err.starts_with("0.001 is not one") && err.contains(allowed),
            "{err}"
        );
        let err = "1ms".parse::<AcceptWaitBuckets>().unwrap_err();
        assert!(err.starts_with("1ms is not one"), "{err}");
    }

    #[test]
    fn missing_default_file_is_defaults_but_missing_named_file_is_an_error() {
        let nowhere = PathBuf::from("/nonexistent/backlogd.toml");
        let implicit = Source {
            file: nowhere.clone(),
            explicit: false,
            cli: Layer::default(),
        };
        assert_eq!(implicit.resolve().unwrap(), Config::default());
        let explicit = Source {
            explicit: true,
            ..implicit
        };
        let err = explicit.resolve().unwrap_err().to_string();
        assert!(err.contains("/nonexistent/backlogd.toml"), "{err}");
    }

    #[test]
    fn zero_interval_in_a_file_is_rejected_with_its_origin() {
        let dir = std::env::temp_dir().join(format!("backlogd-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("zero.toml");
        std::fs::write(&path, "hwm_window = 0\n").unwrap();
        let err = Source::new(Some(path.clone()), Layer::default())
            .resolve()
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("hwm_window") && err.contains("zero.toml"),
            "{err}"
        );
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn a_retention_out_of_range_in_a_file_is_rejected_with_the_range() {
        let dir = std::env::temp_dir().join(format!("backlogd-ret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("retention.toml");
        std::fs::write(&path, "drop_source_retention = 5\n").unwrap();
        let err = Source::new(Some(path.clone()), Layer::default())
            .resolve()
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("drop_source_retention") && err.contains("10 to 86400 seconds"),
            "{err}"
        );
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn restart_only_settings_are_reported() {
        let a = Config::default();
        let mut b = a.clone();
        b.rescan_interval = 1;
        assert!(a.restart_only_changes(&b).is_empty());
        b.hook_mode = HookModeArg::Tracepoint;
        assert_eq!(a.restart_only_changes(&b)[0].0, "hook_mode");
    }

    #[test]
    fn a_reload_keeps_every_restart_only_setting_as_running() {
        let running = Config::default();
        let mut new = running.clone();
        new.listen = "127.0.0.1:1".parse().unwrap();
        new.btf = "/elsewhere".into();
        new.pin_dir = Some("/sys/fs/bpf/other".into());
        new.hook_mode = HookModeArg::Tracepoint;
        new.accept_wait = false;
        new.syscall_hook = false;
        new.drop_source_prefix_v4 = 20;
        new.drop_source_prefix_v6 = 56;
        new.drop_source_entries = 3;
        new.drop_source_retention = 60;
        new.drop_source_top_series = 3;
        new.drop_source_addresses_remote = true;
        new.rescan_interval = 1;
        let keys: Vec<_> = running
            .restart_only_changes(&new)
            .iter()
            .map(|c| c.0)
            .collect();
        assert_eq!(
            keys,
            [
                "listen",
                "btf",
                "drop_source_prefix_v4",
                "drop_source_prefix_v6",
                "drop_source_entries",
                "drop_source_retention",
                "drop_source_top_series",
                "drop_source_addresses_remote",
                "accept_wait",
                "syscall_hook",
                "pin_dir",
                "hook_mode"
            ]
        );
        new.keep_restart_only(&running);
        assert!(running.restart_only_changes(&new).is_empty());
        assert_eq!(new.rescan_interval, 1, "reloadable settings are left alone");
    }
}
