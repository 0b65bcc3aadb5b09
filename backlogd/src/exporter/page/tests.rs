//! Every family the page can serve, rendered from fixtures, its samples' labels held to the
//! catalogue's declaration: the collectors take their label names from it, and this is
//! what fails if one ever builds a label set of its own.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use backlogd_common::{DropReason, ListenerStats};

use super::{
    aggregates, listeners,
    netns::{self},
    own::{self, Own},
    retired::Retired,
    rows::Row,
};
use crate::{
    api::fixtures,
    config::AcceptWaitBuckets,
    exporter::{
        catalogue::Metric,
        figures::{Figures, ImpactFigures},
        text::{Exposition, Kind},
    },
    listeners::Listener,
    loader::modes::{HookMode, KernelSupport},
    queues::QueueFigures,
    sampling::tcpext,
};

/// Three listeners: two members of one SO_REUSEPORT group of one process (one with a
/// drop and client impact, both with waits), and a third with every owner name.
fn listeners() -> Vec<Listener> {
    let mut a = fixtures::listener(1, 80, "nginx", Some(511), 128).listener;
    let mut b = fixtures::listener(2, 80, "nginx", None, 128).listener;
    b.pid = a.pid;
    a.comm = "we\"ird, name".into();
    b.comm = a.comm.clone();
    let mut c = fixtures::listener(3, 6379, "redis-server", Some(511), 128).listener;
    let id = "3f4c2d1e0b9a8f7e6d5c4b3a29181706f5e4d3c2b1a09f8e7d6c5b4a39281706";
    let uid = "0a1b2c3d-4e5f-6789-abcd-ef0123456789";
    let mut names = crate::names::cgroup::parse(&format!("/kubepods/pod{uid}/{id}"));
    names.unit = Some("cri-containerd-x.scope".into());
    names.pod_name = Some("cache-0".into());
    names.pod_namespace = Some("shop".into());
    if let Some(container) = names.container.as_mut() {
        container.name = Some("redis".into());
    }
    c.names = Some(names);
    vec![a, b, c]
}

fn figures() -> Figures {
    let mut dropping = ListenerStats::default();
    dropping.drops[DropReason::AcceptQueueFull] = 3;
    dropping.delayed = [1, 1];
    dropping.delay[2] = 2;
    dropping.abandoned = 1;
    dropping.accept_wait[3] = 5;
    let mut waiting = ListenerStats::default();
    waiting.accept_wait[4] = 1;
    Figures {
        events_lost: 0,
        stats_full: 0,
        impact: ImpactFigures::default(),
        stats: [(1, dropping), (2, waiting)].into_iter().collect(),
        queues: [(
            1,
            QueueFigures {
                syn_depth: Some(2),
                ..Default::default()
            },
        )]
        .into_iter()
        .collect(),
        scan: Some(crate::queues::ScanPass {
            at: std::time::Instant::now(),
            took: std::time::Duration::from_millis(2),
        }),
        sources: [(
            1,
            crate::sources::DropSources {
                prefixes: 3,
                top_share: 0.5,
                // The last five minutes: what the gauges and the series serve.
                recent: Some(Box::new(crate::sources::DropSources {
                    prefixes: 2,
                    top_share: 0.75,
                    top: Some(
                        [("192.0.2.0/24", 3), ("198.51.100.0/24", 1)]
                            .map(|(prefix, syn_drops)| crate::sources::Source {
                                prefix: prefix.to_owned(),
                                counts: crate::sources::Counts {
                                    syn_drops,
                                    ..Default::default()
                                },
                                share: 0.0,
                                last_seen_seconds_ago: 0.0,
                            })
                            .to_vec(),
                    ),
                    ..Default::default()
                })),
                ..Default::default()
            },
        )]
        .into_iter()
        .collect(),
        recent: None,
    }
}

/// Source prefixes per listener the page serves a series of (`drop_source_top_series`):
/// fewer than listener 1 has, so the cap shows.
const TOP_SERIES: usize = 1;

/// The whole page, every collector in page order, without a kernel.
fn page() -> String {
    page_seeing(true)
}

/// The whole page, by programs that see accepts or not (`syscall_hook`).
fn page_seeing(accepts: bool) -> String {
    let table = listeners();
    let rows: Vec<Row<'_>> = table.iter().map(Row::new).collect();
    let figures = figures();
    let mut e = Exposition::default();
    listeners::render(
        &mut e,
        &rows,
        &figures,
        accepts,
        accepts.then(AcceptWaitBuckets::default).as_ref(),
        TOP_SERIES,
    );
    let sums = aggregates::sum(
        &rows,
        &figures.stats,
        &figures.queues,
        &mut Retired::default(),
    );
    aggregates::render(&mut e, &sums, accepts);
    let counters: HashMap<String, u64> = tcpext::COUNTERS
        .iter()
        .map(|c| ((*c).to_owned(), 1))
        .collect();
    netns::render(
        &mut e,
        &[(fixtures::NETNS, counters)],
        [(fixtures::NETNS, "blue".to_owned())].into_iter().collect(),
    );
    own::render(
        &mut e,
        &Own {
            listeners: rows.len(),
            events_lost: 0,
            stats_full: 0,
            queues_full: 0,
            orphans_removed: 0,
            impact_tracked: 0,
            impact_sweeps: 0,
            impact_untracked: 0,
            scan: Some((0.5, 0.002)),
            missed_runs: Some((0, vec![("drops", 0)])),
            mode: HookMode::Tracepoint,
            kernel: KernelSupport::default(),
            pinned: false,
        },
    );
    e.finish()
}

