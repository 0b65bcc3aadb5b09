//! Command line.

pub mod docs;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::client::ApiArgs;
use crate::{config::Layer, diagnosis::finding::Severity};

/// Per-listener TCP listen-queue observability: requested vs granted backlogs, SYN and
/// accept-queue drops and why, served as Prometheus metrics.
#[derive(Debug, Parser)]
#[command(name = "backlogd", version)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Log filter (tracing EnvFilter syntax), e.g. `info` or `backlogd=debug`. For `run`
    /// it overrides the config file's `log` [default: info].
    #[arg(long, global = true, env = "BACKLOGD_LOG")]
    pub log: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon: load the eBPF probes and serve /metrics (needs root or CAP_BPF +
    /// CAP_PERFMON).
    Run(RunArgs),
    /// Load, attach and pin the eBPF programs as `run` would, then exit, leaving them for a
    /// `run` without the capabilities to load (the shipped unit runs this as root in
    /// ExecStartPre=, its daemon as user backlogd). Needs pin_dir; keeps a state this
    /// build already pinned.
    Load(RunArgs),
    /// Check every listener and namespace through the running daemon and print what to
    /// change, most severe first. Exits 1 when a finding at or above --fail-on exists,
    /// 2 on errors.
    Doctor(DoctorArgs),
    /// Check a config file and print the settings `backlogd run` would use with it and
    /// these flags (defaults, then the file, then flags); exits non-zero naming the bad key
    /// or value.
    CheckConfig(RunArgs),
    /// Live view of every listener: drops by reason, queues, accept wait, sorted by drops.
    Top(TopArgs),
    /// Remove the state `run --pin-dir` left under bpffs, detaching its programs (for
    /// uninstalling, or before running without pins).
    Unpin(UnpinArgs),
    /// Write the manual pages and the bash, zsh and fish completions into DIR (for
    /// packagers: `cargo xtask deb` installs them).
    #[command(hide = true)]
    GenerateDocs(GenerateDocsArgs),
}

#[derive(Debug, Args)]
pub struct GenerateDocsArgs {
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
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
    #[command(flatten)]
    pub api: ApiArgs,
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
    #[command(flatten)]
    pub api: ApiArgs,
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
    /// TOML config file holding any of the settings below (docs/operations.md lists every key);
    /// flags given here override it. Without this flag /etc/backlogd/backlogd.toml is read
    /// if it exists.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub settings: Layer,
}
