//! deploy/kubernetes/ checked by the tools a cluster's operators trust, not by a parse of
//! our own: kubernetes-validate (the Kubernetes API's OpenAPI schemas, strict: unknown
//! fields are errors) for the built-in kinds, and check-jsonschema against the
//! openAPIV3Schema of prometheus-operator's own CRDs for the PodMonitor and ServiceMonitor.
//! Each check is also shown to fail on a broken copy, so a pass means something. Then what
//! no schema knows: the ConfigMap is the shipped config, the container port is the one the
//! daemon listens on (the daemon's own check-config says), the capabilities are the systemd
//! unit's, the image is this version, the monitors select the DaemonSet's pods and port.
//!
//! And the pod itself runs: podman starts the image `cargo xtask image` builds with exactly
//! what the DaemonSet's pod spec grants (its capabilities, user, read-only root, host
//! namespaces and volumes, read from the manifest, in a cgroup namespace of its own as on a
//! cgroup v2 node), and the daemon must load, pin, serve its probe path and count the SYNs
//! of a listener in another network namespace exactly.
//!
//! The checkers live in a venv that `cargo xtask setup` makes (~/.cache/backlogd/venv) and
//! the CRDs in the Go module cache it fills; a missing one fails the test under
//! `cargo xtask test` and skips it loudly elsewhere (tests/src/tools.rs).

use std::{
    collections::BTreeSet,
    net::{SocketAddr, TcpListener},
    path::{Path, PathBuf},
    process::{Command, Output},
    time::{Duration, Instant},
};

use backlogd_tests::{
    Netns, Scrape, caps,
    containers::{Podman, go_module, podman, text, workspace_root, xtask_image},
    daemon::{binary, hook_mode},
    http,
    pins::PinDir,
    report,
    sockets::{Listener, connect_burst},
    tempdir::TempDir,
    tools,
};
use serde_json::{Value, json};

/// The newest Kubernetes kubernetes-validate 1.37.0 has schemas for.
const KUBERNETES: &str = "1.37.0";
/// The oldest that accepts the DaemonSet: securityContext.appArmorProfile is 1.30's.
const OLDEST_KUBERNETES: &str = "1.30.0";
/// Pinned in xtask/src/setup.rs too; its CRDs are what the monitors must satisfy.
const PROMETHEUS_OPERATOR: &str = "github.com/prometheus-operator/prometheus-operator@v0.85.0";

fn manifest(name: &str) -> PathBuf {
    workspace_root().join("deploy/kubernetes").join(name)
}

/// A program of the venv setup makes, if it runs; else fails or skips as tools.rs says.
fn checker(test: &str, program: &str) -> Option<PathBuf> {
    let venv = std::env::var_os("HOME")
        .map(|home| PathBuf::from(home).join(".cache/backlogd/venv/bin"))
        .expect("HOME is set");
    let path = venv.join(program);
    let probe = Command::new(&path).arg("--version").output();
    let why = match probe {
        Ok(out) if out.status.success() => return Some(path),
        Ok(out) => format!("`{} --version` exited with {}", path.display(), out.status),
        Err(e) => format!("{} cannot be run: {e}", path.display()),
    };
    skip_or_fail(
        test,
        &format!("{program} (PyPI, in the venv setup makes): {why}"),
    )
}

fn skip_or_fail<T>(test: &str, need: &str) -> Option<T> {
    let need = format!("{test} needs {need}");
    if tools::required() {
        panic!("{need}. This run requires every tool; run `cargo xtask setup`");
    }
    backlogd_tests::marks::skip(&format!(
        "{need}; run `cargo xtask setup` (under `cargo xtask test` it fails instead)"
    ));
    None
}

/// prometheus-operator's CRD for `plural` (`podmonitors`), from the module cache only.
fn crd(test: &str, plural: &str) -> Option<PathBuf> {
    let dir = match go_module(PROMETHEUS_OPERATOR, &std::env::temp_dir(), true) {
        Ok(dir) => dir,
        Err(e) => return skip_or_fail(test, &e),
    };
    let path = dir.join(format!(
        "example/prometheus-operator-crd/monitoring.coreos.com_{plural}.yaml"
    ));
    assert!(path.exists(), "{} is not in the module", path.display());
    Some(path)
}

