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
            here.contains(&format!("fn {}_", p.id)),
            "no test for the {} row",
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
