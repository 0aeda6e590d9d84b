//! The drop-in libraries of this build, in a directory of their own (`libibverbs.so.1`,
//! `librdmacm.so.1`, `libmlx5.so.1` and its `libefa.so.1` symlink), for tests that run C
//! programs over them.

// Each test binary uses part of this.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// A temporary directory holding the libraries; removed on drop.
pub(crate) struct LibDir {
    pub(crate) path: PathBuf,
    /// librdmacm.so.1 is there.
    pub(crate) rdmacm: bool,
    /// The provider stand-ins are there.
    pub(crate) dv: bool,
}

impl Drop for LibDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Builds what `cargo test` did not and gathers the libraries into `tag`'s directory.
pub(crate) fn lib_dir(tag: &str) -> LibDir {
    // The cdylib cargo built for this test: next to it in target/<profile>/deps when `cargo
    // test` built the library as the test's dependency, in target/<profile> after a `cargo
    // build`; the newer one is this build's.
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap().to_path_buf();
    let newest = |name: &str| newest_of(&[deps.join(name), deps.parent().unwrap().join(name)]);
    let built = newest("libsoftrdma_ibverbs.so")
        .unwrap_or_else(|| panic!("libsoftrdma_ibverbs.so was not built next to {}", exe.display()));
    let path = std::env::temp_dir().join(format!("softrdma-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&path).unwrap();
    std::fs::copy(&built, path.join("libibverbs.so.1")).unwrap();
    // librdmacm.so.1 (softrdma-rdmacm) and the provider stand-ins (softrdma-dv) are
    // cdylibs no test depends on: `cargo test` does not build them, so this does, with the
    // same profile (its output lands next to the libibverbs.so.1 found above).
    let profile_dir = built.parent().unwrap();
    let profile_dir = if profile_dir.ends_with("deps") { profile_dir.parent().unwrap() } else { profile_dir };
    let mut cargo = Command::new(env!("CARGO"));
    cargo.args(["build", "-q", "-p", "softrdma-rdmacm", "-p", "softrdma-dv"]);
    if profile_dir.ends_with("release") {
        cargo.arg("--release");
    }
    let status = cargo.status().expect("running cargo build -p softrdma-rdmacm -p softrdma-dv");
    assert!(status.success(), "cargo build -p softrdma-rdmacm -p softrdma-dv failed");
    let rdmacm = newest("libsoftrdma_rdmacm.so");
    if let Some(r) = &rdmacm {
        std::fs::copy(r, path.join("librdmacm.so.1")).unwrap();
    }
    // The provider stand-ins perftest links (softrdma-dv): one object, two names.
    let dv = newest("libsoftrdma_dv.so");
    if let Some(d) = &dv {
        std::fs::copy(d, path.join("libmlx5.so.1")).unwrap();
        std::os::unix::fs::symlink("libmlx5.so.1", path.join("libefa.so.1")).unwrap();
    }
    LibDir { path, rdmacm: rdmacm.is_some(), dv: dv.is_some() }
}

fn newest_of(paths: &[PathBuf]) -> Option<PathBuf> {
    paths
        .iter()
        .filter_map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok().map(|t| (t, p.clone())))
        .max()
        .map(|(_, p)| p)
}

/// Whether `program` is on the PATH.
pub(crate) fn installed(program: &str) -> bool {
    Command::new("sh").args(["-c", &format!("command -v {program}")]).output().is_ok_and(|o| o.status.success())
}

/// The repository's root.
pub(crate) fn repo() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// Two network namespaces (two hosts) joined by a veth pair, [`Netns::ADDRS`] on its ends,
/// `lo` up in each; removed on drop.
pub(crate) struct Netns {
    pub(crate) names: [String; 2],
}

impl Netns {
    /// The first namespace's address, then the second's.
    pub(crate) const ADDRS: [&'static str; 2] = ["10.77.0.1", "10.77.0.2"];

    /// Namespaces `srdma-TAG-a` and `-b`. `Err(why)` where this process may not make
    /// namespaces (not root, a container without the capability, no `ip`): the
    /// environment, for the caller to skip on. A later step failing panics.
    pub(crate) fn create(tag: &str) -> Result<Netns, String> {
        let names = [format!("srdma-{tag}-a"), format!("srdma-{tag}-b")];
        let run = |args: &[&str]| -> Result<(), String> {
            let out = Command::new(args[0]).args(&args[1..]).output().map_err(|e| format!("{}: {e}", args[0]))?;
            if out.status.success() {
                Ok(())
            } else {
                Err(format!("{}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
            }
        };
        let _ = run(&["ip", "netns", "del", &names[0]]);
        run(&["ip", "netns", "add", &names[0]]).map_err(|e| format!("cannot make a network namespace ({e})"))?;
        let ns = Netns { names: names.clone() };
        let _ = run(&["ip", "netns", "del", &names[1]]);
        let step = |args: &[&str]| run(args).unwrap_or_else(|e| panic!("building two namespaces joined by veth: {e}"));
        step(&["ip", "netns", "add", &names[1]]);
        // Made inside the namespaces: the names cannot meet another test's.
        step(&[
            "ip", "link", "add", "srdma-va", "netns", &names[0], "type", "veth", "peer", "srdma-vb", "netns", &names[1],
        ]);
        for (n, dev, addr) in [(&names[0], "srdma-va", Self::ADDRS[0]), (&names[1], "srdma-vb", Self::ADDRS[1])] {
            step(&["ip", "-n", n, "link", "set", "lo", "up"]);
            step(&["ip", "-n", n, "addr", "add", &format!("{addr}/24"), "dev", dev]);
            step(&["ip", "-n", n, "link", "set", dev, "up"]);
        }
        Ok(ns)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = Command::new("ip").args(["netns", "del", n]).output();
        }
    }
}
