//! The classic-BPF program that steers datagrams among the sockets of a reuseport group,
//! and the probe datagrams that tell the coordinator which index each socket has.
//!
//! The kernel runs the program on every datagram for the group with the UDP payload at
//! offset 0 and delivers to the socket at the returned index; an index at or past the
//! group's size falls back to the hash. A load past the end of the packet ends the program
//! returning 0, so every load is preceded by a length check.

use std::collections::BTreeMap;

use super::{COMM_ID_COUNTER_BITS, QPN_SLOT_BITS};

/// First four bytes of a probe: opcode 0xff (reserved, never a valid BTH), then "srp".
pub(crate) const PROBE_MAGIC: u32 = 0xff73_7270;
/// A probe: magic, the group index it is for (big-endian), a nonce.
pub(crate) const PROBE_LEN: usize = 16;
/// What the program returns for datagrams it cannot place: past any group, so the kernel
/// hashes them to some member, which drops and counts them.
pub(crate) const FALLBACK: u32 = u32::MAX;
/// The kernel's limit on classic-BPF programs (`BPF_MAXINSNS`).
pub(crate) const MAX_INSNS: usize = 4096;

/// Base Transport Header length.
pub(crate) const BTH_LEN: usize = 12;
/// Offset of the MAD in a UD SEND to QP1: after BTH and DETH.
pub(crate) const MAD: usize = BTH_LEN + 8;
/// MAD header: management class (byte 1).
pub(crate) const MAD_CLASS: usize = MAD + 1;
/// MAD header: attribute ID (bytes 16..18, big-endian).
pub(crate) const MAD_ATTRIBUTE_ID: usize = MAD + 16;
/// Start of the CM data area (after the 24-byte MAD header).
pub(crate) const CM_DATA: usize = MAD + 24;
/// REQ / SIDR_REQ: service ID (CM data 8..16).
pub(crate) const SERVICE_ID: usize = CM_DATA + 8;
/// SIDR_REP: request ID (CM data 0..4).
pub(crate) const SIDR_REP_REQUEST_ID: usize = CM_DATA;
/// MRA, REJ, REP, RTU, DREQ, DREP, LAP, APR: remote comm ID (CM data 4..8).
pub(crate) const REMOTE_COMM_ID: usize = CM_DATA + 4;
/// Shortest CM datagram the program reads: up to the end of the service ID.
pub(crate) const CM_MIN_LEN: usize = SERVICE_ID + 8;

const OPCODE_UD_SEND_ONLY: u32 = 0x64;
const MGMT_CLASS_CM: u32 = 0x07;
const ATTR_REQ: u32 = 0x10;
const ATTR_MRA: u32 = 0x11;
const ATTR_SIDR_REQ: u32 = 0x17;
const ATTR_SIDR_REP: u32 = 0x18;
const ATTR_APR: u32 = 0x1a;

/// One classic-BPF instruction (`struct sock_filter`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct Insn {
    pub(crate) code: u16,
    pub(crate) jt: u8,
    pub(crate) jf: u8,
    pub(crate) k: u32,
}

// Instruction classes, sizes, modes and operations (linux/bpf_common.h).
const LD: u16 = 0x00;
const ALU: u16 = 0x04;
const JMP: u16 = 0x05;
const RET: u16 = 0x06;
const W: u16 = 0x00;
const H: u16 = 0x08;
const B: u16 = 0x10;
const ABS: u16 = 0x20;
const LEN: u16 = 0x80;
const AND: u16 = 0x50;
const RSH: u16 = 0x70;
const JA: u16 = 0x00;
const JEQ: u16 = 0x10;
const JGT: u16 = 0x20;
const JGE: u16 = 0x30;
const K: u16 = 0x00;
const RET_A: u16 = 0x10;

