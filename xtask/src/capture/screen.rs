//! `top`'s tmux pane, captured with its colours (`tmux capture-pane -e`: SGR escapes),
//! as an SVG image (anstyle-svg) and as plain text, both from the same capture.

/// The pane as a terminal shows it: 14 px monospace on a dark background, in the palette
/// of the Windows 10 console (a modern one: VGA's red is too dark to read on black).
pub fn svg(ansi: &str) -> String {
    anstyle_svg::Term::new()
        .palette(anstyle_svg::WIN10_CONSOLE)
        .render_svg(ansi)
}

/// The pane without its trailing blank lines and spaces: `ansi` with its escapes, cut to
/// the lines [`strip`] leaves text on (tmux starts each line's attributes afresh).
pub fn trim(ansi: &str) -> String {
    let lines: Vec<&str> = ansi.lines().collect();
    let end = lines
        .iter()
        .rposition(|l| !strip(l).trim().is_empty())
        .map_or(0, |i| i + 1);
    lines[..end]
        .iter()
        .map(|l| l.trim_end())
        .collect::<Vec<_>>()
        .join("\n")
}

/// `ansi` without its escape sequences: CSI (`ESC [` ... a final byte `@` to `~`, which
/// SGR's `m` is), OSC (`ESC ]` ... BEL or `ESC \`, tmux's hyperlinks) and two-byte ones;
/// trailing spaces of each line go too.
pub fn strip(ansi: &str) -> String {
    let mut out = String::with_capacity(ansi.len());
    let mut chars = ansi.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\x1b' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('[') => {
                for c in chars.by_ref() {
                    if ('@'..='~').contains(&c) {
                        break;
                    }
                }
            }
            Some(']') => {
                while let Some(c) = chars.next() {
                    if c == '\x07' {
                        break;
                    }
                    if c == '\x1b' && chars.peek() == Some(&'\\') {
                        chars.next();
                        break;
                    }
                }
            }
            _ => {}
        }
    }
    out.lines()
        .map(str::trim_end)
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What tmux 3.3's `capture-pane -e` emits (one attribute per sequence, a reset and
    /// the default colours after each run): bold, a colour, 256 colours and RGB,
    /// reverse video, a hyperlink, a line of spaces, a blank line.
    const PANE: &str = "\x1b[1mbacklogd top\x1b[0m\x1b[39m\x1b[49m  drops \x1b[1m\x1b[31m430/s\x1b[0m\x1b[39m\x1b[49m  \n\
                        \x1b[7mADDRESS:PORT   PROCESS\x1b[0m\x1b[39m\x1b[49m\n\
                        \x1b[38;5;196mred256\x1b[39m \x1b[38;2;1;2;3m\x1b[48;5;22mrgb\x1b[0m \x1b]8;;http://x\x1b\\link\x1b]8;;\x07\n\
                        \x1b[0m   \n\
                        \n";

    #[test]
    fn strip_leaves_the_text() {
        assert_eq!(
            strip(PANE),
            "backlogd top  drops 430/s\nADDRESS:PORT   PROCESS\nred256 rgb link\n\n"
        );
    }

    #[test]
    fn trim_cuts_blank_lines_and_keeps_escapes() {
        let trimmed = trim(PANE);
        assert_eq!(trimmed.lines().count(), 3);
        assert!(trimmed.starts_with("\x1b[1mbacklogd top\x1b[0m"));
        assert!(trimmed.contains("\x1b[38;2;1;2;3m\x1b[48;5;22mrgb"));
    }

    /// anstyle-svg understands what tmux emits: bold, the 16 colours, 256 colours, RGB,
    /// reverse video (drawn as a background), on a dark background in monospace.
    #[test]
    fn svg_renders_tmux_escapes() {
        let svg = svg(&trim(PANE));
        for wanted in [
            r#"class="bold""#,
            "fill: #C50F1F",       // ANSI red in the Windows 10 console palette
            "fg-ansi256-196",      // 256-colour
            "fill: #010203",       // RGB
            "bg-ansi256-022",      // a 256-colour background
            ".bg { fill: #0C0C0C", // its black, the default background
            "monospace",
            "backlogd top",
            "ADDRESS:PORT",
        ] {
            assert!(svg.contains(wanted), "no {wanted} in {svg}");
        }
        // Reverse video: a background of the foreground colour behind the header.
        assert!(svg.contains(r#"class="bg-white""#), "{svg}");
        assert!(!svg.contains('\x1b'), "{svg}");
    }
}
