//! How the engine reaches registered memory.
//!
//! The engine never touches memory by address itself. Every access goes through a
//! [`Memory`] the caller passes in, and only *after* the engine has checked the key, the
//! protection domain, the access rights and the bounds of the memory region. Tests back it
//! with [`VecMemory`]; the runtime implements it over the process's address space (the one
//! `unsafe` place, in the `softrdma` crate).

/// The memory access failed although the engine's checks passed (the caller's memory went
/// away, for instance). The engine turns it into a protection or operational error.
#[derive(Clone, Copy, PartialEq, Eq, Debug, thiserror::Error)]
#[error("memory at {addr:#x} (+{len}) is not accessible")]
pub struct MemoryFault {
    /// First byte of the failed access.
    pub addr: u64,
    /// Length of the failed access.
    pub len: usize,
}

/// Registered memory, by virtual address.
///
/// Atomics operate on 64-bit values in the host's byte order, as an RNIC's atomics do on its
/// host's memory; implementations must make each one indivisible with respect to the others.
pub trait Memory {
    /// Copies `buf.len()` bytes from `addr` into `buf`.
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), MemoryFault>;
    /// Puts the `out.len()` bytes at `addr` into a packet's payload, `out`, which the engine
    /// does not read again: the packet leaves with its ICRC still to compute
    /// ([`Transmit::icrc_pending`](crate::Transmit)), and no tag seals it. Only for a send
    /// WQE's data, which the application may not change until the WQE completes (a READ's
    /// answer is read, since the region it comes from may change meanwhile). A memory whose
    /// addresses its runtime can hand to the kernel may note where the bytes are instead of
    /// copying them, for the send to gather them from there (and to compute the ICRC over
    /// them): one copy fewer per packet. The default copies ([`read`](Self::read)), as
    /// softrdma's own runtime does: there the kernel's gathering from three pieces a packet
    /// cost more than the copy it saved (docs/architecture.md, "Payloads copied, not
    /// gathered").
    fn gather(&mut self, addr: u64, out: &mut [u8]) -> Result<(), MemoryFault> {
        self.read(addr, out)
    }
    /// The engine built no packet after all in this call of
    /// [`poll_transmit`](crate::Engine::poll_transmit) (a gather failed part-way): what
    /// [`gather`](Self::gather) noted since the call began is for no packet, and the next
    /// one is written over it. The default noted nothing.
    fn discard_gathered(&mut self) {}
    /// Copies `data` to `addr`.
    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), MemoryFault>;
    /// If the 8 bytes at `addr` equal `compare`, replaces them with `swap`. Returns the value
    /// found.
    fn compare_swap(&mut self, addr: u64, compare: u64, swap: u64) -> Result<u64, MemoryFault> {
        let mut b = [0u8; 8];
        self.read(addr, &mut b)?;
        let old = u64::from_ne_bytes(b);
        if old == compare {
            self.write(addr, &swap.to_ne_bytes())?;
        }
        Ok(old)
    }
    /// Stores the 8 bytes `value` at `addr` as one write (`ATOMIC_WRITE`).
    fn atomic_write(&mut self, addr: u64, value: [u8; 8]) -> Result<(), MemoryFault> {
        self.write(addr, &value)
    }
    /// A FLUSH of `[addr, addr + len)`: what was written there before is visible to every
    /// observer once this returns, and, with `persistent`, durable as far as the memory can
    /// be made so. The default is a sequentially consistent fence (memory that lives only
    /// in RAM is as persistent as it gets).
    fn flush(&mut self, addr: u64, len: u64, persistent: bool) -> Result<(), MemoryFault> {
        let _ = (addr, len, persistent);
        core::sync::atomic::fence(core::sync::atomic::Ordering::SeqCst);
        Ok(())
    }
    /// Copies `len` bytes from address `from` of process `origin` to `addr`: the one copy of
    /// a payload carried by reference ([`crate::reference`]). The engine has checked `addr`
    /// as for a write; `from` is the sender's to vouch for, and a failed copy is a fault.
    /// The default cannot reach another process and refuses.
    fn pull(&mut self, addr: u64, origin: u32, from: u64, len: usize) -> Result<(), MemoryFault> {
        let _ = (origin, from);
        Err(MemoryFault { addr, len })
    }
    /// Adds `add` (wrapping) to the 8 bytes at `addr`. Returns the value found.
    fn fetch_add(&mut self, addr: u64, add: u64) -> Result<u64, MemoryFault> {
        let mut b = [0u8; 8];
        self.read(addr, &mut b)?;
        let old = u64::from_ne_bytes(b);
        self.write(addr, &old.wrapping_add(add).to_ne_bytes())?;
        Ok(old)
    }
}

/// A flat address space starting at `base`, for tests and simulations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VecMemory {
    base: u64,
    bytes: Vec<u8>,
}

impl VecMemory {
    /// `len` zero bytes at addresses `base..base + len`.
    pub fn new(base: u64, len: usize) -> Self {
        Self { base, bytes: vec![0; len] }
    }

    /// The first address.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// All bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// All bytes, writable (a test's local CPU access).
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.bytes
    }

    /// The bytes at `addr .. addr + len`. Panics outside the space (test helper).
    pub fn slice(&self, addr: u64, len: usize) -> &[u8] {
        let start = (addr - self.base) as usize;
        &self.bytes[start..start + len]
    }

    /// The bytes at `addr .. addr + len`, writable. Panics outside the space (test helper).
    pub fn slice_mut(&mut self, addr: u64, len: usize) -> &mut [u8] {
        let start = (addr - self.base) as usize;
        &mut self.bytes[start..start + len]
    }

    fn range(&self, addr: u64, len: usize) -> Result<core::ops::Range<usize>, MemoryFault> {
        let fault = MemoryFault { addr, len };
        let start = usize::try_from(addr.checked_sub(self.base).ok_or(fault)?).map_err(|_| fault)?;
        let end = start.checked_add(len).ok_or(fault)?;
        if end > self.bytes.len() { Err(fault) } else { Ok(start..end) }
    }
}

impl Memory for VecMemory {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), MemoryFault> {
        let r = self.range(addr, buf.len())?;
        buf.copy_from_slice(&self.bytes[r]);
        Ok(())
    }

    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), MemoryFault> {
        let r = self.range(addr, data.len())?;
        self.bytes[r].copy_from_slice(data);
        Ok(())
    }
}
