//! `backlogd top` and `doctor` reading a daemon whose web config turns on TLS and basic
//! auth: with the right CA and credentials they work; without, they fail naming the fix.

use std::{
    path::Path,
    process::{Command, Output},
};

use backlogd_tests::{Daemon, Netns, daemon::binary, sockets::Listener, tempdir::TempDir, tools};

fn run(args: &[&str]) -> Output {
    Command::new(binary())
        .args(args)
        .output()
        .expect("running backlogd")
}

fn text(out: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A private CA (`ca.pem`) and a certificate for localhost signed by it (`cert.pem`,
/// `key.pem`), as a site running its own CA has.
fn private_ca(dir: &Path) {
    let openssl = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "openssl {args:?}: {}", text(&out));
    };
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
    ];
    openssl(
        &[
            &["req", "-x509"][..],
            &ec,
            &[
                "-days",
                "1",
                "-subj",
                "/CN=backlogd test CA",
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
            ],
        ]
        .concat(),
    );
    openssl(
        &[
            &["req"][..],
            &ec,
            &[
                "-subj",
                "/CN=localhost",
                "-keyout",
                "key.pem",
                "-out",
                "leaf.csr",
            ],
        ]
        .concat(),
    );
    std::fs::write(dir.join("leaf.ext"), "subjectAltName=DNS:localhost\n").unwrap();
    openssl(&[
        "x509",
        "-req",
        "-in",
        "leaf.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "1",
        "-extfile",
        "leaf.ext",
        "-out",
        "cert.pem",
    ]);
}

fn bcrypt(user: &str, password: &str) -> String {
    let out = Command::new("htpasswd")
        .args(["-nbBC", "10", user, password])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    String::from_utf8(out.stdout)
        .unwrap()
        .trim()
        .split_once(':')
        .expect("user:hash")
        .1
        .to_owned()
}

#[test]
fn top_and_doctor_read_a_daemon_with_tls_and_basic_auth() {
    let test = "top_and_doctor_read_a_daemon_with_tls_and_basic_auth";
    if !tools::available(test, "openssl", &["version"], "openssl")
        || !tools::available(test, "htpasswd", &["-nbB", "u", "p"], "apache2-utils")
    {
        return;
    }
    let dir = TempDir::new("api-client");
    private_ca(dir.path());
    let web = dir.write(
        "web.yml",
        &format!(
            "tls_server_config:\n  cert_file: cert.pem\n  key_file: key.pem\n\
             basic_auth_users:\n  scraper: {}\n",
            bcrypt("scraper", "s3cret")
        ),
    );
    let right = dir.write("right", "s3cret\n");
    let wrong = dir.write("wrong", "guess\n");
    let ca = dir.path().join("ca.pem");
    let daemon = Daemon::start_with(&["--web-config-file", web.to_str().unwrap()]);
    let ns = Netns::new();
    let listener = Listener::open(&ns, "127.0.0.1:0", 7);

    let url = format!("https://localhost:{}", daemon.addr.port());
    let (ca, right, wrong) = (
        ca.to_str().unwrap(),
        right.to_str().unwrap(),
        wrong.to_str().unwrap(),
    );
    let with = |cmd: &[&str], extra: &[&str]| {
        let mut args = cmd.to_vec();
        args.extend(["--api", url.as_str(), "--ca-file", ca]);
        args.extend(extra);
        run(&args)
    };
    let creds = ["--user", "scraper", "--password-file", right];

    // Right CA and credentials: top shows the listener, doctor reads the same snapshot.
    // (The test's own scrapes speak plain HTTP: wait through top itself.)
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let ours = loop {
        let top = with(&["top", "--json", "--interval", "0.25"], &creds);
        assert!(top.status.success(), "{}", text(&top));
        let rows: serde_json::Value = serde_json::from_slice(&top.stdout).expect("top --json");
        let found = rows
            .as_array()
            .expect("rows")
            .iter()
            .find(|r| r["inode"].as_u64() == Some(listener.inode))
            .cloned();
        match found {
            Some(row) => break row,
            None if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(200))
            }
            None => panic!(
                "listener {} never in top --json ({} rows)",
                listener.inode,
                rows.as_array().map_or(0, Vec::len)
            ),
        }
    };
    assert_eq!(ours["requested"].as_i64(), Some(7), "{ours}");
    let doctor = with(&["doctor", "--json", "--fail-on", "critical"], &creds);
    assert!(
        doctor.status.code() == Some(0) || doctor.status.code() == Some(1),
        "{}",
        text(&doctor)
    );
    serde_json::from_slice::<serde_json::Value>(&doctor.stdout).expect("doctor --json");

    // No credentials, wrong password: refused, and the message says what to pass.
    for (extra, says) in [
        (&[][..], "the daemon requires basic auth"),
        (
            &["--user", "scraper", "--password-file", wrong][..],
            "the daemon refused this user and password",
        ),
    ] {
        for cmd in [&["top", "--once"][..], &["doctor"][..]] {
            let out = with(cmd, extra);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(
                out.status.code(),
                Some(2),
                "{cmd:?} {extra:?}: {}",
                text(&out)
            );
            assert!(
                err.contains("401") && err.contains(says) && err.contains("--password-file"),
                "{cmd:?} {extra:?}: {err}"
            );
        }
    }

    // The system CA bundle does not vouch for a private CA: refused, with the fix named.
    let out = run(&[
        "doctor",
        "--api",
        &url,
        "--user",
        "scraper",
        "--password-file",
        right,
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(err.contains("--ca-file"), "{err}");

    // A password file without a user (and the reverse) is a usage error, not ignored.
    let out = run(&["doctor", "--api", &url, "--password-file", right]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--user"),
        "{}",
        text(&out)
    );
}
