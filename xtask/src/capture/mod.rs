//! `cargo xtask capture`: the README's `backlogd top` screen, `backlogd doctor` output and
//! burst plot, from a real run rather than typed or drawn, so they cannot show a column, a
//! finding or a figure that no longer exists. The release daemon runs (as the suite starts
//! it: a free loopback port, no config file); in a network namespace of its own with
//! `net.core.somaxconn = 128`, a Python server asks `listen()` for 511 and never accepts,
//! and clients connect in a burst and then in a trickle, so its accept queue overflows
//! while the captures are taken. `top` runs in a tmux pane (its live screen, filtered to
//! that namespace with its own `/` key), captured with its colours and drawn as
//! docs/images/top.svg (`screen.rs`), its text kept in the README too; `doctor` runs as a
//! command; the listener's figures in the JSON API are sampled from before the burst until
//! after it and plotted as docs/images/burst.svg (`burst.rs`). Each goes into the README
//! between its markers, under a line naming the commit, the kernel and the hook mode.

mod burst;
mod screen;

use std::{
    process::{Child, Command},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use backlogd_tests::{Daemon, Netns, daemon::binary, sockets::connect_burst};

const PORT: u16 = 8080;
const BACKLOG: u32 = 511;
const SOMAXCONN: &str = "128";
/// Clients at once, then per half second while `top` runs.
const BURST: usize = 400;
const TRICKLE: usize = 20;
const TRICKLE_EVERY: Duration = Duration::from_millis(500);
/// The tmux pane `top` draws in.
const COLUMNS: u16 = 110;
const LINES: u16 = 14;
/// The burst plot's span: samples from this long before the burst until [`AFTER`] after
/// it: long enough for several waves of the clients' SYN retransmits.
const BEFORE: Duration = Duration::from_secs(1);
const AFTER: Duration = Duration::from_secs(8);

/// The README's capture blocks: each from its start marker to the next end marker.
const TOP: &str = "<!-- top: written by `cargo xtask capture` -->";
const DOCTOR: &str = "<!-- doctor: written by `cargo xtask capture` -->";
const BURST_PLOT: &str = "<!-- burst: written by `cargo xtask capture` -->";
const END: &str = "<!-- end of capture -->";
/// Where the pictures go, from the workspace root (the README links them so).
const TOP_SVG: &str = "docs/images/top.svg";
const BURST_SVG: &str = "docs/images/burst.svg";
const BURST_CSV: &str = "docs/images/burst.csv";

pub fn run() -> Result<()> {
    // Both come with `cargo xtask setup` (tmux for the suite's top test; python3 is
    // Debian's), not with the build setup this command runs.
    for (tool, args) in [("tmux", "-V"), ("/usr/bin/python3", "--version")] {
        crate::setup::output(Command::new(tool).arg(args)).with_context(|| {
            format!("{tool} is needed to capture: run `cargo xtask setup` (or apt-get install tmux python3)")
        })?;
    }
    let started = Instant::now();
    let daemon = Daemon::start();
    let ns = Netns::new();
    ns.sysctl("net.core.somaxconn", SOMAXCONN);
    let server = Server::start(&ns)?;
    let to = format!("127.0.0.1:{PORT}").parse()?;
    wait_for_port(&daemon)?;

    let sampler = burst::Sampler::start(daemon.addr, ns.inode(), PORT);
    std::thread::sleep(BEFORE);
    let burst = Instant::now();
    let mut clients = connect_burst(&ns, to, BURST);
    let session = format!("backlogd-capture-{}", std::process::id());
    let top = format!("{} top --api {}", binary().display(), daemon.addr);
    crate::run(Command::new("tmux").args([
        "new-session",
        "-d",
        "-s",
        &session,
        "-x",
        &COLUMNS.to_string(),
        "-y",
        &LINES.to_string(),
        &top,
    ]))?;
    let mut trickle = (Duration::ZERO, Duration::ZERO);
    let filtered = format!("filter {}  ", ns.inode());
    let row = format!("127.0.0.1:{PORT}");
    let screen = (|| -> Result<String> {
        // Keys typed before `top` has put the terminal in raw mode would reach it through
        // the line discipline (Enter as ^J): they wait for its first screen.
        wait_for_pane(&session, "top's first screen", |s| {
            s.contains("ADDRESS:PORT")
        })?;
        // Only this namespace's listener: the daemon sees every listener on the host.
        tmux_keys(&session, &["/"])?;
        tmux_keys(&session, &[&ns.inode().to_string(), "Enter"])?;
        wait_for_pane(
            &session,
            "the filter on the namespace, and its listener",
            |s| s.contains(&filtered) && s.contains(&row),
        )?;
        trickle.0 = burst.elapsed();
        let until = Instant::now() + Duration::from_secs(4);
        while Instant::now() < until {
            trickle.1 = burst.elapsed();
            clients.extend(connect_burst(&ns, to, TRICKLE));
            std::thread::sleep(TRICKLE_EVERY);
        }
        // -e: with its colours and attributes, as SGR escapes.
        crate::setup::output(Command::new("tmux").args([
            "capture-pane",
            "-e",
            "-p",
            "-t",
            &session,
        ]))
    })();
    let _ = Command::new("tmux")
        .args(["kill-session", "-t", &session])
        .status();
    let screen = screen::trim(&screen?);
    let text = screen::strip(&screen);
    if !text.contains(&filtered) || !text.contains(&row) {
        bail!("top's screen lost the filter or the listener {row}:\n{text}");
    }

    let doctor = Command::new(binary())
        .args(["doctor", "--api", &daemon.addr.to_string()])
        .env("NO_COLOR", "1")
        .output()
        .context("running backlogd doctor")?;
    // 1: findings at or above the default --fail-on, which this situation must give.
    if doctor.status.code() != Some(1) {
        bail!(
            "backlogd doctor exited with {} (expected 1, findings):\n{}",
            doctor.status,
            String::from_utf8_lossy(&doctor.stderr)
        );
    }
    let doctor = only_this_namespace(&String::from_utf8(doctor.stdout)?, ns.inode());
    let mode = daemon
        .try_hook_mode()
        .context("the daemon names no hook mode")?;
    let samples = sampler.finish(burst, AFTER)?;
    drop(clients);
    drop(server);

    let commit = crate::setup::output(Command::new("git").args(["rev-parse", "--short", "HEAD"]))?;
    let dirty = !crate::setup::output(Command::new("git").args(["status", "--porcelain"]))?
        .trim()
        .is_empty();
    let kernel = crate::setup::output(Command::new("uname").arg("-r"))?;
    let run = format!(
        "at {}{}, kernel {}, {mode} mode, by `cargo xtask capture`",
        commit.trim(),
        if dirty {
            " (with uncommitted changes)"
        } else {
            ""
        },
        kernel.trim()
    );
    let root = crate::workspace_root();
    std::fs::create_dir_all(root.join("docs/images")).context("creating docs/images")?;
    std::fs::write(root.join(TOP_SVG), screen::svg(&screen)).context("writing the top SVG")?;
    let title = format!(
        "One burst: {BURST} clients at 0 s, then {TRICKLE} every {:.1} s from {:.1} to {:.1} s",
        TRICKLE_EVERY.as_secs_f64(),
        trickle.0.as_secs_f64(),
        trickle.1.as_secs_f64(),
    );
    burst::plot(&samples, &title, BACKLOG, &root.join(BURST_SVG))?;
    std::fs::write(root.join(BURST_CSV), burst::csv(&samples)).context("writing the samples")?;

    let top = format!(
        "`backlogd top` ({COLUMNS}x{LINES} tmux pane, filtered to the namespace with `/`), {run}:\n\n\
         ![backlogd top in a tmux pane: the namespace's Python server and its drops]({TOP_SVG})\n\n\
         <details><summary>The same screen as text</summary>\n\n```\n{text}\n```\n\n</details>",
    );
    let doctor = format!(
        "`backlogd doctor` (its findings about the namespace), {run}:\n\n```\n{}\n```",
        doctor.trim_end()
    );
    let plot = format!(
        "The burst as the daemon served it (`/api/v1/snapshot` read every {} ms; the samples: \
         [{BURST_CSV}]({BURST_CSV})), {run}:\n\n\
         ![SYNs dropped per interval and connections on the accept queue against time]({BURST_SVG})",
        burst::EVERY.as_millis()
    );
    let path = root.join("README.md");
    let readme = std::fs::read_to_string(&path).context("reading README.md")?;
    let readme = replace_block(&readme, TOP, &top)?;
    let readme = replace_block(&readme, DOCTOR, &doctor)?;
    let readme = replace_block(&readme, BURST_PLOT, &plot)?;
    std::fs::write(&path, readme).context("writing README.md")?;
    eprintln!(
        "xtask: wrote the captures into README.md, {TOP_SVG}, {BURST_SVG} and {BURST_CSV} ({run}; {} samples; took {:.0} s)",
        samples.len(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// A Python server in `ns` that listens with backlog [`BACKLOG`] and never accepts: a
/// stalled application, with a name of its own in `top`'s process column.
struct Server(Child);

impl Server {
    fn start(ns: &Netns) -> Result<Self> {
        let script = format!(
            "import socket, time\n\
             s = socket.socket()\n\
             s.bind(('127.0.0.1', {PORT}))\n\
             s.listen({BACKLOG})\n\
             time.sleep(600)\n"
        );
        let child = ns.run(move || {
            Command::new("/usr/bin/python3")
                .args(["-c", &script])
                .spawn()
        });
        Ok(Self(
            child.context("starting /usr/bin/python3 in the namespace")?,
        ))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits until the daemon lists a listener on [`PORT`] (the server's listen() event).
fn wait_for_port(daemon: &Daemon) -> Result<()> {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = daemon.get("/api/v1/listeners");
        if status == 200 && body.contains(&format!("\"port\":{PORT}")) {
            return Ok(());
        }
        if Instant::now() > until {
            bail!("the daemon did not list the server on port {PORT} within 10 s: {body}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits up to 10 s for the pane of tmux `session` to satisfy `done`.
fn wait_for_pane(session: &str, what: &str, done: impl Fn(&str) -> bool) -> Result<()> {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let pane =
            crate::setup::output(Command::new("tmux").args(["capture-pane", "-p", "-t", session]))?;
        if done(&pane) {
            return Ok(());
        }
        if Instant::now() > until {
            bail!("no {what} in the tmux pane within 10 s:\n{pane}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn tmux_keys(session: &str, keys: &[&str]) -> Result<()> {
    crate::run(
        Command::new("tmux")
            .args(["send-keys", "-t", session])
            .args(keys),
    )
}

/// `doctor`'s output reduced to its findings about namespace `netns` (the daemon sees
/// the whole host): the lines before the first finding, and each finding (a paragraph)
/// that names the namespace.
fn only_this_namespace(out: &str, netns: u64) -> String {
    let needle = netns.to_string();
    out.split("\n\n")
        .filter(|p| p.contains(&needle))
        .collect::<Vec<_>>()
        .join("\n\n")
}

/// `text` with the block after marker `start` (up to the next end marker) replaced.
fn replace_block(text: &str, start: &str, block: &str) -> Result<String> {
    let Some(a) = text.find(start) else {
        bail!("README.md has no capture marker {start}");
    };
    let from = a + start.len();
    let Some(b) = text[from..].find(END).map(|b| b + from) else {
        bail!("README.md has no {END} after {start}");
    };
    Ok(format!("{}\n{block}\n{}", &text[..from], &text[b..]))
}
