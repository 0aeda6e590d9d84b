//! `softrdma decode` end to end: the binary run on the project's kernel rxe captures, its
//! output checked against values read by hand from tshark (Wireshark 4.0) for the same
//! frames.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{data, softrdma};
use serde_json::Value;
use softrdma_pcap::CaptureWriter;
use softrdma_wire::Envelope;

fn decode_json(path: &Path) -> Vec<Value> {
    let out = softrdma(&["decode", "--json", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).expect(l)).collect()
}

fn frame(lines: &[Value], number: u64) -> &Value {
    lines.iter().find(|l| l["frame"] == number).unwrap_or_else(|| panic!("frame {number} not decoded"))
}

#[test]
fn every_capture_decodes_with_valid_icrcs() {
    // RoCEv2 frames per capture, counted by tshark -Y 'udp.dstport==4791 && !icmp'.
    let expected = [
        ("guest-to-host-rping-cm-req.pcap", 3),
        ("host-guest-mad-probe.pcap", 6),
        ("rxe2rxe-ib_read_lat.pcap", 42),
        ("rxe2rxe-ib_send_bw.pcap", 132),
        ("rxe2rxe-ib_send_lat.pcap", 96),
        ("rxe2rxe-ib_write_bw-rdma_cm.pcap", 255),
        ("rxe2rxe-ib_write_bw.pcap", 180),
        ("rxe2rxe-ib_write_lat.pcap", 88),
        ("rxe2rxe-ibv_rc_pingpong.pcap", 82),
        ("rxe2rxe-ibv_ud_pingpong.pcap", 10),
        ("rxe2rxe-rping.pcap", 65),
    ];
    for (name, count) in expected {
        let lines = decode_json(&data(name));
        assert_eq!(lines.len(), count, "{name}");
        for l in &lines {
            assert_eq!(l["icrc"], "ok", "{name}: {l}");
            assert!(l.get("malformed").is_none(), "{name}: {l}");
        }
    }
}

