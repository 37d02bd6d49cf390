//! The import-cycle check: within each crate of the workspace, the top-level modules
//! (each file or folder directly under `src/`) must form an acyclic graph, where
//! module `a` depends on module `b` when code in `a` names `crate::b` (in a `use` or in a
//! path) or, from a file directly under `src/`, `super::b`. Comments and string literals
//! are ignored. The layering this protects is documented in `runtime/src/lib.rs`.
//!
//! The checker is tested on small synthetic graphs too, so that it provably fails when a
//! cycle is planted.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Module dependency graph: top-level module -> the top-level modules it names.
type Graph = BTreeMap<String, BTreeSet<String>>;

/// `src` with comments, string and char literals blanked out (kept the same length, so
/// nothing else moves).
fn strip(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                out.push(b' ');
                i += 1;
            }
        } else if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
            let mut depth = 0usize;
            while i < b.len() {
                if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                    depth += 1;
                    out.extend_from_slice(b"  ");
                    i += 2;
                } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                    depth -= 1;
                    out.extend_from_slice(b"  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(if b[i] == b'\n' { b'\n' } else { b' ' });
                    i += 1;
                }
            }
        } else if b[i] == b'r' && matches!(b.get(i + 1), Some(b'"') | Some(b'#')) && !ident(b, i) {
            // Raw string: r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&b'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&b'"') {
                out.push(b[i]);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= b.len() {
                    break;
                }
                if b[j] == b'"' && (0..hashes).all(|k| b.get(j + 1 + k) == Some(&b'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            out.extend(std::iter::repeat_n(b' ', j - i));
            i = j;
        } else if b[i] == b'"' {
            out.push(b' ');
            i += 1;
            while i < b.len() && b[i] != b'"' {
                let n = if b[i] == b'\\' { 2 } else { 1 };
                for _ in 0..n.min(b.len() - i) {
                    out.push(if b[i] == b'\n' { b'\n' } else { b' ' });
                    i += 1;
                }
            }
            out.push(b' ');
            i += 1;
        } else if b[i] == b'\'' && is_char_literal(b, i) {
            let end = char_literal_end(b, i);
            out.extend(std::iter::repeat_n(b' ', end - i));
            i = end;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether the byte before `i` continues an identifier (so `b[i]` is not a prefix).
fn ident(b: &[u8], i: usize) -> bool {
    i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_')
}

/// Whether the `'` at `i` opens a char literal (not a lifetime or a label).
fn is_char_literal(b: &[u8], i: usize) -> bool {
    match (b.get(i + 1), b.get(i + 2)) {
        (Some(b'\\'), _) => true,
        (Some(_), Some(b'\'')) => true,
        // A multi-byte UTF-8 char: 'é'.
        (Some(c), _) if *c >= 0x80 => true,
        _ => false,
    }
}

fn char_literal_end(b: &[u8], i: usize) -> usize {
    let mut j = i + 1;
    while j < b.len() && b[j] != b'\'' {
        j += if b[j] == b'\\' { 2 } else { 1 };
    }
    (j + 1).min(b.len())
}

/// The top-level modules that `src` (a file of module `own`, at `depth` folders below
/// `src/`: 0 for `src/foo.rs` and `src/foo/mod.rs`) names through `crate::` (and, at
/// depth 0, `super::`), including every name of a `crate::{a, b::c}` group.
fn references(src: &str, depth: usize) -> BTreeSet<String> {
    let s = strip(src);
    let mut found = BTreeSet::new();
    let mut prefixes = vec!["crate::"];
    if depth == 0 {
        prefixes.push("super::");
    }
    for prefix in prefixes {
        let mut at = 0;
        while let Some(k) = s[at..].find(prefix) {
            let start = at + k;
            at = start + prefix.len();
            // `$crate::` (macros) and `foo_crate::` are not this crate's paths.
            if start > 0 {
                let c = s.as_bytes()[start - 1];
                if c == b'$' || c.is_ascii_alphanumeric() || c == b'_' {
                    continue;
                }
            }
            let rest = &s[at..];
            let rest = rest.trim_start();
            if let Some(group) = rest.strip_prefix('{') {
                // Top-level names of the group: split on commas at brace depth 0.
                let mut depth = 0i32;
                let mut item = String::new();
                for c in group.chars() {
                    match c {
                        '{' => depth += 1,
                        '}' if depth == 0 => break,
                        '}' => depth -= 1,
                        ',' if depth == 0 => {
                            push_head(&item, &mut found);
                            item.clear();
                            continue;
                        }
                        _ => {}
                    }
                    if depth == 0 {
                        item.push(c);
                    }
                }
                push_head(&item, &mut found);
            } else {
                push_head(rest, &mut found);
            }
        }
    }
    found
}

/// Adds the first path segment of `item` (an identifier), unless it is `self`.
fn push_head(item: &str, found: &mut BTreeSet<String>) {
    let item = item.trim_start();
    let name: String = item
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    if !name.is_empty() && name != "self" && name != "super" && name != "crate" {
        found.insert(name);
    }
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The module graph of the crate whose sources are in `src`.
fn crate_graph(src: &Path) -> Graph {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut modules = BTreeSet::new();
    let mut refs: Vec<(String, BTreeSet<String>)> = Vec::new();
    for f in files {
        let rel = f.strip_prefix(src).expect("under src");
        let parts: Vec<String> = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        let top = parts[0].trim_end_matches(".rs").to_string();
        if parts.len() == 1 && (top == "lib" || top == "main") {
            continue; // the crate root declares and re-exports; nothing names it
        }
        // `src/foo.rs` and `src/foo/mod.rs` are the module itself (depth 0).
        let depth = if parts.len() == 2 && parts[1] == "mod.rs" {
            0
        } else {
            parts.len() - 1
        };
        let text = fs::read_to_string(&f).expect("readable source");
        modules.insert(top.clone());
        refs.push((top, references(&text, depth)));
    }
    let mut g = Graph::new();
    for m in &modules {
        g.entry(m.clone()).or_default();
    }
    for (from, to) in refs {
        for t in to {
            // Only names that are modules of this crate (not items re-exported at the root).
            if t != from && modules.contains(&t) {
                g.entry(from.clone()).or_default().insert(t);
            }
        }
    }
    g
}

/// A cycle of the graph (its modules in order, the first repeated at the end), if any.
fn find_cycle(g: &Graph) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        Open,
        Done,
    }
    fn visit<'a>(
        g: &'a Graph,
        n: &'a str,
        marks: &mut BTreeMap<&'a str, Mark>,
        path: &mut Vec<&'a str>,
    ) -> Option<Vec<String>> {
        marks.insert(n, Mark::Open);
        path.push(n);
        for m in g.get(n).into_iter().flatten() {
            match marks.get(m.as_str()).copied().unwrap_or(Mark::New) {
                Mark::Open => {
                    let i = path
                        .iter()
                        .position(|p| p == m)
                        .expect("open nodes are on the path");
                    let mut cycle: Vec<String> = path[i..].iter().map(|s| s.to_string()).collect();
                    cycle.push(m.clone());
                    return Some(cycle);
                }
                Mark::New => {
                    if let Some(c) = visit(g, m, marks, path) {
                        return Some(c);
                    }
                }
                Mark::Done => {}
            }
        }
        path.pop();
        marks.insert(n, Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for n in g.keys() {
        if marks.get(n.as_str()).copied().unwrap_or(Mark::New) == Mark::New {
            if let Some(c) = visit(g, n, &mut marks, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("runtime/ is in the workspace")
        .to_path_buf()
}

/// Every crate's `src/` in the workspace: the root crate and each member folder.
fn crate_sources() -> Vec<PathBuf> {
    let root = workspace();
    let mut out = vec![root.join("src")];
    for member in ["runtime", "scheduler", "kernels", "ops"] {
        out.push(root.join(member).join("src"));
    }
    out.into_iter().filter(|p| p.is_dir()).collect()
}

#[test]
fn no_crate_has_an_import_cycle_between_its_top_level_modules() {
    let mut failures = Vec::new();
    for src in crate_sources() {
        let g = crate_graph(&src);
        if let Some(cycle) = find_cycle(&g) {
            failures.push(format!("{}: {}", src.display(), cycle.join(" -> ")));
        }
    }
    assert!(
        failures.is_empty(),
        "import cycles between top-level modules (break them by moving the shared piece \
         to the lower module; see runtime/src/lib.rs for the layers):\n{}",
        failures.join("\n")
    );
}

#[test]
fn the_runtime_driver_layer_names_no_module_above_it() {
    let g = crate_graph(&workspace().join("runtime/src"));
    let allowed: BTreeSet<&str> = [
        "error", "device", "dtype", "shape", "settings", "stats", "sync",
    ]
    .into_iter()
    .collect();
    let driver = g.get("driver").expect("runtime/src/driver exists");
    let above: Vec<&String> = driver
        .iter()
        .filter(|m| !allowed.contains(m.as_str()))
        .collect();
    assert!(above.is_empty(), "the driver layer depends on {above:?}");
    for core in [
        "buffer",
        "storage",
        "op",
        "tensor",
        "job",
        "completion",
        "mailbox",
    ] {
        let deps = g
            .get(core)
            .unwrap_or_else(|| panic!("runtime/src has `{core}`"));
        for backend in ["cpu", "cuda", "actor", "runtime"] {
            assert!(
                !deps.contains(backend),
                "core module `{core}` names the `{backend}` layer above it"
            );
        }
    }
}

// ---- the checker itself ----------------------------------------------------------------

fn graph(edges: &[(&str, &str)]) -> Graph {
    let mut g = Graph::new();
    for (a, b) in edges {
        g.entry(a.to_string()).or_default().insert(b.to_string());
        g.entry(b.to_string()).or_default();
    }
    g
}

#[test]
fn the_checker_finds_a_planted_cycle() {
    let acyclic = graph(&[
        ("runtime", "cuda"),
        ("cuda", "driver"),
        ("storage", "driver"),
    ]);
    assert_eq!(find_cycle(&acyclic), None);
    let planted = graph(&[
        ("runtime", "cuda"),
        ("cuda", "storage"),
        ("storage", "driver"),
        ("driver", "cuda"),
    ]);
    let cycle = find_cycle(&planted).expect("the planted cycle is found");
    assert_eq!(cycle.first(), cycle.last(), "a closed path: {cycle:?}");
    for m in ["cuda", "storage", "driver"] {
        assert!(cycle.iter().any(|c| c == m), "{m} in {cycle:?}");
    }
    assert!(
        find_cycle(&graph(&[("a", "a")])).is_some(),
        "a self-loop is a cycle"
    );
}

#[test]
fn the_checker_reads_uses_groups_and_paths_but_not_comments_or_strings() {
    let src = r#"
        use crate::{buffer::Buffer, error::{Error, Result}, self};
        use crate::sync::Arc;
        // use crate::commented::Out;
        /* crate::blocked */
        fn f() -> crate::device::Device { let _ = "crate::quoted"; let c = 'x'; todo() }
        macro_rules! m { () => { $crate::macro_path::X } }
        fn g<'a>(x: &'a str) -> &'a str { x }
        use super::sibling;
    "#;
    let at_top: Vec<String> = references(src, 0).into_iter().collect();
    assert_eq!(at_top, ["buffer", "device", "error", "sibling", "sync"]);
    // `super::` in a file below a module folder is that module itself.
    assert!(!references(src, 1).contains("sibling"));
}

#[test]
fn a_cycle_planted_in_sources_fails_the_check() {
    let dir = std::env::temp_dir().join(format!("rtx-layers-{}", std::process::id()));
    let src = dir.join("src");
    fs::create_dir_all(src.join("cuda")).expect("temp dir");
    fs::write(src.join("lib.rs"), "mod cuda; mod storage;").expect("write");
    fs::write(
        src.join("storage.rs"),
        "use crate::cuda::actor::EventBurst;",
    )
    .expect("write");
    fs::write(src.join("cuda/mod.rs"), "mod actor;").expect("write");
    fs::write(src.join("cuda/actor.rs"), "use crate::storage::Mark;").expect("write");
    let cycle = find_cycle(&crate_graph(&src));
    fs::remove_dir_all(&dir).ok();
    let cycle = cycle.expect("storage <-> cuda is found");
    assert!(cycle.contains(&"storage".to_string()) && cycle.contains(&"cuda".to_string()));
}
