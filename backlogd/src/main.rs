//! backlogd: eBPF-based listen-queue observability daemon and CLI.

mod api;
mod bpf_syscall;
mod cli;
mod client;
mod config;
mod daemon;
mod diagnosis;
#[cfg(test)]
mod docs_names;
mod doctor;
mod exporter;
mod kernel_maps;
mod listeners;
mod loader;
mod names;
mod programs;
mod queues;
mod sampling;
mod service;
mod sources;
mod state;
mod tui;

use clap::Parser as _;
use tracing_subscriber::EnvFilter;

use crate::cli::{Cli, Command};

fn doctor_cmd(args: &cli::DoctorArgs) -> anyhow::Result<Outcome> {
    let api = if args.standalone {
        let api = daemon::spawn_standalone()?;
        std::thread::sleep(std::time::Duration::from_secs(args.duration));
        client::ApiArgs::plain(api)
    } else {
        args.api.clone()
    };
    let failed = doctor::run(&doctor::DoctorOptions {
        api: client::Api::new(&api)?,
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
        client::ApiArgs::plain(daemon::spawn_standalone()?)
    } else {
        args.api.clone()
    };
    tui::run(&tui::TopOptions {
        api: client::Api::new(&api)?,
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

type LogHandle = tracing_subscriber::reload::Handle<EnvFilter, tracing_subscriber::Registry>;

/// Logs to stderr through a filter a config reload can replace. A terminal gets
/// timestamps and colour; journald (stderr is the stream systemd names in
/// `JOURNAL_STREAM`) gets plain lines with a syslog priority prefix (sd-daemon(3)), so
/// `journalctl -p warning` shows backlogd's warnings and journald keeps its own timestamps.
fn init_logging(filter: &str, quiet: bool) -> LogHandle {
    use tracing_subscriber::{layer::SubscriberExt as _, util::SubscriberInitExt as _};
    let filter = EnvFilter::try_new(filter).unwrap_or_else(|_| EnvFilter::new("info"));
    let (filter, handle) = tracing_subscriber::reload::Layer::new(filter);
    let writer = move || -> Box<dyn std::io::Write> {
        if quiet {
            Box::new(std::io::sink())
        } else {
            Box::new(std::io::stderr())
        }
    };
    let registry = tracing_subscriber::registry().with(filter);
    if stderr_is_journal() {
        let format = journal::Prefixed(
            tracing_subscriber::fmt::format()
                .without_time()
                .with_level(false)
                .with_ansi(false),
        );
        registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_ansi(false)
                    .event_format(format)
                    .with_writer(writer),
            )
            .init();
    } else {
        registry
            .with(tracing_subscriber::fmt::layer().with_writer(writer))
            .init();
    }
    handle
}

/// Whether stderr is the journal stream systemd set up: `JOURNAL_STREAM` is `DEV:INODE`
/// of that stream, and a child that redirected stderr elsewhere inherits the variable.
fn stderr_is_journal() -> bool {
    use std::os::unix::fs::MetadataExt as _;
    let Some(stream) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Ok(meta) = std::fs::metadata("/proc/self/fd/2") else {
        return false;
    };
    stream.to_str() == Some(&format!("{}:{}", meta.dev(), meta.ino()))
}

mod journal {
    use tracing::{Event, Level, Subscriber};
    use tracing_subscriber::{
        fmt::{FmtContext, FormatEvent, FormatFields, format::Writer},
        registry::LookupSpan,
    };

    /// An event format with the `<N>` syslog priority prefix journald reads from a stream.
    pub struct Prefixed<F>(pub F);

    impl<S, N, F> FormatEvent<S, N> for Prefixed<F>
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
        N: for<'a> FormatFields<'a> + 'static,
        F: FormatEvent<S, N>,
    {
        fn format_event(
            &self,
            ctx: &FmtContext<'_, S, N>,
            mut writer: Writer<'_>,
            event: &Event<'_>,
        ) -> std::fmt::Result {
            write!(writer, "<{}>", priority(*event.metadata().level()))?;
            self.0.format_event(ctx, writer, event)
        }
    }

    /// syslog(3) priorities: err, warning, info, debug.
    pub fn priority(level: Level) -> u8 {
        match level {
            Level::ERROR => 3,
            Level::WARN => 4,
            Level::INFO => 6,
            Level::DEBUG | Level::TRACE => 7,
        }
    }
}

fn run_daemon(
    source: config::Source,
    config: config::Config,
    log: LogHandle,
) -> anyhow::Result<()> {
    match source.file_in_use() {
        Some(file) => tracing::info!(
            "configuration: {} (command-line flags override it)",
            file.display()
        ),
        None => tracing::info!(
            "configuration: built-in defaults and flags ({} does not exist)",
            source.file.display()
        ),
    }
    daemon::run(daemon::RunConfig {
        ready: None,
        config,
        source: Some(source),
        set_log_filter: Some(Box::new(move |filter: &str| {
            let filter = EnvFilter::try_new(filter)?;
            log.reload(filter)?;
            Ok(())
        })),
        drop_privileges: true,
        worker_threads: 2,
    })
}

fn check_config(source: &config::Source) -> anyhow::Result<()> {
    let config = source.resolve()?;
    exporter::server::HttpSettings::load(&config.http)?;
    match source.file_in_use() {
        Some(file) => println!(
            "# {}: OK. Effective settings (file, then flags):",
            file.display()
        ),
        None => println!(
            "# {} does not exist: built-in defaults and flags. Effective settings:",
            source.file.display()
        ),
    }
    print!("{}", config.to_toml());
    Ok(())
}

/// The settings `run`, `load` and `check-config` use: the file, then the flags (and the
/// global --log).
fn settings_source(args: cli::RunArgs, log: Option<String>) -> config::Source {
    config::Source::new(
        args.config,
        config::Layer {
            log,
            ..args.settings
        },
    )
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    // The terminal view owns the screen: logs would tear it.
    let quiet = matches!(&cli.command, Command::Top(t) if !t.once && !t.json);
    let cli_log = cli.log.clone();
    let result = match cli.command {
        Command::Run(args) => {
            let source = settings_source(args, cli_log);
            match source.resolve() {
                Ok(config) => {
                    let log = init_logging(&config.log, quiet);
                    run_daemon(source, config, log).map(|()| Outcome::Clean)
                }
                Err(e) => Err(e.into()),
            }
        }
        Command::Load(args) => {
            let source = settings_source(args, cli_log);
            match source.resolve() {
                Ok(config) => {
                    init_logging(&config.log, quiet);
                    daemon::load_and_hand_over(&config).map(|()| Outcome::Clean)
                }
                Err(e) => Err(e.into()),
            }
        }
        Command::CheckConfig(args) => {
            check_config(&settings_source(args, cli_log)).map(|()| Outcome::Clean)
        }
        Command::Doctor(args) => {
            init_logging(cli_log.as_deref().unwrap_or("info"), quiet);
            doctor_cmd(&args)
        }
        Command::Top(args) => {
            init_logging(cli_log.as_deref().unwrap_or("info"), quiet);
            top(&args).map(|()| Outcome::Clean)
        }
        Command::Unpin(args) => {
            init_logging(cli_log.as_deref().unwrap_or("info"), quiet);
            loader::unpin(&args.pin_dir).map(|()| Outcome::Clean)
        }
        Command::GenerateDocs(args) => cli::docs::generate(&args.out).map(|()| Outcome::Clean),
    };
    match result {
        Ok(Outcome::Clean) => std::process::ExitCode::SUCCESS,
        Ok(Outcome::Findings) => std::process::ExitCode::from(1),
        Err(e) => {
            // The one line systemd's status and `journalctl -p err` must show.
            let prefix = if stderr_is_journal() { "<3>" } else { "" };
            eprintln!("{prefix}backlogd: error: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}
