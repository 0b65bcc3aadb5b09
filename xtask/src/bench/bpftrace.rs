//! A bpftrace script on the same tracepoints, for comparison.

use super::*;

/// The counting a user could do with bpftrace on the tracepoints backlogd's tracepoint
/// mode uses. `{overflow}` is the kernel's SKB_DROP_REASON_TCP_LISTEN_OVERFLOW.
pub(super) const BPFTRACE_SCRIPT: &str = r#"// What bpftrace can count per listener on backlogd's tracepoints.
tracepoint:syscalls:sys_enter_listen { @requested_backlog[pid, comm] = max(args->backlog); }
tracepoint:sock:inet_sock_set_state
/args->protocol == 6 && (args->newstate == 10 || args->oldstate == 10)/
{ @listen_state_changes[args->sport] = count(); }
tracepoint:sock:sk_data_ready
/args->protocol == 6 && ((struct sock *)args->skaddr)->__sk_common.skc_state == 10/
{ @queued[((struct sock *)args->skaddr)->__sk_common.skc_num] = count(); }
tracepoint:skb:kfree_skb /args->reason == {overflow}/ { @final_ack_overflows[args->rx_sk] = count(); }
tracepoint:tcp:tcp_retransmit_synack { @synack_retransmits[args->sport] = count(); }
tracepoint:syscalls:sys_exit_accept4, tracepoint:syscalls:sys_exit_accept
/args->ret >= 0/ { @accepted[pid, comm] = count(); }
"#;

/// SKB_DROP_REASON_TCP_LISTEN_OVERFLOW's value on this kernel, from the tracepoint format.
pub(super) fn listen_overflow_reason() -> Result<u32> {
    let path = "/sys/kernel/tracing/events/skb/kfree_skb/format";
    let format = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
    format
        .split("{ ")
        .find_map(|e| e.strip_suffix(", \"TCP_LISTEN_OVERFLOW\" }")?.parse().ok())
        .or_else(|| {
            format
                .split('{')
                .filter_map(|e| e.trim().strip_suffix("\"TCP_LISTEN_OVERFLOW\" },"))
                .find_map(|e| e.trim().trim_end_matches(',').trim().parse().ok())
        })
        .with_context(|| format!("no TCP_LISTEN_OVERFLOW in {path}"))
}

pub(super) fn bpftrace(p: &Params, ns: &Netns, r: &mut Report) -> Result<()> {
    if output(Command::new("sh").args(["-c", "command -v bpftrace"])).is_err() {
        r.line("bpftrace is not installed (`cargo xtask setup` installs it).\n");
        return Ok(());
    }
    let version = output(Command::new("bpftrace").arg("--version"))?;
    let dir = crate::workspace_root().join("target/bench");
    std::fs::create_dir_all(&dir)?;
    let script = dir.join("listeners.bt");
    let text = BPFTRACE_SCRIPT.replace("{overflow}", &listen_overflow_reason()?.to_string());
    std::fs::write(&script, &text)?;
    let stats = BpfStats::enable()?;
    let bt = match Bpftrace::start(&script)? {
        Ok(bt) => bt,
        Err(why) => {
            r.line(format!("{} could not attach: {why}\n", version.trim()));
            return Ok(());
        }
    };
    let startup_cpu = bt.proc.cpu_seconds()?;
    let startup_mem = bt.proc.memory()?;
    let full = FullListener::new(ns)?;
    let costs = measure_programs(p, ns, &bt.proc, &full)?;
    for c in &costs {
        let ns = Some(median(&c.per_event_ns));
        match c.workload {
            Workload::DroppedSyns => r.targets.bpftrace_per_syn_ns = ns,
            Workload::Handshakes => r.targets.bpftrace_per_handshake_ns = ns,
            // The same for bpftrace's script (it has no gate): shown in its table only.
            Workload::HandshakesAfterDrops => {}
        }
    }
    let names = procs::prog_names()?;
    drop(stats);
    let rows = load_rows(p, ns, &bt.proc, None, &full)?;
    r.line(format!(
        "{} with this script (`target/bench/listeners.bt`), measured the same way as \
         backlogd above:\n\n```\n{}```\n",
        version.trim(),
        text
    ));
    r.line(format!(
        "Startup (parse, LLVM, load, attach): {:.2} s wall, {:.2} s CPU, {:.1} MiB peak \
         RSS.\n",
        bt.startup.as_secs_f64(),
        startup_cpu,
        startup_mem.peak_mib
    ));
    render_costs(r, &costs, &names);
    r.line("bpftrace's own process under the same loads as the daemon (its maps are printed only at exit, so nothing reads them meanwhile):\n");
    render_load_rows(r, &rows);
    r.line(
        "What it cannot count: SYNs received and SYN-time drops per listener (accept \
         queue full, SYN queue full) and syncookies. The kernel has no tracepoint in \
         `tcp_conn_request`; a SYN it drops is freed through `consume_skb` with no reason, \
         so only the per-CPU MIB delta across the segment's processing (backlogd's \
         cgroup_skb ingress + tp_btf release programs) attributes it to a socket, and \
         bpftrace can attach neither cgroup_skb programs nor read per-CPU MIBs. Without \
         fentry/kprobes (this kernel has neither) there is no other hook. It also keeps no \
         queue peaks or accept-wait histogram, and does not know listeners opened before \
         it started.\n",
    );
    complaints(r, &bt.proc);
    drop(bt);

    let pairs = capacity_pairs(p, ns, || {
        Bpftrace::start(&script)?.map_err(|e| anyhow!("bpftrace did not start: {e}"))
    })?;
    r.line("Connection-rate capacity with this script attached, measured as for backlogd:\n");
    r.targets.bpftrace_capacity = Some(report_pairs(
        r,
        "without (handshakes/s)",
        "with bpftrace",
        pairs,
    ));
    Ok(())
}
