//! Safe access to kernel memory at offsets resolved at load time.
//!
//! rustc emits no CO-RE relocations, so every struct field offset comes from `OFFSETS`,
//! which the daemon overrides before loading (from the running kernel's BTF).

use aya_ebpf::helpers::{
    bpf_get_current_task, bpf_probe_read_kernel, generated::bpf_skc_to_tcp_sock,
};
use backlogd_common::{AF_INET, AF_INET6, IPPROTO_TCP, KernelOffsets, TCP_LISTEN, fexit_ret};

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
    sk_ack_backlog: 0,
    net_mib_stats: 0,
    mib_index: [0; 4],
    bpf_array_pptrs: 0,
    icsk_syn_qlen: 0,
    request_sock_listener: 0,
    skb_head: 0,
    skb_transport_header: 0,
    regs_syscall_nr: 0,
    regs_arg0: 0,
    regs_arg1: 0,
    nr_accept: 0,
    nr_accept4: 0,
    nr_listen: 0,
    compat_flags: 0,
    compat_in_regs: 0,
    compat_mask: 0,
    skb_network_header: 0,
    tcp_rcv_nxt: 0,
    tcp_rcvq_time: 0,
    socket_file: 0,
    file_inode: 0,
    inode_ino: 0,
    skb_tcp_flags: 0,
    inode_mode: 0,
    task_tgid: 0,
    net_somaxconn: 0,
    net_max_syn_backlog: 0,
    net_syncookies: 0,
    net_abort_on_overflow: 0,
    mptcp_first: 0,
    mptcp_subflow: 0,
    ret_slot: [0; fexit_ret::COUNT],
};

/// Errors are the helpers' negative errno values; programs only ever drop them.
pub type Result<T> = core::result::Result<T, i32>;

/// The errno values programs report themselves, as the helpers would (negated).
pub mod errno {
    /// A map slot that should always exist was not there.
    pub const ENOENT: i32 = -2;
    /// Interrupted by another program on this CPU twice in a row.
    pub const EAGAIN: i32 = -11;
    /// A null or unreadable kernel pointer.
    pub const EFAULT: i32 = -14;
    /// A map update with `BPF_NOEXIST` found the key.
    pub const EEXIST: i32 = -17;
    /// Input the program does not handle.
    pub const EINVAL: i32 = -22;
    /// A map had no room for a new entry.
    pub const ENOSPC: i32 = -28;
    /// A copy that is no longer the one asked for (replaced by an interrupting program).
    pub const ESTALE: i32 = -116;
}

/// Reads one offset. Volatile so LLVM cannot fold the object file's zeros into the code.
#[inline(always)]
pub fn offset(select: fn(&KernelOffsets) -> &u32) -> usize {
    // SAFETY: `OFFSETS` is a valid, aligned static; volatile only defeats const-folding.
    (unsafe { core::ptr::read_volatile(select(&OFFSETS)) }) as usize
}

/// Reads one of the kernel-specific numbers in `OFFSETS` that is not an offset.
#[inline(always)]
pub fn number(select: fn(&KernelOffsets) -> &u32) -> u32 {
    offset(select) as u32
}

/// Kernel memory read at `OFFSETS` offsets, two ways: [`KPtr`] through
/// `bpf_probe_read_kernel` (any address: kprobe arguments, addresses kept in maps) and
/// [`BtfPtr`] by direct load (a fentry/fexit argument, whose type the verifier knows).
/// On the handshake path the helper call costs ~80 instructions per read, a direct load
/// a handful, so code shared by the modes is generic over this and each mode passes the
/// cheapest pointer it has.
pub trait Kmem: Copy {
    /// The address, to key maps by and to keep in a window.
    fn addr(self) -> u64;
    /// Reads a `T` at `self + off`.
    fn read<T: Copy>(self, off: usize) -> Result<T>;
    /// Follows a pointer field at `self + off`; a NULL field is an error.
    fn deref(self, off: usize) -> Result<Self>;
    /// A pointer field at `self + off` as a plain number, for address arithmetic.
    fn number(self, off: usize) -> Result<u64>;
    /// A pointer field at `self + off`, only to compare with a value kept from before
    /// (the verifier may still type it as a pointer: no arithmetic).
    fn pointer_value(self, off: usize) -> Result<u64>;
    /// The socket inode of the `struct sock` at `self`.
    fn socket_inode(self) -> Result<u64>;
    /// A field at `off` of the `struct tcp_sock` at `self`, past the `struct sock` a typed
    /// pointer allows (`icsk_accept_queue.qlen`, `rcvq_space.time`).
    #[inline(always)]
    fn read_tcp<T: Copy>(self, off: usize) -> Result<T> {
        self.probed().read(off)
    }
    /// The SYN-queue length (`icsk_accept_queue.qlen`) of the listener at `self`.
    #[inline(always)]
    fn syn_qlen(self) -> Result<u32> {
        self.read_tcp(offset(|o| &o.icsk_syn_qlen))
    }
    /// The same address, read through the helper from here on.
    #[inline(always)]
    fn probed(self) -> KPtr {
        KPtr(self.addr())
    }
}