/// Where each member's socket sits in one group, and who listens to which service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Table {
    /// Slot → index in the group.
    pub(crate) slots: BTreeMap<u32, u32>,
    /// Service ID → index of the listener's socket in the group.
    pub(crate) services: BTreeMap<u64, u32>,
    /// Where a REQ or SIDR_REQ for a service nobody listens to goes: a live member's
    /// socket, whose CM answers REJ 8 or SIDR_REP status 1 at once. Hashed among the
    /// group's sockets instead ([`FALLBACK`]), it can land on a gone member's socket that
    /// the coordinator holds in place, where nobody reads: the REQ and every retry of it
    /// (same addresses, same hash) would be lost, and the client waits for its CM
    /// timeouts instead of a REJ.
    pub(crate) unlistened: u32,
}

impl Default for Table {
    fn default() -> Self {
        Table { slots: BTreeMap::new(), services: BTreeMap::new(), unlistened: FALLBACK }
    }
}

impl Table {
    /// Instructions [`program`] needs for this table.
    pub(crate) fn program_len(&self) -> usize {
        HEADER_LEN + 2 * self.slots.len() + 1 + 5 * self.services.len() + 1
    }
}

/// Length of the fixed part of the program (checked by a test).
const HEADER_LEN: usize = 33;

#[derive(Clone, Copy)]
enum Label {
    Fail,
    Probe,
    Cm,
    SidrRep,
    Service,
    Lookup,
    Services,
    Accept,
}

/// A tiny assembler: conditional jumps to labels (resolved when placed, at most 255
/// ahead) and `JA` to labels (32-bit).
struct Asm {
    code: Vec<Insn>,
    fixups: Vec<(usize, Option<Label>, Option<Label>, bool)>,
    labels: [Option<usize>; 8],
}

impl Asm {
    fn op(&mut self, code: u16, k: u32) {
        self.code.push(Insn { code, jt: 0, jf: 0, k });
    }
    /// A conditional jump: to `jt` when true, `jf` when false; `None` is the next insn.
    fn jump(&mut self, op: u16, k: u32, jt: Option<Label>, jf: Option<Label>) {
        self.fixups.push((self.code.len(), jt, jf, false));
        self.op(JMP | op | K, k);
    }
    fn ja(&mut self, to: Label) {
        self.fixups.push((self.code.len(), Some(to), None, true));
        self.op(JMP | JA, 0);
    }
    fn place(&mut self, label: Label) {
        self.labels[label as usize] = Some(self.code.len());
    }
    fn finish(mut self) -> Vec<Insn> {
        for (pc, jt, jf, always) in std::mem::take(&mut self.fixups) {
            let offset = |l: Option<Label>| -> usize {
                l.map_or(0, |l| self.labels[l as usize].expect("label placed") - pc - 1)
            };
            if always {
                self.code[pc].k = u32::try_from(offset(jt)).expect("program under 4096 insns");
            } else {
                self.code[pc].jt = u8::try_from(offset(jt)).expect("conditional jump within 255");
                self.code[pc].jf = u8::try_from(offset(jf)).expect("conditional jump within 255");
            }
        }
        self.code
    }
}

/// The start of a program or filter (the payload at `base`): shorter than a BTH to
/// `Fail`, a probe to `Probe`, destination QPN 1 to `Cm`, any other to `Lookup` with its
/// slot in A.
fn bth(a: &mut Asm, base: u32) {
    use Label::*;
    a.op(LD | W | LEN, 0);
    a.jump(JGE, base + BTH_LEN as u32, None, Some(Fail));
    a.op(LD | W | ABS, base);
    a.jump(JEQ, PROBE_MAGIC, Some(Probe), None);
    // Destination QPN: BTH bytes 5..8.
    a.op(LD | W | ABS, base + 4);
    a.op(ALU | AND | K, 0x00ff_ffff);
    a.jump(JEQ, 1, Some(Cm), None);
    a.op(ALU | RSH | K, QPN_SLOT_BITS);
    a.ja(Lookup);
}

