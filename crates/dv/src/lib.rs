//! # softrdma-dv: stand-ins for `libmlx5.so.1` and `libefa.so.1`
//!
//! perftest's `ib_*` programs name rdma-core's two provider "direct verbs" libraries in
//! `DT_NEEDED` and import a few of their functions (DC transport, AES-XTS crypto, EFA's
//! SRD). They are linked with BIND_NOW, so each imported `symbol@version` must exist when
//! the program loads, even though perftest calls them only for those options. Debian's
//! real libraries would need libibverbs's private provider ABI (`IBVERBS_PRIVATE_34`,
//! `verbs_register_driver_34` from their constructors); these stand-ins need nothing.
//!
//! This one object carries both libraries' functions at their version nodes
//! (`mlx5dv_create_qp@@MLX5_1.3`, `efadv_query_device@@EFA_1.1`, ...). It is installed as
//! `libmlx5.so.1` with `libefa.so.1` a symlink to it (see `softrdma env`). Every function
//! answers "not supported" the way its man page says a failure looks: `NULL` with
//! `errno = EOPNOTSUPP`, or `EOPNOTSUPP` returned, or `false` for
//! `mlx5dv_is_supported`. softrdma's device is no mlx5 or EFA device: that is the truth.

// `global_asm!` counts as unsafe code: each export is a `jmp` to an `extern "C"` function
// of the same C signature below, and `.symver` names its version. Nothing else here.
#![allow(unsafe_code)]

use std::ffi::{c_int, c_void};

// `export!("name", "NODE", f)`: crates/ibverbs's macro, one definition for both libraries.
#[path = "../../ibverbs/src/export.rs"]
#[macro_use]
mod export;

/// For functions returning a pointer: `NULL` with `errno = EOPNOTSUPP`.
extern "C" fn null_not_supported() -> *mut c_void {
    // SAFETY: __errno_location returns this thread's errno, valid for the thread's life.
    unsafe { *libc::__errno_location() = libc::EOPNOTSUPP };
    std::ptr::null_mut()
}

/// For functions returning an error number (0 on success).
extern "C" fn errno_not_supported() -> c_int {
    libc::EOPNOTSUPP
}

/// `bool mlx5dv_is_supported(struct ibv_device *)`: softrdma's device is not mlx5.
extern "C" fn is_supported_false() -> bool {
    false
}

// libmlx5: what perftest imports, and the two calls a program makes to ask whether a
// device is mlx5 at all. Extra arguments are ignored (the C calling convention lets a
// callee take fewer than the caller passes).
export!("mlx5dv_is_supported", "MLX5_1.8", is_supported_false);
export!("mlx5dv_open_device", "MLX5_1.7", null_not_supported);
export!("mlx5dv_query_device", "MLX5_1.0", errno_not_supported);
export!("mlx5dv_create_qp", "MLX5_1.3", null_not_supported);
export!("mlx5dv_qp_ex_from_ibv_qp_ex", "MLX5_1.10", null_not_supported);
export!("mlx5dv_create_mkey", "MLX5_1.10", null_not_supported);
export!("mlx5dv_destroy_mkey", "MLX5_1.10", errno_not_supported);
export!("mlx5dv_devx_general_cmd", "MLX5_1.7", errno_not_supported);
export!("mlx5dv_crypto_login", "MLX5_1.21", errno_not_supported);
export!("mlx5dv_dek_create", "MLX5_1.21", null_not_supported);
export!("mlx5dv_dek_destroy", "MLX5_1.21", errno_not_supported);

// libefa.
export!("efadv_query_device", "EFA_1.1", errno_not_supported);
export!("efadv_create_qp_ex", "EFA_1.1", null_not_supported);
