//! Generates one provider stand-in from its symbol list: `softrdma-dv` is `libmlx5.so.1`
//! (mlx5.symbols), `softrdma-dv-efa` (crates/dv-efa, the same sources) is `libefa.so.1`
//! (efa.symbols). scripts/gen-dv-symbols writes the lists from Debian's real libraries and
//! the programs that link them.
//!
//! - The version script declares the list's nodes, each with the parent it inherits, as
//!   the real library does; the nodes list no symbols (rustc's own anonymous version script
//!   for a cdylib would beat them, crates/ibverbs/nodes.rs).
//! - `exports.rs` (included by src/lib.rs): one `global_asm!` in which each function is a
//!   `jmp` to the Rust function answering "not supported" for its return type, named with
//!   `.symver name, name@@NODE`; a compatibility version (`mlx5dv_init_obj@MLX5_1.0` beside
//!   `@@MLX5_1.2`) is a second label, `name@NODE`.

use std::fmt::Write as _;
use std::path::PathBuf;

/// The Rust function (src/lib.rs) each return kind of the list jumps to.
const KINDS: &[(&str, &str)] = &[
    ("ptr", "null_not_supported"),
    ("int", "errno_not_supported"),
    ("bool", "false_not_supported"),
    ("minus1", "minus_one_not_supported"),
    ("void", "nothing"),
];

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let package = std::env::var("CARGO_PKG_NAME").expect("cargo sets CARGO_PKG_NAME");
    let (list, soname) = match package.as_str() {
        "softrdma-dv" => ("mlx5.symbols", "libmlx5.so.1"),
        "softrdma-dv-efa" => ("efa.symbols", "libefa.so.1"),
        other => panic!("crates/dv/build.rs builds softrdma-dv or softrdma-dv-efa, not {other}"),
    };
    // crates/dv/../dv or crates/dv-efa/../dv: the lists live in crates/dv.
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let path = manifest.join("../dv").join(list);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));

    let mut map = String::new();
    let mut asm = String::new();
    let mut used = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        match fields.as_slice() {
            ["node", node] => writeln!(map, "{node} {{ }};"),
            ["node", node, parent] => writeln!(map, "{node} {{ }} {parent};"),
            [versioned, kind] => {
                let (f, default, node) = match versioned.split_once("@@") {
                    Some((f, node)) => (f, true, node),
                    None => {
                        let (f, node) = versioned
                            .split_once('@')
                            .unwrap_or_else(|| panic!("{list}:{}: no @NODE in {versioned}", n + 1));
                        (f, false, node)
                    }
                };
                let target = KINDS
                    .iter()
                    .find(|(k, _)| k == kind)
                    .unwrap_or_else(|| panic!("{list}:{}: unknown kind {kind}", n + 1))
                    .1;
                if !used.contains(&target) {
                    used.push(target);
                }
                // A compatibility version needs a label of its own: `f` is the default's.
                let label = if default { f.to_string() } else { format!("{f}.{}", node.replace('.', "_")) };
                let at = if default { "@@" } else { "@" };
                for l in [
                    format!(".globl {label}"),
                    format!(".type {label},@function"),
                    format!("{label}:"),
                    format!("jmp {{{target}}}"),
                    format!(".size {label}, . - {label}"),
                    format!(".symver {label}, {f}{at}{node}"),
                ] {
                    writeln!(asm, "    \"{l}\",").expect("writing to a String");
                }
                Ok(())
            }
            _ => panic!("{list}:{}: expected `node NAME [PARENT]` or `NAME@@NODE KIND`: {line}", n + 1),
        }
        .expect("writing to a String");
    }
    let mut rs = String::from("::core::arch::global_asm!(\n");
    rs.push_str(&asm);
    for target in used {
        writeln!(rs, "    {target} = sym crate::{target},").expect("writing to a String");
    }
    rs.push_str(");\n");
    std::fs::write(out.join("exports.rs"), rs).expect("writing exports.rs");
    std::fs::write(out.join("dv.map"), map).expect("writing the version script");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={}", out.join("dv.map").display());
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,{soname}");
    println!("cargo:rerun-if-changed={}", path.display());
    println!("cargo:rerun-if-changed=build.rs");
}
