//! `/metrics`: rendered from the live tables at scrape time, so there are no copies to
//! keep in sync and closed listeners cannot leave stale series. Every metric here is
//! documented in docs/metrics.md.

use std::sync::{Arc, Mutex};

use aya::maps::{MapData, PerCpuArray};

use super::text::{Exposition, Kind};
use crate::{daemon::Shared, listeners::Listener};

pub struct Metrics {
    shared: Arc<Shared>,
    /// Per-CPU count of lifecycle events the ring buffer had no room for.
    events_lost: Mutex<PerCpuArray<MapData, u64>>,
}

impl Metrics {
    pub fn new(shared: Arc<Shared>, events_lost: PerCpuArray<MapData, u64>) -> Self {
        Self {
            shared,
            events_lost: Mutex::new(events_lost),
        }
    }

    fn events_lost(&self) -> u64 {
        let map = self.events_lost.lock().unwrap_or_else(|e| e.into_inner());
        map.get(&0, 0)
            .map(|per_cpu| per_cpu.iter().sum())
            .unwrap_or_else(|e| {
                tracing::warn!(error = %e, "reading LISTENER_EVENTS_LOST");
                0
            })
    }

    pub fn render(&self) -> String {
        let listeners = self.shared.listeners();
        let mut e = Exposition::with_capacity(512 + listeners.len() * 400);
        let rows: Vec<([String; 6], &Listener)> =
            listeners.iter().map(|l| (label_values(l), l)).collect();

        e.family(
            "backlogd_listen_backlog_requested",
            Kind::Gauge,
            "Backlog the application passed to listen(2) on this socket (absent for \
             listeners already listening when backlogd started).",
        );
        for (values, l) in &rows {
            if let Some(requested) = l.requested {
                e.sample(
                    "backlogd_listen_backlog_requested",
                    &labels(values),
                    requested,
                );
            }
        }
        e.family(
            "backlogd_listen_backlog_granted",
            Kind::Gauge,
            "Accept-queue capacity the kernel granted (sk_max_ack_backlog): the requested \
             backlog clamped to net.core.somaxconn of the socket's network namespace.",
        );
        for (values, l) in &rows {
            e.sample(
                "backlogd_listen_backlog_granted",
                &labels(values),
                l.granted,
            );
        }

        e.family(
            "backlogd_listeners",
            Kind::Gauge,
            "Listening TCP sockets backlogd is tracking.",
        );
        e.sample("backlogd_listeners", &[], listeners.len());
        drop(rows);
        drop(listeners);

        e.family(
            "backlogd_listener_events_lost_total",
            Kind::Counter,
            "Listener lifecycle events dropped because the kernel ring buffer was full.",
        );
        e.sample(
            "backlogd_listener_events_lost_total",
            &[],
            self.events_lost(),
        );

        e.family(
            "backlogd_build_info",
            Kind::Gauge,
            "Always 1; the labels describe the running backlogd build.",
        );
        e.sample(
            "backlogd_build_info",
            &[("version", env!("CARGO_PKG_VERSION"))],
            1,
        );
        e.finish()
    }
}

const LABELS: [&str; 6] = ["netns", "address", "port", "socket", "pid", "comm"];

fn label_values(l: &Listener) -> [String; 6] {
    [
        l.netns.to_string(),
        l.addr.to_string(),
        l.port.to_string(),
        l.inode.to_string(),
        l.pid.to_string(),
        l.comm.clone(),
    ]
}

fn labels(values: &[String; 6]) -> [(&'static str, &str); 6] {
    std::array::from_fn(|i| (LABELS[i], values[i].as_str()))
}
