//! Drawing `backlogd top`: header, table, sparkline or detail pane, help overlay.

use ratatui::{
    Frame,
    layout::{Constraint, Layout, Rect},
    style::{Color, Modifier, Style},
    text::{Line as TextLine, Span},
    widgets::{
        Block, Borders, Cell, Clear, Paragraph, Row as TableRow, Sparkline, Table, TableState,
    },
};

use super::app::{App, Line, Row};
use crate::api::Request;

/// Widths at or above this get the extra columns (netns, per-reason drops, rates, waits).
const WIDE: u16 = 120;

pub fn draw(frame: &mut Frame, app: &App) {
    let area = frame.area();
    let [header, table, bottom] = Layout::vertical([
        Constraint::Length(2),
        Constraint::Min(5),
        Constraint::Length(if app.detail { 12 } else { 5 }),
    ])
    .areas(area);
    draw_header(frame, app, header);
    draw_table(frame, app, table);
    if app.detail {
        draw_detail(frame, app, bottom);
    } else {
        draw_sparkline(frame, app, bottom);
    }
    if app.help {
        draw_help(frame, area);
    }
}

fn rate(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v < 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.0}")
    }
}

fn seconds(v: Option<f64>) -> String {
    match v {
        None => "-".into(),
        Some(s) if s.is_infinite() => ">8s".into(),
        Some(s) if s < 1e-3 => format!("{:.0}us", s * 1e6),
        Some(s) if s < 1.0 => format!("{:.0}ms", s * 1e3),
        Some(s) => format!("{s:.1}s"),
    }
}

fn draw_header(frame: &mut Frame, app: &App, area: Rect) {
    let drops: f64 = app.rows.iter().map(Row::drops_total_per_s).sum();
    let cookies: f64 = app.rows.iter().map(|r| r.syncookies_per_s).sum();
    let mut first = vec![
        Span::styled("backlogd top", Style::new().add_modifier(Modifier::BOLD)),
        Span::raw(format!(
            "  mode {}  listeners {}  ",
            app.hook_mode,
            app.rows.len()
        )),
        Span::styled(
            format!("drops {}/s", rate(drops)),
            if drops > 0.0 {
                Style::new().fg(Color::Red).add_modifier(Modifier::BOLD)
            } else {
                Style::new()
            },
        ),
        Span::raw(format!("  cookies {}/s", rate(cookies))),
    ];
    if app.paused {
        first.push(Span::styled("  PAUSED", Style::new().fg(Color::Yellow)));
    }
    let second = match &app.status {
        Some(s) => TextLine::styled(s.clone(), Style::new().fg(Color::Yellow)),
        None => TextLine::raw(format!(
            "sort {}  refresh {:.2}s  filter {}{}  ? help  q quit",
            app.sort.name(),
            app.interval.as_secs_f64(),
            if app.filter.is_empty() {
                "-"
            } else {
                app.filter.as_str()
            },
            if app.typing_filter { "_" } else { "" },
        )),
    };
    frame.render_widget(Paragraph::new(vec![TextLine::from(first), second]), area);
}

fn queue_bar(depth: u32, capacity: u32, width: usize) -> String {
    let filled = if capacity == 0 {
        0
    } else {
        ((depth as usize * width) / capacity as usize).min(width)
    };
    // ASCII: block glyphs have ambiguous width in some terminals and locales (SSH).
    format!("[{}{}]", "#".repeat(filled), ".".repeat(width - filled))
}

fn draw_table(frame: &mut Frame, app: &App, area: Rect) {
    let wide = area.width >= WIDE;
    let mut header = vec![
        "ADDRESS:PORT",
        "PROCESS",
        "BACKLOG",
        "ACCEPT QUEUE",
        "SYNQ",
        "DROPS/s",
    ];
    let mut widths = vec![
        Constraint::Length(22),
        Constraint::Length(16),
        Constraint::Length(9),
        Constraint::Length(20),
        Constraint::Length(5),
        Constraint::Length(8),
    ];
    if wide {
        header.extend([
            "ACC/SYN/ACK/OTH",
            "COOKIE/s",
            "RTX/s",
            "WAIT p50/p99",
            "NETNS",
        ]);
        widths.extend([
            Constraint::Length(18),
            Constraint::Length(9),
            Constraint::Length(7),
            Constraint::Length(13),
            Constraint::Length(11),
        ]);
    }
    let lines = app.lines();
    let rows: Vec<TableRow> = lines
        .iter()
        .map(|line| match line {
            Line::Group {
                key,
                members,
                collapsed,
                drops_per_s,
            } => TableRow::new(vec![
                Cell::from(format!(
                    "{} {}:{}",
                    if *collapsed { "+" } else { "-" },
                    key.1,
                    key.2
                )),
                Cell::from(format!("group of {members}")),
                Cell::from(""),
                Cell::from(""),
                Cell::from(""),
                Cell::from(rate(*drops_per_s)),
            ])
            .style(Style::new().add_modifier(Modifier::BOLD)),
            Line::Listener(i) => listener_row(&app.rows[*i], wide),
        })
        .collect();
    let mut state =
        TableState::default().with_selected(Some(app.selected.min(lines.len().saturating_sub(1))));
    let table = Table::new(rows, widths)
        .header(TableRow::new(header).style(Style::new().add_modifier(Modifier::REVERSED)))
        .row_highlight_style(Style::new().add_modifier(Modifier::BOLD).fg(Color::Cyan))
        .block(Block::new().borders(Borders::TOP));
    frame.render_stateful_widget(table, area, &mut state);
}

