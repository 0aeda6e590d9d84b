//! # softrdma-rdmacm: a drop-in `librdmacm.so.1`
//!
//! Every function of rdma-core's librdmacm (`rdma_*` and the rsocket `r*` calls, listed
//! in symbols.txt) exported at its version node (`rdma_accept@@RDMACM_1.0`,
//! `rdma_establish@@RDMACM_1.2`, ...), each a single jump to
//! `softrdma_rdmacm_<name>@SOFTRDMA_PRIVATE_1` in `libibverbs.so.1` (softrdma-ibverbs),
//! which this library names in `DT_NEEDED`.
//!
//! The implementations live there, not here, because an `rdma_cm_id` carries verbs
//! objects (`verbs`, `pd`, `qp`, `send_cq`, ...) that programs use with `ibv_*` calls and
//! the header inlines: they must be libibverbs's own, made by the same softrdma runtime.
//! A second copy of the runtime linked in here would have its own devices and objects.
//! See docs/architecture.md, "The C layer".

// `global_asm!` counts as unsafe code: each forwarder is a `jmp` to the function of the
// same contract in libibverbs.so.1 (arguments and return untouched), and the `.symver`
// directive only names its version. Nothing else here.
#![allow(unsafe_code)]

include!(concat!(env!("OUT_DIR"), "/forward.rs"));
