//! `backlogd top` in a real terminal (tmux): the dropping listener is the top row, and
//! `q` leaves the terminal as it was.

use std::{
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use backlogd_tests::{
    Daemon, Netns,
    daemon::binary,
    sockets::{Listener, connect_burst},
};

struct Tmux {
    socket: String,
}

impl Tmux {
    fn new(width: u16, height: u16) -> Self {
        let socket = format!("backlogd-test-{}", std::process::id());
        let t = Self { socket };
        t.run(&[
            "new-session",
            "-d",
            "-s",
            "top",
            "-x",
            &width.to_string(),
            "-y",
            &height.to_string(),
            "bash --norc --noprofile",
        ]);
        t
    }

    fn run(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .args(["-L", &self.socket])
            .args(args)
            .output()
            .expect("tmux (Debian package; `cargo xtask setup` installs it)");
        assert!(
            out.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn screen(&self) -> String {
        self.run(&["capture-pane", "-p", "-t", "top"])
    }

    fn wait_for(&self, what: &str, f: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let s = self.screen();
            if f(&s) {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}:\n{s}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["-L", &self.socket, "kill-server"])
            .status();
    }
}

#[test]
fn top_shows_the_dropping_listener_first_and_q_restores_the_terminal() {
    let daemon = Daemon::start();
    let ns = Netns::new();
    ns.sysctl("net.ipv4.tcp_syncookies", "0");
    let listener = Listener::open(&ns, "127.0.0.1:0", 4);
    daemon.wait_for_listener(listener.inode);
    // Keep SYNs arriving at a full queue while top refreshes.
    let stop = Arc::new(AtomicBool::new(false));
    let flood = {
        let stop = stop.clone();
        let addr = listener.addr;
        let ns = Arc::new(ns);
        let ns2 = ns.clone();
        std::thread::spawn(move || {
            let mut held = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                held.extend(connect_burst(&ns2, addr, 20));
                std::thread::sleep(Duration::from_millis(100));
            }
            drop(held);
            ns
        })
    };

    let tmux = Tmux::new(120, 30);
    let cmd = format!(
        "{} top --api {} --interval 0.5; echo TOP-EXITED-$?",
        binary().display(),
        daemon.addr
    );
    tmux.run(&["send-keys", "-t", "top", &cmd, "Enter"]);
    let port = format!("127.0.0.1:{}", listener.addr.port());
    let screen = tmux.wait_for("the dropping listener on top", |s| {
        let lines: Vec<&str> = s.lines().collect();
        lines
            .iter()
            .position(|l| l.contains("ADDRESS:PORT"))
            .and_then(|h| lines.get(h + 1))
            .is_some_and(|first| first.contains(&port))
            && !s.contains("drops 0/s")
    });
    let lines: Vec<&str> = screen.lines().collect();
    let h = lines
        .iter()
        .position(|l| l.contains("ADDRESS:PORT"))
        .unwrap();
    let first = lines[h + 1];
    // The DROPS/s column (6th) is non-zero for that row.
    let drops_col = lines[h].find("DROPS/s").unwrap();
    let drops: f64 = first
        .chars()
        .skip(drops_col)
        .collect::<String>()
        .split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no drop rate in {first:?}"));
    assert!(drops > 0.0, "{screen}");

    tmux.run(&["send-keys", "-t", "top", "q"]);
    let after = tmux.wait_for("top to exit", |s| s.contains("TOP-EXITED-0"));
    // Back on the shell's screen: the alternate screen with the table is gone.
    assert!(!after.contains("ADDRESS:PORT"), "{after}");
    stop.store(true, Ordering::Relaxed);
    drop(flood.join().unwrap());
}
