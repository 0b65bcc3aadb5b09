//! Container names and Kubernetes pod names for the containers the cgroup paths found
//! (`cgroup.rs`): docker and podman answer the same Docker Engine API on a unix socket
//! (`GET /containers/ID/json`: `Name`, and `Config.Labels`, where the `io.kubernetes.*`
//! labels of a CRI-managed container live); containerd's and CRI-O's containers are named
//! from their OCI bundles (`bundle.rs`).
//!
//! Where a runtime's API is not served (podman's is a service most hosts never start) or
//! does not answer, each runtime's names come from a source that needs no API, if it has
//! one ([`without_api`]):
//!
//! | runtime | source without an API | what it misses |
//! |---|---|---|
//! | podman | `conmon`'s command line (`-c ID -n NAME`), through /proc | labels (pod names), a `podman rename` after start |
//! | docker | dockerd's own record, `/var/lib/docker/containers/ID/config.v2.json` (the inspect document's `Name` and `Config.Labels`) | a `--data-root` other than /var/lib/docker, rootless dockerd |
//! | containerd (CRI, nerdctl), CRI-O | the bundle's annotations (`bundle.rs`): the only source used, no API ever asked | containers made with `ctr`, whose only name is their id |
//! | `cri` (kubelet's cgroupfs path, no monitor found) | none | everything but the id |
//!
//! Off the hot path: one lookup per container, cached by container id, dropped from the
//! cache when no listener has that container any more. A runtime whose socket refuses or
//! is slow is left alone for [`RETRY_AFTER`]; one whose socket is absent is looked for
//! again at each rescan (a stat per path). Either is logged once, with the cause; names
//! then come from the source without an API, or stay empty, and nothing else changes. A
//! container named without the API is not asked again when the API comes.

use std::{
    collections::{HashMap, HashSet},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use http_body_util::{BodyExt as _, Empty, Limited};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde::Deserialize;

use super::cgroup::{Container, RuntimeNames};

/// A runtime or a container that could not be asked is asked again after this long.
pub const RETRY_AFTER: Duration = Duration::from_secs(60);
/// One API call, connect to body: a slow runtime must not hold the names of the others.
const TIMEOUT: Duration = Duration::from_secs(2);
/// A container's inspect document is a few KiB; more is not a runtime answering.
const MAX_BODY: usize = 1 << 20;
/// Containers remembered at once (a node runs a few hundred at most).
const MAX_CACHED: usize = 4096;

/// The unix sockets each runtime serves its API on, in the order tried. podman's rootless
/// service runs per user (`/run/user/UID/podman/podman.sock`): `uid` is the owner's.
fn sockets(runtime: &str, uid: Option<u32>) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = match runtime {
        "docker" => vec!["/run/docker.sock".into(), "/var/run/docker.sock".into()],
        "podman" => vec!["/run/podman/podman.sock".into()],
        _ => Vec::new(),
    };
    if runtime == "podman"
        && let Some(uid) = uid.filter(|&u| u != 0)
    {
        out.push(format!("/run/user/{uid}/podman/podman.sock").into());
    }
    // In a container with the host's PID namespace (the DaemonSet), the host's sockets
    // are reachable through PID 1's root without mounting each of them.
    let host: Vec<PathBuf> = out
        .iter()
        .map(|p| Path::new("/proc/1/root").join(p.strip_prefix("/").unwrap_or(p)))
        .collect();
    out.extend(host);
    out
}

/// Whether backlogd asks `runtime`'s API (docker, podman); containerd's and CRI-O's
/// containers are named from their bundles (`bundle.rs`).
pub fn asks(runtime: &str) -> bool {
    matches!(runtime, "docker" | "podman")
}

/// The owner's uid: rootless podman serves its API per user.
fn uid_of(pid: u32) -> Option<u32> {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata(format!("/proc/{pid}"))
        .ok()
        .map(|m| m.uid())
}

