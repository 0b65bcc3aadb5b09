//! What a process's cgroup path says about who runs it: the systemd unit, the container
//! (runtime and id) and the Kubernetes pod. Container managers encode these in the cgroup
//! names they create, the same way on every host; nothing here asks a runtime (the names
//! only a runtime knows are filled in by `runtime.rs`).

use serde::{Deserialize, Serialize};

/// Names from one cgroup path; each `None` where the path does not say.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupNames {
    /// The innermost systemd unit (`nginx.service`, `session-3.scope`, `docker-ID.scope`).
    pub unit: Option<String>,
    /// The slice that holds it (`system.slice`, `user-1000.slice`, `kubepods-...slice`).
    pub slice: Option<String>,
    pub container: Option<Container>,
    /// The pod's UID, for a container of a Kubernetes pod (kubelet names its cgroup).
    pub pod_uid: Option<String>,
    /// The pod's name and namespace, from its runtime's API (`runtime.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_namespace: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Container {
    /// `docker`, `podman`, `containerd` or `cri-o`.
    pub runtime: String,
    /// The full 64-hex-digit id.
    pub id: String,
    /// Its name, from its runtime's API (`runtime.rs`): Kubernetes' container name in a
    /// pod, `--name` otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// What a container's runtime adds to what its cgroup path says (`runtime.rs` asks the
/// API, `bundle.rs` reads the bundle); kept here, beside what it completes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuntimeNames {
    /// The runtime, where the path's cgroup did not say and the lookup did (kubelet's
    /// cgroupfs layout says only `cri`; a `containerd-shim` or `conmon` ancestor says which).
    pub runtime: Option<String>,
    /// The container's name: Kubernetes' container name for a pod's container, the
    /// runtime's own (`docker run --name`) otherwise.
    pub container: Option<String>,
    pub pod_name: Option<String>,
    pub pod_namespace: Option<String>,
}

/// Scope-name prefixes of container managers (systemd cgroup driver), and the runtime.
/// The monitor processes' scopes (`libpod-conmon-`, `crio-conmon-`) are not containers.
const SCOPES: &[(&str, &str)] = &[
    ("docker-", "docker"),
    ("libpod-", "podman"),
    ("cri-containerd-", "containerd"),
    ("nerdctl-", "containerd"),
    ("crio-", "cri-o"),
];

/// Parent directory names of the cgroupfs driver: `/docker/ID`, `/kubepods/.../ID`.
const PARENTS: &[(&str, &str)] = &[("docker", "docker"), ("libpod_parent", "podman")];

/// Parses `/proc/PID/cgroup` (the cgroup v2 line `0::PATH`).
pub fn from_proc_file(text: &str) -> Option<CgroupNames> {
    let path = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    Some(parse(path.trim()))
}

pub fn parse(path: &str) -> CgroupNames {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let mut names = CgroupNames::default();
    for (i, part) in parts.iter().enumerate() {
        if is_unit(part) {
            names.unit = Some((*part).to_owned());
            names.slice = parts[..i]
                .iter()
                .rev()
                .find(|p| p.ends_with(".slice"))
                .map(|s| (*s).to_owned());
        }
        if let Some(uid) = pod_uid(part) {
            names.pod_uid = Some(uid);
        }
        if let Some(c) = scope_container(part).or_else(|| {
            let parent = if i > 0 { parts[i - 1] } else { "" };
            parent_container(parent, part, names.pod_uid.is_some())
        }) {
            names.container = Some(c);
        }
    }
    names
}

impl CgroupNames {
    /// The name an operator knows the owner by: its pod, its container, or its unit
    /// (container ids shortened to 12 digits, as `docker ps` and `podman ps` show them;
    /// names where the runtime gave them).
    pub fn owner(&self) -> Option<String> {
        let container = |c: &Container| match &c.name {
            Some(name) => format!("{} container {name}", c.runtime),
            None => format!(
                "{} container {}",
                c.runtime,
                c.id.chars().take(12).collect::<String>()
            ),
        };
        let pod = match (&self.pod_namespace, &self.pod_name, &self.pod_uid) {
            (Some(ns), Some(name), _) => Some(format!("pod {ns}/{name}")),
            (_, _, Some(uid)) => Some(format!("pod {uid}")),
            _ => None,
        };
        match (pod, &self.container, &self.unit) {
            (Some(pod), Some(c), _) => Some(format!("{pod}, {}", container(c))),
            (Some(pod), None, _) => Some(pod),
            (None, Some(c), _) => Some(container(c)),
            (None, None, Some(unit)) => Some(unit.clone()),
            (None, None, None) => None,
        }
    }

