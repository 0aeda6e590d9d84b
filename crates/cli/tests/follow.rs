//! `softrdma decode --follow`: a capture read as one QP's conversation. Against kernel rxe's
//! captures (tests/data: rping with its CM exchange, perftest without one), the peer is
//! found, messages are numbered and each is paired with its ACK or response; against a
//! capture of two softrdma engines on the simulator's fabric with packets lost, the
//! retransmissions are marked and the NAKs named.

mod common;

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{data, softrdma};
use serde_json::Value;
use softrdma_engine::*;
use softrdma_sim::{Datagram, Fabric, Tap, Verdict};
use softrdma_wire::{Envelope, Opcode, Qpn};

/// The JSON lines of `decode --follow`: the conversation, the packets, the summary.
fn follow(path: &Path, target: &str) -> (Value, Vec<Value>, Value) {
    let out = softrdma(&["decode", "--json", "--follow", target, path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut lines: Vec<Value> =
        String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).expect(l)).collect();
    let summary = lines.pop().unwrap()["summary"].clone();
    let conversation = lines.remove(0)["conversation"].clone();
    (conversation, lines, summary)
}

fn frame(lines: &[Value], n: u64) -> &Value {
    lines.iter().find(|l| l["frame"] == n).unwrap_or_else(|| panic!("frame {n} is not in the conversation"))
}

#[test]
fn rping_is_followed_from_either_end_with_every_message_paired() {
    // rping: 198.18.0.2 (QP 0x5b) connects to 198.18.0.3 (QP 0x11) with rdma_cm; the
    // server READs the client's buffer, the client SENDs, and so on, 10 rounds.
    let path = data("rxe2rxe-rping.pcap");
    let (c, lines, s) = follow(&path, "0x11");
    assert_eq!(c["a_host"], "198.18.0.3");
    assert_eq!(c["a_qpn"], 0x11);
    assert_eq!(c["b_host"], "198.18.0.2");
    assert_eq!(c["b_qpn"], 0x5b);
    assert_eq!(c["peer_found_by"], "cm");
    // Every RoCEv2 frame of the capture is this connection's: 60 on the QPs, 5 CM MADs.
    assert_eq!(lines.len(), 65);
    assert_eq!(s["cm_messages"], 5);
    assert_eq!(frame(&lines, 3)["cm"]["message"], "REQ");
    assert_eq!(frame(&lines, 3)["dir"], "B>A");
    // The client's first SEND (B1) and its ACK.
    let send = frame(&lines, 5);
    assert_eq!(send["message"]["id"], "B1");
    assert_eq!(send["message"]["op"], "SEND");
    assert_eq!(send["message"]["part"], "only");
    assert_eq!(send["acked_by"], 7);
    assert_eq!(frame(&lines, 7)["acks"], serde_json::json!(["B1"]));
    // The server's first READ (A1), answered by its response.
    let read = frame(&lines, 8);
    assert_eq!(read["dir"], "A>B");
    assert_eq!(read["message"]["id"], "A1");
    assert_eq!(read["message"]["op"], "READ");
    assert_eq!(read["message"]["part"], "request");
    assert_eq!(read["acked_by"], 9);
    let response = frame(&lines, 9);
    assert_eq!(response["message"]["id"], "A1");
    assert_eq!(response["message"]["part"], "response only");
    // Then a SEND (A2), a WRITE (A3), a SEND (A4): the numbering runs per requester.
    assert_eq!(frame(&lines, 10)["message"]["id"], "A2");
    assert_eq!(frame(&lines, 12)["message"]["id"], "B2");
    assert_eq!(frame(&lines, 14)["message"]["op"], "WRITE");
    assert_eq!(frame(&lines, 14)["message"]["id"], "A3");
    assert_eq!(frame(&lines, 64)["message"]["id"], "A20");
    // Every request is answered by the next packet on the QPs (the RTU may come between).
    let on_qps: Vec<&Value> = lines.iter().filter(|l| l.get("cm").is_none()).collect();
    for (i, l) in on_qps.iter().enumerate() {
        if let Some(by) = l.get("acked_by") {
            assert_eq!(by, &on_qps[i + 1]["frame"], "{l}");
        }
    }
    assert_eq!(on_qps.iter().filter(|l| l.get("acked_by").is_some()).count(), 30);
    assert_eq!(s["messages_a"], serde_json::json!({"READ": 5, "SEND": 10, "WRITE": 5}));
    assert_eq!(s["messages_b"], serde_json::json!({"SEND": 10}));
    assert_eq!(s["unacked_a"], 0);
    assert_eq!(s["unacked_b"], 0);
    assert_eq!(s["retransmissions_a"], 0);
    assert_eq!(s["naks"], serde_json::json!({}));
    assert!(lines.iter().all(|l| l.get("retransmission").is_none()));

    // From the other end, the same conversation with the sides swapped.
    let (c, lines, s) = follow(&path, "198.18.0.2/0x5b");
    assert_eq!((c["a_qpn"].as_u64(), c["b_qpn"].as_u64()), (Some(0x5b), Some(0x11)));
    assert_eq!(lines.len(), 65);
    assert_eq!(frame(&lines, 8)["message"]["id"], "B1");
    assert_eq!(frame(&lines, 5)["message"]["id"], "A1");
    assert_eq!(s["messages_b"], serde_json::json!({"READ": 5, "SEND": 10, "WRITE": 5}));
}

