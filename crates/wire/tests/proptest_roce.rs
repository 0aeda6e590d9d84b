//! Property tests of the RoCEv2 codec: every header and every opcode's packet round-trips
//! through emit and parse, emit writes every byte it owns, PSN arithmetic holds on the 24-bit
//! circle, no input makes a parser panic, and any single flipped covered bit is an ICRC error.
//!
//! Failure persistence is off (a failing case would otherwise write a `proptest-regressions`
//! file next to this one); shrunk failures are kept as plain tests at the end of the file.

use std::cmp::Ordering;
use std::fmt::Debug;
use std::net::{Ipv4Addr, Ipv6Addr};

use etherparse::{
    EtherType, Ethernet2Header, IpDscp, IpEcn, IpFragOffset, IpNumber, Ipv4Header, Ipv4Options, Ipv6FlowLabel,
    Ipv6Header, UdpHeader,
};
use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::{TestCaseError, TestRunner};
use softrdma_wire::grh::{GRH_LEN, GrhRepr};
use softrdma_wire::opcode::OPCODES;
use softrdma_wire::{
    AethPacket, AethRepr, AtomicAckEthPacket, AtomicAckEthRepr, AtomicEthPacket, AtomicEthRepr, BthPacket, BthRepr,
    DatagramRepr, DethPacket, DethRepr, Envelope, Error, EthernetFrameRepr, ExtHeaders, FethPacket, FethRepr, Headers,
    IethPacket, IethRepr, ImmDtPacket, ImmDtRepr, IpRepr, Ipv4Envelope, Ipv6Envelope, Msn, Opcode, OpcodeInfo, PKey,
    PayloadRule, Psn, PsnWindow, QKey, Qpn, RKey, ROCEV2_UDP_PORT, RethPacket, RethRepr, RocePacket, RoceRepr,
    Syndrome, UdpDatagram, XrcEthRepr,
};

type TestResult = Result<(), TestCaseError>;

/// Cases for a property, without failure persistence (see the module docs).
fn config(cases: u32) -> ProptestConfig {
    ProptestConfig { cases, failure_persistence: None, ..ProptestConfig::default() }
}

// ------------------------------------------------------------------------------------------
// Strategies
// ------------------------------------------------------------------------------------------

fn u24() -> impl Strategy<Value = u32> {
    prop_oneof![1 => Just(0u32), 1 => Just(0x00ff_ffff), 6 => 0..=0x00ff_ffffu32]
}

fn psn() -> impl Strategy<Value = Psn> {
    u24().prop_map(|v| Psn::new(v).unwrap())
}

fn qpn() -> impl Strategy<Value = Qpn> {
    u24().prop_map(|v| Qpn::new(v).unwrap())
}

fn msn() -> impl Strategy<Value = Msn> {
    u24().prop_map(|v| Msn::new(v).unwrap())
}

fn bth_with(opcode: impl Strategy<Value = Opcode>) -> impl Strategy<Value = BthRepr> {
    (opcode, any::<[bool; 6]>(), any::<u16>(), qpn(), psn()).prop_map(
        |(opcode, [solicited_event, mig_req, fecn, becn, ack_req, _], pkey, dest_qp, psn)| BthRepr {
            opcode,
            solicited_event,
            mig_req,
            pkey: PKey(pkey),
            fecn,
            becn,
            dest_qp,
            ack_req,
            psn,
        },
    )
}

fn bth() -> impl Strategy<Value = BthRepr> {
    bth_with(any::<u8>().prop_map(Opcode))
}

fn reth() -> impl Strategy<Value = RethRepr> {
    (any::<u64>(), any::<u32>(), any::<u32>()).prop_map(|(virtual_address, rkey, dma_length)| RethRepr {
        virtual_address,
        rkey: RKey(rkey),
        dma_length,
    })
}

/// Every syndrome `Syndrome::from_u8` can return: ACK, RNR NAK, every NAK code (reserved
/// ones included) and the reserved syndromes.
fn syndrome() -> impl Strategy<Value = Syndrome> {
    any::<u8>().prop_map(Syndrome::from_u8)
}

fn aeth() -> impl Strategy<Value = AethRepr> {
    (syndrome(), msn()).prop_map(|(syndrome, msn)| AethRepr { syndrome, msn })
}

fn deth() -> impl Strategy<Value = DethRepr> {
    (any::<u32>(), qpn()).prop_map(|(qkey, src_qp)| DethRepr { qkey: QKey(qkey), src_qp })
}

fn atomic_eth() -> impl Strategy<Value = AtomicEthRepr> {
    (any::<u64>(), any::<u32>(), any::<u64>(), any::<u64>()).prop_map(|(virtual_address, rkey, swap_add, compare)| {
        AtomicEthRepr { virtual_address, rkey: RKey(rkey), swap_add, compare }
    })
}

fn atomic_ack_eth() -> impl Strategy<Value = AtomicAckEthRepr> {
    any::<u64>().prop_map(|original_data| AtomicAckEthRepr { original_data })
}

fn imm_dt() -> impl Strategy<Value = ImmDtRepr> {
    any::<[u8; 4]>().prop_map(ImmDtRepr)
}

fn ieth() -> impl Strategy<Value = IethRepr> {
    any::<u32>().prop_map(|rkey| IethRepr { rkey: RKey(rkey) })
}

/// An XRCETH: a 24-bit SRQ number.
fn xrceth() -> impl Strategy<Value = XrcEthRepr> {
    (0..1u32 << 24).prop_map(|srqn| XrcEthRepr { srqn })
}

/// A FETH with in-range fields: selectivity is 2 bits, placement type 4.
fn feth() -> impl Strategy<Value = FethRepr> {
    (0..4u8, 0..16u8).prop_map(|(selectivity, placement_type)| FethRepr { selectivity, placement_type })
}