/// What asking a runtime about one container came to.
enum Answer {
    Names(RuntimeNames),
    /// The runtime does not know the container.
    Unknown,
    /// A socket is there but does not answer (refused, timed out, not the API), or none
    /// is; with the cause, for the log.
    Unreachable(String),
    NoSocket(String),
}

/// Why a runtime is not asked now; logged once when it starts.
#[derive(Debug)]
enum Down {
    Unreachable(Instant),
    NoSocket,
}

#[derive(Debug)]
enum Entry {
    Known(RuntimeNames),
    /// Not answered (no such container yet, or its runtime was down): asked again later.
    Failed(Instant),
}

/// The cache, and which runtimes are down (with the cause logged once).
#[derive(Debug, Default)]
pub struct Resolver {
    entries: HashMap<String, Entry>,
    down: HashMap<String, Down>,
}

impl Resolver {
    /// What is known of `id`, if anything.
    pub fn get(&self, id: &str) -> Option<&RuntimeNames> {
        match self.entries.get(id) {
            Some(Entry::Known(n)) => Some(n),
            _ => None,
        }
    }

    /// Names the containers in `wanted` (container, pid of a process of it) not named
    /// yet, and forgets containers no longer wanted.
    pub async fn refresh(&mut self, wanted: &[(Container, u32)]) {
        let ids: HashSet<&str> = wanted.iter().map(|(c, _)| c.id.as_str()).collect();
        self.entries.retain(|id, _| ids.contains(id.as_str()));
        let now = Instant::now();
        for (container, pid) in wanted {
            if self.entries.len() >= MAX_CACHED {
                break;
            }
            match self.entries.get(&container.id) {
                Some(Entry::Known(_)) => continue,
                Some(Entry::Failed(at)) if now.duration_since(*at) < RETRY_AFTER => continue,
                _ => {}
            }
            if !asks(&container.runtime) {
                // A few /proc reads and one small file: no API, nothing to wait for.
                let entry = match super::bundle::names(*pid, &container.id) {
                    Some(names) => Entry::Known(names),
                    None => Entry::Failed(now),
                };
                self.entries.insert(container.id.clone(), entry);
                continue;
            }
            if let Some(Down::Unreachable(at)) = self.down.get(&container.runtime)
                && now.duration_since(*at) < RETRY_AFTER
            {
                // The API is set aside: its containers are named without it, if they can be.
                if let Some(names) = without_api(&container.runtime, *pid, &container.id) {
                    self.entries
                        .insert(container.id.clone(), Entry::Known(names));
                }
                continue;
            }
            let runtime = container.runtime.as_str();
            let local = || without_api(runtime, *pid, &container.id);
            let (names, down) = match self.ask(container, uid_of(*pid)).await {
                Answer::Names(names) => (Some(names), None),
                // A 404 as well: a rootless container is not in root's podman.
                Answer::Unknown => (local(), None),
                Answer::Unreachable(cause) => {
                    (local(), Some((Down::Unreachable(Instant::now()), cause)))
                }
                Answer::NoSocket(cause) => (local(), Some((Down::NoSocket, cause))),
            };
            let no_socket = matches!(down, Some((Down::NoSocket, _)));
            if let Some((down, cause)) = down {
                self.set_down(runtime, down, &cause, names.is_some());
            }
            match names {
                Some(names) => {
                    self.entries
                        .insert(container.id.clone(), Entry::Known(names));
                }
                // Looking for a socket costs a stat per path: looked for again at the next
                // rescan, so an API service started later is used then.
                None if no_socket => {}
                None => {
                    self.entries
                        .insert(container.id.clone(), Entry::Failed(Instant::now()));
                }
            }
        }
    }

