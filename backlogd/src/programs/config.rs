//! Reading the backlog a server's own configuration sets, from its command line and the
//! files it names, through its root. Each reader understands only the lines that set a
//! backlog (and the includes that lead to them); anything it cannot follow leaves the
//! program's default in place, which the finding then says.

use super::{
    asks::Asks,
    process::{JvmMain, Process, jvm, netty_jar},
};

/// A figure a reader found, with where.
type Found = Option<(Asks, String)>;

/// A fixed figure found at `at`.
fn backlog(n: u32, at: String) -> Found {
    Some((Asks::Backlog(n), at))
}

/// The command line as words. Servers that retitle themselves (nginx's "nginx: master
/// process /usr/sbin/nginx -c FILE", redis) leave it as one string with spaces.
fn words(process: &Process) -> Vec<String> {
    match process.cmdline.as_slice() {
        [title] => title.split_whitespace().map(str::to_owned).collect(),
        args => args.to_vec(),
    }
}

/// The value of `-x N`, `-xN`, `--long=N` or `--long N` on a command line.
fn flag(cmdline: &[String], short: &str, long: &str) -> Option<u32> {
    let mut args = cmdline.iter().skip(1);
    while let Some(a) = args.next() {
        let value = if a == short || a == long {
            args.next().map(String::as_str)
        } else if let Some(v) = a.strip_prefix(&format!("{long}=")) {
            Some(v)
        } else if short.len() == 2 && a.starts_with(short) && !a.starts_with("--") {
            Some(&a[2..])
        } else {
            None
        };
        if let Some(v) = value.and_then(|v| v.parse().ok()) {
            return Some(v);
        }
    }
    None
}

/// The argument after `opt` on the command line.
fn arg_after<'a>(cmdline: &'a [String], opt: &str) -> Option<&'a str> {
    let i = cmdline.iter().position(|a| a == opt)?;
    cmdline.get(i + 1).map(String::as_str)
}

/// Lines of a configuration file and the files it includes (depth-limited), each with
/// `file:line` for evidence. `include` says whether a line includes others, returning
/// the glob it names.
fn lines_with_includes(
    process: &Process,
    path: &str,
    base: Option<&str>,
    include: &dyn Fn(&str) -> Option<String>,
) -> Vec<(String, String)> {
    fn walk(
        process: &Process,
        file: &str,
        text: &str,
        base: Option<&str>,
        include: &dyn Fn(&str) -> Option<String>,
        depth: usize,
        out: &mut Vec<(String, String)>,
    ) {
        for (n, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            match include(line) {
                Some(pattern) if depth < 8 => {
                    for (f, t) in process.glob(&pattern, base) {
                        walk(process, &f, &t, base, include, depth + 1, out);
                    }
                }
                _ => out.push((format!("{file}:{}", n + 1), line.to_owned())),
            }
        }
    }
    let mut out = Vec::new();
    if let Some(text) = process.read(path, base) {
        walk(process, path, &text, base, include, 0, &mut out);
    }
    out
}

/// Whether a `listen`/`bind` address (`8080`, `*:80`, `127.0.0.1:80`, `[::]:80`) is for
/// `port`.
fn addr_port_is(addr: &str, port: u16) -> bool {
    let p = addr.rsplit(':').next().unwrap_or(addr);
    p.parse() == Ok(port)
}

/// nginx: `listen ADDR[:PORT] ... backlog=N;` in nginx.conf (`-c`, else
/// /etc/nginx/nginx.conf) and what it includes; a `listen` for the port without
/// `backlog=` asks for the default.
pub fn nginx(process: &Process, port: u16) -> Found {
    let args = words(process);
    let conf = arg_after(&args, "-c").unwrap_or("/etc/nginx/nginx.conf");
    // Relative includes are relative to the directory of nginx.conf (its conf prefix).
    let prefix = conf
        .rsplit_once('/')
        .map(|(d, _)| d)
        .filter(|d| !d.is_empty());
    let include = |line: &str| {
        let rest = line.strip_prefix("include")?;
        rest.starts_with(char::is_whitespace)
            .then(|| rest.trim().trim_end_matches(';').trim().to_owned())
    };
    for (at, line) in lines_with_includes(process, conf, prefix, &include) {
        // Several directives (and blocks) may share a line.
        for statement in line.split([';', '{', '}']) {
            let mut words = statement.split_whitespace();
            if words.next() != Some("listen") {
                continue;
            }
            let Some(addr) = words.next() else { continue };
            if !addr_port_is(addr, port) {
                continue;
            }
            if let Some(n) = words.find_map(|w| w.strip_prefix("backlog=")?.parse().ok()) {
                return backlog(n, format!("{at}: {}", statement.trim()));
            }
        }
    }
    None
}

