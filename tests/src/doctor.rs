//! `backlogd doctor --json` against a test daemon, and its findings read back.

use std::{collections::BTreeSet, process::Command};

use crate::{Daemon, Netns, daemon::binary};

pub struct Doctor {
    pub findings: Vec<serde_json::Value>,
    pub status: i32,
}

impl Doctor {
    /// `backlogd doctor --json --api DAEMON EXTRA...`.
    pub fn run(daemon: &Daemon, extra: &[&str]) -> Self {
        let out = Command::new(binary())
            .args(["doctor", "--json", "--api", &daemon.addr.to_string()])
            .args(extra)
            .output()
            .expect("running backlogd doctor");
        let findings: Vec<serde_json::Value> =
            serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
                panic!(
                    "doctor --json: {e}\n{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                )
            });
        Self {
            findings,
            status: out.status.code().expect("exit status"),
        }
    }

    /// Findings about namespace `ns` (subjects name their netns).
    pub fn about(&self, ns: &Netns) -> Vec<&serde_json::Value> {
        let tag = format!("netns {}", ns.inode());
        self.findings
            .iter()
            .filter(|f| f["subject"].as_str().unwrap().contains(&tag))
            .collect()
    }
}

impl Doctor {
    /// The finding of `kind` about `listener` in `ns`; panics with every finding when there
    /// is none.
    pub fn on(
        &self,
        kind: &str,
        ns: &Netns,
        listener: &crate::sockets::Listener,
    ) -> &serde_json::Value {
        let port = format!(":{} (netns", listener.addr.port());
        self.about(ns)
            .into_iter()
            .find(|f| f["kind"] == kind && f["subject"].as_str().unwrap().contains(&port))
            .unwrap_or_else(|| {
                panic!(
                    "doctor has no {kind} finding on {}: {:#?}",
                    listener.addr, self.findings
                )
            })
    }
}

pub fn kinds(findings: &[&serde_json::Value]) -> BTreeSet<String> {
    findings
        .iter()
        .map(|f| f["kind"].as_str().unwrap().to_owned())
        .collect()
}

/// A finding's evidence lines joined with "; ".
pub fn evidence(f: &serde_json::Value) -> String {
    f["evidence"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect::<Vec<_>>()
        .join("; ")
}

pub fn set(k: &[&str]) -> BTreeSet<String> {
    k.iter().map(|s| s.to_string()).collect()
}
