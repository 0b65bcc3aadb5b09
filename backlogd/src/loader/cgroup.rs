//! A cgroup_skb ingress program attached to a cgroup through a BPF link.
//!
//! A link lives exactly as long as its fd: if the daemon dies, even by SIGKILL, the kernel
//! detaches the program. (BPF_PROG_ATTACH attachments outlive their process and pile up
//! until the cgroup's 64-program limit is hit.) aya 0.14 creates the same kind of link
//! but its attach returns EINVAL on the 6.18 CI kernel, so backlogd makes the syscall
//! itself (`crate::bpf_syscall`).

use std::{
    fs::File,
    os::fd::{AsFd as _, BorrowedFd, OwnedFd},
};

/// Holds the link; dropping it (or the process dying) detaches the program.
pub struct CgroupAttachment {
    link: OwnedFd,
}

impl CgroupAttachment {
    pub fn attach(cgroup: File, prog: OwnedFd) -> std::io::Result<Self> {
        let link = crate::bpf_syscall::link_cgroup_ingress(prog.as_fd(), cgroup.as_fd())?;
        Ok(Self { link })
    }

    /// The link, for pinning.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.link.as_fd()
    }
}
