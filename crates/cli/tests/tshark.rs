//! An independent check of the codec's layouts: one packet of every opcode in the table,
//! emitted by softrdma-wire, written to a pcap and dissected by Wireshark's tshark. Every
//! field tshark reads must be the value emitted, and tshark must find nothing malformed.
//!
//! This covers the opcodes the kernel captures do not hold (atomics, immediate data,
//! invalidate, NAKs, UC). Where tshark is not installed the test says so and checks only
//! that the capture was written; `.ci/run` installs it.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use softrdma_pcap::CaptureWriter;
use softrdma_wire::opcode::{OPCODES, PayloadRule, Transport};
use softrdma_wire::{
    AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr, Envelope, ExtHeaders, FethRepr, Headers, IethRepr,
    ImmDtRepr, Msn, NakCode, Opcode, PKey, Psn, QKey, Qpn, RKey, RethRepr, RnrTimer, RoceRepr, Syndrome, XrcEthRepr,
};

/// Opcodes tshark 4.0 (Debian bookworm) does not dissect, with the reason.
/// Wireshark 4.0 names the XRC opcodes but dissects none of their headers (it shows them as
/// a vendor-specific header sequence): not cross-checked, for that reason.
const XRC_NOT_IN_TSHARK_4_0: &str = "Wireshark 4.0 names XRC opcodes but does not dissect their headers";

const NOT_IN_TSHARK_4_0: [(Opcode, &str); 3] = [
    (Opcode::RC_FLUSH, "IBA 1.5 FLUSH postdates Wireshark 4.0's dissector"),
    (Opcode::RC_ATOMIC_WRITE, "IBA 1.5 ATOMIC_WRITE postdates Wireshark 4.0's dissector"),
    (Opcode::CNP, "Wireshark 4.0 has no RoCEv2 CNP layout"),
];

/// A packet of `info.opcode` whose every field has a distinctive value.
fn packet(index: usize, opcode: Opcode, payload: &[u8]) -> RoceRepr<'_> {
    let info = opcode.info().unwrap();
    let h = info.headers;
    let i = index as u64;
    // Cycle the AETH through every kind of syndrome.
    let syndrome = match index % 4 {
        0 => Syndrome::ACK_NO_CREDITS,
        1 => Syndrome::RnrNak(RnrTimer::new(12).unwrap()),
        2 => Syndrome::Nak(NakCode::RemoteAccessError),
        _ => Syndrome::Nak(NakCode::PsnSequenceError),
    };
    RoceRepr {
        bth: BthRepr {
            opcode,
            solicited_event: info.position.ends_message() && index % 2 == 0,
            mig_req: false,
            pkey: PKey::DEFAULT,
            fecn: false,
            becn: opcode == Opcode::CNP,
            dest_qp: Qpn::new(0x100 + index as u32).unwrap(),
            ack_req: index % 3 == 0,
            psn: Psn::new(0xabc000 + index as u32).unwrap(),
        },
        ext: ExtHeaders {
            xrceth: h.contains(Headers::XRCETH).then_some(XrcEthRepr { srqn: 0x5_0000 + index as u32 }),
            feth: h.contains(Headers::FETH).then_some(FethRepr { selectivity: 1, placement_type: 2 }),
            reth: h.contains(Headers::RETH).then_some(RethRepr {
                virtual_address: 0x7f00_0000_0000 + i * 0x1000,
                rkey: RKey(0x1000 + index as u32),
                dma_length: 5000 + index as u32,
            }),
            aeth: h
                .contains(Headers::AETH)
                .then_some(AethRepr { syndrome, msn: Msn::new(0x42 + index as u32).unwrap() }),
            deth: h
                .contains(Headers::DETH)
                .then_some(DethRepr { qkey: QKey(0x1111_0000 + index as u32), src_qp: Qpn::new(0x77).unwrap() }),
            atomic_eth: h.contains(Headers::ATOMIC_ETH).then_some(AtomicEthRepr {
                virtual_address: 0x7f00_0000_8000 + i * 8,
                rkey: RKey(0x2000 + index as u32),
                swap_add: 0x1111_2222_3333_4444 + i,
                compare: 0x5555_6666_7777_8888 + i,
            }),
            atomic_ack_eth: h
                .contains(Headers::ATOMIC_ACK_ETH)
                .then_some(AtomicAckEthRepr { original_data: 0x0123_4567_89ab_cdef + i }),
            imm_dt: h.contains(Headers::IMM_DT).then_some(ImmDtRepr((0xdead_0000 + index as u32).to_be_bytes())),
            ieth: h.contains(Headers::IETH).then_some(IethRepr { rkey: RKey(0x3000 + index as u32) }),
        },
        payload,
    }
}

