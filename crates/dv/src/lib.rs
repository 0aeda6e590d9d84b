//! # softrdma-dv: stand-ins for `libmlx5.so.1` and `libefa.so.1`
//!
//! Debian's programs and libraries name rdma-core's two provider "direct verbs" libraries
//! in `DT_NEEDED`: perftest (DC, AES-XTS crypto, EFA SRD), libfabric (its efa provider),
//! UCX's `libuct_ib` (mlx5 accelerations), pyverbs' provider modules. Each versioned
//! import must exist when the program loads (perftest is linked with BIND_NOW), or the
//! program does not start, though none calls these functions on a device that is not an
//! mlx5 or EFA one. Debian's real libraries would need libibverbs's private provider ABI
//! (`IBVERBS_PRIVATE_34`, `verbs_register_driver_34` from their constructors); these
//! stand-ins need nothing.
//!
//! This source builds both: `softrdma-dv` is `libmlx5.so.1` (every function of Debian's
//! libmlx5 at its `MLX5_1.x` node, crates/dv/mlx5.symbols), `softrdma-dv-efa`
//! (crates/dv-efa) is `libefa.so.1` (its `EFA_1.x` functions, crates/dv/efa.symbols).
//! scripts/gen-dv-symbols writes the lists from the real libraries' export tables, the
//! imports of every ELF file that links them, and the headers' prototypes; build.rs turns
//! them into exports. Every function answers "not supported" as the real library does on
//! a device that is not its own: `NULL` with `errno = EOPNOTSUPP` for a pointer,
//! `EOPNOTSUPP` returned for an error number, `false` for `mlx5dv_is_supported`, -1 with
//! `errno` for a `ssize_t` or a file descriptor. softrdma's device is no mlx5 or EFA
//! device: that is the truth. Extra arguments are ignored (the C calling convention lets a
//! callee take fewer than the caller passes).

// `global_asm!` counts as unsafe code: each export is a `jmp` to an `extern "C"` function
// below whose result has the C return type of the export (exports.rs, from build.rs), and
// `.symver` names its version. Nothing else here.
#![allow(unsafe_code)]

use std::ffi::{c_int, c_void};

/// Sets this thread's `errno` to `EOPNOTSUPP`.
fn set_errno_not_supported() {
    // SAFETY: __errno_location returns this thread's errno, valid for the thread's life.
    unsafe { *libc::__errno_location() = libc::EOPNOTSUPP };
}

/// For functions returning a pointer: `NULL` with `errno = EOPNOTSUPP`.
#[allow(dead_code, reason = "a list may have no function of this kind (efa.symbols has no bool)")]
extern "C" fn null_not_supported() -> *mut c_void {
    set_errno_not_supported();
    std::ptr::null_mut()
}

/// For functions returning an error number (0 on success).
#[allow(dead_code, reason = "a list may have no function of this kind (efa.symbols has no bool)")]
extern "C" fn errno_not_supported() -> c_int {
    libc::EOPNOTSUPP
}

/// For functions returning `bool` (`mlx5dv_is_supported`): softrdma's device is not theirs.
#[allow(dead_code, reason = "a list may have no function of this kind (efa.symbols has no bool)")]
extern "C" fn false_not_supported() -> bool {
    false
}

/// For functions returning `ssize_t`, or an `int` file descriptor: -1 with `errno =
/// EOPNOTSUPP` (the low 32 bits of -1 are the `int` -1).
#[allow(dead_code, reason = "a list may have no function of this kind (efa.symbols has no bool)")]
extern "C" fn minus_one_not_supported() -> isize {
    set_errno_not_supported();
    -1
}

/// For functions returning nothing (destructors of objects these libraries never create).
#[allow(dead_code, reason = "a list may have no function of this kind (efa.symbols has no bool)")]
extern "C" fn nothing() {}

include!(concat!(env!("OUT_DIR"), "/exports.rs"));