#[test]
fn without_the_cm_the_peer_is_the_qp_whose_psns_answer() {
    // ib_write_bw: connected over TCP (no CM), 20 WRITEs of 8 KiB in 1 KiB packets from
    // 198.18.0.2 to QP 0x14 on 198.18.0.3, acknowledged in ACKs that cover several.
    let (c, lines, s) = follow(&data("rxe2rxe-ib_write_bw.pcap"), "0x14");
    assert_eq!(c["a_host"], "198.18.0.3");
    assert_eq!(c["b_qpn"], 0x5e);
    assert_eq!(c["peer_found_by"], "psn");
    assert_eq!(lines.len(), 180);
    assert_eq!(s["messages_b"], serde_json::json!({"WRITE": 20}));
    assert_eq!(s["unacked_b"], 0);
    let parts: Vec<&str> = lines.iter().take(8).map(|l| l["message"]["part"].as_str().unwrap()).collect::<Vec<_>>();
    assert_eq!(parts, ["first", "middle", "middle", "middle", "middle", "middle", "middle", "last"]);
    assert!(lines.iter().take(8).all(|l| l["message"]["id"] == "B1"));
    // B1 ends at frame 27 and is acknowledged by the ACK in frame 150.
    assert_eq!(frame(&lines, 27)["acked_by"], 150);
    assert_eq!(frame(&lines, 150)["dir"], "A>B");
    assert!(frame(&lines, 150)["acks"].as_array().unwrap().contains(&Value::from("B1")));
    // Each message's packets carry its number, in order.
    let mut last = 0;
    for l in lines.iter().filter(|l| l["dir"] == "B>A") {
        let n = l["message"]["number"].as_u64().unwrap();
        assert!(n == last || n == last + 1, "{l}");
        last = n;
    }
    assert_eq!(last, 20);
}

