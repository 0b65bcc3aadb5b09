#!/usr/bin/python3
"""The systemd guest's checks (`cargo xtask systemd-guest`): runs as a oneshot unit after
multi-user.target in a Debian guest whose PID 1 is systemd, installs the backlogd package
and proves the service's behaviour from systemd's own state (`systemctl show`, the
journal) and the kernel's (/proc, bpftool, TcpExt).

Every line for the host starts with MARK: `check N NAME PASS|FAIL (...)`, `evidence N: ...`,
and `done passed=P failed=F`. The host fails the run unless every check passed.
"""

import http.client
import json
import os
import pwd
import re
import signal
import subprocess
import sys
import time
import traceback

MARK = "@@backlogd-systemd"
UNIT = "backlogd.service"
PAYLOAD = os.path.dirname(os.path.abspath(__file__))
DEB = os.path.join(PAYLOAD, "backlogd.deb")
CONFIG = "/etc/backlogd/backlogd.toml"
PIN_DIR = "/sys/fs/bpf/backlogd"
METRICS_PORT = 9851
NETNS = "sgdrops"
# What the unit gives the daemon, user backlogd: CAP_DAC_READ_SEARCH (2), CAP_SYS_PTRACE
# (19), CAP_BPF (39). Nothing that loads or attaches (the unit's `backlogd load` step, as
# root, did that), and no CAP_SYS_ADMIN: the scan iterator lists listeners without
# entering a namespace.
UNIT_BOUNDING = (1 << 2) | (1 << 19) | (1 << 39)


def runtime_caps():
    """What the daemon keeps of UNIT_BOUNDING: CAP_BPF only where bpf(2) on its maps needs
    it, as 5.10's kernel/bpf/syscall.c gates every command while
    kernel.unprivileged_bpf_disabled is set, and 6.1's only loading and map creation (the
    daemon finds out by trying). None between the two: not known."""
    sysctl = open("/proc/sys/kernel/unprivileged_bpf_disabled").read().strip()
    version = tuple(int(p) for p in re.findall(r"\d+", os.uname().release)[:2])
    if sysctl not in ("1", "2") or version < (5, 11):
        return UNIT_BOUNDING
    if version >= (6, 1):
        return UNIT_BOUNDING & ~(1 << 39)
    return None
DAEMON_USER = "backlogd"
# Shortened from the unit's 30 s so the watchdog check costs seconds, not a minute.
WATCHDOG_SEC = 8


def say(text):
    print(f"{MARK} {text}", flush=True)


