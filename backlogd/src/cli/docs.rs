//! Manual pages and shell completions, generated from the clap command line itself so they
//! cannot drift from `--help` (`backlogd generate-docs --out DIR`, run by `cargo xtask deb`).

use std::path::Path;

use anyhow::Context as _;
use clap::CommandFactory as _;

/// Writes `man/backlogd.1` and one `man/backlogd-SUBCOMMAND.1` per visible subcommand,
/// and `completions/{backlogd.bash,_backlogd,backlogd.fish}`.
pub fn generate(out: &Path) -> anyhow::Result<()> {
    let man = out.join("man");
    let completions = out.join("completions");
    for dir in [&man, &completions] {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let cmd = super::Cli::command();
    write_page(&man.join("backlogd.1"), cmd.clone())?;
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let name = format!("backlogd-{}", sub.get_name());
        let page = sub.clone().name(name.clone());
        write_page(&man.join(format!("{name}.1")), page)?;
    }
    for (shell, file) in [
        (clap_complete::Shell::Bash, "backlogd.bash"),
        (clap_complete::Shell::Zsh, "_backlogd"),
        (clap_complete::Shell::Fish, "backlogd.fish"),
    ] {
        let path = completions.join(file);
        let mut f =
            std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        clap_complete::generate(shell, &mut super::Cli::command(), "backlogd", &mut f);
    }
    Ok(())
}

fn write_page(path: &Path, cmd: clap::Command) -> anyhow::Result<()> {
    let mut buffer = Vec::new();
    clap_mangen::Man::new(cmd)
        .render(&mut buffer)
        .with_context(|| format!("rendering {}", path.display()))?;
    std::fs::write(path, buffer).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_visible_subcommand_gets_a_page_and_every_shell_a_completion() {
        let dir = std::env::temp_dir().join(format!("backlogd-docs-{}", std::process::id()));
        super::generate(&dir).unwrap();
        for page in [
            "backlogd",
            "backlogd-run",
            "backlogd-doctor",
            "backlogd-top",
        ] {
            let text = std::fs::read_to_string(dir.join(format!("man/{page}.1"))).unwrap();
            assert!(text.contains(".TH"), "{page}: {text}");
        }
        assert!(!dir.join("man/backlogd-generate-docs.1").exists());
        let bash = std::fs::read_to_string(dir.join("completions/backlogd.bash")).unwrap();
        assert!(bash.contains("--hook-mode"), "{bash}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
