//! A network namespace owned by one helper thread.
//!
//! The thread unshares its network namespace (or joins an existing one: [`Netns::join`]);
//! sockets it creates, `/proc/sys/net` writes it makes and processes it spawns all live
//! there. When the `Netns` is dropped the thread
//! exits, and the kernel frees the namespace once its last socket is closed: nothing to
//! clean up, even when a test panics.

use std::{
    os::unix::fs::MetadataExt as _,
    process::Command,
    sync::mpsc,
    thread::{self, JoinHandle},
};

type Job = Box<dyn FnOnce() + Send>;

/// Name of the helper thread; backlogd reports it as the listener's `comm`.
pub const THREAD_NAME: &str = "backlogd-netns";

pub struct Netns {
    jobs: Option<mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
    inode: u64,
}

impl Netns {
    /// A fresh namespace with loopback up.
    pub fn new() -> Self {
        let (jobs, rx) = mpsc::channel::<Job>();
        let (ready_tx, ready) = mpsc::channel();
        let thread = thread::Builder::new()
            .name(THREAD_NAME.into())
            .spawn(move || {
                // SAFETY: plain syscall; affects only this thread.
                if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
                    let err = std::io::Error::last_os_error();
                    ready_tx
                        .send(Err(format!(
                            "unshare(CLONE_NEWNET): {err} (tests need root)"
                        )))
                        .ok();
                    return;
                }
                let up = Command::new("ip")
                    .args(["link", "set", "lo", "up"])
                    .status();
                if !matches!(up, Ok(s) if s.success()) {
                    ready_tx
                        .send(Err(format!("`ip link set lo up` failed: {up:?}")))
                        .ok();
                    return;
                }
                let inode = std::fs::metadata("/proc/thread-self/ns/net")
                    .map(|m| m.ino())
                    .map_err(|e| e.to_string());
                ready_tx.send(inode).ok();
                for job in rx {
                    job();
                }
            })
            .expect("spawning netns thread");
        let inode = ready
            .recv()
            .expect("netns thread died")
            .unwrap_or_else(|e| panic!("creating a network namespace: {e}"));
        Self {
            jobs: Some(jobs),
            thread: Some(thread),
            inode,
        }
    }

    /// An existing namespace, e.g. a container's (`/proc/PID/ns/net`): the helper thread
    /// setns()es into it instead of unsharing a new one, and changes nothing in it (its
    /// loopback is left as it is). The namespace lives on while this `Netns` holds it.
    pub fn join(path: impl AsRef<std::path::Path>) -> Self {
        use std::os::fd::AsRawFd as _;
        let path = path.as_ref().to_owned();
        let (jobs, rx) = mpsc::channel::<Job>();
        let (ready_tx, ready) = mpsc::channel();
        let thread = thread::Builder::new()
            .name(THREAD_NAME.into())
            .spawn(move || {
                let entered = std::fs::File::open(&path)
                    .map_err(|e| format!("opening {}: {e}", path.display()))
                    .and_then(|f| {
                        // SAFETY: plain syscall on an fd we own; affects only this thread.
                        match unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } {
                            0 => Ok(()),
                            _ => Err(format!(
                                "setns({}, CLONE_NEWNET): {} (tests need root)",
                                path.display(),
                                std::io::Error::last_os_error()
                            )),
                        }
                    })
                    .and_then(|()| {
                        std::fs::metadata("/proc/thread-self/ns/net")
                            .map(|m| m.ino())
                            .map_err(|e| e.to_string())
                    });
                let ok = entered.is_ok();
                ready_tx.send(entered).ok();
                if ok {
                    for job in rx {
                        job();
                    }
                }
            })
            .expect("spawning netns thread");
        let inode = ready
            .recv()
            .expect("netns thread died")
            .unwrap_or_else(|e| panic!("joining a network namespace: {e}"));
        Self {
            jobs: Some(jobs),
            thread: Some(thread),
            inode,
        }
    }

    /// Inode of the namespace (`readlink /proc/PID/ns/net`), as backlogd labels it.
    pub fn inode(&self) -> u64 {
        self.inode
    }

    /// A path naming the namespace while it lives (its thread's), for `nsenter --net=`.
    pub fn path(&self) -> String {
        // SAFETY: gettid takes no arguments and cannot fail.
        let tid = self.run(|| unsafe { libc::gettid() });
        format!("/proc/{}/task/{tid}/ns/net", std::process::id())
    }

    /// Runs `f` inside the namespace and returns its result.
    pub fn run<R: Send + 'static>(&self, f: impl FnOnce() -> R + Send + 'static) -> R {
        let (tx, rx) = mpsc::channel();
        self.jobs
            .as_ref()
            .expect("netns alive")
            .send(Box::new(move || {
                tx.send(f()).ok();
            }))
            .expect("netns thread gone");
        rx.recv().expect("job panicked inside the netns thread")
    }

    /// Sets a namespaced sysctl, e.g. `net.core.somaxconn`.
    pub fn sysctl(&self, key: &str, value: &str) {
        let path = format!("/proc/sys/{}", key.replace('.', "/"));
        let value = value.to_owned();
        self.run(move || {
            std::fs::write(&path, &value).unwrap_or_else(|e| panic!("writing {path}: {e}"))
        });
    }

    /// Runs a command inside the namespace and returns its stdout; panics on failure.
    pub fn command(&self, program: &str, args: &[&str]) -> String {
        let program = program.to_owned();
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        self.run(move || {
            let out = Command::new(&program)
                .args(&args)
                .output()
                .unwrap_or_else(|e| panic!("starting {program}: {e}"));
            assert!(
                out.status.success(),
                "{program} {args:?}: {}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8(out.stdout).expect("utf-8 output")
        })
    }
}

