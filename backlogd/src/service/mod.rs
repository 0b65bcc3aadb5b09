//! Running as a system service: systemd notifications, the watchdog's health check and
//! dropping capabilities.

pub mod caps;
pub mod health;
pub mod notify;
