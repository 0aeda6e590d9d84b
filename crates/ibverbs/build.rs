//! Links `libibverbs.so` with rdma-core's soname and version nodes.
//!
//! The nodes are declared empty here: each symbol gets its version from a `.symver`
//! directive next to its definition (`export!` in src/export.rs). rustc passes its own
//! anonymous version script for a cdylib, which would win over named nodes listing the
//! symbols (they would stay unversioned); a symbol named `name@@NODE` by the assembler keeps
//! its version.

/// rdma-core's libibverbs version nodes, oldest first, each inheriting the one before.
const NODES: &[&str] = &[
    "IBVERBS_1.0",
    "IBVERBS_1.1",
    "IBVERBS_1.5",
    "IBVERBS_1.6",
    "IBVERBS_1.7",
    "IBVERBS_1.8",
    "IBVERBS_1.9",
    "IBVERBS_1.10",
    "IBVERBS_1.11",
    "IBVERBS_1.12",
    "IBVERBS_1.13",
    "IBVERBS_1.14",
];

#[path = "nodes.rs"]
mod nodes;

fn main() {
    let out = std::path::PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let map = out.join("libibverbs.map");
    // The provider-private node: ibv_devinfo imports ibv_query_gid_type from it.
    // softrdma's own: the rdma_* implementations librdmacm.so.1 (crates/rdmacm) jumps to,
    // so that both libraries share this one runtime (softrdma_rdmacm_<name>).
    let text = nodes::declare(&[NODES], &["IBVERBS_PRIVATE_34", "SOFTRDMA_PRIVATE_1"]);
    std::fs::write(&map, text).expect("writing the version script");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={}", map.display());
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libibverbs.so.1");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=nodes.rs");
}