/// Exactly the extended headers in `headers`, with arbitrary contents.
fn ext_for(headers: Headers) -> impl Strategy<Value = ExtHeaders> {
    (feth(), reth(), aeth(), deth(), atomic_eth(), atomic_ack_eth(), imm_dt(), ieth(), xrceth()).prop_map(
        move |(feth, reth, aeth, deth, atomic_eth, atomic_ack_eth, imm_dt, ieth, xrceth)| {
            let has = |h| headers.contains(h);
            ExtHeaders {
                xrceth: has(Headers::XRCETH).then_some(xrceth),
                feth: has(Headers::FETH).then_some(feth),
                reth: has(Headers::RETH).then_some(reth),
                aeth: has(Headers::AETH).then_some(aeth),
                deth: has(Headers::DETH).then_some(deth),
                atomic_eth: has(Headers::ATOMIC_ETH).then_some(atomic_eth),
                atomic_ack_eth: has(Headers::ATOMIC_ACK_ETH).then_some(atomic_ack_eth),
                imm_dt: has(Headers::IMM_DT).then_some(imm_dt),
                ieth: has(Headers::IETH).then_some(ieth),
            }
        },
    )
}

/// Payload bytes: all zero for seed 0 (what a shrunk case shows), xorshift noise otherwise.
fn fill(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed;
    (0..len)
        .map(|_| {
            if seed == 0 {
                return 0;
            }
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// A length in `lo..=hi`, mostly small so that every pad count (0..=3) is common.
fn len_in(lo: usize, hi: usize) -> BoxedStrategy<usize> {
    prop_oneof![3 => lo..=hi.min(lo + 16), 1 => lo..=hi].boxed()
}

/// A payload length that the opcode's rule allows.
fn payload_len(rule: PayloadRule) -> BoxedStrategy<usize> {
    match rule {
        PayloadRule::None => Just(0).boxed(),
        PayloadRule::PathMtu => select(vec![256usize, 512, 1024, 2048, 4096]).boxed(),
        PayloadRule::UpToPathMtuNonEmpty => len_in(1, 4096),
        PayloadRule::UpToPathMtu => len_in(0, 4096),
        PayloadRule::Exactly(n) => Just(usize::from(n)).boxed(),
    }
}

fn payload(len: impl Strategy<Value = usize>) -> impl Strategy<Value = Vec<u8>> {
    (len, prop_oneof![Just(0u64), 1..=u64::MAX]).prop_map(|(len, seed)| fill(len, seed))
}

/// A `RoceRepr` that owns its payload.
#[derive(Clone, Debug)]
struct Roce {
    bth: BthRepr,
    ext: ExtHeaders,
    payload: Vec<u8>,
}

impl Roce {
    fn repr(&self) -> RoceRepr<'_> {
        RoceRepr { bth: self.bth, ext: self.ext, payload: &self.payload }
    }
}

/// A valid packet of the opcode `info` describes.
fn roce_for(info: &'static OpcodeInfo) -> impl Strategy<Value = Roce> {
    (bth_with(Just(info.opcode)), ext_for(info.headers), payload(payload_len(info.payload)))
        .prop_map(|(bth, ext, payload)| Roce { bth, ext, payload })
}

/// Every byte the opcode table does not know (reserved and RD opcodes).
fn unknown_opcodes() -> Vec<u8> {
    (0..=255u8).filter(|&b| Opcode(b).info().is_none()).collect()
}

/// A packet of an unknown opcode: no extended headers, any payload.
fn roce_unknown() -> impl Strategy<Value = Roce> {
    (bth_with(select(unknown_opcodes()).prop_map(Opcode)), payload(len_in(0, 4096))).prop_map(|(bth, payload)| Roce {
        bth,
        ext: ExtHeaders::default(),
        payload,
    })
}

/// A valid packet of any opcode, known or not.
fn roce() -> impl Strategy<Value = Roce> {
    prop_oneof![
        4 => select(&OPCODES[..]).prop_flat_map(|info| roce_for(Opcode(info.opcode.0).info().unwrap())),
        1 => roce_unknown(),
    ]
}

fn ipv4_envelope() -> impl Strategy<Value = Ipv4Envelope> {
    (any::<[u8; 4]>(), any::<[u8; 4]>(), any::<u16>(), any::<bool>(), any::<u16>(), any::<u16>()).prop_map(
        |(src, dst, identification, dont_fragment, src_port, dst_port)| Ipv4Envelope {
            src: Ipv4Addr::from(src),
            dst: Ipv4Addr::from(dst),
            identification,
            dont_fragment,
            src_port,
            dst_port,
        },
    )
}

fn ipv6_envelope() -> impl Strategy<Value = Ipv6Envelope> {
    (any::<[u8; 16]>(), any::<[u8; 16]>(), any::<u16>(), any::<u16>()).prop_map(|(src, dst, src_port, dst_port)| {
        Ipv6Envelope { src: Ipv6Addr::from(src), dst: Ipv6Addr::from(dst), src_port, dst_port }
    })
}

fn envelope() -> impl Strategy<Value = Envelope> {
    prop_oneof![ipv4_envelope().prop_map(Envelope::V4), ipv6_envelope().prop_map(Envelope::V6)]
}

/// Any IPv4 header without options; `protocol` and fragmentation as the caller says.
fn ipv4_header_with(
    protocol: impl Strategy<Value = u8>,
    fragments: impl Strategy<Value = (bool, u16)>,
) -> impl Strategy<Value = Ipv4Header> {
    (
        (0..=IpDscp::MAX_U8, 0..=IpEcn::MAX_U8, any::<u16>(), any::<u16>(), any::<bool>(), fragments),
        (any::<u8>(), protocol, any::<u16>(), any::<[u8; 4]>(), any::<[u8; 4]>()),
    )
        .prop_map(
            |(
                (dscp, ecn, total_len, identification, dont_fragment, (more_fragments, offset)),
                (ttl, protocol, header_checksum, source, destination),
            )| Ipv4Header {
                dscp: IpDscp::try_new(dscp).unwrap(),
                ecn: IpEcn::try_new(ecn).unwrap(),
                total_len,
                identification,
                dont_fragment,
                more_fragments,
                fragment_offset: IpFragOffset::try_new(offset).unwrap(),
                time_to_live: ttl,
                protocol: IpNumber(protocol),
                header_checksum,
                source,
                destination,
                options: Default::default(),
            },
        )
}

fn any_ipv4_header() -> impl Strategy<Value = Ipv4Header> {
    ipv4_header_with(any::<u8>(), (any::<bool>(), 0..=IpFragOffset::MAX_U16))
}

fn ipv6_header_with(next_header: impl Strategy<Value = u8>) -> impl Strategy<Value = Ipv6Header> {
    (
        any::<u8>(),
        0..=Ipv6FlowLabel::MAX_U32,
        any::<u16>(),
        next_header,
        any::<u8>(),
        any::<[u8; 16]>(),
        any::<[u8; 16]>(),
    )
        .prop_map(|(traffic_class, flow, payload_length, next_header, hop_limit, source, destination)| {
            Ipv6Header {
                traffic_class,
                flow_label: Ipv6FlowLabel::try_new(flow).unwrap(),
                payload_length,
                next_header: IpNumber(next_header),
                hop_limit,
                source,
                destination,
            }
        })
}

/// An IP header RoCEv2 can travel in: UDP, no options, no fragments.
fn roce_ip_header() -> impl Strategy<Value = IpRepr> {
    prop_oneof![
        ipv4_header_with(Just(17u8), Just((false, 0u16))).prop_map(IpRepr::V4),
        ipv6_header_with(Just(17u8)).prop_map(IpRepr::V6),
    ]
}

fn roce_udp_header() -> impl Strategy<Value = UdpHeader> {
    (any::<u16>(), any::<u16>(), any::<u16>()).prop_map(|(source_port, length, checksum)| UdpHeader {
        source_port,
        destination_port: ROCEV2_UDP_PORT,
        length,
        checksum,
    })
}

// ------------------------------------------------------------------------------------------
// Checks shared by several properties
// ------------------------------------------------------------------------------------------

/// Bytes after the header that emit must leave alone.
const GUARD: usize = 8;

/// Emits into buffers pre-filled with 0x00, 0xa5 and 0xff; all three must come out the same
/// (emit writes every byte it owns) with the bytes past `len` untouched. Returns the output.
fn emit_everywhere(len: usize, emit: impl Fn(&mut [u8])) -> Result<Vec<u8>, TestCaseError> {
    let mut outputs = Vec::new();
    for fill in [0x00u8, 0xa5, 0xff] {
        let mut buf = vec![fill; len + GUARD];
        emit(&mut buf);
        prop_assert!(buf[len..].iter().all(|&b| b == fill), "wrote past {len} bytes (fill {fill:#04x})");
        buf.truncate(len);
        outputs.push(buf);
    }
    prop_assert_eq!(&outputs[0], &outputs[1], "a byte depends on the buffer's old contents");
    prop_assert_eq!(&outputs[0], &outputs[2], "a byte depends on the buffer's old contents");
    Ok(outputs.swap_remove(0))
}

/// The round trip of one fixed-size header: emit writes exactly `len` bytes, all of them,
/// and parse gives back `repr`; one byte less is a truncation.
fn check_header<R: PartialEq + Debug>(
    repr: &R,
    len: usize,
    emit: impl Fn(&R, &mut [u8]),
    parse: impl Fn(&[u8]) -> softrdma_wire::Result<R>,
) -> TestResult {
    let bytes = emit_everywhere(len, |buf| emit(repr, buf))?;
    let parsed = parse(&bytes);
    prop_assert_eq!(parsed.as_ref(), Ok(repr));
    prop_assert_eq!(parse(&bytes[..len - 1]).err(), Some(Error::Truncated));
    Ok(())
}

/// Emits `repr` inside `env` (checking that emit writes every byte and exactly
/// `buffer_len`), then parses it back.
fn emit_roce(repr: &RoceRepr<'_>, env: &Envelope) -> Result<Vec<u8>, TestCaseError> {
    let len = repr.buffer_len();
    emit_everywhere(len, |buf| {
        assert_eq!(repr.emit(env, buf), Ok(len));
    })
}

fn check_roce_round_trip(roce: &Roce, env: &Envelope) -> TestResult {
    let repr = roce.repr();
    prop_assert_eq!(repr.validate(), Ok(()));
    let bytes = emit_roce(&repr, env)?;
    prop_assert_eq!(bytes.len(), repr.buffer_len());
    prop_assert_eq!(bytes.len() % 4, 0);
    let packet = RocePacket::new_checked(&bytes[..]).map_err(|e| TestCaseError::fail(format!("{e:?}")))?;
    prop_assert_eq!(packet.payload(), &roce.payload[..]);
    prop_assert_eq!(packet.pad().len(), repr.pad_len());
    prop_assert!(packet.pad().iter().all(|&b| b == 0), "pad not zero");
    prop_assert_eq!(usize::from(packet.bth().pad_count()), repr.pad_len());
    prop_assert_eq!(packet.headers(), roce.ext.headers());
    prop_assert!(packet.verify_icrc(env));
    prop_assert_eq!(RoceRepr::parse(&packet, env), Ok(repr));
    prop_assert_eq!(RoceRepr::parse_ignoring_icrc(&packet), Ok(repr));
    // A buffer larger than buffer_len is refused only when it is too small.
    let mut short = vec![0u8; repr.buffer_len() - 1];
    prop_assert_eq!(repr.emit(env, &mut short), Err(Error::BufferTooSmall));
    Ok(())
}

/// Calls every accessor of every view over `bytes`, and every parser; none may panic. Also
/// checks the relations between parsers that hold for any input.
fn exercise(bytes: &[u8], env: &Envelope) {
    // Fixed-size header views: accessors are safe once new_checked passes.
    if let Ok(p) = BthPacket::new_checked(bytes) {
        let _ = (p.opcode(), p.solicited_event(), p.mig_req(), p.pad_count(), p.transport_version(), p.pkey());
        let _ = (p.fecn(), p.becn(), p.dest_qp(), p.ack_req(), p.psn());
    }
    let _ = BthRepr::parse(&BthPacket::new_unchecked(bytes));
    if let Ok(p) = RethPacket::new_checked(bytes) {
        let _ = (p.virtual_address(), p.rkey(), p.dma_length(), RethRepr::parse(&p));
    }
    if let Ok(p) = AethPacket::new_checked(bytes) {
        let _ = (p.syndrome_raw(), p.syndrome(), p.msn(), AethRepr::parse(&p));
        assert_eq!(p.syndrome().to_u8(), p.syndrome_raw());
    }
    if let Ok(p) = DethPacket::new_checked(bytes) {
        let _ = (p.qkey(), p.src_qp(), DethRepr::parse(&p));
    }
    if let Ok(p) = AtomicEthPacket::new_checked(bytes) {
        let _ = (p.virtual_address(), p.rkey(), p.swap_add(), p.compare(), AtomicEthRepr::parse(&p));
    }
    if let Ok(p) = AtomicAckEthPacket::new_checked(bytes) {
        let _ = (p.original_data(), AtomicAckEthRepr::parse(&p));
    }
    if let Ok(p) = ImmDtPacket::new_checked(bytes) {
        let _ = (p.immediate(), ImmDtRepr::parse(&p));
    }
    if let Ok(p) = IethPacket::new_checked(bytes) {
        let _ = (p.rkey(), IethRepr::parse(&p));
    }
    if let Ok(p) = FethPacket::new_checked(bytes) {
        let _ = (p.selectivity(), p.placement_type(), FethRepr::parse(&p));
    }

    // The whole packet view.
    if let Ok(p) = RocePacket::new_checked(bytes) {
        let _ = (p.bth(), p.info(), p.headers(), p.header_len());
        let _ = (p.reth().map(|h| RethRepr::parse(&h)), p.aeth().map(|h| AethRepr::parse(&h)));
        let _ = (p.deth().map(|h| DethRepr::parse(&h)), p.atomic_eth().map(|h| AtomicEthRepr::parse(&h)));
        let _ = (p.atomic_ack_eth().map(|h| AtomicAckEthRepr::parse(&h)), p.imm_dt().map(|h| ImmDtRepr::parse(&h)));
        let _ = (p.ieth().map(|h| IethRepr::parse(&h)), p.feth().map(|h| FethRepr::parse(&h)));
        let _ = (p.payload(), p.pad(), p.icrc_covered(), p.icrc(), p.verify_icrc(env));
        assert_eq!(p.header_len() + p.payload().len() + p.pad().len() + 4, bytes.len());
    }
    let unchecked = RocePacket::new_unchecked(bytes);
    let _ = unchecked.verify_icrc(env);
    let checked = RoceRepr::parse(&unchecked, env);
    let ignoring = RoceRepr::parse_ignoring_icrc(&unchecked);
    // The parse fails as `check_len` does wherever that fails, with the same error (a guard
    // for a parse that works the lengths out itself rather than through the view).
    if let Err(e) = unchecked.check_len() {
        assert_eq!(ignoring, Err(e));
    }
    if let Ok(r) = checked {
        // The ICRC is the only extra check `parse` makes.
        assert_eq!(ignoring, Ok(r));
    }
    if let Ok(r) = ignoring {
        // Round-trip oracle: whatever parses re-emits into something that parses the same.
        assert_eq!(r.validate(), Ok(()));
        let mut out = vec![0u8; r.buffer_len()];
        assert_eq!(r.emit(env, &mut out), Ok(r.buffer_len()));
        assert_eq!(RoceRepr::parse(&RocePacket::new_unchecked(&out[..]), env), Ok(r));
    }

    // Framing.
    let _ = UdpDatagram::parse(bytes).map(|d| (d.is_roce(), d.envelope()));
    if let Ok(d) = DatagramRepr::parse(bytes) {
        let mut out = vec![0u8; d.buffer_len()];
        assert_eq!(d.emit(&mut out), Ok(d.buffer_len()));
        assert_eq!(DatagramRepr::parse(&out), Ok(d));
    }
    if let Ok(f) = EthernetFrameRepr::parse(bytes) {
        let mut out = vec![0u8; f.buffer_len()];
        assert_eq!(f.emit(&mut out), Ok(f.buffer_len()));
        assert_eq!(EthernetFrameRepr::parse(&out), Ok(f));
    }
    if let Ok(g) = GrhRepr::parse(bytes) {
        let _ = (g.sgid(), g.dgid());
        let mut out = [0u8; GRH_LEN];
        // Parsed IPv4 GRHs may carry options, which emit refuses.
        if g.emit(&mut out).is_ok() {
            let again = GrhRepr::parse(&out).unwrap();
            assert_eq!((again.sgid(), again.dgid()), (g.sgid(), g.dgid()));
        }
    }
}

/// `bytes` with some bytes overwritten, then cut or extended.
fn mutate(mut bytes: Vec<u8>, edits: &[(usize, u8)], cut: Option<usize>, extra: &[u8]) -> Vec<u8> {
    if !bytes.is_empty() {
        let n = bytes.len();
        for &(at, value) in edits {
            bytes[at % n] = value;
        }
    }
    if let Some(cut) = cut {
        bytes.truncate(cut % (bytes.len() + 1));
    }
    bytes.extend_from_slice(extra);
    bytes
}

fn expected_v4(mut h: Ipv4Header, udp_len: usize) -> Ipv4Header {
    h.total_len = (udp_len + Ipv4Header::MIN_LEN) as u16;
    h.header_checksum = h.calc_header_checksum();
    h
}

// ------------------------------------------------------------------------------------------
// Header round trips
// ------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn bth_round_trips(r in bth()) {
        check_header(&r, 12, |r, b| r.emit(&mut BthPacket::new_unchecked(b)),
            |b| BthRepr::parse(&BthPacket::new_checked(b)?))?;
    }

    #[test]
    fn reth_round_trips(r in reth()) {
        check_header(&r, 16, |r, b| r.emit(&mut RethPacket::new_unchecked(b)),
            |b| RethRepr::parse(&RethPacket::new_checked(b)?))?;
    }

    #[test]
    fn aeth_round_trips(r in aeth()) {
        check_header(&r, 4, |r, b| r.emit(&mut AethPacket::new_unchecked(b)),
            |b| AethRepr::parse(&AethPacket::new_checked(b)?))?;
    }

    #[test]
    fn deth_round_trips(r in deth()) {
        check_header(&r, 8, |r, b| r.emit(&mut DethPacket::new_unchecked(b)),
            |b| DethRepr::parse(&DethPacket::new_checked(b)?))?;
    }

    #[test]
    fn atomic_eth_round_trips(r in atomic_eth()) {
        check_header(&r, 28, |r, b| r.emit(&mut AtomicEthPacket::new_unchecked(b)),
            |b| AtomicEthRepr::parse(&AtomicEthPacket::new_checked(b)?))?;
    }

    #[test]
    fn atomic_ack_eth_round_trips(r in atomic_ack_eth()) {
        check_header(&r, 8, |r, b| r.emit(&mut AtomicAckEthPacket::new_unchecked(b)),
            |b| AtomicAckEthRepr::parse(&AtomicAckEthPacket::new_checked(b)?))?;
    }

    #[test]
    fn imm_dt_round_trips(r in imm_dt()) {
        check_header(&r, 4, |r, b| r.emit(&mut ImmDtPacket::new_unchecked(b)),
            |b| ImmDtRepr::parse(&ImmDtPacket::new_checked(b)?))?;
    }

    #[test]
    fn ieth_round_trips(r in ieth()) {
        check_header(&r, 4, |r, b| r.emit(&mut IethPacket::new_unchecked(b)),
            |b| IethRepr::parse(&IethPacket::new_checked(b)?))?;
    }

    #[test]
    fn feth_round_trips(r in feth()) {
        check_header(&r, 4, |r, b| r.emit(&mut FethPacket::new_unchecked(b)),
            |b| FethRepr::parse(&FethPacket::new_checked(b)?))?;
    }

    /// Out-of-range FETH fields are masked to their 2 and 4 bits, never spill into others.
    #[test]
    fn feth_masks_wide_fields(selectivity in any::<u8>(), placement_type in any::<u8>()) {
        let wide = FethRepr { selectivity, placement_type };
        let masked = FethRepr { selectivity: selectivity & 3, placement_type: placement_type & 0xf };
        let bytes = emit_everywhere(4, |b| wide.emit(&mut FethPacket::new_unchecked(b)))?;
        prop_assert_eq!(FethRepr::parse(&FethPacket::new_checked(&bytes[..])?), Ok(masked));
        prop_assert_eq!(&bytes[..3], &[0u8; 3][..]);
    }

    /// The syndrome byte survives any AETH round trip, reserved values included.
    #[test]
    fn syndrome_byte_round_trips(b in any::<u8>()) {
        prop_assert_eq!(Syndrome::from_u8(b).to_u8(), b);
    }
}