/// redis: `--tcp-backlog N` on the command line, else `tcp-backlog N` in the config file
/// it was started with (its first argument) and the files that includes.
pub fn redis(process: &Process, _port: u16) -> Found {
    let args = words(process);
    if let Some(n) = flag(&args, "--tcp-backlog", "--tcp-backlog") {
        return backlog(n, "its command line (--tcp-backlog)".to_owned());
    }
    let conf = args.get(1).filter(|a| !a.starts_with('-'))?;
    let include = |line: &str| Some(line.strip_prefix("include ")?.trim().to_owned());
    // The last setting wins: search from the end.
    lines_with_includes(process, conf, None, &include)
        .into_iter()
        .rev()
        .find_map(|(at, line)| {
            let n = line.strip_prefix("tcp-backlog")?.trim().parse().ok()?;
            backlog(n, format!("{at}: {line}"))
        })
}

/// Apache: `ListenBacklog N` in its configuration (`-f`, relative to the server root
/// `-d`, else Debian's /etc/apache2/apache2.conf) and what that includes.
pub fn apache(process: &Process, _port: u16) -> Found {
    let args = words(process);
    let root = arg_after(&args, "-d").unwrap_or("/etc/apache2");
    let conf = arg_after(&args, "-f").unwrap_or("apache2.conf");
    let include = |line: &str| {
        let mut words = line.split_whitespace();
        let keyword = words.next()?;
        (keyword.eq_ignore_ascii_case("Include") || keyword.eq_ignore_ascii_case("IncludeOptional"))
            .then(|| words.next().map(|w| w.trim_matches('"').to_owned()))
            .flatten()
    };
    lines_with_includes(process, conf, Some(root), &include)
        .into_iter()
        .rev()
        .find_map(|(at, line)| {
            let mut words = line.split_whitespace();
            if !words.next()?.eq_ignore_ascii_case("ListenBacklog") {
                return None;
            }
            backlog(words.next()?.parse().ok()?, format!("{at}: {line}"))
        })
}

/// HAProxy: what it passes to listen() for the section binding `port`: the `bind` line's
/// `backlog`, else the section's `backlog`, else the defaults', else the section's (or
/// the defaults') `maxconn`. Configuration from each `-f FILE`.
pub fn haproxy(process: &Process, port: u16) -> Found {
    haproxy_backlog(process, port).map(|(n, at)| (Asks::Backlog(n), at))
}

fn haproxy_backlog(process: &Process, port: u16) -> Option<(u32, String)> {
    #[derive(Default)]
    struct Section {
        binds_port: bool,
        bind_backlog: Option<(u32, String)>,
        backlog: Option<(u32, String)>,
        maxconn: Option<(u32, String)>,
    }
    let mut files = Vec::new();
    let args = words(process);
    let mut args = args.iter();
    while let Some(a) = args.next() {
        if a == "-f" {
            files.extend(args.next().cloned());
        }
    }
    let value = |words: &[&str], key: &str, at: &str, line: &str| {
        let i = words.iter().position(|w| *w == key)?;
        Some((words.get(i + 1)?.parse().ok()?, format!("{at}: {line}")))
    };
    let mut defaults = Section::default();
    for file in &files {
        let mut current: Option<Section> = None;
        let mut in_defaults = false;
        let finish = |s: Option<Section>, defaults: &Section| {
            let s = s.filter(|s| s.binds_port)?;
            s.bind_backlog
                .or(s.backlog)
                .or_else(|| defaults.backlog.clone())
                .or(s.maxconn)
                .or_else(|| defaults.maxconn.clone())
        };
        for (at, line) in lines_with_includes(process, file, None, &|_| None) {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words[0] {
                "frontend" | "listen" => {
                    if let Some(found) = finish(current.take(), &defaults) {
                        return Some(found);
                    }
                    current = Some(Section::default());
                    in_defaults = false;
                }
                "defaults" => {
                    if let Some(found) = finish(current.take(), &defaults) {
                        return Some(found);
                    }
                    defaults = Section::default();
                    in_defaults = true;
                }
                "global" | "backend" | "resolvers" | "peers" | "userlist" | "program"
                | "mailers" | "http-errors" | "ring" | "cache" => {
                    if let Some(found) = finish(current.take(), &defaults) {
                        return Some(found);
                    }
                    in_defaults = false;
                }
                "bind" => {
                    if let Some(s) = current.as_mut()
                        && words.get(1).is_some_and(|a| addr_port_is(a, port))
                    {
                        s.binds_port = true;
                        s.bind_backlog = value(&words, "backlog", &at, &line);
                    }
                }
                "backlog" | "maxconn" => {
                    let v = value(&words, words[0], &at, &line);
                    let target = if in_defaults {
                        Some(&mut defaults)
                    } else {
                        current.as_mut()
                    };
                    if let Some(t) = target {
                        if words[0] == "backlog" {
                            t.backlog = v;
                        } else {
                            t.maxconn = v;
                        }
                    }
                }
                _ => {}
            }
        }
        if let Some(found) = finish(current.take(), &defaults) {
            return Some(found);
        }
    }
    None
}