impl Kmem for KPtr {
    #[inline(always)]
    fn addr(self) -> u64 {
        self.0
    }

    #[inline(always)]
    fn read<T: Copy>(self, off: usize) -> Result<T> {
        KPtr::read(self, off)
    }

    #[inline(always)]
    fn deref(self, off: usize) -> Result<Self> {
        KPtr::deref(self, off)
    }

    #[inline(always)]
    fn number(self, off: usize) -> Result<u64> {
        KPtr::read(self, off)
    }

    #[inline(always)]
    fn pointer_value(self, off: usize) -> Result<u64> {
        KPtr::read(self, off)
    }

    /// `sk->sk_socket` and the inode that follows it (`struct socket_alloc`).
    #[inline(always)]
    fn socket_inode(self) -> Result<u64> {
        self.deref(offset(|o| &o.sk_socket))?
            .read(offset(|o| &o.socket_ino))
    }
}

impl Kmem for BtfPtr {
    #[inline(always)]
    fn addr(self) -> u64 {
        self.0 as u64
    }

    #[inline(always)]
    fn read<T: Copy>(self, off: usize) -> Result<T> {
        Ok(self.load(off))
    }

    #[inline(always)]
    fn deref(self, off: usize) -> Result<Self> {
        let p: *const u8 = self.load(off);
        if p.is_null() {
            Err(errno::EFAULT)
        } else {
            Ok(BtfPtr(p))
        }
    }

    /// The verifier types a loaded pointer field as a pointer, and refuses to add an
    /// unbounded number to one: launder it.
    #[inline(always)]
    fn number(self, off: usize) -> Result<u64> {
        launder(self.load::<*const u8>(off))
    }

    /// A direct load, not laundered: comparing a pointer with a number and keeping it in
    /// a map are allowed to the loader's capabilities (CAP_PERFMON), adding one is not.
    #[inline(always)]
    fn pointer_value(self, off: usize) -> Result<u64> {
        Ok(self.load(off))
    }

    /// The kernel's own cast (`bpf_skc_to_tcp_sock`, 5.9+) types the pointer as a
    /// `struct tcp_sock`: a helper call and a load instead of a probe read (58
    /// instructions a read, measured on the SYN queue's length). In fentry mode the SYN
    /// and final-ACK exits observe the queues through their typed arguments, and the
    /// accept reads both stamps of the accept wait this way; kprobe and tracepoint modes
    /// have numbers, which keep the probe read.
    #[inline(always)]
    fn read_tcp<T: Copy>(self, off: usize) -> Result<T> {
        // SAFETY: the verifier checks the argument is a BTF-typed socket; the helper
        // returns NULL for one that is not a full TCP socket.
        let tp = unsafe { bpf_skc_to_tcp_sock(self.0 as *mut _) };
        if tp.is_null() {
            return self.probed().read(off);
        }
        Ok(BtfPtr(tp as *const u8).load(off))
    }

    /// The inode `struct socket_alloc` puts after the `struct socket` lies outside the
    /// type the verifier knows, so the direct way goes through the socket's file:
    /// `sk->sk_socket->file->f_inode->i_ino`, the same inode (`sock_alloc_file`). A
    /// socket without a file (a kernel socket) takes the helper's way.
    #[inline(always)]
    fn socket_inode(self) -> Result<u64> {
        let socket = self.deref(offset(|o| &o.sk_socket))?;
        match socket.deref(offset(|o| &o.socket_file)) {
            Ok(file) => file
                .deref(offset(|o| &o.file_inode))?
                .read(offset(|o| &o.inode_ino)),
            Err(_) => socket.probed().read(offset(|o| &o.socket_ino)),
        }
    }
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
        if p.is_null() {
            Err(errno::EFAULT)
        } else {
            Ok(p)
        }
    }
}