// ------------------------------------------------------------------------------------------
// Whole packets
// ------------------------------------------------------------------------------------------

/// Every opcode of the table, each with its own run of cases, so none is left to chance.
#[test]
fn roce_round_trips_for_every_opcode() {
    for info in OPCODES.iter() {
        let mut runner = TestRunner::new(config(32));
        let result = runner.run(&(roce_for(info), envelope()), |(roce, env)| check_roce_round_trip(&roce, &env));
        if let Err(e) = result {
            panic!("{}: {e}", info.name);
        }
    }
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn roce_round_trips(roce in roce(), env in envelope()) {
        check_roce_round_trip(&roce, &env)?;
    }

    #[test]
    fn unknown_opcodes_round_trip(roce in roce_unknown(), env in envelope()) {
        check_roce_round_trip(&roce, &env)?;
    }

    /// Headers the opcode does not carry, or a payload its rule forbids, are refused.
    #[test]
    fn emit_refuses_what_the_opcode_does_not_allow(
        roce in roce(), other in ext_for(Headers::IMM_DT), env in envelope(), len in 0..=4200usize,
    ) {
        let mut wrong = roce.clone();
        wrong.ext.imm_dt = if roce.ext.imm_dt.is_some() { None } else { other.imm_dt };
        let mut buf = vec![0u8; 4300];
        prop_assert_eq!(wrong.repr().emit(&env, &mut buf), Err(Error::HeaderMismatch));
        let mut bad_len = roce.clone();
        bad_len.payload = vec![0; len];
        let allowed = roce.bth.opcode.info().is_none_or(|i| i.payload.allows(len));
        let got = bad_len.repr().emit(&env, &mut buf);
        prop_assert_eq!(got.is_ok(), allowed, "{:?}", got);
    }

    /// Any single flipped bit outside BTH byte 4 is caught by the ICRC.
    #[test]
    fn flipped_bit_is_an_icrc_error(roce in roce(), env in envelope(), bit in any::<prop::sample::Index>()) {
        let repr = roce.repr();
        let mut bytes = emit_roce(&repr, &env)?;
        let bits = bytes.len() * 8 - 8; // every bit but those of byte 4
        let mut bit = bit.index(bits);
        if bit >= 4 * 8 {
            bit += 8;
        }
        bytes[bit / 8] ^= 1 << (bit % 8);
        prop_assert_eq!(RoceRepr::parse(&RocePacket::new_unchecked(&bytes[..]), &env), Err(Error::BadIcrc));
    }

    /// BTH byte 4 (FECN, BECN, reserved) is variant: any value keeps the ICRC valid, and
    /// only FECN and BECN change in what parses.
    #[test]
    fn bth_byte_4_is_variant(roce in roce(), env in envelope(), byte in any::<u8>()) {
        let repr = roce.repr();
        let mut bytes = emit_roce(&repr, &env)?;
        bytes[4] = byte;
        let mut expected = repr;
        expected.bth.fecn = byte & 0x80 != 0;
        expected.bth.becn = byte & 0x40 != 0;
        prop_assert_eq!(RoceRepr::parse(&RocePacket::new_unchecked(&bytes[..]), &env), Ok(expected));
    }

    /// Any other envelope (as long as it differs in a covered field) breaks the ICRC.
    #[test]
    fn envelope_is_covered(roce in roce(), env in envelope(), other in envelope()) {
        prop_assume!(env != other);
        let bytes = emit_roce(&roce.repr(), &env)?;
        prop_assert_eq!(RoceRepr::parse(&RocePacket::new_unchecked(&bytes[..]), &other), Err(Error::BadIcrc));
    }
}

