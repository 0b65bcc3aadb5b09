//! Whether this kernel can attach BPF trampolines (fentry/fexit), found by trying.
//!
//! The probe is aya's (`is_program_supported(ProgramType::Tracing)`): load the smallest
//! fentry program against `bpf_fentry_test1` and attach it, since some kernels load
//! tracing programs but cannot attach them (arm64 before 6.4 answers ENOTSUPP). aya looks
//! up the function's BTF id in a parse of the kernel's BTF of its own, a third one at each
//! start (after `EbpfLoader::new`'s and the loader's): 20-27 ms of a ~240 ms start on
//! the host (measured at 1477adb; not measured apart in the TCG guests, where a whole
//! start takes about 2 s). Here the id comes from the parse the layout is read from.
//!
//! What proves it: the kernel matrix's fentry cells (a probe that said no would refuse
//! `--hook-mode fentry` there) and the CI host, which loads tracing programs but has no
//! trampolines (`cli::hook_mode_the_kernel_lacks_is_refused_with_the_fix`).

use std::{
    io,
    os::fd::{FromRawFd as _, OwnedFd},
};

use aya_obj::generated::{bpf_attach_type, bpf_attr, bpf_cmd, bpf_prog_type};

/// The kernel function the probe attaches to: built into every kernel with BPF and
/// networking (net/bpf/test_run.c), and there to be traced.
pub const TARGET: &str = "bpf_fentry_test1";

/// `r0 = 0; exit`, as bytes: registers, offset and immediate all zero, so one encoding
/// for either byte order.
static RETURN_0: [u8; 16] = [0xb7, 0, 0, 0, 0, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0];

/// ENOTSUPP (kernel-internal, 524): loaded, but this kernel has no trampoline to attach.
const ENOTSUPP: i32 = 524;

/// Whether an fentry program on the function of BTF id `target` loads and attaches (the
/// link is closed at once).
pub fn attachable(target: u32) -> bool {
    match load_fentry(target).and_then(|prog| attach(&prog)) {
        Ok(_link) => true,
        Err(e) => {
            let reason = match e.raw_os_error() {
                Some(ENOTSUPP) => "the kernel cannot attach BPF trampolines (ENOTSUPP)".into(),
                _ => e.to_string(),
            };
            tracing::debug!(%reason, "no fentry mode: the trampoline probe failed");
            false
        }
    }
}

fn load_fentry(target: u32) -> io::Result<OwnedFd> {
    match try_load_fentry(target) {
        // Before 5.11 a program's memory counts against RLIMIT_MEMLOCK, which every
        // BPF object of the same user shares: aya raises it on EPERM there and loads
        // again, and so does this (aya, loading next, then finds it raised). From 5.11
        // EPERM means a missing privilege, and the limit stays.
        Err(e) if e.raw_os_error() == Some(libc::EPERM) && before_5_11() && raise_memlock() => {
            try_load_fentry(target)
        }
        loaded => loaded,
    }
}

fn before_5_11() -> bool {
    use aya::util::KernelVersion;
    KernelVersion::current().is_ok_and(|v| v < KernelVersion::new(5, 11, 0))
}

/// Lifts RLIMIT_MEMLOCK; whether it was lower.
fn raise_memlock() -> bool {
    let unlimited = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    let mut now = unlimited;
    // SAFETY: getrlimit and setrlimit read or write one rlimit we own.
    unsafe {
        libc::getrlimit(libc::RLIMIT_MEMLOCK, &raw mut now) == 0
            && now.rlim_cur != libc::RLIM_INFINITY
            && libc::setrlimit(libc::RLIMIT_MEMLOCK, &raw const unlimited) == 0
    }
}

fn try_load_fentry(target: u32) -> io::Result<OwnedFd> {
    // SAFETY: bpf_attr is plain data; all-zero is every command's empty request.
    let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
    // SAFETY: writing the BPF_PROG_LOAD member of a zeroed union.
    let load = unsafe { &mut attr.__bindgen_anon_3 };
    load.prog_type = bpf_prog_type::BPF_PROG_TYPE_TRACING as u32;
    load.expected_attach_type = bpf_attach_type::BPF_TRACE_FENTRY as u32;
    load.attach_btf_id = target;
    load.insns = RETURN_0.as_ptr() as u64;
    load.insn_cnt = (RETURN_0.len() / 8) as u32;
    load.license = c"GPL".as_ptr() as u64;
    sys_bpf(bpf_cmd::BPF_PROG_LOAD, &mut attr)
}

fn attach(prog: &OwnedFd) -> io::Result<OwnedFd> {
    use std::os::fd::AsRawFd as _;
    // SAFETY: as above.
    let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
    // A tracing program attaches through BPF_RAW_TRACEPOINT_OPEN with no name (5.5+).
    attr.raw_tracepoint.prog_fd = prog.as_raw_fd() as u32;
    sys_bpf(bpf_cmd::BPF_RAW_TRACEPOINT_OPEN, &mut attr)
}

/// bpf(2) for a command that returns a new file descriptor.
fn sys_bpf(cmd: bpf_cmd, attr: &mut bpf_attr) -> io::Result<OwnedFd> {
    // SAFETY: the kernel reads (and may write) `attr`, which is as large as we say; the
    // pointers in it (instructions, license) outlive the call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd as libc::c_long,
            std::ptr::from_mut(attr),
            std::mem::size_of::<bpf_attr>(),
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: for these commands a non-negative result is a new fd, now ours.
    Ok(unsafe { OwnedFd::from_raw_fd(ret as i32) })
}