#[test]
fn read_requests_are_paired_with_their_responses_and_a_kernel_retry_is_marked() {
    // ib_read_lat: READs from QP 0x60 on 198.18.0.2, each answered by one response. The
    // 17th's response was slow (the emulated guest): rxe's requester timed out and sent the
    // READ again (frame 58), and the responder answered both (59 and 60).
    let (c, lines, s) = follow(&data("rxe2rxe-ib_read_lat.pcap"), "0x16");
    assert_eq!(c["b_qpn"], 0x60);
    assert_eq!(lines.len(), 42);
    let requests: Vec<&Value> = lines.iter().filter(|l| l["message"]["part"] == "request").collect();
    assert_eq!(requests.len(), 21);
    for r in &requests {
        let by = r["acked_by"].as_u64().expect("every READ answered");
        let response = frame(&lines, by);
        assert_eq!(response["message"]["id"], r["message"]["id"]);
        assert_eq!(response["message"]["part"], "response only");
        assert_eq!(response["psn"], r["psn"]);
    }
    assert_eq!(frame(&lines, 57)["message"]["id"], "B17");
    assert!(frame(&lines, 57).get("retransmission").is_none());
    assert_eq!(frame(&lines, 58)["message"]["id"], "B17");
    assert_eq!(frame(&lines, 58)["retransmission"], true);
    assert_eq!(frame(&lines, 58)["acked_by"], 59);
    assert_eq!(frame(&lines, 59)["acks"], serde_json::json!(["B17"]));
    assert_eq!(frame(&lines, 60)["retransmission"], true, "the second answer repeats the first");
    assert_eq!(frame(&lines, 61)["message"]["id"], "B18");
    assert_eq!(s["messages_b"], serde_json::json!({"READ": 20}));
    assert_eq!(s["retransmissions_b"], 1);
    assert_eq!(s["unacked_b"], 0);
}

