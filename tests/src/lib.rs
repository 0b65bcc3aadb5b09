//! Helpers for backlogd's integration suite. Everything here is real: network namespaces
//! made with unshare(2), sockets in them, the backlogd binary as a child process, its
//! metrics over HTTP, and the kernel's own view through `ss`.
//!
//! Tests panic with context rather than return errors (as aya's own suite does).

pub mod bpf;
pub mod caps;
pub mod cgroups;
pub mod containers;
pub mod daemon;
pub mod doctor;
pub mod exact;
pub mod figures;
pub mod http;
pub mod kernel;
pub mod marks;
pub mod netns;
pub mod pins;
pub mod prom;
pub mod scenario;
pub mod sockets;
pub mod tempdir;
pub mod tools;
pub mod top;

pub use daemon::Daemon;
pub use exact::Exact;
pub use netns::Netns;
pub use prom::Scrape;

/// Writes a report (a table for the CI log) straight to stderr. libtest captures the
/// `print!` family in passing tests; this is meant to be seen.
pub fn report(text: &str) {
    use std::io::Write as _;
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(text.as_bytes());
    let _ = err.flush();
}
