//! The names README.md, BENCHMARKS.md and docs/*.md quote are names backlogd has: every
//! `backlogd_*` metric family in backticks or a code block is one the catalogue serves,
//! every `--flag` given to a backlogd command (or quoted bare, as a flag of backlogd) is
//! one its command line has, and every config key quoted as one is a key of the config
//! file; and the config table lists every key. Quote another program's flag with its
//! command (`redis-server --tcp-backlog N`) and a sysctl by its full name
//! (`net.ipv4.tcp_syn_retries = 6`): a bare `--flag` or `name = value` reads as backlogd's. A renamed flag or metric otherwise lives on in the docs
//! for as long as nobody tries it. Each bad name is reported with its file and line.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
};

use clap::CommandFactory as _;

use crate::{
    cli::Cli,
    config::Layer,
    exporter::{catalogue::Metric, text::Kind},
};

/// Crates of this workspace: `backlogd_common::...` is a Rust path, not a metric.
const CRATE_NAMES: [&str; 3] = ["backlogd_common", "backlogd_ebpf", "backlogd_tests"];

/// First words of commands that are not backlogd's: a bare `--flag` quoted after one of
/// them (in the same paragraph) is that command's, not backlogd's.
const OTHER_COMMANDS: [&str; 13] = [
    "cargo",
    "podman",
    "docker",
    "kubectl",
    "systemctl",
    "systemd-analyze",
    "qemu-system-x86_64",
    "setpriv",
    "wrk",
    "ip",
    "ss",
    "curl",
    "node_exporter",
];

/// One piece of quoted text: an inline code span or a line of a fenced block.
struct Span {
    text: String,
    line: usize,
    /// Inside a fenced code block (a command line, not prose).
    code: bool,
    /// Index of the paragraph (or block) it is in: context for bare flags.
    paragraph: usize,
}

/// The docs the test reads: README.md, BENCHMARKS.md and every docs/*.md.
fn doc_files() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = vec![root.join("README.md"), root.join("BENCHMARKS.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .map(|e| e.expect("docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

/// Inline code spans (which may wrap across lines, never across paragraphs) and the
/// lines of fenced code blocks, with the line each starts on. Backslash-continued lines
/// of a block are one command.
fn spans(text: &str) -> Vec<Span> {
    let mut out = Vec::new();
    let mut fence: Option<String> = None;
    let mut paragraph = 0;
    let mut open: Option<Span> = None;
    let mut continued: Option<Span> = None;
    for (i, line) in text.lines().enumerate() {
        let number = i + 1;
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") {
            fence = match fence {
                Some(_) => None,
                None => Some(trimmed.trim_start_matches('`').to_owned()),
            };
            paragraph += 1;
            open = None;
            continue;
        }
        if let Some(lang) = &fence {
            // Scenario files and the like are not backlogd's config or command line.
            if lang == "toml" {
                continue;
            }
            let mut span = continued.take().unwrap_or(Span {
                text: String::new(),
                line: number,
                code: true,
                paragraph,
            });
            let body = line.trim_end();
            match body.strip_suffix('\\') {
                Some(head) => {
                    span.text.push_str(head);
                    span.text.push(' ');
                    continued = Some(span);
                }
                None => {
                    span.text.push_str(body);
                    out.push(span);
                }
            }
            continue;
        }
        if line.trim().is_empty() {
            paragraph += 1;
            // An unmatched backtick ends with its paragraph.
            open = None;
            continue;
        }
        for (j, piece) in line.split('`').enumerate() {
            if j > 0 {
                match open.take() {
                    Some(span) => out.push(span),
                    None => {
                        open = Some(Span {
                            text: String::new(),
                            line: number,
                            code: false,
                            paragraph,
                        })
                    }
                }
            }
            if let Some(span) = open.as_mut() {
                if j == 0 {
                    span.text.push(' ');
                }
                span.text.push_str(piece);
            }
        }
    }
    out
}

/// The catalogue's families; a histogram's `_bucket`, `_sum` and `_count` series too.
fn metric_names() -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for m in Metric::ALL {
        names.insert(m.name().to_owned());
        if matches!(m.kind(), Kind::Histogram) {
            for suffix in ["_bucket", "_sum", "_count"] {
                names.insert(format!("{}{suffix}", m.name()));
            }
        }
    }
    names
}

