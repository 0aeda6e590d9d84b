//! # softrdma-ibverbs: a drop-in `libibverbs.so.1`
//!
//! rdma-core's verbs C ABI over the [`softrdma`] crate, so that unmodified programs built
//! against rdma-core (`ibv_devinfo`, `ibv_rc_pingpong`, ...) run on softrdma with
//! `LD_LIBRARY_PATH` pointing at this library.
//!
//! - **Symbols and versions.** Every function is exported under rdma-core's name at the
//!   version node programs import it from (`ibv_alloc_pd@@IBVERBS_1.1`,
//!   `ibv_query_gid_type@@IBVERBS_PRIVATE_34`, ...): see [`export`] and build.rs. Programs
//!   are linked with BIND_NOW, so every imported symbol must exist even if never called;
//!   what softrdma does not do yet fails the documented way (NULL with `errno`, or an error
//!   number), never aborts.
//! - **Objects.** `ibv_open_device` hands out the `ibv_context` inside a real
//!   `struct verbs_context` (`abi_compat`, `sz`, `ops` set), so the header inlines
//!   (`ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq`, `ibv_req_notify_cq`,
//!   `ibv_post_srq_recv`, `ibv_query_port`) land here. Every other object is a `#[repr(C)]`
//!   struct whose first member is the public C struct, followed by the softrdma handle.
//! - **Thin.** Each entry catches panics, checks pointers, converts C to typed values,
//!   calls the safe API and maps errors to `errno` in one table ([`errno`]). No protocol
//!   logic lives here.
//!
//! `verbs_context` grows downwards with new rdma-core releases (new ops at lower offsets):
//! `sz` is exactly v44's 648, so a program built against newer headers finds the ops it
//! does not know to be out of range and never reads before our allocation.

// The C ABI needs unsafe code: raw pointers from C, `#[repr(C)]` layouts, `.symver`
// directives. Every block says why it is sound in a `// SAFETY:` line.
#![allow(unsafe_code)]

pub mod abi;
pub mod cma_abi;
pub mod errno;
#[macro_use]
mod export;
mod cq_ex;
mod device;
mod objects;
mod post;
mod rdmacm;
mod rsocket;
mod stubs;
mod wr;
mod xrc;

use std::panic::{AssertUnwindSafe, catch_unwind};

/// Whether the file descriptor of a channel (completion or CM event) is in non-blocking
/// mode, which the application sets with `fcntl(fd, F_SETFL, O_NONBLOCK)` to use it in an
/// event loop.
pub(crate) fn would_block(fd: std::ffi::c_int) -> bool {
    // SAFETY: F_GETFL reads the flags of a descriptor; an invalid one gives -1 (blocking).
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    flags != -1 && flags & libc::O_NONBLOCK != 0
}

/// The `*_str` functions: `names[i]` as a C string that lives for the program, or
/// `unknown` for a value outside the table.
pub(crate) fn name_in(
    names: &[&'static std::ffi::CStr],
    i: std::ffi::c_int,
    unknown: &'static std::ffi::CStr,
) -> *const std::ffi::c_char {
    usize::try_from(i).ok().and_then(|i| names.get(i)).unwrap_or(&unknown).as_ptr()
}

/// Runs `f`, turning a panic into `on_panic` with `errno` set to `EIO`: a panic must never
/// unwind into C.
pub(crate) fn guard<T>(on_panic: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(_) => {
            errno::set(libc::EIO);
            on_panic
        }
    }
}