    /// Sets `runtime`'s API aside; the first time, says why and what names come instead
    /// (`named`: the source without an API named the container that found it down).
    fn set_down(&mut self, runtime: &str, down: Down, cause: &str, named: bool) {
        let first = self.down.insert(runtime.to_owned(), down).is_none();
        if !first {
            return;
        }
        let retry = RETRY_AFTER.as_secs();
        if named {
            tracing::info!(
                runtime,
                %cause,
                source = source_without_api(runtime),
                "the container runtime's API does not answer; its containers are named \
                 without it (their names only: labels and the pod names they carry need the \
                 API). It is asked again at each rescan, or after {retry} s if it failed to \
                 answer"
            );
        } else {
            tracing::warn!(
                runtime,
                %cause,
                "cannot ask the container runtime for container names and found none without \
                 it; they stay empty (ids, units and pod UIDs from cgroups are unaffected) and \
                 it is asked again at each rescan, or after {retry} s if it failed to answer. \
                 To have names, run its API service (podman: `systemctl enable --now \
                 podman.socket`) and, in a container, share the host's PID namespace or mount \
                 the socket"
            );
        }
    }

    async fn ask(&mut self, container: &Container, uid: Option<u32>) -> Answer {
        let runtime = container.runtime.as_str();
        let paths = sockets(runtime, uid);
        let mut why = None;
        for socket in paths.iter().filter(|s| s.exists()) {
            match inspect(socket, &container.id).await {
                Ok(answer) => {
                    if self.down.remove(runtime).is_some() {
                        tracing::info!(
                            runtime,
                            socket = %socket.display(),
                            "the container runtime's API answers; its containers are named \
                             by it"
                        );
                    }
                    // None: the runtime does not know the container (one just gone).
                    return answer.map_or(Answer::Unknown, Answer::Names);
                }
                Err(e) => why = Some(format!("{}: {e}", socket.display())),
            }
        }
        match why {
            Some(why) => Answer::Unreachable(why),
            None => {
                let list: Vec<_> = paths.iter().map(|p| p.display().to_string()).collect();
                Answer::NoSocket(format!("no API socket at {}", list.join(", ")))
            }
        }
    }
}

/// Names for container `id` (whose process `pid` is) from `runtime`'s source that needs no
/// API (the table at the top of this file); None where it has none or it says nothing.
pub fn without_api(runtime: &str, pid: u32, id: &str) -> Option<RuntimeNames> {
    match runtime {
        "podman" => super::bundle::podman_names(pid, id),
        "docker" => docker_record(id),
        _ => None,
    }
}

/// Where [`without_api`] reads, for the log.
fn source_without_api(runtime: &str) -> &'static str {
    match runtime {
        "podman" => "conmon's command line (-n)",
        "docker" => "/var/lib/docker/containers/ID/config.v2.json",
        _ => "none",
    }
}

/// dockerd's own record of a container, `config.v2.json` in its data root: the same
/// `Name` and `Config.Labels` as the inspect document (dockerd serves inspect from it),
/// written since docker 1.10. Read where dockerd's API is not reachable: a socket moved
/// with `-H`, a daemon in a container without the socket, dockerd restarting under
/// `live-restore`. An internal file, not an API: only its two fields are read, and a
/// record that does not parse names nothing. Misses a `--data-root` elsewhere and
/// rootless dockerd (`~/.local/share/docker`).
fn docker_record(id: &str) -> Option<RuntimeNames> {
    docker_record_in(&["/var/lib/docker", "/proc/1/root/var/lib/docker"], id)
}

/// [`docker_record`] in the first of the data roots `roots` that has it.
fn docker_record_in(roots: &[&str], id: &str) -> Option<RuntimeNames> {
    use std::io::Read as _;
    roots.iter().find_map(|root| {
        let path = format!("{root}/containers/{id}/config.v2.json");
        let mut body = Vec::new();
        std::fs::File::open(path)
            .ok()?
            .take(MAX_BODY as u64)
            .read_to_end(&mut body)
            .ok()?;
        parse_inspect(&body).ok()
    })
}

