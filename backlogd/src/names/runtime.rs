//! Container names and Kubernetes pod names for the containers the cgroup paths found
//! (`cgroup.rs`): docker and podman answer the same Docker Engine API on a unix socket
//! (`GET /containers/ID/json`: `Name`, and `Config.Labels`, where the `io.kubernetes.*`
//! labels of a CRI-managed container live); containerd's and CRI-O's containers are named
//! from their OCI bundles (`bundle.rs`).
//!
//! Off the hot path: one lookup per container, cached by container id, dropped from the
//! cache when no listener has that container any more. A runtime whose socket refuses or
//! is slow is left alone for [`RETRY_AFTER`]; one whose socket is absent is looked for
//! again at each rescan (a stat per path). Either is logged once, with the cause; the
//! names stay empty and nothing else changes.

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
    /// A socket is there but does not answer (refused, timed out, not the API).
    Unreachable,
    NoSocket,
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
                continue;
            }
            let entry = match self.ask(container, uid_of(*pid)).await {
                Answer::Names(names) => Entry::Known(names),
                Answer::Unknown | Answer::Unreachable => Entry::Failed(Instant::now()),
                // Looking for a socket costs a stat per path: looked for again at the next
                // rescan, so an API service started later is used then.
                Answer::NoSocket => continue,
            };
            self.entries.insert(container.id.clone(), entry);
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
                            "the container runtime's API answers; its containers are named"
                        );
                    }
                    // None: the runtime does not know the container (one just gone).
                    return answer.map_or(Answer::Unknown, Answer::Names);
                }
                Err(e) => why = Some(format!("{}: {e}", socket.display())),
            }
        }
        let (down, answer, why) = match why {
            Some(why) => (Down::Unreachable(Instant::now()), Answer::Unreachable, why),
            None => {
                let list: Vec<_> = paths.iter().map(|p| p.display().to_string()).collect();
                let why = format!("no API socket at {}", list.join(", "));
                (Down::NoSocket, Answer::NoSocket, why)
            }
        };
        if !self.down.contains_key(runtime) {
            tracing::warn!(
                runtime,
                cause = %why,
                "cannot ask the container runtime for container names; they stay empty \
                 (ids, units and pod UIDs from cgroups are unaffected) and it is asked again \
                 at each rescan, or after {} s if it failed to answer. To have names, run \
                 its API service (podman: `systemctl enable --now podman.socket`) and, in a \
                 container, share the host's PID namespace or mount the socket",
                RETRY_AFTER.as_secs()
            );
        }
        self.down.insert(runtime.to_owned(), down);
        answer
    }
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
