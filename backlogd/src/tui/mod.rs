//! `backlogd top`: the live terminal view over the daemon's JSON API.

pub mod app;
pub mod ui;

use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use anyhow::{Context as _, anyhow};
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};

use self::app::App;
use crate::exporter::metrics::Snapshot;

pub struct TopOptions {
    pub api: SocketAddr,
    pub interval: Duration,
    pub once: bool,
    pub json: bool,
}

fn fetch(api: SocketAddr) -> anyhow::Result<Snapshot> {
    let url = format!("http://{api}/api/v1/snapshot");
    let body = ureq::get(&url)
        .call()
        .map_err(|e| {
            anyhow!(
                "no backlogd daemon answers at {api} ({e}). Fix: start it (`sudo backlogd run` \
                 or its systemd service), point `--api HOST:PORT` at it, or run \
                 `sudo backlogd top --standalone` to load the probes in this process"
            )
        })?
        .body_mut()
        .read_to_string()
        .with_context(|| format!("reading {url}"))?;
    serde_json::from_str(&body).with_context(|| format!("{url}: not a backlogd snapshot"))
}

pub fn run(opts: &TopOptions) -> anyhow::Result<()> {
    let mut app = App::new(opts.interval);
    let mut last = Instant::now();
    app.update(fetch(opts.api)?, opts.interval);
    if opts.once || opts.json {
        // Rates need two snapshots one interval apart.
        std::thread::sleep(opts.interval);
        app.update(fetch(opts.api)?, last.elapsed());
        if opts.json {
            println!("{}", serde_json::to_string_pretty(&app.rows)?);
        } else {
            print!("{}", ui::plain(&app));
        }
        return Ok(());
    }
    // Restores the terminal on exit and on panic (ratatui installs the hook).
    let mut terminal = ratatui::init();
    let result = (|| -> anyhow::Result<()> {
        loop {
            terminal.draw(|f| ui::draw(f, &app))?;
            let wait = app.interval.saturating_sub(last.elapsed());
            if event::poll(wait)? {
                if let Event::Key(k) = event::read()?
                    && k.kind == KeyEventKind::Press
                {
                    // Raw mode delivers Ctrl-C as a key, not a signal.
                    let ctrl_c =
                        k.code == KeyCode::Char('c') && k.modifiers.contains(KeyModifiers::CONTROL);
                    if ctrl_c || app.on_key(k.code) {
                        return Ok(());
                    }
                }
                continue;
            }
            let now = Instant::now();
            if !app.paused {
                match fetch(opts.api) {
                    Ok(s) => app.update(s, now - last),
                    Err(e) => app.status = Some(format!("stale: {e:#}")),
                }
            }
            last = now;
        }
    })();
    ratatui::restore();
    result
}