/// Each row: capture, frame, and fields as tshark shows them (`-T fields -e ...`).
#[test]
fn fields_match_tshark() {
    struct Row {
        file: &'static str,
        frame: u64,
        time: f64,
        src: &'static str,
        src_port: u64,
        dst: &'static str,
        opcode: u64,
        dest_qp: u64,
        psn: u64,
        ack_req: bool,
        icrc_wire: &'static str,
    }
    let rows = [
        Row {
            file: "rxe2rxe-rping.pcap",
            frame: 8,
            time: 0.240209,
            src: "198.18.0.3",
            src_port: 59460,
            dst: "198.18.0.2",
            opcode: 12,
            dest_qp: 0x5b,
            psn: 736235,
            ack_req: true,
            icrc_wire: "da163c55",
        },
        Row {
            file: "rxe2rxe-rping.pcap",
            frame: 9,
            time: 0.241432,
            src: "198.18.0.2",
            src_port: 59460,
            dst: "198.18.0.3",
            opcode: 16,
            dest_qp: 0x11,
            psn: 736235,
            ack_req: false,
            icrc_wire: "6bcf76a3",
        },
        Row {
            file: "rxe2rxe-ib_read_lat.pcap",
            frame: 25,
            time: 0.578120,
            src: "198.18.0.2",
            src_port: 51264,
            dst: "198.18.0.3",
            opcode: 12,
            dest_qp: 0x16,
            psn: 14486952,
            ack_req: true,
            icrc_wire: "d05557b4",
        },
        Row {
            file: "rxe2rxe-ib_write_bw.pcap",
            frame: 20,
            time: 1.099626,
            src: "198.18.0.2",
            src_port: 51032,
            dst: "198.18.0.3",
            opcode: 6,
            dest_qp: 0x14,
            psn: 1513236,
            ack_req: false,
            icrc_wire: "ac1cc32f",
        },
        Row {
            file: "rxe2rxe-ib_write_bw.pcap",
            frame: 150,
            time: 1.158889,
            src: "198.18.0.3",
            src_port: 51032,
            dst: "198.18.0.2",
            opcode: 17,
            dest_qp: 0x5e,
            psn: 1513243,
            ack_req: false,
            icrc_wire: "86ed02f4",
        },
        Row {
            file: "rxe2rxe-ib_write_lat.pcap",
            frame: 25,
            time: 0.939356,
            src: "198.18.0.3",
            src_port: 51147,
            dst: "198.18.0.2",
            opcode: 10,
            dest_qp: 0x5f,
            psn: 13388752,
            ack_req: true,
            icrc_wire: "f697a12f",
        },
        Row {
            file: "rxe2rxe-ibv_ud_pingpong.pcap",
            frame: 13,
            time: 0.038165,
            src: "198.18.0.2",
            src_port: 57718,
            dst: "198.18.0.3",
            opcode: 100,
            dest_qp: 0x13,
            psn: 7042350,
            ack_req: false,
            icrc_wire: "a2ed0ba1",
        },
        Row {
            file: "rxe2rxe-ibv_rc_pingpong.pcap",
            frame: 12,
            time: 0.959235,
            src: "198.18.0.2",
            src_port: 50808,
            dst: "198.18.0.3",
            opcode: 0,
            dest_qp: 0x12,
            psn: 8876580,
            ack_req: false,
            icrc_wire: "46847d7f",
        },
        Row {
            file: "rxe2rxe-ib_send_lat.pcap",
            frame: 24,
            time: 1.006378,
            src: "198.18.0.3",
            src_port: 51383,
            dst: "198.18.0.2",
            opcode: 17,
            dest_qp: 0x61,
            psn: 4950286,
            ack_req: false,
            icrc_wire: "58d023ac",
        },
        Row {
            file: "rxe2rxe-ib_send_bw.pcap",
            frame: 104,
            time: 0.213054,
            src: "198.18.0.3",
            src_port: 51504,
            dst: "198.18.0.2",
            opcode: 17,
            dest_qp: 0x62,
            psn: 10998689,
            ack_req: false,
            icrc_wire: "9e3e8e6c",
        },
        Row {
            file: "rxe2rxe-ib_write_bw-rdma_cm.pcap",
            frame: 43,
            time: 1.338609,
            src: "198.18.0.2",
            src_port: 62231,
            dst: "198.18.0.3",
            opcode: 6,
            dest_qp: 0x1a,
            psn: 2054294,
            ack_req: false,
            icrc_wire: "1493e07d",
        },
        Row {
            file: "rxe2rxe-rping.guest1-eth0.pcap",
            frame: 7,
            time: 0.034030,
            src: "198.18.0.2",
            src_port: 54459,
            dst: "198.18.0.3",
            opcode: 16,
            dest_qp: 0x1b,
            psn: 16584940,
            ack_req: false,
            icrc_wire: "5abecb02",
        },
        Row {
            file: "guest-to-host-rping-cm-req.pcap",
            frame: 5,
            time: 11.795276,
            src: "198.18.0.2",
            src_port: 55410,
            dst: "198.18.0.1",
            opcode: 100,
            dest_qp: 1,
            psn: 28,
            ack_req: true,
            icrc_wire: "9deba18d",
        },
    ];
    for r in rows {
        let lines = decode_json(&data(r.file));
        let l = frame(&lines, r.frame);
        let what = format!("{} frame {}", r.file, r.frame);
        assert!((l["time"].as_f64().unwrap() - r.time).abs() < 1e-6, "{what}: time {}", l["time"]);
        assert_eq!(l["src"], r.src, "{what}");
        assert_eq!(l["src_port"], r.src_port, "{what}");
        assert_eq!(l["dst"], r.dst, "{what}");
        assert_eq!(l["dst_port"], 4791, "{what}");
        assert_eq!(l["opcode_value"], r.opcode, "{what}");
        assert_eq!(l["dest_qp"], r.dest_qp, "{what}");
        assert_eq!(l["psn"], r.psn, "{what}");
        assert_eq!(l["ack_req"], r.ack_req, "{what}");
        assert_eq!(l["icrc_wire"], r.icrc_wire, "{what}");
    }
}