// ------------------------------------------------------------------------------------------
// IP, UDP, Ethernet and the GRH
// ------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn datagram_round_trips(
        roce in roce(), ip in roce_ip_header(), udp in roce_udp_header(),
        macs in any::<([u8; 6], [u8; 6])>(),
        other_ether_type in prop_oneof![Just(0x0800u16), Just(0x86dd), any::<u16>()],
    ) {
        let d = DatagramRepr { ip, udp, roce: roce.repr() };
        let len = d.buffer_len();
        let bytes = emit_everywhere(len, |buf| assert_eq!(d.emit(buf), Ok(len)))?;
        let parsed = DatagramRepr::parse(&bytes);
        let udp_len = UdpHeader::LEN + d.roce.buffer_len();
        let expected = DatagramRepr {
            ip: match &d.ip {
                IpRepr::V4(h) => IpRepr::V4(expected_v4(h.clone(), udp_len)),
                IpRepr::V6(h) => IpRepr::V6(Ipv6Header { payload_length: udp_len as u16, ..h.clone() }),
            },
            udp: UdpHeader { length: udp_len as u16, ..d.udp.clone() },
            roce: d.roce,
        };
        prop_assert_eq!(parsed.as_ref(), Ok(&expected));
        let dgram = UdpDatagram::parse(&bytes).unwrap();
        prop_assert_eq!(dgram.payload.len(), d.roce.buffer_len());
        prop_assert_eq!(dgram.envelope(), d.envelope());
        // Ethernet padding after the IP packet is ignored.
        let mut padded = bytes.clone();
        padded.extend_from_slice(&[0xa5; 7]);
        let parsed = DatagramRepr::parse(&padded);
        prop_assert_eq!(parsed.as_ref(), Ok(&expected));

        // The same in an Ethernet frame whose EtherType names the IP version.
        let ether_type = match d.ip {
            IpRepr::V4(_) => EtherType::IPV4,
            IpRepr::V6(_) => EtherType::IPV6,
        };
        let ethernet = Ethernet2Header { destination: macs.0, source: macs.1, ether_type };
        let frame = EthernetFrameRepr { ethernet: ethernet.clone(), datagram: d.clone() };
        let flen = frame.buffer_len();
        let fbytes = emit_everywhere(flen, |buf| assert_eq!(frame.emit(buf), Ok(flen)))?;
        prop_assert_eq!(&fbytes[14..], &bytes[..]);
        let expected_frame = EthernetFrameRepr { ethernet: ethernet.clone(), datagram: expected };
        prop_assert_eq!(EthernetFrameRepr::parse(&fbytes), Ok(expected_frame.clone()));

        // Any other EtherType: whatever emit writes must parse back as written.
        let other = EthernetFrameRepr {
            ethernet: Ethernet2Header { ether_type: EtherType(other_ether_type), ..ethernet },
            datagram: d,
        };
        let mut out = vec![0u8; flen];
        if other.emit(&mut out).is_ok() {
            let parsed = EthernetFrameRepr::parse(&out);
            prop_assert_eq!(
                parsed.map(|f| f.ethernet.ether_type), Ok(EtherType(other_ether_type)),
                "emit wrote a frame that does not parse back as written"
            );
        }
    }

    /// Whatever IPv4 header a `DatagramRepr` holds, emit does not panic, and what it emits
    /// parses back or is refused as unsupported (options, fragments) or not RoCE.
    #[test]
    fn datagram_emit_never_panics_for_any_ipv4_header(
        roce in roce(), ip in any_ipv4_header(), options in prop::collection::vec(any::<u8>(), 0..=40),
        udp in roce_udp_header(),
    ) {
        let mut ip = ip;
        ip.options = Ipv4Options::try_from(&options[..options.len() / 4 * 4]).unwrap();
        let d = DatagramRepr { ip: IpRepr::V4(ip.clone()), udp, roce: roce.repr() };
        let mut buf = vec![0u8; d.buffer_len() + 64];
        if d.emit(&mut buf).is_ok() {
            match DatagramRepr::parse(&buf[..d.buffer_len()]) {
                Ok(parsed) => prop_assert_eq!(parsed.roce, d.roce),
                Err(e) => prop_assert!(matches!(e, Error::Unsupported | Error::NotRoce), "{:?} for {:?}", e, ip),
            }
        }
    }

    #[test]
    fn grh_v4_round_trips(h in any_ipv4_header()) {
        let g = GrhRepr::V4(h.clone());
        let area = emit_everywhere(GRH_LEN, |buf| assert_eq!(g.emit(buf), Ok(())))?;
        prop_assert_eq!(&area[..20], &[0u8; 20][..]);
        let mut expected = h;
        expected.header_checksum = expected.calc_header_checksum();
        prop_assert_eq!(GrhRepr::parse(&area), Ok(GrhRepr::V4(expected)));
        // Linux reads it as IPv4 even when byte 0 is garbled into an IPv6 version.
        let mut garbled = area.clone();
        garbled[0] = 0x60;
        prop_assert!(matches!(GrhRepr::parse(&garbled), Ok(GrhRepr::V4(_))));
    }

    #[test]
    fn grh_v6_round_trips(h in ipv6_header_with(any::<u8>())) {
        let g = GrhRepr::V6(h.clone());
        let area = emit_everywhere(GRH_LEN, |buf| assert_eq!(g.emit(buf), Ok(())))?;
        // The documented ambiguity: an IPv6 header whose last 20 bytes happen to be a valid
        // IPv4 header (IHL 5, checksum right) reads as IPv4, as in Linux. Chance: ~2^-24.
        let looks_v4 = Ipv4Header::from_slice(&area[20..])
            .is_ok_and(|(v4, _)| v4.header_len() == 20 && v4.header_checksum == v4.calc_header_checksum());
        prop_assume!(!looks_v4);
        prop_assert_eq!(GrhRepr::parse(&area), Ok(GrhRepr::V6(h)));
    }

    #[test]
    fn grh_of_a_datagram_names_its_gids(ip in roce_ip_header()) {
        let g = GrhRepr::from_ip(&ip);
        let mut area = [0u8; GRH_LEN];
        g.emit(&mut area).unwrap();
        let parsed = GrhRepr::parse(&area).unwrap();
        prop_assert_eq!((parsed.sgid(), parsed.dgid()), (g.sgid(), g.dgid()));
    }
}