/// A BTF-typed kernel pointer, as a tp_btf or fentry program receives its arguments:
/// the verifier knows the pointee's type and turns a direct load from it into a
/// fault-safe one (`PROBE_MEM`), no helper call. The offset must be a constant the
/// verifier can see (an `OFFSETS` field: a frozen read-only map) that lands inside a
/// field of that type, or the program is refused at load.
#[derive(Clone, Copy)]
pub struct BtfPtr(*const u8);

impl BtfPtr {
    #[inline(always)]
    pub fn new(p: *const u8) -> Self {
        Self(p)
    }

    #[inline(always)]
    pub fn addr(self) -> u64 {
        self.0 as u64
    }

    /// Reads a `T` at `self + off`.
    #[inline(always)]
    pub fn load<T: Copy>(self, off: usize) -> T {
        // SAFETY: the verifier rewrites this load of a BTF-typed pointer into one that
        // yields zero instead of faulting, and refuses the program unless `off` is a
        // known constant inside the pointee's type.
        unsafe { core::ptr::read_volatile(self.0.wrapping_add(off) as *const T) }
    }
}

/// The current task (`struct task_struct *`).
#[inline(always)]
pub fn current_task() -> KPtr {
    // SAFETY: the helper takes no arguments and returns the current task's address.
    KPtr(unsafe { bpf_get_current_task() })
}

/// The context slot of the return value the fexit program `which` ([`fexit_ret`]) reads.
#[inline(always)]
pub fn ret_slot(which: usize) -> u32 {
    let slots = &OFFSETS.ret_slot;
    if which >= slots.len() {
        return 0;
    }
    // SAFETY: in-bounds element of a valid static; volatile only defeats const-folding.
    unsafe { core::ptr::read_volatile(&slots[which]) }
}

/// Reads one element of an offset array.
#[inline(always)]
pub fn offset_at(select: fn(&KernelOffsets) -> &[u32; 4], i: usize) -> usize {
    let arr = select(&OFFSETS);
    if i >= arr.len() {
        return 0;
    }
    // SAFETY: in-bounds element of a valid static; volatile only defeats const-folding.
    (unsafe { core::ptr::read_volatile(&arr[i]) }) as usize
}

/// Socket inode of a `struct sock *` ([`Kmem::socket_inode`]).
#[inline(always)]
pub fn socket_inode<K: Kmem>(sk: K) -> Result<u64> {
    sk.socket_inode()
}

/// Whether `sk` is a listening TCP socket (IPv4 or IPv6). Unix stream listeners use the
/// same state value and pass through accept() too.
#[inline(always)]
pub fn is_tcp_listener<K: Kmem>(sk: K) -> Result<bool> {
    let state: u8 = sk.read(offset(|o| &o.sk_state))?;
    if u32::from(state) != TCP_LISTEN {
        return Ok(false);
    }
    let family: u16 = sk.read(offset(|o| &o.sk_family))?;
    let protocol: u16 = sk.read(offset(|o| &o.sk_protocol))?;
    Ok((family == AF_INET || family == AF_INET6) && protocol == IPPROTO_TCP)
}

/// Whether `sk` is still the TCP listener whose socket inode is `ino`, before a per-listener
/// map entry is created for it. A window may be settled late (at the next ingress on its
/// CPU) with the address of a listener that has closed (its entries removed) and been freed
/// since; the slab may have given that memory to another listener, which the state check
/// alone would accept. The inode tells them apart, so a gone listener's entry is never
/// re-created. (Seen under listener churn: 7 of 10,000 closed listeners kept entries.)
#[inline(always)]
pub fn is_listener_with_inode(sk: KPtr, ino: u64) -> bool {
    is_tcp_listener(sk).unwrap_or(false) && socket_inode(sk) == Ok(ino)
}

/// `struct socket *` behind file descriptor `fd` of the current task:
/// `current->files->fdt->fd[fd]->private_data`. The caller must know `fd` is a socket
/// (here: `listen(2)` on it just succeeded).
#[inline(always)]
pub fn socket_of_fd(fd: u64) -> Result<KPtr> {
    FdTable::current()?.socket(fd)
}

/// The current task's open files: `current->files->fdt->fd`, read once for several
/// descriptors (accept() looks up two: three probe reads fewer per accept in kprobe and
/// tracepoint modes).
#[derive(Clone, Copy)]
pub struct FdTable(KPtr);