/// Every YAML document of `path`, as PyYAML's safe loader (the venv's) reads it.
fn documents(python: &Path, path: &Path) -> Vec<Value> {
    let out = Command::new(python)
        .args([
            "-c",
            "import json, sys, yaml; json.dump(list(yaml.safe_load_all(open(sys.argv[1]))), sys.stdout)",
        ])
        .arg(path)
        .output()
        .expect("running the venv's python");
    assert!(out.status.success(), "{}: {}", path.display(), text(&out));
    serde_json::from_slice(&out.stdout).expect("json.dump's output")
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    let mut found = docs.iter().filter(|d| d["kind"] == kind);
    let doc = found.next().unwrap_or_else(|| panic!("no {kind}"));
    assert!(found.next().is_none(), "two {kind}s");
    doc
}

fn kubernetes_validate(program: &Path, version: &str, files: &[PathBuf]) -> Output {
    Command::new(program)
        .args(["--strict", "--kubernetes-version", version])
        .args(files)
        .output()
        .expect("running kubernetes-validate")
}

fn all_manifests() -> Vec<PathBuf> {
    ["daemonset.yaml", "servicemonitor.yaml", "podmonitor.yaml"]
        .into_iter()
        .map(manifest)
        .collect()
}

#[test]
fn the_built_in_kinds_pass_kubernetes_validate_in_strict_mode() {
    let test = "the_built_in_kinds_pass_kubernetes_validate_in_strict_mode";
    let Some(validate) = checker(test, "kubernetes-validate") else {
        return;
    };
    let out = kubernetes_validate(&validate, KUBERNETES, &all_manifests());
    let said = text(&out);
    report(&format!(
        "kubernetes-validate --strict --kubernetes-version {KUBERNETES}:\n{said}"
    ));
    assert!(out.status.success(), "{said}");
    let version = KUBERNETES.rsplit_once('.').expect("x.y.z").0;
    for resource in [
        "namespace/backlogd",
        "serviceaccount/backlogd",
        "configmap/backlogd-config",
        "daemonset/backlogd",
        "service/backlogd",
    ] {
        let passed = format!("passed for resource {resource} against version {version}");
        assert!(said.contains(&passed), "no `{passed}` in:\n{said}");
    }
    // It knows no CRDs and says so without failing: those two are the next test's. Any
    // other warning would be a kind or version it did not check either.
    for line in said.lines().filter(|l| !l.starts_with("INFO ")) {
        assert!(
            line.contains("Couldn't find schema for kind PodMonitor with api version monitoring.coreos.com/v1")
                || line.contains("Couldn't find schema for kind ServiceMonitor with api version monitoring.coreos.com/v1"),
            "unexpected: {line}"
        );
    }
}

/// The oldest version docs/kubernetes.md names is the oldest whose schema takes the DaemonSet.
#[test]
fn kubernetes_before_the_oldest_named_refuses_the_daemonset_for_its_apparmor_field() {
    let test = "kubernetes_before_the_oldest_named_refuses_the_daemonset_for_its_apparmor_field";
    let Some(validate) = checker(test, "kubernetes-validate") else {
        return;
    };
    let daemonset = [manifest("daemonset.yaml")];
    let out = kubernetes_validate(&validate, OLDEST_KUBERNETES, &daemonset);
    assert!(out.status.success(), "{}", text(&out));
    let out = kubernetes_validate(&validate, "1.29.0", &daemonset);
    let said = text(&out);
    assert!(!out.status.success(), "1.29 accepted it:\n{said}");
    assert!(
        said.contains("'appArmorProfile' was unexpected"),
        "refused for another reason:\n{said}"
    );
}

