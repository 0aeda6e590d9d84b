//! The drop-in libraries of this build, in a directory of their own (`libibverbs.so.1`,
//! `librdmacm.so.1`, `libmlx5.so.1` and `libefa.so.1`), for tests that run C
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
    // librdmacm.so.1 (softrdma-rdmacm) and the provider stand-ins (softrdma-dv, -dv-efa) are
    // cdylibs no test depends on: `cargo test` does not build them, so this does, with the
    // same profile (its output lands next to the libibverbs.so.1 found above).
    let profile_dir = built.parent().unwrap();
    let profile_dir = if profile_dir.ends_with("deps") { profile_dir.parent().unwrap() } else { profile_dir };
    let mut cargo = Command::new(env!("CARGO"));
    cargo.args(["build", "-q", "-p", "softrdma-rdmacm", "-p", "softrdma-dv", "-p", "softrdma-dv-efa"]);
    if profile_dir.ends_with("release") {
        cargo.arg("--release");
    }
    let status = cargo.status().expect("running cargo build -p softrdma-rdmacm -p softrdma-dv -p softrdma-dv-efa");
    assert!(status.success(), "cargo build -p softrdma-rdmacm -p softrdma-dv -p softrdma-dv-efa failed");
    let rdmacm = newest("libsoftrdma_rdmacm.so");
    if let Some(r) = &rdmacm {
        std::fs::copy(r, path.join("librdmacm.so.1")).unwrap();
    }
    // The provider stand-ins perftest, libfabric, UCX and pyverbs link.
    let mlx5 = newest("libsoftrdma_dv.so");
    let efa = newest("libsoftrdma_dv_efa.so");
    if let (Some(m), Some(e)) = (&mlx5, &efa) {
        std::fs::copy(m, path.join("libmlx5.so.1")).unwrap();
        std::fs::copy(e, path.join("libefa.so.1")).unwrap();
    }
    LibDir { path, rdmacm: rdmacm.is_some(), dv: mlx5.is_some() && efa.is_some() }
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

/// Runs a command; its standard output, or what failed.
pub(crate) fn run(args: &[&str]) -> Result<String, String> {
    let out = Command::new(args[0]).args(&args[1..]).output().map_err(|e| format!("{}: {e}", args[0]))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!("{}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// Compiles `tests/c/<name>.c` against rdma-core's headers and the libraries in `lib`, into
/// `lib`, linking them by their sonames as a program built against rdma-core and run with
/// LD_LIBRARY_PATH would; the program, or `None` having said why not (no compiler, no
/// headers).
pub(crate) fn build_c(name: &str, lib: &Path) -> Option<PathBuf> {
    for header in ["/usr/include/infiniband/verbs.h", "/usr/include/rdma/rdma_cma.h"] {
        if !Path::new(header).exists() {
            eprintln!("SKIP: {header} is missing (apt-get install libibverbs-dev librdmacm-dev)");
            return None;
        }
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"));
    let exe = lib.join(name);
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = match Command::new(&cc)
        .args(["-std=gnu11", "-Wall", "-Werror", "-pthread", "-o"])
        .arg(&exe)
        .arg(&src)
        .arg(format!("-L{}", lib.display()))
        .args(["-l:librdmacm.so.1", "-l:libibverbs.so.1"])
        .status()
    {
        Ok(s) => s,
        Err(e) => {
            eprintln!("SKIP: no C compiler ({cc}: {e})");
            return None;
        }
    };
    assert!(status.success(), "{cc} failed to build {}", src.display());
    Some(exe)
}

/// Two network namespaces (two hosts) joined by a veth pair, veth end `ifaces[i]` in
/// namespace `names[i]`, up, with `lo` up and no address but those the test adds (no
/// automatic link-local one); removed on drop.
pub(crate) struct NetnsPair {
    pub(crate) names: [String; 2],
    pub(crate) ifaces: [&'static str; 2],
}

impl NetnsPair {
    /// The pair for test `tag` (names unique per process and tag), or `None` having said
    /// why this process may not make namespaces (not root, a container without the
    /// capability, no `ip`): the environment, for the caller to skip on. A later step
    /// failing panics.
    pub(crate) fn create_or_skip(tag: &str, ifaces: [&'static str; 2]) -> Option<NetnsPair> {
        if !run(&["id", "-u"]).is_ok_and(|u| u.trim() == "0") {
            eprintln!("SKIP: creating network namespaces needs root");
            return None;
        }
        let names = ["a", "b"].map(|side| format!("srdma-{}-{tag}-{side}", std::process::id() % 100_000));
        for n in &names {
            let _ = run(&["ip", "netns", "del", n]);
        }
        if let Err(e) = run(&["ip", "netns", "add", &names[0]]) {
            eprintln!("SKIP: `ip netns add` is not possible here: {e}");
            return None;
        }
        let pair = NetnsPair { names, ifaces };
        let step = |args: &[&str]| run(args).unwrap_or_else(|e| panic!("building two namespaces joined by veth: {e}"));
        let [a, b] = [&pair.names[0], &pair.names[1]];
        step(&["ip", "netns", "add", b]);
        // Made inside the namespaces: the names cannot meet another test's.
        step(&["ip", "link", "add", ifaces[0], "netns", a, "type", "veth", "peer", ifaces[1], "netns", b]);
        for (n, dev) in pair.names.iter().zip(ifaces) {
            step(&["ip", "-n", n, "link", "set", "lo", "up"]);
            step(&["ip", "-n", n, "link", "set", dev, "addrgenmode", "none"]);
            step(&["ip", "-n", n, "link", "set", dev, "up"]);
        }
        Some(pair)
    }

    /// Adds `cidr` to side `i`'s veth end. IPv6 addresses skip duplicate address detection
    /// (bindable at once); they are added once the link is up (as it is here): one added
    /// before answers no neighbour solicitation for about a second.
    pub(crate) fn add_address(&self, i: usize, cidr: &str) {
        let mut args = vec!["ip", "-n", &self.names[i], "addr", "add", cidr, "dev", self.ifaces[i]];
        if cidr.contains(':') {
            args.push("nodad");
        }
        run(&args).unwrap_or_else(|e| panic!("{e}"));
    }
}

impl Drop for NetnsPair {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = Command::new("ip").args(["netns", "del", n]).output();
        }
    }
}