def now_usec():
    """CLOCK_MONOTONIC in µs: the clock of systemd's *TimestampMonotonic properties and of
    the journal's __MONOTONIC_TIMESTAMP (one boot)."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000


class CheckFailed(Exception):
    pass


def expect(cond, what):
    if not cond:
        raise CheckFailed(what)


def sh(*cmd, ok=True, stdin=None):
    p = subprocess.run(cmd, input=stdin, capture_output=True, text=True)
    if ok and p.returncode != 0:
        raise CheckFailed(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()}")
    return p


def show(*props):
    out = sh("systemctl", "show", UNIT, "-p", ",".join(props)).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def wait_for(what, fn, timeout=60.0, every=0.2):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(every)
    raise CheckFailed(f"timed out after {timeout:.0f} s waiting for {what}")


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def journal(since_usec=0):
    """backlogd's journal entries (the daemon's lines and systemd's about the unit) at or
    after `since_usec` on the monotonic clock: (monotonic µs, pid, message, raw message,
    syslog priority)."""
    out = sh("journalctl", "-b", "-u", UNIT, "-o", "json", "--no-pager").stdout
    entries = []
    for line in out.splitlines():
        e = json.loads(line)
        mono = int(e["__MONOTONIC_TIMESTAMP"])
        if mono < since_usec:
            continue
        raw = e.get("MESSAGE", "")
        # journald stores a message holding control characters (ANSI colours) as bytes.
        text = bytes(raw).decode("utf-8", "replace") if isinstance(raw, list) else raw
        entries.append((mono, int(e.get("_PID", 0)), ANSI.sub("", text), raw,
                        int(e.get("PRIORITY", 6))))
    return entries


def first(entries, needle, pid=None):
    for e in entries:
        if needle in e[2] and (pid is None or e[1] == pid):
            return e
    return None


def http_get(path, headers=None, timeout=10):
    c = http.client.HTTPConnection("127.0.0.1", METRICS_PORT, timeout=timeout)
    try:
        c.request("GET", path, headers=headers or {})
        r = c.getresponse()
        return r.status, r.read().decode("utf-8", "replace")
    finally:
        c.close()


LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def metric_sum(text, name, /, **labels):
    """Sum of the samples of `name` whose labels include `labels`; None if there is none."""
    total = None
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        head, value = line.rsplit(" ", 1)
        got = dict(LABEL.findall(head[len(name):]))
        if all(got.get(k) == str(v) for k, v in labels.items()):
            total = (total or 0) + float(value)
    return total


def main_pid():
    return int(show("MainPID")["MainPID"])


def bpf_progs():
    out = sh("bpftool", "-j", "prog", "list").stdout
    return {p["id"]: p.get("name", "") for p in json.loads(out or "[]")}


def pin_files():
    found = []
    for root, dirs, files in os.walk(PIN_DIR):
        found.extend(os.path.join(root, f) for f in files + dirs)
    return found


state = {}
# What the running check found so far: printed after it, whether it passed or not.
EVIDENCE = []


# ---- 1 ------------------------------------------------------------------------------------
def start_becomes_active_only_after_ready():
    ev = EVIDENCE
    props = show("ActiveState", "UnitFileState", "FragmentPath")
    ev.append(f"after install: {props}")
    expect(props["UnitFileState"] == "enabled", "the package did not enable the unit")
    if props["ActiveState"] != "inactive":
        ev.append("NOTE: the package started the unit on install; stopped it for this check")
        sh("systemctl", "stop", UNIT)
    t0 = now_usec()
    sh("systemctl", "start", "--no-block", UNIT)
    # Poll systemd's view while the daemon loads its probes.
    seen = []
    running_not_active = None
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        p = show("ActiveState", "SubState", "MainPID")
        key = (p["ActiveState"], p["SubState"])
        if not seen or seen[-1] != key:
            seen.append(key)
        if p["ActiveState"] == "activating" and int(p["MainPID"]) > 0:
            running_not_active = running_not_active or (now_usec(), int(p["MainPID"]))
        if p["ActiveState"] in ("active", "failed") or (
            p["ActiveState"] == "inactive" and len(seen) > 1
        ):
            break
        time.sleep(0.05)
    ev.append(f"ActiveState/SubState as polled: {seen}")
    p = show(
        "ActiveState", "SubState", "MainPID", "ExecMainStartTimestampMonotonic",
        "ActiveEnterTimestampMonotonic", "StatusText", "NRestarts", "Type", "NotifyAccess",
        "WatchdogUSec",
    )
    ev.append(f"systemctl show: {p}")
    expect(p["ActiveState"] == "active", f"the unit did not become active: {p}")
    pid = int(p["MainPID"])
    exec_start = int(p["ExecMainStartTimestampMonotonic"])
    active = int(p["ActiveEnterTimestampMonotonic"])
    expect(running_not_active is not None,
           "never saw the daemon running while the unit was still activating")
    ev.append(f"daemon pid {running_not_active[1]} running while the unit was activating "
              f"at +{(running_not_active[0] - exec_start) / 1e6:.3f} s after ExecMainStart")
    entries = journal(t0)
    attached = first(entries, "probes attached", pid)
    serving = first(entries, "serving metrics on", pid)
    started = first(entries, "Started backlogd.service")
    for what, e in (("probes attached", attached), ("serving metrics", serving),
                    ("systemd: Started", started)):
        expect(e is not None, f"no journal line {what!r} for pid {pid}")
        ev.append(f"journal {what}: +{(e[0] - exec_start) / 1e6:.3f} s after ExecMainStart: "
                  f"{e[2][:160]}")
    ev.append(f"ActiveEnterTimestampMonotonic: +{(active - exec_start) / 1e6:.3f} s after "
              "ExecMainStart")
    expect(exec_start < attached[0] < active,
           "systemd called the unit active before the daemon logged that its probes were "
           f"attached (exec {exec_start}, attached {attached[0]}, active {active})")
    # journald timestamps a line when it reads it; systemd stamps READY when it receives
    # it: the daemon logs "serving metrics" before it sends READY=1, but the two arrive
    # through different sockets, so only their order in the journal is reported here.
    ev.append(f"'serving metrics' journal time minus ActiveEnter: "
              f"{(serving[0] - active) / 1e3:+.1f} ms (informative: two sockets)")
    expect(p["StatusText"] == "probes attached, serving metrics",
           f"StatusText is {p['StatusText']!r}, not the STATUS sent with READY=1")
    status, body = http_get("/metrics")
    expect(status == 200 and "backlogd_hook_mode" in body, f"/metrics answered {status}")
    mode = [l for l in body.splitlines() if l.startswith("backlogd_hook_mode{")]
    ev.append(f"/metrics 200 once active; {mode}")
    # The journal as an operator reads it (journalctl without -a shows [blob data] for a
    # line holding control characters).
    blobs = sum(1 for e in entries if isinstance(e[3], list))
    ev.append(f"journal lines of the daemon stored as blobs (control characters): {blobs} "
              f"of {len(entries)}")
    plain = sh("journalctl", "-b", "-u", UNIT, "--no-pager", "-n", "3").stdout
    for line in plain.splitlines():
        ev.append(f"journalctl -u backlogd: {line[:200]}")
    warn = [e[2][:200] for e in entries if e[1] == pid and e[4] <= 4]
    for w in warn:
        ev.append(f"daemon warning at start (what it left out, if anything): {w}")
    state["pid"] = pid
    return ev


# ---- 2 ------------------------------------------------------------------------------------
def reload_applies_a_changed_setting():
    ev = EVIDENCE
    pid = main_pid()
    # A 12 KiB request head: within the default http.max_header_bytes (16384), over 8192.
    pad = {"X-Pad": "a" * 12 * 1024}
    status, _ = http_get("/metrics", pad)
    ev.append(f"before: GET /metrics with a 12 KiB head -> {status}")
    expect(status == 200, f"12 KiB head before the reload: {status}, want 200")
    text = open(CONFIG).read()
    new, n = re.subn(r"(?m)^#?max_header_bytes = \d+$", "max_header_bytes = 8192", text)
    expect(n == 1, f"{CONFIG} has {n} max_header_bytes lines, want 1")
    with open(CONFIG, "w") as f:
        f.write(new)
    t0 = now_usec()
    sh("systemctl", "reload", UNIT)
    def applied():
        try:
            s, _ = http_get("/metrics", pad)
        except OSError:
            return None
        return s if s == 431 else None
    status = wait_for("a 431 for a 12 KiB head after the reload", applied, timeout=30)
    ev.append(f"after `systemctl reload`: the same request -> {status}")
    p = show("ActiveState", "SubState", "MainPID", "StatusText")
    ev.append(f"systemctl show: {p}")
    expect(p["ActiveState"] == "active" and int(p["MainPID"]) == pid,
           f"the reload restarted or stopped the daemon: {p}")
    entries = journal(t0)
    for needle in ("Reloading backlogd", "configuration reloaded", "Reloaded backlogd"):
        e = first(entries, needle)
        expect(e is not None, f"no journal line {needle!r} after the reload")
        ev.append(f"journal: {e[2][:200]}")
    expect("changed: http" in first(entries, "configuration reloaded")[2],
           "the reload's log line does not name [http] among the changed settings")
    return ev


# ---- 5 ------------------------------------------------------------------------------------
def mountinfo_options(pid, path):
    """(mount point, per-mount options) of the mount that holds `path` in pid's namespace."""
    best = None
    for line in open(f"/proc/{pid}/mountinfo"):
        fields = line.split()
        point, opts = fields[4], fields[5]
        if path == point or path.startswith(point.rstrip("/") + "/") or point == "/":
            if best is None or len(point) >= len(best[0]):
                best = (point, opts)
    return best


