//! The listeners of one render, each with its labels rendered once.

use backlogd_common::DropReason;

use crate::{
    exporter::{
        catalogue::{GROUP_LABELS, LISTENER_LABELS, PROCESS_LABELS},
        text::LabelSet,
    },
    listeners::Listener,
};

/// One listener of the page and its label set ([`LISTENER_LABELS`], in order). Its
/// group's labels are the set's first ones and its process's the last, so the group and
/// process families use parts of it instead of label sets of their own.
pub struct Row<'a> {
    pub set: LabelSet,
    /// End of the group's labels in `set`.
    group_end: usize,
    /// Start of the process's labels in `set`.
    process_start: usize,
    pub listener: &'a Listener,
}

impl<'a> Row<'a> {
    pub fn new(l: &'a Listener) -> Self {
        let int = itoa::Buffer::new;
        let (mut netns, mut port, mut socket, mut pid) = (int(), int(), int(), int());
        let address = l.addr.to_string();
        // The values of LISTENER_LABELS, in its order (the test below holds them to it).
        let values: [&str; LISTENER_LABELS.len()] = [
            netns.format(l.netns),
            &address,
            port.format(l.port),
            socket.format(l.inode),
            pid.format(l.pid),
            &l.comm,
        ];
        let mut set = LabelSet::default();
        let (mut group_end, mut process_start) = (0, 0);
        for (i, (name, value)) in LISTENER_LABELS.into_iter().zip(values).enumerate() {
            if i == LISTENER_LABELS.len() - PROCESS_LABELS.len() {
                // After the comma that follows the labels before.
                process_start = set.len() + 1;
            }
            set.push(name, value);
            if i + 1 == GROUP_LABELS.len() {
                group_end = set.len();
            }
        }
        Self {
            set,
            group_end,
            process_start,
            listener: l,
        }
    }

    /// The labels of the listener's SO_REUSEPORT group ([`GROUP_LABELS`]).
    pub fn group_labels(&self) -> &str {
        &self.set[..self.group_end]
    }

    /// The labels of the listener's process ([`PROCESS_LABELS`]).
    pub fn process_labels(&self) -> &str {
        &self.set[self.process_start..]
    }
}

/// `,label="x"} ` for each of `values`, pre-rendered once per family: the last label of
/// a per-listener series, after the listener's set.
pub fn label_suffixes<const N: usize>(label: &str, values: [&str; N]) -> [String; N] {
    values.map(|value| format!(",{label}=\"{value}\"}} "))
}

/// [`label_suffixes`] of each drop reason, indexed by it.
pub fn reason_suffixes() -> [String; DropReason::COUNT] {
    use crate::exporter::catalogue::REASON;
    label_suffixes(REASON, DropReason::ALL.map(DropReason::name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_and_process_labels_are_the_ends_of_the_listener_set() {
        assert_eq!(LISTENER_LABELS[..GROUP_LABELS.len()], GROUP_LABELS);
        assert_eq!(
            LISTENER_LABELS[LISTENER_LABELS.len() - PROCESS_LABELS.len()..],
            PROCESS_LABELS
        );
        let l: Listener = serde_json::from_value(serde_json::json!({
            "inode": 77, "netns": 4026531840u32, "addr": "::1", "port": 8080, "pid": 12,
            "comm": "we\"ird\\name", "requested": null, "granted": 128
        }))
        .expect("a listener");
        let row = Row::new(&l);
        let names: Vec<&str> = row
            .set
            .split(',')
            .map(|label| label.split_once('=').expect("k=v").0)
            .collect();
        assert_eq!(names, LISTENER_LABELS);
        assert_eq!(
            &*row.set,
            r#"netns="4026531840",address="::1",port="8080",socket="77",pid="12",comm="we\"ird\\name""#
        );
        let group = [
            ("netns", "4026531840"),
            ("address", "::1"),
            ("port", "8080"),
        ];
        assert_eq!(row.group_labels(), &*LabelSet::new(&group));
        let process = [("pid", "12"), ("comm", "we\"ird\\name")];
        assert_eq!(row.process_labels(), &*LabelSet::new(&process));
    }
}
