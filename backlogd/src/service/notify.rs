//! systemd's notification protocol (`sd_notify(3)`): one datagram of `KEY=VALUE` lines to
//! the unix socket named by `NOTIFY_SOCKET`.
//!
//! Hand-written rather than the `sd-notify` crate because that crate treats an abstract
//! socket name (`@name`, which systemd and `systemd-notify`-compatible supervisors use)
//! as a file path.

use std::{
    os::{linux::net::SocketAddrExt as _, unix::net::UnixDatagram},
    time::Duration,
};

/// Sends `state` (newline-separated `KEY=VALUE`) to the service manager, if there is one.
/// Failures are logged, not fatal: a daemon started by hand has no manager to tell.
pub fn notify(state: &str) {
    let Some(target) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    if let Err(e) = send(&target, state) {
        tracing::warn!(socket = ?target, error = %e, "cannot notify the service manager");
    }
}

fn send(target: &std::ffi::OsStr, state: &str) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt as _;
    let bytes = target.as_bytes();
    let addr = match bytes.strip_prefix(b"@") {
        Some(name) => std::os::unix::net::SocketAddr::from_abstract_name(name)?,
        None => std::os::unix::net::SocketAddr::from_pathname(target)?,
    };
    let socket = UnixDatagram::unbound()?;
    socket.connect_addr(&addr)?;
    socket.send(state.as_bytes())?;
    Ok(())
}

pub fn ready() {
    notify("READY=1\nSTATUS=probes attached, serving metrics\n");
}

/// Reload start; systemd (253+) wants the monotonic time with it.
pub fn reloading() {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    let usec = ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1000;
    notify(&format!(
        "RELOADING=1\nMONOTONIC_USEC={usec}\nSTATUS=reloading configuration\n"
    ));
}

pub fn stopping() {
    notify("STOPPING=1\nSTATUS=shutting down\n");
}

pub fn watchdog() {
    notify("WATCHDOG=1\n");
}

/// How often to ping the watchdog: half the period systemd set (`WATCHDOG_USEC`), as
/// `sd_watchdog_enabled(3)` advises, if it is meant for this process.
pub fn watchdog_interval() -> Option<Duration> {
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
    if let Ok(pid) = std::env::var("WATCHDOG_PID")
        && pid.parse::<u32>().ok()? != std::process::id()
    {
        return None;
    }
    (usec > 0).then(|| Duration::from_micros(usec / 2))
}
