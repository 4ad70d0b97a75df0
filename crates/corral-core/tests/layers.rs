//! The layering rule, checked from the module imports: within each crate, no source file
//! imports a file that imports it back (directly or through others), so every crate's files
//! form floors a reader can take bottom up.
//!
//! A file A depends on a file B when A names one of B's items through a path: `use crate::x::y`,
//! `crate::x::y::f(..)`, `super::y`, `self::y`, a child module's `y::z` (and `use` groups
//! `crate::{x, y::z}`). Each `mod.rs` / `lib.rs` is the file of its folder's module; a parent
//! naming its child counts as a dependency as much as a child naming its parent (`super::`).
//! Left out: tests (`tests/` folders, `tests.rs`, `#[cfg(test)] mod` blocks), re-exports
//! (`pub use`: a module's face, not a dependency), binaries under `src/bin/`, and the crate
//! root (`lib.rs`), which only declares and re-exports. `../shared/tools/circles` applies the
//! same rule from outside the project.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use crate::repo;
use repo::workspace_root;

type Module = Vec<String>;

/// The source files of a crate's library, by module path (`host::batch`), without tests,
/// binaries and the crate root.
fn source_files(src: &Path) -> BTreeMap<Module, PathBuf> {
    fn walk(dir: &Path, src: &Path, out: &mut BTreeMap<Module, PathBuf>) {
        let mut entries: Vec<_> = fs::read_dir(dir)
            .expect("read a source folder")
            .map(|e| e.expect("a folder entry").path())
            .collect();
        entries.sort();
        for path in entries {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                if name != "tests" && !(dir == src && name == "bin") {
                    walk(&path, src, out);
                }
                continue;
            }
            if !name.ends_with(".rs") || name == "tests.rs" {
                continue;
            }
            let rel = path.strip_prefix(src).unwrap().with_extension("");
            let mut module: Module = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if matches!(
                module.last().map(String::as_str),
                Some("mod" | "lib" | "main")
            ) {
                module.pop();
            }
            if !module.is_empty() {
                out.insert(module, path);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(src, src, &mut out);
    out
}

/// The text without comments and without `#[cfg(test)] mod name { … }` blocks (roughly, as a
/// reader skims: strings are not parsed, which the rule does not need).
fn strip(text: &str) -> String {
    let uncommented: String = text
        .lines()
        .map(|line| match line.find("//") {
            Some(at) if !line[..at].contains('"') => &line[..at],
            _ => line,
        })
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = String::new();
    let mut rest = uncommented.as_str();
    while let Some(at) = rest.find("#[cfg(test)]") {
        let after = &rest[at + "#[cfg(test)]".len()..];
        let trimmed = after.trim_start();
        let trimmed = trimmed.strip_prefix("pub ").unwrap_or(trimmed).trim_start();
        let is_module = trimmed.starts_with("mod ") && {
            let head = &trimmed[..trimmed.find(['{', ';']).unwrap_or(trimmed.len())];
            trimmed[head.len()..].starts_with('{')
        };
        if !is_module {
            out.push_str(&rest[..at + "#[cfg(test)]".len()]);
            rest = after;
            continue;
        }
        out.push_str(&rest[..at]);
        let open = after.find('{').unwrap();
        let end = closing_brace(after, open).map_or(after.len(), |close| close + 1);
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// Where the `}` closing the `{` at `open` stands in `text`, if it does.
fn closing_brace(text: &str, open: usize) -> Option<usize> {
    let mut depth = 0usize;
    for (i, c) in text[open..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(open + i);
                }
            }
            _ => {}
        }
    }
    None
}

/// `crate::{a, b::{c, d}}` → `crate::a`, `crate::b::c`, `crate::b::d`.
fn expand_use(tree: &str) -> Vec<String> {
    let tree: String = tree.chars().filter(|c| !c.is_whitespace()).collect();
    let Some(open) = tree.find("::{") else {
        return vec![tree];
    };
    if !tree.ends_with('}') {
        return vec![tree];
    }
    let prefix = &tree[..open];
    let inner = &tree[open + 3..tree.len() - 1];
    let (mut parts, mut depth, mut current) = (Vec::new(), 0i32, String::new());
    for c in inner.chars() {
        match c {
            ',' if depth == 0 => parts.push(std::mem::take(&mut current)),
            '{' => {
                depth += 1;
                current.push(c);
            }
            '}' => {
                depth -= 1;
                current.push(c);
            }
            _ => current.push(c),
        }
    }
    parts.push(current);
    parts
        .into_iter()
        .filter(|p| !p.is_empty())
        .flat_map(|p| match p.as_str() {
            "self" => vec![prefix.to_owned()],
            _ => expand_use(&format!("{prefix}::{p}")),
        })
        .collect()
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Every `a::b::c` path in `text` that starts at an identifier boundary.
fn paths(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let boundary = i == 0 || !(is_ident(chars[i - 1]) || chars[i - 1] == ':');
        if !(boundary && (chars[i].is_ascii_alphabetic() || chars[i] == '_')) {
            i += 1;
            continue;
        }
        let mut j = i;
        let mut path = String::new();
        loop {
            let start = j;
            while j < chars.len() && is_ident(chars[j]) {
                j += 1;
            }
            path.extend(&chars[start..j]);
            if j + 2 < chars.len()
                && chars[j] == ':'
                && chars[j + 1] == ':'
                && (is_ident(chars[j + 2]))
            {
                path.push_str("::");
                j += 2;
            } else {
                break;
            }
        }
        if path.contains("::") {
            out.push(path);
        }
        i = j.max(i + 1);
    }
    out
}

/// The paths a file names: its private `use` trees, expanded, and paths written in its code.
fn references(text: &str) -> Vec<String> {
    let mut refs = Vec::new();
    let mut code = String::new();
    let mut rest = text;
    while let Some(at) = rest.find("use ") {
        let before = &rest[..at];
        let boundary = before
            .chars()
            .last()
            .is_none_or(|c| !is_ident(c) && c != ':');
        let Some(end) = rest[at..].find(';') else {
            break;
        };
        if !boundary {
            code.push_str(&rest[..at + 4]);
            rest = &rest[at + 4..];
            continue;
        }
        let line_start = before.rfind(['\n', ';', '{', '}']).map_or(0, |p| p + 1);
        let is_reexport = before[line_start..].trim_start().starts_with("pub");
        code.push_str(&before[..line_start]);
        if !is_reexport {
            refs.extend(expand_use(&rest[at + 4..at + end]));
        }
        rest = &rest[at + end + 1..];
    }
    code.push_str(rest);
    refs.extend(paths(&code));
    refs
}

/// The text split by inline modules (`mod wall { … }`): the file's own text with their bodies
/// left out, then each body with its path below the file's module (nested ones too), so that
/// `super::` inside one is resolved from where it is written.
fn inline_modules(text: &str) -> Vec<(Vec<String>, String)> {
    let mut own = String::new();
    let mut inner = Vec::new();
    let mut rest = text;
    loop {
        let found = rest.match_indices("mod ").find(|(at, _)| {
            let boundary = rest[..*at]
                .chars()
                .last()
                .is_none_or(|c| c.is_whitespace() || c == ')' || c == ';' || c == '}');
            let after = &rest[at + 4..];
            let name_len = after.chars().take_while(|c| is_ident(*c)).count();
            boundary && name_len > 0 && after[name_len..].trim_start().starts_with('{')
        });
        let Some((at, _)) = found else {
            own.push_str(rest);
            break;
        };
        own.push_str(&rest[..at]);
        let after = &rest[at + 4..];
        let name: String = after.chars().take_while(|c| is_ident(*c)).collect();
        let open = after.find('{').unwrap();
        let end = closing_brace(after, open).unwrap_or(after.len());
        for (mut path, body) in inline_modules(&after[open + 1..end]) {
            path.insert(0, name.clone());
            inner.push((path, body));
        }
        rest = &after[(end + 1).min(after.len())..];
    }
    let mut out = vec![(Vec::new(), own)];
    out.extend(inner);
    out
}

/// Which file each file depends on, with the names that tie them.
fn dependencies(
    files: &BTreeMap<Module, PathBuf>,
) -> BTreeMap<Module, BTreeMap<Module, BTreeSet<String>>> {
    let owner = |path: &[String]| -> Option<Module> {
        (1..=path.len())
            .rev()
            .map(|n| path[..n].to_vec())
            .find(|m| files.contains_key(m))
    };
    let mut edges: BTreeMap<Module, BTreeMap<Module, BTreeSet<String>>> = BTreeMap::new();
    for (module, path) in files {
        let text = strip(&fs::read_to_string(path).expect("read a source file"));
        let children: BTreeSet<&str> = files
            .keys()
            .filter(|m| m.len() == module.len() + 1 && m.starts_with(module))
            .map(|m| m.last().unwrap().as_str())
            .collect();
        for (inline, text) in inline_modules(&text) {
            let here: Module = module.iter().chain(&inline).cloned().collect();
            for reference in references(&text) {
                let segments: Vec<&str> = reference.split("::").filter(|s| !s.is_empty()).collect();
                let target: Vec<String> = match segments[0] {
                    "crate" => segments[1..].iter().map(|s| s.to_string()).collect(),
                    "self" | "super" => {
                        let mut base = here.clone();
                        let mut rest = &segments[..];
                        while let Some((&first, tail)) = rest.split_first() {
                            match first {
                                "self" => {}
                                "super" => {
                                    base.pop();
                                }
                                _ => break,
                            }
                            rest = tail;
                        }
                        base.extend(rest.iter().map(|s| s.to_string()));
                        base
                    }
                    first if inline.is_empty() && children.contains(first) => {
                        let mut base = module.clone();
                        base.extend(segments.iter().map(|s| s.to_string()));
                        base
                    }
                    _ => continue,
                };
                let Some(target) = owner(&target) else {
                    continue;
                };
                if &target == module {
                    continue;
                }
                let name = segments.last().unwrap().to_string();
                edges
                    .entry(module.clone())
                    .or_default()
                    .entry(target)
                    .or_default()
                    .insert(name);
            }
        }
    }
    edges
}

/// The strongly connected components of more than one file (Tarjan's algorithm).
fn circles(
    nodes: &[Module],
    edges: &BTreeMap<Module, BTreeMap<Module, BTreeSet<String>>>,
) -> Vec<Vec<Module>> {
    struct Walk<'a> {
        edges: &'a BTreeMap<Module, BTreeMap<Module, BTreeSet<String>>>,
        index: BTreeMap<Module, usize>,
        low: BTreeMap<Module, usize>,
        stack: Vec<Module>,
        on_stack: BTreeSet<Module>,
        out: Vec<Vec<Module>>,
    }
    impl Walk<'_> {
        fn visit(&mut self, v: &Module) {
            let n = self.index.len();
            self.index.insert(v.clone(), n);
            self.low.insert(v.clone(), n);
            self.stack.push(v.clone());
            self.on_stack.insert(v.clone());
            let next: Vec<Module> = self
                .edges
                .get(v)
                .map(|e| e.keys().cloned().collect())
                .unwrap_or_default();
            for w in next {
                if !self.index.contains_key(&w) {
                    self.visit(&w);
                    let low = self.low[v].min(self.low[&w]);
                    self.low.insert(v.clone(), low);
                } else if self.on_stack.contains(&w) {
                    let low = self.low[v].min(self.index[&w]);
                    self.low.insert(v.clone(), low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                loop {
                    let w = self.stack.pop().unwrap();
                    self.on_stack.remove(&w);
                    let done = &w == v;
                    component.push(w);
                    if done {
                        break;
                    }
                }
                if component.len() > 1 {
                    self.out.push(component);
                }
            }
        }
    }
    let mut walk = Walk {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in nodes {
        if !walk.index.contains_key(v) {
            walk.visit(v);
        }
    }
    walk.out
}

fn report(crate_dir: &Path) -> Vec<String> {
    let src = crate_dir.join("src");
    let files = source_files(&src);
    let edges = dependencies(&files);
    let nodes: Vec<Module> = files.keys().cloned().collect();
    let name = |m: &Module| {
        files[m]
            .strip_prefix(crate_dir)
            .unwrap()
            .display()
            .to_string()
    };
    circles(&nodes, &edges)
        .into_iter()
        .map(|component| {
            let members: BTreeSet<&Module> = component.iter().collect();
            let mut lines = vec![format!(
                "circle in {}: {} files",
                crate_dir.file_name().unwrap().to_string_lossy(),
                component.len()
            )];
            for a in &component {
                for (b, names) in &edges[a] {
                    if members.contains(b) {
                        let names: Vec<&str> = names.iter().map(String::as_str).take(6).collect();
                        lines.push(format!(
                            "  {} -> {}: {}",
                            name(a),
                            name(b),
                            names.join(", ")
                        ));
                    }
                }
            }
            lines.join("\n")
        })
        .collect()
}

#[test]
fn no_file_imports_a_file_that_imports_it_back() {
    let crates = workspace_root().join("crates");
    let mut dirs: Vec<PathBuf> = fs::read_dir(&crates)
        .expect("read crates/")
        .map(|e| e.expect("an entry").path())
        .filter(|p| p.join("src").is_dir())
        .collect();
    dirs.sort();
    assert!(dirs.len() > 10, "found only {} crates", dirs.len());
    let found: Vec<String> = dirs.iter().flat_map(|d| report(d)).collect();
    assert!(
        found.is_empty(),
        "import circles between files (move the shared item down to a file both can import):\n{}",
        found.join("\n")
    );
}

/// The checker itself: a parent and child that name each other are a circle, a re-export is
/// not, and the paths of `use` groups and `super::` (in a file or an inline module) are
/// resolved as Rust resolves them.
#[test]
fn the_checker_sees_the_ties_rust_has() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    fs::create_dir_all(src.join("host")).unwrap();
    fs::write(src.join("lib.rs"), "pub mod host;\npub mod leaf;\n").unwrap();
    fs::write(src.join("leaf.rs"), "//! leaf\npub struct E;\n").unwrap();
    fs::write(
        src.join("host/mod.rs"),
        "mod batch;\nmod wire;\npub use wire::Api;\nuse batch::{self, Write};\npub struct Host;\n",
    )
    .unwrap();
    fs::write(
        src.join("host/batch.rs"),
        "use super::{Host, wire::Api};\nuse crate::leaf::E; // crate::host::mod\npub struct Write;\n",
    )
    .unwrap();
    fs::write(
        src.join("host/wire.rs"),
        "pub struct Api;\npub(crate) mod at {\n    use super::Api;\n}\n\
         #[cfg(test)]\nmod tests {\n    use super::super::Host;\n}\n",
    )
    .unwrap();
    let files = source_files(&src);
    let edges = dependencies(&files);
    let module = |s: &str| s.split("::").map(str::to_owned).collect::<Module>();
    let batch = &edges[&module("host::batch")];
    assert_eq!(
        batch.keys().cloned().collect::<Vec<_>>(),
        vec![module("host"), module("host::wire"), module("leaf")]
    );
    assert_eq!(
        edges[&module("host")].keys().cloned().collect::<Vec<_>>(),
        vec![module("host::batch")],
        "the re-export of wire is not a dependency"
    );
    assert!(
        !edges.contains_key(&module("host::wire")),
        "tests are left out"
    );
    let nodes: Vec<Module> = files.keys().cloned().collect();
    let found = circles(&nodes, &edges);
    assert_eq!(found.len(), 1);
    let mut members = found[0].clone();
    members.sort();
    assert_eq!(members, vec![module("host"), module("host::batch")]);
}