/// The same tool, the same flags, a copy with one fault each: a wrong type, and a field
/// that does not exist (strict mode's doing).
#[test]
fn kubernetes_validate_rejects_a_broken_daemonset() {
    let test = "kubernetes_validate_rejects_a_broken_daemonset";
    let Some(validate) = checker(test, "kubernetes-validate") else {
        return;
    };
    let original = std::fs::read_to_string(manifest("daemonset.yaml")).unwrap();
    let dir = TempDir::new("kubernetes-broken");
    for (broken, complaint) in [
        (
            "hostPID: \"yes\"",
            "spec.template.spec.hostPID: 'yes' is not of type 'boolean'",
        ),
        ("hostPid: true", "'hostPid' was unexpected"),
    ] {
        assert_eq!(original.matches("hostPID: true").count(), 1);
        let copy = dir.write("daemonset.yaml", &original.replace("hostPID: true", broken));
        let out = kubernetes_validate(&validate, KUBERNETES, &[copy]);
        let said = text(&out);
        assert!(!out.status.success(), "`{broken}` passed:\n{said}");
        assert!(said.contains(complaint), "`{broken}`:\n{said}");
        report(&format!("kubernetes-validate on `{broken}`:\n{said}"));
    }
}

/// The CRD's openAPIV3Schema, as strict as the API server is with kubectl's default
/// `--validate=strict`: an object schema that lists its properties and says nothing of
/// others gets `additionalProperties: false` (the API server would reject, or at best
/// prune, an unknown field; JSON Schema would let it pass). Nothing is loosened: schemas
/// that allow other fields (`additionalProperties`, `x-kubernetes-preserve-unknown-fields`)
/// stay as they are.
fn strict_schema(python: &Path, crd_path: &Path) -> Value {
    let crd = documents(python, crd_path).remove(0);
    let versions = crd["spec"]["versions"].as_array().expect("versions");
    let v1 = versions
        .iter()
        .find(|v| v["name"] == "v1")
        .expect("a v1 version");
    let mut schema = v1["schema"]["openAPIV3Schema"].clone();
    fn tighten(schema: &mut Value) {
        match schema {
            Value::Object(map) => {
                if map.contains_key("properties")
                    && !map.contains_key("additionalProperties")
                    && map.get("x-kubernetes-preserve-unknown-fields") != Some(&json!(true))
                {
                    map.insert("additionalProperties".into(), json!(false));
                }
                map.values_mut().for_each(tighten);
            }
            Value::Array(items) => items.iter_mut().for_each(tighten),
            _ => {}
        }
    }
    tighten(&mut schema);
    schema
}

/// check-jsonschema of `doc` against `schema`, each written as its own file (the tool
/// reads one document per file; servicemonitor.yaml has two).
fn check_jsonschema(program: &Path, dir: &TempDir, schema: &Value, doc: &Value) -> Output {
    let schema = dir.write("schema.json", &schema.to_string());
    let doc = dir.write("monitor.json", &doc.to_string());
    Command::new(program)
        .arg("--schemafile")
        .arg(schema)
        .arg(doc)
        .output()
        .expect("running check-jsonschema")
}

struct Monitors {
    python: PathBuf,
    check: PathBuf,
    /// (file, kind, the CRD's strict schema)
    each: Vec<(&'static str, &'static str, Value)>,
}

fn monitors(test: &str) -> Option<Monitors> {
    let python = checker(test, "python")?;
    let check = checker(test, "check-jsonschema")?;
    let mut each = Vec::new();
    for (file, kind, plural) in [
        ("podmonitor.yaml", "PodMonitor", "podmonitors"),
        ("servicemonitor.yaml", "ServiceMonitor", "servicemonitors"),
    ] {
        let schema = strict_schema(&python, &crd(test, plural)?);
        each.push((file, kind, schema));
    }
    Some(Monitors {
        python,
        check,
        each,
    })
}

#[test]
fn the_monitors_pass_their_crds_schemas() {
    let test = "the_monitors_pass_their_crds_schemas";
    let Some(m) = monitors(test) else {
        return;
    };
    let dir = TempDir::new("kubernetes-monitors");
    for (file, kind, schema) in &m.each {
        let docs = documents(&m.python, &manifest(file));
        let out = check_jsonschema(&m.check, &dir, schema, of_kind(&docs, kind));
        let said = text(&out);
        report(&format!(
            "check-jsonschema, {kind} of {file} against {PROMETHEUS_OPERATOR}'s CRD: {said}"
        ));
        assert!(out.status.success(), "{file}: {said}");
    }
}