/// memcached: `-b N` / `--listen-backlog=N` on its command line.
pub fn memcached(process: &Process, _port: u16) -> Found {
    let n = flag(&words(process), "-b", "--listen-backlog")?;
    backlog(n, "its command line (-b)".to_owned())
}

/// Where the system manager finds unit files, highest precedence first
/// (systemd.unit(5), "System Unit Search Path"; /lib for hosts without merged /usr).
const SYSTEM_UNIT_DIRS: &[&str] = &[
    "/etc/systemd/system.control",
    "/run/systemd/system.control",
    "/run/systemd/transient",
    "/run/systemd/generator.early",
    "/etc/systemd/system",
    "/etc/systemd/system.attached",
    "/run/systemd/system",
    "/run/systemd/system.attached",
    "/run/systemd/generator",
    "/usr/local/lib/systemd/system",
    "/usr/lib/systemd/system",
    "/lib/systemd/system",
    "/run/systemd/generator.late",
];

/// systemd: `Backlog=` of the `.socket` unit whose `ListenStream=` is on `port`, from the
/// unit file the system manager uses (the first on its search path, through its root)
/// and its drop-ins (`NAME.socket.d/*.conf`, in file-name order, a name in a
/// higher-precedence directory hiding the same name lower down). A unit without
/// `Backlog=` asks for the most the kernel allows: the default. The user manager
/// (`systemd --user`) is not read.
pub fn systemd(process: &Process, port: u16) -> Found {
    if process.cmdline.iter().any(|a| a == "--user") {
        return None;
    }
    units_named(process, "*.socket")
        .into_iter()
        .find_map(|(name, path, text)| {
            let mut dropins = units_named(process, &format!("{name}.d/*.conf"));
            dropins.sort();
            let files =
                std::iter::once((path, text)).chain(dropins.into_iter().map(|(_, p, t)| (p, t)));
            socket_backlog(files, port)
        })
        .map(|(n, at)| (Asks::Backlog(n), at))
}

/// The files matching `pattern` (relative to a unit directory) on the system manager's
/// search path, the first of each file name only, as (file name, path, text): the one
/// systemd uses.
fn units_named(process: &Process, pattern: &str) -> Vec<(String, String, String)> {
    let mut found: Vec<(String, String, String)> = Vec::new();
    for dir in SYSTEM_UNIT_DIRS {
        for (path, text) in process.glob(&format!("{dir}/{pattern}"), None) {
            let name = path.rsplit('/').next().unwrap_or(&path).to_owned();
            if !found.iter().any(|(n, _, _)| *n == name) {
                found.push((name, path, text));
            }
        }
    }
    found
}

/// What a `.socket` unit's files (the unit, then its drop-ins) set: `Some` when a
/// `ListenStream=` of the `[Socket]` section is on `port` and `Backlog=` is set, with
/// where. An empty assignment resets either, as systemd does.
fn socket_backlog(
    files: impl Iterator<Item = (String, String)>,
    port: u16,
) -> Option<(u32, String)> {
    let mut listens: Vec<String> = Vec::new();
    let mut backlog: Option<(u32, String)> = None;
    for (path, text) in files {
        let mut section = "";
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.starts_with(['#', ';']) || line.is_empty() {
                continue;
            }
            if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                section = if name == "Socket" { "Socket" } else { "" };
                continue;
            }
            let Some((key, value)) = line.split_once('=') else {
                continue;
            };
            let value = value.trim();
            match (section, key.trim()) {
                ("Socket", "ListenStream") if value.is_empty() => listens.clear(),
                ("Socket", "ListenStream") => listens.push(value.to_owned()),
                ("Socket", "Backlog") if value.is_empty() => backlog = None,
                // systemd ignores an assignment it cannot parse.
                ("Socket", "Backlog") => {
                    if let Ok(b) = value.parse() {
                        backlog = Some((b, format!("{path}:{}: {line}", n + 1)));
                    }
                }
                _ => {}
            }
        }
    }
    // A path, an abstract name or a vsock address is not a TCP port.
    let on_port = listens
        .iter()
        .any(|l| !l.starts_with(['/', '@']) && !l.starts_with("vsock:") && addr_port_is(l, port));
    backlog.filter(|_| on_port)
}

/// Option-file groups mariadbd reads (`load_default_groups` in 10.11's
/// mysqld_default_groups.h), the versioned ones (`mysqld-10.11`) included.
fn mariadb_group(name: &str) -> bool {
    let versioned = |prefix: &str| {
        name.strip_prefix(prefix)
            .is_some_and(|v| !v.is_empty() && v.chars().all(|c| c.is_ascii_digit() || c == '.'))
    };
    [
        "mysqld",
        "server",
        "mariadb",
        "mariadbd",
        "client-server",
        "galera",
    ]
    .contains(&name)
        || ["mysqld-", "mariadb-", "mariadbd-"]
            .into_iter()
            .any(versioned)
}