// ------------------------------------------------------------------------------------------
// PSN arithmetic
// ------------------------------------------------------------------------------------------

/// A 24-bit distance biased towards the interesting ones: 0, ±1, around half the circle.
fn psn_offset() -> impl Strategy<Value = u32> {
    let h = Psn::HALF;
    prop_oneof![
        4 => 0..Psn::MODULUS,
        1 => select(vec![0, 1, 2, h - 2, h - 1, h, h + 1, h + 2, Psn::MODULUS - 2, Psn::MODULUS - 1]),
    ]
}

proptest! {
    #![proptest_config(config(1024))]

    #[test]
    fn psn_add_then_sub_is_identity(a in psn(), n in any::<u32>()) {
        prop_assert_eq!(a.wrapping_add(n).wrapping_sub(n), a);
        prop_assert_eq!(a.wrapping_sub(n).wrapping_add(n), a);
        prop_assert!(a.wrapping_add(n).value() < Psn::MODULUS);
    }

    #[test]
    fn psn_distance_inverts_add(a in psn(), d in -(Psn::HALF as i32 - 1)..=(Psn::HALF as i32 - 1)) {
        prop_assert_eq!(a.distance_to(a.wrapping_add(d as u32)), d);
        prop_assert_eq!(a.wrapping_add(d as u32).distance_to(a), -d);
    }

    /// `compare` is antisymmetric except at exactly half the circle, where both orders give
    /// the same answer; that case is pinned in `psn_compare_at_half_the_circle`.
    #[test]
    fn psn_compare_is_antisymmetric(a in psn(), d in psn_offset()) {
        prop_assume!(d != Psn::HALF);
        let b = a.wrapping_add(d);
        prop_assert_eq!(a.compare(b), b.compare(a).reverse());
        prop_assert_eq!(a.compare(b) == Ordering::Equal, a == b);
    }

    /// `compare`, `is_before`, `is_after` and `distance_to` tell the same story.
    #[test]
    fn psn_compare_agrees_with_is_before(a in psn(), d in psn_offset()) {
        let b = a.wrapping_add(d);
        prop_assert_eq!(a.compare(b) == Ordering::Less, a.is_before(b), "a={:?} b={:?}", a, b);
        prop_assert_eq!(a.compare(b) == Ordering::Greater, a.is_after(b), "a={:?} b={:?}", a, b);
        prop_assert_eq!(a.is_before(b), a.distance_to(b) > 0);
    }

    #[test]
    fn psn_window_contains_exactly_its_run(s in psn(), len in 0..=Psn::HALF, k in psn_offset(), near in -2i64..=2) {
        let w = PsnWindow::new(s, len).unwrap();
        // Also probe right at the window's edges.
        for k in [k, (i64::from(len) + near).rem_euclid(i64::from(Psn::MODULUS)) as u32] {
            prop_assert_eq!(w.contains(s.wrapping_add(k)), k < len, "start {:?} len {} k {}", s, len, k);
        }
        prop_assert_eq!(w.end(), s.wrapping_add(len));
        prop_assert_eq!(PsnWindow::new(s, Psn::HALF + 1 + k % Psn::HALF), None);
    }
}

