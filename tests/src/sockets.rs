//! Listening sockets made with explicit backlogs, and the kernel's view of them.

use std::{
    net::SocketAddr,
    os::{fd::AsRawFd as _, unix::fs::MetadataExt as _},
};

use socket2::{Domain, Socket, Type};

use crate::Netns;

/// A TCP listener created inside a namespace.
pub struct Listener {
    pub socket: Socket,
    pub addr: SocketAddr,
    /// Socket inode, as `ss -e` and backlogd's `socket` label show it.
    pub inode: u64,
}

impl Listener {
    /// `socket(); bind(addr); listen(backlog)` inside `ns`.
    pub fn open(ns: &Netns, addr: &str, backlog: i32) -> Self {
        let addr: SocketAddr = addr.parse().expect("socket address");
        let socket = ns.run(move || {
            let s = Socket::new(Domain::for_address(addr), Type::STREAM, None).expect("socket()");
            s.bind(&addr.into())
                .unwrap_or_else(|e| panic!("bind {addr}: {e}"));
            s.listen(backlog).expect("listen()");
            s
        });
        let addr = socket
            .local_addr()
            .expect("local_addr")
            .as_socket()
            .expect("inet socket");
        let inode = std::fs::metadata(format!("/proc/self/fd/{}", socket.as_raw_fd()))
            .expect("stat socket fd")
            .ino();
        Self {
            socket,
            addr,
            inode,
        }
    }

    /// `listen()` again with another backlog.
    pub fn relisten(&self, backlog: i32) {
        self.socket.listen(backlog).expect("listen() again");
    }
}

/// The kernel's view of one listener through sock_diag: `ss -ltn` prints Recv-Q
/// (`sk_ack_backlog`) and Send-Q (`sk_max_ack_backlog`) for LISTEN sockets.
#[derive(Debug, PartialEq, Eq)]
pub struct KernelQueue {
    pub recv_q: u64,
    pub send_q: u64,
}

pub fn kernel_queue(ns: &Netns, listener: &Listener) -> KernelQueue {
    let out = ns.command(
        "ss",
        &["-ltnHe", &format!("sport = :{}", listener.addr.port())],
    );
    let wanted = format!("ino:{}", listener.inode);
    let line = out
        .lines()
        .find(|l| l.split_whitespace().any(|w| w == wanted))
        .unwrap_or_else(|| panic!("ss shows no socket with {wanted}:\n{out}"));
    let cols: Vec<&str> = line.split_whitespace().collect();
    KernelQueue {
        recv_q: cols[1].parse().expect("Recv-Q"),
        send_q: cols[2].parse().expect("Send-Q"),
    }
}
