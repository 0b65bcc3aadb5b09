//! `cargo xtask lint`'s module-graph check: no import cycle between the modules (files) of
//! a crate, nor between its folders.
//!
//! A cycle means two files that cannot be read, changed or tested one without the other;
//! the daemon's layering (state, loader, exporter, clients) only holds if every reference
//! points one way. Each `.rs` file is one module; a reference is any path in a `use`, a
//! type, an expression or a macro's tokens that resolves (through `crate::`, `super::`,
//! `self::` or a child module's name) to another file's module. Cycles are reported with
//! one line per edge, `file:line`, so the fix starts at the place that closes the loop.
//!
//! A folder (`loader/`) is one room: its files may use each other, but as a whole it sits
//! on one side of every other module. So the check also folds each folder into one node,
//! level by level, and looks for loops between the folders and files of one folder (e.g.
//! `loader/` -> `kernel_maps.rs` -> `loader/syscall.rs`, before bpf(2) became a leaf: no
//! two files reached each other, yet neither side could move or be tested without the
//! other). Each link of such a loop is reported with the file and line that makes it.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result, bail};
use proc_macro2::{TokenStream, TokenTree};
use syn::{spanned::Spanned as _, visit::Visit};

/// Module path of each file: `[]` for the crate root, `["loader", "pins"]` for
/// `loader/pins.rs` or `loader/pins/mod.rs`.
type ModPath = Vec<String>;

/// A strongly connected set of nodes and one loop of links through it.
type Cycle = (BTreeSet<ModPath>, Vec<(ModPath, Link)>);

/// A cycle of the graph folded at a depth, with that depth.
type FolderCycle = (usize, BTreeSet<ModPath>, Vec<(ModPath, Link)>);

/// One reference from a file to another module, where it was written.
#[derive(Debug, Clone)]
struct Edge {
    to: ModPath,
    line: usize,
}

/// An edge between two nodes of a checked graph (files, or folders folded into one node),
/// with the reference that makes it: `file`'s line `line` names module `target`.
#[derive(Debug, Clone)]
struct Link {
    to: ModPath,
    file: ModPath,
    line: usize,
    target: ModPath,
}

/// Each node's outgoing links.
type Links = BTreeMap<ModPath, Vec<Link>>;

/// The crates whose module graphs must stay acyclic: (source dir, root file).
pub const CRATES: [(&str, &str); 2] = [
    ("backlogd/src", "main.rs"),
    ("backlogd-ebpf/src", "main.rs"),
];

/// Checks every crate of [`CRATES`] under `root`; fails with each cycle's edges.
pub fn check(root: &Path) -> Result<()> {
    let mut report = String::new();
    for (dir, main) in CRATES {
        let graph = Graph::load(&root.join(dir), main)?;
        report.push_str(&graph.report(dir));
    }
    if report.is_empty() {
        println!(
            "module graph: no import cycles between files or folders in {}",
            CRATES.map(|c| c.0).join(", ")
        );
        Ok(())
    } else {
        bail!("{report}break each cycle (move the shared item to a module both can depend on)")
    }
}

fn name(m: &ModPath) -> String {
    if m.is_empty() {
        "crate".to_owned()
    } else {
        m.join("::")
    }
}

struct Graph {
    files: BTreeMap<ModPath, PathBuf>,
    edges: BTreeMap<ModPath, Vec<Edge>>,
}

impl Graph {
    fn load(src: &Path, root_file: &str) -> Result<Self> {
        let mut files = BTreeMap::new();
        collect(src, src, root_file, &mut files)?;
        let modules: BTreeSet<ModPath> = files.keys().cloned().collect();
        let mut edges = BTreeMap::new();
        for (module, file) in &files {
            let text = std::fs::read_to_string(file)
                .with_context(|| format!("reading {}", file.display()))?;
            let ast =
                syn::parse_file(&text).with_context(|| format!("parsing {}", file.display()))?;
            let mut refs = Refs {
                module: module.clone(),
                inline: Vec::new(),
                modules: &modules,
                found: Vec::new(),
            };
            refs.visit_file(&ast);
            edges.insert(module.clone(), refs.found);
        }
        Ok(Self { files, edges })
    }

