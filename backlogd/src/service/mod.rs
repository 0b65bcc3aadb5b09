//! Running as a system service: systemd notifications and dropping capabilities.

pub mod caps;
pub mod notify;