/// The same schemas reject a wrong type (what the CRD itself says) and a misspelt field
/// (what the tightening adds).
#[test]
fn the_crd_check_rejects_broken_monitors() {
    let test = "the_crd_check_rejects_broken_monitors";
    let Some(m) = monitors(test) else {
        return;
    };
    let dir = TempDir::new("kubernetes-monitors-broken");
    for (file, kind, schema) in &m.each {
        let docs = documents(&m.python, &manifest(file));
        let good = of_kind(&docs, kind);
        let list = if *kind == "PodMonitor" {
            "podMetricsEndpoints"
        } else {
            "endpoints"
        };
        let mut not_a_list = good.clone();
        not_a_list["spec"][list] = json!({});
        let mut misspelt = good.clone();
        let endpoint = misspelt["spec"][list][0].as_object_mut().expect("endpoint");
        let interval = endpoint.remove("interval").expect("an interval");
        endpoint.insert("intervall".into(), interval);
        for (broken, complaint) in [
            (
                not_a_list,
                format!("$.spec.{list}: {{}} is not of type 'array'"),
            ),
            (misspelt, "('intervall' was unexpected)".to_owned()),
        ] {
            let out = check_jsonschema(&m.check, &dir, schema, &broken);
            let said = text(&out);
            assert!(!out.status.success(), "{kind} passed broken: {said}");
            assert!(said.contains(&complaint), "{kind}: {said}");
            report(&format!("check-jsonschema on a broken {kind}: {said}"));
        }
    }
}

/// What the manifests say, as JSON.
struct Manifests {
    daemonset: Value,
    configmap: Value,
    service: Value,
    podmonitor: Value,
    servicemonitor: Value,
}

fn manifests(test: &str) -> Option<Manifests> {
    let python = checker(test, "python")?;
    let deploy = documents(&python, &manifest("daemonset.yaml"));
    let service = documents(&python, &manifest("servicemonitor.yaml"));
    let pod = documents(&python, &manifest("podmonitor.yaml"));
    Some(Manifests {
        daemonset: of_kind(&deploy, "DaemonSet").clone(),
        configmap: of_kind(&deploy, "ConfigMap").clone(),
        service: of_kind(&service, "Service").clone(),
        podmonitor: of_kind(&pod, "PodMonitor").clone(),
        servicemonitor: of_kind(&service, "ServiceMonitor").clone(),
    })
}

fn container(daemonset: &Value) -> &Value {
    let containers = daemonset["spec"]["template"]["spec"]["containers"]
        .as_array()
        .expect("containers");
    assert_eq!(containers.len(), 1);
    &containers[0]
}

fn strings(value: &Value) -> Vec<&str> {
    value
        .as_array()
        .unwrap_or_else(|| panic!("not a list: {value}"))
        .iter()
        .map(|v| v.as_str().expect("a string"))
        .collect()
}