/// The request as the detail pane says it.
fn request_detail(request: &Request) -> String {
    match request {
        Request::Seen { backlog } => backlog.to_string(),
        Request::Program {
            program,
            backlog,
            source,
        } => format!("{backlog} ({program}: {source})"),
        Request::Somaxconn { program } => format!("net.core.somaxconn ({program})"),
        Request::AtLeast { backlog } => {
            format!(">= {backlog} (not seen; granted = somaxconn: may be cut)")
        }
        Request::Unknown => "? (not seen)".to_owned(),
    }
}

fn listener_row(r: &Row, wide: bool) -> TableRow<'static> {
    let l = &r.l.listener;
    let q = &r.l.queues;
    let backlog = format!("{}/{}", r.l.request.short(), l.granted);
    let drops = r.drops_total_per_s();
    let mut cells = vec![
        Cell::from(format!("{}:{}", l.addr, l.port)),
        Cell::from(match l.names.as_ref().and_then(|n| n.owner()) {
            Some(owner) => format!("{}[{}] {owner}", l.comm, l.pid),
            None => format!("{}[{}]", l.comm, l.pid),
        }),
        Cell::from(backlog).style(if r.clamped() {
            Style::new().fg(Color::Red).add_modifier(Modifier::BOLD)
        } else {
            Style::new()
        }),
        Cell::from(format!(
            "{} {}/{} ^{}",
            queue_bar(q.accept_depth, l.granted, 4),
            q.accept_depth,
            l.granted,
            q.accept_max
        ))
        .style(if q.accept_depth > l.granted {
            Style::new().fg(Color::Red)
        } else {
            Style::new()
        }),
        Cell::from(q.syn_max.to_string()),
        Cell::from(rate(drops)).style(if drops > 0.0 {
            Style::new().fg(Color::Red).add_modifier(Modifier::BOLD)
        } else {
            Style::new()
        }),
    ];
    if wide {
        let d = r.drops_per_s;
        cells.extend([
            Cell::from(format!(
                "{}/{}/{}/{}",
                rate(d[0]),
                rate(d[1]),
                rate(d[2]),
                rate(d[3])
            )),
            Cell::from(rate(r.syncookies_per_s)),
            Cell::from(rate(r.synack_retransmits_per_s)),
            Cell::from(format!("{}/{}", seconds(r.wait_p50), seconds(r.wait_p99))),
            Cell::from(l.netns.to_string()),
        ]);
    }
    TableRow::new(cells)
}

fn draw_sparkline(frame: &mut Frame, app: &App, area: Rect) {
    let (title, data): (String, Vec<u64>) = match app.selected_row() {
        Some(r) => (
            format!(" drops/s {}:{} ", r.l.listener.addr, r.l.listener.port),
            app.history
                .get(&r.l.listener.inode)
                .map(|h| h.iter().copied().collect())
                .unwrap_or_default(),
        ),
        None => (" drops/s (select a listener) ".into(), Vec::new()),
    };
    frame.render_widget(
        Sparkline::default()
            .block(Block::new().borders(Borders::TOP).title(title))
            .data(&data)
            .style(Style::new().fg(Color::Red)),
        area,
    );
}