/// An option's name as MariaDB compares them: `-` and `_` alike, a `loose-` prefix
/// dropped.
fn mariadb_option(name: &str) -> String {
    let name = name.trim().to_ascii_lowercase().replace('-', "_");
    name.strip_prefix("loose_")
        .map_or(name.clone(), str::to_owned)
}

/// A number as MariaDB's option parser reads it (`151`, `1K`).
fn mariadb_number(value: &str) -> Option<u32> {
    let value = value.trim().trim_matches(['"', '\'']);
    let (digits, unit) = match value.char_indices().last()? {
        (i, c) if c.is_ascii_alphabetic() => (&value[..i], c.to_ascii_lowercase()),
        _ => (value, ' '),
    };
    let n: u64 = digits.parse().ok()?;
    let scale = match unit {
        ' ' => 1,
        'k' => 1 << 10,
        'm' => 1 << 20,
        'g' => 1 << 30,
        _ => return None,
    };
    u32::try_from(n.checked_mul(scale)?).ok()
}

/// MariaDB: `back_log` from its option files (the groups mariadbd reads, through
/// `!include`/`!includedir`) and its command line, the command line last; unset (or 0),
/// mariadbd computes it from `max_connections` (10.11's mysqld.cc: min(900, 50 +
/// max_connections / 5)). Files: `--defaults-file` alone, else /etc/my.cnf,
/// /etc/mysql/my.cnf and `--defaults-extra-file`; none with `--no-defaults`.
/// (~/.my.cnf is not read.)
pub fn mariadb(process: &Process, _port: u16) -> Found {
    // (option, value, where), in the order mariadbd applies them.
    let mut settings: Vec<(String, String, String)> = Vec::new();
    let mut command_line = Vec::new();
    let (mut only, mut extra, mut none) = (None, None, false);
    let mut args = process.cmdline.iter().skip(1).peekable();
    while let Some(a) = args.next() {
        let Some(long) = a.strip_prefix("--") else {
            continue;
        };
        let (name, value) = match long.split_once('=') {
            Some((n, v)) => (mariadb_option(n), Some(v.to_owned())),
            None => (mariadb_option(long), None),
        };
        match name.as_str() {
            "no_defaults" => none = true,
            "defaults_file" => only = value,
            "defaults_extra_file" => extra = value,
            "back_log" | "max_connections" => {
                // Both take a required argument: `--back-log=N` or `--back-log N`.
                let value = value.or_else(|| args.next().cloned());
                if let Some(v) = value {
                    let at = format!("its command line (--{long})");
                    command_line.push((name, v, at));
                }
            }
            _ => {}
        }
    }
    let files: Vec<String> = match (none, only) {
        (true, _) => Vec::new(),
        (false, Some(file)) => vec![file],
        (false, None) => ["/etc/my.cnf", "/etc/mysql/my.cnf"]
            .map(str::to_owned)
            .into_iter()
            .chain(extra)
            .collect(),
    };
    let include = |line: &str| {
        if let Some(dir) = line.strip_prefix("!includedir") {
            Some(format!("{}/*.cnf", dir.trim()))
        } else {
            line.strip_prefix("!include").map(|f| f.trim().to_owned())
        }
    };
    for file in files {
        // Whether each file is in a group mariadbd reads: an included file starts
        // outside any group, and the file that included it carries on in its own.
        // `at` is `file:line`.
        let mut in_group: std::collections::HashMap<String, bool> = Default::default();
        for (at, line) in lines_with_includes(process, &file, None, &include) {
            let path = at
                .rsplit_once(':')
                .map_or(at.as_str(), |(f, _)| f)
                .to_owned();
            if line.starts_with(';') {
                continue;
            }
            if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                in_group.insert(path, mariadb_group(name.trim()));
                continue;
            }
            let read = in_group.get(&path).copied().unwrap_or(false);
            if let Some((name, value)) = line.split_once('=').filter(|_| read) {
                settings.push((
                    mariadb_option(name),
                    value.trim().to_owned(),
                    format!("{at}: {line}"),
                ));
            }
        }
    }
    settings.extend(command_line);
    let last = |option: &str| {
        settings
            .iter()
            .rev()
            .find(|(o, _, _)| o == option)
            .and_then(|(_, v, at)| Some((mariadb_number(v)?, at.clone())))
    };
    match last("back_log") {
        Some((n, at)) if n > 0 => backlog(n, at),
        _ => {
            let (connections, at) = last("max_connections")?;
            backlog(
                (50 + connections / 5).min(900),
                format!(
                    "back_log unset: min(900, 50 + max_connections/5) with max_connections \
                     {connections} ({at})"
                ),
            )
        }
    }
}

/// What PostgreSQL 15's postmaster passes to listen() (StreamServerPort in
/// src/backend/libpq/pqcomm.c): `2 * MaxBackends`, at most PG_SOMAXCONN (10000), where
/// MaxBackends = max_connections + autovacuum_max_workers + 1 (the launcher) +
/// max_worker_processes + max_wal_senders (InitializeMaxBackends, postinit.c). The
/// settings, with 15's defaults.
const POSTGRES_TERMS: [(&str, u32); 4] = [
    ("max_connections", 100),
    ("autovacuum_max_workers", 3),
    ("max_worker_processes", 8),
    ("max_wal_senders", 10),
];