#[test]
fn psn_compare_at_half_the_circle() {
    // Half the circle away is ambiguous (psn.rs, `distance_to`): each PSN is at distance
    // -2^23 from the other, and `compare` gives the same answer both ways round.
    for a in [0, 1, Psn::HALF - 1, Psn::MAX.value()] {
        let a = Psn::new(a).unwrap();
        let b = a.wrapping_add(Psn::HALF);
        assert_eq!(a.distance_to(b), -(Psn::HALF as i32));
        assert_eq!(b.distance_to(a), -(Psn::HALF as i32));
        assert_ne!(a.compare(b), Ordering::Equal);
        assert_eq!(a.compare(b), b.compare(a));
    }
}

// ------------------------------------------------------------------------------------------
// Robustness: nothing panics, whatever the bytes
// ------------------------------------------------------------------------------------------

/// Bytes that look like the start of something: raw noise, a BTH of a known opcode, an
/// IPv4 or IPv6 version nibble.
fn noise() -> impl Strategy<Value = Vec<u8>> {
    (
        prop::collection::vec(any::<u8>(), 0..=5000),
        select(vec![None, Some(0x00u8), Some(0x45), Some(0x60)]),
        any::<u8>(),
    )
        .prop_map(|(mut bytes, first, second)| {
            if let (Some(first), Some(b)) = (first, bytes.first_mut()) {
                *b = first;
                if first == 0 && bytes.len() > 1 {
                    // A known opcode with TVer 0.
                    bytes[0] = OPCODES[usize::from(second) % OPCODES.len()].opcode.0;
                    bytes[1] &= 0xf0;
                }
            }
            bytes
        })
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in noise(), env in envelope()) {
        exercise(&bytes, &env);
    }

    /// A valid packet with a few bytes overwritten, cut short or extended: parsers neither
    /// panic nor accept something that does not re-emit to the same value.
    #[test]
    fn mutated_packets_never_panic(
        roce in roce(), env in envelope(), edits in prop::collection::vec((any::<usize>(), any::<u8>()), 0..4),
        cut in prop::option::weighted(0.3, any::<usize>()), extra in prop::collection::vec(any::<u8>(), 0..8),
    ) {
        let bytes = emit_roce(&roce.repr(), &env)?;
        let bytes = mutate(bytes, &edits, cut, &extra);
        exercise(&bytes, &env);
        // Mutated bytes whose ICRC is recomputed get past the ICRC to the layout checks.
        if bytes.len() >= 16 {
            let mut fixed = bytes.clone();
            RocePacket::new_unchecked(&mut fixed[..]).fill_icrc(&env);
            exercise(&fixed, &env);
        }
    }

    #[test]
    fn mutated_datagrams_never_panic(
        roce in roce(), ip in roce_ip_header(), udp in roce_udp_header(),
        edits in prop::collection::vec((any::<usize>(), any::<u8>()), 0..4),
        cut in prop::option::weighted(0.3, any::<usize>()), extra in prop::collection::vec(any::<u8>(), 0..8),
        ether_type in prop_oneof![Just(0x0800u16), Just(0x86dd), any::<u16>()],
    ) {
        let d = DatagramRepr { ip, udp, roce: roce.repr() };
        let mut bytes = vec![0u8; d.buffer_len()];
        d.emit(&mut bytes).unwrap();
        let env = d.envelope();
        let bytes = mutate(bytes, &edits, cut, &extra);
        exercise(&bytes, &env);
        let mut frame = vec![0u8; 12];
        frame.extend_from_slice(&ether_type.to_be_bytes());
        frame.extend_from_slice(&bytes);
        exercise(&frame, &env);
    }
}

