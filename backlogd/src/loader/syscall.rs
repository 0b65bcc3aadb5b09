//! bpf(2) commands backlogd makes itself: those aya 0.14 lacks (batch lookups) or gets
//! wrong on some kernels (cgroup link creation, see `cgroup.rs`).

/// `bpf(cmd, attr, sizeof attr)`: the return value, or the errno as an error.
///
/// # Safety
/// `A` must be the uapi `union bpf_attr` layout `cmd` reads (a prefix of it), and every
/// pointer in it must be valid for what the kernel reads or writes through it.
pub unsafe fn bpf<A>(cmd: libc::c_long, attr: &mut A) -> std::io::Result<i64> {
    // SAFETY: the caller's contract above; the kernel reads and may write back `attr`.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            std::ptr::from_mut(attr),
            size_of::<A>() as libc::c_uint,
        )
    };
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}
