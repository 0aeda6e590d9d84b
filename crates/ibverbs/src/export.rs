//! Versioned exports.
//!
//! `export!("ibv_alloc_pd", "IBVERBS_1.1", path::to::rust_fn)` defines the global symbol
//! `ibv_alloc_pd` as a jump to `rust_fn` (an ordinary, unexported `extern "C" fn`) and
//! gives it the default version `IBVERBS_1.1` with `.symver name, name@@NODE`. The
//! definition and the directive live in one `global_asm!` block, so they always land in
//! the same object file whatever the codegen-unit split. The Rust functions themselves
//! stay local: rustc's version script hides every symbol it does not export, and the
//! exported ones carry their version in their name.

macro_rules! export {
    ($name:literal, $node:literal, $f:path) => {
        ::core::arch::global_asm!(
            concat!(".globl ", $name),
            concat!(".type ", $name, ",@function"),
            concat!($name, ":"),
            "jmp {f}",
            concat!(".size ", $name, ", . - ", $name),
            concat!(".symver ", $name, ", ", $name, "@@", $node),
            f = sym $f,
        );
    };
}
