//! A cgroup_skb ingress program attached to a cgroup through a BPF link.
//!
//! A link lives exactly as long as its fd: if the daemon dies, even by SIGKILL, the kernel
//! detaches the program. (BPF_PROG_ATTACH attachments outlive their process and pile up
//! until the cgroup's 64-program limit is hit.) aya 0.14 creates the same kind of link
//! but its attach returns EINVAL on the 6.18 CI kernel, so the syscall is made here.

use std::{
    fs::File,
    os::fd::{AsFd as _, AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
};

const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_CGROUP_INET_INGRESS: u32 = 0;

/// The prefix of `union bpf_attr` that BPF_LINK_CREATE reads for cgroup links (uapi,
/// stable); the kernel treats the omitted tail as zero.
#[repr(C)]
#[derive(Default)]
struct LinkCreateAttr {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
    _rest: [u32; 12],
}

/// Holds the link; dropping it (or the process dying) detaches the program.
pub struct CgroupAttachment {
    link: OwnedFd,
}

impl CgroupAttachment {
    pub fn attach(cgroup: File, prog: OwnedFd) -> std::io::Result<Self> {
        let mut attr = LinkCreateAttr {
            prog_fd: prog.as_raw_fd() as u32,
            target_fd: cgroup.as_raw_fd() as u32,
            attach_type: BPF_CGROUP_INET_INGRESS,
            ..Default::default()
        };
        // SAFETY: LinkCreateAttr is the BPF_LINK_CREATE prefix of bpf_attr; it holds no
        // pointers.
        let fd = unsafe { super::syscall::bpf(BPF_LINK_CREATE, &mut attr) }?;
        // SAFETY: the kernel just returned this fd and nothing else owns it.
        let link = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        Ok(Self { link })
    }

    /// The link, for pinning.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.link.as_fd()
    }
}