    /// Every cycle, file-level then folder-level, one line per link (empty: none).
    fn report(&self, dir: &str) -> String {
        let mut report = String::new();
        for (members, cycle) in cycles(&self.file_links()) {
            let members: Vec<String> = members.iter().map(name).collect();
            report.push_str(&format!(
                "import cycle in {dir} (modules that reach each other: {}); one loop:\n",
                members.join(", ")
            ));
            for (from, link) in cycle {
                report.push_str(&format!(
                    "  {} -> {}   ({}:{})\n",
                    name(&from),
                    name(&link.to),
                    self.files[&link.file].display(),
                    link.line
                ));
            }
        }
        for (depth, members, cycle) in self.folder_cycles() {
            let node = |m: &ModPath| self.node_name(m, depth);
            let members: Vec<String> = members.iter().map(node).collect();
            report.push_str(&format!(
                "folder-level import cycle in {dir} (folders and files that reach each other: \
                 {}); one loop:\n",
                members.join(", ")
            ));
            for (from, link) in cycle {
                report.push_str(&format!(
                    "  {} -> {}   ({}:{}: {} -> {})\n",
                    node(&from),
                    node(&link.to),
                    self.files[&link.file].display(),
                    link.line,
                    name(&link.file),
                    name(&link.target)
                ));
            }
        }
        report
    }

    /// The file graph itself.
    fn file_links(&self) -> Links {
        self.folded(usize::MAX)
    }

    /// The graph with every module at or below `depth` path segments folded into its
    /// ancestor of that depth: each folder there is one node; files above it stay files.
    fn folded(&self, depth: usize) -> Links {
        let fold = |m: &ModPath| m[..m.len().min(depth)].to_vec();
        let mut links: Links = self.files.keys().map(|m| (fold(m), Vec::new())).collect();
        for (from, edges) in &self.edges {
            let node = fold(from);
            for e in edges {
                let to = fold(&e.to);
                if to != node {
                    links.entry(node.clone()).or_default().push(Link {
                        to,
                        file: from.clone(),
                        line: e.line,
                        target: e.to.clone(),
                    });
                }
            }
        }
        links
    }

    /// Whether `m` is a folder: some file's module lies below it.
    fn has_children(&self, m: &ModPath) -> bool {
        self.files
            .keys()
            .any(|f| f.len() > m.len() && f.starts_with(m))
    }

    /// Whether node `m` of the graph folded at `depth` is a whole folder.
    fn is_folder(&self, m: &ModPath, depth: usize) -> bool {
        m.len() == depth && self.has_children(m)
    }

    /// `loader/` for a folded folder, `loader` for a file (`loader/mod.rs` at a depth where
    /// its children are nodes of their own).
    fn node_name(&self, m: &ModPath, depth: usize) -> String {
        if self.is_folder(m, depth) {
            format!("{}/", m.join("/"))
        } else {
            name(m)
        }
    }

    /// The folder node `m` of the graph folded at `depth` sits in: a folder's own file
    /// (`mod.rs`) sits next to the folder's children.
    fn home(&self, m: &ModPath, depth: usize) -> ModPath {
        if m.len() < depth && self.has_children(m) {
            m.clone()
        } else {
            m[..m.len().saturating_sub(1)].to_vec()
        }
    }

    /// Loops between the folders and files of one folder, at each depth, with the depth.
    /// Loops of files alone are the file-level check's; a loop whose nodes lie in
    /// different folders folds into a loop between those folders one level up, and is
    /// reported there.
    fn folder_cycles(&self) -> Vec<FolderCycle> {
        let deepest = self.files.keys().map(Vec::len).max().unwrap_or(0);
        let mut out = Vec::new();
        for depth in 1..=deepest {
            for (members, cycle) in cycles(&self.folded(depth)) {
                let any_folder = members.iter().any(|m| self.is_folder(m, depth));
                let homes: BTreeSet<ModPath> =
                    members.iter().map(|m| self.home(m, depth)).collect();
                if any_folder && homes.len() == 1 {
                    out.push((depth, members, cycle));
                }
            }
        }
        out
    }
}

/// Every strongly connected set of two or more nodes, as a loop of links through it.
fn cycles(links: &Links) -> Vec<Cycle> {
    let targets =
        |m: &ModPath| -> BTreeSet<ModPath> { links[m].iter().map(|l| l.to.clone()).collect() };
    let mut out = Vec::new();
    let mut done: BTreeSet<ModPath> = BTreeSet::new();
    for start in links.keys() {
        if done.contains(start) {
            continue;
        }
        // The nodes that reach `start` and that `start` reaches form its component.
        let forward = reach(start, &|m| targets(m));
        let component: BTreeSet<ModPath> = forward
            .iter()
            .filter(|m| reach(m, &|n| targets(n)).contains(start))
            .cloned()
            .collect();
        done.extend(component.iter().cloned());
        if component.len() < 2 {
            continue;
        }
        let cycle = loop_through(links, start, &component);
        out.push((component, cycle));
    }
    out
}

