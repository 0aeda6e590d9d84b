//! Links the stand-in with the soname `libmlx5.so.1` and declares the version nodes its
//! functions carry (`mlx5dv_create_qp@@MLX5_1.3`, `efadv_query_device@@EFA_1.1`, ...);
//! each symbol gets its node from a `.symver` directive next to its definition
//! (src/lib.rs), as in crates/ibverbs.

/// rdma-core's libmlx5 nodes up to the newest perftest imports, each inheriting the one
/// before, then libefa's.
const MLX5_NODES: std::ops::RangeInclusive<u32> = 0..=21;
const EFA_NODES: &[&str] = &["EFA_1.0", "EFA_1.1"];

#[path = "../ibverbs/nodes.rs"]
mod nodes;

fn main() {
    let out = std::path::PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let map = out.join("dv.map");
    let mlx5: Vec<String> = MLX5_NODES.map(|n| format!("MLX5_1.{n}")).collect();
    let mlx5: Vec<&str> = mlx5.iter().map(String::as_str).collect();
    std::fs::write(&map, nodes::declare(&[&mlx5, EFA_NODES], &[])).expect("writing the version script");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={}", map.display());
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libmlx5.so.1");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=../ibverbs/nodes.rs");
}
