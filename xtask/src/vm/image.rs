//! The guest: an initramfs with backlogd, the suites, the tools they drive and the modules
//! they need, and the init script that runs each suite once per mode.

use super::*;

/// Host tools the suites run, copied into the guest with their shared libraries.
/// (bpftrace and iperf3: the stress suite's other tracer and background traffic;
/// unshare: the container suite's cgroup namespace.)
pub(super) const GUEST_TOOLS: &[&str] = &[
    "ip", "ss", "nft", "bpftool", "setpriv", "bpftrace", "iperf3", "unshare",
];

/// Kernel modules the suites need: nf_tables for `Netns::drop_incoming`, nft_reject_inet
/// for `Netns::reject_outgoing_synacks`; tcp_diag (and inet_diag) for sock_diag, which
/// backlogd's scans and `ss` use. (A production host's modprobe autoloads them; the guest
/// has no modprobe.)
pub(super) const GUEST_MODULES: &[&str] = &["nf_tables", "nft_reject_inet", "tcp_diag"];
/// UAPI header directories bpftrace may need in the guest (see `build_initramfs`).
const UAPI_HEADERS: &[&str] = &[
    "/usr/include/linux",
    "/usr/include/asm-generic",
    "/usr/include/x86_64-linux-gnu/asm",
];

/// Copies a directory tree of regular files.
fn copy_tree(src: &Path, dst: &Path) -> Result<()> {
    std::fs::create_dir_all(dst)?;
    for entry in std::fs::read_dir(src)? {
        let entry = entry?;
        let to = dst.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_tree(&entry.path(), &to)?;
        } else {
            copy_file(&entry.path().canonicalize()?, &to)?;
        }
    }
    Ok(())
}

/// Modules of older kernels that newer ones build into another (nft_counter is a module
/// on 5.10 and part of nf_tables on 6.1): loaded where they exist.
pub(super) const BUILTIN_LATER_MODULES: &[&str] = &["nft_counter"];

/// What goes into every guest: backlogd and the suites' test executables.
pub(crate) struct Payload {
    pub(crate) backlogd: PathBuf,
    pub(crate) suites: Vec<(String, PathBuf)>,
}

pub(super) fn build_payload() -> Result<Payload> {
    crate::cargo(&["build", "--release", "--package", "backlogd"])?;
    let mut cmd = Command::new("cargo");
    cmd.args([
        "test",
        "--release",
        "--package",
        "backlogd-tests",
        "--no-run",
        "--message-format=json",
    ]);
    for (suite, _) in GUEST_SUITES {
        cmd.args(["--test", suite]);
    }
    let out = cmd
        .current_dir(crate::workspace_root())
        .stderr(Stdio::inherit())
        .output()
        .context("building the integration suites")?;
    if !out.status.success() {
        bail!("building the integration suites failed: {}", out.status);
    }
    let mut suites = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if msg["reason"] != "compiler-artifact" || msg["target"]["kind"][0] != "test" {
            continue;
        }
        if let (Some(name), Some(exe)) =
            (msg["target"]["name"].as_str(), msg["executable"].as_str())
        {
            suites.push((name.to_owned(), PathBuf::from(exe)));
        }
    }
    for (suite, _) in GUEST_SUITES {
        if !suites.iter().any(|(n, _)| n == suite) {
            bail!("cargo built no executable for integration suite `{suite}`");
        }
    }
    Ok(Payload {
        backlogd: crate::workspace_root().join("target/release/backlogd"),
        suites,
    })
}

