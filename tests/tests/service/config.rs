//! The config file (`check-config`) and the shipped systemd unit.

use std::process::Command;

use backlogd_tests::{
    daemon::{binary, run_to_end},
    tempdir::TempDir,
    tools,
};

use crate::support::unit_file;

#[test]
fn check_config_prints_effective_settings_and_rejects_unknown_keys_by_name() {
    let dir = TempDir::new("check");
    let good = dir.write(
        "good.toml",
        "rescan_interval = 5\nhook_mode = \"tracepoint\"\n[http]\nmax_connections = 8\n",
    );
    let out = run_to_end(&[
        "check-config",
        "--config",
        good.to_str().unwrap(),
        "--hwm-window",
        "9",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in [
        "rescan_interval = 5",
        "hwm_window = 9",
        "hook_mode = \"tracepoint\"",
        "max_connections = 8",
        "listen = \"0.0.0.0:9851\"",
    ] {
        assert!(text.contains(line), "{line} missing from:\n{text}");
    }

    let bad = dir.write("bad.toml", "log = \"info\"\n[http]\nmax_conections = 8\n");
    let out = run_to_end(&["check-config", "--config", bad.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    for want in ["max_conections", "line 3", "bad.toml", "max_connections"] {
        assert!(err.contains(want), "{want} missing from:\n{err}");
    }

    let out = run_to_end(&["check-config", "--config", "/nonexistent/backlogd.toml"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/backlogd.toml"));

    let web = dir.write("web.yml", "basic_auth_users:\n  prometheus: not-a-hash\n");
    let out = run_to_end(&["check-config", "--web-config-file", web.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("basic_auth_users.prometheus") && err.contains("bcrypt"),
        "{err}"
    );

    // `run` refuses a bad file before touching the kernel.
    let out = run_to_end(&["run", "--config", bad.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("max_conections"));
}

#[test]
fn systemd_analyze_verifies_the_shipped_unit() {
    if !tools::available(
        "systemd_analyze_verifies_the_shipped_unit",
        "systemd-analyze",
        &["--version"],
        "systemd",
    ) {
        return;
    }
    // verify checks that ExecStart's binary exists: point it at the one under test.
    let dir = TempDir::new("unit");
    let unit = std::fs::read_to_string(unit_file())
        .unwrap()
        .replace("/usr/local/bin/backlogd", binary().to_str().unwrap());
    let path = dir.write("backlogd.service", &unit);
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "verify:\n{said}"
    );
    let out = Command::new("systemd-analyze")
        .args(["security", "--offline=yes"])
        .arg(&path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let score = text
        .lines()
        .find(|l| l.contains("Overall exposure level"))
        .unwrap_or_else(|| panic!("no score in:\n{text}"));
    eprintln!("{score}");
    let value: f64 = score
        .split(':')
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap();
    // 1.9 with the load split (docs/operations.md, "systemd unit").
    assert!(value <= 2.0, "exposure rose to {value}: {score}");
}
