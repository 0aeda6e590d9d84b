//! The scatter/gather list: the one walk over a WQE's SGEs and their key checks
//! ([`for_each_part`]), for the requester's gather (a payload's bytes, or where they are
//! for a packet by reference, [`crate::reference`]) and for the one place that writes into
//! a WQE's local buffers, for the responder (SEND and WRITE-with-immediate payloads, UD
//! GRHs) and the completer (READ responses, atomics' original values) alike.

use crate::engine::Shared;
use crate::memory::Memory;
use crate::reference::Payload;
use crate::verbs::{Access, PdId, Sge, WcStatus};

/// Walks bytes `offset .. offset + len` of the buffers `sges` describe: checks each SGE's
/// part against its local key (in `pd`, for `need`), then calls `f` with where the part is
/// (the key's translation), how far into the bytes it starts, and its length. Bytes past
/// the last SGE are `LocLenErr`; a failed key check is the `WcStatus` of
/// `local_key_status`; an error of `f` ends the walk with it.
pub(crate) fn for_each_part(
    sh: &Shared,
    pd: PdId,
    sges: &[Sge],
    mut offset: u32,
    len: u32,
    need: Access,
    mut f: impl FnMut(u64, u32, u32) -> Result<(), WcStatus>,
) -> Result<(), WcStatus> {
    let mut done = 0u32;
    for sge in sges {
        if done == len {
            break;
        }
        if offset >= sge.length {
            offset -= sge.length;
            continue;
        }
        let n = (sge.length - offset).min(len - done);
        let at = sh
            .check_lkey(pd, sge.lkey, sge.addr + u64::from(offset), u64::from(n), need)
            .map_err(crate::completer::local_key_status)?;
        f(at, done, n)?;
        done += n;
        offset = 0;
    }
    if done == len { Ok(()) } else { Err(WcStatus::LocLenErr) }
}

/// Writes `data` at byte `offset` of the buffers `sges` describe, checking each SGE's local
/// key (in `pd`, for local write) before it touches memory. Data that runs past the last
/// SGE is `LocLenErr`; a failed key check is the `WcStatus` of `local_key_status`.
pub(crate) fn scatter<M: Memory + ?Sized>(
    sh: &Shared,
    pd: PdId,
    mem: &mut M,
    sges: &[Sge],
    offset: u32,
    data: Payload<'_>,
) -> Result<(), WcStatus> {
    for_each_part(sh, pd, sges, offset, data.len(), Access::LOCAL_WRITE, |at, from, n| {
        data.copy_to(mem, at, from, n).map_err(|_| WcStatus::LocProtErr)
    })
}
