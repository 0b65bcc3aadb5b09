//! Names a container's runtime left with its per-container monitor process, read through
//! /proc with no API: the annotations of its OCI bundle (containerd's CRI plugin and CRI-O
//! write the Kubernetes names of a pod's container into the bundle's config.json:
//! `io.kubernetes.cri.sandbox-name`, `io.kubernetes.pod.name`, ...; nerdctl its `--name`),
//! the same names their gRPC APIs give, so backlogd needs no gRPC client and no socket
//! mount; and podman's container name, on its `conmon`'s command line.
//!
//! The monitor is an ancestor of the container's process (the process reparents to it).
//! containerd's `containerd-shim-runc-v2` runs in the bundle directory of the first
//! container it was started for (a pod's sandbox, when containerd groups a pod's
//! containers under one shim); the others' bundles are its siblings, named by container
//! id. CRI-O's (and podman's) `conmon` is given the bundle with `-b`, the container's id
//! with `-c` and, by podman, its name with `-n`. Paths are opened through `/proc/PID/cwd`
//! and `/proc/PID/root`, so a daemon in a container with the host's PID namespace reads
//! the host's files.

use std::{collections::HashMap, path::PathBuf};

use serde::Deserialize;

use super::cgroup::RuntimeNames;

/// Ancestors walked up from the container's process (container init, a shell, the server:
/// a few levels; the monitor is the first ancestor outside the container).
const MAX_DEPTH: usize = 16;

/// The names in the bundle of container `id`, whose process `pid` is; None where no
/// monitor or bundle is found.
pub fn names(pid: u32, id: &str) -> Option<RuntimeNames> {
    let (runtime, config) = config_path(pid, id)?;
    let text = std::fs::read(&config).ok()?;
    let spec: Spec = serde_json::from_slice(&text).ok()?;
    Some(RuntimeNames {
        runtime: Some(runtime.to_owned()),
        ..from_annotations(&spec.annotations.unwrap_or_default())
    })
}

#[derive(Deserialize)]
struct Spec {
    annotations: Option<HashMap<String, String>>,
}

/// The runtime the monitor belongs to, and the bundle's config.json.
fn config_path(pid: u32, id: &str) -> Option<(&'static str, PathBuf)> {
    match monitor(pid)? {
        Monitor::Shim(p) => {
            let config = PathBuf::from(format!("/proc/{p}/cwd/../{id}/config.json"));
            Some(("containerd", config))
        }
        Monitor::Conmon(p) => {
            let cmdline = std::fs::read(format!("/proc/{p}/cmdline")).ok()?;
            let bundle = flag_value(&cmdline, &["-b", "--bundle"])?;
            let relative = bundle.trim_start_matches('/');
            // podman's containers are named by its API or `podman_names`; under a kubelet
            // (the path's runtime says `cri`), a conmon is CRI-O's.
            let config = PathBuf::from(format!("/proc/{p}/root/{relative}/config.json"));
            Some(("cri-o", config))
        }
    }
}

/// podman's name for container `id`, whose process `pid` is, from the command line
/// podman gave its `conmon` (libpod's `sharedConmonArgs`: `-c ID -u ID ... -n NAME`, in
/// podman 4 and 5 alike). Why not libpod's own storage: the name is in its database
/// (`libpod/bolt_state.db`, or the SQLite `db.sql` podman 5 defaults to), whose schema is
/// internal and which lives in each user's own store for rootless podman, and not in the
/// bundle's config.json; the monitor's argv is one small read through /proc that works
/// the same for root and rootless containers. It misses what only the API has: labels
/// (the `io.kubernetes.*` ones naming a pod), and a name changed by `podman rename` after
/// the container started (its conmon keeps the old one). None unless the nearest monitor
/// is a conmon for `id`.
pub fn podman_names(pid: u32, id: &str) -> Option<RuntimeNames> {
    let Monitor::Conmon(p) = monitor(pid)? else {
        return None;
    };
    let cmdline = std::fs::read(format!("/proc/{p}/cmdline")).ok()?;
    conmon_names(&cmdline, id)
}

/// The name on a conmon command line whose container id (`-c`) is `id`.
fn conmon_names(cmdline: &[u8], id: &str) -> Option<RuntimeNames> {
    if flag_value(cmdline, &["-c", "--cid"])? != id {
        return None;
    }
    let name = flag_value(cmdline, &["-n", "--name"]).filter(|n| !n.is_empty())?;
    Some(RuntimeNames {
        container: Some(name),
        ..RuntimeNames::default()
    })
}

/// A runtime's per-container monitor process, by pid.
enum Monitor {
    /// `containerd-shim*`: containerd (CRI, nerdctl, docker's `moby` namespace).
    Shim(u32),
    /// `conmon`: podman and CRI-O.
    Conmon(u32),
}

/// The first monitor among `pid`'s ancestors (itself included).
fn monitor(pid: u32) -> Option<Monitor> {
    let mut p = pid;
    for _ in 0..MAX_DEPTH {
        let (comm, ppid) = comm_and_ppid(p)?;
        // comm is cut at 15 bytes: `containerd-shim-runc-v2` reads `containerd-shim`.
        if comm.starts_with("containerd-shim") {
            return Some(Monitor::Shim(p));
        }
        if comm == "conmon" {
            return Some(Monitor::Conmon(p));
        }
        if ppid <= 1 {
            return None;
        }
        p = ppid;
    }
    None
}

