//! The scatter/gather list: the one place that writes into a WQE's local buffers after the
//! key check, for the responder (SEND and WRITE-with-immediate payloads, UD GRHs) and the
//! completer (READ responses, atomics' original values) alike.

use crate::engine::Shared;
use crate::memory::Memory;
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
    mut data: &[u8],
) -> Result<(), WcStatus> {
    for sge in sges {
        if data.is_empty() {
            break;
        }
        if offset >= sge.length {
            offset -= sge.length;
            continue;
        }
        let n = ((sge.length - offset) as usize).min(data.len());
        let addr = sge.addr + u64::from(offset);
        let at = sh
            .check_lkey(pd, sge.lkey, addr, n as u64, Access::LOCAL_WRITE)
            .map_err(crate::completer::local_key_status)?;
        mem.write(at, &data[..n]).map_err(|_| WcStatus::LocProtErr)?;
        data = &data[n..];
        offset = 0;
    }
    if data.is_empty() { Ok(()) } else { Err(WcStatus::LocLenErr) }
}