/// The CM part of a program or filter, at label `Cm` (a datagram to QP1 with the payload
/// at `base`): a UD SEND carrying a CM MAD; REQ and SIDR_REQ go to `req`, SIDR_REP to
/// `Lookup` with its request ID's slot in A, MRA..DREP, LAP and APR with their remote comm
/// ID's; anything else to `Fail`.
fn cm(a: &mut Asm, base: u32, req: Label) {
    use Label::*;
    let at = |offset: usize| base + offset as u32;
    a.place(Cm);
    a.op(LD | W | LEN, 0);
    a.jump(JGE, at(CM_MIN_LEN), None, Some(Fail));
    a.op(LD | B | ABS, at(0));
    a.jump(JEQ, OPCODE_UD_SEND_ONLY, None, Some(Fail));
    a.op(LD | B | ABS, at(MAD_CLASS));
    a.jump(JEQ, MGMT_CLASS_CM, None, Some(Fail));
    a.op(LD | H | ABS, at(MAD_ATTRIBUTE_ID));
    a.jump(JEQ, ATTR_REQ, Some(req), None);
    a.jump(JEQ, ATTR_SIDR_REQ, Some(req), None);
    a.jump(JEQ, ATTR_SIDR_REP, Some(SidrRep), None);
    a.jump(JGE, ATTR_MRA, None, Some(Fail));
    a.jump(JGT, ATTR_APR, Some(Fail), None);
    a.op(LD | W | ABS, at(REMOTE_COMM_ID));
    a.op(ALU | RSH | K, COMM_ID_COUNTER_BITS);
    a.ja(Lookup);

    a.place(SidrRep);
    a.op(LD | W | ABS, at(SIDR_REP_REQUEST_ID));
    a.op(ALU | RSH | K, COMM_ID_COUNTER_BITS);
    a.ja(Lookup);
}

/// The steering program for one group, or `None` if it would exceed [`MAX_INSNS`].
///
/// 1. A probe (magic, then index) goes to the index it carries.
/// 2. A datagram shorter than a BTH falls back to the hash.
/// 3. Destination QPN other than 1: slot = QPN >> 13, looked up.
/// 4. QPN 1, UD_SEND_ONLY, MAD class CM: REQ and SIDR_REQ by service ID (listeners, or
///    [`Table::unlistened`]); SIDR_REP by request ID >> 21; MRA..DREP, LAP, APR by remote
///    comm ID >> 21.
/// 5. Anything else falls back.
pub(crate) fn program(table: &Table) -> Option<Vec<Insn>> {
    if table.program_len() > MAX_INSNS {
        return None;
    }
    let mut a = Asm { code: Vec::with_capacity(table.program_len()), fixups: Vec::new(), labels: [None; 8] };
    use Label::*;
    bth(&mut a, 0);

    a.place(Probe);
    a.op(LD | W | LEN, 0);
    a.jump(JGE, PROBE_LEN as u32, None, Some(Fail));
    a.op(LD | W | ABS, 4);
    a.op(RET | RET_A, 0);

    cm(&mut a, 0, Service);

    a.place(Service);
    a.ja(Services);

    a.place(Fail);
    a.op(RET | K, FALLBACK);
    debug_assert_eq!(a.code.len(), HEADER_LEN);

    // A = slot.
    a.place(Lookup);
    for (&slot, &index) in &table.slots {
        a.code.push(Insn { code: JMP | JEQ | K, jt: 0, jf: 1, k: slot });
        a.op(RET | K, index);
    }
    a.op(RET | K, FALLBACK);

    // The service ID is read again for each listener: the kernel's checker rejects loads
    // from scratch memory (M[]) after a RET it treats as falling through.
    a.place(Services);
    for (&service, &index) in &table.services {
        a.op(LD | W | ABS, SERVICE_ID as u32);
        a.code.push(Insn { code: JMP | JEQ | K, jt: 0, jf: 3, k: (service >> 32) as u32 });
        a.op(LD | W | ABS, SERVICE_ID as u32 + 4);
        a.code.push(Insn { code: JMP | JEQ | K, jt: 0, jf: 1, k: service as u32 });
        a.op(RET | K, index);
    }
    a.op(RET | K, table.unlistened);
    let code = a.finish();
    debug_assert_eq!(code.len(), table.program_len());
    Some(code)
}

