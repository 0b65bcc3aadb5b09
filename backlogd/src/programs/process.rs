//! A process as /proc shows it: enough to tell which program it is and to read its
//! configuration files through its own root (a container's files, not the host's).

use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Default)]
pub struct Process {
    pub pid: u32,
    pub comm: String,
    /// Target of `/proc/PID/exe` (may end in " (deleted)" after an upgrade).
    pub exe: Option<PathBuf>,
    pub cmdline: Vec<String>,
    /// Where the process's `/` and working directory are, as seen from here
    /// (`/proc/PID/root`, `/proc/PID/cwd`); tests point them at a directory.
    pub root: PathBuf,
    pub cwd: PathBuf,
    /// [`Self::is_go`], once asked: it parses the executable's ELF headers, and a process
    /// can own thousands of listeners.
    pub go: std::sync::OnceLock<bool>,
    /// CLASSPATH from its environment, once asked ([`Self::classpath_env`]): the only
    /// variable kept, since an environment holds secrets.
    pub classpath: std::sync::OnceLock<Option<String>>,
}

impl Process {
    /// Reads what /proc says about `pid`; None once it has exited.
    pub fn of(pid: u32) -> Option<Self> {
        let dir = PathBuf::from(format!("/proc/{pid}"));
        let comm = std::fs::read_to_string(dir.join("comm")).ok()?;
        let cmdline = std::fs::read(dir.join("cmdline")).unwrap_or_default();
        Some(Self {
            pid,
            comm: comm.trim_end().to_owned(),
            exe: std::fs::read_link(dir.join("exe")).ok(),
            cmdline: cmdline
                .split(|&b| b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect(),
            root: dir.join("root"),
            cwd: dir.join("cwd"),
            go: std::sync::OnceLock::new(),
            classpath: std::sync::OnceLock::new(),
        })
    }

    /// File name of the executable, without a " (deleted)" suffix.
    pub fn exe_name(&self) -> Option<String> {
        let name = self.exe.as_ref()?.file_name()?.to_str()?;
        Some(name.strip_suffix(" (deleted)").unwrap_or(name).to_owned())
    }

    /// A path the process names, as this process can open it: absolute paths under its
    /// root, relative ones under `base` (itself a path in the process's view, or its
    /// working directory when None).
    pub fn resolve(&self, path: &str, base: Option<&str>) -> PathBuf {
        let inside = |p: &str| self.root.join(p.trim_start_matches('/'));
        if path.starts_with('/') {
            inside(path)
        } else {
            match base {
                Some(base) => inside(base).join(path),
                None => self.cwd.join(path),
            }
        }
    }

    /// A file the process names (see [`Process::resolve`]), as text.
    pub fn read(&self, path: &str, base: Option<&str>) -> Option<String> {
        read_config(&self.resolve(path, base))
    }

    /// The files a glob the process names (`conf.d/*.conf`, as nginx and apache include
    /// them) matches, in name order, with their paths in the process's view.
    pub fn glob(&self, pattern: &str, base: Option<&str>) -> Vec<(String, String)> {
        let full = self.resolve(pattern, base);
        let Some(prefix) = self.root.to_str() else {
            return Vec::new();
        };
        let Ok(paths) = glob::glob(&full.to_string_lossy()) else {
            return Vec::new();
        };
        let mut out: Vec<(String, String)> = paths
            .flatten()
            .filter_map(|p| {
                let text = read_config(&p)?;
                let shown = p
                    .to_str()?
                    .strip_prefix(prefix)
                    .map_or_else(|| p.display().to_string(), str::to_owned);
                Some((shown, text))
            })
            .collect();
        out.sort();
        out
    }

    /// The names of the files in a directory the process names (see
    /// [`Process::resolve`]), sorted; empty when it cannot be read.
    pub fn list(&self, dir: &str, base: Option<&str>) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(self.resolve(dir, base)) else {
            return Vec::new();
        };
        let mut names: Vec<String> = entries
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        names.sort();
        names
    }