/// `backlogd_*` words in `text`: (name, whether a `*` follows it, as in `backlogd_listen_*`).
fn quoted_metrics(text: &str) -> Vec<(String, bool)> {
    let mut out = Vec::new();
    let bytes = text.as_bytes();
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut from = 0;
    while let Some(at) = text[from..].find("backlogd_").map(|k| k + from) {
        let mut end = at + "backlogd_".len();
        while end < bytes.len() && word(bytes[end]) {
            end += 1;
        }
        from = end;
        if at > 0 && (word(bytes[at - 1]) || bytes[at - 1] == b'-' || bytes[at - 1] == b'.') {
            continue;
        }
        let name = &text[at..end];
        let rest = &text[end..];
        // A Rust path, a crate, a file name (`backlogd_0.1.0-1_amd64.deb`) or the bare prefix.
        if rest.starts_with("::")
            || CRATE_NAMES.contains(&name)
            || name.len() == "backlogd_".len()
            || name.as_bytes()["backlogd_".len()].is_ascii_digit()
        {
            continue;
        }
        out.push((name.to_owned(), rest.starts_with('*')));
    }
    out
}

/// Long flags of each subcommand (global ones included), and of the top-level command
/// under "".
fn flags() -> Vec<(String, BTreeSet<String>)> {
    let cmd = Cli::command();
    let longs = |c: &clap::Command| -> BTreeSet<String> {
        let mut set: BTreeSet<String> = c
            .get_arguments()
            .filter_map(|a| a.get_long().map(str::to_owned))
            .collect();
        set.extend(["help".to_owned(), "version".to_owned()]);
        set
    };
    let global: BTreeSet<String> = cmd
        .get_arguments()
        .filter(|a| a.is_global_set())
        .filter_map(|a| a.get_long().map(str::to_owned))
        .collect();
    let mut out = vec![(String::new(), longs(&cmd))];
    for sub in cmd.get_subcommands() {
        let mut set = longs(sub);
        set.extend(global.iter().cloned());
        out.push((sub.get_name().to_owned(), set));
    }
    out
}

/// Every key of the config file, `http.` ones dotted.
fn config_keys() -> BTreeSet<String> {
    let serde_json::Value::Object(layer) =
        serde_json::to_value(Layer::default()).expect("a layer serializes")
    else {
        panic!("a config layer is a table");
    };
    let mut keys = BTreeSet::new();
    for (key, value) in layer {
        match value {
            serde_json::Value::Object(table) => {
                keys.extend(table.keys().map(|k| format!("{key}.{k}")));
            }
            _ => {
                keys.insert(key);
            }
        }
    }
    keys
}

/// `--flag` words of a token list: `[--pin-dir` and `--listen=ADDR` give their names.
fn flag_words<'a>(tokens: impl Iterator<Item = &'a str>) -> Vec<String> {
    tokens
        .map(|t| t.trim_start_matches(['[', '(']))
        .filter(|t| t.starts_with("--") && t.len() > 2)
        .map(|t| {
            t[2..]
                .split(['=', ']', ')', ',', '/', '`'])
                .next()
                .unwrap_or_default()
                .to_owned()
        })
        .filter(|f| !f.is_empty())
        .collect()
}