/// A shortest path from `start` back to itself inside `component`.
fn loop_through(
    links: &Links,
    start: &ModPath,
    component: &BTreeSet<ModPath>,
) -> Vec<(ModPath, Link)> {
    let mut previous: BTreeMap<ModPath, (ModPath, Link)> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start.clone()]);
    while let Some(m) = queue.pop_front() {
        for l in &links[&m] {
            if !component.contains(&l.to) || previous.contains_key(&l.to) {
                continue;
            }
            previous.insert(l.to.clone(), (m.clone(), l.clone()));
            if &l.to == start {
                queue.clear();
                break;
            }
            queue.push_back(l.to.clone());
        }
    }
    let mut path = Vec::new();
    let mut at = start.clone();
    while let Some((from, link)) = previous.get(&at).cloned() {
        path.push((from.clone(), link));
        if &from == start {
            break;
        }
        at = from;
    }
    path.reverse();
    path
}

fn reach(start: &ModPath, next: &dyn Fn(&ModPath) -> BTreeSet<ModPath>) -> BTreeSet<ModPath> {
    let mut seen = BTreeSet::new();
    let mut stack = vec![start.clone()];
    while let Some(m) = stack.pop() {
        for n in next(&m) {
            if seen.insert(n.clone()) {
                stack.push(n);
            }
        }
    }
    seen
}

/// Files of the crate: `root_file` in `src` and every other `.rs` file below it.
fn collect(
    src: &Path,
    dir: &Path,
    root_file: &str,
    out: &mut BTreeMap<ModPath, PathBuf>,
) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            collect(src, &path, root_file, out)?;
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let rel = path.strip_prefix(src)?.with_extension("");
        let mut module: ModPath = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        if module.last().is_some_and(|l| l == "mod")
            || (module.len() == 1 && format!("{}.rs", module[0]) == root_file)
        {
            module.pop();
        }
        out.insert(module, path);
    }
    Ok(())
}

/// Collects the references of one file.
struct Refs<'a> {
    module: ModPath,
    /// Inline modules (`mod tests { ... }`) the visitor is inside.
    inline: Vec<String>,
    modules: &'a BTreeSet<ModPath>,
    found: Vec<Edge>,
}

impl Refs<'_> {
    /// Resolves a path's leading segments to a file module and records the edge.
    fn reference(&mut self, segments: &[String], line: usize) {
        let Some(first) = segments.first() else {
            return;
        };
        let mut here: ModPath = self.module.clone();
        here.extend(self.inline.iter().cloned());
        let mut abs: ModPath = match first.as_str() {
            "crate" => Vec::new(),
            "self" => here.clone(),
            "super" => {
                let mut m = here.clone();
                m.pop();
                m
            }
            // A child module of the current file, named without `self::`.
            child
                if self
                    .modules
                    .contains(&[here.as_slice(), &[child.to_owned()]].concat()) =>
            {
                here.clone()
            }
            _ => return,
        };
        let mut rest =
            &segments[usize::from(matches!(first.as_str(), "crate" | "self" | "super"))..];
        while rest.first().is_some_and(|s| s == "super") {
            abs.pop();
            rest = &rest[1..];
        }
        abs.extend(rest.iter().cloned());
        // The longest prefix that is a file's module is what the path depends on.
        let target = (0..=abs.len())
            .rev()
            .map(|n| abs[..n].to_vec())
            .find(|m| self.modules.contains(m));
        if let Some(to) = target
            && to != self.module
        {
            self.found.push(Edge { to, line });
        }
    }

    /// `crate::a::b`, `super::x` and `child::y` sequences inside a macro's tokens.
    fn tokens(&mut self, tokens: TokenStream) {
        let trees: Vec<TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < trees.len() {
            if let TokenTree::Group(g) = &trees[i] {
                self.tokens(g.stream());
                i += 1;
                continue;
            }
            let TokenTree::Ident(first) = &trees[i] else {
                i += 1;
                continue;
            };
            let line = first.span().start().line;
            let mut segments = vec![first.to_string()];
            let mut j = i + 1;
            while let (
                Some(TokenTree::Punct(a)),
                Some(TokenTree::Punct(b)),
                Some(TokenTree::Ident(next)),
            ) = (trees.get(j), trees.get(j + 1), trees.get(j + 2))
            {
                if a.as_char() != ':' || b.as_char() != ':' {
                    break;
                }
                segments.push(next.to_string());
                j += 3;
            }
            if segments.len() > 1 {
                self.reference(&segments, line);
            }
            i = j.max(i + 1);
        }
    }
}