#[test]
fn a_qpn_nobody_sends_to_is_an_error_naming_the_qps_there_are() {
    let out = softrdma(&["decode", "--follow", "0x999", data("rxe2rxe-rping.pcap").to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no packet goes to QP 0x000999"), "{err}");
    assert!(err.contains("0x000011") && err.contains("0x00005b"), "{err}");
    let out = softrdma(&["decode", "--follow", "zz", data("rxe2rxe-rping.pcap").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not a QP number"));
}

// ---- A capture with losses: two engines on the simulator's fabric ----

const BASE: u64 = 0x1000_0000;
const MEM: usize = 1 << 20;

/// An engine with one PD, CQ, region and RC QP, as a node of the fabric.
struct EngineNode {
    engine: Engine,
    mem: VecMemory,
    ip: IpAddr,
    cq: CqId,
    keys: MrKeys,
    qp: Qpn,
}

impl softrdma_sim::Node for EngineNode {
    fn addresses(&self) -> Vec<IpAddr> {
        vec![self.ip]
    }
    fn handle_datagram(&mut self, now: softrdma_sim::Time, envelope: &Envelope, payload: &[u8]) {
        self.engine.handle_datagram(now, envelope, payload, &mut self.mem);
    }
    fn handle_timeout(&mut self, now: softrdma_sim::Time) {
        self.engine.handle_timeout(now);
    }
    fn poll_transmit(&mut self, now: softrdma_sim::Time, buf: &mut [u8]) -> Option<(Envelope, usize)> {
        self.engine.poll_transmit(now, &mut self.mem, buf).map(|t| (t.envelope, t.len))
    }
    fn poll_timeout(&self) -> Option<softrdma_sim::Time> {
        self.engine.poll_timeout()
    }
}

fn engine_node(ip: [u8; 4], seed: u64) -> EngineNode {
    let ip = IpAddr::from(ip);
    let mut engine = Engine::new(DeviceConfig { addresses: vec![ip], seed, ..DeviceConfig::default() });
    let pd = engine.alloc_pd();
    let cq = engine.create_cq(64).unwrap();
    let keys = engine.reg_mr(pd, BASE, MEM as u64, Access::ALL).unwrap();
    let init = QpInitAttr {
        pd,
        send_cq: cq,
        recv_cq: cq,
        srq: None,
        qp_type: QpType::Rc,
        cap: QpCap::default(),
        sq_sig_all: true,
    };
    let qp = engine.create_qp(&init).unwrap();
    EngineNode { engine, mem: VecMemory::new(BASE, MEM), ip, cq, keys, qp }
}

/// A SEND that finds no receive (RNR NAK), a WRITE whose first MIDDLE packet is lost (PSN
/// sequence error NAK, go back), a READ whose MIDDLE response is lost (the READ asked
/// again from there), and a WRITE with a bad R_Key (remote access error), from A
/// (10.0.0.1) to B (10.0.0.2), captured as they entered the fabric (`path`) and as they
/// arrived (`delivered`). Returns A's and B's QPNs.
fn lossy_capture(path: &Path, delivered: &Path) -> (Qpn, Qpn) {
    let mut fabric = Fabric::new(0x19);
    let mut a = engine_node([10, 0, 0, 1], 1);
    let mut b = engine_node([10, 0, 0, 2], 2);
    let (aq, bq, a_ip, b_ip) = (a.qp, b.qp, a.ip, b.ip);
    common::rc_up(&mut a.engine, a.qp, bq, b_ip, 1000);
    common::rc_up(&mut b.engine, b.qp, aq, a_ip, 1000);
    let rkey = b.keys.rkey;
    let lkey = a.keys.lkey;
    let (a_id, b_id) = (fabric.add_node(a), fabric.add_node(b));
    fabric.capture(path, Tap::Sent).unwrap();
    fabric.capture(delivered, Tap::Delivered).unwrap();
    let mut lost_write = false;
    let mut lost_response = false;
    fabric.add_rule(move |d: &Datagram| {
        let op = d.opcode();
        if op == Some(Opcode::RC_RDMA_WRITE_MIDDLE) && !lost_write {
            lost_write = true;
            return Verdict::Drop;
        }
        if op == Some(Opcode::RC_RDMA_READ_RESPONSE_MIDDLE) && !lost_response {
            lost_response = true;
            return Verdict::Drop;
        }
        Verdict::Deliver
    });
    let post = |fabric: &mut Fabric, wr_id: u64, op: SendOp, len: u32| {
        let n = fabric.node_mut::<EngineNode>(a_id);
        let sg = [Sge { addr: BASE, length: len, lkey }];
        let wr = SendWr { wr_id, op, sg_list: &sg, flags: SendFlags::SIGNALED, ud: None, xrc_srqn: None };
        n.engine.post_send(n.qp, &[wr], &n.mem).unwrap();
    };
    // 1. The SEND: B has no receive yet; it posts one 200 µs later.
    post(&mut fabric, 1, SendOp::Send, 3000);
    fabric.run_for(Duration::from_micros(200)).unwrap();
    {
        let n = fabric.node_mut::<EngineNode>(b_id);
        let rs = [Sge { addr: BASE + 0x8_0000, length: 4096, lkey: n.keys.lkey }];
        n.engine.post_recv(n.qp, &[RecvWr { wr_id: 9, sg_list: &rs }]).unwrap();
    }
    fabric.run_until_idle(Duration::from_secs(1)).unwrap();
    // 2. and 3. The WRITE and the READ, one after the other.
    post(&mut fabric, 2, SendOp::RdmaWrite { remote_addr: BASE + 0x1_0000, rkey }, 3000);
    fabric.run_until_idle(Duration::from_secs(1)).unwrap();
    post(&mut fabric, 3, SendOp::RdmaRead { remote_addr: BASE + 0x2_0000, rkey }, 2500);
    fabric.run_until_idle(Duration::from_secs(1)).unwrap();
    // 4. A WRITE with a key B never gave: the QP fails.
    post(&mut fabric, 4, SendOp::RdmaWrite { remote_addr: BASE, rkey: softrdma_wire::RKey(rkey.0 ^ 0x55) }, 8);
    fabric.run_until_idle(Duration::from_secs(1)).unwrap();
    fabric.finish_captures().unwrap();
    let n = fabric.node_mut::<EngineNode>(a_id);
    let mut statuses = Vec::new();
    while let Some(wc) = n.engine.poll_cq(n.cq) {
        statuses.push((wc.wr_id, wc.status));
    }
    assert_eq!(
        statuses,
        [(1, WcStatus::Success), (2, WcStatus::Success), (3, WcStatus::Success), (4, WcStatus::RemAccessErr)]
    );
    (aq, bq)
}

#[test]
fn retransmissions_are_marked_and_naks_named_in_a_lossy_capture() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lossy.pcap");
    let (aq, bq) = lossy_capture(&path, &dir.path().join("delivered.pcap"));
    // Both engines number their first QP 0x11: A is named with its address.
    let target = format!("10.0.0.1/{:#x}", aq.value());
    let (c, lines, s) = follow(&path, &target);
    assert_eq!(c["a_host"], "10.0.0.1");
    assert_eq!(c["b_qpn"], bq.value());
    assert_eq!(c["also_at"], serde_json::json!(["10.0.0.2"]));
    let ids = |part: &str| -> Vec<String> {
        lines
            .iter()
            .filter(|l| l["message"]["part"] == part && l["dir"] == "A>B")
            .map(|l| l["message"]["id"].as_str().unwrap().to_string())
            .collect()
    };
    // Messages: A1 SEND, A2 WRITE, A3 READ, A4 WRITE.
    assert_eq!(s["messages_a"], serde_json::json!({"READ": 1, "SEND": 1, "WRITE": 2}));
    let first = |id: &str| lines.iter().find(|l| l["message"]["id"] == id).unwrap();
    assert_eq!(first("A1")["message"]["op"], "SEND");
    assert_eq!(first("A2")["message"]["op"], "WRITE");
    assert_eq!(first("A3")["message"]["op"], "READ");
    assert_eq!(first("A4")["message"]["op"], "WRITE");
    // The SEND was refused receiver-not-ready, then resent whole.
    let rnr = lines.iter().find(|l| l["nak"]["kind"] == "RNR").expect("an RNR NAK");
    assert_eq!(rnr["message"]["id"], "A1");
    assert_eq!(rnr["nak"]["rnr_timer"], 1);
    assert_eq!(rnr["nak"]["rnr_delay_us"], 10);
    assert!(ids("first").iter().filter(|id| *id == "A1").count() >= 2, "the SEND resent: {:?}", ids("first"));
    // The WRITE's lost MIDDLE: B NAKs the LAST (sequence error, naming A2), A resends the
    // MIDDLE and the LAST, marked as retransmissions of A2.
    let seq: Vec<&Value> =
        lines.iter().filter(|l| l["nak"]["kind"] == "PSN_SEQUENCE_ERROR" && l["message"]["id"] == "A2").collect();
    assert_eq!(seq.len(), 1, "one sequence NAK for the WRITE");
    let middles: Vec<&Value> =
        lines.iter().filter(|l| l["message"]["id"] == "A2" && l["message"]["part"] == "middle").collect();
    assert_eq!(middles.len(), 2, "sent, lost, sent again");
    assert!(middles[0].get("retransmission").is_none());
    assert_eq!(middles[1]["retransmission"], true);
    assert_eq!(middles[0]["psn"], middles[1]["psn"]);
    // The READ's lost middle response: A asks again from that PSN (a retransmission of A3),
    // and the last response completes it.
    let reads: Vec<&Value> =
        lines.iter().filter(|l| l["message"]["id"] == "A3" && l["message"]["part"] == "request").collect();
    assert_eq!(reads.len(), 2);
    assert_eq!(reads[1]["retransmission"], true);
    assert_eq!(reads[1]["psn"].as_u64(), reads[0]["psn"].as_u64().map(|p| p + 1));
    // The capture saw the first last response too (the loss was after it, for the
    // requester's sake), but the READ completes with the answer to the second request.
    let lasts: Vec<&Value> = lines.iter().filter(|l| l["message"]["part"] == "response last").collect();
    assert_eq!(lasts.len(), 2);
    assert!(lasts.iter().all(|l| l["message"]["id"] == "A3"));
    assert_eq!(lasts[1]["retransmission"], true);
    assert_eq!(reads[1]["acked_by"], lasts[1]["frame"]);
    // The bad key: a remote access error NAK, paired with the WRITE it refused.
    let access = lines.iter().find(|l| l["nak"]["kind"] == "REMOTE_ACCESS_ERROR").expect("an access NAK");
    assert_eq!(access["message"]["id"], "A4");
    let a4 = lines.iter().find(|l| l["message"]["id"] == "A4" && l["message"]["part"] == "only").unwrap();
    assert_eq!(a4["naked_by"], access["frame"]);
    // Every other message was acknowledged.
    for id in ["A1", "A2"] {
        let closing = lines.iter().rfind(|l| l["message"]["id"] == id && l["message"]["part"] == "last").unwrap();
        assert!(closing["acked_by"].is_u64(), "{id}: {closing}");
    }
    assert_eq!(s["unacked_a"], 1, "A4, NAKed");
    assert!(s["retransmissions_a"].as_u64().unwrap() >= 4, "{s}");
    // Each RNR round also NAKs the SEND's later packets out of sequence.
    assert!(s["naks"]["PSN_SEQUENCE_ERROR"].as_u64().unwrap() >= 1);
    assert_eq!(s["naks"]["REMOTE_ACCESS_ERROR"], 1);
    assert!(s["naks"]["RNR"].as_u64().unwrap() >= 1);

    // The text names the same things, one line per packet and the summary last.
    let out = softrdma(&["decode", "--follow", &target, path.to_str().unwrap()]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.lines().any(|l| l.contains("RETRANSMISSION A2 WRITE middle")), "{text}");
    assert!(text.lines().any(|l| l.contains("NAK PSN_SEQUENCE_ERROR A2 WRITE nak")), "{text}");
    assert!(text.lines().any(|l| l.contains("RETRANSMISSION A3 READ request")), "{text}");
    assert!(text.lines().any(|l| l.contains("RNR_NAK timer=1 (10us) A1 SEND")), "{text}");
    assert!(text.lines().any(|l| l.contains("NAK REMOTE_ACCESS_ERROR A4 WRITE")), "{text}");
    assert!(text.contains("PSN_SEQUENCE_ERROR") && text.contains("1 REMOTE_ACCESS_ERROR"), "{text}");
    assert!(text.contains("(QP 0x000011 also receives at 10.0.0.2: name one as --follow ADDR/QPN)"), "{text}");
    assert_eq!(text.lines().count(), 2 + lines.len() + 3, "two head lines, the packets, three summary lines");
}

/// The frames of a capture of what was sent (`a`) and of what was delivered (`b`), merged
/// by time, the delivered first at equal times (a packet sent at the instant another
/// arrived is the node's answer to it, as a capture at the node would show). Returns the
/// number delivered.
fn merge(a: &Path, b: &Path, out: &Path) -> usize {
    let read = |p: &Path| softrdma_pcap::CaptureReader::open(p).unwrap().map(Result::unwrap).collect::<Vec<_>>();
    let mut frames: Vec<(Duration, usize, Vec<u8>)> = Vec::new();
    for (i, p) in [a, b].into_iter().enumerate() {
        frames.extend(read(p).into_iter().map(|f| (f.timestamp, i, f.data)));
    }
    frames.sort_by_key(|f| (f.0, std::cmp::Reverse(f.1)));
    let mut w = softrdma_pcap::CaptureWriter::create(out).unwrap();
    for (ts, _, data) in &frames {
        w.write_frame(*ts, data).unwrap();
    }
    std::io::Write::flush(&mut w.into_inner()).unwrap();
    read(b).len()
}

#[test]
fn a_capture_of_both_ends_shows_each_packet_twice_and_reads_the_same() {
    // What SOFTRDMA_PCAP gives for a process with both ends, or two captures merged: every
    // packet as sent and again as received. Retransmissions resent at once after a NAK,
    // and an RNR NAK repeated for each resend, are not copies.
    let dir = tempfile::tempdir().unwrap();
    let (sent, delivered, both) = (dir.path().join("s.pcap"), dir.path().join("d.pcap"), dir.path().join("b.pcap"));
    let (aq, _) = lossy_capture(&sent, &delivered);
    let arrived = merge(&sent, &delivered, &both);
    let target = format!("10.0.0.1/{:#x}", aq.value());
    let (_, one, s1) = follow(&sent, &target);
    let (_, two, s2) = follow(&both, &target);
    assert_eq!(s2["copies"], arrived as u64);
    assert_eq!(two.len(), one.len() + arrived);
    for key in ["messages_a", "messages_b", "unacked_a", "retransmissions_a", "retransmissions_b", "naks"] {
        assert_eq!(s1[key], s2[key], "{key}");
    }
    // Every copy names a frame of the same PSN and opcode before it.
    for l in two.iter().filter(|l| l.get("copy_of").is_some()) {
        let original = frame(&two, l["copy_of"].as_u64().unwrap());
        assert_eq!((&original["psn"], &original["opcode"]), (&l["psn"], &l["opcode"]), "{l}");
        assert!(original.get("copy_of").is_none());
    }
    assert_eq!(s1["copies"], 0);
}

/// Both ends on one host (a process that holds both, as tests and examples do): every
/// packet has the same addresses both ways, so only the QPNs tell the sides apart, and the
/// followed QP must not be taken for its own peer.
#[test]
fn both_ends_on_one_host_are_told_apart_by_their_qps() {
    use softrdma::{Access, ConnectOptions, ContextOptions, Device, QpInit, QpType, RecvWr, SendFlags, SendOp, SendWr};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("one-host.pcap");
    // RoCEv2's port, shared with whatever else runs on the host: decoders know RoCE by it.
    let open = |capture: Option<PathBuf>| {
        let device = Device::with_addresses("lo", vec![IpAddr::from([127, 0, 0, 1])]);
        device.open_with(&ContextOptions { capture: capture.map(Into::into), ..ContextOptions::default() }).unwrap()
    };
    let (ca, cb) = (open(Some(path.clone())), open(None));
    let (pa, pb) = (ca.alloc_pd().unwrap(), cb.alloc_pd().unwrap());
    let (qa_cq, qb_cq) = (ca.create_cq(16, None).unwrap(), cb.create_cq(16, None).unwrap());
    let (qa, qb) = (
        pa.create_qp(&QpInit::new(QpType::Rc, &qa_cq)).unwrap(),
        pb.create_qp(&QpInit::new(QpType::Rc, &qb_cq)).unwrap(),
    );
    let (ma, mb) = (pa.reg_mr(4096, Access::LOCAL_WRITE).unwrap(), pb.reg_mr(3 * 4096, Access::LOCAL_WRITE).unwrap());
    let (ea, eb) = (qa.endpoint(0, 10).unwrap(), qb.endpoint(0, 20).unwrap());
    qa.connect(10, &eb, &ConnectOptions::default()).unwrap();
    qb.connect(20, &ea, &ConnectOptions::default()).unwrap();
    for i in 0..3 {
        qb.post_recv(&[RecvWr { wr_id: i, sg_list: &[mb.sge(i as usize * 4096..(i as usize + 1) * 4096).unwrap()] }])
            .unwrap();
    }
    let sge = [ma.sge(0..4096).unwrap()];
    for i in 0..3 {
        let wr = SendWr { wr_id: i, op: SendOp::Send, sg_list: &sge, flags: SendFlags::SIGNALED, ..SendWr::default() };
        qa.post_send(&[wr]).unwrap();
        assert_eq!(qa_cq.wait(Duration::from_secs(10)).unwrap().status, softrdma::WcStatus::Success);
    }
    assert_eq!(qb_cq.wait_n(3, Duration::from_secs(10)).unwrap().len(), 3);
    drop((qa, qb, qa_cq, qb_cq, ma, mb, pa, pb));
    drop((ca, cb)); // flushes the capture
    let (conversation, lines, summary) = follow(&path, &format!("{:#x}", ea.qpn));
    assert_eq!(conversation["b_qpn"], eb.qpn, "{conversation}");
    assert_eq!(conversation["a_host"], conversation["b_host"]);
    assert_eq!(summary["messages_a"]["SEND"], 3, "{summary}");
    assert_eq!(
        (&summary["a_to_b"], &summary["b_to_a"], &summary["unacked_a"]),
        (&3.into(), &3.into(), &0.into()),
        "{summary}"
    );
    assert_eq!(lines.len(), 6);
}
