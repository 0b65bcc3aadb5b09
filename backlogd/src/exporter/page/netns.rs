//! The namespaces' own TcpExt counters, next to backlogd's per-socket figures.

use std::collections::HashMap;

use crate::{
    exporter::{catalogue::Metric, text::Exposition},
    sampling::tcpext,
};

/// The family of each of `tcpext::COUNTERS`, in that order.
const FAMILIES: [Metric; 6] = [
    Metric::NetnsListenOverflows,
    Metric::NetnsListenDrops,
    Metric::NetnsReqqFullDrops,
    Metric::NetnsReqqFullDoCookies,
    Metric::NetnsSynRetransmits,
    Metric::NetnsSyncookiesReturned,
];

/// `names`: the name of each namespace that has one (`names::netns::named`), to join on
/// `netns` (group_left).
pub fn render(
    e: &mut Exposition<'_>,
    namespaces: &[(u32, HashMap<String, u64>)],
    mut names: HashMap<u32, String>,
) {
    Metric::NetnsInfo.open(e);
    for (netns, _) in namespaces {
        if let Some(name) = names.remove(netns) {
            e.sample(
                Metric::NetnsInfo.name(),
                &Metric::NetnsInfo.labelled([&netns.to_string(), &name]),
                1,
            );
        }
    }
    for (counter, metric) in tcpext::COUNTERS.iter().zip(FAMILIES) {
        metric.open(e);
        for (netns, values) in namespaces {
            if let Some(v) = values.get(*counter) {
                e.sample(metric.name(), &metric.labelled([&netns.to_string()]), v);
            }
        }
    }
}