/// Stages the guest's root file system under `work/root` and packs it as a newc cpio.
pub(crate) fn build_initramfs(
    work: &Path,
    kernel: &Kernel,
    payload: &Payload,
    runs: &str,
) -> Result<PathBuf> {
    let root = work.join("root");
    let _ = std::fs::remove_dir_all(&root);
    for dir in [
        "bin",
        "sbin",
        "dev",
        "proc",
        "sys",
        "tmp",
        "run",
        "etc",
        "backlogd/tests",
    ] {
        std::fs::create_dir_all(root.join(dir))?;
    }
    copy_file(Path::new("/bin/busybox"), &root.join("bin/busybox"))
        .context("busybox-static is required for the guest (Debian package busybox-static)")?;
    for f in ["/etc/protocols", "/etc/services"] {
        if Path::new(f).exists() {
            copy_file(Path::new(f), &root.join(&f[1..]))?;
        }
    }
    std::fs::write(root.join("etc/passwd"), "root:x:0:0:root:/:/bin/sh\n")?;
    std::fs::write(root.join("etc/group"), "root:x:0:\n")?;

    let mut binaries = vec![(payload.backlogd.clone(), PathBuf::from("backlogd/backlogd"))];
    for (suite, exe) in &payload.suites {
        binaries.push((exe.clone(), PathBuf::from("backlogd/tests").join(suite)));
    }
    for tool in GUEST_TOOLS {
        let path = output(Command::new("sh").args(["-c", &format!("command -v {tool}")]))
            .with_context(|| format!("host tool `{tool}` not found (run `cargo xtask setup`)"))?;
        let path = PathBuf::from(path.trim());
        let canonical = path.canonicalize()?;
        binaries.push((canonical, path.strip_prefix("/")?.to_path_buf()));
    }
    let mut libs = BTreeSet::new();
    for (src, dst) in &binaries {
        copy_file(src, &root.join(dst))?;
        libs.extend(shared_libraries(src)?);
    }
    for lib in &libs {
        copy_file(&lib.canonicalize()?, &root.join(lib.strip_prefix("/")?))?;
    }
    // bpftrace describes a tracepoint's record from the kernel's BTF when that has its
    // type; 5.10's lacks some, and bpftrace then compiles the format file's fields against
    // <linux/types.h>. The host's UAPI headers (linux-libc-dev) serve; they are not the
    // kernel's own but define the same fixed-size types.
    for dir in UAPI_HEADERS {
        copy_tree(Path::new(dir), &root.join(&dir[1..]))
            .with_context(|| format!("{dir}: install Debian package linux-libc-dev"))?;
    }

    let modules = module_load_order(kernel)?;
    let mut insmods = String::new();
    for (i, module) in modules.iter().enumerate() {
        let dst = format!("modules/{i:02}.ko");
        decompress_module(module, &root.join(&dst))?;
        writeln!(
            insmods,
            "insmod /{dst} || echo \"{MARK} insmod {} failed\"",
            module.display()
        )?;
    }

    let init = INIT_TEMPLATE
        .replace("@MARK@", MARK)
        .replace("@RELEASE@", &kernel.release)
        .replace("@INSMODS@", &insmods)
        .replace("@SLOW@", &SUITE_SLOW.as_secs().to_string())
        .replace("@STUCK@", &SUITE_STUCK.as_secs().to_string())
        .replace("@RUNS@", runs);
    let init_path = root.join("init");
    std::fs::write(&init_path, init)?;
    set_executable(&init_path)?;

    let cpio = work.join("initramfs.cpio");
    let status = Command::new("sh")
        .args([
            "-c",
            "find . -print0 | cpio --null --quiet -o -H newc -R 0:0 > \"$0\"",
        ])
        .arg(&cpio)
        .current_dir(&root)
        .status()
        .context("starting cpio (Debian package cpio)")?;
    if !status.success() {
        bail!("packing the initramfs with cpio failed: {status}");
    }
    Ok(cpio)
}

/// A suite run this long gets the guest's state printed (tasks, kernel stacks, daemon
/// logs): a kernel's every suite in every mode (about 30 runs) took 8 to 15 minutes in all
/// under TCG on a 2-CPU machine (`cargo xtask vm` at 731fe89), so one suite still running
/// after 5 is stuck or starved. Guest time, which under TCG can run fast (5.10's ran
/// up to 2.6x fast on that machine): each run's `end` marker carries its guest seconds
/// (`secs=`), so the CI log shows how close any suite comes.
pub(super) const SUITE_SLOW: Duration = Duration::from_secs(5 * 60);
/// A suite run this long is killed (its row fails with rc=137 and the state printed), so
/// the guest goes on with its other runs instead of reaching [`GUEST_TIMEOUT`]; 18 minutes
/// here once cost a CI run its last kernel's remaining suites.
pub(super) const SUITE_STUCK: Duration = Duration::from_secs(9 * 60);

