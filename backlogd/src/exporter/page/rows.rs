//! The listeners of one render, each with its labels rendered once.

use crate::{
    exporter::{catalogue::LISTENER_LABELS, text::LabelSet},
    listeners::Listener,
};

/// One listener of the page: its label values (in [`LISTENER_LABELS`] order) and the
/// label set made from them.
pub struct Row<'a> {
    pub values: [String; 6],
    pub set: LabelSet,
    pub listener: &'a Listener,
}

impl<'a> Row<'a> {
    pub fn new(l: &'a Listener) -> Self {
        let values = [
            l.netns.to_string(),
            l.addr.to_string(),
            l.port.to_string(),
            l.inode.to_string(),
            l.pid.to_string(),
            l.comm.clone(),
        ];
        let labels: [(&str, &str); 6] =
            std::array::from_fn(|i| (LISTENER_LABELS[i], values[i].as_str()));
        let set = LabelSet::new(&labels);
        Self {
            values,
            set,
            listener: l,
        }
    }

    /// The value of label `name` (one of [`LISTENER_LABELS`]).
    pub fn value(&self, name: &str) -> &str {
        let i = LISTENER_LABELS
            .iter()
            .position(|l| *l == name)
            .unwrap_or_else(|| panic!("{name} is not a listener label"));
        &self.values[i]
    }
}

/// `,reason="x"} ` for each drop reason, pre-rendered once per family.
pub fn reason_suffixes() -> [String; 4] {
    crate::exporter::catalogue::DROP_REASONS
        .map(|reason| format!(",{}=\"{reason}\"}} ", crate::exporter::catalogue::REASON))
}