impl FdTable {
    #[inline(always)]
    pub fn current() -> Result<Self> {
        let files = current_task().deref(offset(|o| &o.task_files))?;
        let fdt = files.deref(offset(|o| &o.files_fdt))?;
        Ok(Self(fdt.deref(offset(|o| &o.fdtable_fd))?))
    }

    /// [`socket_of_fd`] in this table.
    #[inline(always)]
    pub fn socket(self, fd: u64) -> Result<KPtr> {
        let file = self.0.deref((fd as usize) * 8)?;
        file.deref(offset(|o| &o.file_private_data))
    }
}

/// Per CPU, element 0: a pointer being turned into a plain number and a generation
/// count ([`launder`]); element 1 only lends its address ([`cpu_area_offset`]).
#[aya_ebpf::macros::map]
static LAUNDER: aya_ebpf::maps::PerCpuArray<[u64; 2]> =
    aya_ebpf::maps::PerCpuArray::with_max_entries(2, 0);

/// Cached per-CPU area offset of this CPU (0 until first computed).
#[aya_ebpf::macros::map]
static CPU_AREA_OFFSET: aya_ebpf::maps::PerCpuArray<u64> =
    aya_ebpf::maps::PerCpuArray::with_max_entries(1, 0);

/// Returns the numeric value of a pointer the verifier tracks as a typed pointer (socket,
/// skb context, map), so it can be offset and read with `bpf_probe_read_kernel`. Storing
/// a pointer into a map value and loading it back yields a scalar; the verifier allows
/// this for privileged (CAP_PERFMON) loaders, which backlogd requires anyway.
///
/// The slot is this CPU's, but not this program's alone: a program running with bottom
/// halves enabled (`inet_csk_accept` returning; `tcp_check_req` for a Fast Open child,
/// called from its socket's backlog in process context) can be interrupted between the
/// store and the load by a softirq whose programs launder pointers of their own. Each
/// launder bumps the generation first, so one that finds it moved on by the load has seen
/// another's pointer, and stores again. (Comparing the pointer read back with the one
/// stored would do, but LLVM may then hand on the register it compared with, which the
/// verifier still tracks as a pointer.)
#[inline(always)]
pub fn launder(p: *const u8) -> Result<u64> {
    let slot = LAUNDER.get_ptr_mut(0).ok_or(errno::ENOENT)?;
    // SAFETY: `slot` is this CPU's element of LAUNDER. Volatile keeps LLVM from
    // forwarding the pointer register past the store, and keeps every access in order.
    unsafe {
        let [value, generation] = &mut *slot;
        for _ in 0..2 {
            let mine = core::ptr::read_volatile(generation).wrapping_add(1);
            core::ptr::write_volatile(generation, mine);
            core::ptr::write_volatile((value as *mut u64).cast::<*const u8>(), p);
            let laundered = core::ptr::read_volatile(value);
            if core::ptr::read_volatile(generation) == mine {
                return Ok(laundered);
            }
        }
    }
    Err(errno::EAGAIN)
}

/// This CPU's per-CPU area offset (`__per_cpu_offset[cpu]`): the address a per-CPU array
/// lookup returns minus the per-CPU pointer stored in the array. Per-CPU kernel data
/// (such as a netns's MIB counters) for this CPU lives at `percpu_ptr + offset`.
#[inline(always)]
pub fn cpu_area_offset() -> Result<u64> {
    let cached = CPU_AREA_OFFSET.get_ptr_mut(0).ok_or(errno::ENOENT)?;
    // SAFETY: this CPU's element; programs do not migrate mid-run.
    let known = unsafe { *cached };
    if known != 0 {
        return Ok(known);
    }
    let this_cpu = LAUNDER.get_ptr_mut(1).ok_or(errno::ENOENT)?;
    let this_cpu_addr = launder(this_cpu.cast::<u8>())?;
    let map_addr = launder(core::ptr::addr_of!(LAUNDER).cast::<u8>())?;
    // bpf_array.pptrs[1]: the per-CPU pointer of element 1.
    let pptr: u64 = KPtr(map_addr).read(offset(|o| &o.bpf_array_pptrs) + 8)?;
    let off = this_cpu_addr.wrapping_sub(pptr);
    // SAFETY: as above.
    unsafe { *cached = off };
    Ok(off)
}