fn draw_detail(frame: &mut Frame, app: &App, area: Rect) {
    let text = match app.selected_row() {
        None => vec![TextLine::raw("select a listener (not a group header)")],
        Some(r) => {
            let l = &r.l;
            vec![
                TextLine::raw(format!(
                    "{}:{}  socket {}  netns {}  {}[{}]",
                    l.listener.addr,
                    l.listener.port,
                    l.listener.inode,
                    l.listener.netns,
                    l.listener.comm,
                    l.listener.pid
                )),
                TextLine::raw(format!(
                    "backlog requested {}  granted {}{}",
                    request_detail(&l.request),
                    l.listener.granted,
                    if r.clamped() {
                        "  CLAMPED by net.core.somaxconn"
                    } else {
                        ""
                    }
                )),
                TextLine::raw(format!(
                    "accept queue {}/{} (max {} in window)  SYN queue max {}",
                    l.queues.accept_depth,
                    l.listener.granted,
                    l.queues.accept_max,
                    l.queues.syn_max
                )),
                TextLine::raw(format!(
                    "totals: SYNs {}  queued {}  accepted {}  cookies {}  SYN-ACK retransmits {}",
                    l.syns_received, l.queued, l.accepted, l.syncookies_sent, l.synack_retransmits
                )),
                TextLine::raw(format!(
                    "drops: accept queue full {}  SYN queue full {}  final-ACK overflow {}  other {}",
                    l.drops.accept_queue_full,
                    l.drops.syn_queue_full,
                    l.drops.final_ack_overflow,
                    l.drops.other
                )),
                TextLine::raw(format!(
                    "accept wait p50 {}  p99 {}  (last refresh)",
                    seconds(r.wait_p50),
                    seconds(r.wait_p99)
                )),
            ]
            .into_iter()
            .chain(
                app.findings
                    .iter()
                    .filter(|f| f.subject == crate::doctor::finding::subject(l))
                    .map(|f| {
                        TextLine::styled(
                            format!("doctor: {} ({:?}): {}", f.kind, f.severity, f.summary),
                            Style::new().fg(Color::Yellow),
                        )
                    }),
            )
            .collect()
        }
    };
    frame.render_widget(
        Paragraph::new(text).block(Block::new().borders(Borders::TOP).title(" detail ")),
        area,
    );
}

fn draw_help(frame: &mut Frame, area: Rect) {
    let w = 50.min(area.width);
    let h = 14.min(area.height);
    let popup = Rect::new(
        area.x + (area.width - w) / 2,
        area.y + (area.height - h) / 2,
        w,
        h,
    );
    let keys = [
        ("s", "sort by next column"),
        ("/", "filter by port, process, pid or netns"),
        ("p, space", "pause / resume"),
        ("+ / -", "slower / faster refresh"),
        ("up/down, j/k", "select"),
        ("enter, d", "detail pane / collapse group"),
        ("?, h", "this help"),
        ("q, esc", "quit"),
    ];
    let text: Vec<TextLine> = keys
        .iter()
        .map(|(k, v)| TextLine::raw(format!("  {k:<14}{v}")))
        .collect();
    frame.render_widget(Clear, popup);
    frame.render_widget(
        Paragraph::new(text).block(Block::bordered().title(" keys ")),
        popup,
    );
}