/// What is wrong with the names one file quotes, one line per bad name (`file:line: ...`).
fn check(file: &str, text: &str) -> Vec<String> {
    let metrics = metric_names();
    let flags = flags();
    let all_flags: BTreeSet<&String> = flags.iter().flat_map(|(_, f)| f).collect();
    let keys = config_keys();
    let mut bad = Vec::new();
    let spans = spans(text);
    for (n, span) in spans.iter().enumerate() {
        let at = format!("{file}:{}", span.line);
        for (name, wildcard) in quoted_metrics(&span.text) {
            let known = if wildcard {
                metrics.iter().any(|m| m.starts_with(&name))
            } else {
                metrics.contains(&name)
            };
            if !known {
                bad.push(format!("{at}: metric `{name}` is not in the catalogue"));
            }
        }

        // Commands: split at shell separators; a code line's `#` starts a comment.
        let body = match span.code {
            true => span.text.split(" #").next().unwrap_or_default(),
            false => span.text.as_str(),
        };
        let mut bare = true;
        for segment in body.split(['|', ';', '&']) {
            let tokens: Vec<&str> = segment.split_whitespace().collect();
            let start = tokens
                .iter()
                .position(|t| *t != "sudo" && !t.contains('='))
                .unwrap_or(tokens.len());
            let Some(first) = tokens.get(start) else {
                continue;
            };
            let is_backlogd = *first == "backlogd" || first.ends_with("/backlogd");
            // `cargo xtask run -- ARGS`: ARGS are `backlogd run`'s.
            let xtask_run = *first == "cargo"
                && tokens.get(start + 1) == Some(&"xtask")
                && tokens.get(start + 2) == Some(&"run");
            if !first.starts_with("--") {
                bare = false;
            }
            let (sub, args): (&str, &[&str]) = if is_backlogd {
                match tokens.get(start + 1) {
                    Some(s) if flags.iter().any(|(name, _)| !name.is_empty() && name == s) => {
                        (s, &tokens[start + 2..])
                    }
                    _ => ("", &tokens[start + 1..]),
                }
            } else if xtask_run {
                match tokens.iter().position(|t| *t == "--") {
                    Some(dash) => ("run", &tokens[dash + 1..]),
                    None => continue,
                }
            } else {
                continue;
            };
            let known = &flags
                .iter()
                .find(|(name, _)| name == sub)
                .expect("listed")
                .1;
            for flag in flag_words(args.iter().copied()) {
                if !known.contains(&flag) {
                    let command = match sub {
                        "" => "backlogd".to_owned(),
                        s => format!("backlogd {s}"),
                    };
                    bad.push(format!("{at}: `{command}` has no flag `--{flag}`"));
                }
            }
        }
        // A span that is only flags (`--pin-dir DIR`) is backlogd's, unless an earlier
        // span of its paragraph named another command.
        if bare && !span.code && span.text.trim_start().starts_with("--") {
            let other = spans[..n]
                .iter()
                .rev()
                .take_while(|s| s.paragraph == span.paragraph)
                .find_map(|s| {
                    let first = s.text.split_whitespace().find(|t| *t != "sudo")?;
                    if first == "backlogd" {
                        Some(false)
                    } else {
                        OTHER_COMMANDS.contains(&first).then_some(true)
                    }
                })
                .unwrap_or(false);
            if !other {
                for flag in flag_words(span.text.split_whitespace()) {
                    if !all_flags.contains(&flag) {
                        bad.push(format!("{at}: no backlogd command has a flag `--{flag}`"));
                    }
                }
            }
        }

        // Config keys quoted as such: `http.x`, and `key = value` as the file spells it
        // (a TOML line; dotted names other than `http.` are sysctls and the like).
        if !span.code {
            let t = span.text.trim();
            let key = match t.split_once(" = ") {
                Some((k, _)) => toml::from_str::<toml::Table>(t).is_ok().then_some(k),
                None => Some(t).filter(|t| t.starts_with("http.") && !t.ends_with(".rs")),
            };
            if let Some(k) = key
                && is_key_word(k)
                && !keys.contains(k)
            {
                bad.push(format!("{at}: `{k}` is not a key of the config file"));
            }
        }
    }
    bad.extend(check_key_tables(file, text, &keys));
    bad
}

