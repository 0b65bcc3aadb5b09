//! The systemd watchdog, pinged while the periodic jobs keep finishing.

use std::{sync::Arc, time::Duration};

use tokio::sync::watch;

use crate::service::{health::Heartbeats, notify};

/// Pings the systemd watchdog every `every` while the periodic jobs keep finishing; when
/// one stops, says which and stops pinging, so systemd restarts the daemon.
pub async fn watchdog(
    every: Duration,
    heartbeats: Arc<Heartbeats>,
    rescan_interval: watch::Receiver<Duration>,
) {
    let mut quiet = false;
    loop {
        match heartbeats.stalled(*rescan_interval.borrow()) {
            None => {
                if quiet {
                    tracing::info!("daemon healthy again: pinging the systemd watchdog");
                    quiet = false;
                }
                notify::watchdog();
            }
            Some(what) => {
                if !quiet {
                    tracing::error!(
                        "not pinging the systemd watchdog: {what}. The daemon is stuck; \
                         systemd restarts it when the watchdog period runs out"
                    );
                    quiet = true;
                }
            }
        }
        tokio::time::sleep(every).await;
    }
}
