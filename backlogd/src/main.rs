//! backlogd: eBPF-based listen-queue observability daemon and CLI.

mod cli;
mod daemon;
mod doctor;
mod exporter;
mod listeners;
mod loader;
mod queues;
mod sampling;
mod tui;

use clap::Parser as _;
use tracing_subscriber::EnvFilter;

use crate::cli::{Cli, Command};

fn doctor_cmd(args: &cli::DoctorArgs) -> anyhow::Result<Outcome> {
    let api = if args.standalone {
        let api = daemon::spawn_standalone()?;
        std::thread::sleep(std::time::Duration::from_secs(args.duration));
        api
    } else {
        args.api
    };
    let failed = doctor::run(&doctor::DoctorOptions {
        api,
        json: args.json,
        fail_on: args.fail_on,
    })?;
    Ok(if failed {
        Outcome::Findings
    } else {
        Outcome::Clean
    })
}

fn top(args: &cli::TopArgs) -> anyhow::Result<()> {
    let interval = std::time::Duration::from_secs_f64(args.interval.clamp(0.25, 60.0));
    let api = if args.standalone {
        daemon::spawn_standalone()?
    } else {
        args.api
    };
    tui::run(&tui::TopOptions {
        api,
        interval,
        once: args.once,
        json: args.json,
    })
}

/// How a command ended, for the exit status.
enum Outcome {
    Clean,
    /// `doctor` found something at or above `--fail-on`.
    Findings,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    // The terminal view owns the screen: logs would tear it.
    let quiet = matches!(&cli.command, Command::Top(t) if !t.once && !t.json);
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_new(&cli.log).unwrap_or_else(|_| EnvFilter::new("info")))
        .with_writer(move || -> Box<dyn std::io::Write> {
            if quiet {
                Box::new(std::io::sink())
            } else {
                Box::new(std::io::stderr())
            }
        })
        .init();
    let result = match cli.command {
        Command::Run(args) => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(anyhow::Error::from)
            .and_then(|rt| {
                rt.block_on(daemon::run(daemon::RunConfig {
                    ready: None,
                    listen: args.listen,
                    btf: args.btf,
                    rescan_interval: std::time::Duration::from_secs(args.rescan_interval),
                    hwm_window: std::time::Duration::from_secs(args.hwm_window),
                    hook_mode: args.hook_mode,
                    pin_dir: args.pin_dir,
                }))
            })
            .map(|()| Outcome::Clean),
        Command::Doctor(args) => doctor_cmd(&args),
        Command::Top(args) => top(&args).map(|()| Outcome::Clean),
        Command::Unpin(args) => loader::unpin(&args.pin_dir).map(|()| Outcome::Clean),
    };
    match result {
        Ok(Outcome::Clean) => std::process::ExitCode::SUCCESS,
        Ok(Outcome::Findings) => std::process::ExitCode::from(1),
        Err(e) => {
            eprintln!("backlogd: error: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}
