//! Safe access to kernel memory at offsets resolved at load time.
//!
//! rustc emits no CO-RE relocations, so every struct field and tracepoint record offset
//! comes from `OFFSETS`, which the daemon overrides before loading (from BTF and tracefs).

use aya_ebpf::{
    helpers::{bpf_get_current_task, bpf_probe_read_kernel},
    programs::TracePointContext,
};
use backlogd_common::KernelOffsets;

/// Filled in by the daemon with `EbpfLoader::override_global`; all zeros in the object file.
#[unsafe(no_mangle)]
static OFFSETS: KernelOffsets = KernelOffsets {
    task_files: 0,
    files_fdt: 0,
    fdtable_fd: 0,
    file_private_data: 0,
    socket_sk: 0,
    sk_socket: 0,
    socket_ino: 0,
    sk_family: 0,
    sk_state: 0,
    sk_num: 0,
    sk_rcv_saddr: 0,
    sk_v6_rcv_saddr: 0,
    sk_net: 0,
    sk_protocol: 0,
    sk_max_ack_backlog: 0,
    net_inum: 0,
    tp_listen_fd: 0,
    tp_listen_backlog: 0,
    tp_exit_ret: 0,
    tp_state_skaddr: 0,
    tp_state_oldstate: 0,
    tp_state_newstate: 0,
    tp_state_protocol: 0,
};

/// Errors are the helpers' negative errno values; programs only ever drop them.
pub type Result<T> = core::result::Result<T, i32>;

/// Reads one offset. Volatile so LLVM cannot fold the object file's zeros into the code.
#[inline(always)]
pub fn offset(select: fn(&KernelOffsets) -> &u32) -> usize {
    // SAFETY: `OFFSETS` is a valid, aligned static; volatile only defeats const-folding.
    (unsafe { core::ptr::read_volatile(select(&OFFSETS)) }) as usize
}

/// A kernel address we only ever read through `bpf_probe_read_kernel`.
#[derive(Clone, Copy)]
pub struct KPtr(pub u64);

impl KPtr {
    #[inline(always)]
    pub fn is_null(self) -> bool {
        self.0 == 0
    }

    /// Reads a `T` at `self + off`.
    #[inline(always)]
    pub fn read<T>(self, off: usize) -> Result<T> {
        // SAFETY: bpf_probe_read_kernel validates the source address and returns an error
        // instead of faulting, so any address is sound to pass.
        unsafe { bpf_probe_read_kernel((self.0 as usize + off) as *const T) }
    }

    /// Follows a pointer field at `self + off`; a NULL field is an error.
    #[inline(always)]
    pub fn deref(self, off: usize) -> Result<KPtr> {
        let p = KPtr(self.read::<u64>(off)?);
        if p.is_null() { Err(-14) } else { Ok(p) }
    }
}

/// The current task (`struct task_struct *`).
#[inline(always)]
pub fn current_task() -> KPtr {
    // SAFETY: the helper takes no arguments and returns the current task's address.
    KPtr(unsafe { bpf_get_current_task() })
}

/// Reads a tracepoint record field at `off`.
#[inline(always)]
pub fn tp_field<T>(ctx: &TracePointContext, off: usize) -> Result<T> {
    // SAFETY: read_at uses bpf_probe_read, which validates the address.
    unsafe { ctx.read_at::<T>(off) }
}

/// `struct socket *` behind file descriptor `fd` of the current task:
/// `current->files->fdt->fd[fd]->private_data`. The caller must know `fd` is a socket
/// (here: `listen(2)` on it just succeeded).
#[inline(always)]
pub fn socket_of_fd(fd: u64) -> Result<KPtr> {
    let files = current_task().deref(offset(|o| &o.task_files))?;
    let fdt = files.deref(offset(|o| &o.files_fdt))?;
    let fd_array = fdt.deref(offset(|o| &o.fdtable_fd))?;
    let file = fd_array.deref((fd as usize) * 8)?;
    file.deref(offset(|o| &o.file_private_data))
}