/// The table as plain text, for `--once`.
pub fn plain(app: &App) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<24} {:<18} {:>9} {:>13} {:>5} {:>8} {:>9} {:>7} {:>13}  OWNER",
        "ADDRESS:PORT",
        "PROCESS",
        "BACKLOG",
        "ACCEPT Q",
        "SYNQ",
        "DROPS/s",
        "COOKIE/s",
        "RTX/s",
        "WAIT p50/p99"
    );
    for r in &app.rows {
        let l = &r.l.listener;
        let q = &r.l.queues;
        let _ = writeln!(
            out,
            "{:<24} {:<18} {:>9} {:>13} {:>5} {:>8} {:>9} {:>7} {:>13}  {}",
            format!("{}:{}", l.addr, l.port),
            format!("{}[{}]", l.comm, l.pid),
            format!(
                "{}/{}{}",
                r.l.request.short(),
                l.granted,
                if r.clamped() { "!" } else { "" }
            ),
            format!("{}/{} ^{}", q.accept_depth, l.granted, q.accept_max),
            q.syn_max,
            rate(r.drops_total_per_s()),
            rate(r.syncookies_per_s),
            rate(r.synack_retransmits_per_s),
            format!("{}/{}", seconds(r.wait_p50), seconds(r.wait_p99)),
            l.names.as_ref().and_then(|n| n.owner()).unwrap_or_default(),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use ratatui::{Terminal, backend::TestBackend, crossterm::event::KeyCode};

    use super::*;
    use crate::{
        api::{ListenerSnapshot, Snapshot, fixtures},
        queues::QueueFigures,
    };

    fn listener(
        inode: u64,
        port: u16,
        comm: &str,
        requested: i32,
        granted: u32,
    ) -> ListenerSnapshot {
        fixtures::listener(inode, port, comm, Some(requested), granted)
    }

    fn snapshot(listeners: Vec<ListenerSnapshot>) -> Snapshot {
        fixtures::snapshot(listeners, Vec::new())
    }

    /// Two snapshots one second apart: nginx on :80 drops 50/s, sshd is quiet, and a
    /// 2-socket reuseport group on :8080.
    fn app() -> App {
        let quiet = vec![
            listener(1, 80, "nginx", 511, 128),
            listener(2, 22, "sshd", 128, 128),
            listener(3, 8080, "app", 64, 64),
            listener(4, 8080, "app", 64, 64),
        ];
        let mut busy = quiet.clone();
        busy[0].drops.accept_queue_full = 50;
        busy[0].syns_received = 200;
        busy[0].queues = QueueFigures {
            accept_depth: 129,
            accept_max: 129,
            syn_max: 3,
        };
        let mut app = App::new(Duration::from_secs(1));
        app.update(snapshot(quiet), Duration::from_secs(1));
        app.update(snapshot(busy), Duration::from_secs(1));
        app
    }

    fn render(app: &App, w: u16, h: u16) -> Vec<String> {
        let mut terminal = Terminal::new(TestBackend::new(w, h)).unwrap();
        terminal.draw(|f| draw(f, app)).unwrap();
        let buf = terminal.backend().buffer().clone();
        (0..h)
            .map(|y| (0..w).map(|x| buf[(x, y)].symbol().to_string()).collect())
            .collect()
    }

    #[test]
    fn at_80x24_the_dropping_listener_is_the_top_row_with_its_clamp() {
        let screen = render(&app(), 80, 24);
        assert!(
            screen[0].contains("mode tracepoint") && screen[0].contains("drops 50/s"),
            "{}",
            screen[0]
        );
        let header = screen
            .iter()
            .position(|l| l.contains("ADDRESS:PORT"))
            .unwrap();
        let first = &screen[header + 1];
        assert!(
            first.contains("0.0.0.0:80") && first.contains("nginx[101]"),
            "{screen:#?}"
        );
        assert!(
            first.contains("511/128") && first.contains("129/128") && first.contains("50"),
            "{first}"
        );
        // Narrow: the wide-only columns are gone, and nothing overflows a line.
        assert!(!screen.iter().any(|l| l.contains("WAIT p50/p99")));
        assert!(
            screen.iter().any(|l| l.contains("group of 2")),
            "{screen:#?}"
        );
        assert!(screen.iter().all(|l| l.chars().count() == 80));
    }

    #[test]
    fn at_200x50_every_column_and_the_sparkline_title_show() {
        let screen = render(&app(), 200, 50);
        let header = screen.iter().find(|l| l.contains("ADDRESS:PORT")).unwrap();
        for col in [
            "ACC/SYN/ACK/OTH",
            "COOKIE/s",
            "RTX/s",
            "WAIT p50/p99",
            "NETNS",
        ] {
            assert!(header.contains(col), "{col} missing: {header}");
        }
        let first = screen.iter().find(|l| l.contains("0.0.0.0:80 ")).unwrap();
        assert!(
            first.contains("50/0/0/0") && first.contains("4026531840"),
            "{first}"
        );
        assert!(
            screen.iter().any(|l| l.contains("drops/s 0.0.0.0:80")),
            "{screen:#?}"
        );
    }

    #[test]
    fn keys_filter_sort_collapse_detail_help_and_quit() {
        let mut app = app();
        for c in "/22".chars() {
            app.on_key(KeyCode::Char(c));
        }
        app.on_key(KeyCode::Enter);
        assert_eq!(app.lines().len(), 1, "filtered to sshd");
        let screen = render(&app, 80, 24);
        assert!(screen.iter().any(|l| l.contains("sshd[102]")));
        assert!(!screen.iter().any(|l| l.contains("nginx[101]")));

        app.on_key(KeyCode::Char('/'));
        app.on_key(KeyCode::Enter); // empty filter
        app.on_key(KeyCode::Char('s'));
        assert_eq!(app.sort.name(), "accept queue");
        // Collapse the reuseport group.
        let group = app
            .lines()
            .iter()
            .position(|l| matches!(l, Line::Group { .. }))
            .unwrap();
        app.selected = group;
        let before = app.lines().len();
        app.on_key(KeyCode::Enter);
        assert_eq!(app.lines().len(), before - 2);
        // Detail pane for the top listener.
        app.selected = 0;
        app.on_key(KeyCode::Char('d'));
        let screen = render(&app, 80, 24);
        assert!(
            screen
                .iter()
                .any(|l| l.contains("CLAMPED by net.core.somaxconn")),
            "{screen:#?}"
        );
        // The same findings doctor reports, for the selected listener.
        for kind in ["doctor: backlog_clamped", "doctor: accept_queue_overflow"] {
            assert!(
                screen.iter().any(|l| l.contains(kind)),
                "{kind}: {screen:#?}"
            );
        }
        app.on_key(KeyCode::Char('?'));
        assert!(render(&app, 80, 24).iter().any(|l| l.contains(" keys ")));
        app.on_key(KeyCode::Esc);
        assert!(!app.help);
        app.on_key(KeyCode::Char('p'));
        assert!(app.paused);
        assert!(app.on_key(KeyCode::Char('q')));
    }
}
