//! Names a container's OCI bundle holds. containerd's CRI plugin and CRI-O write the
//! Kubernetes names of a pod's container into the annotations of the bundle's config.json
//! (`io.kubernetes.cri.sandbox-name`, `io.kubernetes.pod.name`, ...), and nerdctl its
//! `--name`: the same names their gRPC APIs give, read from a file instead, so backlogd
//! needs no gRPC client and no socket mount.
//!
//! The bundle is found from the container's process: its runtime's per-container monitor
//! is an ancestor (the process reparents to it). containerd's `containerd-shim-runc-v2`
//! runs in the bundle directory of the first container it was started for (a pod's
//! sandbox, when containerd groups a pod's containers under one shim); the others' bundles
//! are its siblings, named by container id. CRI-O's (and podman's) `conmon` is given the
//! bundle with `-b`. Paths are opened through `/proc/PID/cwd` and `/proc/PID/root`, so a
//! daemon in a container with the host's PID namespace reads the host's files.

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
    let mut p = pid;
    for _ in 0..MAX_DEPTH {
        let (comm, ppid) = comm_and_ppid(p)?;
        // comm is cut at 15 bytes: `containerd-shim-runc-v2` reads `containerd-shim`.
        if comm.starts_with("containerd-shim") {
            let config = PathBuf::from(format!("/proc/{p}/cwd/../{id}/config.json"));
            return Some(("containerd", config));
        }
        if comm == "conmon" {
            let bundle = flag_value(&std::fs::read(format!("/proc/{p}/cmdline")).ok()?, "-b")?;
            let relative = bundle.trim_start_matches('/');
            // podman's containers are named by its API; a kubelet's conmon is CRI-O's.
            let config = PathBuf::from(format!("/proc/{p}/root/{relative}/config.json"));
            return Some(("cri-o", config));
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

/// The value after `-b` or `--bundle` (either `--bundle X` or `--bundle=X`) in a
/// NUL-separated command line.
fn flag_value(cmdline: &[u8], short: &str) -> Option<String> {
    let args: Vec<&str> = cmdline
        .split(|&b| b == 0)
        .filter_map(|a| std::str::from_utf8(a).ok())
        .collect();
    args.iter().enumerate().find_map(|(i, a)| {
        if *a == short || *a == "--bundle" {
            args.get(i + 1).map(|v| (*v).to_owned())
        } else {
            a.strip_prefix("--bundle=").map(str::to_owned)
        }
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
        assert_eq!(
            flag_value(cmdline, "-b").as_deref(),
            Some("/run/x/userdata")
        );
        let long = b"conmon\0--bundle=/var/b\0";
        assert_eq!(flag_value(long, "-b").as_deref(), Some("/var/b"));
        assert_eq!(flag_value(b"conmon\0-c\0x\0", "-b"), None);
    }

    #[test]
    fn comm_with_spaces_and_parentheses_is_read_to_the_last_parenthesis() {
        let (comm, ppid) = comm_and_ppid(std::process::id()).expect("our own stat");
        assert!(!comm.is_empty());
        assert!(ppid > 0);
    }
}
