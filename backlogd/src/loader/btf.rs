//! Kernel struct layouts from BTF, resolved at load time.
//!
//! The eBPF programs are compiled once; the same binary runs on 6.1, 6.12 and 6.18, whose
//! `struct sock`, `struct file` and friends differ. Every offset the programs use comes
//! from here.

use std::path::{Path, PathBuf};

use backlogd_common::{KernelOffsets, fexit_ret, mib};
use btf_rs::{Backend, Btf, Type};
use fallible_iterator::FallibleIterator as _;

pub const KERNEL_BTF: &str = "/sys/kernel/btf/vmlinux";

#[derive(Debug, thiserror::Error)]
pub enum BtfError {
    #[error(
        "no kernel BTF at {}: this kernel was built without CONFIG_DEBUG_INFO_BTF=y, and \
         backlogd reads kernel struct layouts from BTF. Fix: run a kernel with BTF (stock \
         Debian, Ubuntu, RHEL and Fedora kernels have it), or pass --btf FILE with the BTF \
         of exactly this kernel (e.g. from btfhub)",
        path.display()
    )]
    Missing { path: PathBuf },
    #[error(
        "cannot read BTF from {}: {reason}. Fix: pass --btf with the raw BTF of the running \
         kernel (as found in /sys/kernel/btf/vmlinux)",
        path.display()
    )]
    Unreadable { path: PathBuf, reason: String },
    #[error(
        "the kernel's BTF has no `{ty}.{field}`: this kernel's layout is one backlogd does \
         not know yet. Please report it with the output of `uname -r`"
    )]
    NoField { ty: String, field: String },
    #[error(
        "the kernel's enum linux_mib_field does not have {first} and {second} next to each \
         other, which backlogd's SYN-path programs read as one pair: this kernel's layout is \
         one backlogd does not know yet. Please report it with the output of `uname -r`"
    )]
    MibNotPaired {
        first: &'static str,
        second: &'static str,
    },
    #[error("BTF field `{ty}.{field}` is {found} bytes, expected {expected}")]
    FieldSize {
        ty: String,
        field: String,
        found: usize,
        expected: usize,
    },
}

/// The SYN-path programs read the MIB counters as two 16-byte pairs (syn.rs `read_mib`):
/// ListenOverflows with ListenDrops, TCPReqQFullDoCookies with TCPReqQFullDrop. Adjacent
/// in enum linux_mib_field since Linux 4.4; checked, not assumed.
fn check_mib_pairs(index: &[u32; mib::COUNT]) -> Result<(), BtfError> {
    for (first, second, names) in [
        (
            mib::LISTEN_OVERFLOWS,
            mib::LISTEN_DROPS,
            ("LINUX_MIB_LISTENOVERFLOWS", "LINUX_MIB_LISTENDROPS"),
        ),
        (
            mib::REQQ_FULL_DO_COOKIES,
            mib::REQQ_FULL_DROP,
            (
                "LINUX_MIB_TCPREQQFULLDOCOOKIES",
                "LINUX_MIB_TCPREQQFULLDROP",
            ),
        ),
    ] {
        if index[second] != index[first] + 8 {
            return Err(BtfError::MibNotPaired {
                first: names.0,
                second: names.1,
            });
        }
    }
    Ok(())
}

