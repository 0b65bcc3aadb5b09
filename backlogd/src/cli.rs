//! Command line.

use std::{net::SocketAddr, path::PathBuf};

use clap::{Args, Parser, Subcommand};

use crate::{
    doctor::findings::Severity,
    loader::{btf::KERNEL_BTF, modes::HookModeArg},
};

/// Per-listener TCP listen-queue observability: requested vs granted backlogs, SYN and
/// accept-queue drops and why, served as Prometheus metrics.
#[derive(Debug, Parser)]
#[command(name = "backlogd", version)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Log filter (tracing EnvFilter syntax), e.g. `info` or `backlogd=debug`.
    #[arg(long, global = true, env = "BACKLOGD_LOG", default_value = "info")]
    pub log: String,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon: load the eBPF probes and serve /metrics (needs root or CAP_BPF +
    /// CAP_PERFMON).
    Run(RunArgs),
    /// Check every listener and namespace through the running daemon and print what to
    /// change, most severe first. Exits 1 when a finding at or above --fail-on exists,
    /// 2 on errors.
    Doctor(DoctorArgs),
    /// Live view of every listener: drops by reason, queues, accept wait, sorted by drops.
    Top(TopArgs),
    /// Remove the state `run --pin-dir` left under bpffs, detaching its programs (for
    /// uninstalling, or before running without pins).
    Unpin(UnpinArgs),
}

/// Where the shipped systemd unit pins.
pub const DEFAULT_PIN_DIR: &str = "/sys/fs/bpf/backlogd";

#[derive(Debug, Args)]
pub struct UnpinArgs {
    /// The directory given to `run --pin-dir`.
    #[arg(long, value_name = "DIR", default_value = DEFAULT_PIN_DIR)]
    pub pin_dir: PathBuf,
}

#[derive(Debug, Args)]
pub struct TopArgs {
    /// Address of the daemon's HTTP endpoint.
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:9851")]
    pub api: SocketAddr,
    /// Seconds between refreshes (change it live with + and -).
    #[arg(long, value_name = "SECONDS", default_value_t = 1.0)]
    pub interval: f64,
    /// Print one snapshot (rates over one interval) as a table and exit.
    #[arg(long)]
    pub once: bool,
    /// Print one snapshot as JSON and exit.
    #[arg(long)]
    pub json: bool,
    /// Load the probes in this process instead of reading a daemon (needs root).
    #[arg(long)]
    pub standalone: bool,
}

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Address of the daemon's HTTP endpoint.
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:9851")]
    pub api: SocketAddr,
    /// Print the findings as JSON.
    #[arg(long)]
    pub json: bool,
    /// Lowest severity that makes the exit status non-zero.
    #[arg(long, value_enum, default_value_t = Severity::Warning)]
    pub fail_on: Severity,
    /// No daemon: load the probes in this process (needs root), watch for --duration
    /// seconds, then report. Sees only what happens in that window (and the backlogs
    /// granted to listeners already open).
    #[arg(long)]
    pub standalone: bool,
    /// Seconds to watch in --standalone mode.
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 10,
        requires = "standalone"
    )]
    pub duration: u64,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Address to serve /metrics, /healthz and the JSON API on (port 0 picks a free one;
    /// the log says which).
    #[arg(long, value_name = "HOST:PORT", default_value = "0.0.0.0:9851")]
    pub listen: SocketAddr,
    /// Raw BTF of the running kernel, for kernels that do not expose
    /// /sys/kernel/btf/vmlinux.
    #[arg(long, value_name = "FILE", default_value = KERNEL_BTF)]
    pub btf: PathBuf,
    /// Seconds between sock_diag scans of every network namespace. Events report
    /// listeners as they come and go; the scan finds those that were listening before
    /// backlogd started and repairs the table if an event was ever lost.
    #[arg(long, value_name = "SECONDS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    pub rescan_interval: u64,
    /// Seconds over which queue high-water marks are reported: a queue that filled for
    /// 50 ms stays visible in `*_max_length` for this long. Keep it at least as long as
    /// the scrape interval.
    #[arg(long, value_name = "SECONDS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub hwm_window: u64,
    /// How the SYN path is hooked. `auto` picks the best mode the kernel and this build
    /// support and logs the choice; it is exported as backlogd_hook_mode.
    #[arg(long, value_enum, default_value_t = HookModeArg::Auto)]
    pub hook_mode: HookModeArg,
    /// Pin the programs' links and the counter maps under this bpffs directory (the
    /// shipped unit uses /sys/fs/bpf/backlogd): the programs keep counting while the
    /// daemon is down, and the next daemon of the same build continues the counters
    /// instead of starting from zero. Without it everything is detached at exit. Remove
    /// the pins with `backlogd unpin`.
    #[arg(long, value_name = "DIR")]
    pub pin_dir: Option<PathBuf>,
}