#[test]
fn extended_headers_match_tshark() {
    let rping = decode_json(&data("rxe2rxe-rping.pcap"));
    // Frame 8: RETH VA 0x000055da91e805e0, R_Key 0x000069c0, DMA length 64.
    let reth = &frame(&rping, 8)["reth"];
    assert_eq!(reth["va"], 0x0000_55da_91e8_05e0u64);
    assert_eq!(reth["rkey"], 0x69c0);
    assert_eq!(reth["dma_length"], 64);
    // Frame 9: READ response, AETH syndrome 31 (ACK), MSN 1, 64 bytes of data.
    let resp = frame(&rping, 9);
    assert_eq!(resp["aeth"]["syndrome"], 31);
    assert_eq!(resp["aeth"]["kind"], "ACK");
    assert_eq!(resp["aeth"]["msn"], 1);
    assert_eq!(resp["payload_len"], 64);

    let write_bw = decode_json(&data("rxe2rxe-ib_write_bw.pcap"));
    // Frame 20: WRITE_FIRST, RETH VA 0x000055d69c8c6000, R_Key 0x0000075a, DMA length 8192.
    let reth = &frame(&write_bw, 20)["reth"];
    assert_eq!(reth["va"], 0x0000_55d6_9c8c_6000u64);
    assert_eq!(reth["rkey"], 0x075a);
    assert_eq!(reth["dma_length"], 8192);

    let read_lat = decode_json(&data("rxe2rxe-ib_read_lat.pcap"));
    // Frame 25: RETH VA 0x00005562752dd000, R_Key 0x00000954, DMA length 64.
    let reth = &frame(&read_lat, 25)["reth"];
    assert_eq!(reth["va"], 0x0000_5562_752d_d000u64);
    assert_eq!(reth["rkey"], 0x0954);

    let ud = decode_json(&data("rxe2rxe-ibv_ud_pingpong.pcap"));
    // Frame 13: DETH Q_Key 0x11111111, source QP 0x5d.
    let deth = &frame(&ud, 13)["deth"];
    assert_eq!(deth["qkey"], 0x1111_1111);
    assert_eq!(deth["src_qp"], 0x5d);

    let cm = decode_json(&data("guest-to-host-rping-cm-req.pcap"));
    // Frame 5 (the REJ): DETH Q_Key 0x80010000 (GSI), source QP 1.
    let deth = &frame(&cm, 5)["deth"];
    assert_eq!(deth["qkey"], 0x8001_0000u64);
    assert_eq!(deth["src_qp"], 1);

    // The two padded packets (tshark: infiniband.bth.padcnt == 2).
    let rdma_cm = decode_json(&data("rxe2rxe-ib_write_bw-rdma_cm.pcap"));
    for n in [16, 18] {
        assert_eq!(frame(&rdma_cm, n)["pad"], 2, "frame {n}");
        assert_eq!(frame(&rdma_cm, n)["opcode"], "RC_SEND_ONLY", "frame {n}");
    }
}

#[test]
fn cm_messages_match_tshark() {
    let rping = decode_json(&data("rxe2rxe-rping.pcap"));
    // Frame 3, the REQ: TID 0x000000022dbcdc8f, Local Communication ID 0x8fdcbc2d, Local QPN
    // 0x00005b, Starting PSN 0x0b3beb; IP CM source port 0xa9b0, 198.18.0.2 to 198.18.0.3;
    // service ID: rdma_cm TCP port space (0x0106), port 7174 (rping's default).
    let mad = &frame(&rping, 3)["mad"];
    assert_eq!(mad["class"], "CM");
    assert_eq!(mad["method"], "SEND");
    assert_eq!(mad["attribute_id"], 0x0010);
    assert_eq!(mad["transaction_id"], 0x0000_0002_2dbc_dc8fu64);
    let req = &mad["cm"];
    assert_eq!(req["message"], "REQ");
    assert_eq!(req["local_comm_id"], 0x8fdc_bc2du64);
    assert_eq!(req["qpn"], 0x5b);
    assert_eq!(req["starting_psn"], 0x0b_3beb);
    assert_eq!(req["service_id"], 0x0106_1c06);
    assert_eq!(req["rdma_cm"]["src_port"], 0xa9b0);
    assert_eq!(req["rdma_cm"]["src"], "198.18.0.2");
    assert_eq!(req["rdma_cm"]["dst"], "198.18.0.3");
    assert_eq!(req["rdma_cm"]["dst_port"], 7174);
    // Frame 4, the REP: Local 0xe1aea61d, Remote 0x8fdcbc2d, QPN 0x000011, PSN 0x296126.
    let rep = &frame(&rping, 4)["mad"]["cm"];
    assert_eq!(rep["message"], "REP");
    assert_eq!(rep["local_comm_id"], 0xe1ae_a61du64);
    assert_eq!(rep["remote_comm_id"], 0x8fdc_bc2du64);
    assert_eq!(rep["qpn"], 0x11);
    assert_eq!(rep["starting_psn"], 0x29_6126);
    let names: Vec<&str> = rping.iter().filter_map(|l| l["mad"]["cm"]["message"].as_str()).collect();
    assert_eq!(names, ["REQ", "REP", "RTU", "DREQ", "DREP"]);

    // The REJ after an unanswered REQ: Local 0x8cdcbc2d, Remote 0, reason 0x0004 (timeout).
    let cm = decode_json(&data("guest-to-host-rping-cm-req.pcap"));
    let rej = &frame(&cm, 5)["mad"]["cm"];
    assert_eq!(rej["message"], "REJ");
    assert_eq!(rej["local_comm_id"], 0x8cdc_bc2du64);
    assert_eq!(rej["remote_comm_id"], 0);
    assert_eq!(rej["reason_value"], 4);

    // A performance-management MAD: class 0x04, GetResp (0x81), attribute 0x0012
    // (PortCounters), TID 0x30e17d90d1839b5f. Not CM, so no "cm" object.
    let probe = decode_json(&data("host-guest-mad-probe.pcap"));
    let mad = &frame(&probe, 2)["mad"];
    assert_eq!(mad["class_value"], 4);
    assert_eq!(mad["method_value"], 0x81);
    assert_eq!(mad["attribute_id"], 0x0012);
    assert_eq!(mad["transaction_id"], 0x30e1_7d90_d183_9b5fu64);
    assert!(mad.get("cm").is_none());
}