/// Settings of a postgresql.conf (and what it includes) as (name, value, where).
fn postgres_file(process: &Process, file: &str) -> Vec<(String, String, String)> {
    let dir = file.rsplit_once('/').map(|(d, _)| d.to_owned());
    let quoted = |v: &str| v.trim().trim_matches('\'').to_owned();
    let include = |line: &str| {
        let (word, rest) = line.split_once(char::is_whitespace)?;
        match word {
            "include" | "include_if_exists" => Some(quoted(rest)),
            "include_dir" => Some(format!("{}/*.conf", quoted(rest))),
            _ => None,
        }
    };
    lines_with_includes(process, file, dir.as_deref(), &include)
        .into_iter()
        .filter_map(|(at, line)| {
            let (name, value) = match line.split_once('=') {
                Some((n, v)) => (n.trim(), v),
                None => line.split_once(char::is_whitespace)?,
            };
            Some((
                name.to_ascii_lowercase(),
                quoted(value),
                format!("{at}: {line}"),
            ))
        })
        .collect()
}

/// PostgreSQL: the postmaster's listen() backlog from the settings that make up
/// MaxBackends ([`POSTGRES_TERMS`]), read as the postmaster reads them: its
/// configuration file (`-c config_file=`, else postgresql.conf in the `-D` directory)
/// with its includes, then postgresql.auto.conf in the data directory (ALTER SYSTEM),
/// then the command line (`-c name=value`, `--name=value`, `-N` for max_connections).
/// PGDATA in its environment is not read.
pub fn postgres(process: &Process, _port: u16) -> Found {
    let mut command_line: Vec<(String, String, String)> = Vec::new();
    let mut dir = None;
    let mut args = process.cmdline.iter().skip(1);
    while let Some(a) = args.next() {
        let (setting, shown) = match a.as_str() {
            "-D" => {
                dir = args.next().cloned();
                continue;
            }
            "-N" | "-c" => {
                let Some(value) = args.next() else { break };
                let setting = if a == "-N" {
                    format!("max_connections={value}")
                } else {
                    value.clone()
                };
                (setting, format!("{a} {value}"))
            }
            _ => match a.strip_prefix("--") {
                Some(setting) => (setting.replace('-', "_"), a.clone()),
                None => continue,
            },
        };
        if let Some((name, value)) = setting.split_once('=') {
            let at = format!("its command line ({shown})");
            command_line.push((name.to_ascii_lowercase(), value.to_owned(), at));
        }
    }
    let given = |name: &str, from: &[(String, String, String)]| {
        from.iter()
            .rev()
            .find(|(n, _, _)| n == name)
            .map(|(_, v, _)| v.clone())
    };
    let conf = given("config_file", &command_line)
        .or_else(|| Some(format!("{}/postgresql.conf", dir.as_deref()?)));
    let mut settings = conf.map_or_else(Vec::new, |c| postgres_file(process, &c));
    // The data directory: the command line's or the file's data_directory, else -D.
    let data = given("data_directory", &command_line)
        .or_else(|| given("data_directory", &settings))
        .or(dir);
    if let Some(data) = data {
        settings.extend(postgres_file(
            process,
            &format!("{data}/postgresql.auto.conf"),
        ));
    }
    settings.extend(command_line);
    // (name, value, where it was set), the last setting of each winning.
    let terms: Vec<(&str, u32, Option<&str>)> = POSTGRES_TERMS
        .iter()
        .map(|&(name, default)| {
            let found = settings
                .iter()
                .rev()
                .find(|(n, _, _)| n == name)
                .and_then(|(_, v, at)| Some((v.parse().ok()?, at.as_str())));
            (
                name,
                found.map_or(default, |(v, _)| v),
                found.map(|(_, at)| at),
            )
        })
        .collect();
    let set: Vec<&str> = terms.iter().filter_map(|t| t.2).collect();
    if set.is_empty() {
        return None;
    }
    let backends = 1 + terms.iter().map(|t| t.1).sum::<u32>();
    let figures: Vec<String> = terms.iter().map(|(n, v, _)| format!("{n} {v}")).collect();
    backlog(
        backends.saturating_mul(2).min(10000),
        format!(
            "2 x ({} + 1), at most 10000; {}",
            figures.join(" + "),
            set.join("; ")
        ),
    )
}

