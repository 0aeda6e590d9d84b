//! Links `librdmacm.so` with rdma-core's soname and version nodes, and with a
//! `DT_NEEDED libibverbs.so.1` whose `softrdma_rdmacm_*@SOFTRDMA_PRIVATE_1` functions its
//! exports jump to.
//!
//! - symbols.txt lists every function Debian's librdmacm.so.1 exports, with its node.
//! - `forward.rs` (generated): for each, `rdma_x@@RDMACM_1.y` is `jmp
//!   softrdma_rdmacm_rdma_x@PLT`, in one `global_asm!` (the `.symver` route of
//!   crates/ibverbs/src/export.rs; the version script here only declares the nodes).
//! - The link needs a `libibverbs.so.1` that defines those targets at their version; the
//!   real one is another crate's cdylib, which cargo cannot order before this link. So
//!   this script compiles a stand-in with `cc` (every target an empty function, the same
//!   soname and node) and links against it: the loader then binds the references to the
//!   real `libibverbs.so.1` that `LD_LIBRARY_PATH` finds, and fails at load time (BIND_NOW
//!   programs) if it lacks one, which tests/conformance/run.sh would show.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;

const NODES: &[&str] = &["RDMACM_1.0", "RDMACM_1.1", "RDMACM_1.2", "RDMACM_1.3"];

#[path = "../ibverbs/nodes.rs"]
mod nodes;

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let list = std::fs::read_to_string("symbols.txt").expect("reading symbols.txt");
    let symbols: Vec<(&str, &str)> = list
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| l.split_once(' ').expect("symbols.txt: `name node` per line"))
        .collect();

    // This library's version nodes, each inheriting the one before.
    let map = nodes::declare(&[NODES], &[]);
    std::fs::write(out.join("librdmacm.map"), map).expect("writing the version script");

    // The forwarders.
    let mut asm = String::from("::core::arch::global_asm!(\n");
    for (name, node) in &symbols {
        assert!(NODES.contains(node), "symbols.txt: unknown node {node}");
        for line in [
            format!(".globl {name}"),
            format!(".type {name},@function"),
            format!("{name}:"),
            format!("jmp softrdma_rdmacm_{name}@PLT"),
            format!(".size {name}, . - {name}"),
            format!(".symver {name}, {name}@@{node}"),
        ] {
            writeln!(asm, "    \"{line}\",").expect("writing to a String");
        }
    }
    asm.push_str(");\n");
    std::fs::write(out.join("forward.rs"), asm).expect("writing forward.rs");

    // The stand-in libibverbs.so.1 to link against.
    let stub = out.join("stub");
    std::fs::create_dir_all(&stub).expect("creating the stub directory");
    let mut c = String::new();
    let mut vs = String::from("SOFTRDMA_PRIVATE_1 {\n  global:\n");
    for (name, _) in &symbols {
        writeln!(c, "void softrdma_rdmacm_{name}(void) {{}}").expect("writing to a String");
        writeln!(vs, "    softrdma_rdmacm_{name};").expect("writing to a String");
    }
    vs.push_str("  local: *;\n};\n");
    std::fs::write(stub.join("stub.c"), c).expect("writing stub.c");
    std::fs::write(stub.join("stub.map"), vs).expect("writing stub.map");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args(["-shared", "-fPIC", "-o"])
        .arg(stub.join("libibverbs.so"))
        .arg(stub.join("stub.c"))
        .arg(format!("-Wl,--version-script={}", stub.join("stub.map").display()))
        .arg("-Wl,-soname,libibverbs.so.1")
        .status()
        .unwrap_or_else(|e| panic!("running {cc} to build the stand-in libibverbs.so: {e}"));
    assert!(status.success(), "{cc} failed to build the stand-in libibverbs.so");

    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={}", out.join("librdmacm.map").display());
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,librdmacm.so.1");
    println!("cargo:rustc-cdylib-link-arg=-L{}", stub.display());
    println!("cargo:rustc-cdylib-link-arg=-Wl,--no-as-needed");
    println!("cargo:rustc-cdylib-link-arg=-libverbs");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=symbols.txt");
    println!("cargo:rerun-if-changed=../ibverbs/nodes.rs");
}
