//! Hook modes: which kernel mechanism the SYN path and the accept queue run on.
//!
//! Order of preference: fentry/fexit (BPF trampolines: cheapest, never skipped for
//! recursion), then kprobes, then tracepoint mode (cgroup_skb + tracepoints, needs
//! neither). `auto` picks the first the running kernel allows, found by trying.

use std::path::Path;

use aya::programs::ProgramType;

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

/// What the running kernel allows, as found by trying.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct KernelSupport {
    /// A BPF_PROG_TYPE_TRACING program loads (BPF trampolines work).
    pub fentry: bool,
    /// The kprobe PMU exists (CONFIG_KPROBES), so kprobes can be attached.
    pub kprobe: bool,
}

impl KernelSupport {
    pub fn probe() -> Self {
        Self {
            fentry: matches!(
                aya::sys::is_program_supported(ProgramType::Tracing),
                Ok(true)
            ),
            kprobe: Path::new("/sys/bus/event_source/devices/kprobe").exists(),
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
            why: "loading a BPF tracing program fails: no BPF trampoline support",
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
    };
    const ALL: KernelSupport = KernelSupport {
        fentry: true,
        kprobe: true,
    };

    const KPROBE_ONLY: KernelSupport = KernelSupport {
        fentry: false,
        kprobe: true,
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
            fentry: true,
            kprobe: false,
        };
        assert_eq!(
            attempts(HookModeArg::Auto, Fentry, fentry_only),
            [Fentry, Tracepoint]
        );
        assert_eq!(attempts(HookModeArg::Auto, Tracepoint, NONE), [Tracepoint]);
        assert_eq!(attempts(HookModeArg::Fentry, Fentry, ALL), [Fentry]);
    }
}
