//! The namespaces' own TcpExt counters, next to backlogd's per-socket figures.

use std::collections::HashMap;

use crate::{
    exporter::{catalogue::Metric, text::Exposition},
    sampling::tcpext,
};

/// The family of each of `tcpext::COUNTERS`, in that order.
const FAMILIES: [Metric; 5] = [
    Metric::NetnsListenOverflows,
    Metric::NetnsListenDrops,
    Metric::NetnsReqqFullDrops,
    Metric::NetnsReqqFullDoCookies,
    Metric::NetnsSynRetransmits,
];

pub fn render(e: &mut Exposition<'_>, namespaces: &[(u32, HashMap<String, u64>)]) {
    // The name of each namespace that has one, to join on `netns` (group_left).
    let mut names = crate::names::netns::named();
    Metric::NetnsInfo.open(e);
    for (netns, _) in namespaces {
        if let Some(name) = names.remove(netns) {
            e.sample(
                Metric::NetnsInfo.name(),
                &[("netns", &netns.to_string()), ("name", &name)],
                1,
            );
        }
    }
    for (counter, metric) in tcpext::COUNTERS.iter().zip(FAMILIES) {
        metric.open(e);
        for (netns, values) in namespaces {
            if let Some(v) = values.get(*counter) {
                e.sample(metric.name(), &[("netns", &netns.to_string())], v);
            }
        }
    }
}