/// Every path a `use` tree names, with `{...}` groups expanded (globs and renames end a path).
fn use_paths(tree: &syn::UseTree, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            use_paths(&p.tree, prefix, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) => out.push([prefix.as_slice(), &[n.ident.to_string()]].concat()),
        syn::UseTree::Rename(r) => out.push([prefix.as_slice(), &[r.ident.to_string()]].concat()),
        syn::UseTree::Glob(_) => out.push(prefix.clone()),
        syn::UseTree::Group(g) => {
            for t in &g.items {
                use_paths(t, prefix, out);
            }
        }
    }
}

impl<'ast> Visit<'ast> for Refs<'_> {
    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        let mut paths = Vec::new();
        use_paths(&u.tree, &mut Vec::new(), &mut paths);
        let line = u.span().start().line;
        for p in paths {
            self.reference(&p, line);
        }
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segments: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        if segments.len() > 1 {
            self.reference(&segments, p.span().start().line);
        }
        syn::visit::visit_path(self, p);
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        self.tokens(m.tokens.clone());
        syn::visit::visit_macro(self, m);
    }

    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if m.content.is_some() {
            self.inline.push(m.ident.to_string());
            syn::visit::visit_item_mod(self, m);
            self.inline.pop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(files: &[(&str, &str)]) -> Graph {
        // Tests run in parallel: one directory per call.
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("modgraph-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for (path, text) in files {
            let path = dir.join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        let g = Graph::load(&dir, "main.rs").unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        g
    }

    fn cycle_names(g: &Graph) -> Vec<Vec<String>> {
        cycles(&g.file_links())
            .iter()
            .map(|(_, c)| c.iter().map(|(from, _)| name(from)).collect())
            .collect()
    }

    #[test]
    fn a_use_group_and_a_macro_path_close_a_cycle() {
        let g = graph(&[
            ("main.rs", "mod a; mod b; fn main() {}"),
            ("a.rs", "use crate::{b::{self, X}};"),
            ("b.rs", "fn f() { tracing::info!(\"{}\", crate::a::g()); }"),
        ]);
        assert_eq!(cycle_names(&g), vec![vec!["a", "b"]]);
    }

    #[test]
    fn super_and_child_names_resolve_to_files_and_test_modules_stay_in_theirs() {
        let g = graph(&[
            ("main.rs", "mod l; fn main() { l::run(); }"),
            ("l/mod.rs", "mod p; mod s; pub fn run() { p::attach(); }"),
            ("l/p.rs", "use super::s; mod tests { use super::*; }"),
            ("l/s.rs", "pub fn bpf() {}"),
        ]);
        assert!(cycles(&g.file_links()).is_empty());
        assert!(g.folder_cycles().is_empty());
        let p = &g.edges[&vec!["l".to_owned(), "p".to_owned()]];
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].to, vec!["l".to_owned(), "s".to_owned()]);
    }

    #[test]
    fn a_child_using_its_parents_item_is_a_cycle() {
        let g = graph(&[
            ("main.rs", "mod l; fn main() {}"),
            ("l/mod.rs", "mod p; pub struct E; fn f() { p::g(); }"),
            ("l/p.rs", "pub fn g() -> super::E { super::E }"),
        ]);
        assert_eq!(cycle_names(&g), vec![vec!["l", "l::p"]]);
    }

    /// The folder-level loops: (depth, the nodes of one loop as reported).
    fn folder_loops(g: &Graph) -> Vec<(usize, Vec<String>)> {
        g.folder_cycles()
            .iter()
            .map(|(depth, _, c)| {
                (
                    *depth,
                    c.iter()
                        .map(|(from, _)| g.node_name(from, *depth))
                        .collect(),
                )
            })
            .collect()
    }

    #[test]
    fn a_folder_that_a_file_of_its_own_reaches_through_another_is_a_folder_loop() {
        // loader/ -> kernel_maps -> loader/syscall: no two files reach each other.
        let g = graph(&[
            ("main.rs", "mod kernel_maps; mod loader; fn main() {}"),
            (
                "loader/mod.rs",
                "mod syscall;\nuse crate::kernel_maps::KernelMaps;",
            ),
            ("loader/syscall.rs", "pub fn bpf() {}"),
            (
                "kernel_maps.rs",
                "pub struct KernelMaps;\n\nfn f() { crate::loader::syscall::bpf(); }",
            ),
        ]);
        assert!(cycles(&g.file_links()).is_empty());
        assert_eq!(
            folder_loops(&g),
            [(1, vec!["kernel_maps".into(), "loader/".into()])]
        );
        let report = g.report("src");
        assert!(
            report.contains("folder-level import cycle in src (folders and files that reach each other: kernel_maps, loader/)"),
            "{report}"
        );
        // Each link names the file and line that makes it, and the modules it joins.
        let at = |file: &str| {
            g.files
                .values()
                .find(|p| p.ends_with(file))
                .unwrap()
                .display()
                .to_string()
        };
        assert!(
            report.contains(&format!(
                "  kernel_maps -> loader/   ({}:3: kernel_maps -> loader::syscall)",
                at("kernel_maps.rs")
            )),
            "{report}"
        );
        assert!(
            report.contains(&format!(
                "  loader/ -> kernel_maps   ({}:2: loader -> kernel_maps)",
                at("loader/mod.rs")
            )),
            "{report}"
        );
    }

    #[test]
    fn folder_loops_inside_a_folder_are_found_at_their_depth_and_reported_once() {
        let g = graph(&[
            ("main.rs", "mod e; mod s; fn main() {}"),
            // Inside e/: page/ -> text -> page/rows.
            ("e/mod.rs", "mod page; mod text;"),
            ("e/page/mod.rs", "mod rows; use super::text::T;"),
            ("e/page/rows.rs", "pub struct R;"),
            (
                "e/text.rs",
                "pub struct T; fn f(_: super::page::rows::R) {}",
            ),
            // Across folders: s/a -> e/text, e/text -> s/b: one loop of e/ and s/, not
            // also one of s/a, s/b and e/ one level down.
            ("s/mod.rs", "mod a; mod b;"),
            ("s/a.rs", "use crate::e::text::T;"),
            ("s/b.rs", "fn g() { crate::e::text::f(); }"),
        ]);
        assert!(cycles(&g.file_links()).is_empty());
        assert_eq!(
            folder_loops(&g),
            [(2, vec!["e/page/".into(), "e::text".into()])]
        );
        let g = graph(&[
            ("main.rs", "mod e; mod s; fn main() {}"),
            ("e/mod.rs", "mod text;"),
            ("e/text.rs", "pub struct T; fn f() { crate::s::b::g(); }"),
            ("s/mod.rs", "mod a; mod b;"),
            ("s/a.rs", "use crate::e::text::T;"),
            ("s/b.rs", "pub fn g() {}"),
        ]);
        // e/text -> s/b and s/a -> e/text: no file loop, one folder loop at the top.
        assert_eq!(folder_loops(&g), [(1, vec!["e/".into(), "s/".into()])]);
    }

    #[test]
    fn a_folders_own_file_and_a_child_folder_can_loop() {
        let g = graph(&[
            ("main.rs", "mod l; fn main() {}"),
            ("l/mod.rs", "mod p; pub struct E; fn f() { p::x(); }"),
            ("l/p/mod.rs", "mod q; pub fn x() {}"),
            ("l/p/q.rs", "fn g(_: crate::l::E) {}"),
        ]);
        assert!(cycles(&g.file_links()).is_empty());
        assert_eq!(folder_loops(&g), [(2, vec!["l".into(), "l/p/".into()])]);
    }

    #[test]
    fn file_loops_and_one_way_folders_are_not_folder_loops() {
        let g = graph(&[
            ("main.rs", "mod a; mod b; mod l; fn main() {}"),
            ("a.rs", "use crate::b::X;"),
            (
                "b.rs",
                "pub struct X; fn f() { crate::a::g(); crate::l::p::h(); }",
            ),
            ("l/mod.rs", "mod p; mod s;"),
            ("l/p.rs", "pub fn h() { super::s::i(); }"),
            ("l/s.rs", "pub fn i() {}"),
        ]);
        // a <-> b is the file-level check's; b -> l/ goes one way.
        assert_eq!(cycle_names(&g), vec![vec!["a", "b"]]);
        assert!(g.folder_cycles().is_empty());
    }
}
