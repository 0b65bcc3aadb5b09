use anyhow::{Context as _, anyhow};
use aya_build::{Package, Toolchain};

// Builds backlogd-ebpf for the BPF target on every build and leaves the object in OUT_DIR,
// where src/loader embeds it.
fn main() -> anyhow::Result<()> {
    let cargo_metadata::Metadata { packages, .. } = cargo_metadata::MetadataCommand::new()
        .no_deps()
        .exec()
        .context("cargo metadata")?;
    let ebpf = packages
        .into_iter()
        .find(|p| p.name.as_str() == "backlogd-ebpf")
        .ok_or_else(|| anyhow!("backlogd-ebpf package not found in the workspace"))?;
    let root_dir = ebpf
        .manifest_path
        .parent()
        .ok_or_else(|| anyhow!("no parent for {}", ebpf.manifest_path))?;
    aya_build::build_ebpf(
        [Package {
            name: ebpf.name.as_str(),
            root_dir: root_dir.as_str(),
            ..Default::default()
        }],
        Toolchain::default(),
    )
}