#[test]
fn the_config_map_holds_the_shipped_config_where_the_daemon_reads_it() {
    let test = "the_config_map_holds_the_shipped_config_where_the_daemon_reads_it";
    let Some(m) = manifests(test) else {
        return;
    };
    let shipped =
        std::fs::read_to_string(workspace_root().join("deploy/config/backlogd.toml")).unwrap();
    let data = m.configmap["data"].as_object().expect("data");
    assert_eq!(data.len(), 1, "{data:?}");
    let (key, embedded) = data.iter().next().unwrap();
    assert!(
        embedded.as_str() == Some(shipped.as_str()),
        "the ConfigMap's {key} differs from deploy/config/backlogd.toml: copy the file into \
         it again (indented by four spaces)"
    );
    // --config names the file the ConfigMap volume puts there.
    let c = container(&m.daemonset);
    let args = strings(&c["args"]);
    let config = args[args
        .iter()
        .position(|a| *a == "--config")
        .expect("--config")
        + 1];
    let volume = m.daemonset["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["configMap"]["name"] == m.configmap["metadata"]["name"])
        .expect("a volume of the ConfigMap");
    let mount = c["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == volume["name"])
        .expect("the ConfigMap's volume mounted");
    assert_eq!(
        config,
        format!("{}/{key}", mount["mountPath"].as_str().unwrap())
    );
}

/// The daemon's own reading of the container's command line with the ConfigMap's file
/// (`check-config` prints the settings in force), against the port the manifests expose.
#[test]
fn the_ports_and_the_pin_directory_are_the_daemons() {
    let test = "the_ports_and_the_pin_directory_are_the_daemons";
    let Some(m) = manifests(test) else {
        return;
    };
    let c = container(&m.daemonset);
    assert_eq!(strings(&c["command"]), ["/usr/bin/backlogd"]);
    let args = strings(&c["args"]);
    assert_eq!(args[0], "run");
    let shipped = workspace_root().join("deploy/config/backlogd.toml");
    let args: Vec<&str> = args[1..]
        .iter()
        .map(|a| {
            if a.ends_with("backlogd.toml") {
                shipped.to_str().unwrap()
            } else {
                a
            }
        })
        .collect();
    let out = Command::new(binary())
        .arg("check-config")
        .args(&args)
        .output()
        .expect("running backlogd check-config");
    assert!(out.status.success(), "{}", text(&out));
    let settings: toml::Table =
        toml::from_str(&String::from_utf8_lossy(&out.stdout)).expect("check-config's TOML");
    let listen = settings["listen"].as_str().expect("listen");
    let port: u64 = listen.rsplit_once(':').unwrap().1.parse().unwrap();

    let ports = c["ports"].as_array().expect("ports");
    assert_eq!(ports.len(), 1);
    assert_eq!(
        ports[0]["containerPort"], port,
        "the daemon listens on {listen}"
    );
    let name = &ports[0]["name"];
    for probe in ["startupProbe", "readinessProbe", "livenessProbe"] {
        assert_eq!(c[probe]["httpGet"]["port"], *name, "{probe}");
        assert_eq!(c[probe]["httpGet"]["path"], "/healthz", "{probe}");
    }
    assert_eq!(
        m.podmonitor["spec"]["podMetricsEndpoints"][0]["port"],
        *name
    );
    let service_port = &m.service["spec"]["ports"][0];
    assert_eq!(service_port["port"], port);
    assert_eq!(service_port["targetPort"], *name);
    assert_eq!(
        m.servicemonitor["spec"]["endpoints"][0]["port"],
        service_port["name"]
    );

    // Pins need the host's bpffs, writable, at the configured directory.
    let pin_dir = settings["pin_dir"].as_str().expect("pin_dir");
    let mounts = c["volumeMounts"].as_array().unwrap();
    let bpffs = mounts
        .iter()
        .find(|v| pin_dir.starts_with(&format!("{}/", v["mountPath"].as_str().unwrap())))
        .unwrap_or_else(|| panic!("nothing mounted above pin_dir {pin_dir}"));
    assert_ne!(bpffs["readOnly"], true);
    let volume = m.daemonset["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == bpffs["name"])
        .unwrap();
    assert_eq!(volume["hostPath"]["path"], "/sys/fs/bpf");
}

/// The pod gets what the systemd unit's daemon gets, except that CAP_SYS_ADMIN stands in
/// for CAP_BPF and for what the unit's load step has as root (CAP_PERFMON, CAP_NET_ADMIN):
/// the pod loads in its own process, and the runtimes' default seccomp profiles
/// (RuntimeDefault; containers/common's, Docker's) allow bpf(2) and perf_event_open only
/// to a container holding CAP_SYS_ADMIN. (The daemon then keeps CAP_SYS_ADMIN for the maps
/// where it would keep CAP_BPF: backlogd/src/service/caps.rs.) Kubernetes spells them
/// without the CAP_ prefix.
#[test]
fn the_capabilities_are_the_systemd_units() {
    let test = "the_capabilities_are_the_systemd_units";
    let Some(m) = manifests(test) else {
        return;
    };
    let unit =
        std::fs::read_to_string(workspace_root().join("deploy/systemd/backlogd.service")).unwrap();
    let bounding: BTreeSet<String> = unit
        .lines()
        .find_map(|l| l.strip_prefix("CapabilityBoundingSet="))
        .expect("CapabilityBoundingSet=")
        .split_whitespace()
        .map(|c| c.strip_prefix("CAP_").expect("CAP_ prefix").to_owned())
        .filter(|c| !["BPF", "PERFMON", "NET_ADMIN"].contains(&c.as_str()))
        .chain(["SYS_ADMIN".to_owned()])
        .collect();
    let security = &container(&m.daemonset)["securityContext"];
    let added: BTreeSet<String> = strings(&security["capabilities"]["add"])
        .into_iter()
        .map(str::to_owned)
        .collect();
    assert_eq!(added, bounding);
    assert_eq!(strings(&security["capabilities"]["drop"]), ["ALL"]);
    // Not privileged: the capabilities above are all it gets.
    assert_ne!(security["privileged"], true);
    assert_eq!(security["runAsUser"], 0);
    let pod = &m.daemonset["spec"]["template"]["spec"];
    assert_eq!(pod["hostPID"], true);
    assert_eq!(pod["hostNetwork"], true);
}

fn workspace_version() -> String {
    let cargo: toml::Table =
        toml::from_str(&std::fs::read_to_string(workspace_root().join("Cargo.toml")).unwrap())
            .unwrap();
    cargo["workspace"]["package"]["version"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[test]
fn the_image_the_labels_and_the_selectors_agree() {
    let test = "the_image_the_labels_and_the_selectors_agree";
    let Some(m) = manifests(test) else {
        return;
    };
    let version = workspace_version();
    let version = version.as_str();
    let c = container(&m.daemonset);
    assert_eq!(c["image"], format!("localhost/backlogd:{version}"));
    let template = &m.daemonset["spec"]["template"];
    assert_eq!(
        template["metadata"]["labels"]["app.kubernetes.io/version"],
        version
    );
    assert_eq!(
        m.daemonset["metadata"]["labels"]["app.kubernetes.io/version"],
        version
    );

    let pod_labels = template["metadata"]["labels"].as_object().unwrap();
    let selects = |selector: &Value| {
        selector
            .as_object()
            .expect("matchLabels")
            .iter()
            .all(|(k, v)| pod_labels.get(k) == Some(v))
    };
    assert!(selects(&m.daemonset["spec"]["selector"]["matchLabels"]));
    assert!(selects(&m.podmonitor["spec"]["selector"]["matchLabels"]));
    assert!(selects(&m.service["spec"]["selector"]));
    let service_labels = m.service["metadata"]["labels"].as_object().unwrap();
    let matches = m.servicemonitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .unwrap();
    assert!(
        matches
            .iter()
            .all(|(k, v)| service_labels.get(k) == Some(v))
    );
    // prometheus-operator looks for the pods or the Service in the monitor's namespace
    // unless told otherwise.
    for object in [&m.daemonset, &m.service, &m.podmonitor, &m.servicemonitor] {
        assert_eq!(object["metadata"]["namespace"], "backlogd");
    }
    // The AppArmor annotation for kubelets before 1.30 says what the field says.
    let annotation = &template["metadata"]["annotations"][format!(
        "container.apparmor.security.beta.kubernetes.io/{}",
        c["name"].as_str().unwrap()
    )];
    assert_eq!(annotation, "unconfined");
    assert_eq!(
        c["securityContext"]["appArmorProfile"]["type"],
        "Unconfined"
    );
}

/// `podman run` arguments for the DaemonSet's one container: its pod's host namespaces, its
/// securityContext, its volumes (a ConfigMap's written to `scratch`), its command.
fn podman_run_args(m: &Manifests, scratch: &Path) -> Vec<String> {
    let pod = &m.daemonset["spec"]["template"]["spec"];
    let c = container(&m.daemonset);
    let mut args: Vec<String> = Vec::new();
    let mut arg = |a: &str| args.push(a.to_owned());
    if pod["hostPID"] == true {
        arg("--pid=host");
    }
    if pod["hostNetwork"] == true {
        arg("--network=host");
    }
    // A cgroup v2 node gives every container a cgroup namespace of its own.
    arg("--cgroupns=private");
    let security = &c["securityContext"];
    assert_ne!(security["privileged"], true);
    for cap in strings(&security["capabilities"]["drop"]) {
        arg(&format!("--cap-drop={cap}"));
    }
    for cap in strings(&security["capabilities"]["add"]) {
        arg(&format!("--cap-add=CAP_{cap}"));
    }
    arg(&format!(
        "--user={}:{}",
        security["runAsUser"], security["runAsGroup"]
    ));
    if security["readOnlyRootFilesystem"] == true {
        // Kubernetes mounts no tmpfs of its own on a read-only root; podman would.
        arg("--read-only");
        arg("--read-only-tmpfs=false");
    }
    // podman's default seccomp filter is the runtime default: the same rules (moby's)
    // containerd and CRI-O apply for RuntimeDefault.
    assert_eq!(security["seccompProfile"]["type"], "RuntimeDefault");
    if security["appArmorProfile"]["type"] == "Unconfined" {
        arg("--security-opt=apparmor=unconfined");
    }
    // seLinuxOptions: not translated; no SELinux on the machines this runs on.
    let volumes = pod["volumes"].as_array().expect("volumes");
    for mount in c["volumeMounts"].as_array().expect("volumeMounts") {
        let volume = volumes
            .iter()
            .find(|v| v["name"] == mount["name"])
            .unwrap_or_else(|| panic!("no volume for {mount}"));
        let source = if let Some(host) = volume["hostPath"].as_object() {
            let path = PathBuf::from(host["path"].as_str().unwrap());
            // What the kubelet checks (or does) before it starts the container.
            match host.get("type").and_then(Value::as_str).unwrap_or("") {
                "Directory" => {
                    assert!(path.is_dir(), "hostPath {} is no directory", path.display())
                }
                "DirectoryOrCreate" => std::fs::create_dir_all(&path).unwrap(),
                other => panic!("hostPath type {other:?}: teach this test what the kubelet does"),
            }
            path
        } else if let Some(name) = volume["configMap"]["name"].as_str() {
            assert_eq!(m.configmap["metadata"]["name"], name);
            let dir = scratch.join(name);
            std::fs::create_dir_all(&dir).unwrap();
            for (key, value) in m.configmap["data"].as_object().unwrap() {
                std::fs::write(dir.join(key), value.as_str().unwrap()).unwrap();
            }
            dir
        } else {
            panic!("volume {volume}: teach this test its kind");
        };
        let mut options = vec![];
        if mount["readOnly"] == true {
            options.push("ro");
        }
        match mount["mountPropagation"].as_str() {
            Some("HostToContainer") => options.push("rslave"),
            None | Some("None") => options.push("rprivate"),
            Some(other) => panic!("mountPropagation {other}: teach this test"),
        }
        arg(&format!(
            "--volume={}:{}:{}",
            source.display(),
            mount["mountPath"].as_str().unwrap(),
            options.join(",")
        ));
    }
    let command = strings(&c["command"]);
    assert_eq!(command.len(), 1);
    arg(&format!("--entrypoint={}", command[0]));
    args
}

/// The image of the binary under test, built by `cargo xtask image` under a name of the
/// test's own and loaded into podman (no registry: the DaemonSet's pull policy
/// IfNotPresent is what makes a loaded image enough on a node too).
fn load_image(scratch: &Path, reference: &str) -> Podman {
    let archive = scratch.join("image.tar");
    xtask_image(&archive, reference);
    let image = Podman::Image(reference.to_owned());
    let out = podman(&["load", "--input", archive.to_str().unwrap()]);
    assert!(out.status.success(), "podman load: {}", text(&out));
    image
}

fn free_loopback_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// Effective and bounding capability sets of `pid`, as /proc shows them.
fn capabilities(pid: &str) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let set = |name: &str| {
        let hex = status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name}"));
        u64::from_str_radix(hex.trim(), 16).unwrap()
    };
    (set("CapEff:"), set("CapBnd:"))
}

#[test]
fn the_daemonsets_pod_runs_with_only_what_its_spec_grants() {
    let test = "the_daemonsets_pod_runs_with_only_what_its_spec_grants";
    if !tools::available(test, "podman", &["--version"], "podman") {
        return;
    }
    let Some(m) = manifests(test) else {
        return;
    };
    let scratch = TempDir::new("kubernetes-pod");
    let reference = format!("localhost/backlogd-kubernetes-test:{}", workspace_version());
    let _image = load_image(scratch.path(), &reference);

    // A listener outside the container, in a network namespace of its own: found by the
    // scan iterator (hostPID: it sees this process's descriptors); its SYNs counted by
    // probes the pod's privileges loaded.
    let ns = Netns::new();
    let listener = Listener::open(&ns, "127.0.0.1:0", 16);

    // Where this differs from the manifest: a free loopback port instead of the node's
    // :9851, and a pin directory of the test's own instead of the node's.
    let port = free_loopback_port();
    let pins = PinDir::new("kubernetes");
    let name = format!("backlogd-kubernetes-test-{}", std::process::id());
    let mut run: Vec<String> = ["run", "--detach", "--name", &name]
        .map(str::to_owned)
        .to_vec();
    // This machine kind's hard rlimits are below podman's defaults (tests/tests/podman.rs).
    run.extend(["--ulimit=nofile=1024:1024", "--ulimit=nproc=1024:1024"].map(str::to_owned));
    run.extend(podman_run_args(&m, scratch.path()));
    run.push(reference.clone());
    let c = container(&m.daemonset);
    run.extend(strings(&c["args"]).into_iter().map(str::to_owned));
    run.extend(["--listen".into(), format!("127.0.0.1:{port}")]);
    run.extend(["--pin-dir".into(), pins.arg().to_owned()]);
    if let Some(mode) = hook_mode() {
        run.extend(["--hook-mode".into(), mode]);
    }
    report(&format!("podman {}\n", run.join(" ")));
    let run: Vec<&str> = run.iter().map(String::as_str).collect();
    let out = podman(&run);
    let _container = Podman::Container(name.clone());
    assert!(out.status.success(), "podman run: {}", text(&out));

    let logs = || text(&podman(&["logs", &name]));
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let probe = c["readinessProbe"]["httpGet"]["path"].as_str().unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if matches!(http::try_get(addr, probe), Ok((200, _))) {
            break;
        }
        let state = text(&podman(&[
            "inspect",
            "--format",
            "{{.State.Status}}",
            &name,
        ]));
        assert!(
            state.trim() == "running" && Instant::now() < deadline,
            "the pod's container never answered {probe} ({}):\n{}",
            state.trim(),
            logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // What the daemon holds is what the spec adds, less SYS_ADMIN where bpf(2) on its maps
    // does not need it (6.1+: it stands in for CAP_BPF only), and nothing else; it cannot
    // regain more (the bounding set).
    let pid = text(&podman(&["inspect", "--format", "{{.State.Pid}}", &name]));
    let granted = strings(&c["securityContext"]["capabilities"]["add"])
        .into_iter()
        .map(|cap| match cap {
            "SYS_ADMIN" => 1u64 << 21,
            "SYS_PTRACE" => 1 << 19,
            "DAC_READ_SEARCH" => 1 << 2,
            other => panic!("{other}: add its number here"),
        })
        .fold(0, |all, bit| all | bit);
    let (effective, bounding) = capabilities(pid.trim());
    let kept = match caps::daemon_keeps_cap_bpf() {
        Some(true) => granted,
        Some(false) => granted & !(1 << 21),
        None => effective,
    };
    assert_eq!(effective, kept, "CapEff {effective:#x}");
    assert_eq!(bounding, granted, "CapBnd {bounding:#x}");

    let clients = connect_burst(&ns, listener.addr, 3);
    let socket = listener.inode.to_string();
    let netns = ns.inode().to_string();
    let deadline = Instant::now() + Duration::from_secs(20);
    let scrape = loop {
        let scrape = Scrape::parse(&http::get(addr, "/metrics").1);
        let syns = scrape.value(
            "backlogd_listen_syns_received_total",
            &[("socket", &socket), ("netns", &netns)],
        );
        if syns == Some(3.0) {
            break scrape;
        }
        assert!(
            Instant::now() < deadline && syns.is_none_or(|n| n < 3.0),
            "SYNs of the listener in netns {netns}: {syns:?}, 3 sent\n{}",
            logs()
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    drop(clients);
    assert_eq!(scrape.value("backlogd_pinned", &[]), Some(1.0));
    report(&format!(
        "the DaemonSet's pod under podman: {} mode, pinned, CapEff {kept:#x}, CapBnd {granted:#x}, \
         3 of 3 SYNs counted in another network namespace\n",
        scrape.hook_mode()
    ));
}