/// A socket filter sees the UDP header before the payload (a steering program does not).
const UDP_HEADER: u32 = 8;
/// What a socket filter returns to keep a whole datagram (0 drops it).
pub(crate) const ACCEPT: u32 = u32::MAX;

/// The socket filter of a socket the coordinator makes for another user's process (a
/// *guest*, slot `slot`), locked before it is handed over: whatever the group's program
/// (or a program some member put in its place, or a member's `connect`) sends that
/// socket, it keeps only what is the guest's own:
/// 1. probes (they carry an index and a nonce, nobody's data);
/// 2. destination QPN other than 1 in the slot's range;
/// 3. to QP1, a UD SEND carrying a CM MAD: SIDR_REP by request ID, MRA..DREP, LAP, APR by
///    remote comm ID, in the slot's range; and REQ and SIDR_REQ, which name a service
///    (a listener's), not a slot;
/// 4. nothing else.
///
/// The same offsets as [`program`], past the UDP header.
pub(crate) fn guest_filter(slot: u32) -> Vec<Insn> {
    let mut a = Asm { code: Vec::with_capacity(40), fixups: Vec::new(), labels: [None; 8] };
    use Label::*;
    let at = |offset: usize| UDP_HEADER + offset as u32;
    bth(&mut a, UDP_HEADER);

    a.place(Probe);
    a.op(LD | W | LEN, 0);
    a.jump(JGE, at(PROBE_LEN), Some(Accept), Some(Fail));

    cm(&mut a, UDP_HEADER, Accept);

    // A = slot.
    a.place(Lookup);
    a.jump(JEQ, slot, Some(Accept), Some(Fail));
    a.place(Fail);
    a.op(RET | K, 0);
    a.place(Accept);
    a.op(RET | K, ACCEPT);
    a.finish()
}

/// A probe datagram for `index`.
pub(crate) fn probe(index: u32, nonce: u64) -> [u8; PROBE_LEN] {
    let mut p = [0u8; PROBE_LEN];
    p[..4].copy_from_slice(&PROBE_MAGIC.to_be_bytes());
    p[4..8].copy_from_slice(&index.to_be_bytes());
    p[8..].copy_from_slice(&nonce.to_be_bytes());
    p
}

/// The (index, nonce) of a probe datagram.
pub(crate) fn parse_probe(payload: &[u8]) -> Option<(u32, u64)> {
    if payload.len() < PROBE_LEN || payload[..4] != PROBE_MAGIC.to_be_bytes() {
        return None;
    }
    let index = u32::from_be_bytes(payload[4..8].try_into().ok()?);
    let nonce = u64::from_be_bytes(payload[8..16].try_into().ok()?);
    Some((index, nonce))
}