/// The php-fpm.conf a PHP-FPM process was started with: the master's title
/// (`php-fpm: master process (FILE)`), `--fpm-config`/`-y`, or, for a worker (`php-fpm:
/// pool www`), its master's; else Debian's path for the executable's version, else
/// PHP's own default.
fn php_fpm_conf(process: &Process) -> String {
    let own = |p: &Process| {
        let title = p.cmdline.join(" ");
        if let Some((_, rest)) = title.split_once("master process (") {
            return rest.rsplit_once(')').map(|(f, _)| f.to_owned());
        }
        let args = words(p);
        arg_after(&args, "--fpm-config")
            .or_else(|| arg_after(&args, "-y"))
            .map(str::to_owned)
            .or_else(|| {
                args.iter()
                    .find_map(|a| a.strip_prefix("--fpm-config=").map(str::to_owned))
            })
    };
    let version = process.exe_name().and_then(|n| {
        let v = n.strip_prefix("php-fpm")?;
        (!v.is_empty()).then(|| format!("/etc/php/{v}/fpm/php-fpm.conf"))
    });
    own(process)
        .or_else(|| {
            let parent = process.parent()?;
            (parent.exe_name() == process.exe_name())
                .then(|| own(&parent))
                .flatten()
        })
        .or(version)
        .unwrap_or_else(|| "/usr/local/etc/php-fpm.conf".to_owned())
}

/// PHP-FPM: `listen.backlog` of the pool whose `listen` is on the port, in php-fpm.conf
/// and the pool files it includes (`include=`). A pool without it passes
/// FPM_BACKLOG_DEFAULT, -1 on Linux, as does `listen.backlog = -1`: the kernel gives a
/// negative backlog net.core.somaxconn.
pub fn php_fpm(process: &Process, port: u16) -> Found {
    #[derive(Default)]
    struct Pool {
        name: String,
        on_port: bool,
        backlog: Option<(i64, String)>,
    }
    let conf = php_fpm_conf(process);
    let include = |line: &str| {
        let (key, value) = line.split_once('=')?;
        (key.trim() == "include").then(|| value.trim().trim_matches('"').to_owned())
    };
    let mut pools: Vec<Pool> = Vec::new();
    for (at, line) in lines_with_includes(process, &conf, None, &include) {
        if line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            pools.push(Pool {
                name: name.trim().to_owned(),
                ..Pool::default()
            });
            continue;
        }
        let (Some(pool), Some((key, value))) = (pools.last_mut(), line.split_once('=')) else {
            continue;
        };
        let value = value.trim().trim_matches('"');
        match key.trim() {
            "listen" => pool.on_port = addr_port_is(value, port),
            "listen.backlog" => pool.backlog = value.parse().ok().map(|n| (n, at)),
            _ => {}
        }
    }
    let pool = pools
        .into_iter()
        .rev()
        .find(|p| p.on_port && p.name != "global")?;
    let (n, at) = pool.backlog?;
    let at = format!("{at}: listen.backlog = {n} (pool [{}])", pool.name);
    match u32::try_from(n) {
        Ok(n) => backlog(n, at),
        Err(_) => Some((Asks::Somaxconn, at)),
    }
}

/// gunicorn: `--backlog N` on its command line, else `backlog = N` in its configuration
/// file (`-c FILE`/`--config FILE`, else ./gunicorn.conf.py in its working directory).
/// GUNICORN_CMD_ARGS in its environment is not read.
pub fn gunicorn(process: &Process, _port: u16) -> Found {
    let args = words(process);
    if let Some(n) = flag(&args, "--backlog", "--backlog") {
        return backlog(n, "its command line (--backlog)".to_owned());
    }
    let conf = arg_after(&args, "-c")
        .or_else(|| arg_after(&args, "--config"))
        .or_else(|| args.iter().find_map(|a| a.strip_prefix("--config=")))
        .unwrap_or("gunicorn.conf.py");
    // `python:module` configurations are imported, not read here.
    let conf = conf.strip_prefix("file:").unwrap_or(conf);
    let text = process.read(conf, None)?;
    // A top-level assignment (not inside a function or a condition); the last one wins.
    let lines: Vec<&str> = text.lines().collect();
    lines.iter().enumerate().rev().find_map(|(n, line)| {
        let (name, value) = line.split('#').next()?.split_once('=')?;
        if name.trim_end() != "backlog" {
            return None;
        }
        backlog(
            value.trim().parse().ok()?,
            format!("{conf}:{}: {}", n + 1, line.trim()),
        )
    })
}

/// Python: what is known from the command line alone: `python -m http.server` (a
/// socketserver.TCPServer, whose request_queue_size is 5). Any other code's figure is
/// its own.
pub fn python(process: &Process, _port: u16) -> Found {
    let module = arg_after(&process.cmdline, "-m")?;
    (module == "http.server").then(|| {
        (
            Asks::Backlog(5),
            "python -m http.server: socketserver.TCPServer's request_queue_size".to_owned(),
        )
    })
}

/// The value of `name="..."` in an XML start tag's text.
fn xml_attribute<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
    let mut rest = tag;
    loop {
        let i = rest.find(name)?;
        let before = rest[..i].chars().last();
        rest = &rest[i + name.len()..];
        if before.is_some_and(char::is_whitespace)
            && let Some(v) = rest.trim_start().strip_prefix('=')
        {
            let v = v.trim_start();
            let quote = v.chars().next().filter(|c| *c == '"' || *c == '\'')?;
            return v[1..].split(quote).next();
        }
    }
}

