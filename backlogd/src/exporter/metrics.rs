//! Prometheus exposition, read from the live tables at scrape time (no copies to keep in
//! sync). Every metric here is documented in docs/metrics.md.

use std::sync::{Arc, Mutex};

use aya::maps::{MapData, PerCpuArray};
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge},
    registry::Registry,
};

use crate::{daemon::Shared, listeners::Listener};

/// Reads the daemon's shared state on every scrape.
pub struct BacklogdCollector {
    shared: Arc<Shared>,
    /// Per-CPU count of lifecycle events the ring buffer had no room for.
    events_lost: Mutex<PerCpuArray<MapData, u64>>,
}

impl std::fmt::Debug for BacklogdCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BacklogdCollector").finish_non_exhaustive()
    }
}

impl BacklogdCollector {
    pub fn registry(shared: Arc<Shared>, events_lost: PerCpuArray<MapData, u64>) -> Registry {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Self {
            shared,
            events_lost: Mutex::new(events_lost),
        }));
        registry
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
}

type Labels = [(&'static str, String); 6];

fn listener_labels(l: &Listener) -> Labels {
    [
        ("netns", l.netns.to_string()),
        ("address", l.addr.to_string()),
        ("port", l.port.to_string()),
        ("socket", l.inode.to_string()),
        ("pid", l.pid.to_string()),
        ("comm", l.comm.clone()),
    ]
}

impl Collector for BacklogdCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let listeners = self.shared.listeners();
        let rows: Vec<(Labels, &Listener)> =
            listeners.iter().map(|l| (listener_labels(l), l)).collect();

        let mut family = encoder.encode_descriptor(
            "backlogd_listen_backlog_requested",
            "Backlog the application passed to listen(2) on this socket.",
            None,
            MetricType::Gauge,
        )?;
        for (labels, l) in &rows {
            ConstGauge::new(i64::from(l.requested)).encode(family.encode_family(labels)?)?;
        }

        let mut family = encoder.encode_descriptor(
            "backlogd_listen_backlog_granted",
            "Accept-queue capacity the kernel granted (sk_max_ack_backlog): the requested \
             backlog clamped to net.core.somaxconn of the socket's network namespace.",
            None,
            MetricType::Gauge,
        )?;
        for (labels, l) in &rows {
            ConstGauge::new(i64::from(l.granted)).encode(family.encode_family(labels)?)?;
        }

        ConstGauge::new(listeners.len() as i64).encode(encoder.encode_descriptor(
            "backlogd_listeners",
            "Listening TCP sockets backlogd is tracking.",
            None,
            MetricType::Gauge,
        )?)?;
        drop(listeners);

        ConstCounter::new(self.events_lost()).encode(encoder.encode_descriptor(
            "backlogd_listener_events_lost",
            "Listener lifecycle events dropped because the kernel ring buffer was full.",
            None,
            MetricType::Counter,
        )?)?;

        let mut family = encoder.encode_descriptor(
            "backlogd_build_info",
            "Always 1; the labels describe the running backlogd build.",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(1i64)
            .encode(family.encode_family(&[("version", env!("CARGO_PKG_VERSION"))])?)?;
        Ok(())
    }
}
