//! Hook modes: which kernel mechanism the SYN path and the accept queue run on.
//!
//! Order of preference: fentry/fexit (BPF trampolines: cheapest, never skipped for
//! recursion), then kprobes, then tracepoint mode (cgroup_skb + tracepoints, needs
//! neither). `auto` picks the first the running kernel allows, found by trying.

use std::path::Path;

use aya::programs::ProgramType;

use super::btf::KernelBtf;

/// `--hook-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum HookModeArg {
    /// The best mode this kernel and this backlogd support.
    Auto,
    Fentry,
    Kprobe,
    Tracepoint,
}

/// The mode in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookMode {
    Fentry,
    Kprobe,
    Tracepoint,
}

impl HookModeArg {
    /// Whether a daemon started with this argument may run in `mode`.
    pub fn allows(self, mode: HookMode) -> bool {
        matches!(
            (self, mode),
            (HookModeArg::Auto, _)
                | (HookModeArg::Fentry, HookMode::Fentry)
                | (HookModeArg::Kprobe, HookMode::Kprobe)
                | (HookModeArg::Tracepoint, HookMode::Tracepoint)
        )
    }
}

impl HookMode {
    pub fn name(self) -> &'static str {
        match self {
            HookMode::Fentry => "fentry",
            HookMode::Kprobe => "kprobe",
            HookMode::Tracepoint => "tracepoint",
        }
    }
}

/// What the running kernel allows, as found by trying (program types) and by reading its
/// BTF (link types it knows: features are not backported, and the enums in the kernel's
/// own BTF say exactly what this build has).
/// The JSON API serves these figures in a type of its own (`api::KernelSupport`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KernelSupport {
    /// fentry mode can run: BPF trampolines work (Linux 5.5; arm64 6.0). Its fexit
    /// programs read the traced function's return value from their context, at the slot
    /// this kernel's BTF gives (`backlogd-ebpf/src/fentry.rs`), so they need nothing newer.
    pub fentry: bool,
    /// The kprobe PMU exists (CONFIG_KPROBES), so kprobes can be attached.
    pub kprobe: bool,
    /// A BPF_PROG_TYPE_TRACING program loads (BPF trampolines work, Linux 5.5).
    pub trampolines: bool,
    /// Links of kprobes can be pinned (BPF_LINK_TYPE_PERF_EVENT, Linux 5.15): kprobe mode
    /// keeps counting across a restart.
    pub perf_link_pinning: bool,
}

/// `enum bpf_link_type` names every kind of link the kernel can create.
const PERF_EVENT_LINK: &str = "BPF_LINK_TYPE_PERF_EVENT";

/// What the kernel's BTF says of its BPF, read while the parse is at hand (see
/// [`KernelSupport::probe`]).
#[derive(Debug, Clone, Copy)]
pub struct BtfFacts {
    perf_link: bool,
    /// The BTF id of the function the trampoline probe attaches to, when the BTF read is
    /// the running kernel's own (ids of a `--btf` file need not be this kernel's).
    fentry_target: Option<u32>,
}

impl BtfFacts {
    pub fn of(btf: &KernelBtf, the_kernels_own: bool) -> Self {
        Self {
            perf_link: btf.has_enumerator(PERF_EVENT_LINK),
            fentry_target: the_kernels_own
                .then(|| btf.func_id(super::trampoline::TARGET))
                .flatten(),
        }
    }
}

impl KernelSupport {
    pub fn probe(facts: BtfFacts) -> Self {
        let trampolines = match facts.fentry_target {
            Some(target) => super::trampoline::attachable(target),
            // BTF from a `--btf` file, or a kernel without the probe's usual target: aya's
            // probe, which reads the kernel's own BTF (at the price of its parse).
            None => matches!(
                aya::sys::is_program_supported(ProgramType::Tracing),
                Ok(true)
            ),
        };
        Self::from_facts(
            trampolines,
            Path::new("/sys/bus/event_source/devices/kprobe").exists(),
            facts.perf_link,
        )
    }

    fn from_facts(trampolines: bool, kprobe: bool, perf_link: bool) -> Self {
        Self {
            fentry: trampolines,
            kprobe,
            trampolines,
            perf_link_pinning: perf_link,
        }
    }