// ------------------------------------------------------------------------------------------
// Shrunk failures the properties above found, kept as plain regression tests
// ------------------------------------------------------------------------------------------

fn send_only(payload: &[u8]) -> RoceRepr<'_> {
    RoceRepr {
        bth: BthRepr {
            opcode: Opcode::RC_SEND_ONLY,
            solicited_event: false,
            mig_req: false,
            pkey: PKey::DEFAULT,
            fecn: false,
            becn: false,
            dest_qp: Qpn::new(0x12).unwrap(),
            ack_req: false,
            psn: Psn::new(0).unwrap(),
        },
        ext: ExtHeaders::default(),
        payload,
    }
}

fn udp_to_4791() -> UdpHeader {
    UdpHeader { source_port: 0xc000, destination_port: ROCEV2_UDP_PORT, length: 0, checksum: 0 }
}

/// From `datagram_emit_never_panics_for_any_ipv4_header`: `DatagramRepr::emit` sized the
/// buffer for a 20-byte IPv4 header but wrote `h.to_bytes()`, options included. With 28
/// option bytes and an empty SEND_ONLY it indexed past its buffer and panicked; with 4 it
/// returned `BufferTooSmall` for a buffer of `buffer_len()`. Like `emit_ip_udp` and
/// `GrhRepr::emit`, it must refuse options with `Unsupported`.
#[test]
fn regression_datagram_emit_with_ipv4_options() {
    for option_len in [4usize, 28, 40] {
        let mut ip = Ipv4Header::new(0, 64, IpNumber::UDP, [10, 0, 0, 1], [10, 0, 0, 2]).unwrap();
        ip.options = Ipv4Options::try_from(&vec![1u8; option_len][..]).unwrap();
        let d = DatagramRepr { ip: IpRepr::V4(ip), udp: udp_to_4791(), roce: send_only(&[]) };
        let mut buf = vec![0u8; d.buffer_len()];
        assert_eq!(d.emit(&mut buf), Err(Error::Unsupported), "{option_len} option bytes");
    }
}

