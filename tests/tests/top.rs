//! `backlogd top` in a real terminal (tmux): the dropping listener is the top row, its
//! drop totals are the kernel's, and `q` leaves the terminal as it was.

use std::{
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use backlogd_common::names::figure;
use backlogd_tests::{
    Daemon, Exact, Netns,
    daemon::binary,
    kernel::{ListenCounters, tcp_ext},
    sockets::{Listener, connect_burst, reset_close},
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

    /// Captures the pane until `f` holds. The limit only catches a hang: top redraws
    /// every refresh (0.5 s here).
    fn wait_for(&self, what: &str, f: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
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
    // The listener is alone in its namespace: the namespace's TcpExt counts its drops.
    let before = tcp_ext(&ns);
    let start = daemon.program_misses();
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
            // Closed with a RST: no client retries a SYN after this.
            held.into_iter().for_each(reset_close);
            ns
        })
    };

    let tmux = Tmux::new(120, 40);
    let cmd = format!(
        "{} top --api {} --interval 0.5; echo TOP-EXITED-$?",
        binary().display(),
        daemon.addr
    );
    tmux.run(&["send-keys", "-t", "top", &cmd, "Enter"]);
    let port = format!("127.0.0.1:{}", listener.addr.port());
    // Sorted by drops per second: the only listener dropping is the first row.
    tmux.wait_for("the dropping listener on top", |s| {
        let lines: Vec<&str> = s.lines().collect();
        lines
            .iter()
            .position(|l| l.contains("ADDRESS:PORT"))
            .and_then(|h| lines.get(h + 1))
            .is_some_and(|first| first.contains(&port))
            && !s.contains("drops 0/s")
    });

    // The interval closes: no more SYNs. Then top's totals for the listener (its detail
    // pane, the rows filtered to its namespace) must be the kernel's for the same
    // interval, the listener's whole life.
    stop.store(true, Ordering::Relaxed);
    let ns = flood.join().unwrap();
    let kernel = ListenCounters::delta(&before, &tcp_ext(&ns));
    let netns = ns.inode().to_string();
    for key in ["/"]
        .into_iter()
        .chain(std::iter::once(netns.as_str()))
        .chain(["Enter", "d"])
    {
        tmux.run(&["send-keys", "-t", "top", key]);
    }
    // A refresh whose two snapshots were both taken after the last drop shows no drops
    // per second in the header (while the flood ran, every 100 ms brought 20 more).
    let screen = tmux.wait_for(
        "a refresh after the interval closed, with the detail pane",
        |s| detail_drops(s).is_some() && s.contains("drops 0/s"),
    );
    let [accept_queue_full, syn_queue_full, final_ack_overflow, other] = detail_drops(&screen)
        .unwrap_or_else(|| panic!("no drops line in the detail pane:\n{screen}"));
    let mut exact = Exact::listener(&daemon, &ns, &listener);
    exact
        .interval(&daemon, &start)
        .evidence("top's screen", &screen)
        .evidence("kernel TcpExt deltas", kernel)
        .eq_fed(
            "top: accept queue full + final-ACK overflow vs ListenOverflows",
            &[figure::DROPS],
            accept_queue_full + final_ack_overflow,
            kernel.listen_overflows,
        )
        .eq_fed(
            "top: SYN queue full vs TCPReqQFullDrop",
            &[figure::DROPS],
            syn_queue_full,
            kernel.reqq_full_drop,
        )
        .eq_fed(
            "top: all drops vs ListenDrops",
            &[figure::DROPS],
            accept_queue_full + syn_queue_full + final_ack_overflow + other,
            kernel.listen_drops,
        );
    exact.verify();

    tmux.run(&["send-keys", "-t", "top", "q"]);
    let after = tmux.wait_for("top to exit", |s| s.contains("TOP-EXITED-0"));
    // Back on the shell's screen: the alternate screen with the table is gone.
    assert!(!after.contains("ADDRESS:PORT"), "{after}");
}

/// The detail pane's drop totals: accept queue full, SYN queue full, final-ACK overflow,
/// other.
fn detail_drops(screen: &str) -> Option<[u64; 4]> {
    let line = screen
        .lines()
        .find_map(|l| Some(l.split_once("dropped: SYNs, accept queue full ")?.1))?;
    let mut numbers = line
        .split_whitespace()
        .filter_map(|w| w.parse::<u64>().ok());
    Some([
        numbers.next()?,
        numbers.next()?,
        numbers.next()?,
        numbers.next()?,
    ])
}