    /// Whether `mode`'s kernel state can be pinned (survive a daemon restart) here.
    pub fn can_pin(self, mode: HookMode) -> bool {
        match mode {
            // Tracing, raw tracepoint and cgroup links are pinnable since 5.7/5.8, before
            // any kernel backlogd runs on (its ring buffer needs 5.8); tracepoint mode has
            // no other kind.
            HookMode::Fentry | HookMode::Tracepoint => true,
            HookMode::Kprobe => self.perf_link_pinning,
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ModeError {
    #[error(
        "--hook-mode {mode}: this kernel does not support it ({why}). Fix: use \
         `--hook-mode auto`, which picks the best mode this kernel allows \
         ({best} here)"
    )]
    KernelLacks {
        mode: &'static str,
        why: &'static str,
        best: &'static str,
    },
}

pub fn choose(requested: HookModeArg, kernel: KernelSupport) -> Result<HookMode, ModeError> {
    let best = if kernel.fentry {
        HookMode::Fentry
    } else if kernel.kprobe {
        HookMode::Kprobe
    } else {
        HookMode::Tracepoint
    };
    match requested {
        HookModeArg::Auto => Ok(best),
        HookModeArg::Tracepoint => Ok(HookMode::Tracepoint),
        HookModeArg::Fentry if !kernel.fentry => Err(ModeError::KernelLacks {
            mode: "fentry",
            why: "loading a BPF tracing program fails: no BPF trampoline support (Linux \
                  5.5+; arm64 6.0+)",
            best: best.name(),
        }),
        HookModeArg::Kprobe if !kernel.kprobe => Err(ModeError::KernelLacks {
            mode: "kprobe",
            why: "no kprobe PMU in /sys/bus/event_source/devices: CONFIG_KPROBES is off",
            best: best.name(),
        }),
        HookModeArg::Fentry => Ok(HookMode::Fentry),
        HookModeArg::Kprobe => Ok(HookMode::Kprobe),
    }
}

/// The modes to try in order: with `auto`, the chosen mode and then every lesser mode the
/// kernel allows (a kernel can pass the probe yet refuse one hook: Debian's 6.1 builds no
/// trampoline for some functions); with an explicit mode, that mode only.
pub fn attempts(requested: HookModeArg, chosen: HookMode, kernel: KernelSupport) -> Vec<HookMode> {
    if requested != HookModeArg::Auto {
        return vec![chosen];
    }
    [HookMode::Fentry, HookMode::Kprobe, HookMode::Tracepoint]
        .into_iter()
        .skip_while(|m| *m != chosen)
        .filter(|m| match m {
            HookMode::Fentry => kernel.fentry,
            HookMode::Kprobe => kernel.kprobe,
            HookMode::Tracepoint => true,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const NONE: KernelSupport = KernelSupport {
        fentry: false,
        kprobe: false,
        trampolines: false,
        perf_link_pinning: false,
    };
    const ALL: KernelSupport = KernelSupport {
        fentry: true,
        kprobe: true,
        trampolines: true,
        perf_link_pinning: true,
    };

    const KPROBE_ONLY: KernelSupport = KernelSupport {
        fentry: false,
        kprobe: true,
        trampolines: false,
        perf_link_pinning: true,
    };

    #[test]
    fn auto_prefers_fentry_then_kprobe_then_tracepoint() {
        assert_eq!(choose(HookModeArg::Auto, ALL), Ok(HookMode::Fentry));
        assert_eq!(choose(HookModeArg::Auto, KPROBE_ONLY), Ok(HookMode::Kprobe));
        assert_eq!(choose(HookModeArg::Auto, NONE), Ok(HookMode::Tracepoint));
    }

    #[test]
    fn an_explicit_mode_the_kernel_allows_is_used() {
        for k in [NONE, KPROBE_ONLY, ALL] {
            assert_eq!(choose(HookModeArg::Tracepoint, k), Ok(HookMode::Tracepoint));
        }
        assert_eq!(choose(HookModeArg::Kprobe, ALL), Ok(HookMode::Kprobe));
        assert_eq!(choose(HookModeArg::Fentry, ALL), Ok(HookMode::Fentry));
    }

    #[test]
    fn an_unsupported_request_names_the_kernel_and_the_fix() {
        let e = choose(HookModeArg::Kprobe, NONE).unwrap_err().to_string();
        assert!(
            e.contains("CONFIG_KPROBES")
                && e.contains("--hook-mode auto")
                && e.contains("(tracepoint here)"),
            "{e}"
        );
        let e = choose(HookModeArg::Fentry, KPROBE_ONLY)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("trampoline") && e.contains("(kprobe here)"),
            "{e}"
        );
    }

    #[test]
    fn auto_falls_back_through_what_the_kernel_allows() {
        use HookMode::*;
        assert_eq!(
            attempts(HookModeArg::Auto, Fentry, ALL),
            [Fentry, Kprobe, Tracepoint]
        );
        let fentry_only = KernelSupport {
            kprobe: false,
            ..ALL
        };
        assert_eq!(
            attempts(HookModeArg::Auto, Fentry, fentry_only),
            [Fentry, Tracepoint]
        );
        assert_eq!(attempts(HookModeArg::Auto, Tracepoint, NONE), [Tracepoint]);
        assert_eq!(attempts(HookModeArg::Fentry, Fentry, ALL), [Fentry]);
    }

    /// Debian 11's 5.10 (and every kernel from 5.5 to 5.16): trampolines, no
    /// bpf_get_func_ret, no perf-event link pinning. fentry mode runs there, pinned.
    #[test]
    fn a_kernel_with_trampolines_runs_fentry_pinned_without_perf_event_links() {
        let k = KernelSupport::from_facts(true, true, false);
        assert!(k.fentry && k.trampolines);
        assert_eq!(choose(HookModeArg::Auto, k), Ok(HookMode::Fentry));
        assert_eq!(
            attempts(HookModeArg::Auto, HookMode::Fentry, k),
            [HookMode::Fentry, HookMode::Kprobe, HookMode::Tracepoint]
        );
        assert!(k.can_pin(HookMode::Fentry) && k.can_pin(HookMode::Tracepoint));
        assert!(!k.can_pin(HookMode::Kprobe));
        // Without trampolines (arm64 before 6.0, kernels built without them): kprobe.
        let old = KernelSupport::from_facts(false, true, false);
        assert!(!old.fentry);
        assert_eq!(choose(HookModeArg::Auto, old), Ok(HookMode::Kprobe));
        let new = KernelSupport::from_facts(true, true, true);
        assert!(new.fentry && new.can_pin(HookMode::Kprobe));
    }
}
