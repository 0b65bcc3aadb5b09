//! `cargo xtask lint`'s module-graph check: no import cycle between the modules (files) of
//! a crate.
//!
//! A cycle means two files that cannot be read, changed or tested one without the other;
//! the daemon's layering (state, loader, exporter, clients) only holds if every reference
//! points one way. Each `.rs` file is one module; a reference is any path in a `use`, a
//! type, an expression or a macro's tokens that resolves (through `crate::`, `super::`,
//! `self::` or a child module's name) to another file's module. Cycles are reported with
//! one line per edge, `file:line`, so the fix starts at the place that closes the loop.

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

/// A strongly connected set of modules and one loop of edges through it.
type Cycle = (BTreeSet<ModPath>, Vec<(ModPath, Edge)>);

/// One reference from a file to another module, where it was written.
#[derive(Debug, Clone)]
struct Edge {
    to: ModPath,
    line: usize,
}

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
        for (members, cycle) in graph.cycles() {
            let members: Vec<String> = members.iter().map(name).collect();
            report.push_str(&format!(
                "import cycle in {dir} (modules that reach each other: {}); one loop:\n",
                members.join(", ")
            ));
            for (from, edge) in cycle {
                report.push_str(&format!(
                    "  {} -> {}   ({}:{})\n",
                    name(&from),
                    name(&edge.to),
                    graph.files[&from].display(),
                    edge.line
                ));
            }
        }
    }
    if report.is_empty() {
        println!(
            "module graph: no import cycles in {}",
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

    /// Every strongly connected set of two or more modules, as a loop of edges through it.
    fn cycles(&self) -> Vec<Cycle> {
        let targets = |m: &ModPath| -> BTreeSet<ModPath> {
            self.edges[m].iter().map(|e| e.to.clone()).collect()
        };
        let mut out = Vec::new();
        let mut done: BTreeSet<ModPath> = BTreeSet::new();
        for start in self.files.keys() {
            if done.contains(start) {
                continue;
            }
            // The modules that reach `start` and that `start` reaches form its component.
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
            let cycle = self.loop_through(start, &component);
            out.push((component, cycle));
        }
        out
    }

    /// A shortest path from `start` back to itself inside `component`.
    fn loop_through(&self, start: &ModPath, component: &BTreeSet<ModPath>) -> Vec<(ModPath, Edge)> {
        let mut previous: BTreeMap<ModPath, (ModPath, Edge)> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([start.clone()]);
        while let Some(m) = queue.pop_front() {
            for e in &self.edges[&m] {
                if !component.contains(&e.to) || previous.contains_key(&e.to) {
                    continue;
                }
                previous.insert(e.to.clone(), (m.clone(), e.clone()));
                if &e.to == start {
                    queue.clear();
                    break;
                }
                queue.push_back(e.to.clone());
            }
        }
        let mut path = Vec::new();
        let mut at = start.clone();
        while let Some((from, edge)) = previous.get(&at).cloned() {
            path.push((from.clone(), edge));
            if &from == start {
                break;
            }
            at = from;
        }
        path.reverse();
        path
    }
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
        g.cycles()
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
        assert!(g.cycles().is_empty());
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
}
