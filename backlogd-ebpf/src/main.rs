//! backlogd's eBPF programs, one module per hook family.
//!
//! - [`syn`]: the SYN path: SYNs, drops by reason, syncookies, SYN-ACK retransmits.
//! - [`accept`]: the accept queue: queued, accepted, accept wait, queue depths.
//! - [`fentry`], [`kprobe`]: the SYN-path and accept-queue figures from function hooks,
//!   for kernels that allow them; [`syn`] and [`accept`] hold the shared accounting.
//! - [`impact`]: client impact: connection attempts a listener dropped a segment of,
//!   matched to their completion (delayed, and by how much); [`syn`] calls it.
//! - [`sources`]: who is being dropped: dropped and cookie-answered segments per listener
//!   and source prefix; [`impact`] calls it with the address it read.
//! - [`listener`]: the per-listener maps the daemon reads (counters, queue depths) and
//!   their updates; [`syn`] and [`accept`] write through it.
//! - [`listen`]: listener lifecycle: `listen(2)` (requested vs granted backlog, owner,
//!   netns, address) and listeners leaving the LISTEN state.
//! - [`syscall`]: accept() and listen() returning in kprobe and tracepoint modes: one tp_btf
//!   `sys_exit` program that hands them to [`accept`] and [`listen`].
//!
//! Kernel struct layouts are never compiled in: [`kernel`] reads them from
//! the `OFFSETS` global that the daemon fills from the running kernel's BTF at load time.
#![no_std]
#![no_main]
// `asm!` on the BPF target: `fentry.rs` loads context slots at literal offsets, and
// `sources.rs` adds atomically.
#![feature(asm_experimental_arch)]

mod accept;
mod fentry;
mod impact;
mod kernel;
mod kprobe;
mod listen;
mod listener;
mod sources;
mod syn;
mod syscall;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // A reachable panic makes the verifier reject the program; this is never called.
    loop {}
}

// bpf_probe_read_kernel is GPL-only.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
