//! Loading the scan iterator (`backlogd-ebpf/src/scan.rs`), a second object beside the
//! hooks: the kernel's own view of every listener, read in one pass (`sampling/iterator.rs`
//! reads it). It has none of the hooks' maps and no hook, so it loads the same in every
//! hook mode and beside programs adopted from pins; where it cannot load, everything else
//! still works and only the figures it alone gives are missing.

use std::os::fd::{AsFd as _, OwnedFd};

use aya::{Ebpf, EbpfLoader, programs::Iter};
use backlogd_common::names;

use super::error::error_chain;

/// The scan object aya-build produced from backlogd-ebpf for this build.
static SCAN_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/backlogd-scan"));

/// The loaded iterator and its link; each pass is a new file opened from the link.
pub struct ScanIterator {
    /// Holds the program loaded; `None` when the link came from a pin (the link holds it).
    _ebpf: Option<Ebpf>,
    link: OwnedFd,
    /// Whether its records' listen sysctls are the namespaces' (the kernel's BTF gave
    /// their places in `struct net`, `btf::reads_listen_sysctls`): only then does it list
    /// listeners; without, it still reads the SYN queues.
    pub reads_sysctls: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    #[error("loading the scan object failed")]
    Load(#[source] aya::EbpfError),
    #[error("the scan object has no program `{0}` (build mismatch)")]
    Missing(&'static str),
    #[error(
        "the kernel refused the `{}` iterator (BPF iterators over task files need Linux \
         5.8+ with BTF)",
        names::scan::ITERATOR
    )]
    Program(#[source] aya::programs::ProgramError),
    #[error(
        "the kernel refused every `task_file` iterator (BPF iterators over task files need \
         Linux 5.8+ with BTF): {0}"
    )]
    Refused(String),
    #[error("creating the iterator's link failed")]
    Link(#[source] std::io::Error),
}

impl ScanIterator {
    /// Loads and links the iterator through `loader`, which the caller has given the
    /// running kernel's `btf` and the `OFFSETS` global (and nothing the scan object lacks).
    /// Needs the loading capabilities (CAP_BPF and CAP_PERFMON, or CAP_SYS_ADMIN); the
    /// passes later do not.
    pub fn load(
        loader: &mut EbpfLoader<'_>,
        btf: &aya::Btf,
        reads_sysctls: bool,
    ) -> Result<Self, ScanError> {
        let mut ebpf = loader.load(SCAN_OBJECT).map_err(ScanError::Load)?;
        // The first that loads: the typed one where the kernel has its helper.
        let mut refused = Vec::new();
        for name in names::scan::PROGRAMS {
            let program: &mut Iter = ebpf
                .program_mut(name)
                .ok_or(ScanError::Missing(name))?
                .try_into()
                .map_err(ScanError::Program)?;
            match program.load(names::scan::ITERATOR, btf) {
                Ok(()) => {
                    let fd = program.fd().map_err(ScanError::Program)?;
                    let link =
                        crate::bpf_syscall::link_iterator(fd.as_fd()).map_err(ScanError::Link)?;
                    tracing::debug!(program = name, "scan iterator loaded");
                    return Ok(Self {
                        _ebpf: Some(ebpf),
                        link,
                        reads_sysctls,
                    });
                }
                Err(e) => {
                    tracing::debug!(
                        program = name,
                        error = %e,
                        "scan iterator refused; trying the next"
                    );
                    refused.push(format!("{name}: {}", error_chain(&e)));
                }
            }
        }
        Err(ScanError::Refused(refused.join("; ")))
    }

    /// The iterator a load step (`backlogd load`) pinned at `path`: opening it needs no
    /// loading capability, so a daemon that adopts pins without them still scans.
    pub fn from_pin(path: &std::path::Path, reads_sysctls: bool) -> std::io::Result<Self> {
        Ok(Self {
            _ebpf: None,
            link: crate::bpf_syscall::obj_get(path)?,
            reads_sysctls,
        })
    }

    /// Pins the iterator's link at `path`, replacing what is there.
    pub fn pin(&self, path: &std::path::Path) -> std::io::Result<()> {
        match std::fs::remove_file(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        crate::bpf_syscall::obj_pin(self.link.as_fd(), path)
    }

    /// A new pass: reading the file to its end runs the program over every task's files.
    pub fn open(&self) -> std::io::Result<std::fs::File> {
        crate::bpf_syscall::iter_create(self.link.as_fd())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scan_object_has_its_program_and_no_map() {
        let object = aya_obj::Object::parse(SCAN_OBJECT).expect("the scan object parses");
        let mut programs: Vec<&str> = object.programs.keys().map(String::as_str).collect();
        programs.sort_unstable();
        assert_eq!(programs, names::scan::PROGRAMS);
        // Its globals only (OFFSETS in .rodata); the hooks' helpers bring two small
        // per-CPU arrays it never uses.
        let maps: Vec<&str> = object.maps.keys().map(String::as_str).collect();
        assert!(
            !maps.iter().any(|m| names::map::DAEMON.contains(m)),
            "no map of the hooks' state: {maps:?}"
        );
    }
}