/// Tomcat: `acceptCount` of the `<Connector>` on the port in conf/server.xml under
/// `-Dcatalina.base` (else `-Dcatalina.home`). Commented-out connectors (server.xml ships
/// several) are skipped. Tomcat passes it to bind() as the backlog (NioEndpoint.bind in
/// 10.1); 0 or less leaves its 100 (AbstractEndpoint.setAcceptCount). The attribute's
/// old name `backlog` is not read: Tomcat 9 renamed the property, and a `backlog="N"`
/// since sets nothing.
pub fn tomcat(process: &Process, port: u16) -> Found {
    let jvm = jvm(process)?;
    let base = jvm
        .property("catalina.base")
        .or_else(|| jvm.property("catalina.home"))?;
    let conf = format!("{base}/conf/server.xml");
    let mut text = process.read(&conf, None)?;
    // Blank out comments, keeping their newlines for the line numbers.
    while let Some(start) = text.find("<!--") {
        let end = text[start..]
            .find("-->")
            .map_or(text.len(), |e| start + e + 3);
        let blank: String = text[start..end]
            .chars()
            .map(|c| if c == '\n' { '\n' } else { ' ' })
            .collect();
        text.replace_range(start..end, &blank);
    }
    let mut from = 0;
    while let Some(i) = text[from..].find("<Connector") {
        let start = from + i;
        let end = text[start..].find('>').map_or(text.len(), |e| start + e);
        let tag = &text[start..end];
        from = end;
        if xml_attribute(tag, "port").and_then(|p| p.parse().ok()) != Some(port) {
            continue;
        }
        // The line the tag starts on (text before it may end mid-line: indentation).
        let line = text[..start].matches('\n').count() + 1;
        let n: u32 = xml_attribute(tag, "acceptCount")?.parse().ok()?;
        return (n > 0).then(|| {
            (
                Asks::Backlog(n),
                format!("{conf}:{line}: acceptCount=\"{n}\""),
            )
        });
    }
    None
}

/// The JDK's backlog for a bind() given 0 or less (ServerSocketChannelImpl.netBind:
/// `backlog < 1 ? 50 : backlog`), which is what Jetty's ServerConnector passes by default.
const JDK_BACKLOG: u32 = 50;

/// Jetty's properties as its XML files see them, each with where it was set, the last
/// setting winning.
type JettyProperties = std::collections::HashMap<String, (String, String)>;

/// One `name=value` line of Jetty's start configuration (a start.ini line, an argument
/// of start.jar's): `name?=value` sets only what nothing set before it (StartArgs'
/// processAndSetProperty); options (`--module=`) and XML files are not properties.
fn jetty_set(props: &mut JettyProperties, line: &str, at: String) {
    let setting = line.strip_prefix("-D").unwrap_or(line);
    if setting.starts_with('-') {
        return;
    }
    let Some((name, value)) = setting.split_once('=') else {
        return;
    };
    let (name, only_if_unset) = match name.strip_suffix('?') {
        Some(name) => (name, true),
        None => (name, false),
    };
    // `name+=value` appends to a list; no backlog setting is one.
    if name.ends_with('+') || (only_if_unset && props.contains_key(name)) {
        return;
    }
    // Jetty trims the line, not the name: `name = value` sets "name ", which no XML
    // file reads.
    props.insert(
        name.to_owned(),
        (value.trim().to_owned(), format!("{at}: {line}")),
    );
}

/// The lines of a start.ini-style file (StartIni: trimmed, `#` comments and blank lines
/// skipped) with `file:line`.
fn jetty_ini(process: &Process, file: &str, props: &mut JettyProperties) {
    let Some(text) = process.read(file, None) else {
        return;
    };
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if !line.is_empty() && !line.starts_with('#') {
            jetty_set(props, line, format!("{file}:{}", n + 1));
        }
    }
}

/// A Java properties file's `name=value` (or `name: value`) lines, `#`/`!` comments
/// skipped (line continuations and escapes are not read: no figure needs them).
fn jetty_properties_file(process: &Process, file: &str, props: &mut JettyProperties) {
    let Some(text) = process.read(file, None) else {
        return;
    };
    for (n, line) in text.lines().enumerate() {
        let line = line.trim_start();
        if line.starts_with(['#', '!']) {
            continue;
        }
        if let Some((name, value)) = line.split_once(['=', ':']) {
            props.insert(
                name.trim().to_owned(),
                (
                    value.trim().to_owned(),
                    format!("{file}:{}: {}", n + 1, line.trim_end()),
                ),
            );
        }
    }
}