fn payload_for(rule: PayloadRule, index: usize, buf: &[u8]) -> &[u8] {
    match rule {
        PayloadRule::None => &[],
        PayloadRule::PathMtu => &buf[..256],
        // Odd lengths, so that pad counts 1..3 all appear.
        PayloadRule::UpToPathMtuNonEmpty | PayloadRule::UpToPathMtu => &buf[..13 + index % 4],
        PayloadRule::Exactly(n) => &buf[..usize::from(n)],
    }
}

fn tshark_available() -> bool {
    Command::new("tshark").arg("--version").output().is_ok_and(|o| o.status.success())
}

#[test]
fn tshark_dissects_every_opcode_as_emitted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("all-opcodes.pcap");
    let env = Envelope::rocev2([10, 0, 0, 1].into(), 0xc123, [10, 0, 0, 2].into()).unwrap();
    let data: Vec<u8> = (0..=255u8).cycle().take(4096).collect();
    let mut writer = CaptureWriter::create(&path).unwrap();
    let mut expected = Vec::new();
    for (index, info) in OPCODES.iter().enumerate() {
        if NOT_IN_TSHARK_4_0.iter().any(|(op, _)| *op == info.opcode) || info.transport == Transport::Xrc {
            continue;
        }
        let repr = packet(index, info.opcode, payload_for(info.payload, index, &data));
        let mut buf = vec![0u8; repr.buffer_len()];
        repr.emit(&env, &mut buf).unwrap();
        writer.write_roce(Duration::from_secs(1_800_000_000 + index as u64), &env, &buf).unwrap();
        expected.push(repr);
    }
    drop(writer);
    let xrc = OPCODES.iter().filter(|i| i.transport == Transport::Xrc).count();
    assert_eq!(expected.len(), OPCODES.len() - NOT_IN_TSHARK_4_0.len() - xrc);

    if !tshark_available() {
        println!("SKIP tshark cross-check: tshark is not installed (apt-get install tshark; .ci/run does)");
        return;
    }
    for (op, reason) in NOT_IN_TSHARK_4_0 {
        println!("not cross-checked: {op}: {reason}");
    }
    println!("not cross-checked: {xrc} XRC opcodes: {XRC_NOT_IN_TSHARK_4_0}");
    let fields = [
        "infiniband.bth.opcode",
        "infiniband.bth.se",
        "infiniband.bth.padcnt",
        "infiniband.bth.destqp",
        "infiniband.bth.a",
        "infiniband.bth.psn",
        "infiniband.reth.va",
        "infiniband.reth.r_key",
        "infiniband.reth.dmalen",
        "infiniband.aeth.syndrome",
        "infiniband.aeth.msn",
        "infiniband.deth.q_key",
        "infiniband.deth.srcqp",
        "infiniband.atomiceth.swapdt",
        "infiniband.atomiceth.cmpdt",
        "infiniband.atomicacketh.origremdt",
        "infiniband.immdt",
        "infiniband.ieth",
        "_ws.malformed",
        "_ws.expert.severity",
    ];
    let mut cmd = Command::new("tshark");
    cmd.args(["-r", path.to_str().unwrap(), "-T", "fields", "-E", "separator=|", "-E", "occurrence=f"]);
    for f in fields {
        cmd.args(["-e", f]);
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), expected.len());

    let hex = |v: u64| format!("{v:#018x}");
    for (line, repr) in lines.iter().zip(&expected) {
        let got: Vec<&str> = line.split('|').collect();
        let name = repr.bth.opcode.to_string();
        let field = |i: usize| got[i];
        let bth = &repr.bth;
        assert_eq!(field(0), bth.opcode.0.to_string(), "{name}: opcode");
        assert_eq!(field(1), if bth.solicited_event { "1" } else { "0" }, "{name}: SE");
        assert_eq!(field(2), (repr.payload.len().wrapping_neg() & 3).to_string(), "{name}: pad");
        assert_eq!(field(3), format!("{:#08x}", bth.dest_qp.value()), "{name}: dest QP");
        assert_eq!(field(4), if bth.ack_req { "1" } else { "0" }, "{name}: AckReq");
        assert_eq!(field(5), bth.psn.value().to_string(), "{name}: PSN");
        if let Some(r) = &repr.ext.reth {
            assert_eq!(field(6), hex(r.virtual_address), "{name}: RETH VA");
            assert_eq!(field(7), format!("{:#010x}", r.rkey.0), "{name}: RETH R_Key");
            assert_eq!(field(8), r.dma_length.to_string(), "{name}: RETH length");
        } else if let Some(a) = &repr.ext.atomic_eth {
            // Wireshark dissects the AtomicETH's VA and R_Key into the RETH fields.
            assert_eq!(field(6), hex(a.virtual_address), "{name}: AtomicETH VA");
            assert_eq!(field(7), format!("{:#010x}", a.rkey.0), "{name}: AtomicETH R_Key");
        } else {
            assert_eq!(field(6), "", "{name}: no RETH");
        }
        if let Some(a) = &repr.ext.aeth {
            assert_eq!(field(9), a.syndrome.to_u8().to_string(), "{name}: AETH syndrome");
            assert_eq!(field(10), a.msn.value().to_string(), "{name}: AETH MSN");
        } else {
            assert_eq!(field(9), "", "{name}: no AETH");
        }
        if let Some(d) = &repr.ext.deth {
            assert_eq!(field(11), hex(u64::from(d.qkey.0)), "{name}: DETH Q_Key");
            assert_eq!(field(12), format!("{:#010x}", d.src_qp.value()), "{name}: DETH source QP");
        }
        if let Some(a) = &repr.ext.atomic_eth {
            assert_eq!(field(13), a.swap_add.to_string(), "{name}: swap/add");
            assert_eq!(field(14), a.compare.to_string(), "{name}: compare");
        }
        if let Some(a) = &repr.ext.atomic_ack_eth {
            assert_eq!(field(15), a.original_data.to_string(), "{name}: original data");
        }
        if let Some(i) = &repr.ext.imm_dt {
            // tshark lists the ImmDt bytes twice ("dead0003,dead0003"); compare the first.
            assert_eq!(
                field(16).split(',').next().unwrap(),
                format!("{:02x}{:02x}{:02x}{:02x}", i.0[0], i.0[1], i.0[2], i.0[3]),
                "{name}: ImmDt"
            );
        }
        if let Some(i) = &repr.ext.ieth {
            assert_eq!(field(17).split(',').next().unwrap(), format!("{:08x}", i.rkey.0), "{name}: IETH");
        }
        assert_eq!(field(18), "", "{name}: tshark reports it malformed");
        assert!(!["error", "warning"].contains(&field(19)), "{name}: tshark expert info {}", field(19));
    }
}

