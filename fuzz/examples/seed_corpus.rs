//! Seeds `fuzz/corpus/{roce_packet,ip_datagram,mad,engine_ingress}` from the rxe captures in `tests/data`:
//!
//! - `ip_datagram`: every RoCEv2 IP packet (Ethernet header stripped), and the whole frame;
//! - `roce_packet`: its UDP payload (BTH through ICRC);
//! - `mad`: the payload of every UD packet to QP1 (a 256-byte MAD);
//! - `engine_ingress`: each capture's UDP payloads as one sequence (a little-endian
//!   two-byte length before each).
//!
//! `cargo run --manifest-path fuzz/Cargo.toml --example seed_corpus` (stable is enough).

use std::error::Error;
use std::fs::{self, File};
use std::path::Path;

use pcap_file::pcap::PcapReader;
use softrdma_wire::{Qpn, RocePacket, UdpDatagram};

const ETHERNET_LEN: usize = 14;

fn main() -> Result<(), Box<dyn Error>> {
    let fuzz_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let captures = fuzz_dir.join("../tests/data");
    let corpus = fuzz_dir.join("corpus");
    let targets = ["ip_datagram", "roce_packet", "mad", "engine_ingress"];
    for target in targets {
        fs::create_dir_all(corpus.join(target))?;
    }
    let mut written = [0usize; 4];
    let mut write = |target: usize, name: &str, bytes: &[u8]| -> std::io::Result<()> {
        written[target] += 1;
        fs::write(corpus.join(targets[target]).join(name), bytes)
    };

    let mut paths: Vec<_> = fs::read_dir(&captures)?.map(|e| e.map(|e| e.path())).collect::<Result<_, _>>()?;
    paths.retain(|p| p.extension().is_some_and(|e| e == "pcap"));
    paths.sort();
    for path in paths {
        let stem = path.file_stem().unwrap_or_default().to_string_lossy().into_owned();
        let mut reader = PcapReader::new(File::open(&path)?)?;
        let mut index = 0;
        let mut sequence = Vec::new();
        while let Some(packet) = reader.next_packet() {
            let frame = packet?.data;
            index += 1;
            let Some(ip) = frame.get(ETHERNET_LEN..) else { continue };
            let Ok(dgram) = UdpDatagram::parse(ip) else { continue };
            if !dgram.is_roce() {
                continue;
            }
            let name = format!("{stem}-{index:04}");
            write(0, &name, ip)?;
            write(0, &format!("{name}-frame"), &frame)?;
            write(1, &name, dgram.payload)?;
            if let Ok(len) = u16::try_from(dgram.payload.len()) {
                sequence.extend_from_slice(&len.to_le_bytes());
                sequence.extend_from_slice(dgram.payload);
            }
            if let Ok(p) = RocePacket::new_checked(dgram.payload)
                && p.deth().is_some()
                && p.bth().dest_qp() == Qpn::GSI
            {
                write(2, &name, p.payload())?;
            }
        }
        write(3, &stem, &sequence)?;
    }
    for (target, n) in targets.iter().zip(written) {
        println!("{n:5} seeds in {}", corpus.join(target).display());
    }
    Ok(())
}
