//! No two top-level modules of a crate import each other, directly or through others, and
//! the layer tables of docs/ARCHITECTURE.md say where each module's imports go.
//!
//! The test reads every crate's sources (tests left out: a `#[cfg(test)]` module may reach
//! anywhere), takes each file's references to `crate::MODULE` as edges from its top-level
//! module, and looks for cycles. A cycle makes two modules one in all but name: neither can
//! be understood, tested or changed without the other. It then reads each crate's table
//! (a ```` ```layers CRATE ```` block: one line per layer, top first) and checks that it
//! names every module once and that every import goes to a lower line.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const CRATES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
const ARCHITECTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/ARCHITECTURE.md");

/// Every crate's name and module graph.
fn crates() -> Vec<(String, BTreeMap<String, BTreeSet<String>>)> {
    let mut all = Vec::new();
    for entry in std::fs::read_dir(CRATES).expect("the crates").flatten() {
        let src = entry.path().join("src");
        if src.is_dir() {
            all.push((entry.file_name().to_string_lossy().into_owned(), graph(&src)));
        }
    }
    all.sort();
    all
}

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
    // The text without comments and test-only items.
    let mut code = String::new();
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
        code.push_str(line);
        code.push('\n');
    }
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + 7..];
        match rest.strip_prefix('{') {
            // `crate::{a, b::c, d::{e, f}}`: the first name of each item at the top level.
            Some(group) => {
                let mut depth = 1;
                let mut item_start = true;
                let mut name = String::new();
                for c in group.chars() {
                    if depth == 1 && item_start && (c.is_ascii_alphanumeric() || c == '_') {
                        name.push(c);
                        continue;
                    }
                    if !name.is_empty() {
                        found.insert(std::mem::take(&mut name));
                    }
                    item_start &= c.is_whitespace();
                    match c {
                        '{' => depth += 1,
                        '}' if depth == 1 => break,
                        '}' => depth -= 1,
                        ',' if depth == 1 => item_start = true,
                        _ => {}
                    }
                }
            }
            None => {
                let name: String =
                    rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                if !name.is_empty() {
                    found.insert(name);
                }
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
        if from == "lib" || from == "main" {
            continue; // the crate's root declares the modules and sits above them all
        }
        let text = std::fs::read_to_string(&file).expect("read a source");
        let to: Vec<String> = references(&text).into_iter().filter(|m| *m != from).collect();
        edges.entry(from).or_default().extend(to);
    }
    // `crate::Communicator` and the like name re-exports at the root, not modules.
    let modules: BTreeSet<String> = edges.keys().cloned().collect();
    for to in edges.values_mut() {
        to.retain(|m| modules.contains(m));
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
    for (name, edges) in crates() {
        assert!(!edges.is_empty() || name == "xccl-c", "{name} has modules");
        for module in edges.keys() {
            if let Some(c) = cycle_through(&edges, module) {
                cycles.push(format!("{name}: {}", c.join(" -> ")));
            }
        }
    }
    assert!(cycles.is_empty(), "module cycles:\n{}", cycles.join("\n"));
}

/// The layer tables of `doc`: crate name, then its layers from the top.
fn layer_tables(doc: &str) -> BTreeMap<String, Vec<Vec<String>>> {
    let mut tables = BTreeMap::new();
    let mut lines = doc.lines();
    while let Some(line) = lines.next() {
        let Some(name) = line.strip_prefix("```layers ") else { continue };
        let layers = lines
            .by_ref()
            .take_while(|l| !l.starts_with("```"))
            .map(|l| l.split_whitespace().map(str::to_string).collect::<Vec<_>>())
            .filter(|l| !l.is_empty())
            .collect();
        tables.insert(name.trim().to_string(), layers);
    }
    tables
}

/// What is wrong with `layers` as the table of `edges`: modules missing or named twice or
/// unknown, imports that do not go down.
fn table_errors(edges: &BTreeMap<String, BTreeSet<String>>, layers: &[Vec<String>]) -> Vec<String> {
    let mut errors = Vec::new();
    let mut level = BTreeMap::new();
    for (i, layer) in layers.iter().enumerate() {
        for m in layer {
            if level.insert(m.clone(), i).is_some() {
                errors.push(format!("`{m}` is on two lines"));
            }
        }
    }
    for m in edges.keys().filter(|m| !level.contains_key(*m)) {
        errors.push(format!("`{m}` is missing"));
    }
    for m in level.keys().filter(|m| !edges.contains_key(*m)) {
        errors.push(format!("`{m}` is not a module"));
    }
    for (from, tos) in edges {
        for to in tos {
            if let (Some(a), Some(b)) = (level.get(from), level.get(to))
                && a >= b
            {
                errors.push(format!("`{from}` (line {}) imports `{to}` (line {})", a + 1, b + 1));
            }
        }
    }
    errors
}

/// The layers `edges` imply: each module one line above the highest it imports.
fn derived_table(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    fn height(
        m: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        memo: &mut BTreeMap<String, usize>,
    ) -> usize {
        if let Some(&h) = memo.get(m) {
            return h;
        }
        memo.insert(m.to_string(), 0); // cut a cycle; the other test reports it
        let h = edges.get(m).into_iter().flatten().map(|t| height(t, edges, memo) + 1).max().unwrap_or(0);
        memo.insert(m.to_string(), h);
        h
    }
    let mut memo = BTreeMap::new();
    let mut layers: Vec<Vec<String>> = Vec::new();
    for m in edges.keys() {
        let h = height(m, edges, &mut memo);
        if layers.len() <= h {
            layers.resize(h + 1, Vec::new());
        }
        layers[h].push(m.clone());
    }
    layers.reverse();
    layers
}

#[test]
fn the_layer_tables_match_the_module_graph() {
    let doc = std::fs::read_to_string(ARCHITECTURE).expect("docs/ARCHITECTURE.md");
    let tables = layer_tables(&doc);
    let mut wrong = Vec::new();
    for (name, edges) in crates().into_iter().filter(|(_, edges)| !edges.is_empty()) {
        let errors = match tables.get(&name) {
            Some(layers) => table_errors(&edges, layers),
            None => vec!["no table".to_string()],
        };
        if !errors.is_empty() {
            let derived: Vec<String> = derived_table(&edges).iter().map(|l| l.join(" ")).collect();
            wrong.push(format!(
                "{name}: {}\n  a table the sources allow:\n```layers {name}\n{}\n```",
                errors.join("; "),
                derived.join("\n")
            ));
        }
    }
    assert!(wrong.is_empty(), "docs/ARCHITECTURE.md's layer tables are out of date:\n{}", wrong.join("\n"));
}

#[test]
fn a_table_that_lets_an_import_go_up_is_wrong() {
    let edges: BTreeMap<String, BTreeSet<String>> = [
        ("a".to_string(), BTreeSet::from(["b".to_string()])),
        ("b".to_string(), BTreeSet::from(["c".to_string()])),
        ("c".to_string(), BTreeSet::new()),
    ]
    .into();
    let table = |t: &str| layer_tables(&format!("text\n```layers k\n{t}\n```\nmore"))["k"].clone();
    assert_eq!(table_errors(&edges, &table("a\nb\nc")), Vec::<String>::new());
    assert_eq!(derived_table(&edges), table("a\nb\nc"));
    assert_eq!(table_errors(&edges, &table("a\nb c")), ["`b` (line 2) imports `c` (line 2)"]);
    assert_eq!(table_errors(&edges, &table("b\na\nc")), ["`a` (line 2) imports `b` (line 1)"]);
    let errors = ["`c` is missing", "`d` is not a module", "`a` (line 1) imports `b` (line 1)"];
    assert_eq!(table_errors(&edges, &table("a b\nd")), errors);
}

#[test]
fn the_scan_sees_a_cycle_where_there_is_one() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("modgraph-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("b")).unwrap();
    std::fs::write(dir.join("a.rs"), "use crate::b::Thing; // crate::c in a comment\n").unwrap();
    std::fs::write(dir.join("b/mod.rs"), "pub fn f() { crate::a::g() }\n#[cfg(test)]\nuse crate::c;\n")
        .unwrap();
    std::fs::write(dir.join("c.rs"), "pub fn h() {}\n").unwrap();
    std::fs::write(dir.join("d.rs"), "use crate::{\n    c::{self, h},\n    e::Thing as F,\n};\n").unwrap();
    std::fs::write(dir.join("e.rs"), "pub struct Thing;\n").unwrap();
    let edges = graph(&dir);
    assert_eq!(edges["a"], BTreeSet::from(["b".to_string()]), "comments are left out");
    assert_eq!(edges["b"], BTreeSet::from(["a".to_string()]), "test modules are left out");
    assert_eq!(cycle_through(&edges, "a"), Some(vec!["a".into(), "b".into(), "a".into()]));
    assert_eq!(cycle_through(&edges, "c"), None);
    let grouped = BTreeSet::from(["c".to_string(), "e".to_string()]);
    assert_eq!(edges["d"], grouped, "grouped imports, over several lines, count");
    std::fs::remove_dir_all(&dir).unwrap();
}
