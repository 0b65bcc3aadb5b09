//! What a listening program asks `listen()` for, when backlogd did not see it ask.
//!
//! The kernel keeps only the granted backlog (`min(request, net.core.somaxconn)` at the
//! time of the call), so for a listener that was already listening when the daemon
//! started the request is gone. Many servers ask for a figure that is fixed or set in
//! their own configuration; this table holds that knowledge as data, one row per program,
//! identified by what the kernel and /proc say about the owning process (its executable,
//! its comm, the Go build info in its ELF file), never by port. `docs/programs.md` is the
//! same table for people; `tests.rs` has a test per row.

mod asks;
mod config;
mod process;
#[cfg(test)]
mod tests;

use serde::{Deserialize, Serialize};

pub use asks::Asks;
pub use process::Process;

/// One row of the table.
#[derive(Debug)]
pub struct Program {
    /// Stable identifier, served in the JSON API (`nginx`, `go`, ...).
    pub id: &'static str,
    /// Executable file names (or comms) that identify it.
    pub names: &'static [&'static str],
    /// Recognises it from more than its name (an interpreter's command line, a build-info
    /// section), after `names`.
    pub recognise: Option<fn(&Process) -> bool>,
    /// What it asks for when its configuration says nothing.
    pub default: Asks,
    /// Where its own setting lives, in its own terms (for remedies).
    pub knob: &'static str,
    /// Reads the figure its configuration sets for a listener on a port.
    pub configured: Option<Reader>,
    /// What makes it call `listen()` again, where that is not simply "restart COMM" (or
    /// where a reload looks like it would but does not).
    pub relisten: Option<&'static str>,
}

/// Reads what a program's configuration makes it ask for on a port, with where it was
/// found (`file:line: text`, or the command line); None when the configuration does not
/// set it (or cannot be read).
pub type Reader = fn(&Process, u16) -> Option<(Asks, String)>;

