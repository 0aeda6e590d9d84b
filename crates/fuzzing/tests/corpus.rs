//! Replays every input checked in under `fuzz/corpus/<target>/` through its target, on
//! stable: what a fuzzer found once (and the inputs that reach deepest) stays passing.
//! A target with no corpus fails here, so that a new target cannot ship without one.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;

fn corpus_dir(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus").join(target)
}

#[test]
fn every_checked_in_input_passes_its_target() {
    let mut failures = Vec::new();
    let mut total = 0;
    for &(name, run) in softrdma_fuzzing::TARGETS {
        let dir = corpus_dir(name);
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}: every target needs a corpus (see fuzz/README.md)", dir.display()))
            .map(|e| e.expect("a directory entry").path())
            .collect();
        files.sort();
        assert!(!files.is_empty(), "{}: empty; every target needs a corpus", dir.display());
        for path in files {
            let data = std::fs::read(&path).expect("a corpus file");
            total += 1;
            if let Err(panic) = catch_unwind(AssertUnwindSafe(|| run(&data))) {
                let why = panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| panic.downcast_ref::<&str>().copied())
                    .unwrap_or("a panic");
                failures.push(format!("{name}: {}: {why}", path.display()));
            }
        }
    }
    assert!(failures.is_empty(), "{} of {total} inputs failed:\n{}", failures.len(), failures.join("\n"));
}