/// Runs a classic-BPF program on `packet` as the kernel does for reuseport (only the
/// instructions [`program`] emits): for tests.
#[cfg(test)]
pub(crate) fn run(code: &[Insn], packet: &[u8]) -> u32 {
    let (mut a, mut pc) = (0u32, 0usize);
    let load = |k: u32, n: usize| -> Option<u32> {
        let k = k as usize;
        let bytes = packet.get(k..k + n)?;
        Some(bytes.iter().fold(0u32, |acc, &b| acc << 8 | u32::from(b)))
    };
    loop {
        let i = code[pc];
        pc += 1;
        match i.code {
            c if c == LD | W | LEN => a = packet.len() as u32,
            c if c == LD | W | ABS || c == LD | H | ABS || c == LD | B | ABS => {
                let n = match c & 0x18 {
                    W => 4,
                    H => 2,
                    _ => 1,
                };
                match load(i.k, n) {
                    Some(v) => a = v,
                    None => return 0, // the kernel ends the program returning 0
                }
            }
            c if c == ALU | AND | K => a &= i.k,
            c if c == ALU | RSH | K => a >>= i.k,
            c if c == JMP | JA => pc += i.k as usize,
            c if c & 0x07 == JMP => {
                let taken = match c & 0xf0 {
                    JEQ => a == i.k,
                    JGT => a > i.k,
                    JGE => a >= i.k,
                    _ => panic!("unexpected jump {c:#x}"),
                };
                pc += usize::from(if taken { i.jt } else { i.jf });
            }
            c if c == RET | K => return i.k,
            c if c == RET | RET_A => return a,
            c => panic!("unexpected instruction {c:#x}"),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use softrdma_wire::cm::CmMessage;
    use softrdma_wire::mad::{AttributeId, MAD_LEN, MadHeader, MadPacket, MadRepr};

    use super::*;

    /// A RoCEv2 UD SEND to QP1 carrying a CM MAD with `attr`, and `field` written at
    /// `offset` (an offset into the datagram).
    pub(crate) fn cm_packet(attr: u16, offset: usize, field: &[u8]) -> Vec<u8> {
        let mut p = vec![0u8; MAD + MAD_LEN + 4];
        p[0] = 0x64;
        p[5..8].copy_from_slice(&[0, 0, 1]);
        let mut mad = [0u8; MAD_LEN];
        MadHeader::cm(AttributeId(attr), 7).emit(&mut MadPacket::new_unchecked(&mut mad[..]));
        p[MAD..MAD + MAD_LEN].copy_from_slice(&mad);
        p[offset..offset + field.len()].copy_from_slice(field);
        p
    }

    fn data_packet(qpn: u32) -> Vec<u8> {
        let mut p = vec![0u8; 12 + 64 + 4];
        p[0] = 0x04; // RC SEND_ONLY
        p[5..8].copy_from_slice(&qpn.to_be_bytes()[1..]);
        p
    }

    fn parse(p: &[u8]) -> CmMessage<'_> {
        let mad = MadRepr::parse(&MadPacket::new_unchecked(&p[MAD..MAD + MAD_LEN])).unwrap();
        CmMessage::parse(&mad).unwrap()
    }

    /// The offsets the program reads are the ones the wire crate parses.
    #[test]
    fn offsets_match_the_wire_crate() {
        let service = 0x0106_0000_0000_1c06u64;
        match parse(&cm_packet(0x10, SERVICE_ID, &service.to_be_bytes())) {
            CmMessage::Req(r) => assert_eq!(r.service_id, service),
            other => panic!("{}", other.name()),
        }
        match parse(&cm_packet(0x17, SERVICE_ID, &service.to_be_bytes())) {
            CmMessage::SidrReq(r) => assert_eq!(r.service_id, service),
            other => panic!("{}", other.name()),
        }
        match parse(&cm_packet(0x18, SIDR_REP_REQUEST_ID, &0x1234_5678u32.to_be_bytes())) {
            CmMessage::SidrRep(r) => assert_eq!(r.request_id, 0x1234_5678),
            other => panic!("{}", other.name()),
        }
        for attr in [0x11u16, 0x12, 0x13, 0x14, 0x15, 0x16] {
            let p = cm_packet(attr, REMOTE_COMM_ID, &0xdead_beefu32.to_be_bytes());
            let m = parse(&p);
            assert_eq!(m.remote_comm_id(), Some(0xdead_beef), "{}", m.name());
            assert_eq!(p[MAD_CLASS], 0x07);
            assert_eq!(u16::from_be_bytes([p[MAD_ATTRIBUTE_ID], p[MAD_ATTRIBUTE_ID + 1]]), attr);
        }
        // LAP and APR (IBA 12.6.16/17): local comm ID 0..4, remote comm ID 4..8, like the rest.
        assert_eq!(REMOTE_COMM_ID - CM_DATA, 4);
    }

    fn table() -> Table {
        Table {
            slots: [(1, 2), (5, 0), (2047, 1), (9, 3)].into_iter().collect(),
            services: [(0x0106_0000_0000_1c06, 3), (0x0106_0000_0000_1c07, 0), (0x0002_0000_0000_1c06, 1)]
                .into_iter()
                .collect(),
            unlistened: 2,
        }
    }

    #[test]
    fn data_by_qpn_slot() {
        let code = program(&table()).unwrap();
        assert_eq!(code.len(), table().program_len());
        for (qpn, want) in [
            (1 << 13, 2),
            ((1 << 13) + 8191, 2),
            (5 << 13 | 17, 0),
            (2047 << 13 | 0x1fff, 1),
            (9 << 13, 3),
            (2 << 13, FALLBACK),
            (0, FALLBACK),
            (2, FALLBACK),
        ] {
            assert_eq!(run(&code, &data_packet(qpn)), want, "qpn {qpn:#x}");
        }
    }

    #[test]
    fn cm_by_service_and_comm_id() {
        let code = program(&table()).unwrap();
        let svc = |attr, s: u64| run(&code, &cm_packet(attr, SERVICE_ID, &s.to_be_bytes()));
        assert_eq!(svc(0x10, 0x0106_0000_0000_1c06), 3);
        assert_eq!(svc(0x17, 0x0106_0000_0000_1c07), 0);
        assert_eq!(svc(0x10, 0x0002_0000_0000_1c06), 1);
        // Nobody listens: the member that answers REJ 8, or the hash when there is none.
        assert_eq!(svc(0x10, 0x0106_0000_0000_1c08), 2);
        assert_eq!(svc(0x17, 0x0107_0000_0000_1c06), 2);
        let none = Table { unlistened: FALLBACK, ..table() };
        let code_none = program(&none).unwrap();
        assert_eq!(run(&code_none, &cm_packet(0x10, SERVICE_ID, &0x0106_0000_0000_1c08u64.to_be_bytes())), FALLBACK);
        let comm = |attr, offset, id: u32| run(&code, &cm_packet(attr, offset, &id.to_be_bytes()));
        for attr in 0x11..=0x1a {
            if attr == 0x17 || attr == 0x18 {
                continue;
            }
            assert_eq!(comm(attr, REMOTE_COMM_ID, 5 << 21 | 77), 0, "attr {attr:#x}");
            assert_eq!(comm(attr, REMOTE_COMM_ID, 9 << 21), 3, "attr {attr:#x}");
            assert_eq!(comm(attr, REMOTE_COMM_ID, 3 << 21), FALLBACK, "attr {attr:#x}");
        }
        assert_eq!(comm(0x18, SIDR_REP_REQUEST_ID, 2047 << 21 | 0x1f_ffff), 1);
        assert_eq!(comm(0x18, SIDR_REP_REQUEST_ID, 4 << 21), FALLBACK);
        // Class port info, unknown attributes, other classes, other opcodes: fallback.
        assert_eq!(comm(0x01, REMOTE_COMM_ID, 5 << 21), FALLBACK);
        assert_eq!(comm(0x1b, REMOTE_COMM_ID, 5 << 21), FALLBACK);
        let mut p = cm_packet(0x13, REMOTE_COMM_ID, &(5u32 << 21).to_be_bytes());
        p[MAD_CLASS] = 0x04;
        assert_eq!(run(&code, &p), FALLBACK);
        let mut p = cm_packet(0x13, REMOTE_COMM_ID, &(5u32 << 21).to_be_bytes());
        p[0] = 0x04;
        assert_eq!(run(&code, &p), FALLBACK);
    }

    #[test]
    fn probes_and_short_packets() {
        let code = program(&table()).unwrap();
        assert_eq!(run(&code, &probe(3, 99)), 3);
        assert_eq!(run(&code, &probe(700, 1)), 700);
        assert_eq!(parse_probe(&probe(3, 99)), Some((3, 99)));
        assert_eq!(parse_probe(&data_packet(1 << 13)), None);
        // Never 0 (a load past the end) for anything short: the fallback.
        for len in 0..CM_MIN_LEN {
            let p = &cm_packet(0x13, REMOTE_COMM_ID, &(5u32 << 21).to_be_bytes())[..len];
            assert_eq!(run(&code, p), FALLBACK, "cm len {len}");
            let p = &probe(0, 0)[..len.min(PROBE_LEN - 1)];
            assert_eq!(run(&code, p), FALLBACK, "probe len {len}");
        }
        for len in 0..12 {
            assert_eq!(run(&code, &data_packet(5 << 13)[..len]), FALLBACK);
        }
    }

    #[test]
    fn size_limit() {
        let mut t = Table::default();
        assert_eq!(program(&t).unwrap().len(), HEADER_LEN + 2);
        for s in 1..2000 {
            t.slots.insert(s, s - 1);
        }
        for s in 0..10u64 {
            t.services.insert(s << 40 | s, s as u32);
        }
        let code = program(&t).unwrap();
        assert!(code.len() <= MAX_INSNS);
        assert_eq!(run(&code, &data_packet(1999 << 13)), 1998);
        assert_eq!(run(&code, &cm_packet(0x10, SERVICE_ID, &(9u64 << 40 | 9).to_be_bytes())), 9);
        for s in 10..100u64 {
            t.services.insert(s << 40 | s, s as u32);
        }
        assert!(program(&t).is_none());
    }

    /// What a guest's socket filter keeps of a datagram (its payload; the filter sees a UDP
    /// header before it).
    fn kept(slot: u32, payload: &[u8]) -> bool {
        let mut d = vec![0u8; UDP_HEADER as usize];
        d.extend_from_slice(payload);
        match run(&guest_filter(slot), &d) {
            0 => false,
            ACCEPT => true,
            other => panic!("returns {other}"),
        }
    }

    #[test]
    fn a_guest_keeps_its_own_only() {
        for (qpn, want) in [(5 << 13, true), (5 << 13 | 0x1fff, true), (6 << 13, false), (4 << 13 | 0x1fff, false)] {
            assert_eq!(kept(5, &data_packet(qpn)), want, "qpn {qpn:#x}");
        }
        assert!(!kept(5, &data_packet(0)), "QPN 0");
        for attr in [0x11u16, 0x12, 0x13, 0x14, 0x15, 0x16, 0x19, 0x1a] {
            assert!(kept(5, &cm_packet(attr, REMOTE_COMM_ID, &(5u32 << 21 | 9).to_be_bytes())), "{attr:#x}");
            assert!(!kept(5, &cm_packet(attr, REMOTE_COMM_ID, &(6u32 << 21).to_be_bytes())), "{attr:#x}");
        }
        assert!(kept(5, &cm_packet(0x18, SIDR_REP_REQUEST_ID, &(5u32 << 21).to_be_bytes())));
        assert!(!kept(5, &cm_packet(0x18, SIDR_REP_REQUEST_ID, &(4u32 << 21).to_be_bytes())));
        // REQs name a service, which a guest may listen to.
        assert!(kept(5, &cm_packet(0x10, SERVICE_ID, &7u64.to_be_bytes())));
        assert!(kept(5, &cm_packet(0x17, SERVICE_ID, &7u64.to_be_bytes())));
        // Other classes and attributes, other opcodes to QP1, anything short: dropped.
        assert!(!kept(5, &cm_packet(0x01, REMOTE_COMM_ID, &(5u32 << 21).to_be_bytes())));
        let mut p = cm_packet(0x13, REMOTE_COMM_ID, &(5u32 << 21).to_be_bytes());
        p[MAD_CLASS] = 0x04;
        assert!(!kept(5, &p));
        p[MAD_CLASS] = 0x07;
        p[0] = 0x04;
        assert!(!kept(5, &p));
        for len in 0..CM_MIN_LEN {
            assert!(!kept(5, &cm_packet(0x13, REMOTE_COMM_ID, &(5u32 << 21).to_be_bytes())[..len]), "len {len}");
        }
        for len in 0..12 {
            assert!(!kept(5, &data_packet(5 << 13)[..len]), "len {len}");
        }
        assert!(kept(5, &probe(3, 1)));
        assert!(!kept(5, &probe(3, 1)[..PROBE_LEN - 1]));
    }

    /// The kernel runs the guest filter on a real socket as [`run`] does.
    #[test]
    fn the_kernel_runs_the_guest_filter() {
        use std::os::fd::AsFd;
        let config = crate::Config { port: 0, ..crate::Config::default() };
        let socket = crate::RoceSocket::bind_with([127, 0, 0, 1].into(), &config).unwrap();
        let code: Vec<_> = guest_filter(5).iter().map(|i| (i.code, i.jt, i.jf, i.k)).collect();
        crate::sys::attach_filter(socket.as_fd(), &code).unwrap();
        assert_eq!(crate::sys::filter_of(socket.as_fd()).unwrap(), code);
        let to = socket.local_addr();
        let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        for qpn in [6 << 13, 5 << 13 | 1, 1 << 13, 5 << 13 | 2] {
            tx.send_to(&data_packet(qpn), to).unwrap();
        }
        let mut batch = crate::RecvBatch::new(8, 2048);
        let mut got = Vec::new();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while got.len() < 2 && std::time::Instant::now() < deadline {
            if socket.recv_timeout(&mut batch, std::time::Duration::from_millis(50)).unwrap_or(0) > 0 {
                got.extend(batch.iter().map(|d| u32::from_be_bytes(d.payload[4..8].try_into().unwrap()) & 0xff_ffff));
            }
        }
        assert_eq!(got, [5 << 13 | 1, 5 << 13 | 2]);
        // Locked, nobody can take it off or put another in its place.
        crate::sys::set_int(socket.as_fd(), libc::SOL_SOCKET, libc::SO_LOCK_FILTER, 1).unwrap();
        assert!(crate::sys::filter_locked(socket.as_fd()).unwrap());
        assert!(crate::sys::attach_filter(socket.as_fd(), &[(RET | K, 0, 0, ACCEPT)]).is_err());
        assert!(crate::sys::set_int(socket.as_fd(), libc::SOL_SOCKET, libc::SO_DETACH_FILTER, 0).is_err());
        assert!(crate::sys::set_int(socket.as_fd(), libc::SOL_SOCKET, libc::SO_LOCK_FILTER, 0).is_err());
    }

    /// The kernel's classic-BPF checker accepts every shape of program, up to the limit.
    #[test]
    fn kernel_accepts_programs() {
        use std::os::fd::AsFd;
        let config = crate::Config { port: 0, reuse_port: true, ..crate::Config::default() };
        let socket = crate::RoceSocket::bind_with([127, 0, 0, 1].into(), &config).unwrap();
        let mut big = Table::default();
        for s in 1..1500 {
            big.slots.insert(s, s - 1);
        }
        for s in 0..150u64 {
            big.services.insert(s << 33 | s, s as u32);
        }
        for t in [Table::default(), table(), big] {
            let code: Vec<_> = program(&t).unwrap().iter().map(|i| (i.code, i.jt, i.jf, i.k)).collect();
            crate::sys::attach_reuseport_cbpf(socket.as_fd(), &code).unwrap();
        }
    }
}
