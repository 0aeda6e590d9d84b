//! `Memory::gather`: where the runtime computes the ICRC, a packet's payload need not be
//! copied into it, and a memory may note where the bytes are instead (the runtime's socket
//! path sends them from there). What it noted for a packet the engine then abandons must
//! be dropped, or it would land in the next packet written in its place.

mod common;

use common::*;
use softrdma_engine::*;
use softrdma_wire::{Qpn, RKey};

/// A memory that notes gathers instead of copying, refuses one address, and logs what the
/// engine asked of it.
struct Noting<'a> {
    mem: &'a mut VecMemory,
    refuse: u64,
    log: Vec<String>,
}

impl Memory for Noting<'_> {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), MemoryFault> {
        self.mem.read(addr, buf)
    }
    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), MemoryFault> {
        self.mem.write(addr, data)
    }
    fn gather(&mut self, addr: u64, out: &mut [u8]) -> Result<(), MemoryFault> {
        if addr == self.refuse {
            return Err(MemoryFault { addr, len: out.len() });
        }
        self.log.push(format!("gather {:#x}+{}", addr - BASE, out.len()));
        Ok(())
    }
    fn discard_gathered(&mut self) {
        self.log.push("discard".into());
    }
}

fn sender(defer_icrc: bool) -> Node {
    let mut a = node_configured([10, 0, 0, 1], 1, QpType::Rc, QpCap::default(), &|c| c.defer_icrc = defer_icrc);
    let peer = std::net::IpAddr::from([10, 0, 0, 2]);
    connect(&mut a, Qpn::new(0x11).unwrap(), peer, QpType::Rc, Mtu::Mtu4096, &|_| {});
    a
}

#[test]
fn a_packet_abandoned_part_way_through_its_gather_discards_what_was_noted() {
    let mut a = sender(true);
    let write = SendOp::RdmaWrite { remote_addr: 0x5000, rkey: RKey(7) };
    // A WRITE gathered whole, then one whose second SGE cannot be read.
    let good = [a.sge(0, 2048)];
    let bad = [a.sge(0, 2048), a.sge(8192, 1024)];
    a.engine.post_send(a.qp, &[wr(1, write, &good), wr(2, write, &bad)], &a.mem).unwrap();
    let mut mem = Noting { mem: &mut a.mem, refuse: BASE + 8192, log: Vec::new() };
    let mut buf = vec![0u8; 4200];
    let t = a.engine.poll_transmit(Instant::ZERO, &mut mem, &mut buf).expect("the first WRITE");
    assert_eq!(t.len, 12 + 16 + 2048 + 4);
    assert_eq!(mem.log, ["gather 0x0+2048"], "the payload noted, not copied, and kept");
    mem.log.clear();
    assert!(a.engine.poll_transmit(Instant::ZERO, &mut mem, &mut buf).is_none(), "the second fails");
    assert_eq!(mem.log, ["gather 0x0+2048", "discard"], "its first SGE noted, then dropped with the packet");
    assert!(a.engine.poll_cq(a.cq).is_none(), "the failed WRITE completes after the one in flight");
}

#[test]
fn where_the_engine_computes_the_icrc_it_copies_the_payload() {
    let mut a = sender(false);
    let sge = [a.sge(0, 2048)];
    a.fill(0, &pattern(2048, 9));
    a.engine.post_send(a.qp, &[wr(1, SendOp::Send, &sge)], &a.mem).unwrap();
    let mut mem = Noting { mem: &mut a.mem, refuse: 0, log: Vec::new() };
    let mut buf = vec![0u8; 4200];
    let t = a.engine.poll_transmit(Instant::ZERO, &mut mem, &mut buf).expect("the SEND");
    assert!(mem.log.is_empty(), "nothing noted: {:?}", mem.log);
    assert!(!t.icrc_pending);
    assert_eq!(buf[12..12 + 2048], pattern(2048, 9), "the payload in the packet");
}

/// A READ's answer is copied even where the runtime could gather it: the application may
/// write the region a READ reads while it is read, and a response sent from where the
/// bytes are would carry an ICRC over other bytes than the ones that leave.
#[test]
fn a_read_response_is_copied_not_gathered() {
    let mut a = node([10, 0, 0, 1], 1, QpType::Rc, QpCap::default());
    let mut b = node_configured([10, 0, 0, 2], 2, QpType::Rc, QpCap::default(), &|c| c.defer_icrc = true);
    let (aq, bq, aa, ba) = (a.qp, b.qp, a.addr, b.addr);
    connect(&mut a, bq, ba, QpType::Rc, Mtu::Mtu4096, &|_| {});
    connect(&mut b, aq, aa, QpType::Rc, Mtu::Mtu4096, &|_| {});
    b.fill(0x2000, &pattern(3000, 6));
    let local = [a.sge(0, 3000)];
    let read = SendOp::RdmaRead { remote_addr: b.addr_of(0x2000), rkey: b.mr.rkey };
    a.engine.post_send(a.qp, &[wr(1, read, &local)], &a.mem).unwrap();
    let mut buf = vec![0u8; 4200];
    let t = a.engine.poll_transmit(Instant::ZERO, &mut a.mem, &mut buf).expect("the READ request");
    b.engine.handle_datagram(Instant::ZERO, &t.envelope, &buf[..t.len], &mut b.mem);
    let mut mem = Noting { mem: &mut b.mem, refuse: 0, log: Vec::new() };
    let t = b.engine.poll_transmit(Instant::ZERO, &mut mem, &mut buf).expect("the READ response");
    assert!(mem.log.is_empty(), "nothing gathered: {:?}", mem.log);
    assert_eq!(t.len, 12 + 4 + 3000 + 4, "RDMA_READ_RESPONSE_ONLY: BTH, AETH, data, ICRC");
    assert_eq!(buf[16..16 + 3000], pattern(3000, 6), "the answer's bytes in the packet");
}