    /// CLASSPATH in the environment it was started with (`/proc/PID/environ`); None in
    /// tests (pid 0) unless set there.
    pub fn classpath_env(&self) -> Option<&str> {
        self.classpath
            .get_or_init(|| {
                if self.pid == 0 {
                    return None;
                }
                let path = PathBuf::from(format!("/proc/{}/environ", self.pid));
                let environ = read_limited(&path)?;
                environ
                    .split(|&b| b == 0)
                    .find_map(|v| v.strip_prefix(b"CLASSPATH="))
                    .map(|v| String::from_utf8_lossy(v).into_owned())
            })
            .as_deref()
    }

    /// The process that started this one (PHP-FPM's master, for a worker holding the
    /// pool's socket); None in tests (pid 0) and once it is gone.
    pub fn parent(&self) -> Option<Self> {
        if self.pid == 0 {
            return None;
        }
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)).ok()?;
        // "PID (comm) STATE PPID ...": comm may hold spaces and parentheses.
        let after = stat.rsplit_once(')')?.1;
        let ppid = after.split_whitespace().nth(1)?.parse().ok()?;
        (ppid > 1).then(|| Self::of(ppid)).flatten()
    }

    /// Whether the executable is a Go program: Go's linker always writes a
    /// `.go.buildinfo` section (since Go 1.13), stripped binaries included.
    pub fn is_go(&self) -> bool {
        *self.go.get_or_init(|| self.read_is_go())
    }

    fn read_is_go(&self) -> bool {
        self.exe.as_deref().is_some_and(|exe| {
            // Read through /proc/PID/exe: the path may be another mount namespace's.
            let path = if self.pid == 0 {
                exe.to_path_buf()
            } else {
                PathBuf::from(format!("/proc/{}/exe", self.pid))
            };
            has_go_buildinfo(&path)
        })
    }
}

/// Largest configuration file read: any process can name any file on its command line
/// (`-c /dev/zero`), so only regular files, and only this much of them.
const CONFIG_LIMIT: u64 = 1 << 20;

/// A regular file of at most [`CONFIG_LIMIT`] bytes, as text.
fn read_config(path: &Path) -> Option<String> {
    use std::io::Read as _;
    let file = std::fs::File::open(path).ok()?;
    let meta = file.metadata().ok()?;
    if !meta.is_file() || meta.len() > CONFIG_LIMIT {
        return None;
    }
    let mut text = String::new();
    file.take(CONFIG_LIMIT).read_to_string(&mut text).ok()?;
    Some(text)
}

/// At most [`CONFIG_LIMIT`] bytes of a file that need not be regular (`/proc` files
/// report a size of 0).
fn read_limited(path: &Path) -> Option<Vec<u8>> {
    use std::io::Read as _;
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .ok()?
        .take(CONFIG_LIMIT)
        .read_to_end(&mut bytes)
        .ok()?;
    Some(bytes)
}

/// Whether the ELF file at `path` has a `.go.buildinfo` section. Reads the headers only.
pub fn has_go_buildinfo(path: &Path) -> bool {
    use object::{Object as _, ObjectSection as _, read::ReadCache};
    let Ok(file) = std::fs::File::open(path) else {
        return false;
    };
    let cache = ReadCache::new(file);
    let Ok(elf) = object::File::parse(&cache) else {
        return false;
    };
    elf.sections()
        .any(|s| s.name().is_ok_and(|n| n == ".go.buildinfo"))
}

/// Whether `name` is `stem` followed by a version (`python3.11`, `php-fpm8.2`) or nothing.
fn versioned(name: &str, stem: &str) -> bool {
    name.strip_prefix(stem)
        .is_some_and(|v| v.chars().all(|c| c.is_ascii_digit() || c == '.'))
}

/// A Python interpreter: `python`, `python3`, `python3.11`.
pub fn is_python(process: &Process) -> bool {
    process.exe_name().is_some_and(|n| versioned(&n, "python"))
}

