//! The connection-burst replay suite: every `tests/scenarios/*.toml`, or those whose name
//! contains one of the arguments (`cargo xtask test NAME`). Prints a table per scenario
//! and a libtest-style result line; exits non-zero on any mismatch between backlogd and
//! the kernel.

use std::{panic::AssertUnwindSafe, path::PathBuf};

use backlogd_tests::{Daemon, scenario};

fn main() {
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    files.sort();
    let total = files.len();
    let chosen: Vec<PathBuf> = files
        .into_iter()
        .filter(|p| {
            let name = p.file_stem().unwrap().to_string_lossy();
            filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str()))
        })
        .collect();
    println!("\nrunning {} scenarios", chosen.len());
    let args = scenario::daemon_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    // The sweeps' debug lines go into a mismatch's report.
    let daemon = (!chosen.is_empty())
        .then(|| Daemon::start_env(&args, &[("BACKLOGD_LOG", "info,backlogd::daemon=debug")]));
    let (mut passed, mut failed) = (0, Vec::new());
    for path in &chosen {
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        let outcome = scenario::Scenario::load(path).and_then(|s| {
            let daemon = daemon.as_ref().expect("daemon started");
            std::panic::catch_unwind(AssertUnwindSafe(|| scenario::run(&name, &s, daemon)))
                .unwrap_or_else(|p| {
                    Err(format!(
                        "scenario {name} panicked: {}",
                        p.downcast_ref::<String>()
                            .map(String::as_str)
                            .or(p.downcast_ref::<&str>().copied())
                            .unwrap_or("?")
                    ))
                })
        });
        match outcome {
            Ok(table) => {
                println!("{table}");
                passed += 1;
            }
            Err(report) => {
                println!("{report}");
                failed.push(name);
            }
        }
    }
    let filtered = total - chosen.len();
    println!(
        "test result: {}. {passed} passed; {} failed; 0 ignored; 0 measured; {filtered} filtered out",
        if failed.is_empty() { "ok" } else { "FAILED" },
        failed.len()
    );
    if !failed.is_empty() {
        println!("failed scenarios: {}", failed.join(", "));
        // exit() skips destructors: stop the daemon first, or it outlives the suite.
        drop(daemon);
        std::process::exit(1);
    }
}
