//! Arbitrary bytes as a RoCEv2 UDP payload (BTH through ICRC).
//!
//! - No accessor of `RocePacket` panics once `new_checked` has passed.
//! - `RoceRepr::parse` with a fixed envelope and `parse_ignoring_icrc` never panic, and
//!   agree whenever the ICRC matches.
//! - The same bytes with their ICRC recomputed reach the layout checks behind the ICRC.
//! - Round-trip oracle: whatever `parse_ignoring_icrc` accepts re-emits, the re-emitted bytes
//!   parse to the same value, and they differ from the input only in reserved bits, pad
//!   bytes and the ICRC.
use softrdma_wire::opcode::Headers;
use softrdma_wire::{
    AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr, Envelope, FethRepr, IethRepr, ImmDtRepr,
    Ipv4Envelope, ROCEV2_UDP_PORT, RethRepr, RocePacket, RoceRepr,
};

const ENVELOPE: Envelope = Envelope::V4(Ipv4Envelope {
    src: core::net::Ipv4Addr::new(192, 168, 1, 10),
    dst: core::net::Ipv4Addr::new(192, 168, 1, 20),
    identification: 0x1234,
    dont_fragment: true,
    src_port: 0xc132,
    dst_port: ROCEV2_UDP_PORT,
});

/// Runs the target on one input; panics when an oracle above does not hold.
pub fn run(data: &[u8]) {
    accessors(data);
    check(data);
    if data.len() >= softrdma_wire::roce::MIN_LEN {
        let mut fixed = data.to_vec();
        RocePacket::new_unchecked(&mut fixed[..]).fill_icrc(&ENVELOPE);
        let packet = RocePacket::new_unchecked(&fixed[..]);
        assert_eq!(RoceRepr::parse(&packet, &ENVELOPE), RoceRepr::parse_ignoring_icrc(&packet));
        check(&fixed);
    }
}

fn accessors(data: &[u8]) {
    let _ = RocePacket::new_unchecked(data).verify_icrc(&ENVELOPE);
    let Ok(p) = RocePacket::new_checked(data) else { return };
    let bth = p.bth();
    let _ = (bth.opcode(), bth.solicited_event(), bth.mig_req(), bth.pad_count(), bth.transport_version());
    let _ = (bth.pkey(), bth.fecn(), bth.becn(), bth.dest_qp(), bth.ack_req(), bth.psn(), BthRepr::parse(&bth));
    let _ = (p.info(), p.headers(), p.header_len());
    if let Some(h) = p.reth() {
        let _ = (h.virtual_address(), h.rkey(), h.dma_length(), RethRepr::parse(&h));
    }
    if let Some(h) = p.aeth() {
        let _ = (h.syndrome_raw(), h.syndrome(), h.msn(), AethRepr::parse(&h));
    }
    if let Some(h) = p.deth() {
        let _ = (h.qkey(), h.src_qp(), DethRepr::parse(&h));
    }
    if let Some(h) = p.atomic_eth() {
        let _ = (h.virtual_address(), h.rkey(), h.swap_add(), h.compare(), AtomicEthRepr::parse(&h));
    }
    if let Some(h) = p.atomic_ack_eth() {
        let _ = (h.original_data(), AtomicAckEthRepr::parse(&h));
    }
    if let Some(h) = p.imm_dt() {
        let _ = (h.immediate(), ImmDtRepr::parse(&h));
    }
    if let Some(h) = p.ieth() {
        let _ = (h.rkey(), IethRepr::parse(&h));
    }
    if let Some(h) = p.feth() {
        let _ = (h.selectivity(), h.placement_type(), FethRepr::parse(&h));
    }
    let _ = (p.payload(), p.pad(), p.icrc_covered(), p.icrc());
    assert_eq!(p.header_len() + p.payload().len() + p.pad().len() + 4, data.len());
}

fn check(data: &[u8]) {
    let packet = RocePacket::new_unchecked(data);
    let checked = RoceRepr::parse(&packet, &ENVELOPE);
    let ignoring = RoceRepr::parse_ignoring_icrc(&packet);
    if let Ok(r) = checked {
        assert_eq!(ignoring, Ok(r), "parse accepted what parse_ignoring_icrc refuses");
    }
    let Ok(r) = ignoring else { return };

    assert_eq!(r.validate(), Ok(()));
    assert_eq!(r.buffer_len(), data.len());
    let mut out = vec![0u8; r.buffer_len()];
    assert_eq!(r.emit(&ENVELOPE, &mut out), Ok(data.len()));
    let again = RocePacket::new_checked(&out[..]).expect("emitted packet fails check_len");
    assert_eq!(RoceRepr::parse(&again, &ENVELOPE), Ok(r), "emitted packet parses differently");
    same_but_reserved(data, &out, again.headers(), r.pad_len());
}

/// `input` and `emitted` agree on every bit that carries meaning: they may differ only in
/// BTH reserved bits, the DETH reserved byte, FETH reserved bits, the pad and the ICRC.
fn same_but_reserved(input: &[u8], emitted: &[u8], headers: Headers, pad: usize) {
    assert_eq!(input.len(), emitted.len());
    let mut mask = vec![0xffu8; input.len()];
    mask[4] = 0xc0; // FECN, BECN; bits 5:0 reserved
    mask[8] = 0x80; // AckReq; bits 6:0 reserved
    if let Some(at) = headers.offset_of(Headers::DETH) {
        mask[12 + at + 4] = 0; // reserved byte between Q_Key and SrcQP
    }
    if let Some(at) = headers.offset_of(Headers::FETH) {
        mask[12 + at..12 + at + 3].fill(0);
        mask[12 + at + 3] = 0x3f; // selectivity (5:4), placement type (3:0)
    }
    let n = input.len();
    mask[n - 4 - pad..].fill(0);
    for (i, ((a, b), m)) in input.iter().zip(emitted).zip(&mask).enumerate() {
        assert_eq!(a & m, b & m, "byte {i} of {n}: input {a:#04x}, re-emitted {b:#04x}");
    }
}
