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

use backlogd_common::DropReason;

use super::app::{App, Line, Row};
use crate::api::{ClientImpact, ImpactWindow, ListenerSnapshot, Request};

pub fn draw(frame: &mut Frame, app: &App) {
    let area = frame.area();
    let [header, table, bottom] = Layout::vertical([
        Constraint::Length(2),
        Constraint::Min(5),
        // The detail pane: its top border, the listener, its backlog, two findings and up to
        // ten lines of figures; with a 2-line header and a 5-row table, 23 rows.
        Constraint::Length(if app.detail { 16 } else { 5 }),
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

/// The table's columns, in display order. The first [`Col::BASE`] always show (a cut
/// process name makes room for them); the others join in [`EXTRAS`] order while the
/// width allows. Each is as wide as its header or its widest cell, up to [`Col::cap`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Col {
    Address,
    Process,
    Backlog,
    Accept,
    Synq,
    Drops,
    Impact,
    Reasons,
    Cookies,
    Rtx,
    Wait,
    Netns,
}

impl Col {
    const ALL: [Col; 12] = [
        Col::Address,
        Col::Process,
        Col::Backlog,
        Col::Accept,
        Col::Synq,
        Col::Drops,
        Col::Impact,
        Col::Reasons,
        Col::Cookies,
        Col::Rtx,
        Col::Wait,
        Col::Netns,
    ];
    /// `ADDRESS:PORT` to `DLY/ABN/s`.
    const BASE: usize = 7;

    fn index(self) -> usize {
        Col::ALL.iter().position(|&c| c == self).unwrap_or_default()
    }

    fn header(self) -> &'static str {
        match self {
            Col::Address => "ADDRESS:PORT",
            Col::Process => "PROCESS",
            Col::Backlog => "BACKLOG",
            Col::Accept => "ACCEPT QUEUE",
            Col::Synq => "SYNQ",
            Col::Drops => "DROPS/s",
            Col::Impact => "DLY/ABN/s",
            Col::Reasons => "ACC/SYN/ACK/OTH",
            Col::Cookies => "COOKIE/s",
            Col::Rtx => "RTX/s",
            Col::Wait => "WAIT p50/p99",
            Col::Netns => "NETNS",
        }
    }

    /// The widest the column gets; a longer cell is cut.
    fn cap(self) -> usize {
        match self {
            Col::Address => 22,
            Col::Process => 16,
            Col::Backlog => 10,
            Col::Accept => 15,
            Col::Synq => 10,
            Col::Drops => 8,
            Col::Impact => 11,
            Col::Reasons => 18,
            Col::Cookies => 9,
            Col::Rtx => 7,
            Col::Wait => 13,
            Col::Netns => 11,
        }
    }
}

/// What joins the base columns when there is room, most wanted first.
#[derive(Debug, Clone, Copy)]
enum Extra {
    Col(Col),
    /// The accept queue's fill bar, in front of its figures.
    Bar,
}

const EXTRAS: [Extra; 6] = [
    Extra::Bar,
    Extra::Col(Col::Reasons),
    Extra::Col(Col::Wait),
    Extra::Col(Col::Cookies),
    Extra::Col(Col::Rtx),
    Extra::Col(Col::Netns),
];

/// `[####] ` in front of the accept queue's figures.
const BAR: usize = 7;

/// One line of the table: its cells in [`Col::ALL`] order, and the accept queue's bar.
struct Cells {
    cells: Vec<(String, Style)>,
    bar: Option<String>,
    style: Style,
}

/// The columns that fit in `width` with their widths, given each column's widest cell
/// (`content`, in [`Col::ALL`] order), and whether the accept queue gets its bar.
fn fit(width: usize, content: &[usize]) -> (Vec<(Col, usize)>, bool) {
    let mut own: Vec<usize> = Col::ALL
        .iter()
        .map(|&c| content[c.index()].max(c.header().len()).min(c.cap()))
        .collect();
    let mut shown: Vec<Col> = Col::ALL[..Col::BASE].to_vec();
    // Every column after the first costs one more, for the gap in front of it.
    let mut used = shown.iter().map(|&c| own[c.index()] + 1).sum::<usize>() - 1;
    if used > width {
        let process = &mut own[Col::Process.index()];
        let cut = (used - width).min(*process - Col::Process.header().len());
        *process -= cut;
        used -= cut;
    }
    let mut bar = false;
    for extra in EXTRAS {
        let cost = match extra {
            Extra::Col(c) => own[c.index()] + 1,
            Extra::Bar => BAR,
        };
        if used + cost <= width {
            used += cost;
            match extra {
                Extra::Col(c) => shown.push(c),
                Extra::Bar => bar = true,
            }
        }
    }
    let widths = Col::ALL
        .iter()
        .filter(|c| shown.contains(c))
        .map(|&c| {
            (
                c,
                own[c.index()] + if bar && c == Col::Accept { BAR } else { 0 },
            )
        })
        .collect();
    (widths, bar)
}

fn draw_table(frame: &mut Frame, app: &App, area: Rect) {
    let lines = app.lines();
    let table: Vec<Cells> = lines
        .iter()
        .map(|line| match line {
            Line::Group {
                key,
                members,
                collapsed,
                drops_per_s,
                impact_per_s,
            } => {
                let mut cells = vec![(String::new(), Style::new()); Col::ALL.len()];
                cells[Col::Address.index()].0 = format!(
                    "{} {}",
                    if *collapsed { "+" } else { "-" },
                    match key.1.parse::<std::net::IpAddr>() {
                        Ok(ip) => std::net::SocketAddr::new(ip, key.2).to_string(),
                        Err(_) => format!("{}:{}", key.1, key.2),
                    }
                );
                cells[Col::Process.index()].0 = format!("group of {members}");
                cells[Col::Drops.index()].0 = rate(*drops_per_s);
                cells[Col::Impact.index()].0 = impact(*impact_per_s);
                Cells {
                    cells,
                    bar: None,
                    style: Style::new().add_modifier(Modifier::BOLD),
                }
            }
            Line::Listener(i) => listener_cells(&app.rows[*i]),
        })
        .collect();
    let content: Vec<usize> = (0..Col::ALL.len())
        .map(|i| {
            table
                .iter()
                .map(|l| l.cells[i].0.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let (columns, bar) = fit(area.width.into(), &content);
    let rows: Vec<TableRow> = table
        .into_iter()
        .map(|line| {
            let cells: Vec<Cell> = columns
                .iter()
                .map(|&(c, _)| {
                    let (text, style) = line.cells[c.index()].clone();
                    let text = match (&line.bar, c) {
                        (Some(b), Col::Accept) if bar => format!("{b} {text}"),
                        _ => text,
                    };
                    Cell::from(text).style(style)
                })
                .collect();
            TableRow::new(cells).style(line.style)
        })
        .collect();
    let header: Vec<&str> = columns.iter().map(|(c, _)| c.header()).collect();
    let widths: Vec<Constraint> = columns
        .iter()
        .map(|&(_, w)| Constraint::Length(w as u16))
        .collect();
    let mut state =
        TableState::default().with_selected(Some(app.selected.min(lines.len().saturating_sub(1))));
    let table = Table::new(rows, widths)
        .header(TableRow::new(header).style(Style::new().add_modifier(Modifier::REVERSED)))
        .row_highlight_style(Style::new().add_modifier(Modifier::BOLD).fg(Color::Cyan))
        .block(Block::new().borders(Borders::TOP));
    frame.render_stateful_widget(table, area, &mut state);
}

/// The detail pane's line of the daemon's recent client impact (none from an older
/// daemon).
fn recent_impact(
    window: Option<&ImpactWindow>,
    l: &ListenerSnapshot,
    long: f64,
) -> Option<TextLine<'static>> {
    let window = window?;
    let none = ClientImpact::none();
    let r = l.recent_impact.as_ref().unwrap_or(&none);
    Some(TextLine::raw(format!(
        "impact {}: connections delayed {} ({} waited > {long} s)  attempts abandoned {}",
        crate::diagnosis::impact::window(window),
        r.delayed(),
        r.delayed_at_least(long),
        r.abandoned
    )))
}

/// The `DLY/ABN/s` cell: delayed and abandoned connections per second.
fn impact((delayed, abandoned): (f64, f64)) -> String {
    format!("{}/{}", rate(delayed), rate(abandoned))
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

/// A listener's cells in [`Col::ALL`] order.
fn listener_cells(r: &Row) -> Cells {
    let l = &r.l.listener;
    let q = &r.l.queues;
    let drops = r.drops_total_per_s();
    let (delayed, abandoned) = r.impact_per_s();
    let d = r.drops_per_s;
    let plain = Style::new();
    let red = Style::new().fg(Color::Red);
    let alarm = red.add_modifier(Modifier::BOLD);
    let cells = vec![
        (l.endpoint().to_string(), plain),
        (
            match l.names.as_ref().and_then(|n| n.owner()) {
                Some(owner) => format!("{}[{}] {owner}", l.comm, l.pid),
                None => format!("{}[{}]", l.comm, l.pid),
            },
            plain,
        ),
        (
            format!(
                "{}/{}{}",
                r.l.request.short(),
                l.granted,
                if r.relisten { "+" } else { "" }
            ),
            if r.clamped() { alarm } else { plain },
        ),
        (
            format!("{}/{} ^{}", q.accept_depth, l.granted, q.accept_max),
            if q.accept_depth > l.granted {
                red
            } else {
                plain
            },
        ),
        (syn_queue(q), plain),
        (rate(drops), if drops > 0.0 { alarm } else { plain }),
        (
            impact((delayed, abandoned)),
            if abandoned > 0.0 {
                alarm
            } else if delayed > 0.0 {
                red
            } else {
                plain
            },
        ),
        (
            format!(
                "{}/{}/{}/{}",
                rate(d[DropReason::AcceptQueueFull]),
                rate(d[DropReason::SynQueueFull]),
                rate(d[DropReason::FinalAckOverflow]),
                rate(d[DropReason::Other])
            ),
            plain,
        ),
        (rate(r.syncookies_per_s), plain),
        (rate(r.synack_retransmits_per_s), plain),
        (
            format!("{}/{}", seconds(r.wait_p50), seconds(r.wait_p99)),
            plain,
        ),
        (l.netns.to_string(), plain),
    ];
    Cells {
        cells,
        bar: Some(queue_bar(q.accept_depth, l.granted, 4)),
        style: plain,
    }
}

fn draw_sparkline(frame: &mut Frame, app: &App, area: Rect) {
    let (title, data): (String, Vec<u64>) = match app.selected_row() {
        Some(r) => (
            format!(" SYNs + final ACKs dropped/s {} ", r.l.listener.endpoint()),
            app.history
                .get(&r.l.listener.inode)
                .map(|h| h.iter().copied().collect())
                .unwrap_or_default(),
        ),
        None => (
            " SYNs + final ACKs dropped/s (select a listener) ".into(),
            Vec::new(),
        ),
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
            let long = crate::api::ClientImpact::bounds()[0];
            let lines = vec![
                TextLine::raw(format!(
                    "{}  socket {}  netns {}  {}[{}]",
                    l.listener.endpoint(),
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
                    "accept queue {}/{} connections (max {} in window)  SYN queue {} pending \
                     handshakes (max {} in window)",
                    l.queues.accept_depth,
                    l.listener.granted,
                    l.queues.accept_max,
                    l.queues
                        .syn_depth
                        .map_or_else(|| "-".to_owned(), |n| n.to_string()),
                    l.queues.syn_max
                )),
                TextLine::raw(format!(
                    "totals: SYNs {} (retransmissions included)  connections queued {}  \
                     accepted {}  SYNs answered with a cookie {}  SYN-ACKs retransmitted {}",
                    l.syns_received,
                    l.queued,
                    if app.accepts_counted {
                        l.accepted.to_string()
                    } else {
                        "- (syscall_hook = false)".to_owned()
                    },
                    l.syncookies_sent,
                    l.synack_retransmits
                )),
                TextLine::raw(format!(
                    "dropped: SYNs, accept queue full {}  SYNs, SYN queue full {}  final \
                     ACKs {}  other {}",
                    l.drops[DropReason::AcceptQueueFull],
                    l.drops[DropReason::SynQueueFull],
                    l.drops[DropReason::FinalAckOverflow],
                    l.drops[DropReason::Other]
                )),
                TextLine::raw(format!(
                    "accept wait p50 {}  p99 {}  (last refresh)",
                    seconds(r.wait_p50),
                    seconds(r.wait_p99)
                )),
                TextLine::raw(format!(
                    "client impact: connections delayed {}/s ({}/s waited > {long} s)  \
                     attempts abandoned {}/s  (last refresh)",
                    rate(r.delayed_per_s),
                    rate(r.delayed_long_per_s),
                    rate(r.abandoned_per_s)
                )),
                TextLine::raw(format!(
                    "impact totals: connections delayed {} (SYN drop {}, final-ACK overflow \
                     {}; {} waited > {long} s)  attempts abandoned {}",
                    l.impact.delayed(),
                    l.impact.delayed_syn_drop,
                    l.impact.delayed_final_ack_overflow,
                    l.impact.delayed_at_least(long),
                    l.impact.abandoned
                )),
            ]
            .into_iter()
            .chain(recent_impact(app.impact_window.as_ref(), l, long))
            .chain(sources_lines(app.impact_window.as_ref(), l))
            .collect::<Vec<_>>();
            // What doctor finds right under the listener's identity and backlog: on a
            // small terminal the figures below it are cut, not the findings.
            let findings = app
                .findings
                .iter()
                .filter(|f| f.subject == crate::diagnosis::finding::subject(l))
                .map(|f| {
                    TextLine::styled(
                        format!("doctor: {} ({:?}): {}", f.kind, f.severity, f.summary),
                        Style::new().fg(Color::Yellow),
                    )
                });
            let mut lines = lines;
            let figures = lines.split_off(2.min(lines.len()));
            lines.extend(findings);
            lines.extend(figures);
            lines
        }
    };
    frame.render_widget(
        Paragraph::new(text).block(Block::new().borders(Borders::TOP).title(" detail ")),
        area,
    );
}

/// Who the listener dropped (or answered with a cookie), by source prefix: in the recent
/// window (what is going on now) and since counting began, how many prefixes and the
/// largest, or only its share when the daemon withholds addresses.
fn sources_lines(window: Option<&ImpactWindow>, l: &ListenerSnapshot) -> Vec<TextLine<'static>> {
    let Some(d) = l.drop_sources.as_ref() else {
        return Vec::new();
    };
    // The largest prefix's counts in the recent line only: the pane may be 120 columns.
    let line = |when: String, d: &crate::sources::DropSources, detail: bool| {
        let counts = d
            .top
            .as_ref()
            .and_then(|t| t.first())
            .filter(|_| detail)
            .map(|s| {
                format!(
                    " ({} SYN drops, {} final-ACK drops, {} cookies)",
                    s.counts.syn_drops, s.counts.final_ack_drops, s.counts.cookies
                )
            })
            .unwrap_or_default();
        // Expired and untracked in the line since start only, for the same reason.
        let unsourced = if detail {
            String::new()
        } else {
            format!(
                ", expired {}, untracked {}",
                d.expired.total(),
                d.untracked.total()
            )
        };
        TextLine::raw(format!(
            "drop sources {when}: {} prefixes, largest {}{counts}{unsourced}",
            d.prefixes,
            d.largest().unwrap_or_else(|| "none".to_owned()),
        ))
    };
    let recent = window
        .zip(d.recent.as_deref())
        .map(|(w, r)| line(crate::diagnosis::impact::window(w), r, true));
    recent
        .into_iter()
        .chain([line("since start".to_owned(), d, false)])
        .collect()
}

fn draw_help(frame: &mut Frame, area: Rect) {
    // Every value fits the popup's 38 columns, and every line an 80x24 terminal.
    let keys = [
        ("s", "sort by next column"),
        ("/", "filter by port, process, pid or netns"),
        ("p, space", "pause / resume"),
        ("+ / -", "slower / faster refresh"),
        ("up/down, j/k", "select"),
        ("enter, d", "detail pane / collapse group"),
        ("?/h, q/esc", "this help / quit"),
        ("", ""),
        // What each rate counts: segments, connections or connection attempts.
        ("DROPS/s", "SYNs + final ACKs dropped, not"),
        ("", "connections (a retried SYN counts"),
        ("", "again); by reason in ACC/SYN/ACK/OTH"),
        ("DLY/ABN/s", "connections queued after a drop /"),
        ("", "attempts with a drop not queued"),
        ("", "within the horizon, per second"),
        ("COOKIE/s", "SYNs answered with a syncookie"),
        ("RTX/s", "SYN-ACKs retransmitted"),
        ("SYNQ", "handshakes pending now^peak (or"),
        ("", "^peak: no length now)"),
        ("BACKLOG", "asked/granted, red: granted less;"),
        ("", "+: listen() again gets more"),
    ];
    // Every line and the two borders.
    let w = 56.min(area.width);
    let h = (keys.len() as u16 + 2).min(area.height);
    let popup = Rect::new(
        area.x + (area.width - w) / 2,
        area.y + (area.height - h) / 2,
        w,
        h,
    );
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

/// The SYN-queue cell: its length now and its peak in the window (`^peak` alone where no
/// scan pass found the listener).
fn syn_queue(q: &crate::queues::QueueFigures) -> String {
    match q.syn_depth {
        // No space, unlike the accept queue's: the cell must fit beside it at 80 columns.
        Some(now) => format!("{now}^{}", q.syn_max),
        None => format!("^{}", q.syn_max),
    }
}

/// The table as plain text, for `--once`.
pub fn plain(app: &App) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<24} {:<18} {:>9} {:>13} {:>9} {:>8} {:>9} {:>9} {:>7} {:>13}  OWNER",
        "ADDRESS:PORT",
        "PROCESS",
        "BACKLOG",
        "ACCEPT Q",
        "SYNQ",
        "DROPS/s",
        "DLY/ABN/s",
        "COOKIE/s",
        "RTX/s",
        "WAIT p50/p99"
    );
    for r in &app.rows {
        let l = &r.l.listener;
        let q = &r.l.queues;
        let _ = writeln!(
            out,
            "{:<24} {:<18} {:>9} {:>13} {:>9} {:>8} {:>9} {:>9} {:>7} {:>13}  {}",
            l.endpoint().to_string(),
            format!("{}[{}]", l.comm, l.pid),
            format!(
                "{}/{}{}{}",
                r.l.request.short(),
                l.granted,
                if r.clamped() { "!" } else { "" },
                if r.relisten { "+" } else { "" }
            ),
            format!("{}/{} ^{}", q.accept_depth, l.granted, q.accept_max),
            syn_queue(q),
            rate(r.drops_total_per_s()),
            impact(r.impact_per_s()),
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
        api::{Snapshot, fixtures},
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

    /// Two snapshots one second apart: nginx on :80 drops 50/s, delays 12 connections
    /// (10 of them by more than 0.5 s) and 3 are abandoned, sshd is quiet, and a 2-socket
    /// reuseport group on :8080.
    fn app() -> App {
        let quiet = vec![
            listener(1, 80, "nginx", 511, 128),
            listener(2, 22, "sshd", 128, 128),
            listener(3, 8080, "app", 64, 64),
            listener(4, 8080, "app", 64, 64),
        ];
        let mut busy = quiet.clone();
        busy[0].drops[DropReason::AcceptQueueFull] = 50;
        busy[0].syns_received = 200;
        busy[0].queues = QueueFigures {
            accept_depth: 129,
            accept_max: 129,
            syn_max: 3,
            syn_depth: Some(1),
        };
        busy[0].impact = fixtures::impact(10, 2, &[2, 9, 1], 3);
        busy[0].recent_impact = Some(fixtures::impact(4, 0, &[1, 3], 1));
        let largest = |syn_drops, share| crate::sources::DropSources {
            prefixes: 3,
            top_share: share,
            top: Some(vec![crate::sources::Source {
                prefix: "192.0.2.0/24".into(),
                counts: crate::sources::Counts {
                    syn_drops,
                    ..Default::default()
                },
                share,
                last_seen_seconds_ago: 1.0,
            }]),
            ..Default::default()
        };
        busy[0].drop_sources = Some(crate::sources::DropSources {
            expired: crate::sources::Counts {
                syn_drops: 7,
                ..Default::default()
            },
            recent: Some(Box::new(largest(25, 0.5))),
            ..largest(40, 0.4)
        });
        let mut app = App::new(Duration::from_secs(1));
        app.update(snapshot(quiet), Duration::from_secs(1));
        let mut busy = snapshot(busy);
        busy.impact_window = Some(ImpactWindow {
            window_seconds: 303.0,
            since_start: false,
        });
        app.update(busy, Duration::from_secs(1));
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
            "DLY/ABN/s",
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
            screen
                .iter()
                .any(|l| l.contains("SYNs + final ACKs dropped/s 0.0.0.0:80")),
            "{screen:#?}"
        );
    }

    /// The header line of a rendered table and the row of `addr`.
    fn header_and_row<'a>(screen: &'a [String], addr: &str) -> (&'a str, &'a str) {
        let h = screen
            .iter()
            .position(|l| l.contains("ADDRESS:PORT"))
            .expect("a header");
        let row = screen[h + 1..]
            .iter()
            .find(|l| l.starts_with(&format!("{addr} ")))
            .unwrap_or_else(|| panic!("no row for {addr}: {screen:#?}"));
        (&screen[h], row)
    }

    /// The cell under `column`'s header.
    fn cell<'a>(header: &str, row: &'a str, column: &str) -> &'a str {
        let at = header
            .find(column)
            .unwrap_or_else(|| panic!("no {column} in {header}"));
        row[at..].split_whitespace().next().unwrap_or("")
    }

    #[test]
    fn the_impact_column_shows_delayed_and_abandoned_per_second_from_80_columns_on() {
        let app = app();
        for w in [80, 100, 120, 200] {
            let screen = render(&app, w, 24);
            let (header, row) = header_and_row(&screen, "0.0.0.0:80");
            assert_eq!(cell(header, row, "DLY/ABN/s"), "12/3.0", "{w}: {screen:#?}");
            assert_eq!(cell(header, row, "DROPS/s"), "50", "{w}: {screen:#?}");
            // The base columns are never cut to make room for it.
            assert_eq!(cell(header, row, "BACKLOG"), "511/128", "{w}: {screen:#?}");
            assert!(row.contains("129/128 ^129"), "{w}: {row}");
            let (_, group) = header_and_row(&screen, "- 0.0.0.0:8080");
            assert_eq!(cell(header, group, "DLY/ABN/s"), "0/0", "{w}: {screen:#?}");
        }
        let screen = render(&app, 80, 24);
        assert_eq!(
            header_and_row(&screen, "0.0.0.0:80").1.trim_end(),
            "0.0.0.0:80     nginx[101] 511/128 [####] 129/128 ^129 1^3  50      12/3.0"
        );
        // With room, the other columns join in turn.
        let screen = render(&app, 120, 24);
        let (header, row) = header_and_row(&screen, "0.0.0.0:80");
        assert_eq!(
            header.trim_end(),
            "ADDRESS:PORT   PROCESS    BACKLOG ACCEPT QUEUE        SYNQ DROPS/s DLY/ABN/s \
             ACC/SYN/ACK/OTH COOKIE/s RTX/s WAIT p50/p99"
        );
        assert_eq!(
            row.trim_end(),
            "0.0.0.0:80     nginx[101] 511/128 [####] 129/128 ^129 1^3  50      12/3.0    \
             50/0/0/0        0        0     -/-"
        );
    }

    #[test]
    fn at_80_columns_a_long_address_keeps_the_impact_column_and_cuts_the_process() {
        let mut l = listener(99999, 65535, "postgres-worker", 4096, 4096);
        l.listener.addr = "255.255.255.255".parse().unwrap();
        l.queues = QueueFigures {
            accept_depth: 4096,
            accept_max: 4097,
            syn_max: 4096,
            syn_depth: Some(0),
        };
        let mut after = l.clone();
        after.impact = fixtures::impact(1000, 0, &[0, 1000], 0);
        let mut app = App::new(Duration::from_secs(1));
        app.update(snapshot(vec![l]), Duration::from_secs(1));
        app.update(snapshot(vec![after]), Duration::from_secs(1));
        let screen = render(&app, 80, 24);
        let (header, row) = header_and_row(&screen, "255.255.255.255:65535");
        assert_eq!(
            header.trim_end(),
            "ADDRESS:PORT          PROCESS BACKLOG   ACCEPT QUEUE    SYNQ   DROPS/s DLY/ABN/s"
        );
        assert_eq!(
            row.trim_end(),
            "255.255.255.255:65535 postgre 4096/4096 4096/4096 ^4097 0^4096 0       1000/0"
        );
    }

    #[test]
    fn a_listener_that_would_get_more_from_listen_again_is_flagged() {
        // Asked for 511, granted 128; somaxconn raised to 4096 since: `!+`. One that asks
        // for somaxconn itself (Go) and holds an old 128: `+` alone. At somaxconn 128
        // neither can get more.
        let clamped = listener(1, 80, "nginx", 511, 128);
        let mut go = listener(2, 8080, "server", 0, 128);
        go.request = crate::api::Request::Somaxconn {
            program: "Go".into(),
        };
        let mut raised = App::new(Duration::from_secs(1));
        raised.update(
            fixtures::snapshot(
                vec![clamped.clone(), go.clone()],
                vec![fixtures::namespace(fixtures::NETNS, 4096)],
            ),
            Duration::from_secs(1),
        );
        let text = plain(&raised);
        let row = |port: &str| {
            text.lines()
                .find(|l| l.starts_with(&format!("0.0.0.0:{port} ")))
                .unwrap_or_else(|| panic!("no row for {port}: {text}"))
                .to_owned()
        };
        assert!(row("80").contains(" 511/128!+ "), "{}", row("80"));
        assert!(row("8080").contains(" =max/128+ "), "{}", row("8080"));
        let mut same = App::new(Duration::from_secs(1));
        same.update(
            fixtures::snapshot(
                vec![clamped],
                vec![fixtures::namespace(fixtures::NETNS, 128)],
            ),
            Duration::from_secs(1),
        );
        assert!(plain(&same).contains(" 511/128! "), "{}", plain(&same));
    }

    #[test]
    fn impact_rates_are_the_counters_increase_over_the_refresh() {
        let mut before = listener(1, 80, "nginx", 511, 128);
        before.impact = fixtures::impact(4, 0, &[0, 4], 1);
        let mut after = before.clone();
        after.impact = fixtures::impact(14, 2, &[2, 13, 1], 7);
        let mut app = App::new(Duration::from_secs(2));
        app.update(snapshot(vec![before]), Duration::from_secs(2));
        // The first snapshot has nothing to compare with.
        assert_eq!(app.rows[0].impact_per_s(), (0.0, 0.0));
        app.update(snapshot(vec![after]), Duration::from_secs(2));
        let r = &app.rows[0];
        assert_eq!(r.impact_per_s(), (6.0, 3.0));
        assert_eq!(r.delayed_long_per_s, 5.0);
        // `top --json` carries them.
        let json = serde_json::to_value(r).unwrap();
        assert_eq!(json["delayed_per_s"], 6.0);
        assert_eq!(json["delayed_long_per_s"], 5.0);
        assert_eq!(json["abandoned_per_s"], 3.0);
        // `--once`: after DROPS/s.
        let text = plain(&app);
        let mut lines = text.lines();
        assert_eq!(
            lines.next().unwrap(),
            "ADDRESS:PORT             PROCESS              BACKLOG      ACCEPT Q      SYNQ  \
             DROPS/s DLY/ABN/s  COOKIE/s   RTX/s  WAIT p50/p99  OWNER"
        );
        assert_eq!(
            lines.next().unwrap(),
            "0.0.0.0:80               nginx[101]          511/128!      0/128 ^0        ^0        \
             0   6.0/3.0         0       0           -/-  "
        );
    }

    #[test]
    fn the_detail_pane_and_the_help_explain_the_impact() {
        let mut app = app();
        app.selected = 0;
        app.on_key(KeyCode::Char('d'));
        let screen = render(&app, 120, 30);
        for line in [
            "client impact: connections delayed 12/s (10/s waited > 0.5 s)  attempts \
             abandoned 3.0/s  (last refresh)",
            "impact totals: connections delayed 12 (SYN drop 10, final-ACK overflow 2; 10 \
             waited > 0.5 s)  attempts abandoned 3",
            "impact in the last 5.0 min: connections delayed 4 (3 waited > 0.5 s)  attempts \
             abandoned 1",
            "drop sources in the last 5.0 min: 3 prefixes, largest 192.0.2.0/24 50% (25 SYN \
             drops, 0 final-ACK drops, 0 cookies)",
            "drop sources since start: 3 prefixes, largest 192.0.2.0/24 40%, expired 7, \
             untracked 0",
        ] {
            assert!(
                screen.iter().any(|l| l.contains(line)),
                "{line}: {screen:#?}"
            );
        }
        app.on_key(KeyCode::Char('?'));
        let screen = render(&app, 80, 24);
        for line in [
            "DLY/ABN/s     connections queued after a drop /",
            "attempts with a drop not queued",
            "within the horizon, per second",
            "DROPS/s       SYNs + final ACKs dropped, not",
            "COOKIE/s      SYNs answered with a syncookie",
            // The last line: the popup fits 80x24 whole.
            "+: listen() again gets more",
        ] {
            assert!(
                screen.iter().any(|l| l.contains(line)),
                "{line}: {screen:#?}"
            );
        }
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
