//! Day one on a running host: servers from Debian packages, each started BEFORE `backlogd
//! run` in its own namespace at a net.core.somaxconn below what it asks for (128; 64 for
//! sshd, which asks for 128), so backlogd never sees them call listen(). doctor must still
//! name each listener, its program, the backlog that program asks for, the program's own
//! setting and the sysctl; a Go server (Go asks for somaxconn itself) gets no clamp
//! finding; `top --once` and the JSON API say what is known. For the programs whose figure
//! is compiled in (Node.js, sshd), the kernel itself shows what they ask for. A second test
//! does the same for MariaDB, PostgreSQL, PHP-FPM, gunicorn, Python and a JVM, whose
//! figures are derived from their configuration (or are a runtime's default), then raises
//! somaxconn under three of them: doctor says each must call listen() again, and after a
//! restart the kernel grants the derived figures. A third runs Debian's Tomcat and Jetty
//! from base directories of their own and a Netty server compiled here, all at once (a
//! JVM takes a second or more to listen), and does the same: the kernel shows Tomcat's
//! and Jetty's defaults at a somaxconn above them, and Netty's somaxconn read at start.

use std::{
    os::unix::process::CommandExt as _,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use backlogd_tests::{
    Daemon, Netns,
    doctor::{Doctor, evidence, kinds, set},
    sockets::{Listener, connect_burst, fill_accept_queue, kernel_queue},
    tempdir::TempDir,
    tools,
    top::Top,
};

/// A server process (and whatever it forks: one process group) in its own namespace.
struct Server {
    child: Child,
    ns: Netns,
    /// The namespace's net.core.somaxconn when the server called listen().
    somaxconn: u32,
    port: u16,
    program: String,
    args: Vec<String>,
    dir: TempDir,
}

impl Server {
    /// Starts `program args` in a new namespace at somaxconn 128 and waits until it
    /// listens on 127.0.0.1:`port`.
    fn start(port: u16, program: &str, args: &[String], dir: TempDir) -> Self {
        Self::start_at(128, port, program, args, dir)
    }

    /// [`Server::start`] in a namespace at net.core.somaxconn `somaxconn`.
    fn start_at(somaxconn: u32, port: u16, program: &str, args: &[String], dir: TempDir) -> Self {
        let ns = Netns::new();
        ns.sysctl("net.core.somaxconn", &somaxconn.to_string());
        let child = Self::spawn(&ns, program, args, &dir);
        let server = Self {
            child,
            ns,
            somaxconn,
            port,
            program: program.to_owned(),
            args: args.to_vec(),
            dir,
        };
        server.wait_listening();
        server
    }

    fn spawn(ns: &Netns, program: &str, args: &[String], dir: &TempDir) -> Child {
        let (program, args) = (program.to_owned(), args.to_vec());
        let log = dir.path().join("stderr.log");
        ns.run(move || {
            Command::new(&program)
                .args(&args)
                // The server and its workers in one new process group, so Drop ends all.
                .process_group(0)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).expect("server log"))
                .spawn()
                .unwrap_or_else(|e| panic!("starting {program}: {e}"))
        })
    }

    /// Stops it and starts it again in the same namespace: it calls listen() anew.
    fn restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.listening() {
            assert!(
                Instant::now() < deadline,
                "{} still listening",
                self.program
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        self.child = Self::spawn(&self.ns, &self.program, &self.args, &self.dir);
        self.wait_listening();
    }

    fn kill(&mut self) {
        // SAFETY: kill(2) on our own child's process group.
        unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
        self.child.wait().ok();
    }

    fn wait_listening(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.listening() {
            // A server that exited says why in its log.
            assert!(
                Instant::now() < deadline,
                "{} not listening on {} within 20 s: {}",
                self.program,
                self.port,
                std::fs::read_to_string(self.dir.path().join("stderr.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn listening(&self) -> bool {
        self.granted().is_some()
    }

    /// The backlog the kernel granted its listener (`ss` Send-Q of a LISTEN socket:
    /// `sk_max_ack_backlog`), once it listens.
    fn granted(&self) -> Option<u32> {
        self.granted_on(self.port)
    }

    /// [`Server::granted`] for another of its ports.
    fn granted_on(&self, port: u16) -> Option<u32> {
        let out = self
            .ns
            .command("ss", &["-Hltn", &format!("sport = :{port}")]);
        out.split_whitespace().nth(2)?.parse().ok()
    }
}

/// Something [`at_once`] runs.
type Start<'a, T> = Box<dyn FnOnce() -> T + Send + 'a>;

/// Runs `starts` at once, each on a thread of its own, and returns what they return in
/// their order: a JVM takes a second or more to listen, and servers in namespaces of
/// their own need not wait for each other. A panic in one is raised here, as it was.
fn at_once<'a, T: Send + 'a, const N: usize>(starts: [Start<'a, T>; N]) -> Vec<T> {
    std::thread::scope(|s| {
        let running: Vec<_> = starts.into_iter().map(|f| s.spawn(f)).collect();
        running
            .into_iter()
            .map(|r| {
                r.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    })
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

fn nginx(port: u16) -> Server {
    let dir = TempDir::new(&format!("dayone-nginx-{port}"));
    let d = dir.path().display().to_string();
    let conf = dir.write(
        "nginx.conf",
        &format!(
            "worker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/error.log;\n\
             events {{ worker_connections 64; }}\n\
             http {{\n  access_log off;\n  client_body_temp_path {d}; proxy_temp_path {d};\n  \
             fastcgi_temp_path {d}; uwsgi_temp_path {d}; scgi_temp_path {d};\n  \
             server {{ listen 127.0.0.1:{port} backlog=511; return 200; }}\n}}\n"
        ),
    );
    let args = [
        "-c".to_owned(),
        conf.display().to_string(),
        "-g".to_owned(),
        "daemon off;".to_owned(),
    ];
    Server::start(port, "nginx", &args, dir)
}

fn redis(port: u16) -> Server {
    let dir = TempDir::new(&format!("dayone-redis-{port}"));
    let conf = dir.write(
        "redis.conf",
        &format!(
            "bind 127.0.0.1\nport {port}\ntcp-backlog 511\ndaemonize no\nsave \"\"\n\
             appendonly no\ndir {}\n",
            dir.path().display()
        ),
    );
    Server::start(port, "redis-server", &[conf.display().to_string()], dir)
}

fn apache(port: u16) -> Server {
    let dir = TempDir::new(&format!("dayone-apache-{port}"));
    let d = dir.path().display().to_string();
    let conf = dir.write(
        "apache2.conf",
        &format!(
            "ServerName localhost\nDefaultRuntimeDir {d}\nPidFile {d}/apache2.pid\n\
             ErrorLog {d}/error.log\nMutex file:{d} default\n\
             LoadModule mpm_event_module /usr/lib/apache2/modules/mod_mpm_event.so\n\
             LoadModule authz_core_module /usr/lib/apache2/modules/mod_authz_core.so\n\
             User www-data\nGroup www-data\nDocumentRoot {d}\n\
             Listen 127.0.0.1:{port}\nListenBacklog 511\n"
        ),
    );
    let args = [
        "-f".to_owned(),
        conf.display().to_string(),
        "-DFOREGROUND".to_owned(),
    ];
    Server::start(port, "/usr/sbin/apache2", &args, dir)
}

fn haproxy(port: u16) -> Server {
    let dir = TempDir::new(&format!("dayone-haproxy-{port}"));
    let conf = dir.write(
        "haproxy.cfg",
        &format!(
            "global\n  maxconn 4000\n\
             defaults\n  mode tcp\n  timeout connect 1s\n  timeout client 1s\n  \
             timeout server 1s\n\
             frontend fe\n  bind 127.0.0.1:{port}\n  backlog 1000\n  default_backend be\n\
             backend be\n  server s1 127.0.0.1:9\n"
        ),
    );
    let args = [
        "-db".to_owned(),
        "-f".to_owned(),
        conf.display().to_string(),
    ];
    Server::start(port, "haproxy", &args, dir)
}

fn memcached(port: u16) -> Server {
    let dir = TempDir::new(&format!("dayone-memcached-{port}"));
    let args = [
        "-u",
        "nobody",
        "-l",
        "127.0.0.1",
        "-p",
        &port.to_string(),
        "-U",
        "0",
        "-b",
        "1024",
    ]
    .map(str::to_owned);
    Server::start(port, "memcached", &args, dir)
}

/// Node.js listening with `server.listen(port, host)`: no backlog argument, so Node's
/// own default.
fn node(somaxconn: u32, port: u16) -> Server {
    let dir = TempDir::new(&format!("dayone-node-{port}"));
    let script = dir.write(
        "listen.js",
        &format!("require('net').createServer((c) => c.destroy()).listen({port}, '127.0.0.1');\n"),
    );
    Server::start_at(
        somaxconn,
        port,
        "node",
        &[script.display().to_string()],
        dir,
    )
}

/// OpenSSH's sshd in the foreground, on `port` of the test's own namespace's loopback
/// (never the host's port 22: the namespace is the test's), with a host key of its own and
/// no PAM; killed with its process group when the test ends.
fn sshd(somaxconn: u32, port: u16) -> Server {
    let dir = TempDir::new(&format!("dayone-sshd-{port}"));
    let d = dir.path().display().to_string();
    let key = format!("{d}/host_key");
    let out = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f", &key])
        .output()
        .expect("ssh-keygen (openssh-client, a dependency of openssh-server)");
    assert!(out.status.success(), "ssh-keygen: {out:?}");
    // sshd's privilege-separation directory, compiled in; the package's unit creates it
    // (RuntimeDirectory=sshd), and no unit ran here.
    std::fs::create_dir_all("/run/sshd").expect("creating /run/sshd");
    let conf = dir.write(
        "sshd_config",
        &format!(
            "ListenAddress 127.0.0.1:{port}\nHostKey {key}\nPidFile {d}/sshd.pid\n\
             UsePAM no\n"
        ),
    );
    // An absolute path: sshd re-executes itself and refuses a relative one.
    let args = ["-D", "-e", "-f", &conf.display().to_string()].map(str::to_owned);
    Server::start_at(somaxconn, port, "/usr/sbin/sshd", &args, dir)
}

/// The Go toolchain: `go` on PATH, else the usual /usr/local/go.
fn go() -> String {
    if Command::new("go").arg("version").output().is_ok() {
        "go".to_owned()
    } else {
        "/usr/local/go/bin/go".to_owned()
    }
}

/// A Go server that only listens (Go's net package passes net.core.somaxconn), built here.
fn go_server(port: u16) -> Server {
    let dir = TempDir::new(&format!("dayone-go-{port}"));
    let src = dir.write(
        "main.go",
        "package main\n\nimport (\n\t\"net\"\n\t\"os\"\n)\n\n\
         func main() {\n\tl, err := net.Listen(\"tcp\", os.Args[1])\n\tif err != nil {\n\t\t\
         panic(err)\n\t}\n\tfor {\n\t\tif c, err := l.Accept(); err == nil {\n\t\t\tc.Close()\n\t\t}\n\t}\n}\n",
    );
    let exe = dir.path().join("listen-only");
    let cache = |sub: &str| -> PathBuf { dir.path().join(sub) };
    let out = Command::new(go())
        .args(["build", "-o"])
        .arg(&exe)
        .arg(&src)
        .env("GOCACHE", cache("gocache"))
        .env("GOPATH", cache("gopath"))
        .env("HOME", dir.path())
        .env("GOFLAGS", "-mod=mod")
        .env("GOTOOLCHAIN", "local")
        .output()
        .expect("go build");
    assert!(
        out.status.success(),
        "go build: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let exe = exe.display().to_string();
    Server::start(port, &exe, &[format!("127.0.0.1:{port}")], dir)
}

fn require(test: &str, tools: &[(&str, &[&str], &str)]) -> bool {
    tools
        .iter()
        .all(|(program, probe, package)| tools::available(test, program, probe, package))
}

/// The listener of `server` in the daemon's snapshot, if the daemon has it.
fn try_snapshot_of(daemon: &Daemon, server: &Server) -> Option<serde_json::Value> {
    listener_at(daemon, &server.ns, server.port)
}

/// The listener on `port` in `ns` in the daemon's snapshot, if the daemon has it.
fn listener_at(daemon: &Daemon, ns: &Netns, port: u16) -> Option<serde_json::Value> {
    let (status, body) = daemon.get("/api/v1/snapshot");
    assert_eq!(status, 200, "{body}");
    let snapshot: serde_json::Value = serde_json::from_str(&body).expect("snapshot JSON");
    snapshot["listeners"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| {
            l["netns"].as_u64() == Some(ns.inode()) && l["port"].as_u64() == Some(u64::from(port))
        })
        .cloned()
}

fn snapshot_of(daemon: &Daemon, server: &Server) -> serde_json::Value {
    try_snapshot_of(daemon, server).unwrap_or_else(|| {
        panic!(
            "no listener on {} in netns {}",
            server.port,
            server.ns.inode()
        )
    })
}

#[test]
fn servers_started_before_the_daemon_get_their_programs_request_knob_and_sysctl() {
    let test = "servers_started_before_the_daemon_get_their_programs_request_knob_and_sysctl";
    if !require(
        test,
        &[
            ("nginx", &["-v"], "nginx-light"),
            ("redis-server", &["--version"], "redis-server"),
            ("/usr/sbin/apache2", &["-v"], "apache2"),
            ("haproxy", &["-v"], "haproxy"),
            ("memcached", &["-h"], "memcached"),
            ("node", &["--version"], "nodejs"),
            ("/usr/sbin/sshd", &["-V"], "openssh-server"),
            (&go(), &["version"], "golang-go"),
        ],
    ) {
        return;
    }
    // What the two programs whose figure is compiled in ask for, from the kernel: in a
    // namespace whose somaxconn (4096) is above it, the backlog granted is the one asked.
    for (server, program, asks) in [
        (node(4096, 18185), "nodejs", 511),
        (sshd(4096, 10122), "sshd", 128),
    ] {
        assert_eq!(
            server.granted(),
            Some(asks),
            "{program} at somaxconn 4096: the kernel granted what it asked for (ss Send-Q)"
        );
    }
    // (server, program id, what it asks for, a fragment of its own setting's name)
    let mut servers: Vec<(Server, &str, u32, &str)> = vec![
        (
            nginx(18080),
            "nginx",
            511,
            "`backlog=N` on the `listen` directive",
        ),
        (redis(16379), "redis", 511, "`tcp-backlog N` in redis.conf"),
        (apache(18082), "apache", 511, "`ListenBacklog N`"),
        (
            haproxy(18083),
            "haproxy",
            1000,
            "`backlog N` in the frontend",
        ),
        (memcached(11211), "memcached", 1024, "`-b N`"),
        (
            node(128, 18085),
            "nodejs",
            511,
            "the `backlog` argument of `server.listen()`",
        ),
        // sshd asks for 128: a namespace at 64 clamps it.
        (
            sshd(64, 10022),
            "sshd",
            128,
            "none (OpenSSH compiles its backlog in)",
        ),
    ];
    let go = go_server(18084);
    let daemon = Daemon::start();
    let doctor = Doctor::run(&daemon, &["--fail-on", "critical"]);
    for (server, program, asks, knob) in &servers {
        let found = doctor.about(&server.ns);
        assert_eq!(
            kinds(&found),
            set(&["backlog_clamped"]),
            "{program}: {found:#?}"
        );
        let f = found[0];
        let summary = f["summary"].as_str().unwrap();
        assert!(
            summary.ends_with(&format!(
                "asks for backlog {asks} on 127.0.0.1:{}, the kernel granted {}",
                server.port, server.somaxconn
            )),
            "{program}: {summary}"
        );
        let ev = evidence(f);
        assert!(ev.contains(&format!("{program} asks for {asks}: ")), "{ev}");
        assert!(
            ev.contains(&format!("net.core.somaxconn = {}", server.somaxconn)),
            "{ev}"
        );
        let remedy = f["remedy"].as_str().unwrap();
        assert!(
            remedy.contains(&format!("net.core.somaxconn={asks}")),
            "{remedy}"
        );
        assert!(remedy.contains(knob), "{program}: {remedy}");
        // The JSON API carries the same knowledge.
        let l = snapshot_of(&daemon, server);
        assert_eq!(l["requested"], serde_json::Value::Null, "{l}");
        assert_eq!(l["request"]["known"], "program", "{l}");
        assert_eq!(l["request"]["program"], *program, "{l}");
        assert_eq!(l["request"]["backlog"], *asks, "{l}");
    }
    // Where the figure came from, for the two read from files.
    let nginx_ev = evidence(doctor.about(&servers[0].0.ns)[0]);
    assert!(nginx_ev.contains("nginx.conf:"), "{nginx_ev}");
    assert!(nginx_ev.contains("backlog=511"), "{nginx_ev}");
    let haproxy_ev = evidence(doctor.about(&servers[3].0.ns)[0]);
    assert!(haproxy_ev.contains("haproxy.cfg:"), "{haproxy_ev}");
    // Go asks for somaxconn itself: nothing to say.
    assert_eq!(
        kinds(&doctor.about(&go.ns)),
        set(&[]),
        "{:#?}",
        doctor.about(&go.ns)
    );
    let l = snapshot_of(&daemon, &go);
    assert_eq!(l["request"]["known"], "somaxconn", "{l}");
    assert_eq!(l["request"]["program"], "go", "{l}");
    // nginx restarted while backlogd runs: its listen() is seen, the finding is exact.
    let nginx = &mut servers[0].0;
    nginx.restart();
    let deadline = Instant::now() + Duration::from_secs(10);
    while try_snapshot_of(&daemon, nginx).is_none_or(|l| l["request"]["known"] != "seen") {
        assert!(
            Instant::now() < deadline,
            "nginx's new listen() not seen within 10 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let after = Doctor::run(&daemon, &[]);
    let found = after.about(&nginx.ns);
    assert_eq!(kinds(&found), set(&["backlog_clamped"]), "{found:#?}");
    let ev = evidence(found[0]);
    assert!(
        ev.contains("listen() backlog 511, sk_max_ack_backlog 128"),
        "{ev}"
    );
    let l = snapshot_of(&daemon, nginx);
    assert_eq!(l["requested"], 511, "{l}");
    assert_eq!(l["request"]["known"], "seen", "{l}");
    // top shows the figure the program asks for, marked as not seen.
    let top = Top::once(&daemon);
    let row = |port: u16| top.row(format!("127.0.0.1:{port}")).to_owned();
    assert!(row(18082).contains(" 511*/128!"), "{}", row(18082));
    assert!(row(18080).contains(" 511/128!"), "{}", row(18080));
    assert!(row(18084).contains(" =max/128 "), "{}", row(18084));
}

#[test]
fn a_queue_that_filled_before_the_daemon_started_shows_from_the_first_scrape() {
    // The classic incident, already under way: the application stopped accepting, its
    // queue (backlog 8) is full, new clients' SYNs are dropped.
    let ns = Netns::new();
    let l = Listener::open(&ns, "127.0.0.1:0", 8);
    let _queued = fill_accept_queue(&ns, &l, l.addr, 9);
    let _early = connect_burst(&ns, l.addr, 5);
    let before = kernel_queue(&ns, &l);
    assert_eq!((before.recv_q, before.send_q), (9, 8), "the queue is full");
    let daemon = Daemon::start();
    let inode = l.inode.to_string();
    let socket = [("socket", inode.as_str())];
    let scrape = daemon.scrape();
    let figure = |name: &str| {
        scrape
            .value(name, &socket)
            .unwrap_or_else(|| panic!("no {name} for socket {inode}:\n{}", scrape.text))
    };
    assert_eq!(figure("backlogd_listen_accept_queue_length"), 9.0);
    assert_eq!(figure("backlogd_listen_accept_queue_max_length"), 9.0);
    // More clients while nobody accepts: each SYN is dropped and changes nothing, and
    // the figures stay the kernel's.
    let drops_before = daemon
        .scrape()
        .value(
            "backlogd_listen_drops_total",
            &[("socket", &inode), ("reason", "accept_queue_full")],
        )
        .unwrap_or(0.0);
    let _late = connect_burst(&ns, l.addr, 4);
    let dropped = daemon.wait_for("4 more accept-queue drops", |s| {
        let n = s.value(
            "backlogd_listen_drops_total",
            &[("socket", &inode), ("reason", "accept_queue_full")],
        )?;
        (n >= drops_before + 4.0).then_some(n)
    });
    let now = kernel_queue(&ns, &l);
    let scrape = daemon.scrape();
    assert_eq!(
        scrape.value("backlogd_listen_accept_queue_length", &socket),
        Some(now.recv_q as f64),
        "ss: {now:?}"
    );
    assert_eq!(
        scrape.value("backlogd_listen_accept_queue_max_length", &socket),
        Some(9.0)
    );
    // doctor quotes the same queue as its drop evidence.
    let doctor = Doctor::run(&daemon, &[]);
    let found = doctor.about(&ns);
    let overflow = found
        .iter()
        .find(|f| f["kind"] == "accept_queue_overflow")
        .unwrap_or_else(|| panic!("no accept_queue_overflow: {found:#?}"));
    let ev = evidence(overflow);
    assert!(
        ev.contains(&format!(
            "{dropped} SYNs and final ACKs dropped with the accept queue full"
        )),
        "{ev}"
    );
    assert!(
        ev.contains("accept queue peak 9 of capacity 8 connections (now 9)"),
        "{ev}"
    );
}

/// Owner of `path` set to the system user `user` (mariadbd and postgres refuse to run
/// as root, and write their data directories as themselves).
fn chown_to(path: &std::path::Path, user: &str) {
    let out = Command::new("chown")
        .args(["-R", &format!("{user}:{user}")])
        .arg(path)
        .output()
        .expect("chown");
    assert!(out.status.success(), "chown {user}: {out:?}");
}

/// MariaDB from its own option file: max_connections 300 and no back_log, so it asks for
/// min(900, 50 + 300/5) = 110. An empty data directory is enough to listen (no
/// mariadb-install-db: grant tables skipped), and InnoDB is kept small.
fn mariadb(somaxconn: u32, port: u16) -> Server {
    let dir = TempDir::new(&format!("dayone-mariadb-{port}"));
    let d = dir.path().display().to_string();
    std::fs::create_dir_all(dir.path().join("data")).expect("data directory");
    let cnf = dir.write(
        "my.cnf",
        &format!(
            "[mysqld]\nuser = mysql\ndatadir = {d}/data\nsocket = {d}/mysqld.sock\n\
             pid-file = {d}/mysqld.pid\nbind-address = 127.0.0.1\nport = {port}\n\
             skip-grant-tables\ninnodb_buffer_pool_size = 8M\ninnodb_log_file_size = 4M\n\
             max_connections = 300\n"
        ),
    );
    chown_to(dir.path(), "mysql");
    let args = [format!("--defaults-file={}", cnf.display())];
    Server::start_at(somaxconn, port, "/usr/sbin/mariadbd", &args, dir)
}

/// PostgreSQL 15's postmaster as the postgres user on a fresh cluster, with
/// max_connections 20 (`-N`) and max_wal_senders 2: it asks for 2 * (20 + 3 + 1 + 8 + 2)
/// = 68.
fn postgres(somaxconn: u32, port: u16) -> Server {
    let dir = TempDir::new(&format!("dayone-postgres-{port}"));
    let d = dir.path().display().to_string();
    chown_to(dir.path(), "postgres");
    let as_postgres = ["--reuid=postgres", "--regid=postgres", "--init-groups"];
    let out = Command::new("setpriv")
        .args(as_postgres)
        .arg(format!("{POSTGRES_BIN}/initdb"))
        .args(["-D", &format!("{d}/data"), "-A", "trust", "-U", "postgres"])
        .args(["--no-sync", "--no-instructions"])
        .output()
        .expect("initdb");
    assert!(out.status.success(), "initdb: {out:?}");
    let args: Vec<String> = as_postgres
        .iter()
        .map(|a| a.to_string())
        .chain([format!("{POSTGRES_BIN}/postgres")])
        .chain(
            [
                "-D",
                &format!("{d}/data"),
                "-p",
                &port.to_string(),
                "-N",
                "20",
                "-c",
                "max_wal_senders=2",
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                &format!("unix_socket_directories={d}"),
                "-c",
                "shared_buffers=1MB",
            ]
            .map(str::to_owned),
        )
        .collect();
    Server::start_at(somaxconn, port, "setpriv", &args, dir)
}

/// Debian's PostgreSQL 15 binaries.
const POSTGRES_BIN: &str = "/usr/lib/postgresql/15/bin";

/// PHP-FPM with two pools: `plain` (127.0.0.1:`port`) sets no listen.backlog, so it asks
/// for net.core.somaxconn; `big` (`port` + 1) sets 300. Waits for `big`.
fn php_fpm(port: u16) -> Server {
    let dir = TempDir::new(&format!("dayone-php-fpm-{port}"));
    let d = dir.path().display().to_string();
    std::fs::create_dir_all(dir.path().join("pool.d")).expect("pool.d");
    dir.write(
        "pool.d/pools.conf",
        &format!(
            "[plain]\nlisten = 127.0.0.1:{port}\npm = static\npm.max_children = 1\n\
             [big]\nlisten = 127.0.0.1:{}\nlisten.backlog = 300\npm = static\n\
             pm.max_children = 1\n",
            port + 1
        ),
    );
    let conf = dir.write(
        "php-fpm.conf",
        &format!(
            "[global]\npid = {d}/php-fpm.pid\nerror_log = {d}/error.log\n\
             include={d}/pool.d/*.conf\n"
        ),
    );
    let args = [
        "--nodaemonize".to_owned(),
        "--allow-to-run-as-root".to_owned(),
        "--fpm-config".to_owned(),
        conf.display().to_string(),
    ];
    Server::start(port + 1, PHP_FPM, &args, dir)
}

const PHP_FPM: &str = "/usr/sbin/php-fpm8.2";

/// gunicorn with `backlog = 1000` in its configuration file and a WSGI app of one line.
fn gunicorn(port: u16) -> Server {
    let dir = TempDir::new(&format!("dayone-gunicorn-{port}"));
    dir.write(
        "app.py",
        "def app(environ, start):\n    start('200 OK', [])\n    return [b'']\n",
    );
    let conf = dir.write(
        "gunicorn.conf.py",
        &format!("bind = '127.0.0.1:{port}'\nworkers = 1\nbacklog = 1000\n"),
    );
    let args = [
        "-c".to_owned(),
        conf.display().to_string(),
        "--chdir".to_owned(),
        dir.path().display().to_string(),
        "app:app".to_owned(),
    ];
    Server::start(port, "/usr/bin/gunicorn", &args, dir)
}

/// `python3 -m http.server`: a socketserver.TCPServer, request_queue_size 5.
fn http_server(somaxconn: u32, port: u16) -> Server {
    let dir = TempDir::new(&format!("dayone-python-{port}"));
    let args = ["-m", "http.server", "-b", "127.0.0.1", &port.to_string()].map(str::to_owned);
    Server::start_at(somaxconn, port, "/usr/bin/python3", &args, dir)
}

/// A JVM running code that binds a plain java.net.ServerSocket without a backlog (the
/// source-file launcher compiles it in memory).
fn jvm(somaxconn: u32, port: u16) -> Server {
    let dir = TempDir::new(&format!("dayone-java-{port}"));
    let src = dir.write(
        "Listen.java",
        "import java.net.*;\n\npublic class Listen {\n    public static void main(String[] a) \
         throws Exception {\n        ServerSocket s = new ServerSocket();\n        \
         s.bind(new InetSocketAddress(\"127.0.0.1\", Integer.parseInt(a[0])));\n        \
         while (true) s.accept().close();\n    }\n}\n",
    );
    let args = [
        "-Djava.net.preferIPv4Stack=true".to_owned(),
        "-Xshare:auto".to_owned(),
        "-XX:TieredStopAtLevel=1".to_owned(),
        src.display().to_string(),
        port.to_string(),
    ];
    Server::start_at(somaxconn, port, "java", &args, dir)
}

/// Waits until the daemon's snapshot has `ns`'s net.core.somaxconn at `value` (a rescan
/// reads it again).
fn wait_somaxconn(daemon: &Daemon, ns: &Netns, value: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let snapshot = daemon.api_snapshot();
        let now = snapshot["namespaces"]
            .as_array()
            .and_then(|all| all.iter().find(|n| n["netns"].as_u64() == Some(ns.inode())))
            .and_then(|n| n["somaxconn"].as_u64());
        if now == Some(value) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "netns {}'s somaxconn not {value} in the snapshot within 10 s: {now:?}",
            ns.inode()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until the daemon has seen `server`'s new listen() call (after a restart).
fn wait_seen(daemon: &Daemon, server: &Server) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(l) = try_snapshot_of(daemon, server).filter(|l| l["request"]["known"] == "seen")
        {
            return l;
        }
        assert!(
            Instant::now() < deadline,
            "{}'s new listen() not seen within 10 s",
            server.program
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn databases_php_python_and_java_started_before_the_daemon_and_somaxconn_raised_after() {
    let test = "databases_php_python_and_java_started_before_the_daemon_and_somaxconn_raised_after";
    if !require(
        test,
        &[
            ("/usr/sbin/mariadbd", &["--version"], "mariadb-server"),
            (
                &format!("{POSTGRES_BIN}/postgres"),
                &["--version"],
                "postgresql-15",
            ),
            (PHP_FPM, &["--version"], "php8.2-fpm"),
            ("/usr/bin/gunicorn", &["--version"], "gunicorn"),
            ("/usr/bin/python3", &["--version"], "python3"),
            ("javac", &["-version"], "openjdk-17-jdk-headless"),
        ],
    ) {
        return;
    }
    // (server, program id, what it asks for, what doctor's summary says it asks for, a
    // fragment of its own setting's name), each at a somaxconn below its figure.
    let servers: Vec<(Server, &str, u32, &str)> = vec![
        (
            mariadb(64, 13306),
            "mariadb",
            110,
            "`back_log` in the [mysqld]",
        ),
        (
            postgres(64, 15432),
            "postgres",
            68,
            "max_connections in postgresql.conf",
        ),
        (
            php_fpm(19000),
            "php-fpm",
            300,
            "`listen.backlog` in the pool's section",
        ),
        (
            gunicorn(18000),
            "gunicorn",
            1000,
            "`backlog = N` in its configuration file",
        ),
        (
            http_server(4, 18001),
            "python",
            5,
            "socketserver's request_queue_size is 5",
        ),
        (jvm(32, 18002), "java", 50, "without one a JVM asks for 50"),
    ];
    // Rescans read each namespace's sysctls again: every second here, so that the raise
    // below shows at once.
    let daemon = Daemon::start_with(&["--rescan-interval", "1"]);
    let doctor = Doctor::run(&daemon, &["--fail-on", "critical"]);
    for (server, program, asks, knob) in &servers {
        let found = doctor.about(&server.ns);
        assert_eq!(
            kinds(&found),
            set(&["backlog_clamped"]),
            "{program}: {found:#?}"
        );
        let f = found[0];
        assert_eq!(f["severity"], "warning", "{program}: {f:#?}");
        let summary = f["summary"].as_str().unwrap();
        let unless = if *program == "java" {
            " (if its code passes none)"
        } else {
            ""
        };
        assert!(
            summary.ends_with(&format!(
                "asks for backlog {asks}{unless} on 127.0.0.1:{}, the kernel granted {}",
                server.port, server.somaxconn
            )),
            "{program}: {summary}"
        );
        let ev = evidence(f);
        assert!(ev.contains(&format!("{program} asks for {asks}: ")), "{ev}");
        let remedy = f["remedy"].as_str().unwrap();
        assert!(remedy.contains(knob), "{program}: {remedy}");
        let l = snapshot_of(&daemon, server);
        assert_eq!(l["request"]["known"], "program", "{l}");
        assert_eq!(l["request"]["program"], *program, "{l}");
        assert_eq!(l["request"]["backlog"], *asks, "{l}");
    }
    // Where the figures came from: the files and the command line.
    let ev = |i: usize| evidence(doctor.about(&servers[i].0.ns)[0]);
    assert!(ev(0).contains("with max_connections 300 ("), "{}", ev(0));
    assert!(ev(0).contains("my.cnf:"), "{}", ev(0));
    assert!(ev(1).contains("its command line (-N 20)"), "{}", ev(1));
    assert!(
        ev(2).contains("listen.backlog = 300 (pool [big])"),
        "{}",
        ev(2)
    );
    assert!(
        ev(3).contains("gunicorn.conf.py:3: backlog = 1000"),
        "{}",
        ev(3)
    );
    // PHP-FPM's other pool asks for somaxconn (listen.backlog unset: -1): the kernel gave
    // it 128, and the JSON API says so.
    let l = listener_at(&daemon, &servers[2].0.ns, 19000).expect("php-fpm's pool plain");
    assert_eq!(l["request"]["known"], "somaxconn", "{l}");
    assert_eq!(l["request"]["program"], "php-fpm", "{l}");
    assert_eq!(l["granted"], 128, "{l}");

    // somaxconn raised after they listened, in three of the namespaces: each listener
    // keeps what it was granted and doctor says it must listen again.
    for (server, ..) in &servers[..3] {
        server.ns.sysctl("net.core.somaxconn", "4096");
    }
    for (server, ..) in &servers[..3] {
        wait_somaxconn(&daemon, &server.ns, 4096);
    }
    let raised = Doctor::run(&daemon, &[]);
    // top flags them the same: `+`, listen() again gets more.
    let top = Top::once(&daemon);
    for (server, program, asks, _) in &servers[..2] {
        let row = top.row(format!("127.0.0.1:{}", server.port));
        assert!(
            row.contains(&format!(" {asks}*/{}!+ ", server.somaxconn)),
            "{program}: {row}"
        );
    }
    let row = top.row("127.0.0.1:19000");
    assert!(row.contains(" =max/128+ "), "php-fpm's plain pool: {row}");
    for (server, program, asks, _) in &servers[..3] {
        let found = raised.about(&server.ns);
        let ev = found
            .iter()
            .map(|f| evidence(f))
            .collect::<Vec<_>>()
            .join("\n");
        assert!(
            ev.contains(&format!(
                "net.core.somaxconn is 4096 now, above the {} granted: it was raised after",
                server.somaxconn
            )),
            "{program}: {found:#?}"
        );
        let clamp = found
            .iter()
            .find(|f| {
                f["summary"]
                    .as_str()
                    .unwrap()
                    .contains(&format!("backlog {asks} "))
            })
            .unwrap_or_else(|| panic!("{program}: {found:#?}"));
        assert!(
            clamp["remedy"].as_str().unwrap().starts_with(&format!(
                "net.core.somaxconn is already 4096 in that namespace, so {asks} fits now: \
                 restart"
            )),
            "{program}: {clamp:#?}"
        );
    }
    // PHP-FPM's pool that asks for somaxconn itself now holds less than it asks for.
    let php = raised.about(&servers[2].0.ns);
    let plain = php
        .iter()
        .find(|f| {
            f["summary"]
                .as_str()
                .unwrap()
                .contains("asks for net.core.somaxconn on 127.0.0.1:19000")
        })
        .unwrap_or_else(|| panic!("{php:#?}"));
    assert!(
        plain["summary"]
            .as_str()
            .unwrap()
            .ends_with("it must call listen() again to get 4096"),
        "{plain:#?}"
    );
    // Restarted, MariaDB and PostgreSQL listen again: the kernel grants what their rows
    // say they ask for, now that somaxconn allows it, and doctor has nothing to say.
    let mut servers = servers;
    for (server, program, asks, _) in &mut servers[..2] {
        server.restart();
        assert_eq!(
            server.granted(),
            Some(*asks),
            "{program} at somaxconn 4096: the kernel granted what it asked for (ss Send-Q)"
        );
        let l = wait_seen(&daemon, server);
        assert_eq!(l["requested"], *asks, "{program}: {l}");
    }
    let after = Doctor::run(&daemon, &[]);
    let top = Top::once(&daemon);
    for (server, program, asks, _) in &servers[..2] {
        let row = top.row(format!("127.0.0.1:{}", server.port));
        assert!(
            row.contains(&format!(" {asks}/{asks} ")),
            "{program}: {row}"
        );
    }
    for (server, program, _, _) in &servers[..2] {
        assert_eq!(
            kinds(&after.about(&server.ns)),
            set(&[]),
            "{program}: {:#?}",
            after.about(&server.ns)
        );
    }
}

/// Debian's Tomcat 10.1 as its unit starts it (tomcat-start.sh: `catalina.sh run`, which
/// execs the JVM with Bootstrap), with a CATALINA_BASE of its own: the package's conf/
/// copied, its HTTP connector moved to 127.0.0.1:`port` with acceptCount="300", and a
/// second connector on `port` + 1 without one (Tomcat's 100). The JVM keeps Debian's
/// defaults: its listeners are IPv6 sockets on ::ffff:127.0.0.1. Waits for both ports.
fn tomcat(somaxconn: u32, port: u16) -> Server {
    let dir = TempDir::new(&format!("dayone-tomcat-{port}"));
    let d = dir.path().display().to_string();
    for sub in ["conf", "logs", "webapps", "work", "temp"] {
        std::fs::create_dir_all(dir.path().join(sub)).expect("CATALINA_BASE");
    }
    for file in [
        "catalina.properties",
        "context.xml",
        "jaspic-providers.xml",
        "logging.properties",
        "tomcat-users.xml",
        "web.xml",
    ] {
        std::fs::copy(
            format!("{TOMCAT_CONF}/{file}"),
            dir.path().join("conf").join(file),
        )
        .unwrap_or_else(|e| panic!("copying {TOMCAT_CONF}/{file}: {e}"));
    }
    let packaged =
        std::fs::read_to_string(format!("{TOMCAT_CONF}/server.xml")).expect("Debian's server.xml");
    let connector = "<Connector port=\"8080\" protocol=\"HTTP/1.1\"";
    assert!(packaged.contains(connector), "server.xml: {packaged}");
    let server_xml = packaged.replacen(
        connector,
        &format!(
            "<Connector port=\"{}\" address=\"127.0.0.1\" protocol=\"HTTP/1.1\" />\n    \
             <Connector port=\"{port}\" address=\"127.0.0.1\" acceptCount=\"300\" \
             protocol=\"HTTP/1.1\"",
            port + 1
        ),
        1,
    );
    dir.write("conf/server.xml", &server_xml);
    let args = [
        "CATALINA_HOME=/usr/share/tomcat10".to_owned(),
        format!("CATALINA_BASE={d}"),
        format!("CATALINA_TMPDIR={d}/temp"),
        // Debian's JAVA_OPTS (/etc/default/tomcat10), and a JIT that starts sooner.
        "JAVA_OPTS=-Djava.awt.headless=true -XX:TieredStopAtLevel=1".to_owned(),
        TOMCAT_CATALINA_SH.to_owned(),
        "run".to_owned(),
    ];
    let server = Server::start_at(somaxconn, port, "env", &args, dir);
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.granted_on(port + 1).is_none() {
        assert!(
            Instant::now() < deadline,
            "tomcat not listening on {}",
            port + 1
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    server
}

const TOMCAT_CONF: &str = "/etc/tomcat10";
const TOMCAT_CATALINA_SH: &str = "/usr/share/tomcat10/bin/catalina.sh";

/// The line of `server`'s conf/server.xml that holds `text`, as `FILE:LINE`.
fn line_of(server: &Server, file: &str, text: &str) -> String {
    let path = server.dir.path().join(file);
    let content = std::fs::read_to_string(&path).expect("reading back a file the test wrote");
    let n = content
        .lines()
        .position(|l| l.contains(text))
        .unwrap_or_else(|| panic!("{text} not in {}", path.display()));
    format!("{}:{}", path.display(), n + 1)
}

/// Debian's Jetty 9.4 as its jetty.sh starts it (`java -Djetty.home=H -Djetty.base=B
/// -jar H/start.jar`), with a jetty.base of its own whose start.d/http.ini enables the
/// http module on 127.0.0.1:`port`, with `jetty.http.acceptQueueSize=N` when `queue` is
/// given.
fn jetty(somaxconn: u32, port: u16, queue: Option<u32>) -> Server {
    let dir = TempDir::new(&format!("dayone-jetty-{port}"));
    let d = dir.path().display().to_string();
    std::fs::create_dir_all(dir.path().join("start.d")).expect("start.d");
    let queue = queue.map_or(String::new(), |n| {
        format!("jetty.http.acceptQueueSize={n}\n")
    });
    dir.write(
        "start.d/http.ini",
        &format!("--module=http\njetty.http.host=127.0.0.1\njetty.http.port={port}\n{queue}"),
    );
    let args = [
        "-XX:TieredStopAtLevel=1".to_owned(),
        "-Djetty.home=/usr/share/jetty9".to_owned(),
        format!("-Djetty.base={d}"),
        format!("-Djava.io.tmpdir={d}"),
        "-jar".to_owned(),
        JETTY_START_JAR.to_owned(),
    ];
    Server::start_at(somaxconn, port, "java", &args, dir)
}

const JETTY_START_JAR: &str = "/usr/share/jetty9/start.jar";

/// Debian's Netty 4.1 jars a ServerBootstrap needs (libnetty-java: its netty-all.jar is
/// an empty aggregate whose manifest names no class path).
const NETTY_CLASSPATH: &str = "/usr/share/java/netty-common.jar:/usr/share/java/netty-buffer.jar:\
                               /usr/share/java/netty-resolver.jar:/usr/share/java/netty-transport.jar";

/// A Netty server that sets no SO_BACKLOG, compiled here: a ServerBootstrap on NIO bound
/// to 127.0.0.1:`port`, which asks for NetUtil.SOMAXCONN, the namespace's somaxconn when
/// the JVM loaded Netty.
fn netty(somaxconn: u32, port: u16) -> Server {
    let dir = TempDir::new(&format!("dayone-netty-{port}"));
    let src = dir.write(
        "Serve.java",
        "import io.netty.bootstrap.ServerBootstrap;\n\
         import io.netty.channel.ChannelInitializer;\n\
         import io.netty.channel.nio.NioEventLoopGroup;\n\
         import io.netty.channel.socket.SocketChannel;\n\
         import io.netty.channel.socket.nio.NioServerSocketChannel;\n\n\
         public class Serve {\n    public static void main(String[] a) throws Exception {\n        \
         new ServerBootstrap()\n            .group(new NioEventLoopGroup(1))\n            \
         .channel(NioServerSocketChannel.class)\n            \
         .childHandler(new ChannelInitializer<SocketChannel>() {\n                \
         protected void initChannel(SocketChannel c) { c.close(); }\n            })\n            \
         .bind(\"127.0.0.1\", Integer.parseInt(a[0])).sync().channel().closeFuture().sync();\n    \
         }\n}\n",
    );
    let out = Command::new("javac")
        .args(["-cp", NETTY_CLASSPATH, "-d"])
        .arg(dir.path())
        .arg(&src)
        .output()
        .expect("javac");
    assert!(out.status.success(), "javac: {out:?}");
    let args = [
        "-XX:TieredStopAtLevel=1".to_owned(),
        "-cp".to_owned(),
        format!("{NETTY_CLASSPATH}:{}", dir.path().display()),
        "Serve".to_owned(),
        port.to_string(),
    ];
    Server::start_at(somaxconn, port, "java", &args, dir)
}

#[test]
fn tomcat_jetty_and_netty_started_before_the_daemon_and_somaxconn_raised_after() {
    let test = "tomcat_jetty_and_netty_started_before_the_daemon_and_somaxconn_raised_after";
    if !require(
        test,
        &[
            ("javac", &["-version"], "openjdk-17-jdk-headless"),
            ("test", &["-x", TOMCAT_CATALINA_SH], "tomcat10"),
            ("test", &["-r", JETTY_START_JAR], "jetty9"),
            (
                "test",
                &["-r", "/usr/share/java/netty-transport.jar"],
                "libnetty-java",
            ),
        ],
    ) {
        return;
    }
    // Four JVMs at once, each in its namespace: Tomcat and Jetty at 128, below the 300
    // their configurations ask for; Jetty without acceptQueueSize at 4096, above its
    // default; Netty at 128, which it reads as its default.
    let mut servers = at_once::<Server, 4>([
        Box::new(|| tomcat(128, 18090)),
        Box::new(|| jetty(128, 18092, Some(300))),
        Box::new(|| jetty(4096, 18093, None)),
        Box::new(|| netty(128, 18094)),
    ]);
    // What the kernel granted, before backlogd ran: Tomcat's second connector its 100
    // (below 128: as asked), Jetty's default the JDK's 50 at 4096, Netty somaxconn.
    assert_eq!(servers[0].granted(), Some(128), "tomcat's acceptCount 300");
    assert_eq!(servers[0].granted_on(18091), Some(100), "tomcat's default");
    assert_eq!(
        servers[1].granted(),
        Some(128),
        "jetty's acceptQueueSize 300"
    );
    assert_eq!(servers[2].granted(), Some(50), "jetty's default at 4096");
    assert_eq!(servers[3].granted(), Some(128), "netty at 128");
    let daemon = Daemon::start_with(&["--rescan-interval", "1"]);
    let doctor = Doctor::run(&daemon, &["--fail-on", "critical"]);
    // (server, program id, its own setting's name, where the 300 was read)
    let tomcat_xml = line_of(&servers[0], "conf/server.xml", "acceptCount=\"300\"");
    let jetty_ini = line_of(&servers[1], "start.d/http.ini", "acceptQueueSize=300");
    let clamped = [
        (
            &servers[0],
            "tomcat",
            "`acceptCount` on the `<Connector>`",
            format!("{tomcat_xml}: acceptCount=\"300\""),
        ),
        (
            &servers[1],
            "jetty",
            "`jetty.http.acceptQueueSize=N` in the jetty.base's start.d/http.ini",
            format!("{jetty_ini}: jetty.http.acceptQueueSize=300"),
        ),
    ];
    for (server, program, knob, source) in &clamped {
        let found = doctor.about(&server.ns);
        assert_eq!(
            kinds(&found),
            set(&["backlog_clamped"]),
            "{program}: {found:#?}"
        );
        assert_eq!(found.len(), 1, "{program}: {found:#?}");
        let f = found[0];
        assert_eq!(f["severity"], "warning", "{program}: {f:#?}");
        let summary = f["summary"].as_str().unwrap();
        assert!(
            summary.ends_with(&format!(
                "asks for backlog 300 on [::ffff:127.0.0.1]:{}, the kernel granted 128",
                server.port
            )),
            "{program}: {summary}"
        );
        let ev = evidence(f);
        assert!(
            ev.contains(&format!("{program} asks for 300: {source}")),
            "{ev}"
        );
        let remedy = f["remedy"].as_str().unwrap();
        assert!(remedy.contains(knob), "{program}: {remedy}");
        let l = snapshot_of(&daemon, server);
        assert_eq!(l["request"]["known"], "program", "{l}");
        assert_eq!(l["request"]["program"], *program, "{l}");
        assert_eq!(l["request"]["backlog"], 300, "{l}");
        assert_eq!(l["request"]["source"], *source, "{l}");
    }
    // The defaults, granted in full: nothing to say, and the API says what they ask.
    for (ns, port, program, asks, source) in [
        (&servers[0].ns, 18091, "tomcat", 100, "tomcat's default"),
        (&servers[2].ns, 18093, "jetty", 50, "jetty's default"),
    ] {
        let l = listener_at(&daemon, ns, port).unwrap_or_else(|| panic!("{program} {port}"));
        assert_eq!(l["granted"], asks, "{l}");
        assert_eq!(l["request"]["known"], "program", "{l}");
        assert_eq!(l["request"]["program"], program, "{l}");
        assert_eq!(l["request"]["backlog"], asks, "{l}");
        assert_eq!(l["request"]["source"], source, "{l}");
    }
    assert_eq!(kinds(&doctor.about(&servers[2].ns)), set(&[]));
    // Netty holds what it asked for, somaxconn: nothing to say.
    assert_eq!(
        kinds(&doctor.about(&servers[3].ns)),
        set(&[]),
        "{:#?}",
        doctor.about(&servers[3].ns)
    );
    let l = snapshot_of(&daemon, &servers[3]);
    assert_eq!(l["request"]["known"], "somaxconn", "{l}");
    assert_eq!(l["request"]["program"], "netty", "{l}");
    assert_eq!(l["program"]["asks"], "code_somaxconn", "{l}");
    assert!(
        l["program"]["source"]
            .as_str()
            .unwrap()
            .starts_with("/usr/share/java/netty-transport.jar on its class path: "),
        "{l}"
    );

    // somaxconn raised after they listened, under Tomcat, Jetty (300) and Netty.
    let raised_ns = [0, 1, 3];
    for i in raised_ns {
        servers[i].ns.sysctl("net.core.somaxconn", "4096");
    }
    for i in raised_ns {
        wait_somaxconn(&daemon, &servers[i].ns, 4096);
    }
    let raised = Doctor::run(&daemon, &[]);
    for (server, program, ..) in &clamped {
        let found = raised.about(&server.ns);
        assert_eq!(found.len(), 1, "{program}: {found:#?}");
        assert!(
            evidence(found[0]).contains(
                "net.core.somaxconn is 4096 now, above the 128 granted: it was raised after"
            ),
            "{program}: {found:#?}"
        );
        assert!(
            found[0]["remedy"].as_str().unwrap().starts_with(
                "net.core.somaxconn is already 4096 in that namespace, so 300 fits now: \
                 restart "
            ),
            "{program}: {found:#?}"
        );
    }
    let found = raised.about(&servers[3].ns);
    assert_eq!(kinds(&found), set(&["backlog_clamped"]), "{found:#?}");
    let f = found[0];
    assert_eq!(f["severity"], "warning", "{f:#?}");
    assert!(
        f["summary"].as_str().unwrap().ends_with(
            "asks for net.core.somaxconn (if its code passes none) on \
             [::ffff:127.0.0.1]:18094, 4096 now, and holds the 128 it was granted before it \
             was raised: it must call listen() again to get 4096"
        ),
        "{f:#?}"
    );
    assert!(
        f["remedy"]
            .as_str()
            .unwrap()
            .contains("restart the JVM (Netty reads net.core.somaxconn once"),
        "{f:#?}"
    );
    let top = Top::once(&daemon);
    for (port, cell) in [
        (18090, " 300*/128!+ "),
        (18092, " 300*/128!+ "),
        (18094, " =max/128+ "),
    ] {
        let row = top.row(format!("[::ffff:127.0.0.1]:{port}"));
        assert!(row.contains(cell), "{port}: {row}");
    }

    // Restarted together, each calls listen() again: the kernel grants what the rows
    // say, now that somaxconn allows it (Netty reads the new somaxconn), and doctor has
    // nothing more to say.
    let [tomcat, jetty, _, netty] = servers.as_mut_slice() else {
        unreachable!("four servers")
    };
    at_once::<(), 3>([
        Box::new(|| tomcat.restart()),
        Box::new(|| jetty.restart()),
        Box::new(|| netty.restart()),
    ]);
    for (i, port, asks) in [
        (0, 18090, 300),
        (0, 18091, 100),
        (1, 18092, 300),
        (3, 18094, 4096),
    ] {
        assert_eq!(
            servers[i].granted_on(port),
            Some(asks),
            "{port} at somaxconn 4096: the kernel granted what its row asks for (ss Send-Q)"
        );
    }
    for i in [1, 3] {
        let l = wait_seen(&daemon, &servers[i]);
        let asks = if i == 3 { 4096 } else { 300 };
        assert_eq!(l["requested"], asks, "{l}");
    }
    let l = wait_seen(&daemon, &servers[0]);
    assert_eq!(l["requested"], 300, "{l}");
    let after = Doctor::run(&daemon, &[]);
    for i in raised_ns {
        assert_eq!(
            kinds(&after.about(&servers[i].ns)),
            set(&[]),
            "{:#?}",
            after.about(&servers[i].ns)
        );
    }
}