#[test]
fn text_output_reads_like_the_protocol() {
    let out = softrdma(&["decode", data("rxe2rxe-rping.pcap").to_str().unwrap()]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let line8 = text.lines().find(|l| l.trim_start().starts_with("8 ")).unwrap();
    assert_eq!(
        line8,
        "     8    0.240209 198.18.0.3:59460 → 198.18.0.2:4791 RC_RDMA_READ_REQUEST dqp=0x00005b psn=736235 \
         ackreq=1 va=0x55da91e805e0 rkey=0x000069c0 dmalen=64 len=0 icrc=ok"
    );
    let line3 = text.lines().find(|l| l.trim_start().starts_with("3 ")).unwrap();
    assert!(
        line3.ends_with(
            "mad=CM/SEND attr=REQ tid=0x000000022dbcdc8f cm=REQ local_comm_id=0x8fdcbc2d \
             service_id=0x0000000001061c06 qpn=0x00005b start_psn=736235 \
             rdma_cm=TCP:198.18.0.2:43440→198.18.0.3:7174 len=256 icrc=ok"
        ),
        "{line3}"
    );
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(
        stderr.trim(),
        "softrdma decode: 67 frames: 65 RoCEv2 (65 ICRC ok, 0 bad), 2 other skipped, 0 malformed"
    );
}

#[test]
fn corrupt_truncated_and_foreign_frames() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mixed.pcap");
    let env = Envelope::rocev2([127, 0, 0, 1].into(), 0xc000, [127, 0, 0, 2].into()).unwrap();
    // A valid RC SEND_ONLY "ping" from the wire crate's worked example layout.
    let mut send = vec![0x04, 0x00, 0xff, 0xff, 0, 0, 0, 0x12, 0x80, 0, 0, 1, b'p', b'i', b'n', b'g', 0, 0, 0, 0];
    softrdma_wire::RocePacket::new_unchecked(&mut send[..]).fill_icrc(&env);
    let mut corrupt = send.clone();
    corrupt[13] ^= 0x01;
    let mut w = CaptureWriter::create(&path).unwrap();
    let t = Duration::from_secs(1_700_000_000);
    w.write_roce(t, &env, &send).unwrap();
    w.write_roce(t + Duration::from_millis(1), &env, &corrupt).unwrap();
    w.write_roce(t + Duration::from_millis(2), &env, &send[..10]).unwrap();
    // An ARP frame (not IP) and a frame of garbage.
    w.write_frame(
        t,
        &[0xff; 6].iter().chain(&[2, 0, 0, 0, 0, 1, 0x08, 0x06]).copied().chain([0; 28]).collect::<Vec<_>>(),
    )
    .unwrap();
    w.write_frame(t, &[0x42; 5]).unwrap();
    drop(w);

    let lines = decode_json(&path);
    assert_eq!(lines.len(), 3);
    assert_eq!(lines[0]["icrc"], "ok");
    assert_eq!(lines[0]["payload_len"], 4);
    assert_eq!(lines[1]["icrc"], "BAD");
    assert!(lines[2]["malformed"].as_str().unwrap().starts_with("truncated"), "{}", lines[2]);

    let out = softrdma(&["decode", path.to_str().unwrap()]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.lines().nth(1).unwrap().ends_with("icrc=BAD"), "{text}");
    assert!(text.lines().nth(2).unwrap().contains("malformed: truncated"), "{text}");
    assert_eq!(
        String::from_utf8(out.stderr).unwrap().trim(),
        "softrdma decode: 5 frames: 2 RoCEv2 (1 ICRC ok, 1 bad), 2 other skipped, 1 malformed"
    );
}

#[test]
fn usage_and_file_errors_are_one_line() {
    let missing = softrdma(&["decode", "/nonexistent/capture.pcap"]);
    assert_eq!(missing.status.code(), Some(1));
    let err = String::from_utf8(missing.stderr).unwrap();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("softrdma decode: cannot open /nonexistent/capture.pcap: "), "{err}");

    let not_pcap = softrdma(&["decode", concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml")]);
    assert_eq!(not_pcap.status.code(), Some(1));
    assert!(String::from_utf8(not_pcap.stderr).unwrap().starts_with("softrdma decode: not a readable pcap"));

    let bad_flag = softrdma(&["decode", "--bogus", "x.pcap"]);
    assert_eq!(bad_flag.status.code(), Some(2));
}
