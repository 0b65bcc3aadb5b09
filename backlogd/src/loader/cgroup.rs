//! BPF_PROG_ATTACH / BPF_PROG_DETACH of a cgroup_skb ingress program, detached on drop.

use std::{
    fs::File,
    os::fd::{AsRawFd as _, OwnedFd},
};

const BPF_PROG_ATTACH: libc::c_long = 8;
const BPF_PROG_DETACH: libc::c_long = 9;
const BPF_CGROUP_INET_INGRESS: u32 = 0;
const BPF_F_ALLOW_MULTI: u32 = 1 << 1;

/// The prefix of `union bpf_attr` used by BPF_PROG_ATTACH/DETACH (uapi, stable).
#[repr(C)]
#[derive(Default)]
struct AttachAttr {
    target_fd: u32,
    attach_bpf_fd: u32,
    attach_type: u32,
    attach_flags: u32,
    replace_bpf_fd: u32,
    _rest: [u32; 11],
}

/// A program attached to a cgroup; detaches (only itself) when dropped.
pub struct CgroupAttachment {
    cgroup: File,
    prog: OwnedFd,
}

impl CgroupAttachment {
    pub fn attach(cgroup: File, prog: OwnedFd) -> std::io::Result<Self> {
        bpf(BPF_PROG_ATTACH, &cgroup, &prog)?;
        Ok(Self { cgroup, prog })
    }
}

impl Drop for CgroupAttachment {
    fn drop(&mut self) {
        if let Err(e) = bpf(BPF_PROG_DETACH, &self.cgroup, &self.prog) {
            tracing::warn!(error = %e, "detaching cgroup_skb program");
        }
    }
}

fn bpf(cmd: libc::c_long, cgroup: &File, prog: &OwnedFd) -> std::io::Result<()> {
    let attr = AttachAttr {
        target_fd: cgroup.as_raw_fd() as u32,
        attach_bpf_fd: prog.as_raw_fd() as u32,
        attach_type: BPF_CGROUP_INET_INGRESS,
        attach_flags: BPF_F_ALLOW_MULTI,
        ..Default::default()
    };
    // SAFETY: bpf(2) reads `size_of::<AttachAttr>()` bytes from a valid, initialised struct.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            &raw const attr,
            size_of::<AttachAttr>() as libc::c_uint,
        )
    };
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}
