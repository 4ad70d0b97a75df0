//! The corpus replay of the fuzz targets on stable Rust, included (`#[path]`) by the
//! `tests/main.rs` of each crate that has targets for its `tests/fuzz_corpus.rs`, so `cargo
//! test` (and `make test`) runs every committed input through its target's function:
//! `fuzz/corpus/<target>/` (seeds and kept finds) and `fuzz/regressions/<target>/` (inputs that
//! once crashed).

use std::path::{Path, PathBuf};

/// The repository's `fuzz/` directory.
fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let Ok(listing) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = listing
        .map(|entry| entry.expect("a readable fuzz directory").path())
        .filter(|path| path.is_file())
        .collect();
    files.sort();
    files
}

/// Names the input being replayed if its target panics on it.
struct Replaying<'a>(&'a Path);

impl Drop for Replaying<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("the fuzz input {} panicked", self.0.display());
        }
    }
}

/// Runs `run` over every committed input of `target`; its corpus must hold at least one.
pub fn replay(target: &str, run: fn(&[u8])) {
    let fuzz = fuzz_dir();
    let source = fuzz.join("fuzz_targets").join(format!("{target}.rs"));
    assert!(source.is_file(), "no fuzz target {}", source.display());
    let corpus = files(&fuzz.join("corpus").join(target));
    assert!(!corpus.is_empty(), "fuzz/corpus/{target}/ holds no input");
    let regressions = files(&fuzz.join("regressions").join(target));
    for path in corpus.iter().chain(&regressions) {
        let data = std::fs::read(path).expect("a readable fuzz input");
        let _named = Replaying(path);
        run(&data);
    }
}

/// The tests of a crate's `tests/fuzz_corpus.rs`, from its entries `target => function`: one
/// test per target, named after it, replaying its inputs through the function the target
/// calls; and `every_fuzz_target_is_replayed`.
macro_rules! replay_tests {
    ($($target:ident => $run:path),* $(,)?) => {
        $(
            #[test]
            fn $target() {
                $crate::replay::replay(stringify!($target), $run);
            }
        )*

        #[test]
        fn every_fuzz_target_is_replayed() {
            $crate::replay::every_target_is_replayed();
        }
    };
}

/// Every target in `fuzz/fuzz_targets/` is replayed by some crate's `tests/fuzz_corpus.rs` (an
/// entry of its `replay_tests!`).
pub fn every_target_is_replayed() {
    let fuzz = fuzz_dir();
    let crates = fuzz.join("../crates");
    let replays: Vec<String> = std::fs::read_dir(&crates)
        .expect("the crates directory")
        .map(|entry| entry.expect("a crate").path().join("tests/fuzz_corpus.rs"))
        .filter_map(|path| std::fs::read_to_string(path).ok())
        .collect();
    for target in files(&fuzz.join("fuzz_targets")) {
        let name = target
            .file_stem()
            .and_then(|s| s.to_str())
            .expect("a target's name");
        let entry = format!("{name} =>");
        assert!(
            replays.iter().any(|text| text.contains(&entry)),
            "fuzz target {name} is replayed by no crate's tests/fuzz_corpus.rs"
        );
    }
}
