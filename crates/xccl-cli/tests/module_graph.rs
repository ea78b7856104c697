//! No two top-level modules of a crate import each other, directly or through others.
//!
//! The test reads every crate's sources (tests left out: a `#[cfg(test)]` module may reach
//! anywhere), takes each file's references to `crate::MODULE` as edges from its top-level
//! module, and looks for cycles. A cycle makes two modules one in all but name: neither can
//! be understood, tested or changed without the other (docs/ARCHITECTURE.md gives the
//! direction imports go in).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const CRATES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read the sources").flatten() {
        let path = entry.path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module of `file` in the crate whose sources are in `src`.
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).expect("inside src");
    let first = rel.components().next().expect("a component").as_os_str().to_string_lossy();
    first.trim_end_matches(".rs").to_string()
}

/// The modules `text` names as `crate::NAME`, leaving out comments and every item marked
/// `#[cfg(test)]` (a test module, a test-only function or import).
fn references(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    // Inside a test-only item: the brace depth it ends at, once it has opened.
    let mut skipping: Option<i64> = None;
    let mut depth = 0i64;
    for line in text.lines() {
        let line = line.split("//").next().unwrap_or_default();
        let opened = depth;
        depth += line.matches('{').count() as i64 - line.matches('}').count() as i64;
        if line.trim() == "#[cfg(test)]" {
            skipping = Some(-1);
            continue;
        }
        match skipping {
            // The item's first line: a one-line item ends here, a block at its closing brace.
            Some(-1) => {
                skipping = (depth > opened).then_some(opened);
                continue;
            }
            Some(end) if depth > end => continue,
            Some(_) => {
                skipping = None;
                continue;
            }
            None => {}
        }
        for (at, _) in line.match_indices("crate::") {
            let name: String =
                line[at + 7..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            if !name.is_empty() {
                found.insert(name);
            }
        }
    }
    found
}

/// The module graph of the crate whose sources are in `src`.
fn graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    sources(src, &mut files);
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let from = module_of(src, &file);
        let text = std::fs::read_to_string(&file).expect("read a source");
        let to: Vec<String> =
            references(&text).into_iter().filter(|m| *m != from && m != "lib" && m != "main").collect();
        edges.entry(from).or_default().extend(to);
    }
    edges
}

/// A cycle through `start`, if any: the path back to it.
fn cycle_through(edges: &BTreeMap<String, BTreeSet<String>>, start: &str) -> Option<Vec<String>> {
    let mut stack = vec![(start.to_string(), vec![start.to_string()])];
    let mut seen = BTreeSet::new();
    while let Some((at, path)) = stack.pop() {
        for next in edges.get(&at).into_iter().flatten() {
            if next == start {
                let mut cycle = path.clone();
                cycle.push(start.to_string());
                return Some(cycle);
            }
            if seen.insert(next.clone()) {
                let mut longer = path.clone();
                longer.push(next.clone());
                stack.push((next.clone(), longer));
            }
        }
    }
    None
}

#[test]
fn no_crate_has_a_module_cycle() {
    let mut cycles = Vec::new();
    for entry in std::fs::read_dir(CRATES).expect("the crates").flatten() {
        let src = entry.path().join("src");
        if !src.is_dir() {
            continue;
        }
        let edges = graph(&src);
        assert!(edges.len() > 1 || entry.file_name() == "xccl-c", "{} has modules", src.display());
        for module in edges.keys() {
            if let Some(c) = cycle_through(&edges, module) {
                cycles.push(format!("{}: {}", entry.file_name().to_string_lossy(), c.join(" -> ")));
            }
        }
    }
    assert!(cycles.is_empty(), "module cycles:\n{}", cycles.join("\n"));
}

#[test]
fn the_scan_sees_a_cycle_where_there_is_one() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("modgraph-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("b")).unwrap();
    std::fs::write(dir.join("a.rs"), "use crate::b::Thing; // crate::c in a comment\n").unwrap();
    std::fs::write(dir.join("b/mod.rs"), "pub fn f() { crate::a::g() }\n#[cfg(test)]\nuse crate::c;\n")
        .unwrap();
    std::fs::write(dir.join("c.rs"), "pub fn h() {}\n").unwrap();
    let edges = graph(&dir);
    assert_eq!(edges["a"], BTreeSet::from(["b".to_string()]), "comments are left out");
    assert_eq!(edges["b"], BTreeSet::from(["a".to_string()]), "test modules are left out");
    assert_eq!(cycle_through(&edges, "a"), Some(vec!["a".into(), "b".into(), "a".into()]));
    assert_eq!(cycle_through(&edges, "c"), None);
    std::fs::remove_dir_all(&dir).unwrap();
}