/// The properties Jetty's XML files are configured with, in the order that makes the
/// last setting of a name the one Jetty uses: the JVM's own `-Dname=value` first (the
/// system properties XmlConfiguration.main starts from, which the start properties
/// override), then, for start.jar, `${jetty.base}/start.ini`, then
/// `${jetty.base}/start.d/*.ini` in name order (DirConfigSource), then start.jar's own
/// arguments (the command line source outweighs jetty.base's: StartArgs.parse applies
/// the sources from the lightest); for the JVM start.jar forked (`--exec`), the
/// properties file and `name=value` arguments it was given, in order.
/// `--include-jetty-dir` directories are not read.
fn jetty_properties(process: &Process) -> Option<JettyProperties> {
    let jvm = jvm(process)?;
    let mut props = JettyProperties::new();
    for o in &jvm.options {
        if o.starts_with("-D") {
            jetty_set(&mut props, o, "its command line".to_owned());
        }
    }
    let args = match jvm.main {
        JvmMain::Jar(_, args) => args,
        JvmMain::Class("org.eclipse.jetty.start.Main", args) => args,
        JvmMain::Class(_, args) => {
            for a in args {
                if a.ends_with(".properties") {
                    jetty_properties_file(process, a, &mut props);
                } else if a.contains('=') {
                    jetty_set(&mut props, a, "its command line".to_owned());
                }
            }
            return Some(props);
        }
        JvmMain::Other => return None,
    };
    // jetty.base: start.jar's argument, else the system property, else its working
    // directory (CommandLineConfigSource.findJettyBasePath).
    let base = args
        .iter()
        .rev()
        .find_map(|a| a.strip_prefix("jetty.base="))
        .or_else(|| {
            args.iter()
                .rev()
                .find_map(|a| a.strip_prefix("-Djetty.base="))
        })
        .or_else(|| jvm.property("jetty.base"))
        .unwrap_or(".");
    jetty_ini(process, &format!("{base}/start.ini"), &mut props);
    for name in process.list(&format!("{base}/start.d"), None) {
        if name.ends_with(".ini") {
            jetty_ini(process, &format!("{base}/start.d/{name}"), &mut props);
        }
    }
    for a in args {
        jetty_set(&mut props, a, "its command line".to_owned());
    }
    Some(props)
}

/// Jetty 9.4: the accept queue size of the ServerConnector on the port, as
/// etc/jetty-http.xml (`jetty.http.acceptQueueSize`, for `jetty.http.port`, 8080 unset)
/// and etc/jetty-ssl.xml (`jetty.ssl.acceptQueueSize`, for `jetty.ssl.port`, 8443) set
/// it from Jetty's properties ([`jetty_properties`]); each name's deprecated spelling
/// counts only where the name is set nowhere (XmlConfiguration's `<Property
/// deprecated=>`). ServerConnector binds with it, and 0 (the default) or less gets the
/// JDK's 50. A port neither connector is on is another XML file's connector: its figure
/// is not read.
pub fn jetty(process: &Process, port: u16) -> Found {
    let props = jetty_properties(process)?;
    let get = |name: &str, deprecated: &str| props.get(name).or_else(|| props.get(deprecated));
    let port_of = |name: &str, deprecated: &str, default: u16| -> Option<u16> {
        get(name, deprecated).map_or(Some(default), |(v, _)| v.parse().ok())
    };
    let (name, deprecated) = if port_of("jetty.http.port", "jetty.port", 8080) == Some(port) {
        ("jetty.http.acceptQueueSize", "http.acceptQueueSize")
    } else if port_of("jetty.ssl.port", "ssl.port", 8443) == Some(port) {
        ("jetty.ssl.acceptQueueSize", "ssl.acceptQueueSize")
    } else {
        return Some((
            Asks::Configured,
            format!("port {port} is neither jetty.http.port's nor jetty.ssl.port's"),
        ));
    };
    let (value, at) = get(name, deprecated)?;
    match value.parse::<i64>() {
        Ok(n) if n > 0 => Some((
            Asks::Backlog(u32::try_from(n).unwrap_or(u32::MAX)),
            at.clone(),
        )),
        Ok(_) => backlog(JDK_BACKLOG, format!("{at} (0 or less: the JDK's 50)")),
        // `${other.property}` and the like: Jetty's figure, not read here.
        Err(_) => Some((Asks::Configured, at.clone())),
    }
}

/// Netty 4: ServerBootstrap's channels ask for NetUtil.SOMAXCONN unless the code sets
/// SO_BACKLOG (DefaultServerSocketChannelConfig, EpollServerChannelConfig), and NetUtil
/// reads /proc/sys/net/core/somaxconn once, when the class loads (128 if it cannot).
pub fn netty(process: &Process, _port: u16) -> Found {
    let jvm = jvm(process)?;
    let jar = netty_jar(process, &jvm)?;
    Some((
        Asks::CodeSomaxconn,
        format!(
            "{jar} on its class path: Netty's SO_BACKLOG defaults to net.core.somaxconn as \
             it was when the JVM loaded Netty, if its code sets none"
        ),
    ))
}
