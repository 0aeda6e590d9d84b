//! The scatter/gather list: the one place that writes into a WQE's local buffers after the
//! key check, for the responder (SEND and WRITE-with-immediate payloads, UD GRHs) and the
//! completer (READ responses, atomics' original values) alike, from a packet's bytes or
//! from where a packet by reference says they are ([`crate::reference`]).

use crate::engine::Shared;
use crate::memory::Memory;
use crate::reference::Payload;
use crate::verbs::{Access, PdId, Sge, WcStatus};

/// Writes `data` at byte `offset` of the buffers `sges` describe, checking each SGE's local
/// key (in `pd`, for local write) before it touches memory. Data that runs past the last
/// SGE is `LocLenErr`; a failed key check is the `WcStatus` of `local_key_status`.
pub(crate) fn scatter<M: Memory + ?Sized>(
    sh: &Shared,
    pd: PdId,
    mem: &mut M,
    sges: &[Sge],
    mut offset: u32,
    data: Payload<'_>,
) -> Result<(), WcStatus> {
    let (mut from, len) = (0u32, data.len());
    for sge in sges {
        if from == len {
            break;
        }
        if offset >= sge.length {
            offset -= sge.length;
            continue;
        }
        let n = (sge.length - offset).min(len - from);
        let addr = sge.addr + u64::from(offset);
        let at = sh
            .check_lkey(pd, sge.lkey, addr, u64::from(n), Access::LOCAL_WRITE)
            .map_err(crate::completer::local_key_status)?;
        data.copy_to(mem, at, from, n).map_err(|_| WcStatus::LocProtErr)?;
        from += n;
        offset = 0;
    }
    if from == len { Ok(()) } else { Err(WcStatus::LocLenErr) }
}