impl Netns {
    /// Adds nft `rules` to chain `chain` (hooked at `hook` with `priority`) of inet table
    /// `table`, creating both if needed.
    fn nft_rules(&self, table: &str, chain: &str, hook: &str, priority: i32, rules: &[&str]) {
        self.command("nft", &["add", "table", "inet", table]);
        let spec = format!("{{ type filter hook {hook} priority {priority}; }}");
        self.command("nft", &["add", "chain", "inet", table, chain, &spec]);
        for rule in rules {
            let args: Vec<&str> = ["add", "rule", "inet", table, chain]
                .into_iter()
                .chain(rule.split(' '))
                .collect();
            self.command("nft", &args);
        }
    }

    /// Drops segments with exactly the given TCP flags (e.g. `"syn|ack"`) as they arrive
    /// at this namespace's sockets: handshakes then stay pending on the listener side.
    pub fn drop_incoming(&self, flags: &str) {
        let rule = format!("tcp flags & (syn|ack|rst|fin) == {flags} drop");
        self.nft_rules("backlogd_test", "input", "input", 0, &[&rule]);
    }

    /// As [`Netns::drop_incoming`], only for segments to local ports `ports` (nft syntax:
    /// `40001-40003`): some clients' handshakes stay pending, the others' do not.
    pub fn drop_incoming_to(&self, flags: &str, ports: &str) {
        let rule = format!("tcp dport {ports} tcp flags & (syn|ack|rst|fin) == {flags} drop");
        self.nft_rules("backlogd_test", "input", "input", 0, &[&rule]);
    }

    /// Starts counting the SYNs that arrive for TCP port `port` (an nft counter on the
    /// input hook, which every segment passes before TCP sees it): the kernel's own count
    /// of SYNs reaching the listener, unaffected by when clients read their statistics.
    pub fn count_incoming_syns(&self, port: u16) {
        let rule = format!("tcp dport {port} tcp flags & (syn|ack|rst) == syn counter");
        self.nft_rules("backlogd_count", "input", "input", -10, &[&rule]);
    }

    /// SYNs counted since [`Netns::count_incoming_syns`].
    pub fn incoming_syns(&self) -> u64 {
        let out = self.command("nft", &["-j", "list", "table", "inet", "backlogd_count"]);
        let json: serde_json::Value = serde_json::from_str(&out).expect("nft JSON");
        json["nftables"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|item| item["rule"]["expr"].as_array())
            .flatten()
            .find_map(|expr| expr["counter"]["packets"].as_u64())
            .unwrap_or_else(|| panic!("no SYN counter in: {out}"))
    }

    /// Starts counting the SYNs that arrive for TCP port `port` from each of `sources`
    /// (nft prefixes such as `127.20.1.0/24` or `fd00:1::/48`), one counter per source in
    /// that order: the kernel's own count of who sent them.
    pub fn count_incoming_syns_from(&self, port: u16, sources: &[&str]) {
        let rules: Vec<String> = sources
            .iter()
            .map(|src| {
                let family = if src.contains(':') { "ip6" } else { "ip" };
                format!(
                    "{family} saddr {src} tcp dport {port} tcp flags & (syn|ack|rst) == syn counter"
                )
            })
            .collect();
        let rules: Vec<&str> = rules.iter().map(String::as_str).collect();
        self.nft_rules("backlogd_sources", "input", "input", -10, &rules);
    }

    /// The counters of [`Netns::count_incoming_syns_from`], in its order.
    pub fn incoming_syns_from(&self) -> Vec<u64> {
        let out = self.command("nft", &["-j", "list", "table", "inet", "backlogd_sources"]);
        let json: serde_json::Value = serde_json::from_str(&out).expect("nft JSON");
        // nft lists a chain's rules in the order they were added.
        json["nftables"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|item| item["rule"]["expr"].as_array())
            .filter_map(|exprs| exprs.iter().find_map(|e| e["counter"]["packets"].as_u64()))
            .collect()
    }

    /// Answers every SYN-ACK this namespace sends with an ICMP error instead (IPv4 host
    /// unreachable, IPv6 administratively prohibited), as a router does for a SYN flood's
    /// spoofed sources: the kernel then removes the pending request and counts a listen
    /// drop (`tcp_req_err`).
    pub fn reject_outgoing_synacks(&self) {
        self.nft_rules(
            "backlogd_test",
            "output",
            "output",
            0,
            &[
                "meta nfproto ipv4 tcp flags & (syn|ack) == syn|ack reject with icmp type host-unreachable",
                "meta nfproto ipv6 tcp flags & (syn|ack) == syn|ack reject with icmpv6 type admin-prohibited",
            ],
        );
    }

    /// Removes every rule [`Netns::drop_incoming`] and
    /// [`Netns::reject_outgoing_synacks`] added.
    pub fn stop_dropping(&self) {
        self.command("nft", &["delete", "table", "inet", "backlogd_test"]);
    }
}

impl Default for Netns {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        drop(self.jobs.take());
        if let Some(t) = self.thread.take() {
            t.join().ok();
        }
    }
}