/// `struct pt_regs` members holding, at syscall exit, the syscall number (and its size)
/// and the first argument.
#[cfg(target_arch = "x86_64")]
const SYSCALL_REGS: (&str, usize, &str) = ("orig_ax", 8, "di");
#[cfg(target_arch = "aarch64")]
const SYSCALL_REGS: (&str, usize, &str) = ("syscallno", 4, "orig_x0");
/// The member holding a syscall's second argument, and the byte offset within it.
#[cfg(target_arch = "x86_64")]
const SYSCALL_ARG1: (&str, u32) = ("si", 0);
#[cfg(target_arch = "aarch64")]
const SYSCALL_ARG1: (&str, u32) = ("regs", 8);
/// Where a 32-bit (compat) syscall is flagged: (struct, member path, in the saved user
/// registers rather than the task, mask). x86-64: `TS_COMPAT` in `thread_info.status`
/// (set at ia32 syscall entry, cleared only on the way back to user mode, after the
/// `sys_exit` tracepoint); arm64: `PSR_MODE32_BIT` in the user's `pstate`.
#[cfg(target_arch = "x86_64")]
const COMPAT_FLAG: (&str, &str, bool, u32) = ("task_struct", "thread_info.status", false, 0x2);
#[cfg(target_arch = "aarch64")]
const COMPAT_FLAG: (&str, &str, bool, u32) = ("pt_regs", "pstate", true, 0x10);

/// A file's bytes in an anonymous memory file (memfd), which can be mapped where the
/// original (a sysfs attribute) cannot.
struct InMemory(std::fs::File);