#[derive(Debug, thiserror::Error)]
enum AskError {
    #[error("connect: {0}")]
    Connect(std::io::Error),
    #[error("HTTP: {0}")]
    Http(#[from] hyper::Error),
    #[error("status {0}")]
    Status(hyper::StatusCode),
    #[error("reading the answer: {0}")]
    Body(String),
    #[error("unexpected answer: {0}")]
    Json(#[from] serde_json::Error),
    #[error("no answer within {} s", TIMEOUT.as_secs())]
    Timeout,
}

/// `GET /containers/ID/json` on the Docker Engine API at `socket`; `None` for 404.
async fn inspect(socket: &Path, id: &str) -> Result<Option<RuntimeNames>, AskError> {
    match tokio::time::timeout(TIMEOUT, get(socket, &format!("/containers/{id}/json"))).await {
        Ok(Ok(None)) => Ok(None),
        Ok(Ok(Some(body))) => Ok(Some(parse_inspect(&body)?)),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(AskError::Timeout),
    }
}

async fn get(socket: &Path, path: &str) -> Result<Option<Bytes>, AskError> {
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(AskError::Connect)?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    // Drives the connection; it ends when `sender` is dropped or the runtime hangs up.
    let driver = tokio::spawn(connection);
    let request = hyper::Request::get(path)
        .header(hyper::header::HOST, "localhost")
        .body(Empty::<Bytes>::new())
        .expect("a GET with a literal path and header is a valid request");
    let response = sender.send_request(request).await;
    let result = async {
        let response = response?;
        match response.status() {
            hyper::StatusCode::NOT_FOUND => return Ok(None),
            s if !s.is_success() => return Err(AskError::Status(s)),
            _ => {}
        }
        let body = Limited::new(response.into_body(), MAX_BODY)
            .collect()
            .await
            .map_err(|e| AskError::Body(e.to_string()))?;
        Ok(Some(body.to_bytes()))
    }
    .await;
    drop(sender);
    driver.abort();
    result
}

#[derive(Deserialize)]
struct Inspect {
    #[serde(rename = "Name", default)]
    name: String,
    #[serde(rename = "Config", default)]
    config: Option<InspectConfig>,
}

#[derive(Deserialize)]
struct InspectConfig {
    #[serde(rename = "Labels", default)]
    labels: Option<HashMap<String, String>>,
}

/// The names in an inspect document. Kubernetes' labels (set by the kubelet on every
/// container of a pod: dockershim, cri-dockerd, `podman kube play`) win over the
/// runtime's generated name (`k8s_web_POD_NS_UID_0`).
fn parse_inspect(body: &[u8]) -> Result<RuntimeNames, serde_json::Error> {
    let inspect: Inspect = serde_json::from_slice(body)?;
    let labels = inspect.config.and_then(|c| c.labels).unwrap_or_default();
    let label = |k: &str| labels.get(k).filter(|v| !v.is_empty()).cloned();
    // The Docker API names containers with a leading slash; podman's compat API may not.
    let own = inspect.name.trim_start_matches('/');
    Ok(RuntimeNames {
        runtime: None,
        container: label("io.kubernetes.container.name")
            .or_else(|| (!own.is_empty()).then(|| own.to_owned())),
        pod_name: label("io.kubernetes.pod.name"),
        pod_namespace: label("io.kubernetes.pod.namespace"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_from_an_inspect_document() {
        let plain = br#"{"Id":"abc","Name":"/web","Config":{"Labels":{"app":"x"}}}"#;
        assert_eq!(
            parse_inspect(plain).unwrap(),
            RuntimeNames {
                container: Some("web".into()),
                ..Default::default()
            }
        );
        let pod = br#"{"Name":"k8s_nginx_web-0_shop_0a1b_0","Config":{"Labels":{
            "io.kubernetes.container.name":"nginx","io.kubernetes.pod.name":"web-0",
            "io.kubernetes.pod.namespace":"shop"}}}"#;
        assert_eq!(
            parse_inspect(pod).unwrap(),
            RuntimeNames {
                runtime: None,
                container: Some("nginx".into()),
                pod_name: Some("web-0".into()),
                pod_namespace: Some("shop".into()),
            }
        );
        assert_eq!(
            parse_inspect(br#"{"Config":null}"#).unwrap(),
            RuntimeNames::default()
        );
        assert!(parse_inspect(b"<html>").is_err());
    }

    /// A socket that accepts and never answers costs one timeout, a socket file nobody
    /// listens on one refusal, and either puts the runtime aside for RETRY_AFTER: the
    /// next refresh asks nothing. (The absent socket and a real API: tests/tests/podman.rs.)
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_silent_or_refusing_socket_is_one_attempt_then_left_alone() {
        let dir = std::env::temp_dir().join(format!("backlogd-runtime-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let silent = dir.join("silent.sock");
        let _ = std::fs::remove_file(&silent);
        let listener = tokio::net::UnixListener::bind(&silent).unwrap();
        let held = tokio::spawn(async move {
            let mut conns = Vec::new();
            while let Ok((c, _)) = listener.accept().await {
                conns.push(c);
            }
        });
        let started = tokio::time::Instant::now();
        let err = inspect(&silent, "abc").await.unwrap_err();
        assert!(matches!(err, AskError::Timeout), "{err}");
        assert_eq!(started.elapsed(), TIMEOUT);

        // A socket file whose listener is gone: connect is refused at once.
        let refusing = dir.join("refusing.sock");
        let _ = std::fs::remove_file(&refusing);
        drop(std::os::unix::net::UnixListener::bind(&refusing).unwrap());
        let err = inspect(&refusing, "abc").await.unwrap_err();
        assert!(matches!(err, AskError::Connect(_)), "{err}");

        // Through the resolver: one Unreachable, then nothing until RETRY_AFTER.
        let mut r = Resolver::default();
        r.down
            .insert("podman".into(), Down::Unreachable(Instant::now()));
        let c = Container {
            runtime: "podman".into(),
            id: "abc".into(),
            name: None,
        };
        r.refresh(&[(c, std::process::id())]).await;
        assert!(
            r.entries.is_empty(),
            "asked a runtime set aside: {:?}",
            r.entries
        );
        held.abort();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A record as dockerd 20.10 writes it (fields cut to those around the two read).
    #[test]
    fn docker_names_from_its_own_record_without_the_api() {
        let dir = std::env::temp_dir().join(format!("backlogd-docker-{}", std::process::id()));
        let id = "3f4c2d1e0b9a8f7e6d5c4b3a29181706f5e4d3c2b1a09f8e7d6c5b4a39281706";
        let record = dir.join("containers").join(id);
        std::fs::create_dir_all(&record).unwrap();
        std::fs::write(
            record.join("config.v2.json"),
            format!(
                r#"{{"StreamConfig":{{}},"State":{{"Running":true,"Pid":4242}},"ID":"{id}",
                "Created":"2026-11-27T20:41:17.8Z","Path":"nginx","Args":[],
                "Config":{{"Hostname":"3f4c2d1e0b9a","Image":"nginx","Labels":{{"app":"web"}}}},
                "Name":"/web","Driver":"overlay2","RestartCount":0}}"#
            ),
        )
        .unwrap();
        let root = dir.to_str().unwrap();
        let named = docker_record_in(&["/nonexistent", root], id).expect("a record");
        assert_eq!(named.container.as_deref(), Some("web"));
        assert_eq!(docker_record_in(&[root], "0123"), None);
        std::fs::write(record.join("config.v2.json"), "{").unwrap();
        assert_eq!(docker_record_in(&[root], id), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn rootless_podman_is_asked_at_its_user_socket_and_through_pid_1() {
        let s = sockets("podman", Some(1000));
        assert_eq!(s[0], Path::new("/run/podman/podman.sock"));
        assert!(s.contains(&PathBuf::from("/run/user/1000/podman/podman.sock")));
        assert!(s.contains(&PathBuf::from("/proc/1/root/run/podman/podman.sock")));
        assert!(sockets("containerd", None).is_empty());
        assert!(
            !sockets("podman", Some(0))
                .iter()
                .any(|p| p.starts_with("/run/user"))
        );
    }
}