/// PHP-FPM under its versioned name (Debian's `php-fpm8.2`).
pub fn is_php_fpm(process: &Process) -> bool {
    process.exe_name().is_some_and(|n| versioned(&n, "php-fpm"))
}

/// gunicorn run by its interpreter: `python3 -m gunicorn`, `python3 /usr/bin/gunicorn`,
/// or retitled by setproctitle (`gunicorn: master [app]`).
pub fn is_gunicorn(process: &Process) -> bool {
    let script = |a: &String| a.rsplit('/').next() == Some("gunicorn");
    match process.cmdline.as_slice() {
        [title] => title.starts_with("gunicorn:"),
        [_, rest @ ..] if is_python(process) => {
            rest.iter()
                .zip(rest.iter().skip(1))
                .any(|(a, b)| a == "-m" && b == "gunicorn")
                || rest.first().is_some_and(script)
        }
        _ => false,
    }
}

/// What a `java` command line runs, after its options.
#[derive(Debug, PartialEq, Eq)]
pub enum JvmMain<'a> {
    /// A main class, and the arguments it is given.
    Class(&'a str, &'a [String]),
    /// `-jar FILE`, and the arguments its main class is given.
    Jar(&'a str, &'a [String]),
    /// A module (`-m`), a source file (the source launcher), or nothing found.
    Other,
}

/// A JVM's command line split as the `java` launcher reads it: its options (the class
/// path, `-Dname=value` system properties) and what it runs.
#[derive(Debug)]
pub struct Jvm<'a> {
    pub options: Vec<&'a str>,
    pub main: JvmMain<'a>,
}

/// The launcher's options that take the next argument as their value (`java --help`);
/// an option's value is never the main class.
const JVM_OPTIONS_WITH_VALUE: &[&str] = &[
    "-cp",
    "-classpath",
    "--class-path",
    "-p",
    "--module-path",
    "--upgrade-module-path",
    "--add-modules",
    "--enable-native-access",
    "--limit-modules",
    "--add-reads",
    "--add-exports",
    "--add-opens",
    "--patch-module",
    "--source",
];

/// The JVM `process` is, if its executable is `java`.
pub fn jvm(process: &Process) -> Option<Jvm<'_>> {
    if process.exe_name().as_deref() != Some("java") {
        return None;
    }
    let args = process.cmdline.get(1..).unwrap_or_default();
    let mut options = Vec::new();
    let mut i = 0;
    while let Some(a) = args.get(i) {
        let rest = args.get(i + 1..).unwrap_or_default();
        let main = match a.as_str() {
            "-jar" => match rest.split_first() {
                Some((jar, after)) => JvmMain::Jar(jar, after),
                None => JvmMain::Other,
            },
            "-m" | "--module" => JvmMain::Other,
            a if a.starts_with("--module=") => JvmMain::Other,
            a if a.starts_with('-') => {
                options.push(a);
                if JVM_OPTIONS_WITH_VALUE.contains(&a) {
                    options.extend(rest.first().map(String::as_str));
                    i += 1;
                }
                i += 1;
                continue;
            }
            // The source launcher runs a file, not a class.
            a if a.ends_with(".java") => JvmMain::Other,
            class => JvmMain::Class(class, rest),
        };
        return Some(Jvm { options, main });
    }
    Some(Jvm {
        options,
        main: JvmMain::Other,
    })
}

