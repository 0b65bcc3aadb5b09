//! What a listening program asks `listen()` for, when backlogd did not see it ask.
//!
//! The kernel keeps only the granted backlog (`min(request, net.core.somaxconn)` at the
//! time of the call), so for a listener that was already listening when the daemon
//! started the request is gone. Many servers ask for a figure that is fixed or set in
//! their own configuration; this table holds that knowledge as data, one row per program,
//! identified by what the kernel and /proc say about the owning process (its executable,
//! its comm, the Go build info in its ELF file), never by port. `docs/programs.md` is the
//! same table for people; `tests.rs` has a test per row.

mod config;
mod process;
#[cfg(test)]
mod tests;

use serde::{Deserialize, Serialize};

pub use process::Process;

/// What a program passes to `listen()`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Asks {
    /// The namespace's `net.core.somaxconn` itself (read from /proc, or "as many as the
    /// kernel allows"): never cut by it.
    Somaxconn,
    /// A fixed figure.
    Backlog(u32),
    /// A figure from its configuration that backlogd could not read.
    Configured,
}

/// One row of the table.
#[derive(Debug)]
pub struct Program {
    /// Stable identifier, served in the JSON API (`nginx`, `go`, ...).
    pub id: &'static str,
    /// Executable file names (or comms) that identify it.
    pub names: &'static [&'static str],
    /// What it asks for when its configuration says nothing.
    pub default: Asks,
    /// Where its own setting lives, in its own terms (for remedies).
    pub knob: &'static str,
    /// Reads the figure its configuration sets for a listener on a port.
    pub configured: Option<Reader>,
}

/// Reads the backlog a program's configuration sets for its listener on a port, with
/// where it was found (`file:line: text`, or the command line); None when the
/// configuration does not set it (or cannot be read).
pub type Reader = fn(&Process, u16) -> Option<(u32, String)>;

/// The table. The order matters only where names overlap (none do).
pub static PROGRAMS: &[Program] = &[
    Program {
        id: "nginx",
        names: &["nginx"],
        // NGX_LISTEN_BACKLOG on Linux.
        default: Asks::Backlog(511),
        knob: "`backlog=N` on the `listen` directive in nginx.conf",
        configured: Some(config::nginx),
    },
    Program {
        id: "redis",
        names: &["redis-server", "redis-sentinel"],
        default: Asks::Backlog(511),
        knob: "`tcp-backlog N` in redis.conf",
        configured: Some(config::redis),
    },
    Program {
        id: "apache",
        names: &["apache2", "httpd"],
        // DEFAULT_LISTENBACKLOG.
        default: Asks::Backlog(511),
        knob: "`ListenBacklog N` in apache2.conf (httpd.conf)",
        configured: Some(config::apache),
    },
    Program {
        id: "haproxy",
        names: &["haproxy"],
        // The bind line's `backlog`, else the frontend's, else its maxconn.
        default: Asks::Configured,
        knob: "`backlog N` in the frontend (or on its `bind` line) in haproxy.cfg",
        configured: Some(config::haproxy),
    },
    Program {
        id: "memcached",
        names: &["memcached"],
        default: Asks::Backlog(1024),
        knob: "`-b N` (`--listen-backlog=N`) on memcached's command line \
               (/etc/memcached.conf on Debian)",
        configured: Some(config::memcached),
    },
    Program {
        id: "nodejs",
        names: &["node", "nodejs"],
        default: Asks::Backlog(511),
        knob: "the `backlog` argument of `server.listen()`",
        configured: None,
    },
    Program {
        id: "sshd",
        names: &["sshd"],
        // SSH_LISTEN_BACKLOG, compiled in.
        default: Asks::Backlog(128),
        knob: "none (OpenSSH compiles its backlog in)",
        configured: None,
    },
    Program {
        id: "systemd",
        names: &["systemd"],
        // A .socket unit without Backlog= asks for the most the kernel allows.
        default: Asks::Somaxconn,
        knob: "`Backlog=` in the .socket unit",
        configured: Some(config::systemd),
    },
    Program {
        id: "go",
        // Recognised by its build info, whatever the file is called.
        names: &[],
        // Go's net package reads net.core.somaxconn and asks for that.
        default: Asks::Somaxconn,
        knob: "the listener's own code (Go's net package asks for net.core.somaxconn)",
        configured: None,
    },
];

/// The row with identifier `id`.
pub fn by_id(id: &str) -> Option<&'static Program> {
    PROGRAMS.iter().find(|p| p.id == id)
}

/// What backlogd knows a listener's program asks for, served with the listener.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Known {
    /// The table's identifier (see [`PROGRAMS`]).
    pub program: String,
    pub asks: Asks,
    /// Where the figure comes from: a configuration file and line, the command line, or
    /// the program's default.
    pub source: String,
}

/// The program of `process`, and what it asks for on `port`.
pub fn identify(process: &Process, port: u16) -> Option<Known> {
    let row = row_of(process)?;
    let (asks, source) = match row.configured.and_then(|read| read(process, port)) {
        Some((backlog, source)) => (Asks::Backlog(backlog), source),
        None => (row.default, format!("{}'s default", row.id)),
    };
    Some(Known {
        program: row.id.to_owned(),
        asks,
        source,
    })
}

fn row_of(process: &Process) -> Option<&'static Program> {
    let exe = process.exe_name();
    PROGRAMS
        .iter()
        .find(|p| {
            p.names
                .iter()
                .any(|n| exe.as_deref() == Some(*n) || process.comm == *n)
        })
        .or_else(|| process.is_go().then(|| by_id("go")).flatten())
}
