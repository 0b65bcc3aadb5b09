//! What a test reports beyond pass or fail, in lines `cargo xtask test` and the kernel
//! matrix read: a test that could not check here (SKIP), and checks that held only within
//! the runs the kernel says it skipped (NOT EXACT).
//!
//! libtest knows only passed and failed, and it swallows what a passing test prints, so a
//! test that returned early looked like a pass. These lines go straight to stderr (the
//! guest's console) and, when `BACKLOGD_MARK_LOG` names a file (the host run of `cargo
//! xtask test`), are appended there too. xtask compares them with its expected lists
//! (`xtask/src/marks.rs`): a skip nobody listed fails the cell.
//!
//! Format, one line each: `@@backlogd-mark skip suite=S test=T: reason` and
//! `@@backlogd-mark not-exact suite=S test=T: what`.

use std::io::Write as _;

/// The prefix of every mark line; xtask/src/marks.rs parses it.
pub const MARK: &str = "@@backlogd-mark";

/// This test cannot check on this kernel or machine: says so loudly and in a mark line.
/// The caller returns at once; under `cargo xtask test` a skip that is not on the expected
/// list for this kernel and mode fails the run.
pub fn skip(reason: &str) {
    crate::report(&format!(
        "\n!!!!!!!! SKIPPED {}: {reason}. This test proved nothing here.\n",
        test_name()
    ));
    write_mark("skip", reason);
}

/// Checks of this test held only because the kernel itself reported skipping runs of the
/// programs that feed them (`what` says which, by how much).
pub fn not_exact(what: &str) {
    write_mark("not-exact", what);
}

fn write_mark(kind: &str, text: &str) {
    // One line, whatever the text holds: the readers split on newlines.
    let text = text.replace('\n', " ");
    let line = format!(
        "\n{MARK} {kind} suite={} test={}: {text}\n",
        suite_name(),
        test_name()
    );
    crate::report(&line);
    if let Some(path) = std::env::var_os("BACKLOGD_MARK_LOG") {
        let appended = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(line.trim_start().as_bytes()));
        if let Err(e) = appended {
            // The mark must not be lost silently: a lost skip would read as a pass.
            panic!("writing the mark line to BACKLOGD_MARK_LOG={path:?}: {e}");
        }
    }
}

/// The running test, as libtest names its thread (`module::test_fn`).
pub fn test_name() -> String {
    std::thread::current()
        .name()
        .filter(|n| *n != "main")
        .unwrap_or("unknown-test")
        .to_owned()
}

/// The test binary's name without cargo's hash: `syn_drops` for
/// `target/release/deps/syn_drops-7ae09d8f698ddb91` or the guest's `/backlogd/tests/syn_drops`.
pub fn suite_name() -> String {
    let argv0 = std::env::args().next().unwrap_or_default();
    suite_of(&argv0).to_owned()
}

fn suite_of(argv0: &str) -> &str {
    let base = argv0.rsplit('/').next().unwrap_or(argv0);
    match base.rsplit_once('-') {
        Some((name, hash)) if hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()) => {
            name
        }
        _ => base,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suite_names_lose_cargos_hash_only() {
        assert_eq!(
            suite_of("target/release/deps/syn_drops-7ae09d8f698ddb91"),
            "syn_drops"
        );
        assert_eq!(suite_of("/backlogd/tests/syn_drops"), "syn_drops");
        assert_eq!(suite_of("/x/day_one"), "day_one");
        assert_eq!(suite_of("/x/client-impact"), "client-impact");
    }
}