impl InMemory {
    fn copy_of(path: &Path) -> std::io::Result<Self> {
        // SAFETY: memfd_create reads a NUL-terminated name and returns a new fd or -1.
        let fd = unsafe { libc::memfd_create(c"backlogd-btf".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: fd was just created and is owned by nothing else.
        let mut file = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        std::io::copy(&mut std::fs::File::open(path)?, &mut file)?;
        Ok(Self(file))
    }

    /// A path that opens the same memory file.
    fn path(&self) -> PathBuf {
        use std::os::fd::AsRawFd as _;
        PathBuf::from(format!("/proc/self/fd/{}", self.0.as_raw_fd()))
    }
}

/// Where an fexit program finds the return value of a function whose parameters are
/// `param_sizes` bytes each: the u64 context slot after the arguments. A BPF trampoline
/// passes each argument of up to 8 bytes in one slot and a struct of 9 to 16 bytes by
/// value in two (x86-64 since 6.1, the only kind of wider argument it passes); `None` for
/// a parameter it cannot pass (wider, or of unknown size: variadic) or more slots than a
/// trampoline has (`fexit_ret::MAX_SLOT`), as the attach would fail anyway.
pub fn ret_slot(param_sizes: &[usize]) -> Option<u32> {
    let mut slots = 0u32;
    for &size in param_sizes {
        slots += match size {
            1..=8 => 1,
            9..=16 => 2,
            _ => return None,
        };
    }
    (slots <= fexit_ret::MAX_SLOT).then_some(slots)
}

pub struct KernelBtf {
    btf: Btf,
}

impl KernelBtf {
    pub fn open(path: &Path) -> Result<Self, BtfError> {
        if !path.exists() {
            return Err(BtfError::Missing {
                path: path.to_owned(),
            });
        }
        let unreadable = |reason: String| BtfError::Unreadable {
            path: path.to_owned(),
            reason,
        };
        // btf-rs's cached backend turns vmlinux's ~6 MiB of BTF into ~28 MiB of parsed
        // types, most of the daemon's startup peak; its mmap backend reads the bytes in
        // place. /sys/kernel/btf/vmlinux cannot be mapped before Linux 6.16 (nor with
        // btf-rs's flags after), so the bytes are mapped from an in-memory copy.
        // Where no memory file can be made (a seccomp filter without memfd_create), the
        // cached backend still works, at its cost.
        let btf = match InMemory::copy_of(path) {
            Ok(copy) => Btf::from_file_with_backend(copy.path(), Backend::Mmap),
            Err(e) => {
                tracing::debug!(error = %e, "no memory file for the BTF; parsing it whole");
                Btf::from_file(path)
            }
        }
        .map_err(|e| unreadable(e.to_string()))?;
        Ok(Self { btf })
    }

    /// Everything the eBPF programs need about struct layouts. The listen sysctls' offsets
    /// may be 0 (not found): see [`reads_listen_sysctls`].
    pub fn kernel_offsets(&self) -> Result<KernelOffsets, BtfError> {
        let offsets = self.layout()?;
        check_mib_pairs(&offsets.mib_index)?;
        Ok(offsets)
    }

    fn layout(&self) -> Result<KernelOffsets, BtfError> {
        let f = |ty: &str, path: &str, size: usize| self.offset_of(ty, path, Some(size));
        Ok(KernelOffsets {
            task_files: f("task_struct", "files", 8)?,
            files_fdt: f("files_struct", "fdt", 8)?,
            fdtable_fd: f("fdtable", "fd", 8)?,
            file_private_data: f("file", "private_data", 8)?,
            socket_sk: f("socket", "sk", 8)?,
            sk_socket: f("sock", "sk_socket", 8)?,
            socket_ino: self.offset_of("socket_alloc", "vfs_inode", None)?
                + f("inode", "i_ino", 8)?,
            sk_family: f("sock", "__sk_common.skc_family", 2)?,
            sk_state: f("sock", "__sk_common.skc_state", 1)?,
            sk_num: f("sock", "__sk_common.skc_num", 2)?,
            sk_rcv_saddr: f("sock", "__sk_common.skc_rcv_saddr", 4)?,
            sk_v6_rcv_saddr: f("sock", "__sk_common.skc_v6_rcv_saddr", 16)?,
            sk_net: f("sock", "__sk_common.skc_net.net", 8)?,
            sk_protocol: f("sock", "sk_protocol", 2)?,
            sk_max_ack_backlog: f("sock", "sk_max_ack_backlog", 4)?,
            net_inum: f("net", "ns.inum", 4)?,
            sk_ack_backlog: f("sock", "sk_ack_backlog", 4)?,
            net_mib_stats: self.offset_of("net", "mib", None)?
                + f("netns_mib", "net_statistics", 8)?,
            mib_index: [
                self.mib_offset("LINUX_MIB_LISTENOVERFLOWS")?,
                self.mib_offset("LINUX_MIB_LISTENDROPS")?,
                self.mib_offset("LINUX_MIB_TCPREQQFULLDROP")?,
                self.mib_offset("LINUX_MIB_TCPREQQFULLDOCOOKIES")?,
            ],
            bpf_array_pptrs: self.offset_of("bpf_array", "pptrs", None)?,
            icsk_syn_qlen: self.offset_of("inet_connection_sock", "icsk_accept_queue", None)?
                + f("request_sock_queue", "qlen", 4)?,
            // `rsk_listener` is a macro for this field.
            request_sock_listener: f("request_sock", "__req_common.skc_listener", 8)?,
            skb_head: f("sk_buff", "head", 8)?,
            skb_transport_header: f("sk_buff", "transport_header", 2)?,
            regs_syscall_nr: f("pt_regs", SYSCALL_REGS.0, SYSCALL_REGS.1)?,
            regs_arg0: f("pt_regs", SYSCALL_REGS.2, 8)?,
            regs_arg1: self.offset_of("pt_regs", SYSCALL_ARG1.0, None)? + SYSCALL_ARG1.1,
            nr_accept: libc::SYS_accept as u32,
            nr_accept4: libc::SYS_accept4 as u32,
            nr_listen: libc::SYS_listen as u32,
            compat_flags: self.offset_of(COMPAT_FLAG.0, COMPAT_FLAG.1, None)?,
            compat_in_regs: u32::from(COMPAT_FLAG.2),
            compat_mask: COMPAT_FLAG.3,
            skb_network_header: f("sk_buff", "network_header", 2)?,
            tcp_rcv_nxt: f("tcp_sock", "rcv_nxt", 4)?,
            tcp_rcvq_time: f("tcp_sock", "rcvq_space.time", 8)?,
            socket_file: f("socket", "file", 8)?,
            file_inode: f("file", "f_inode", 8)?,
            inode_ino: f("inode", "i_ino", 8)?,
            // A u8 on older kernels, a u16 on newer ones (6.18; the AccECN flag is bit 8):
            // the programs read the first byte, which holds FIN to CWR on little-endian
            // machines.
            skb_tcp_flags: self.offset_of("sk_buff", "cb", None)?
                + f("tcp_skb_cb", "tcp_flags", 1).or_else(|_| f("tcp_skb_cb", "tcp_flags", 2))?,
            inode_mode: f("inode", "i_mode", 2)?,
            task_tgid: f("task_struct", "tgid", 4)?,
            // Only the scan iterator reads these, for the namespaces' listen sysctls: a
            // kernel that renamed one keeps every hook, and the iterator stops listing
            // ([`reads_listen_sysctls`]). An int on older kernels, a u8 on newer ones
            // (the last two): the programs read the first byte, the value on
            // little-endian machines.
            net_somaxconn: self.listen_sysctl("core.sysctl_somaxconn", &[4]),
            net_max_syn_backlog: self.listen_sysctl("ipv4.sysctl_max_syn_backlog", &[4]),
            net_syncookies: self.listen_sysctl("ipv4.sysctl_tcp_syncookies", &[1, 4]),
            net_abort_on_overflow: self.listen_sysctl("ipv4.sysctl_tcp_abort_on_overflow", &[1, 4]),
            // No MPTCP in the kernel: no MPTCP listener to follow (0 tells the scan so).
            mptcp_first: f("mptcp_sock", "first", 8).unwrap_or(0),
            mptcp_subflow: f("mptcp_sock", "subflow", 8).unwrap_or(0),
            // Which functions is the hook table's business: the loader fills these in
            // with `fexit_ret_slot`.
            ret_slot: [0; fexit_ret::COUNT],
        })
    }

    /// Byte offset in `struct net` of listen sysctl `path`, of one of `sizes`; 0 (never
    /// a field's place in `struct net`, which starts with its reference counts) when
    /// the kernel's BTF has no such field, said at warning level.
    fn listen_sysctl(&self, path: &str, sizes: &[usize]) -> u32 {
        let found = sizes
            .iter()
            .find_map(|&size| self.offset_of("net", path, Some(size)).ok());
        found.unwrap_or_else(|| {
            tracing::warn!(
                field = %format!("struct net.{path}"),
                "the kernel's BTF has no such field (of the size backlogd reads): the scan \
                 iterator cannot read the namespaces' listen sysctls there, so it does not \
                 list listeners; rescans use sock_diag in each namespace instead, which \
                 needs CAP_SYS_ADMIN to join them. Every hook and figure is unaffected"
            );
            0
        })
    }

    /// Byte offset of a dotted member path inside `struct ty`, looking through anonymous
    /// structs and unions the way C does; checks the field's size when `size` is given.
    pub fn offset_of(&self, ty: &str, path: &str, size: Option<usize>) -> Result<u32, BtfError> {
        let no_field = || BtfError::NoField {
            ty: ty.to_owned(),
            field: path.to_owned(),
        };
        let mut current = self.named_struct(ty).ok_or_else(no_field)?;
        let mut offset_bits = 0u32;
        let mut last = None;
        for name in path.split('.') {
            let (bits, member_ty) = self.find_member(&current, name).ok_or_else(no_field)?;
            offset_bits += bits;
            last = Some(member_ty.clone());
            current = member_ty;
        }
        if !offset_bits.is_multiple_of(8) {
            return Err(no_field());
        }
        if let (Some(expected), Some(t)) = (size, last)
            && let Some(found) = self.size_of(&t)
            && found != expected
        {
            return Err(BtfError::FieldSize {
                ty: ty.to_owned(),
                field: path.to_owned(),
                found,
                expected,
            });
        }
        Ok(offset_bits / 8)
    }

    /// Byte offset in `struct linux_mib` of counter `name` (an enum linux_mib_field
    /// enumerator; their values shift between kernels).
    fn mib_offset(&self, name: &str) -> Result<u32, BtfError> {
        self.enumerator(name)
            .map(|v| v * 8)
            .ok_or_else(|| BtfError::NoField {
                ty: "enum linux_mib_field".into(),
                field: name.into(),
            })
    }

    /// The context slot of the return value of kernel function `name` in an fexit
    /// program ([`ret_slot`]); 0 when the kernel has no such function or one a trampoline
    /// cannot pass (the attach fails then, with the kernel's reason).
    pub fn fexit_ret_slot(&self, name: &str) -> u32 {
        self.param_sizes(name)
            .and_then(|s| ret_slot(&s))
            .unwrap_or(0)
    }

    /// Sizes in bytes of the parameters of function `name`, 0 for one of no known size (a
    /// variadic tail); `None` when BTF has no such function. The first function of that
    /// name, as aya and the kernel resolve an attach target by name.
    fn param_sizes(&self, name: &str) -> Option<Vec<usize>> {
        let func = self
            .btf
            .resolve_types_by_name(name)
            .ok()?
            .into_iter()
            .find(|t| matches!(t, Type::Func(_)))?;
        let Type::Func(func) = func else { return None };
        let Type::FuncProto(proto) = self.btf.resolve_chained_type(&func).ok()? else {
            return None;
        };
        Some(
            proto
                .parameters
                .iter()
                .map(|p| {
                    if p.is_variadic() {
                        return 0;
                    }
                    self.btf
                        .resolve_chained_type(p)
                        .ok()
                        .and_then(|t| self.resolve(t))
                        .and_then(|t| self.size_of(&t))
                        .unwrap_or(0)
                })
                .collect(),
        )
    }

    /// Whether any enum of the kernel has an enumerator `name` (e.g. a helper of
    /// `enum bpf_func_id`: the kernel knows that helper).
    pub fn has_enumerator(&self, name: &str) -> bool {
        self.enumerator(name).is_some()
    }

    fn enumerator(&self, name: &str) -> Option<u32> {
        let mut iter = self.btf.type_iter();
        while let Ok(Some(t)) = iter.next() {
            if let Type::Enum(e) = t {
                for m in &e.members {
                    if self.btf.resolve_name(m).is_ok_and(|n| n == name) {
                        return Some(m.val());
                    }
                }
            }
        }
        None
    }

    /// The BTF id of kernel function `name` (the first of that name), e.g. to attach to.
    pub fn func_id(&self, name: &str) -> Option<u32> {
        self.btf
            .resolve_ids_by_name(name)
            .ok()?
            .into_iter()
            .find(|&id| matches!(self.btf.resolve_type_by_id(id), Ok(Type::Func(_))))
    }

    fn named_struct(&self, name: &str) -> Option<Type> {
        self.btf
            .resolve_types_by_name(name)
            .ok()?
            .into_iter()
            .find(|t| matches!(t, Type::Struct(_) | Type::Union(_)))
    }

    /// Strips typedefs and qualifiers.
    fn resolve(&self, mut t: Type) -> Option<Type> {
        loop {
            t = match &t {
                Type::Typedef(x) => self.btf.resolve_chained_type(x).ok()?,
                Type::Const(x) | Type::Volatile(x) | Type::Restrict(x) => {
                    self.btf.resolve_chained_type(x).ok()?
                }
                Type::TypeTag(x) => self.btf.resolve_chained_type(x).ok()?,
                _ => return Some(t),
            }
        }
    }

    /// Finds `name` among the members of `parent`, descending into anonymous members.
    /// Returns the member's bit offset from the start of `parent` and its resolved type.
    fn find_member(&self, parent: &Type, name: &str) -> Option<(u32, Type)> {
        let members = match parent {
            Type::Struct(s) | Type::Union(s) => &s.members,
            _ => return None,
        };
        for m in members {
            let member_name = self.btf.resolve_name(m).unwrap_or_default();
            let ty = self.resolve(self.btf.resolve_chained_type(m).ok()?)?;
            if member_name == name {
                if m.bitfield_size().is_some_and(|b| b != 0) {
                    return None;
                }
                return Some((m.bit_offset(), ty));
            }
            if member_name.is_empty()
                && let Some((inner, t)) = self.find_member(&ty, name)
            {
                return Some((m.bit_offset() + inner, t));
            }
        }
        None
    }

    fn size_of(&self, t: &Type) -> Option<usize> {
        match t {
            Type::Int(i) => Some(i.size()),
            Type::Ptr(_) => Some(8),
            Type::Struct(s) | Type::Union(s) => Some(s.size()),
            Type::Enum(e) => Some(e.size()),
            Type::Enum64(e) => Some(e.size()),
            Type::Float(f) => Some(f.size()),
            Type::Array(a) => {
                let elem = self.resolve(self.btf.resolve_chained_type(a).ok()?)?;
                Some(self.size_of(&elem)? * a.len())
            }
            _ => None,
        }
    }
}

/// Whether `offsets` give every listen sysctl the scan iterator reads from `struct net`
/// (0: the kernel's BTF had no such field).
pub fn reads_listen_sysctls(offsets: &KernelOffsets) -> bool {
    [
        offsets.net_somaxconn,
        offsets.net_max_syn_backlog,
        offsets.net_syncookies,
        offsets.net_abort_on_overflow,
    ]
    .iter()
    .all(|&o| o != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    // These read the running kernel's BTF: the resolver is only meaningful against real
    // kernel types (anonymous unions, typedef chains, bitfields).
    fn kernel() -> KernelBtf {
        KernelBtf::open(Path::new(KERNEL_BTF)).expect("kernel BTF")
    }

    /// The CI kernel (6.18) knows both; nothing knows a made-up name.
    #[test]
    fn enumerators_say_which_helpers_and_links_the_kernel_has() {
        let k = kernel();
        assert!(k.has_enumerator("BPF_FUNC_get_func_ret"));
        assert!(k.has_enumerator("BPF_LINK_TYPE_PERF_EVENT"));
        assert!(!k.has_enumerator("BPF_FUNC_backlogd_does_not_exist"));
    }

    #[test]
    fn resolves_every_offset_and_sock_common_sits_first() {
        let o = kernel().kernel_offsets().unwrap();
        // struct sock starts with its sock_common; skc_family is in its first 32 bytes.
        assert!(o.sk_family < 32, "{o:?}");
        assert!(o.sk_max_ack_backlog > o.sk_family);
        // x86-64 pt_regs is ABI: di and orig_ax are its 15th and 16th words.
        #[cfg(target_arch = "x86_64")]
        assert_eq!((o.regs_arg0, o.regs_syscall_nr), (14 * 8, 15 * 8));
        #[cfg(target_arch = "x86_64")]
        assert_eq!(o.regs_arg1, 13 * 8, "si");
    }

    /// A listen sysctl the kernel does not have (a rename) costs the scan its listing,
    /// not the daemon its start: every other offset still resolves.
    #[test]
    fn a_listen_sysctl_the_kernel_lacks_stops_the_listing_not_the_load() {
        let k = kernel();
        let mut o = k.kernel_offsets().unwrap();
        assert!(reads_listen_sysctls(&o), "this kernel has all four: {o:?}");
        assert_ne!(o.net_syncookies, 0);
        assert_eq!(
            k.listen_sysctl("ipv4.sysctl_tcp_backlogd_renamed", &[1, 4]),
            0
        );
        // Of a size backlogd does not read: not taken either.
        assert_eq!(k.listen_sysctl("core.sysctl_somaxconn", &[2]), 0);
        o.net_abort_on_overflow = 0;
        assert!(!reads_listen_sysctls(&o));
    }

    #[test]
    fn mib_counters_read_as_pairs_must_be_adjacent() {
        let mut index = kernel().layout().unwrap().mib_index;
        assert!(check_mib_pairs(&index).is_ok(), "this kernel: {index:?}");
        index[mib::REQQ_FULL_DROP] += 8;
        let err = check_mib_pairs(&index).unwrap_err().to_string();
        assert!(
            err.contains("LINUX_MIB_TCPREQQFULLDOCOOKIES and LINUX_MIB_TCPREQQFULLDROP"),
            "{err}"
        );
    }

    /// The signatures that moved the return value between kernels, as BTF gives them.
    #[test]
    fn the_return_value_sits_after_the_arguments_of_this_kernels_signature() {
        // tcp_check_req(sk, skb, req, bool fastopen, bool *lost_race) on Debian's 5.10 ...
        assert_eq!(ret_slot(&[8, 8, 8, 1, 8]), Some(5));
        // ... and with `enum skb_drop_reason *drop_reason` after them (the CI kernel's 6.18).
        assert_eq!(ret_slot(&[8, 8, 8, 1, 8, 8]), Some(6));
        // inet_csk_accept(sk, int flags, int *err, bool kern) before 6.10, then
        // inet_csk_accept(sk, struct proto_accept_arg *arg).
        assert_eq!(ret_slot(&[8, 4, 8, 1]), Some(4));
        assert_eq!(ret_slot(&[8, 8]), Some(2));
        // __x64_sys_listen(const struct pt_regs *regs).
        assert_eq!(ret_slot(&[8]), Some(1));
    }

    #[test]
    fn arguments_a_trampoline_cannot_pass_leave_no_slot() {
        // A 16-byte struct by value takes two slots; a wider one is not passed.
        assert_eq!(ret_slot(&[8, 16]), Some(3));
        assert_eq!(ret_slot(&[8, 24]), None);
        // Variadic (size unknown).
        assert_eq!(ret_slot(&[8, 0]), None);
        // More than MAX_SLOT slots.
        assert_eq!(ret_slot(&[8; 12]), Some(12));
        assert_eq!(ret_slot(&[8; 13]), None);
        assert_eq!(ret_slot(&[16; 7]), None);
    }

    /// The same from the CI kernel's BTF (6.18): the functions the fexit programs trace.
    #[test]
    fn finds_the_return_slots_in_the_kernels_btf() {
        let k = kernel();
        assert_eq!(k.fexit_ret_slot("tcp_check_req"), 6);
        assert_eq!(k.fexit_ret_slot("tcp_get_cookie_sock"), 4);
        assert_eq!(k.fexit_ret_slot("inet_csk_reqsk_queue_add"), 3);
        assert_eq!(k.fexit_ret_slot("inet_csk_accept"), 2);
        #[cfg(target_arch = "x86_64")]
        assert_eq!(k.fexit_ret_slot("__x64_sys_listen"), 1);
        assert_eq!(k.fexit_ret_slot("backlogd_no_such_function"), 0);
    }

    #[test]
    fn missing_field_is_named() {
        let err = kernel()
            .offset_of("sock", "no_such_field", None)
            .unwrap_err();
        assert!(err.to_string().contains("sock.no_such_field"), "{err}");
    }

    #[test]
    fn wrong_size_is_rejected() {
        let err = kernel()
            .offset_of("sock", "sk_max_ack_backlog", Some(8))
            .unwrap_err();
        assert!(matches!(err, BtfError::FieldSize { found: 4, .. }), "{err}");
    }

    #[test]
    fn missing_file_names_the_fix() {
        let err = KernelBtf::open(Path::new("/nonexistent/vmlinux"))
            .err()
            .unwrap();
        assert!(err.to_string().contains("--btf"), "{err}");
    }
}
