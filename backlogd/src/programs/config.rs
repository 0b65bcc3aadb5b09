//! Reading the backlog a server's own configuration sets, from its command line and the
//! files it names, through its root. Each reader understands only the lines that set a
//! backlog (and the includes that lead to them); anything it cannot follow leaves the
//! program's default in place, which the finding then says.

use super::process::Process;

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
pub fn nginx(process: &Process, port: u16) -> Option<(u32, String)> {
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
                return Some((n, format!("{at}: {}", statement.trim())));
            }
        }
    }
    None
}

/// redis: `--tcp-backlog N` on the command line, else `tcp-backlog N` in the config file
/// it was started with (its first argument) and the files that includes.
pub fn redis(process: &Process, _port: u16) -> Option<(u32, String)> {
    let args = words(process);
    if let Some(n) = flag(&args, "--tcp-backlog", "--tcp-backlog") {
        return Some((n, "its command line (--tcp-backlog)".to_owned()));
    }
    let conf = args.get(1).filter(|a| !a.starts_with('-'))?;
    let include = |line: &str| Some(line.strip_prefix("include ")?.trim().to_owned());
    // The last setting wins: search from the end.
    lines_with_includes(process, conf, None, &include)
        .into_iter()
        .rev()
        .find_map(|(at, line)| {
            let n = line.strip_prefix("tcp-backlog")?.trim().parse().ok()?;
            Some((n, format!("{at}: {line}")))
        })
}

/// Apache: `ListenBacklog N` in its configuration (`-f`, relative to the server root
/// `-d`, else Debian's /etc/apache2/apache2.conf) and what that includes.
pub fn apache(process: &Process, _port: u16) -> Option<(u32, String)> {
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
            Some((words.next()?.parse().ok()?, format!("{at}: {line}")))
        })
}

/// HAProxy: what it passes to listen() for the section binding `port`: the `bind` line's
/// `backlog`, else the section's `backlog`, else the defaults', else the section's (or
/// the defaults') `maxconn`. Configuration from each `-f FILE`.
pub fn haproxy(process: &Process, port: u16) -> Option<(u32, String)> {
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
pub fn memcached(process: &Process, _port: u16) -> Option<(u32, String)> {
    flag(&words(process), "-b", "--listen-backlog").map(|n| (n, "its command line (-b)".to_owned()))
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
pub fn systemd(process: &Process, port: u16) -> Option<(u32, String)> {
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
