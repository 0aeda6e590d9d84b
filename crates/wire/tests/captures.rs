//! Golden vectors: every RoCEv2 packet that the Linux kernel's rxe put on the wire in the
//! project's captures (tests/data, copied from real rxe-to-rxe runs) parses, passes its
//! ICRC, and re-emits byte for byte.

use std::fs::File;
use std::path::{Path, PathBuf};

use pcap_file::pcap::PcapReader;
use softrdma_wire::{Error, EthernetFrameRepr, Opcode, RocePacket, RoceRepr, UdpDatagram};

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data")
}

fn frames(name: &str) -> Vec<Vec<u8>> {
    let file = File::open(data_dir().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    let mut reader = PcapReader::new(file).unwrap();
    let mut out = Vec::new();
    while let Some(packet) = reader.next_packet() {
        out.push(packet.unwrap().data.into_owned());
    }
    out
}

/// (file, frames in the file, RoCEv2 frames in it), counted by tshark with
/// `-Y 'udp.dstport==4791 && !icmp'`.
const CAPTURES: [(&str, usize, usize); 13] = [
    ("guest-to-host-rping-cm-req.pcap", 6, 3),
    ("host-guest-mad-probe.guest-eth0.pcap", 6, 6),
    ("host-guest-mad-probe.pcap", 6, 6),
    ("rxe2rxe-ib_read_lat.pcap", 73, 42),
    ("rxe2rxe-ib_send_bw.pcap", 163, 132),
    ("rxe2rxe-ib_send_lat.pcap", 125, 96),
    ("rxe2rxe-ib_write_bw-rdma_cm.pcap", 255, 255),
    ("rxe2rxe-ib_write_bw.pcap", 219, 180),
    ("rxe2rxe-ib_write_lat.pcap", 116, 88),
    ("rxe2rxe-ibv_rc_pingpong.pcap", 96, 82),
    ("rxe2rxe-ibv_ud_pingpong.pcap", 22, 10),
    ("rxe2rxe-rping.guest1-eth0.pcap", 41, 41),
    ("rxe2rxe-rping.pcap", 67, 65),
];

#[test]
fn every_project_capture_is_listed() {
    let mut on_disk: Vec<String> = std::fs::read_dir(data_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".pcap"))
        .collect();
    on_disk.sort();
    let listed: Vec<&str> = CAPTURES.iter().map(|c| c.0).collect();
    assert_eq!(on_disk, listed);
}

#[test]
fn every_rxe_packet_parses_verifies_and_reemits_identically() {
    let mut total = 0;
    for (name, frame_count, roce_count) in CAPTURES {
        let frames = frames(name);
        assert_eq!(frames.len(), frame_count, "{name}: frame count");
        let mut roce = 0;
        for (i, frame) in frames.iter().enumerate() {
            let repr = match EthernetFrameRepr::parse(frame) {
                Ok(repr) => repr,
                Err(Error::NotRoce) => continue,
                Err(e) => panic!("{name} frame {}: {e}", i + 1),
            };
            roce += 1;
            let mut out = vec![0xa5u8; repr.buffer_len()];
            let n = repr.emit(&mut out).unwrap();
            // Frames shorter than 60 bytes would carry Ethernet padding after the IP packet.
            assert_eq!(&out[..n], &frame[..n], "{name} frame {}: re-emitted bytes differ", i + 1);
            assert!(frame[n..].iter().all(|&b| b == 0), "{name} frame {}: trailing bytes", i + 1);
        }
        assert_eq!(roce, roce_count, "{name}: RoCE frame count");
        total += roce;
    }
    assert_eq!(total, 1006);
}

/// Every opcode class the captures hold, with the count tshark shows per capture.
#[test]
fn opcodes_seen_match_tshark() {
    let mut seen = std::collections::BTreeMap::<u8, usize>::new();
    for (name, ..) in CAPTURES {
        for frame in frames(name) {
            if let Ok(repr) = EthernetFrameRepr::parse(&frame) {
                *seen.entry(repr.datagram.roce.bth.opcode.0).or_default() += 1;
            }
        }
    }
    let names: Vec<(String, usize)> = seen.iter().map(|(&op, &n)| (Opcode(op).to_string(), n)).collect();
    // From `tshark -Y 'udp.dstport==4791 && !icmp' -T fields -e infiniband.bth.opcode`
    // over every capture, `sort -n | uniq -c`.
    let expected: Vec<(String, usize)> = [
        ("RC_SEND_FIRST", 38),
        ("RC_SEND_MIDDLE", 76),
        ("RC_SEND_LAST", 38),
        ("RC_SEND_ONLY", 112),
        ("RC_RDMA_WRITE_FIRST", 40),
        ("RC_RDMA_WRITE_MIDDLE", 240),
        ("RC_RDMA_WRITE_LAST", 40),
        ("RC_RDMA_WRITE_ONLY", 52),
        ("RC_RDMA_READ_REQUEST", 29),
        ("RC_RDMA_READ_RESPONSE_ONLY", 29),
        ("RC_ACKNOWLEDGE", 266),
        ("UD_SEND_ONLY", 46),
    ]
    .iter()
    .map(|&(n, c)| (n.to_string(), c))
    .collect();
    assert_eq!(names, expected);
}

#[test]
fn any_flipped_bit_in_a_real_packet_fails_the_icrc() {
    // An rping READ response and a CM REQ, flipped bit by bit inside the UDP payload.
    let frames = frames("rxe2rxe-rping.pcap");
    for index in [2, 8] {
        let frame = &frames[index];
        let dgram = UdpDatagram::parse(&frame[14..]).unwrap();
        let envelope = dgram.envelope();
        let payload = dgram.payload.to_vec();
        for bit in 0..payload.len() * 8 {
            if bit / 8 == 4 {
                continue; // FECN/BECN byte: variant, masked out of the ICRC
            }
            let mut corrupt = payload.clone();
            corrupt[bit / 8] ^= 1 << (bit % 8);
            let got = RoceRepr::parse(&RocePacket::new_unchecked(&corrupt[..]), &envelope);
            assert_eq!(got, Err(Error::BadIcrc), "frame {} bit {bit}", index + 1);
        }
    }
}

/// A UDP socket does not show the IPv4 identification, which the ICRC covers and kernel rxe
/// sets per packet. For every IPv4 packet rxe sent, the identification recovered from the
/// ICRC alone (the envelope's own set to 0) is the one in the captured header.
#[test]
fn the_identification_of_every_rxe_ipv4_packet_is_recovered_from_its_icrc() {
    use softrdma_wire::icrc::recover_identification;
    use softrdma_wire::{Envelope, IpRepr};
    let (mut recovered, mut nonzero) = (0, 0);
    for (name, ..) in CAPTURES {
        for (i, frame) in frames(name).iter().enumerate() {
            let Ok(repr) = EthernetFrameRepr::parse(frame) else { continue };
            let IpRepr::V4(ip) = &repr.datagram.ip else { continue };
            let Envelope::V4(mut guess) = repr.datagram.envelope() else { unreachable!() };
            guess.identification = 0;
            let dgram = UdpDatagram::parse(&frame[14..]).unwrap();
            let packet = RocePacket::new_checked(dgram.payload).unwrap();
            let got = recover_identification(&Envelope::V4(guess), packet.icrc_covered(), packet.icrc());
            assert_eq!(got, Some(ip.identification), "{name} frame {}", i + 1);
            recovered += 1;
            nonzero += usize::from(ip.identification != 0);
        }
    }
    assert!(recovered > 900 && nonzero > 900, "{recovered} IPv4 packets, {nonzero} with an identification");
}