/// The table. The first row that recognises a process is its program: rows that
/// recognise a server by its interpreter's command line (gunicorn, Tomcat, Jetty, Netty)
/// come before the interpreter's own row (python, java).
pub static PROGRAMS: &[Program] = &[
    Program {
        id: "nginx",
        names: &["nginx"],
        recognise: None,
        // NGX_LISTEN_BACKLOG on Linux.
        default: Asks::Backlog(511),
        knob: "`backlog=N` on the `listen` directive in nginx.conf",
        configured: Some(config::nginx),
        // ngx_init_cycle keeps an inherited socket and calls listen() again only when
        // the backlog= it is configured with changed.
        relisten: Some(
            "restart nginx (a reload keeps the listening socket, and calls listen() on it \
             again only when the `listen` directive's backlog= changed)",
        ),
    },
    Program {
        id: "redis",
        names: &["redis-server", "redis-sentinel"],
        recognise: None,
        default: Asks::Backlog(511),
        knob: "`tcp-backlog N` in redis.conf",
        configured: Some(config::redis),
        relisten: None,
    },
    Program {
        id: "apache",
        names: &["apache2", "httpd"],
        recognise: None,
        // DEFAULT_LISTENBACKLOG.
        default: Asks::Backlog(511),
        knob: "`ListenBacklog N` in apache2.conf (httpd.conf)",
        configured: Some(config::apache),
        relisten: None,
    },
    Program {
        id: "haproxy",
        names: &["haproxy"],
        recognise: None,
        // The bind line's `backlog`, else the frontend's, else its maxconn.
        default: Asks::Configured,
        knob: "`backlog N` in the frontend (or on its `bind` line) in haproxy.cfg",
        configured: Some(config::haproxy),
        relisten: None,
    },
    Program {
        id: "memcached",
        names: &["memcached"],
        recognise: None,
        default: Asks::Backlog(1024),
        knob: "`-b N` (`--listen-backlog=N`) on memcached's command line \
               (/etc/memcached.conf on Debian)",
        configured: Some(config::memcached),
        relisten: None,
    },
    Program {
        id: "nodejs",
        names: &["node", "nodejs"],
        recognise: None,
        default: Asks::Backlog(511),
        knob: "the `backlog` argument of `server.listen()`",
        configured: None,
        relisten: None,
    },
    Program {
        id: "sshd",
        names: &["sshd"],
        recognise: None,
        // SSH_LISTEN_BACKLOG, compiled in.
        default: Asks::Backlog(128),
        knob: "none (OpenSSH compiles its backlog in)",
        configured: None,
        relisten: None,
    },
    Program {
        id: "systemd",
        names: &["systemd"],
        recognise: None,
        // A .socket unit without Backlog= asks for the most the kernel allows.
        default: Asks::Somaxconn,
        knob: "`Backlog=` in the .socket unit",
        configured: Some(config::systemd),
        relisten: Some(
            "systemd holds the socket, not the service: stop the service and its .socket \
             unit, then start the .socket unit (`systemctl restart NAME.socket` once the \
             service is stopped)",
        ),
    },
    Program {
        id: "mariadb",
        // mysqld is a link to mariadbd since 10.5: /proc/PID/exe says mariadbd. A
        // process whose executable is mysqld is MySQL (or an older MariaDB), not this row.
        names: &["mariadbd"],
        recognise: None,
        // back_log unset: min(900, 50 + max_connections / 5), max_connections 151.
        default: Asks::Backlog(80),
        knob: "`back_log` in the [mysqld] (or [mariadbd]) group of my.cnf, \
               `--back-log=N` on the command line; unset, it is \
               min(900, 50 + max_connections/5)",
        configured: Some(config::mariadb),
        relisten: None,
    },
    Program {
        id: "postgres",
        names: &["postgres", "postmaster"],
        recognise: None,
        // 2 * MaxBackends with PostgreSQL 15's defaults (see config::postgres).
        default: Asks::Backlog(244),
        knob: "max_connections in postgresql.conf (the postmaster asks listen() for twice \
               max_connections + autovacuum_max_workers + 1 + max_worker_processes + \
               max_wal_senders, at most 10000)",
        configured: Some(config::postgres),
        relisten: None,
    },
    Program {
        id: "php-fpm",
        names: &["php-fpm"],
        recognise: Some(process::is_php_fpm),
        // FPM_BACKLOG_DEFAULT is -1 on Linux (8.2's fpm_sockets.h): listen(fd, -1) gets
        // net.core.somaxconn. (www.conf's comment still says 511.)
        default: Asks::Somaxconn,
        knob: "`listen.backlog` in the pool's section of its pool file \
               (/etc/php/X.Y/fpm/pool.d/*.conf)",
        configured: Some(config::php_fpm),
        relisten: None,
    },
    Program {
        id: "gunicorn",
        names: &["gunicorn"],
        recognise: Some(process::is_gunicorn),
        default: Asks::Backlog(2048),
        knob: "`--backlog N` on gunicorn's command line, or `backlog = N` in its \
               configuration file (-c, else ./gunicorn.conf.py)",
        configured: Some(config::gunicorn),
        relisten: None,
    },
    Program {
        id: "python",
        names: &[],
        recognise: Some(process::is_python),
        // Whatever the code passes: see the knob. `python -m http.server` is read.
        default: Asks::Configured,
        knob: "the backlog its code passes to listen() (if the code sets none: \
               socket.listen() asks for 128, socketserver's request_queue_size is 5, \
               asyncio's create_server 100)",
        configured: Some(config::python),
        relisten: None,
    },
    Program {
        id: "tomcat",
        names: &[],
        recognise: Some(process::is_tomcat),
        // AbstractEndpoint's acceptCount (10.1), which NioEndpoint.bind passes to bind().
        default: Asks::Backlog(100),
        knob: "`acceptCount` on the `<Connector>` in Tomcat's conf/server.xml",
        configured: Some(config::tomcat),
        relisten: None,
    },
    Program {
        id: "jetty",
        names: &[],
        recognise: Some(process::is_jetty),
        // ServerConnector's _acceptQueueSize is 0, and the JDK's bind() makes 0 its 50.
        default: Asks::Backlog(50),
        knob: "`jetty.http.acceptQueueSize=N` in the jetty.base's start.d/http.ini (or its \
               start.ini, or on start.jar's command line; `jetty.ssl.acceptQueueSize` for \
               the https connector); unset or 0, a ServerConnector asks for the JDK's 50",
        configured: Some(config::jetty),
        relisten: None,
    },
    Program {
        id: "netty",
        names: &[],
        recognise: Some(process::is_netty),
        // NetUtil.SOMAXCONN: /proc/sys/net/core/somaxconn, read once at class load.
        default: Asks::CodeSomaxconn,
        knob: "`.option(ChannelOption.SO_BACKLOG, N)` on the ServerBootstrap in its code; \
               without it Netty asks for net.core.somaxconn as it was when the JVM loaded \
               Netty",
        configured: Some(config::netty),
        relisten: Some(
            "restart the JVM (Netty reads net.core.somaxconn once, when it loads: a new \
             bind() in the same JVM asks for the old figure)",
        ),
    },
    Program {
        id: "java",
        names: &["java"],
        recognise: None,
        // java.net.ServerSocket (and ServerSocketChannel.bind) without a backlog: 50.
        default: Asks::CodeDefault(50),
        knob: "the backlog its code passes (ServerSocket(port, backlog), \
               ServerSocketChannel.bind(addr, backlog)); without one a JVM asks for 50. A \
               server embedded in it sets its own: Tomcat's acceptCount (100), Jetty's \
               acceptQueueSize (0: 50), Netty's SO_BACKLOG (net.core.somaxconn); started \
               from their distributions they are rows of their own",
        configured: None,
        relisten: None,
    },
    Program {
        id: "go",
        // Recognised by its build info, whatever the file is called.
        names: &[],
        recognise: Some(Process::is_go),
        // Go's net package reads net.core.somaxconn and asks for that.
        default: Asks::Somaxconn,
        knob: "the listener's own code (Go's net package asks for net.core.somaxconn)",
        configured: None,
        relisten: None,
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
        Some(found) => found,
        None => match row.default {
            Asks::CodeDefault(_) | Asks::CodeSomaxconn => (
                row.default,
                format!("{}'s default, if its code passes no backlog", row.id),
            ),
            _ => (row.default, format!("{}'s default", row.id)),
        },
    };
    Some(Known {
        program: row.id.to_owned(),
        asks,
        source,
    })
}

fn row_of(process: &Process) -> Option<&'static Program> {
    let exe = process.exe_name();
    let named = |p: &Program| {
        p.names
            .iter()
            .any(|n| exe.as_deref() == Some(*n) || process.comm == *n)
    };
    PROGRAMS
        .iter()
        .find(|p| named(p) || p.recognise.is_some_and(|r| r(process)))
}
