//! `backlogd top`: the live terminal view over the daemon's JSON API.

pub mod app;
pub mod ui;

use std::time::{Duration, Instant};

use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};

use self::app::App;
use crate::client::Api;

pub struct TopOptions {
    pub api: Api,
    pub interval: Duration,
    pub once: bool,
    pub json: bool,
}

pub fn run(opts: &TopOptions) -> anyhow::Result<()> {
    let mut app = App::new(opts.interval);
    let mut last = Instant::now();
    app.update(opts.api.snapshot()?, opts.interval);
    if opts.once || opts.json {
        // Rates need two snapshots one interval apart.
        std::thread::sleep(opts.interval);
        app.update(opts.api.snapshot()?, last.elapsed());
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
                match opts.api.snapshot() {
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