impl<'a> Jvm<'a> {
    /// The value of the system property `name` (`-Dname=value`); the launcher keeps the
    /// last.
    pub fn property(&self, name: &str) -> Option<&'a str> {
        self.options
            .iter()
            .rev()
            .find_map(|o| o.strip_prefix("-D")?.strip_prefix(name)?.strip_prefix('='))
    }

    /// Whether it runs the main class `class`.
    pub fn runs(&self, class: &str) -> bool {
        matches!(self.main, JvmMain::Class(c, _) if c == class)
    }

    /// Its class path as the launcher takes it: the last `-cp`/`-classpath`/
    /// `--class-path`, else CLASSPATH from its environment; with `-jar`, the jar alone
    /// (its manifest's Class-Path is not read).
    pub fn classpath(&self, process: &Process) -> Vec<String> {
        if let JvmMain::Jar(jar, _) = self.main {
            return vec![jar.to_owned()];
        }
        let mut given = None;
        let mut options = self.options.iter();
        while let Some(o) = options.next() {
            if matches!(*o, "-cp" | "-classpath" | "--class-path") {
                given = options.next().copied();
            } else if let Some(v) = o.strip_prefix("--class-path=") {
                given = Some(v);
            }
        }
        let path = given.or_else(|| process.classpath_env()).unwrap_or("");
        path.split(':')
            .filter(|e| !e.is_empty())
            .map(str::to_owned)
            .collect()
    }
}

/// Tomcat: a JVM whose main class is Tomcat's bootstrap (catalina.sh and the Debian unit
/// both start it so).
pub fn is_tomcat(process: &Process) -> bool {
    jvm(process).is_some_and(|j| j.runs("org.apache.catalina.startup.Bootstrap"))
}

/// Jetty from its distribution: `java -jar .../start.jar` (Debian's jetty.sh, Jetty's
/// own documentation), its main class run directly, or the JVM start.jar forks with
/// `--exec` (which runs XmlConfiguration on the properties and XML files it resolved).
pub fn is_jetty(process: &Process) -> bool {
    jvm(process).is_some_and(|j| match j.main {
        JvmMain::Jar(jar, _) => jar.rsplit('/').next() == Some("start.jar"),
        JvmMain::Class(c, _) => {
            c == "org.eclipse.jetty.start.Main" || c == "org.eclipse.jetty.xml.XmlConfiguration"
        }
        JvmMain::Other => false,
    })
}

/// The Netty 4 jar on a JVM's class path, if any: `netty-transport*.jar` (where
/// ServerBootstrap and its SO_BACKLOG default live) or the all-in-one `netty-all*.jar`,
/// named on the class path or found in a `DIR/*` entry. Netty 3's `netty-3.x.jar` (whose
/// default backlog is 0, the JDK's 50) is not one.
pub fn netty_jar(process: &Process, jvm: &Jvm<'_>) -> Option<String> {
    let netty = |name: &str| {
        (name.starts_with("netty-transport") || name.starts_with("netty-all"))
            && name.ends_with(".jar")
    };
    jvm.classpath(process).into_iter().find_map(|entry| {
        // `DIR/*` is every jar in DIR (`*` alone: the working directory's).
        let dir = match entry.strip_suffix("/*") {
            Some(dir) => Some(dir.to_owned()),
            None => (entry == "*").then(|| ".".to_owned()),
        };
        match dir {
            Some(dir) => {
                let found = process.list(&dir, None).into_iter().find(|n| netty(n))?;
                Some(format!("{dir}/{found}"))
            }
            None => netty(entry.rsplit('/').next().unwrap_or(&entry)).then_some(entry),
        }
    })
}

/// Servers of their own that a class path may carry beside Netty (a Spring Boot
/// application with an embedded Tomcat and a Netty-based client library): the listener
/// is then most likely theirs, and its figure not Netty's.
const OTHER_SERVERS: &[&str] = &["tomcat-embed-core", "jetty-server", "undertow-core"];

/// A Netty server: a JVM with Netty 4 on its class path ([`netty_jar`]) and no other
/// server library ([`OTHER_SERVERS`]).
pub fn is_netty(process: &Process) -> bool {
    jvm(process).is_some_and(|j| {
        netty_jar(process, &j).is_some()
            && !j.classpath(process).iter().any(|e| {
                let name = e.rsplit('/').next().unwrap_or(e);
                OTHER_SERVERS.iter().any(|s| name.starts_with(s))
            })
    })
}
