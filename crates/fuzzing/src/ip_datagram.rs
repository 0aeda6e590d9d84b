//! Arbitrary bytes as an IP packet, an Ethernet frame and a UD receive buffer's GRH area.
//!
//! - `UdpDatagram::parse`, `DatagramRepr::parse`, `EthernetFrameRepr::parse` and
//!   `GrhRepr::parse` never panic.
//! - Round-trip oracle: whatever they accept re-emits, and the re-emitted bytes parse to the
//!   same value (for a GRH, up to the IPv4 checksum, which emit computes).
//! - Each input is also tried "fixed up": IP and UDP lengths set to the bytes present, the
//!   IPv4 checksum and the ICRC recomputed, so that the fuzzer reaches the RoCE layer
//!   without having to guess a CRC.
use softrdma_wire::grh::{GRH_LEN, GrhRepr};
use softrdma_wire::{DatagramRepr, EthernetFrameRepr, RocePacket, UdpDatagram};

const ETHERNET_LEN: usize = 14;

/// Runs the target on one input; panics when an oracle above does not hold.
pub fn run(data: &[u8]) {
    check_ip(data);
    let fixed = fix_up(data);
    check_ip(&fixed);

    check_frame(data);
    if data.len() >= ETHERNET_LEN {
        let mut frame = data[..ETHERNET_LEN].to_vec();
        frame.extend_from_slice(&fix_up(&data[ETHERNET_LEN..]));
        check_frame(&frame);
    }

    check_grh(data);
}

fn check_ip(data: &[u8]) {
    if let Ok(d) = UdpDatagram::parse(data) {
        let _ = (d.is_roce(), d.envelope());
        assert_eq!(usize::from(d.udp.length), d.payload.len() + 8);
    }
    let Ok(d) = DatagramRepr::parse(data) else { return };
    let _ = d.envelope();
    let mut out = vec![0u8; d.buffer_len()];
    assert_eq!(d.emit(&mut out), Ok(d.buffer_len()));
    assert!(data.len() >= out.len(), "emitted more than was parsed");
    assert_eq!(DatagramRepr::parse(&out), Ok(d), "re-emitted datagram parses differently");
}

fn check_frame(data: &[u8]) {
    let Ok(f) = EthernetFrameRepr::parse(data) else { return };
    let mut out = vec![0u8; f.buffer_len()];
    assert_eq!(f.emit(&mut out), Ok(f.buffer_len()));
    assert_eq!(EthernetFrameRepr::parse(&out), Ok(f), "re-emitted frame parses differently");
}

fn check_grh(data: &[u8]) {
    let Ok(g) = GrhRepr::parse(data) else { return };
    let _ = (g.sgid(), g.dgid());
    let mut area = [0u8; GRH_LEN];
    assert_eq!(g.emit(&mut area), Ok(()), "a parsed GRH does not re-emit");
    let expected = match g {
        GrhRepr::V4(mut h) => {
            h.header_checksum = h.calc_header_checksum();
            GrhRepr::V4(h)
        }
        v6 => v6,
    };
    assert_eq!(GrhRepr::parse(&area), Ok(expected), "re-emitted GRH parses differently");
}

/// `data` with IP and UDP lengths matching its size, a valid IPv4 header checksum and, when
/// it then reads as a UDP datagram, a valid ICRC.
fn fix_up(data: &[u8]) -> Vec<u8> {
    let mut v = data.to_vec();
    let len = v.len().min(usize::from(u16::MAX));
    v.truncate(len);
    match v.first().map(|b| b >> 4) {
        Some(4) if len >= 28 && v[0] & 0x0f == 5 => {
            v[2..4].copy_from_slice(&(len as u16).to_be_bytes());
            v[24..26].copy_from_slice(&((len - 20) as u16).to_be_bytes());
            v[10..12].fill(0);
            let sum = ipv4_checksum(&v[..20]);
            v[10..12].copy_from_slice(&sum.to_be_bytes());
        }
        Some(6) if len >= 48 => {
            v[4..6].copy_from_slice(&((len - 40) as u16).to_be_bytes());
            v[44..46].copy_from_slice(&((len - 40) as u16).to_be_bytes());
        }
        _ => return v,
    }
    if let Ok(d) = UdpDatagram::parse(&v) {
        let env = d.envelope();
        let start = d.ip.header_len() + 8;
        let end = start + d.payload.len();
        if d.payload.len() >= softrdma_wire::roce::MIN_LEN {
            RocePacket::new_unchecked(&mut v[start..end]).fill_icrc(&env);
        }
    }
    v
}

/// The IPv4 header checksum of `header` (its checksum field zeroed).
fn ipv4_checksum(header: &[u8]) -> u16 {
    let mut sum: u32 = header.chunks(2).map(|w| u32::from(u16::from_be_bytes([w[0], w[1]]))).sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}