/// comm and ppid from `/proc/PID/stat` (comm may hold spaces and parentheses: it ends at
/// the last `)`).
fn comm_and_ppid(pid: u32) -> Option<(String, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat.get(open + 1..close)?.to_owned();
    let ppid = stat.get(close + 2..)?.split(' ').nth(1)?.parse().ok()?;
    Some((comm, ppid))
}

/// The value of the option named any of `names` (`-b X`, `--bundle X` or `--bundle=X`)
/// in a NUL-separated command line; the first one, which for conmon comes before the
/// free-form `--exit-command-arg` values.
fn flag_value(cmdline: &[u8], names: &[&str]) -> Option<String> {
    let args: Vec<&str> = cmdline
        .split(|&b| b == 0)
        .filter_map(|a| std::str::from_utf8(a).ok())
        .collect();
    args.iter().enumerate().find_map(|(i, a)| {
        if names.contains(a) {
            return args.get(i + 1).map(|v| (*v).to_owned());
        }
        let (flag, value) = a.split_once('=')?;
        (flag.starts_with("--") && names.contains(&flag)).then(|| value.to_owned())
    })
}

/// containerd CRI's keys, then CRI-O's (the kubelet's label names), then nerdctl's.
fn from_annotations(a: &HashMap<String, String>) -> RuntimeNames {
    let first = |keys: &[&str]| {
        keys.iter()
            .find_map(|k| a.get(*k).filter(|v| !v.is_empty()).cloned())
    };
    RuntimeNames {
        runtime: None,
        container: first(&[
            "io.kubernetes.cri.container-name",
            "io.kubernetes.container.name",
            "nerdctl/name",
        ]),
        pod_name: first(&["io.kubernetes.cri.sandbox-name", "io.kubernetes.pod.name"]),
        pod_namespace: first(&[
            "io.kubernetes.cri.sandbox-namespace",
            "io.kubernetes.pod.namespace",
        ]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubernetes_names_from_each_runtimes_annotations() {
        let map = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        let containerd = map(&[
            ("io.kubernetes.cri.container-type", "container"),
            ("io.kubernetes.cri.container-name", "listener"),
            ("io.kubernetes.cri.sandbox-name", "web-0"),
            ("io.kubernetes.cri.sandbox-namespace", "shop"),
        ]);
        let crio = map(&[
            ("io.kubernetes.container.name", "listener"),
            ("io.kubernetes.pod.name", "web-0"),
            ("io.kubernetes.pod.namespace", "shop"),
        ]);
        let want = RuntimeNames {
            runtime: None,
            container: Some("listener".into()),
            pod_name: Some("web-0".into()),
            pod_namespace: Some("shop".into()),
        };
        assert_eq!(from_annotations(&containerd), want);
        assert_eq!(from_annotations(&crio), want);
        let nerdctl = map(&[("nerdctl/name", "cache")]);
        assert_eq!(
            from_annotations(&nerdctl).container.as_deref(),
            Some("cache")
        );
        assert_eq!(from_annotations(&HashMap::new()), RuntimeNames::default());
    }

    #[test]
    fn the_bundle_flag_of_a_monitor() {
        let cmdline = b"/usr/bin/conmon\0--api-version\x001\0-c\0abc\0-b\0/run/x/userdata\0";
        let bundle = ["-b", "--bundle"];
        assert_eq!(
            flag_value(cmdline, &bundle).as_deref(),
            Some("/run/x/userdata")
        );
        let long = b"conmon\0--bundle=/var/b\0";
        assert_eq!(flag_value(long, &bundle).as_deref(), Some("/var/b"));
        assert_eq!(flag_value(b"conmon\0-c\0x\0", &bundle), None);
    }

    /// podman 4.3's conmon, as `ps` shows it (shortened), and a conmon of another container.
    #[test]
    fn podman_names_a_container_on_its_conmons_command_line() {
        let id = "8982f49171cd1ce0e3d7e3823fb65a7118bfdfedd08b5a016b63c8de24ac5057";
        let cmdline = format!(
            "/usr/bin/conmon\0--api-version\x001\0-c\0{id}\0-u\0{id}\0-r\0/usr/bin/runc\0\
             -b\0/var/lib/containers/storage/overlay-containers/{id}/userdata\0-n\0web\0\
             --exit-dir\0/run/libpod/exits\0--full-attach\0--exit-command\0/usr/bin/podman\0\
             --exit-command-arg\0--root\0--exit-command-arg\0-n\0"
        );
        let named = conmon_names(cmdline.as_bytes(), id).expect("a name");
        assert_eq!(named.container.as_deref(), Some("web"));
        assert_eq!((named.runtime, named.pod_name), (None, None));
        assert_eq!(conmon_names(cmdline.as_bytes(), "0123"), None);
        let long = format!("conmon\0--cid={id}\0--name=db\0");
        assert_eq!(
            conmon_names(long.as_bytes(), id)
                .and_then(|n| n.container)
                .as_deref(),
            Some("db")
        );
        assert_eq!(
            conmon_names(format!("conmon\0-c\0{id}\0").as_bytes(), id),
            None
        );
    }

    #[test]
    fn comm_with_spaces_and_parentheses_is_read_to_the_last_parenthesis() {
        let (comm, ppid) = comm_and_ppid(std::process::id()).expect("our own stat");
        assert!(!comm.is_empty());
        assert!(ppid > 0);
    }
}