def hardening_in_force():
    ev = EVIDENCE
    pid = main_pid()
    status = {}
    for line in open(f"/proc/{pid}/status"):
        k, _, v = line.partition(":")
        status[k] = v.strip()
    keys = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp")
    ev.append("/proc/%d/status: %s" % (pid, " ".join(f"{k}={status.get(k)}" for k in keys)))
    keep = runtime_caps()
    if keep is None:
        keep = int(status["CapEff"], 16)
        ev.append("kernel between 5.10 and 6.1: whether CAP_BPF is needed is not known")
    want = f"{keep:016x}"
    for k in ("CapPrm", "CapEff"):
        expect(status[k] == want, f"{k} {status[k]}, want {want} (SYS_PTRACE "
               "DAC_READ_SEARCH, and BPF where bpf(2) on maps needs it)")
    bounding = f"{UNIT_BOUNDING:016x}"
    expect(status["CapBnd"] == bounding, f"CapBnd {status['CapBnd']}, want {bounding} "
           "(the unit's: BPF SYS_PTRACE DAC_READ_SEARCH)")
    user = pwd.getpwnam(DAEMON_USER)
    uids = status["Uid"].split()
    ev.append(f"/proc/{pid}/status Uid: {status['Uid']} (user {DAEMON_USER} is "
              f"{user.pw_uid})")
    expect(all(int(u) == user.pw_uid for u in uids),
           f"the daemon runs as uid {uids}, not {DAEMON_USER} ({user.pw_uid})")
    owners = {os.stat(f).st_uid for f in pin_files()}
    ev.append(f"owners of the {len(pin_files())} pins under {PIN_DIR}: {sorted(owners)}")
    expect(owners == {user.pw_uid}, f"pins owned by {owners}, not {DAEMON_USER}")
    loads = [e[2][:200] for e in journal(0)
             if "pinned under" in e[2] or "already holds" in e[2]]
    ev.append(f"the load step (ExecStartPre=), last: {loads[-1:] or 'no line'}")
    expect(loads, "no journal line of the load step (`backlogd load`)")
    p = sh("systemd-analyze", "security", "backlogd.service", ok=False)
    ev.append("systemd-analyze security: " + " ".join(
        l.strip() for l in p.stdout.splitlines() if "Overall exposure" in l))
    for k in ("CapInh", "CapAmb"):
        expect(int(status[k], 16) == 0, f"{k} {status[k]}, want none")
    expect(status["NoNewPrivs"] == "1", "NoNewPrivs is not set")
    expect(status["Seccomp"] == "2", "no seccomp filter (SystemCallFilter=)")
    for path, mode in (("/usr", "ro"), ("/etc", "ro"), ("/boot", "ro"), (PIN_DIR, "rw")):
        point, opts = mountinfo_options(pid, path)
        ev.append(f"mountinfo of {pid}: {path} is on {point} ({opts})")
        expect(opts.split(",")[0] == mode, f"{path} is not {mode} in the daemon's mount "
               f"namespace: {point} {opts}")
    # Root with every capability, in the daemon's mount namespace only: the mount refuses.
    p = sh("nsenter", "-t", str(pid), "-m", "touch", "/usr/lib/backlogd-sg-probe", ok=False)
    ev.append(f"nsenter -t {pid} -m touch /usr/lib/...: rc={p.returncode} "
              f"{p.stderr.strip()}")
    expect(p.returncode != 0 and "Read-only file system" in p.stderr,
           "/usr is writable in the daemon's mount namespace")
    # PrivateTmp and ProtectHome: the host's /tmp and /root are not what the daemon sees.
    open("/tmp/sg-host-marker", "w").close()
    os.makedirs("/root", exist_ok=True)
    open("/root/sg-host-marker", "w").close()
    for d in ("/tmp", "/root"):
        p = sh("nsenter", "-t", str(pid), "-m", "ls", "-A", d, ok=False)
        ev.append(f"in the daemon's namespace `ls -A {d}`: rc={p.returncode} "
                  f"{(p.stdout + p.stderr).split()}")
        expect("sg-host-marker" not in p.stdout, f"the daemon sees the host's {d}")
    return ev


# ---- 4 ------------------------------------------------------------------------------------
def list_overflows():
    out = sh("ip", "netns", "exec", NETNS, "cat", "/proc/net/netstat").stdout.splitlines()
    for names, values in zip(out[0::2], out[1::2]):
        if names.startswith("TcpExt:"):
            return int(dict(zip(names.split()[1:], values.split()[1:]))["ListenOverflows"])
    raise CheckFailed("no TcpExt in the namespace's /proc/net/netstat")