/// From `mutated_datagrams_never_panic` (and the `ip_datagram` fuzz target): `EthernetFrameRepr::parse`
/// accepted an IPv6 packet in a frame whose EtherType says IPv4 (0x0800), or the reverse;
/// `emit` then wrote the EtherType of the IP version, so parse → emit → parse did not give
/// back what was parsed.
#[test]
fn regression_ethernet_type_disagrees_with_ip_version() {
    let ip6 = Ipv6Header {
        traffic_class: 0,
        flow_label: Ipv6FlowLabel::ZERO,
        payload_length: 0,
        next_header: IpNumber::UDP,
        hop_limit: 64,
        source: Ipv6Addr::LOCALHOST.octets(),
        destination: Ipv6Addr::LOCALHOST.octets(),
    };
    let ip4 = Ipv4Header::new(0, 64, IpNumber::UDP, [10, 0, 0, 1], [10, 0, 0, 2]).unwrap();
    for (ip, wrong_ether_type) in [(IpRepr::V6(ip6), [0x08, 0x00]), (IpRepr::V4(ip4), [0x86, 0xdd])] {
        let d = DatagramRepr { ip, udp: udp_to_4791(), roce: send_only(b"ping") };
        let mut frame = vec![0u8; 12];
        frame.extend_from_slice(&wrong_ether_type);
        frame.resize(14 + d.buffer_len(), 0);
        d.emit(&mut frame[14..]).unwrap();
        if let Ok(parsed) = EthernetFrameRepr::parse(&frame) {
            let mut out = vec![0u8; parsed.buffer_len()];
            parsed.emit(&mut out).unwrap();
            assert_eq!(EthernetFrameRepr::parse(&out), Ok(parsed), "EtherType {wrong_ether_type:02x?}");
        }
    }
}

/// From `psn_compare_agrees_with_is_before`: at exactly half the circle, `compare` said
/// `Less` both ways round (as rxe's `psn_compare`), but `is_before` and `is_after` said
/// neither; so `a.compare(b) == Less` while `!a.is_before(b)`.
#[test]
fn regression_psn_compare_and_is_before_at_half() {
    let a = Psn::new(0).unwrap();
    let b = Psn::new(Psn::HALF).unwrap();
    assert_eq!(a.compare(b) == Ordering::Less, a.is_before(b));
    assert_eq!(a.compare(b) == Ordering::Greater, a.is_after(b));
}
