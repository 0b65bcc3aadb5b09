//! A parser for the Prometheus text exposition format, enough to find series by labels.

use std::collections::BTreeMap;

/// Values of the `reason` label of `backlogd_listen_drops_total`.
pub const DROP_REASONS: [&str; 4] = [
    "accept_queue_full",
    "syn_queue_full",
    "final_ack_overflow",
    "other",
];

#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

#[derive(Debug, Clone)]
pub struct Scrape {
    pub text: String,
    pub samples: Vec<Sample>,
}

impl Scrape {
    pub fn parse(text: &str) -> Self {
        let samples = text
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(|l| parse_line(l).unwrap_or_else(|| panic!("unparsable sample line {l:?}")))
            .collect();
        Self {
            text: text.to_owned(),
            samples,
        }
    }

    /// Samples of `name` whose labels include every pair in `labels`.
    pub fn find(&self, name: &str, labels: &[(&str, &str)]) -> Vec<&Sample> {
        self.samples
            .iter()
            .filter(|s| {
                s.name == name
                    && labels
                        .iter()
                        .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .collect()
    }

    /// The hook mode the daemon reports it is using (`backlogd_hook_mode{mode} 1`).
    pub fn hook_mode(&self) -> String {
        let on: Vec<_> = self
            .find("backlogd_hook_mode", &[])
            .into_iter()
            .filter(|s| s.value == 1.0)
            .collect();
        assert_eq!(on.len(), 1, "exactly one hook mode in use: {on:?}");
        on[0].labels["mode"].clone()
    }

    /// The value of the single sample matching; panics if there are several.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let found = self.find(name, labels);
        assert!(
            found.len() <= 1,
            "{} series of {name} match {labels:?}: {found:#?}",
            found.len()
        );
        found.first().map(|s| s.value)
    }
}

fn parse_line(line: &str) -> Option<Sample> {
    let (head, value) = line.rsplit_once(' ')?;
    let value = value.parse().ok()?;
    let (name, labels) = match head.split_once('{') {
        None => (head, BTreeMap::new()),
        Some((name, rest)) => (name, parse_labels(rest.strip_suffix('}')?)?),
    };
    Some(Sample {
        name: name.to_owned(),
        labels,
        value,
    })
}

fn parse_labels(mut s: &str) -> Option<BTreeMap<String, String>> {
    let mut labels = BTreeMap::new();
    while !s.is_empty() {
        let (key, rest) = s.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            let (i, c) = chars.next()?;
            match c {
                '\\' => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                '"' => break i,
                c => value.push(c),
            }
        };
        labels.insert(key.to_owned(), value);
        s = rest[end + 1..].trim_start_matches(',');
    }
    Some(labels)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_labels_with_escapes_and_bare_samples() {
        let s = Scrape::parse("# HELP x y\nx{a=\"1\",b=\"q\\\"u,o}te\"} 3\nup 1\n");
        assert_eq!(s.value("x", &[("b", "q\"u,o}te")]), Some(3.0));
        assert_eq!(s.value("up", &[]), Some(1.0));
        assert_eq!(s.value("x", &[("a", "2")]), None);
    }
}