/// A config key's spelling: lower-case words joined by `_`, in the `http.` table or none
/// (`net.core.somaxconn = 128` is a sysctl).
fn is_key_word(k: &str) -> bool {
    let k = k.strip_prefix("http.").unwrap_or(k);
    !k.is_empty() && k.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
}

/// Tables whose first column is headed `key` list config keys: each row's key and line.
fn key_table_rows(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut in_key_table = false;
    for (i, line) in text.lines().enumerate() {
        let Some(row) = line.strip_prefix('|') else {
            in_key_table = false;
            continue;
        };
        let first = row.split('|').next().unwrap_or_default().trim();
        if first == "key" {
            in_key_table = true;
        } else if in_key_table && !first.starts_with("---") {
            out.push((i + 1, first.trim_matches('`').to_owned()));
        }
    }
    out
}

/// Each key a config table lists must be one.
fn check_key_tables(file: &str, text: &str, keys: &BTreeSet<String>) -> Vec<String> {
    key_table_rows(text)
        .into_iter()
        .filter(|(_, key)| !keys.contains(key))
        .map(|(line, key)| {
            format!("{file}:{line}: `{key}` in the config table is not a key of the config file")
        })
        .collect()
}

#[test]
fn docs_quote_only_names_backlogd_has() {
    let mut bad = Vec::new();
    let mut tabled = BTreeSet::new();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for path in doc_files() {
        let text = std::fs::read_to_string(&path).expect("readable doc");
        let name = path
            .strip_prefix(&root)
            .unwrap_or(&path)
            .display()
            .to_string();
        bad.extend(check(&name, &text));
        tabled.extend(key_table_rows(&text).into_iter().map(|(_, key)| key));
    }
    for key in config_keys() {
        if !tabled.contains(&key) {
            bad.push(format!(
                "config key `{key}` is in no config table (a table headed `key`) of the docs"
            ));
        }
    }
    assert!(
        bad.is_empty(),
        "the docs quote names backlogd does not have:\n{}",
        bad.join("\n")
    );
}

/// The checker itself: each kind of bad name is caught, with its line, and good ones pass.
#[test]
fn each_kind_of_bad_name_is_reported_with_its_line() {
    let text = "\
Fine: `backlogd_listen_drops_total{reason=\"other\"}`, `backlogd_listen_accept_wait_seconds_bucket`,
`backlogd_listen_*`, `backlogd_tests::Netns`, `backlogd run --pin-dir DIR`, `--hook-mode auto`,
`http.max_header_bytes = 8192`, `http.max_connections`, `backlogd_0.1.0-1_amd64.deb`, `http.rs`,
`net.ipv4.tcp_syn_retries = 6`, `sk_drops = sum of the drops`.

`backlogd_listen_drop_total` and `backlogd top --no-such-flag`

```sh
sudo backlogd doctor --fail-on critical --jsn && deploy   # --not-checked in a comment
cargo xtask run -- --listen 127.0.0.1:9000 --lgo debug
```

`--pin-dri DIR` and `max_header_byte = 1` and `http.max_conections`; after
`cargo xtask vm`, `--kernel` is xtask's.

| key | flag |
|---|---|
| `listen` | `--listen HOST:PORT` |
| `lisen` | |
";
    let bad = check("t.md", text);
    assert_eq!(
        bad,
        [
            "t.md:6: metric `backlogd_listen_drop_total` is not in the catalogue",
            "t.md:6: `backlogd top` has no flag `--no-such-flag`",
            "t.md:9: `backlogd doctor` has no flag `--jsn`",
            "t.md:10: `backlogd run` has no flag `--lgo`",
            "t.md:13: no backlogd command has a flag `--pin-dri`",
            "t.md:13: `max_header_byte` is not a key of the config file",
            "t.md:13: `http.max_conections` is not a key of the config file",
            "t.md:19: `lisen` in the config table is not a key of the config file",
        ]
    );
}