/// The label names of a sample line (`name{a="x",b="y\"z"} 1`), in order.
fn label_names(line: &str) -> Vec<String> {
    let Some(open) = line.find('{') else {
        return Vec::new();
    };
    let mut names = Vec::new();
    let mut rest = &line[open + 1..];
    while let Some((name, after)) = rest.split_once("=\"") {
        names.push(name.trim_start_matches(',').to_owned());
        // Past the value's closing quote (a quote after a backslash is part of it).
        let mut escaped = false;
        let end = after
            .char_indices()
            .find(|&(_, c)| {
                let close = c == '"' && !escaped;
                escaped = c == '\\' && !escaped;
                close
            })
            .map(|(i, _)| i)
            .expect("a closed label value");
        rest = &after[end + 1..];
        if rest.starts_with('}') {
            break;
        }
    }
    names
}

/// Programs that do not see accept() return (`syscall_hook = false` outside fentry mode)
/// leave every accepted counter at zero: served, a zero would say the application
/// accepts nothing. Not served, and nothing else goes with them.
#[test]
fn without_accepts_no_accepted_family_is_served_and_every_other_is() {
    let families = |page: &str| -> BTreeSet<String> {
        page.lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split_whitespace().next())
            .map(str::to_owned)
            .collect()
    };
    let with = families(&page_seeing(true));
    let without = families(&page_seeing(false));
    let gone: BTreeSet<&str> = with.difference(&without).map(String::as_str).collect();
    assert_eq!(
        gone,
        [
            Metric::GroupAccepted.name(),
            Metric::ListenAcceptWaitSeconds.name(),
            Metric::ListenAccepted.name(),
            Metric::ProcessAccepted.name(),
        ]
        .into_iter()
        .collect::<BTreeSet<_>>()
    );
    assert!(without.is_subset(&with));
}

#[test]
fn every_served_label_set_is_the_one_its_family_declares() {
    let page = page();
    let families: HashMap<&str, Metric> = Metric::ALL.iter().map(|m| (m.name(), *m)).collect();
    let mut served: BTreeMap<&str, usize> = BTreeMap::new();
    let mut family: Option<Metric> = None;
    for line in page.lines() {
        if let Some(name) = line.strip_prefix("# TYPE ") {
            let name = name.split(' ').next().unwrap();
            family = Some(*families.get(name).expect("a catalogued family"));
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        let m = family.expect("a sample after its family's TYPE line");
        let sample = line.split(['{', ' ']).next().unwrap();
        let mut declared: Vec<&str> = m.labels().names().to_vec();
        match m.kind() {
            Kind::Histogram if sample == format!("{}_bucket", m.name()) => declared.push("le"),
            Kind::Histogram => assert!(
                [format!("{}_sum", m.name()), format!("{}_count", m.name())]
                    .contains(&sample.to_owned()),
                "{line}"
            ),
            _ => assert_eq!(sample, m.name(), "{line}"),
        }
        let names = label_names(line);
        if m == Metric::ListenerOwnerInfo {
            // An info series leaves out the names its owner lacks (empty is absent to
            // Prometheus): the declared ones, in order, less some.
            let mut left = declared.iter();
            assert!(
                names.iter().all(|n| left.any(|d| d == n)),
                "{}: served {names:?}, declared {declared:?}",
                m.name()
            );
            if names.len() == declared.len() {
                *served.entry(m.name()).or_default() += 1;
            }
        } else {
            assert_eq!(names, declared, "{}: {line}", m.name());
            *served.entry(m.name()).or_default() += 1;
        }
    }
    // Every family was served in full at least once, so none escaped the check.
    let missing: Vec<&str> = Metric::ALL
        .iter()
        .map(|m| m.name())
        .filter(|n| !served.contains_key(n))
        .collect();
    assert!(missing.is_empty(), "no full sample of {missing:?}:\n{page}");
}

#[test]
fn drop_source_families_only_for_the_dropping_listener_and_their_help_reads_well() {
    let page = page();
    for (name, value) in [
        ("backlogd_listen_drop_source_prefixes", "2"),
        ("backlogd_listen_drop_source_top_share", "0.75"),
        ("backlogd_listen_drop_sources_untracked_total", "0"),
        // The largest prefix only: the cap is 1.
        ("backlogd_listen_drop_source_recent_segments", "3"),
    ] {
        let samples: Vec<&str> = page
            .lines()
            .filter(|l| l.starts_with(&format!("{name}{{")))
            .collect();
        // Listener 1 dropped; listener 2 only waited: one series each.
        assert_eq!(samples.len(), 1, "{name}: {samples:?}");
        assert!(samples[0].contains("socket=\"1\""), "{}", samples[0]);
        if name.ends_with("recent_segments") {
            assert!(
                samples[0].contains(",prefix=\"192.0.2.0/24\"}"),
                "{}",
                samples[0]
            );
        }
        assert!(samples[0].ends_with(&format!(" {value}")), "{}", samples[0]);
        let help = page
            .lines()
            .find(|l| l.starts_with(&format!("# HELP {name} ")))
            .expect("a HELP line");
        assert!(!help.contains("  "), "{help}");
    }
}