    /// Adds what the container's runtime said of it.
    pub fn add_runtime_names(&mut self, names: &RuntimeNames) {
        if let Some(c) = &mut self.container {
            c.name.clone_from(&names.container);
            if let Some(runtime) = &names.runtime {
                c.runtime.clone_from(runtime);
            }
        }
        self.pod_name.clone_from(&names.pod_name);
        self.pod_namespace.clone_from(&names.pod_namespace);
    }
}

fn is_unit(part: &str) -> bool {
    [".service", ".scope", ".socket", ".mount", ".swap"]
        .iter()
        .any(|suffix| part.len() > suffix.len() && part.ends_with(suffix))
}

fn is_container_id(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// `PREFIX-ID.scope` (systemd driver) or `PREFIX-ID` (podman's cgroupfs driver:
/// `/libpod_parent/libpod-ID`).
fn scope_container(part: &str) -> Option<Container> {
    let stem = part.strip_suffix(".scope").unwrap_or(part);
    SCOPES.iter().find_map(|(prefix, runtime)| {
        let id = stem.strip_prefix(prefix)?;
        is_container_id(id).then(|| Container {
            runtime: (*runtime).to_owned(),
            id: id.to_owned(),
            name: None,
        })
    })
}

/// cgroupfs driver: the id is a directory of its own under the runtime's parent, or
/// under the pod's directory (whose runtime the path does not say).
fn parent_container(parent: &str, part: &str, in_pod: bool) -> Option<Container> {
    if !is_container_id(part) {
        return None;
    }
    let runtime = PARENTS
        .iter()
        .find(|(p, _)| *p == parent)
        .map(|(_, r)| *r)
        .or(in_pod.then_some("cri"))?;
    Some(Container {
        runtime: runtime.to_owned(),
        id: part.to_owned(),
        name: None,
    })
}

/// `kubepods-burstable-pod<UID with _>.slice` (systemd driver) or `pod<UID>` (cgroupfs).
fn pod_uid(part: &str) -> Option<String> {
    let uid = match part.strip_suffix(".slice") {
        Some(stem) if stem.starts_with("kubepods") => {
            stem.rsplit_once("-pod").map(|(_, u)| u.replace('_', "-"))?
        }
        Some(_) => return None,
        None => part.strip_prefix("pod")?.to_owned(),
    };
    let uuid = uid.len() == 36
        && uid.bytes().enumerate().all(|(i, b)| {
            matches!(i, 8 | 13 | 18 | 23) == (b == b'-') && (b == b'-' || b.is_ascii_hexdigit())
        });
    uuid.then_some(uid)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "3f4c2d1e0b9a8f7e6d5c4b3a29181706f5e4d3c2b1a09f8e7d6c5b4a39281706";
    const UID: &str = "0a1b2c3d-4e5f-6789-abcd-ef0123456789";

    fn container(runtime: &str) -> Option<Container> {
        Some(Container {
            runtime: runtime.into(),
            id: ID.into(),
            name: None,
        })
    }

    #[test]
    fn systemd_services_user_sessions_and_user_services() {
        let n = parse("/system.slice/nginx.service");
        assert_eq!(n.unit.as_deref(), Some("nginx.service"));
        assert_eq!(n.slice.as_deref(), Some("system.slice"));
        assert_eq!((n.container, n.pod_uid), (None, None));
        let n = parse("/system.slice/system-getty.slice/getty@tty1.service");
        assert_eq!(n.unit.as_deref(), Some("getty@tty1.service"));
        assert_eq!(n.slice.as_deref(), Some("system-getty.slice"));
        let n = parse("/user.slice/user-1000.slice/session-3.scope");
        assert_eq!(n.unit.as_deref(), Some("session-3.scope"));
        assert_eq!(n.slice.as_deref(), Some("user-1000.slice"));
        let n = parse("/user.slice/user-1000.slice/user@1000.service/app.slice/web.service");
        assert_eq!(n.unit.as_deref(), Some("web.service"));
        assert_eq!(n.slice.as_deref(), Some("app.slice"));
        assert_eq!(parse("/"), CgroupNames::default());
        assert_eq!(parse("/init.scope").unit.as_deref(), Some("init.scope"));
    }

    #[test]
    fn containers_of_each_runtime_and_cgroup_driver() {
        let docker = parse(&format!("/system.slice/docker-{ID}.scope"));
        assert_eq!(docker.container, container("docker"));
        assert_eq!(docker.unit, Some(format!("docker-{ID}.scope")));
        assert_eq!(
            parse(&format!("/docker/{ID}")).container,
            container("docker")
        );
        // podman with its container in a sub-cgroup of the scope, rootless under a user.
        assert_eq!(
            parse(&format!("/machine.slice/libpod-{ID}.scope/container")).container,
            container("podman")
        );
        assert_eq!(
            parse(&format!(
                "/user.slice/user-0.slice/user@0.service/user.slice/libpod-{ID}.scope"
            ))
            .container,
            container("podman")
        );
        // podman's cgroupfs driver (hosts without systemd as the cgroup manager).
        assert_eq!(
            parse(&format!("/libpod_parent/libpod-{ID}")).container,
            container("podman")
        );
        assert_eq!(parse("/libpod_parent/conmon").container, None);
        // conmon watches the container from a scope of its own: not the container.
        assert_eq!(
            parse(&format!("/machine.slice/libpod-conmon-{ID}.scope")).container,
            None
        );
        assert_eq!(
            parse(&format!("/system.slice/crio-conmon-{ID}.scope")).container,
            None
        );
        assert_eq!(parse("/system.slice/docker-notanid.scope").container, None);
    }

    #[test]
    fn kubernetes_pods_with_either_cgroup_driver() {
        let underscored = UID.replace('-', "_");
        let n = parse(&format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{underscored}.slice/\
             cri-containerd-{ID}.scope"
        ));
        assert_eq!(n.pod_uid.as_deref(), Some(UID));
        assert_eq!(n.container, container("containerd"));
        assert_eq!(
            n.slice,
            Some(format!("kubepods-burstable-pod{underscored}.slice"))
        );
        let n = parse(&format!(
            "/kubepods.slice/kubepods-pod{underscored}.slice/crio-{ID}.scope"
        ));
        assert_eq!(
            (n.pod_uid.as_deref(), n.container),
            (Some(UID), container("cri-o"))
        );
        let n = parse(&format!("/kubepods/besteffort/pod{UID}/{ID}"));
        assert_eq!(
            (n.pod_uid.as_deref(), n.container),
            (Some(UID), container("cri"))
        );
        // A pod's slice alone (its sandbox pause process sits in a container of its own).
        let n = parse(&format!("/kubepods.slice/kubepods-pod{underscored}.slice"));
        assert_eq!((n.pod_uid.as_deref(), n.container), (Some(UID), None));
        assert_eq!(
            parse("/kubepods.slice/kubepods-podnotauid.slice").pod_uid,
            None
        );
    }

    #[test]
    fn the_owner_is_named_by_pod_then_container_then_unit() {
        let n = parse(&format!("/system.slice/docker-{ID}.scope"));
        assert_eq!(n.owner().as_deref(), Some("docker container 3f4c2d1e0b9a"));
        assert_eq!(
            parse("/system.slice/nginx.service").owner().as_deref(),
            Some("nginx.service")
        );
        let n = parse(&format!("/kubepods/pod{UID}/{ID}"));
        assert_eq!(
            n.owner(),
            Some(format!("pod {UID}, cri container 3f4c2d1e0b9a"))
        );
        assert_eq!(parse("/").owner(), None);
        let mut n = parse(&format!("/kubepods/pod{UID}/{ID}"));
        n.add_runtime_names(&RuntimeNames {
            runtime: Some("containerd".into()),
            container: Some("nginx".into()),
            pod_name: Some("web-0".into()),
            pod_namespace: Some("shop".into()),
        });
        assert_eq!(
            n.owner().as_deref(),
            Some("pod shop/web-0, containerd container nginx")
        );
    }

    #[test]
    fn the_v2_line_of_proc_pid_cgroup_is_read() {
        let text = "0::/system.slice/redis-server.service\n";
        assert_eq!(
            from_proc_file(text).unwrap().unit.as_deref(),
            Some("redis-server.service")
        );
        // cgroup v1 only: no unified line, nothing said.
        assert_eq!(from_proc_file("12:pids:/system.slice/x.service\n"), None);
    }
}