class Actor:
    def __init__(self):
        self.p = subprocess.Popen(
            ["ip", "netns", "exec", NETNS, "python3", os.path.join(PAYLOAD, "actor.py")],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        words = self.p.stdout.readline().split()
        if not words or words[0] != "ready":
            raise CheckFailed(f"the namespace's listener did not start: {words}")
        self.port, self.inode = int(words[1]), int(words[2])

    def cmd(self, line):
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()
        answer = self.p.stdout.readline().strip()
        if answer != "ok":
            raise CheckFailed(f"actor `{line}`: {answer!r}")


def sigkill_restarts_and_counters_continue_from_the_pins():
    ev = EVIDENCE
    sh("ip", "netns", "add", NETNS)
    sh("ip", "-n", NETNS, "link", "set", "lo", "up")
    netns = os.stat(f"/run/netns/{NETNS}").st_ino
    base = list_overflows()
    actor = Actor()
    state["actor"] = actor
    labels = {"netns": netns, "port": actor.port}

    def drops():
        _, text = http_get("/metrics")
        return metric_sum(text, "backlogd_listen_drops_total", reason="accept_queue_full",
                          **labels)

    wait_for("the namespace's listener in /metrics", lambda: drops() is not None)
    actor.cmd("fill 2")
    actor.cmd("drop 5")
    kernel1 = list_overflows() - base
    got = wait_for(f"backlogd's accept-queue drops to equal the kernel's {kernel1}",
                   lambda: (lambda d: d if d == kernel1 else None)(drops()), timeout=20)
    ev.append(f"before the kill: backlogd accept_queue_full {got:.0f}, namespace "
              f"ListenOverflows delta {kernel1}")
    expect(kernel1 >= 5, f"only {kernel1} ListenOverflows for 5 SYNs at a full queue")
    before = show("MainPID", "NRestarts")
    old_pid = int(before["MainPID"])
    pins = pin_files()
    ev.append(f"pins under {PIN_DIR}: {len(pins)} entries, e.g. {sorted(pins)[:3]}")
    t_kill = now_usec()
    os.kill(old_pid, signal.SIGKILL)
    # Drops while no daemon runs: only the pinned programs can count them.
    wait_for("the daemon's death", lambda: not os.path.exists(f"/proc/{old_pid}"), 10, 0.01)
    actor.cmd("drop 7")
    dead = show("ActiveState", "SubState", "MainPID")
    ev.append(f"7 more SYNs dropped right after SIGKILL; systemd then: {dead}")
    expect(dead["ActiveState"] != "active" or int(dead["MainPID"]) == 0,
           f"a daemon was already running when the drops happened: {dead}")
    after = wait_for(
        "systemd to restart the daemon",
        lambda: (lambda p: p if p["ActiveState"] == "active" and int(p["MainPID"]) not in
                 (0, old_pid) else None)(show("ActiveState", "MainPID", "NRestarts",
                                              "ExecMainStartTimestampMonotonic")),
        timeout=120)
    ev.append(f"before: {before}; after: {after}")
    expect(int(after["NRestarts"]) == int(before["NRestarts"]) + 1,
           f"NRestarts {before['NRestarts']} -> {after['NRestarts']}, want +1")
    kernel2 = list_overflows() - base
    expect(kernel2 >= kernel1 + 7, f"the kernel counted {kernel2 - kernel1} of 7 drops")
    entries = journal(t_kill)
    for needle in ("Main process exited", "Scheduled restart job", "probes attached"):
        e = first(entries, needle)
        expect(e is not None, f"no journal line {needle!r} after the SIGKILL")
        ev.append(f"journal: {e[2][:220]}")
    if not pins:
        # A kernel that cannot pin (check 7 holds the daemon's warning): counts restart
        # from zero, and from then on they must equal the kernel's again.
        expect(state.get("unpinned_warning"), "nothing pinned, and the daemon never said so")
        ev.append(f"UNPINNED on this kernel ({kernel2 - kernel1} drops while no daemon ran "
                  "are not counted, as the daemon warned): counting from the restart")
        at_restart = list_overflows()
        actor.cmd("drop 4")
        since = list_overflows() - at_restart
        got = wait_for(f"backlogd's accept-queue drops to equal the kernel's {since}",
                       lambda: (lambda d: d if d == since else None)(drops()), timeout=20)
        ev.append(f"after the restart: backlogd accept_queue_full {got:.0f}, namespace "
                  f"ListenOverflows delta since the restart {since}")
        return ev
    got = wait_for(f"backlogd's accept-queue drops to equal the kernel's {kernel2}",
                   lambda: (lambda d: d if d == kernel2 else None)(drops()), timeout=20)
    ev.append(f"after the restart: backlogd accept_queue_full {got:.0f}, namespace "
              f"ListenOverflows delta {kernel2} ({kernel2 - kernel1} while no daemon ran)")
    expect("adopted=true" in first(entries, "probes attached")[2],
           "the restarted daemon did not adopt the pinned programs")
    return ev


# ---- 3 ------------------------------------------------------------------------------------
def watchdog_kills_a_stopped_daemon():
    ev = EVIDENCE
    dropin = "/etc/systemd/system/backlogd.service.d"
    os.makedirs(dropin, exist_ok=True)
    with open(f"{dropin}/sg-watchdog.conf", "w") as f:
        f.write(f"[Service]\nWatchdogSec={WATCHDOG_SEC}s\n")
    sh("systemctl", "daemon-reload")
    sh("systemctl", "restart", UNIT)
    before = show("MainPID", "NRestarts", "WatchdogUSec", "ActiveState")
    ev.append(f"with a drop-in WatchdogSec={WATCHDOG_SEC}s, restarted: {before}")
    expect(before["ActiveState"] == "active", f"not active after the restart: {before}")
    pid = int(before["MainPID"])
    t0 = now_usec()
    os.kill(pid, signal.SIGSTOP)
    after = wait_for(
        "the watchdog to kill the stopped daemon and systemd to restart it",
        lambda: (lambda p: p if p["ActiveState"] == "active" and int(p["MainPID"]) not in
                 (0, pid) else None)(show("ActiveState", "MainPID", "NRestarts")),
        timeout=WATCHDOG_SEC + 120)
    took = (now_usec() - t0) / 1e6
    ev.append(f"after SIGSTOP of {pid}: {after}, {took:.1f} s later")
    expect(int(after["NRestarts"]) == int(before["NRestarts"]) + 1,
           f"NRestarts {before['NRestarts']} -> {after['NRestarts']}, want +1")
    entries = journal(t0)
    for needle in ("Watchdog timeout", "Main process exited", "Scheduled restart job"):
        e = first(entries, needle)
        expect(e is not None, f"no journal line {needle!r} after the SIGSTOP")
        ev.append(f"journal +{(e[0] - t0) / 1e6:.1f} s: {e[2][:200]}")
    # systemd counts WatchdogSec from the last WATCHDOG=1, which the daemon sends every
    # WatchdogSec/2: up to half of it passed before the SIGSTOP (seen: +7.0 s of 8 s).
    fired = (first(entries, "Watchdog timeout")[0] - t0) / 1e6
    expect(fired >= WATCHDOG_SEC / 2 - 0.5,
           f"the watchdog fired {fired:.1f} s after the SIGSTOP, before WatchdogSec since "
           f"the daemon's last ping (every {WATCHDOG_SEC / 2:g} s) could have passed")
    pinger = first(journal(0), "systemd watchdog on", pid)
    if pinger:
        ev.append(f"the stopped daemon had logged: {pinger[2][:160]}")
    os.remove(f"{dropin}/sg-watchdog.conf")
    sh("systemctl", "daemon-reload")
    return ev


# ---- 6 ------------------------------------------------------------------------------------
def remove_and_purge_leave_nothing_attached():
    ev = EVIDENCE
    baseline = state.get("baseline_progs", {})
    running = {i: n for i, n in bpf_progs().items() if i not in baseline}
    ev.append(f"programs loaded since before the install: {len(running)}: "
              f"{sorted(set(running.values()))}")
    expect(running, "no backlogd programs loaded before the removal")
    expect(pin_files() or state.get("unpinned_warning"),
           f"nothing pinned under {PIN_DIR} before the removal, and no warning said why")
    p = sh("apt-get", "remove", "-y", "backlogd")
    ev.append(f"apt-get remove: rc 0, {len(p.stdout.splitlines())} lines")
    left = {i: n for i, n in bpf_progs().items() if i in running}
    ev.append(f"after apt-get remove: programs left {left}; {PIN_DIR}: "
              f"{pin_files() if os.path.exists(PIN_DIR) else 'absent'}")
    expect(not left, f"programs still loaded after apt-get remove: {left}")
    expect(not pin_files(), f"pins left after apt-get remove: {pin_files()}")
    links = json.loads(sh("bpftool", "-j", "link", "list").stdout or "[]")
    stale = [l for l in links if l.get("prog_id") in running]
    expect(not stale, f"links left: {stale}")
    p = show("ActiveState", "LoadState")
    ev.append(f"systemctl show after remove: {p}")
    expect(p["ActiveState"] == "inactive", f"the unit is still {p['ActiveState']}")
    sh("dpkg", "--purge", "backlogd")
    gone = not os.path.exists("/etc/backlogd")
    ev.append(f"after dpkg --purge: /etc/backlogd {'absent' if gone else 'still there'}; "
              f"dpkg -s rc {sh('dpkg', '-s', 'backlogd', ok=False).returncode}")
    expect(gone, "/etc/backlogd survived the purge")
    return ev


# ---- 7 ------------------------------------------------------------------------------------
def starts_and_says_what_it_left_out():
    """The shipped config asks for pins (pin_dir). On a kernel that cannot give what the
    config asks for (pins of perf-event links before 5.15 in kprobe mode, which `auto` picks
    only on a kernel without BPF trampolines), the service must still be active and must
    have said what it left out. Where `auto` picks fentry (every kernel with trampolines,
    Debian 11's 5.10 included), its links pin, so nothing may be left out."""
    ev = EVIDENCE
    p = show("ActiveState", "MainPID")
    expect(p["ActiveState"] == "active", f"the service is not running: {p}")
    pid = int(p["MainPID"])
    entries = journal(0)
    ours = [e for e in entries if e[1] == pid]
    # The daemon writes plain lines with an sd-daemon "<N>" priority prefix to the journal
    # stream: no colour codes (journald would store those lines as bytes), and warnings at
    # priority 4, so `journalctl -p warning` shows them.
    coloured = [e[2][:120] for e in ours if isinstance(e[3], list) or "\x1b[" in e[3]]
    expect(not coloured, f"journal lines with control characters: {coloured}")
    expect(any(e[4] == 6 for e in ours), "no daemon line at priority 6 (info): "
           f"{[(e[4], e[2][:80]) for e in ours]}")
    warned = [e for e in ours if e[4] <= 4]
    warnings = [e[2] for e in warned]
    for e in warned:
        ev.append(f"the daemon warned (journal PRIORITY={e[4]}): {e[2][:300]}")
    _, body = http_get("/metrics")
    mode = [l for l in body.splitlines() if l.startswith("backlogd_hook_mode{")]
    # The scan pass (the SYN queues' lengths now) loads under the shipped unit's
    # hardening and runs when /metrics is read.
    scanned = [l for l in body.splitlines()
               if l.startswith("backlogd_syn_queue_read_age_seconds ")]
    expect(scanned, "no backlogd_syn_queue_read_age_seconds on /metrics: the scan pass did "
           f"not run under the shipped unit; the daemon's warnings: {warnings}")
    ev.append(f"scan pass under the shipped unit: {scanned[0]}")
    pins = pin_files()
    ev.append(f"kernel {os.uname().release}: hook mode {mode}; pins under {PIN_DIR}: "
              f"{len(pins)}")
    in_use = [l.split('mode="', 1)[1].split('"', 1)[0] for l in mode
              if l.split()[-1] == "1"]
    supported = [l for l in body.splitlines()
                 if l.startswith('backlogd_kernel_hook_supported{mode="fentry"}')]
    ev.append(f"served: {supported}")
    if in_use == ["fentry"]:
        # Tracing and raw tracepoint links pin on every kernel fentry mode runs on.
        expect(pins, f"fentry mode, yet nothing is pinned under {PIN_DIR}")
        # The daemon cannot probe trampolines (that loads a program): the load step's
        # finding, recorded beside the pins, must reach it.
        expect(supported and supported[0].split()[-1] == "1",
               f"fentry mode, yet the daemon serves {supported}")
        expect(not [w for w in warnings if "pin" in w],
               f"fentry mode, yet the daemon warned about pinning: {warnings}")
    if not pins:
        said = [w for w in warnings if "pin" in w]
        expect(said, "pin_dir is set in the shipped config but nothing is pinned, and the "
               "daemon logged no warning saying so")
        state["unpinned_warning"] = said[0]
    elif not warnings:
        ev.append("nothing left out on this kernel")
    return ev


# ---- 8 ------------------------------------------------------------------------------------
def package_depends(pkg):
    out = sh("dpkg-query", "-W", "-f=${Depends}, ${Pre-Depends}", pkg).stdout
    names = set()
    for dep in out.split(","):
        for alt in dep.split("|"):
            name = alt.strip().split(" ")[0].split(":")[0]
            if name:
                names.add(name)
    return names


def owner(path):
    """The package that ships `path` (merged /usr: dpkg may know it by the other name)."""
    candidates = [path, os.path.realpath(path)]
    if path.startswith("/usr/"):
        candidates.append(path[len("/usr"):])
    else:
        candidates.append("/usr" + path)
    for c in candidates:
        p = sh("dpkg-query", "-S", c, ok=False)
        if p.returncode == 0:
            return p.stdout.split(":")[0].split(",")[0].strip()
    return None


def unit_commands_come_from_declared_dependencies():
    """A minimal Debian (debootstrap's minbase, a container image) has only Essential
    packages: every program the unit runs must come from one of them, from the package
    itself, or from a package it depends on, or that part of the unit fails there."""
    ev = EVIDENCE
    depends = package_depends("backlogd")
    ev.append(f"backlogd Depends/Pre-Depends: {sorted(depends)}")
    props = ("ExecStartPre", "ExecStart", "ExecStartPost", "ExecReload", "ExecStop",
             "ExecStopPost")
    undeclared = []
    for prop, value in show(*props).items():
        for path in re.findall(r"path=(\S+)", value):
            pkg = owner(path)
            essential = pkg is not None and sh(
                "dpkg-query", "-W", "-f=${Essential}", pkg).stdout.strip() == "yes"
            ok = pkg == "backlogd" or essential or pkg in depends
            ev.append(f"{prop} runs {path}: package {pkg}"
                      f"{' (Essential)' if essential else ''}: {'ok' if ok else 'UNDECLARED'}")
            if not ok:
                undeclared.append(f"{prop} runs {path} from {pkg}, which backlogd neither "
                                  "is nor depends on (not Essential either)")
    expect(not undeclared, "; ".join(undeclared))
    return ev


# ---- 9 (issue 21) -------------------------------------------------------------------------
def listeners_are_named_by_their_unit_and_netns():
    """A server started as a transient service by the real PID 1 is named by its unit on
    the info series, and check 4's `ip netns` namespace by its name."""
    ev = EVIDENCE
    unit = "sg-named-web.service"
    server = ("import socket, time\n"
              "s = socket.socket()\ns.bind(('127.0.0.1', 0))\ns.listen(8)\ntime.sleep(1e9)\n")
    sh("systemd-run", "--quiet", f"--unit={unit}", "--service-type=exec",
       "python3", "-c", server)
    try:
        def inode():
            out = sh("systemctl", "show", unit, "-p", "MainPID").stdout
            pid = int(out.strip().split("=", 1)[1] or 0)
            if pid == 0:
                return None
            # Its stdout and stderr are sockets too (the journal's): the listening one is
            # in /proc/net/tcp in state 0A.
            with open("/proc/net/tcp") as f:
                listening = {int(l.split()[9]) for l in f.readlines()[1:] if l.split()[3] == "0A"}
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:[") and int(link[8:-1]) in listening:
                    return (pid, int(link[8:-1]))
            return None
        pid, ino = wait_for(f"{unit}'s listener", inode, timeout=20)
        cgroup = open(f"/proc/{pid}/cgroup").read().strip()
        ev.append(f"{unit}: pid {pid}, socket {ino}, /proc/PID/cgroup {cgroup!r}")

        def named():
            _, text = http_get("/metrics")
            return metric_sum(text, "backlogd_listener_owner_info", socket=ino, unit=unit)
        try:
            wait_for(f"backlogd_listener_owner_info{{socket={ino},unit={unit}}}", named,
                     timeout=40)
        except CheckFailed:
            _, text = http_get("/metrics")
            for l in text.splitlines():
                if f'"{ino}"' in l or l.startswith("backlogd_listener_owner_info"):
                    ev.append(f"/metrics: {l}")
            _, api = http_get("/api/v1/listeners")
            ev.append(f"API: {[l for l in json.loads(api) if l.get('inode') == ino]}")
            raise
        _, text = http_get("/metrics")
        line = next(l for l in text.splitlines()
                    if l.startswith("backlogd_listener_owner_info{") and f'"{ino}"' in l)
        ev.append(f"/metrics: {line}")
        _, api = http_get("/api/v1/listeners")
        ours = [l for l in json.loads(api) if l.get("inode") == ino]
        expect(len(ours) == 1 and ours[0].get("names", {}).get("unit") == unit
               and ours[0]["names"].get("slice") == "system.slice",
               f"the JSON API's names of socket {ino}: {ours}")
        ev.append(f"API names: {ours[0]['names']}")
    finally:
        sh("systemctl", "stop", unit, ok=False)
    if state.get("actor") is None:
        raise CheckFailed("check 4's namespace is gone: its name could not be checked")
    netns = os.stat(f"/run/netns/{NETNS}").st_ino
    _, text = http_get("/metrics")
    got = metric_sum(text, "backlogd_netns_info", netns=netns, name=NETNS)
    expect(got == 1, f"backlogd_netns_info{{netns={netns},name={NETNS}}} is {got}")
    ev.append(f"backlogd_netns_info{{netns=\"{netns}\",name=\"{NETNS}\"}} 1")
    return ev


# ---- 10 (issue 31) ------------------------------------------------------------------------
# Socket units started by PID 1 before the daemon ever ran, in namespaces of their own:
# (namespace, its net.core.somaxconn) and (unit, namespace, port, Backlog= or None).
SOCKET_NETNS = {"sgsock": 64, "sgsockhi": 4096}
SOCKET_UNITS = [
    ("sg-plain", "sgsock", 18090, None),
    ("sg-backlog", "sgsock", 18091, 256),
    ("sg-plain-hi", "sgsockhi", 18092, None),
    ("sg-backlog-hi", "sgsockhi", 18093, 256),
]
# The one whose service is started (Accept=no: the service holds the listening socket
# too). Every socket unit has a service (systemd refuses to start one without), started on
# a first connection, which never comes to the others.
SOCKET_SERVICE = "sg-backlog"


def prepare_socket_units():
    """Runs before the package is installed, so no daemon ever sees these listen() calls:
    backlogd must know what systemd asked for from the units themselves."""
    for ns, somaxconn in SOCKET_NETNS.items():
        sh("ip", "netns", "add", ns)
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "netns", "exec", ns, "sh", "-c",
           f"echo {somaxconn} > /proc/sys/net/core/somaxconn")
    for unit, ns, port, backlog in SOCKET_UNITS:
        with open(f"/etc/systemd/system/{unit}.socket", "w") as f:
            f.write(f"[Unit]\nDescription=backlogd guest check 10: {unit}\n"
                    f"[Socket]\nListenStream=127.0.0.1:{port}\n"
                    f"NetworkNamespacePath=/run/netns/{ns}\n"
                    + (f"Backlog={backlog}\n" if backlog is not None else ""))
        # The service holds the socket (fd 3) and never accepts.
        with open(f"/etc/systemd/system/{unit}.service", "w") as f:
            f.write("[Service]\nExecStart=/usr/bin/python3 -c \"import socket, time; "
                    "s = socket.socket(fileno=3); time.sleep(1e9)\"\n")
    sh("systemctl", "daemon-reload")
    started = [f"{unit}.socket" for unit, _, _, _ in SOCKET_UNITS] + \
        [f"{SOCKET_SERVICE}.service"]
    for unit in started:
        p = sh("systemctl", "start", unit, ok=False)
        if p.returncode != 0:
            why = sh("journalctl", "-b", "-u", unit, "--no-pager", "-n", "15", ok=False).stdout
            raise CheckFailed(f"systemctl start {unit} failed ({p.returncode}): "
                              f"{p.stderr.strip()}; its journal: {why.strip()}")


def ns_granted(ns, port):
    """The backlog the kernel granted the listener on `port` in `ns` (ss Send-Q)."""
    out = sh("ip", "netns", "exec", ns, "ss", "-Hltn", f"sport = :{port}").stdout.split()
    return int(out[2]) if len(out) > 2 else None


def socket_units_backlog_is_read_and_clamps_named():
    """The program table's systemd row in a real run: a unit without Backlog= asks for the
    most the kernel allows (granted somaxconn, whatever it is; no finding); one with
    Backlog=256 asks for 256 (granted 256 where somaxconn is 4096), which backlogd reads
    from the unit and doctor names as a clamp where somaxconn is 64, with systemd's own
    setting in the remedy."""
    ev = EVIDENCE
    if state.get("socket_units_error"):
        raise CheckFailed(f"the socket units did not start: {state['socket_units_error']}")
    inode = {ns: os.stat(f"/run/netns/{ns}").st_ino for ns in SOCKET_NETNS}
    for unit, ns, port, backlog in SOCKET_UNITS:
        got = ns_granted(ns, port)
        asks = backlog if backlog is not None else "the most the kernel allows"
        want = min(backlog or SOCKET_NETNS[ns], SOCKET_NETNS[ns])
        ev.append(f"{unit}.socket (Backlog={backlog}) in {ns} (somaxconn "
                  f"{SOCKET_NETNS[ns]}): asks {asks}, the kernel granted {got}")
        expect(got == want, f"{unit}: granted {got}, want {want}")

    def listener(ns, port):
        _, text = http_get("/api/v1/snapshot")
        for l in json.loads(text)["listeners"]:
            if l.get("netns") == inode[ns] and l.get("port") == port:
                return l
        return None

    def known(ns, port):
        l = listener(ns, port)
        return l if l and l.get("request", {}).get("known") in ("program", "somaxconn") \
            else None
    for unit, ns, port, backlog in SOCKET_UNITS:
        l = wait_for(f"backlogd knowing what {unit}.socket asks for", lambda: known(ns, port),
                     timeout=60)
        ev.append(f"API {unit}: comm {l.get('comm')} pid {l.get('pid')} granted "
                  f"{l.get('granted')} request {l.get('request')}")
        req = l["request"]
        expect(l.get("pid") == 1 and req.get("program") == "systemd",
               f"{unit}: not attributed to PID 1 as systemd: {l}")
        if backlog is None:
            expect(req["known"] == "somaxconn", f"{unit}: {req}")
        else:
            expect(req["known"] == "program" and req.get("backlog") == backlog
                   and f"/etc/systemd/system/{unit}.socket:" in req.get("source", "")
                   and req["source"].endswith(f"Backlog={backlog}"),
                   f"{unit}: {req}")
    _, text = http_get("/api/v1/findings")
    findings = json.loads(text)
    for unit, ns, port, backlog in SOCKET_UNITS:
        about = [f for f in findings
                 if f":{port} (netns {inode[ns]})" in f["subject"]
                 and f["kind"] in ("backlog_clamped", "backlog_maybe_clamped")]
        clamped = backlog is not None and backlog > SOCKET_NETNS[ns]
        ev.append(f"findings on {unit}: {[(f['kind'], f['summary']) for f in about]}")
        if not clamped:
            expect(not about, f"{unit} is not clamped, yet: {about}")
            continue
        expect(len(about) == 1 and about[0]["kind"] == "backlog_clamped",
               f"{unit}: want one backlog_clamped, got {about}")
        f = about[0]
        expect(f["summary"].endswith(f"asks for backlog {backlog} on 127.0.0.1:{port}, the "
                                     f"kernel granted {SOCKET_NETNS[ns]}"),
               f"summary: {f['summary']}")
        evidence = "; ".join(f["evidence"])
        expect(f"systemd asks for {backlog}: /etc/systemd/system/{unit}.socket:" in evidence
               and f"net.core.somaxconn = {SOCKET_NETNS[ns]}" in evidence,
               f"evidence: {evidence}")
        expect(f"net.core.somaxconn={backlog}" in f["remedy"]
               and "`Backlog=` in the .socket unit" in f["remedy"],
               f"remedy: {f['remedy']}")
        ev.append(f"doctor on {unit}: {f['summary']}; remedy: {f['remedy']}")
    return ev


CHECKS = [
    # (number in issue 20's list, 9: issue 21's, 10: issue 31's; name, function), in the
    # order they run.
    (8, "unit-commands-come-from-declared-dependencies",
     unit_commands_come_from_declared_dependencies),
    (1, "start-becomes-active-only-after-READY", start_becomes_active_only_after_ready),
    (7, "starts-and-says-what-it-left-out", starts_and_says_what_it_left_out),
    (2, "reload-applies-a-changed-setting", reload_applies_a_changed_setting),
    (5, "hardening-in-force-in-the-running-process", hardening_in_force),
    (4, "SIGKILL-restart-counts-continue-from-pins-equal-kernel",
     sigkill_restarts_and_counters_continue_from_the_pins),
    (9, "listeners-named-by-their-systemd-unit-and-netns",
     listeners_are_named_by_their_unit_and_netns),
    (10, "socket-units-Backlog-read-and-clamp-named",
     socket_units_backlog_is_read_and_clamps_named),
    (3, "watchdog-kills-a-SIGSTOPped-daemon-and-it-restarts", watchdog_kills_a_stopped_daemon),
    (6, "remove-and-purge-leave-no-program-attached", remove_and_purge_leave_nothing_attached),
]


def main():
    t_start = time.monotonic()
    say(f"kernel {os.uname().release} systemd "
        f"{sh('systemctl', '--version').stdout.split()[1]} up {time.clock_gettime(time.CLOCK_BOOTTIME):.1f} s")
    state["baseline_progs"] = bpf_progs()
    try:
        prepare_socket_units()
    except Exception as e:
        state["socket_units_error"] = str(e)
    t = time.monotonic()
    p = sh("apt-get", "install", "-y", "--no-install-recommends", DEB, ok=False)
    say(f"install: apt-get install {os.path.basename(DEB)}: rc {p.returncode} "
        f"({time.monotonic() - t:.1f} s)")
    if p.returncode != 0:
        print(p.stdout + p.stderr, flush=True)
    passed = failed = 0
    for n, name, fn in CHECKS:
        EVIDENCE.clear()
        say(f"begin {n} {name}")
        t = time.monotonic()
        try:
            if p.returncode != 0:
                raise CheckFailed("the package did not install")
            if n in (2, 3, 4, 5, 7, 9, 10) and state.get("pid") is None:
                raise CheckFailed("not run: the service never became active (check 1)")
            fn()
            for line in EVIDENCE:
                say(f"evidence {n}: {line}")
            say(f"check {n} {name} PASS ({time.monotonic() - t:.1f} s)")
            passed += 1
        except Exception as e:
            traceback.print_exc(file=sys.stdout)
            for line in EVIDENCE:
                say(f"evidence {n}: {line}")
            say(f"check {n} {name} FAIL ({time.monotonic() - t:.1f} s): {e}")
            failed += 1
            # What systemd and the daemon said, for the host's log.
            out = sh("journalctl", "-b", "-u", UNIT, "-a", "--no-pager", "-n", "60", ok=False)
            print(out.stdout, flush=True)
    actor = state.get("actor")
    if actor:
        actor.p.kill()
    say(f"done passed={passed} failed={failed} ({time.monotonic() - t_start:.1f} s)")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