#[test]
fn decode_reads_back_every_emitted_opcode() {
    // The same packets through `softrdma decode`, including the ones tshark 4.0 cannot read.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("all.pcap");
    let env = Envelope::rocev2([10, 0, 0, 1].into(), 0xc123, [10, 0, 0, 2].into()).unwrap();
    let data = [0x5au8; 4096];
    let mut writer = CaptureWriter::create(&path).unwrap();
    for (index, info) in OPCODES.iter().enumerate() {
        let repr = packet(index, info.opcode, payload_for(info.payload, index, &data));
        let mut buf = vec![0u8; repr.buffer_len()];
        repr.emit(&env, &mut buf).unwrap();
        writer.write_roce(Duration::from_secs(1), &env, &buf).unwrap();
    }
    drop(writer);
    let out =
        Command::new(env!("CARGO_BIN_EXE_softrdma")).args(["decode", "--json"]).arg(Path::new(&path)).output().unwrap();
    assert!(out.status.success());
    let lines: Vec<serde_json::Value> =
        String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), OPCODES.len());
    for (line, info) in lines.iter().zip(OPCODES.iter()) {
        assert_eq!(line["opcode"], info.name);
        assert_eq!(line["icrc"], "ok");
        assert_eq!(line.get("reth").is_some(), info.headers.contains(Headers::RETH), "{}", info.name);
        assert_eq!(line.get("atomic_eth").is_some(), info.headers.contains(Headers::ATOMIC_ETH), "{}", info.name);
        assert_eq!(line.get("imm_data").is_some(), info.headers.contains(Headers::IMM_DT), "{}", info.name);
        assert_eq!(line.get("xrc_srqn").is_some(), info.headers.contains(Headers::XRCETH), "{}", info.name);
        if info.headers.contains(Headers::XRCETH) {
            assert_eq!(line["xrc_srqn"], 0x5_0000 + OPCODES.iter().position(|i| i == info).unwrap() as u64);
        }
    }
}