/// The guest's /init: mounts what backlogd and the suites need, loads modules, runs every
/// suite per mode with markers the host parses, and powers off.
pub(super) const INIT_TEMPLATE: &str = r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/ TMPDIR=/tmp
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs tmp /tmp
mount -t tracefs tracefs /sys/kernel/tracing
mount -t bpf bpf /sys/fs/bpf
mount -t cgroup2 cgroup2 /sys/fs/cgroup
ip link set lo up
@INSMODS@
echo "@MARK@ kernel $(uname -r) expected @RELEASE@ cpus $(nproc)"
# The kernel's taint flags as letters (Documentation/admin-guide/tainted-kernels.rst).
taint_letters() {
    bits=$1 i=0 letters=""
    for l in P F S R M B U D A W C I O E L K X T N J; do
        [ $(( (bits >> i) & 1 )) = 1 ] && letters="$letters$l"
        i=$((i + 1))
    done
    echo "${letters:-none}"
}
# A WARN or an Oops that did not panic shows only here (loglevel=3 hides it from the
# console): flags gained during a suite fail its row, with the kernel log printed.
last_taint=$(cat /proc/sys/kernel/tainted)
echo "@MARK@ taint at boot: $last_taint ($(taint_letters $last_taint))"
export BACKLOGD_BIN=/backlogd/backlogd RUST_BACKTRACE=1 NO_COLOR=1
export BACKLOGD_TEST_LOG_DIR=/tmp/daemon-logs
mkdir -p $BACKLOGD_TEST_LOG_DIR
# What every user task is doing: state, CPU time, kernel stack; and the daemons' last lines.
dump_state() {
    echo "@MARK@ state: uptime $(cut -d' ' -f1 /proc/uptime) s, load $(cat /proc/loadavg)"
    for t in /proc/[0-9]*/task/[0-9]*; do
        [ -n "$(head -c 1 ${t%/task/*}/cmdline 2>/dev/null)" ] || continue
        set -- $(sed 's/^.*) //' $t/stat)
        echo "-- task ${t#/proc/} $(cat $t/comm) state $1 utime ${12} stime ${13} wchan $(cat $t/wchan 2>/dev/null)"
        head -n 12 $t/stack 2>/dev/null
    done
    for f in $BACKLOGD_TEST_LOG_DIR/*.log; do
        [ -e "$f" ] || continue
        echo "-- last lines of $f"
        tail -n 30 "$f"
    done
}
# A suite still running after @SLOW@ s gets its state printed (it may only be slow);
# after @STUCK@ s it is killed, so one hung suite does not cost the guest's other runs.
run_suite() {
    mode=$1 suite=$2
    shift 2
    echo "@MARK@ begin mode=$mode suite=$suite"
    began=$(cut -d. -f1 /proc/uptime)
    rm -f $BACKLOGD_TEST_LOG_DIR/*.log
    BACKLOGD_HOOK_MODE=$mode /backlogd/tests/$suite --test-threads=1 "$@" 2>&1 &
    pid=$!
    (
        sleep @SLOW@
        kill -0 $pid 2>/dev/null || exit 0
        echo "@MARK@ slow mode=$mode suite=$suite: still running after @SLOW@ s"
        dump_state
        sleep $((@STUCK@ - @SLOW@))
        kill -0 $pid 2>/dev/null || exit 0
        echo "@MARK@ stuck mode=$mode suite=$suite: killed after @STUCK@ s"
        dump_state
        for s in /proc/[0-9]*/stat; do
            ppid=$(sed 's/^.*) //' $s 2>/dev/null | cut -d' ' -f2)
            [ "$ppid" = "$pid" ] && c=${s%/stat} && kill -KILL ${c#/proc/}
        done
        kill -KILL $pid
    ) &
    watchdog=$!
    wait $pid
    rc=$?
    kill $watchdog 2>/dev/null
    taint=$(cat /proc/sys/kernel/tainted)
    if [ "$taint" != "$last_taint" ]; then
        echo "@MARK@ tainted mode=$mode suite=$suite flags=$(taint_letters $((taint & ~last_taint)))"
        dmesg | tail -n 120 | sed 's/^/kernel log: /'
        last_taint=$taint
    fi
    echo "@MARK@ end mode=$mode suite=$suite secs=$(($(cut -d. -f1 /proc/uptime) - began)) rc=$rc"
}
@RUNS@
echo "@MARK@ done"
poweroff -f
"#;

/// The init script's `run_suite` lines: every suite in every mode, `repeat` times, less the
/// skipped tests of (mode, suite, test).
pub(super) fn suite_runs(
    mode: &str,
    suites: &[(&str, Option<&str>)],
    repeat: u32,
    skips: &[(&str, &str)],
) -> Vec<String> {
    let mut runs = Vec::new();
    for (suite, filter) in suites {
        let mut args = filter.unwrap_or("").to_owned();
        for (_, test) in skips.iter().filter(|s| s.0 == *suite) {
            args.push_str(&format!(" --skip {test}"));
        }
        for _ in 0..repeat {
            runs.push(format!("run_suite {mode} {suite} {args}\n"));
        }
    }
    runs
}

/// Shared libraries `binary` loads (ldd), the dynamic loader included.
pub(super) fn shared_libraries(binary: &Path) -> Result<Vec<PathBuf>> {
    let out = Command::new("ldd").arg(binary).output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    if text.contains("not a dynamic executable") || !out.status.success() {
        return Ok(Vec::new());
    }
    let mut libs = Vec::new();
    for line in text.lines() {
        if line.contains("not found") {
            bail!("{}: {}", binary.display(), line.trim());
        }
        let path = line
            .split("=>")
            .nth(1)
            .unwrap_or(line)
            .split_whitespace()
            .next()
            .unwrap_or("");
        if path.starts_with('/') {
            libs.push(PathBuf::from(path));
        }
    }
    Ok(libs)
}

pub(super) fn copy_file(src: &Path, dst: &Path) -> Result<()> {
    if let Some(parent) = dst.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::copy(src, dst)
        .with_context(|| format!("copying {} to {}", src.display(), dst.display()))?;
    Ok(())
}

pub(super) fn set_executable(path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))?;
    Ok(())
}
