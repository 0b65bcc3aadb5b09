//! What a rule is: one pure check of a snapshot, reporting one kind of finding.

use std::collections::BTreeMap;

use super::finding::{Finding, FindingKind};
use crate::api::{ListenerSnapshot, NamespaceSnapshot, Snapshot};

/// One rule: the kind of finding it reports, and how it finds them.
pub struct Rule {
    pub kind: FindingKind,
    pub check: Check,
}

pub enum Check {
    /// Looks at each listener alone (in snapshot order).
    Listener(fn(&ListenerSnapshot, &Context<'_>) -> Option<Finding>),
    /// Looks at the snapshot as a whole (groups of listeners, namespaces).
    Snapshot(fn(&Context<'_>) -> Vec<Finding>),
}

/// The snapshot the rules read, with its namespaces by inode.
pub struct Context<'a> {
    pub snapshot: &'a Snapshot,
    namespaces: BTreeMap<u32, &'a NamespaceSnapshot>,
}

impl<'a> Context<'a> {
    pub fn new(snapshot: &'a Snapshot) -> Self {
        Self {
            snapshot,
            namespaces: snapshot.namespaces.iter().map(|n| (n.netns, n)).collect(),
        }
    }

    /// `l`'s namespace, where the snapshot has it.
    pub fn namespace(&self, l: &ListenerSnapshot) -> Option<&'a NamespaceSnapshot> {
        self.namespaces.get(&l.listener.netns).copied()
    }
}
