//! OCI image archives (`ctr images import` reads them) made without a registry: one
//! uncompressed layer of a directory, and the two images the CRI suite runs.

use std::{
    io::Write as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use serde_json::{Value, json};

use super::cri::{APP_IMAGE, PAUSE_IMAGE};

/// An OCI image archive (`ctr images import` reads it) of one uncompressed layer made
/// from `rootfs`, named `name` (containerd takes the name from the index's
/// `io.containerd.image.name` annotation).
pub fn oci_archive(dir: &Path, name: &str, rootfs: &Path, config: Value) -> PathBuf {
    let stem = name.replace(['/', ':'], "_");
    let layout = dir.join(format!("{stem}.oci"));
    let blobs = layout.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    let blob = |bytes: &[u8], media_type: &str| -> (Value, String) {
        let digest = sha256(bytes);
        std::fs::write(blobs.join(&digest), bytes).unwrap();
        (
            json!({
                "mediaType": media_type,
                "digest": format!("sha256:{digest}"),
                "size": bytes.len(),
            }),
            digest,
        )
    };
    let layer = Command::new("tar")
        .args([
            "--sort=name",
            "--owner=0",
            "--group=0",
            "--numeric-owner",
            "--mtime=@0",
            "-C",
        ])
        .arg(rootfs)
        .args(["-cf", "-", "."])
        .output()
        .expect("running tar");
    assert!(
        layer.status.success(),
        "tar: {}",
        String::from_utf8_lossy(&layer.stderr)
    );
    let (layer, diff_id) = blob(&layer.stdout, "application/vnd.oci.image.layer.v1.tar");
    let image_config = json!({
        "architecture": "amd64",
        "os": "linux",
        "config": config,
        "rootfs": { "type": "layers", "diff_ids": [format!("sha256:{diff_id}")] },
    });
    let (config, _) = blob(
        image_config.to_string().as_bytes(),
        "application/vnd.oci.image.config.v1+json",
    );
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": config,
        "layers": [layer],
    });
    let (mut manifest, _) = blob(
        manifest.to_string().as_bytes(),
        "application/vnd.oci.image.manifest.v1+json",
    );
    manifest["annotations"] = json!({
        "io.containerd.image.name": name,
        "org.opencontainers.image.ref.name": name.rsplit(':').next().unwrap(),
    });
    let index = json!({ "schemaVersion": 2, "manifests": [manifest] });
    std::fs::write(layout.join("index.json"), index.to_string()).unwrap();
    std::fs::write(
        layout.join("oci-layout"),
        r#"{"imageLayoutVersion":"1.0.0"}"#,
    )
    .unwrap();
    let archive = dir.join(format!("{stem}.tar"));
    let out = Command::new("tar")
        .arg("-C")
        .arg(&layout)
        .arg("-cf")
        .arg(&archive)
        .args(["oci-layout", "index.json", "blobs"])
        .output()
        .expect("running tar");
    assert!(
        out.status.success(),
        "tar: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    archive
}

fn sha256(bytes: &[u8]) -> String {
    let mut child = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("running sha256sum");
    child.stdin.take().unwrap().write_all(bytes).unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .expect("sha256sum's digest")
        .to_owned()
}

/// The pause image: busybox-static sleeping (a static binary: the sandbox container has
/// nothing else). SIGKILL stops it (CRI's StopPodSandbox kills the sandbox container).
pub fn pause_image(dir: &Path) -> PathBuf {
    let root = dir.join("pause-rootfs");
    std::fs::create_dir_all(root.join("bin")).unwrap();
    std::fs::copy("/bin/busybox", root.join("bin/busybox")).expect("copying /bin/busybox");
    oci_archive(
        dir,
        PAUSE_IMAGE,
        &root,
        json!({ "Entrypoint": ["/bin/busybox", "sleep", "2147483647"] }),
    )
}

/// The app image: a root of symlinks into /usr (merged-/usr Debian), which the
/// container's CRI mount binds from the host.
pub fn app_image(dir: &Path) -> PathBuf {
    let root = dir.join("app-rootfs");
    super::usr_rootfs(&root);
    oci_archive(dir, APP_IMAGE, &root, json!({}))
}
