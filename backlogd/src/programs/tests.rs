//! One test per row of the table: the program is recognised from what /proc would say,
//! and its configuration reader finds the figure where the program's own documentation
//! puts it (files in a directory that stands in for the process's root).

use std::path::PathBuf;

use super::*;

/// A directory standing in for a process's `/`, removed when dropped.
struct Root(PathBuf);

impl Root {
    fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "backlogd-programs-{tag}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    fn file(&self, path: &str, text: &str) -> &Self {
        let full = self.0.join(path.trim_start_matches('/'));
        std::fs::create_dir_all(full.parent().unwrap()).unwrap();
        std::fs::write(full, text).unwrap();
        self
    }

    fn process(&self, exe: &str, cmdline: &[&str]) -> Process {
        Process {
            pid: 0,
            comm: exe.rsplit('/').next().unwrap().chars().take(15).collect(),
            exe: Some(PathBuf::from(exe)),
            cmdline: cmdline.iter().map(|s| s.to_string()).collect(),
            root: self.0.clone(),
            cwd: self.0.join("cwd"),
            go: Default::default(),
            classpath: Default::default(),
        }
    }
}

impl Drop for Root {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn asks(known: &Option<Known>) -> Option<(&str, Asks)> {
    known.as_ref().map(|k| (k.program.as_str(), k.asks))
}

#[test]
fn every_row_has_a_test_below() {
    let here = include_str!("tests.rs");
    for p in PROGRAMS {
        assert!(
            here.contains(&format!("fn {}_", p.id.replace('-', "_"))),
            "no test for the {} row",
            p.id
        );
    }
}

#[test]
fn every_row_is_in_docs_programs_md() {
    let doc = include_str!("../../../docs/programs.md");
    for p in PROGRAMS {
        assert!(
            doc.lines().any(|l| l.starts_with(&format!("| {} ", p.id))),
            "docs/programs.md has no row for {}",
            p.id
        );
    }
}

#[test]
fn nginx_reads_the_listen_directive_for_the_port_through_includes() {
    let root = Root::new("nginx");
    root.file(
        "/etc/nginx/nginx.conf",
        "events {}\nhttp {\n  include /etc/nginx/sites-enabled/*;\n}\n",
    )
    .file(
        "/etc/nginx/sites-enabled/default",
        "server {\n  listen 80 default_server;\n  listen [::]:8080 backlog=4096; # big\n}\n",
    );
    let nginx = root.process(
        "/usr/sbin/nginx",
        &["nginx: master process /usr/sbin/nginx"],
    );
    let k = identify(&nginx, 8080).unwrap();
    assert_eq!(k.asks, Asks::Backlog(4096));
    assert_eq!(
        k.source,
        "/etc/nginx/sites-enabled/default:3: listen [::]:8080 backlog=4096"
    );
    // A listen without backlog= asks for nginx's default.
    assert_eq!(
        asks(&identify(&nginx, 80)),
        Some(("nginx", Asks::Backlog(511)))
    );
    // -c names another file; relative includes are relative to its directory.
    root.file("/srv/n.conf", "include more.conf;\n").file(
        "/srv/more.conf",
        "server { listen 127.0.0.1:9000 backlog=777; }\n",
    );
    let other = root.process("/usr/sbin/nginx", &["/usr/sbin/nginx", "-c", "/srv/n.conf"]);
    assert_eq!(
        asks(&identify(&other, 9000)),
        Some(("nginx", Asks::Backlog(777)))
    );
}

#[test]
fn redis_reads_tcp_backlog_from_its_config_file_and_command_line() {
    let root = Root::new("redis");
    root.file("/etc/redis/redis.conf", "port 6379\ntcp-backlog 2048\n");
    let redis = root.process(
        "/usr/bin/redis-server",
        &["/usr/bin/redis-server", "/etc/redis/redis.conf"],
    );
    let k = identify(&redis, 6379).unwrap();
    assert_eq!(
        (k.asks, k.source.as_str()),
        (
            Asks::Backlog(2048),
            "/etc/redis/redis.conf:2: tcp-backlog 2048"
        )
    );
    let flagged = root.process(
        "/usr/bin/redis-server",
        &[
            "redis-server",
            "/etc/redis/redis.conf",
            "--tcp-backlog",
            "300",
        ],
    );
    assert_eq!(
        asks(&identify(&flagged, 6379)),
        Some(("redis", Asks::Backlog(300)))
    );
    // Debian's service rewrites argv: "redis-server 127.0.0.1:6379".
    let bare = root.process(
        "/usr/bin/redis-server",
        &["/usr/bin/redis-server 127.0.0.1:6379"],
    );
    assert_eq!(
        asks(&identify(&bare, 6379)),
        Some(("redis", Asks::Backlog(511)))
    );
}

#[test]
fn apache_reads_listen_backlog_through_include_optional() {
    let root = Root::new("apache");
    root.file(
        "/etc/apache2/apache2.conf",
        "ServerRoot \"/etc/apache2\"\nIncludeOptional conf-enabled/*.conf\n",
    )
    .file(
        "/etc/apache2/conf-enabled/backlog.conf",
        "ListenBacklog 1500\n",
    );
    let apache = root.process("/usr/sbin/apache2", &["/usr/sbin/apache2", "-k", "start"]);
    assert_eq!(
        asks(&identify(&apache, 80)),
        Some(("apache", Asks::Backlog(1500)))
    );
    let httpd = root.process(
        "/usr/sbin/httpd",
        &["/usr/sbin/httpd", "-f", "/nowhere.conf"],
    );
    assert_eq!(
        asks(&identify(&httpd, 80)),
        Some(("apache", Asks::Backlog(511)))
    );
}

#[test]
fn haproxy_takes_bind_then_frontend_then_defaults_then_maxconn() {
    let root = Root::new("haproxy");
    root.file(
        "/etc/haproxy/haproxy.cfg",
        "global\n  maxconn 50000\ndefaults\n  backlog 900\n  timeout client 5s\n\
         frontend a\n  bind :8001 backlog 1000\n  backlog 2000\n\
         frontend b\n  bind 127.0.0.1:8002\n  backlog 3000\n\
         listen c\n  bind *:8003\n\
         backend x\n  server s 127.0.0.1:1\n",
    );
    let haproxy = root.process(
        "/usr/sbin/haproxy",
        &["/usr/sbin/haproxy", "-Ws", "-f", "/etc/haproxy/haproxy.cfg"],
    );
    let backlog = |port| identify(&haproxy, port).map(|k| k.asks);
    assert_eq!(backlog(8001), Some(Asks::Backlog(1000)));
    assert_eq!(backlog(8002), Some(Asks::Backlog(3000)));
    assert_eq!(backlog(8003), Some(Asks::Backlog(900)));
    // Without any of them, haproxy's figure comes from settings backlogd does not read.
    root.file("/etc/haproxy/haproxy.cfg", "frontend a\n  bind :8001\n");
    assert_eq!(backlog(8001), Some(Asks::Configured));
}

#[test]
fn memcached_reads_dash_b() {
    let root = Root::new("memcached");
    for (args, want) in [
        (&["memcached", "-p", "11211", "-b", "4096"][..], 4096),
        (&["memcached", "-b2048"][..], 2048),
        (&["memcached", "--listen-backlog=3000"][..], 3000),
        (&["memcached", "-m", "64"][..], 1024),
    ] {
        let m = root.process("/usr/bin/memcached", args);
        assert_eq!(
            asks(&identify(&m, 11211)),
            Some(("memcached", Asks::Backlog(want))),
            "{args:?}"
        );
    }
}

#[test]
fn nodejs_is_recognised_by_its_executable() {
    let root = Root::new("node");
    let node = root.process("/usr/bin/node", &["node", "server.js"]);
    assert_eq!(
        asks(&identify(&node, 3000)),
        Some(("nodejs", Asks::Backlog(511)))
    );
}

#[test]
fn sshd_asks_for_128() {
    let root = Root::new("sshd");
    let sshd = root.process("/usr/sbin/sshd", &["sshd: /usr/sbin/sshd -D [listener]"]);
    assert_eq!(
        asks(&identify(&sshd, 22)),
        Some(("sshd", Asks::Backlog(128)))
    );
}

#[test]
fn systemd_socket_units_ask_for_somaxconn() {
    let root = Root::new("systemd");
    let pid1 = root.process("/usr/lib/systemd/systemd", &["/sbin/init"]);
    assert_eq!(
        asks(&identify(&pid1, 22)),
        Some(("systemd", Asks::Somaxconn))
    );
}

#[test]
fn systemd_reads_backlog_of_the_socket_unit_on_the_port_with_its_drop_ins() {
    let root = Root::new("systemd-backlog");
    root.file(
        "/usr/lib/systemd/system/web.socket",
        "[Unit]\nDescription=web\n[Socket]\nListenStream=127.0.0.1:8080\nBacklog=64\n",
    )
    // The administrator's copy in /etc hides the vendor's whole.
    .file(
        "/etc/systemd/system/web.socket",
        "[Socket]\nListenStream=[::]:8080\nBacklog=1024\n[Install]\nBacklog=7\n",
    )
    .file(
        "/usr/lib/systemd/system/web.socket.d/10-more.conf",
        "[Socket]\nBacklog=2048\n",
    )
    // Same name higher up: hides the one above; later names apply last.
    .file(
        "/etc/systemd/system/web.socket.d/10-more.conf",
        "[Socket]\nBacklog=4096\n",
    )
    .file(
        "/run/systemd/system/web.socket.d/20-reset.conf",
        "[Socket]\nBacklog=\n",
    )
    .file(
        "/lib/systemd/system/other.socket",
        "[Socket]\nListenStream=/run/other.sock\nListenStream=9090\nBacklog=300\n",
    )
    .file(
        "/lib/systemd/system/ssh.socket",
        "[Socket]\nListenStream=22\nListenStream=\nListenStream=2222\nBacklog=50\n",
    );
    let pid1 = root.process("/usr/lib/systemd/systemd", &["/sbin/init"]);
    // 20-reset.conf empties Backlog=: the default, the most the kernel allows.
    assert_eq!(
        asks(&identify(&pid1, 8080)),
        Some(("systemd", Asks::Somaxconn))
    );
    root.file(
        "/run/systemd/system/web.socket.d/20-reset.conf",
        "[Socket]\nBacklog=\nBacklog=512\n",
    );
    let web = identify(&pid1, 8080).unwrap();
    assert_eq!(web.asks, Asks::Backlog(512));
    assert_eq!(
        web.source,
        "/run/systemd/system/web.socket.d/20-reset.conf:3: Backlog=512"
    );
    assert_eq!(
        asks(&identify(&pid1, 9090)),
        Some(("systemd", Asks::Backlog(300)))
    );
    // An emptied ListenStream= list no longer holds 22.
    assert_eq!(
        asks(&identify(&pid1, 22)),
        Some(("systemd", Asks::Somaxconn))
    );
    assert_eq!(
        asks(&identify(&pid1, 2222)),
        Some(("systemd", Asks::Backlog(50)))
    );
    // The user manager's units are not the system's.
    let user = root.process(
        "/usr/lib/systemd/systemd",
        &["/lib/systemd/systemd", "--user"],
    );
    assert_eq!(
        asks(&identify(&user, 9090)),
        Some(("systemd", Asks::Somaxconn))
    );
}

#[test]
fn go_programs_are_recognised_by_their_build_info_whatever_their_name() {
    use object::write;
    let root = Root::new("go");
    let elf = |section: &[u8]| {
        let mut obj = write::Object::new(
            object::BinaryFormat::Elf,
            object::Architecture::X86_64,
            object::Endianness::Little,
        );
        let id = obj.add_section(
            Vec::new(),
            section.to_vec(),
            object::SectionKind::ReadOnlyData,
        );
        obj.append_section_data(id, b"\xff Go buildinf:", 16);
        obj.write().unwrap()
    };
    root.file("/srv/api", "");
    std::fs::write(root.0.join("srv/api"), elf(b".go.buildinfo")).unwrap();
    std::fs::write(root.0.join("srv/c"), elf(b".rodata")).unwrap();
    let go = root.process(&root.0.join("srv/api").to_string_lossy(), &["api"]);
    assert_eq!(asks(&identify(&go, 8080)), Some(("go", Asks::Somaxconn)));
    let c = root.process(&root.0.join("srv/c").to_string_lossy(), &["c"]);
    assert_eq!(identify(&c, 8080), None);
}

#[test]
fn an_unknown_program_is_not_guessed_from_its_port() {
    let root = Root::new("unknown");
    let p = root.process("/opt/app/bin/server", &["server", "--port", "80"]);
    assert_eq!(identify(&p, 80), None);
    // A process may name any file: devices and the like are not read.
    let zero = root.process("/usr/sbin/nginx", &["nginx", "-c", "/dev/zero"]);
    std::os::unix::fs::symlink("/dev/zero", root.0.join("dev-zero")).unwrap();
    let via_link = root.process("/usr/sbin/nginx", &["nginx", "-c", "/dev-zero"]);
    assert_eq!(
        asks(&identify(&zero, 80)),
        Some(("nginx", Asks::Backlog(511)))
    );
    assert_eq!(
        asks(&identify(&via_link, 80)),
        Some(("nginx", Asks::Backlog(511)))
    );
    // A deleted executable (after an upgrade) keeps its name.
    let old = root.process("/usr/sbin/nginx (deleted)", &["nginx"]);
    assert_eq!(old.exe_name().as_deref(), Some("nginx"));
}

#[test]
fn mariadb_reads_back_log_from_its_groups_includes_and_command_line_else_max_connections() {
    let root = Root::new("mariadb");
    root.file(
        "/etc/mysql/my.cnf",
        "[client-server]\nsocket = /run/mysqld/mysqld.sock\n\
         !includedir /etc/mysql/mariadb.conf.d/\n",
    )
    .file(
        "/etc/mysql/mariadb.conf.d/50-server.cnf",
        "[server]\n[mysqld]\nbind-address = 127.0.0.1\n#back_log = 1\n\
         max_connections = 300\n[mysqldump]\nback_log = 2\n",
    );
    let mariadb = root.process("/usr/sbin/mariadbd", &["/usr/sbin/mariadbd"]);
    // No back_log: 50 + 300/5.
    let k = identify(&mariadb, 3306).unwrap();
    assert_eq!(k.asks, Asks::Backlog(110));
    assert_eq!(
        k.source,
        "back_log unset: min(900, 50 + max_connections/5) with max_connections 300 \
         (/etc/mysql/mariadb.conf.d/50-server.cnf:5: max_connections = 300)"
    );
    // A later file and a versioned group set back_log; the command line wins over both.
    root.file(
        "/etc/mysql/mariadb.conf.d/60-backlog.cnf",
        "[mariadb-10.11]\nback-log=700\n",
    );
    assert_eq!(
        asks(&identify(&mariadb, 3306)),
        Some(("mariadb", Asks::Backlog(700)))
    );
    // An included file starts outside any group: a setting before its first is ignored.
    root.file("/etc/mysql/mariadb.conf.d/70-loose.cnf", "back_log = 5\n");
    assert_eq!(
        asks(&identify(&mariadb, 3306)),
        Some(("mariadb", Asks::Backlog(700)))
    );
    let flagged = root.process(
        "/usr/sbin/mariadbd",
        &["/usr/sbin/mariadbd", "--back_log", "1200"],
    );
    let k = identify(&flagged, 3306).unwrap();
    assert_eq!(
        (k.asks, k.source.as_str()),
        (Asks::Backlog(1200), "its command line (--back_log)")
    );
    // back_log=0 asks for the computed figure, capped at 900.
    let big = root.process(
        "/usr/sbin/mariadbd",
        &["mariadbd", "--back-log=0", "--max-connections=10000"],
    );
    assert_eq!(
        asks(&identify(&big, 3306)),
        Some(("mariadb", Asks::Backlog(900)))
    );
    // --defaults-file reads that file alone; --no-defaults none: MariaDB's 80.
    root.file("/srv/my.cnf", "[mysqld]\nmax_connections=1K\n");
    let only = root.process(
        "/usr/sbin/mariadbd",
        &["mariadbd", "--defaults-file=/srv/my.cnf"],
    );
    assert_eq!(
        asks(&identify(&only, 3306)),
        Some(("mariadb", Asks::Backlog(50 + 1024 / 5)))
    );
    let none = root.process("/usr/sbin/mariadbd", &["mariadbd", "--no-defaults"]);
    assert_eq!(
        asks(&identify(&none, 3306)),
        Some(("mariadb", Asks::Backlog(80)))
    );
    // A server whose executable is mysqld is MySQL's (or an old MariaDB), not this row.
    let mysql = root.process("/usr/sbin/mysqld", &["/usr/sbin/mysqld"]);
    assert_eq!(identify(&mysql, 3306), None);
}

#[test]
fn postgres_asks_for_twice_max_backends_from_its_conf_auto_conf_and_command_line() {
    let root = Root::new("postgres");
    // Debian: -D names the configuration directory, whose file names the data directory.
    root.file(
        "/etc/postgresql/15/main/postgresql.conf",
        "data_directory = '/var/lib/postgresql/15/main'\n\
         max_connections = 100\t\t\t# (change requires restart)\n\
         include_dir 'conf.d'\n",
    )
    .file(
        "/etc/postgresql/15/main/conf.d/workers.conf",
        "max_worker_processes 16\n",
    )
    .file(
        "/var/lib/postgresql/15/main/postgresql.auto.conf",
        "max_connections = '200'\n",
    );
    let pg = root.process(
        "/usr/lib/postgresql/15/bin/postgres",
        &[
            "/usr/lib/postgresql/15/bin/postgres",
            "-D",
            "/var/lib/postgresql/15/main",
            "-c",
            "config_file=/etc/postgresql/15/main/postgresql.conf",
        ],
    );
    // 2 * (200 + 3 + 1 + 16 + 10)
    let k = identify(&pg, 5432).unwrap();
    assert_eq!(k.asks, Asks::Backlog(460));
    assert!(
        k.source.starts_with(
            "2 x (max_connections 200 + autovacuum_max_workers 3 + max_worker_processes 16 \
             + max_wal_senders 10 + 1), at most 10000; \
             /var/lib/postgresql/15/main/postgresql.auto.conf:1"
        ),
        "{}",
        k.source
    );
    // The command line comes last; the cap is PG_SOMAXCONN.
    let flagged = root.process(
        "/usr/lib/postgresql/15/bin/postgres",
        &[
            "postgres",
            "-D",
            "/var/lib/postgresql/15/main",
            "-c",
            "config_file=/etc/postgresql/15/main/postgresql.conf",
            "-N",
            "20",
            "--max-wal-senders=2",
        ],
    );
    assert_eq!(
        asks(&identify(&flagged, 5432)),
        Some(("postgres", Asks::Backlog(2 * (20 + 3 + 1 + 16 + 2))))
    );
    let huge = root.process("/usr/local/bin/postgres", &["postgres", "-N", "9000"]);
    assert_eq!(
        asks(&identify(&huge, 5432)),
        Some(("postgres", Asks::Backlog(10000)))
    );
    // Nothing set anywhere: 15's defaults, 2 * (100 + 3 + 1 + 8 + 10).
    let bare = root.process("/usr/local/bin/postgres", &["postgres", "-D", "/nowhere"]);
    assert_eq!(
        asks(&identify(&bare, 5432)),
        Some(("postgres", Asks::Backlog(244)))
    );
}

#[test]
fn php_fpm_reads_listen_backlog_of_the_pool_on_the_port_and_minus_one_is_somaxconn() {
    let root = Root::new("php-fpm");
    root.file(
        "/etc/php/8.2/fpm/php-fpm.conf",
        "[global]\npid = /run/php/php8.2-fpm.pid\ninclude=/etc/php/8.2/fpm/pool.d/*.conf\n",
    )
    .file(
        "/etc/php/8.2/fpm/pool.d/www.conf",
        "[www]\nlisten = /run/php/php8.2-fpm.sock\n;listen.backlog = 511\n",
    )
    .file(
        "/etc/php/8.2/fpm/pool.d/api.conf",
        "[api]\nlisten = 127.0.0.1:9000\nlisten.backlog = 1024\n\
         [admin]\nlisten = 9001\nlisten.backlog = -1\n[plain]\nlisten = [::]:9002\n",
    );
    // The master's title names its configuration.
    let master = root.process(
        "/usr/sbin/php-fpm8.2",
        &["php-fpm: master process (/etc/php/8.2/fpm/php-fpm.conf)"],
    );
    let k = identify(&master, 9000).unwrap();
    assert_eq!(k.program, "php-fpm");
    assert_eq!(
        (k.asks, k.source.as_str()),
        (
            Asks::Backlog(1024),
            "/etc/php/8.2/fpm/pool.d/api.conf:3: listen.backlog = 1024 (pool [api])"
        )
    );
    assert_eq!(identify(&master, 9001).unwrap().asks, Asks::Somaxconn);
    // No listen.backlog: FPM_BACKLOG_DEFAULT, -1 on Linux.
    assert_eq!(
        asks(&identify(&master, 9002)),
        Some(("php-fpm", Asks::Somaxconn))
    );
    // A worker's title names its pool only: Debian's path for its version.
    let worker = root.process("/usr/sbin/php-fpm8.2", &["php-fpm: pool api"]);
    assert_eq!(
        asks(&identify(&worker, 9000)),
        Some(("php-fpm", Asks::Backlog(1024)))
    );
    let flagged = root.process(
        "/usr/sbin/php-fpm",
        &[
            "php-fpm",
            "--nodaemonize",
            "-y",
            "/etc/php/8.2/fpm/php-fpm.conf",
        ],
    );
    assert_eq!(
        asks(&identify(&flagged, 9000)),
        Some(("php-fpm", Asks::Backlog(1024)))
    );
}

#[test]
fn gunicorn_reads_backlog_from_its_command_line_then_its_config_file() {
    let root = Root::new("gunicorn");
    root.file(
        "/srv/app/gunicorn.conf.py",
        "bind = '0.0.0.0:8000'\nbacklog = 4096  # burst\n",
    );
    // Run through its script: comm is the script's name, exe the interpreter.
    let mut g = root.process(
        "/usr/bin/python3.11",
        &[
            "/usr/bin/python3",
            "/usr/bin/gunicorn",
            "--backlog",
            "64",
            "app:app",
        ],
    );
    g.comm = "gunicorn".to_owned();
    let k = identify(&g, 8000).unwrap();
    assert_eq!(
        (k.program.as_str(), k.asks, k.source.as_str()),
        (
            "gunicorn",
            Asks::Backlog(64),
            "its command line (--backlog)"
        )
    );
    // python -m gunicorn, with ./gunicorn.conf.py in its working directory.
    let mut m = root.process(
        "/usr/bin/python3.11",
        &["python3", "-m", "gunicorn", "app:app"],
    );
    m.cwd = root.0.join("srv/app");
    let k = identify(&m, 8000).unwrap();
    assert_eq!(
        (k.program.as_str(), k.asks, k.source.as_str()),
        (
            "gunicorn",
            Asks::Backlog(4096),
            "gunicorn.conf.py:2: backlog = 4096  # burst"
        )
    );
    let titled = root.process("/usr/bin/python3.11", &["gunicorn: master [app:app]"]);
    assert_eq!(
        asks(&identify(&titled, 8000)),
        Some(("gunicorn", Asks::Backlog(2048)))
    );
}

#[test]
fn python_is_recognised_by_its_interpreter_and_http_server_asks_for_5() {
    let root = Root::new("python");
    let server = root.process(
        "/usr/bin/python3.11",
        &["/usr/bin/python3", "-m", "http.server", "8000"],
    );
    assert_eq!(
        asks(&identify(&server, 8000)),
        Some(("python", Asks::Backlog(5)))
    );
    // Unknown code: its figure is its own; the knob says the runtime's defaults.
    let mut app = root.process("/usr/local/bin/python3.12", &["python3", "serve.py"]);
    app.comm = "serve.py".to_owned();
    assert_eq!(
        asks(&identify(&app, 8000)),
        Some(("python", Asks::Configured))
    );
    assert!(
        by_id("python")
            .unwrap()
            .knob
            .contains("asyncio's create_server 100")
    );
    let not = root.process("/usr/bin/pythonista", &["pythonista"]);
    assert_eq!(identify(&not, 8000), None);
}

#[test]
fn tomcat_reads_accept_count_of_the_connector_on_the_port() {
    let root = Root::new("tomcat");
    root.file(
        "/var/lib/tomcat10/conf/server.xml",
        "<Server port=\"-1\">\n  <Service name=\"Catalina\">\n\
         <!-- <Connector port=\"8080\" acceptCount=\"1\" /> -->\n\
         <Connector port=\"8080\" protocol=\"HTTP/1.1\"\n   connectionTimeout=\"20000\"\n\
            acceptCount=\"500\" />\n\
         <Connector port=\"8443\" protocol=\"HTTP/1.1\" />\n\
             <Connector port=\"8009\" protocol=\"AJP/1.3\"\n  acceptCount=\"300\" />\n\
             <Connector port=\"8010\" acceptCount=\"0\" />\n\
             <Connector port=\"8011\" backlog=\"700\" />\n\
         </Service>\n</Server>\n",
    );
    let args = [
        "/usr/lib/jvm/default-java/bin/java",
        "-Dcatalina.base=/var/lib/tomcat10",
        "-Dcatalina.home=/usr/share/tomcat10",
        "org.apache.catalina.startup.Bootstrap",
        "start",
    ];
    let tomcat = root.process("/usr/lib/jvm/java-17-openjdk-amd64/bin/java", &args);
    let k = identify(&tomcat, 8080).unwrap();
    assert_eq!(
        (k.program.as_str(), k.asks, k.source.as_str()),
        (
            "tomcat",
            Asks::Backlog(500),
            "/var/lib/tomcat10/conf/server.xml:4: acceptCount=\"500\""
        )
    );
    assert_eq!(
        asks(&identify(&tomcat, 8443)),
        Some(("tomcat", Asks::Backlog(100)))
    );
    // An indented tag: the line it starts on.
    assert_eq!(
        identify(&tomcat, 8009).unwrap().source,
        "/var/lib/tomcat10/conf/server.xml:8: acceptCount=\"300\""
    );
    // setAcceptCount ignores 0 or less; `backlog` has set nothing since Tomcat 9.
    for port in [8010, 8011] {
        let k = identify(&tomcat, port).unwrap();
        assert_eq!(
            (k.asks, k.source.as_str()),
            (Asks::Backlog(100), "tomcat's default"),
            "{port}"
        );
    }
    // Bootstrap given as an argument to another main class is not Tomcat.
    let other = root.process(
        "/usr/lib/jvm/java-17-openjdk-amd64/bin/java",
        &[
            "java",
            "-cp",
            "app.jar",
            "Main",
            "org.apache.catalina.startup.Bootstrap",
        ],
    );
    assert_eq!(identify(&other, 8080).unwrap().program, "java");
}

/// Jetty from its distribution, as Debian's jetty.sh starts it: `java -Djetty.home=H
/// -Djetty.base=B -jar H/start.jar ARGS`.
fn jetty_process(root: &Root, jvm: &[&str], args: &[&str]) -> Process {
    let cmdline: Vec<&str> = ["/usr/bin/java"]
        .into_iter()
        .chain(jvm.iter().copied())
        .chain(["-jar", "/usr/share/jetty9/start.jar"])
        .chain(args.iter().copied())
        .collect();
    root.process("/usr/lib/jvm/java-17-openjdk-amd64/bin/java", &cmdline)
}

#[test]
fn jetty_reads_accept_queue_size_from_start_ini_start_d_and_its_command_line() {
    let root = Root::new("jetty");
    root.file(
        "/srv/jetty/start.ini",
        "# jetty.http.acceptQueueSize=1\n--module=server\njetty.http.acceptQueueSize=100\n",
    )
    .file(
        "/srv/jetty/start.d/http.ini",
        "--module=http\njetty.http.port=8081\n\n  jetty.http.acceptQueueSize=300\n\
         jetty.http.acceptQueueSize = 5\n",
    )
    .file(
        "/srv/jetty/start.d/ssl.ini",
        "jetty.ssl.acceptQueueSize=400\n",
    );
    let base = ["-Djetty.home=/usr/share/jetty9", "-Djetty.base=/srv/jetty"];
    let jetty = jetty_process(&root, &base, &["jetty.state=/srv/jetty.state"]);
    // start.d comes after start.ini.
    let k = identify(&jetty, 8081).unwrap();
    assert_eq!(
        (k.program.as_str(), k.asks, k.source.as_str()),
        (
            "jetty",
            Asks::Backlog(300),
            "/srv/jetty/start.d/http.ini:4: jetty.http.acceptQueueSize=300"
        )
    );
    assert_eq!(identify(&jetty, 8443).unwrap().asks, Asks::Backlog(400));
    // Another connector's port: an XML file's own figure, not read.
    assert_eq!(identify(&jetty, 9000).unwrap().asks, Asks::Configured);
    // start.jar's arguments come last; `?=` sets only what nothing set.
    let flagged = jetty_process(
        &root,
        &base,
        &[
            "jetty.http.acceptQueueSize=700",
            "jetty.http.acceptQueueSize?=900",
        ],
    );
    let k = identify(&flagged, 8081).unwrap();
    assert_eq!(
        (k.asks, k.source.as_str()),
        (
            Asks::Backlog(700),
            "its command line: jetty.http.acceptQueueSize=700"
        )
    );
    let dashed = jetty_process(&root, &base, &["-Djetty.http.acceptQueueSize=800"]);
    assert_eq!(identify(&dashed, 8081).unwrap().asks, Asks::Backlog(800));
    // The JVM's own system property is what the start properties override...
    let jvm_property = [
        "-Djetty.http.acceptQueueSize=1000",
        "-Djetty.base=/srv/jetty",
    ];
    let overridden = jetty_process(&root, &jvm_property, &[]);
    assert_eq!(
        identify(&overridden, 8081).unwrap().asks,
        Asks::Backlog(300)
    );
    // ...and what holds where they set nothing; the deprecated name counts only there.
    root.file("/srv/bare/start.d/http.ini", "http.acceptQueueSize=222\n");
    let bare = [
        "-Djetty.http.acceptQueueSize=1000",
        "-Djetty.base=/srv/bare",
    ];
    let k = identify(&jetty_process(&root, &bare, &[]), 8080).unwrap();
    assert_eq!(
        (k.asks, k.source.as_str()),
        (
            Asks::Backlog(1000),
            "its command line: -Djetty.http.acceptQueueSize=1000"
        )
    );
    let k = identify(&jetty_process(&root, &bare[1..], &[]), 8080).unwrap();
    assert_eq!(
        (k.asks, k.source.as_str()),
        (
            Asks::Backlog(222),
            "/srv/bare/start.d/http.ini:1: http.acceptQueueSize=222"
        )
    );
    // 0 is the JDK's 50; unset, ServerConnector's 0 is too.
    let zero = jetty_process(&root, &base, &["jetty.http.acceptQueueSize=0"]);
    let k = identify(&zero, 8081).unwrap();
    assert_eq!(
        (k.asks, k.source.as_str()),
        (
            Asks::Backlog(50),
            "its command line: jetty.http.acceptQueueSize=0 (0 or less: the JDK's 50)"
        )
    );
    // Debian's service: jetty.base is jetty.home, whose start.ini sets the port only.
    root.file(
        "/usr/share/jetty9/start.ini",
        "--module=deploy,http\njetty.http.port=8080\n",
    );
    let debian = jetty_process(
        &root,
        &[
            "-Djava.awt.headless=true",
            "-Djetty.home=/usr/share/jetty9",
            "-Djetty.base=/usr/share/jetty9",
        ],
        &[
            "jetty.state=/var/lib/jetty9/jetty.state",
            "jetty-started.xml",
        ],
    );
    let k = identify(&debian, 8080).unwrap();
    assert_eq!(
        (k.program.as_str(), k.asks, k.source.as_str()),
        ("jetty", Asks::Backlog(50), "jetty's default")
    );
    // No jetty.base given: its working directory.
    let mut in_base = root.process(
        "/usr/lib/jvm/java-17-openjdk-amd64/bin/java",
        &["java", "-jar", "/opt/jetty/start.jar"],
    );
    in_base.cwd = root.0.join("srv/jetty");
    assert_eq!(identify(&in_base, 8081).unwrap().asks, Asks::Backlog(300));
    // The JVM start.jar forks with --exec runs XmlConfiguration on the properties it
    // resolved.
    root.file(
        "/tmp/start_1234.properties",
        "#start.jar properties\njetty.base=/srv/jetty\njetty.http.acceptQueueSize=512\n",
    );
    let forked = root.process(
        "/usr/lib/jvm/java-17-openjdk-amd64/bin/java",
        &[
            "/usr/bin/java",
            "-Xmx512m",
            "-Djetty.home=/usr/share/jetty9",
            "-cp",
            "/usr/share/jetty9/lib/jetty-xml-9.4.57.v20241219.jar",
            "org.eclipse.jetty.xml.XmlConfiguration",
            "/tmp/start_1234.properties",
            "/usr/share/jetty9/etc/jetty-http.xml",
        ],
    );
    let k = identify(&forked, 8080).unwrap();
    assert_eq!(
        (k.program.as_str(), k.asks, k.source.as_str()),
        (
            "jetty",
            Asks::Backlog(512),
            "/tmp/start_1234.properties:3: jetty.http.acceptQueueSize=512"
        )
    );
    // Another application's jar is not Jetty.
    let app = root.process(
        "/usr/lib/jvm/java-17-openjdk-amd64/bin/java",
        &["java", "-jar", "/srv/app.jar", "start.jar"],
    );
    assert_eq!(identify(&app, 8080).unwrap().program, "java");
}

#[test]
fn netty_is_a_jvm_with_netty_4_on_its_class_path_and_asks_for_somaxconn_at_start() {
    let root = Root::new("netty");
    let java = "/usr/lib/jvm/java-17-openjdk-amd64/bin/java";
    let debian = "/usr/share/java/netty-common.jar:/usr/share/java/netty-buffer.jar:\
                  /usr/share/java/netty-transport.jar:/srv/app";
    let server = root.process(java, &["java", "-Xss1m", "-cp", debian, "Serve", "8080"]);
    let k = identify(&server, 8080).unwrap();
    assert_eq!(
        (k.program.as_str(), k.asks, k.source.as_str()),
        (
            "netty",
            Asks::CodeSomaxconn,
            "/usr/share/java/netty-transport.jar on its class path: Netty's SO_BACKLOG \
             defaults to net.core.somaxconn as it was when the JVM loaded Netty, if its \
             code sets none"
        )
    );
    // --class-path=, and the all-in-one jar; the last class path given is the one.
    let all = root.process(
        java,
        &[
            "java",
            "-cp",
            "/srv/other.jar",
            "--class-path=/srv/lib/netty-all-4.1.48.Final.jar:/srv/app",
            "Serve",
        ],
    );
    assert_eq!(
        asks(&identify(&all, 8080)),
        Some(("netty", Asks::CodeSomaxconn))
    );
    // CLASSPATH from the environment, with a directory's every jar (`DIR/*`).
    root.file("/srv/lib/netty-transport-4.1.100.Final.jar", "")
        .file("/srv/lib/app.jar", "");
    let mut env = root.process(java, &["java", "Serve"]);
    env.classpath = Some("/srv/lib/*".to_owned()).into();
    let k = identify(&env, 8080).unwrap();
    assert_eq!(k.program, "netty");
    assert!(
        k.source
            .starts_with("/srv/lib/netty-transport-4.1.100.Final.jar on its class path"),
        "{}",
        k.source
    );
    // Not Netty 4: Netty 3 (its default backlog is the JDK's 50), a class path given
    // after the main class (the application's argument), CLASSPATH beside -cp, or an
    // embedded Tomcat beside Netty (the listener most likely Tomcat's).
    let mut not =
        vec![
        root.process(
            java,
            &["java", "-cp", "/srv/lib/netty-3.10.6.Final.jar", "Serve"],
        ),
        root.process(
            java,
            &["java", "-cp", "/srv/app", "Serve", "-cp", "netty-transport.jar"],
        ),
        root.process(
            java,
            &[
                "java",
                "-cp",
                "/srv/lib/tomcat-embed-core-10.1.20.jar:/srv/lib/netty-transport-4.1.100.Final.jar",
                "Main",
            ],
        ),
    ];
    let mut beside = root.process(java, &["java", "-cp", "/srv/app", "Serve"]);
    beside.classpath = Some("/srv/lib/*".to_owned()).into();
    not.push(beside);
    for p in &not {
        assert_eq!(
            asks(&identify(p, 8080)),
            Some(("java", Asks::CodeDefault(50))),
            "{:?}",
            p.cmdline
        );
    }
}

#[test]
fn java_asks_for_50_if_its_code_passes_none() {
    let root = Root::new("java");
    let jvm = root.process(
        "/usr/lib/jvm/java-17-openjdk-amd64/bin/java",
        &["java", "-jar", "app.jar"],
    );
    let k = identify(&jvm, 8080).unwrap();
    assert_eq!(
        (k.program.as_str(), k.asks, k.source.as_str()),
        (
            "java",
            Asks::CodeDefault(50),
            "java's default, if its code passes no backlog"
        )
    );
}
