//! rdma_cm over real loopback sockets: IB CM MADs on QP1 between two event channels in one
//! process (two device contexts on 127.0.0.1, sharing the port through the host's group),
//! with the `rdma_post_*` helpers of `<rdma/rdma_verbs.h>`.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use softrdma::*;

const T: Duration = Duration::from_secs(10);

fn channel(port: u16) -> EventChannel {
    // Small CM timeouts (4.096 µs × 2^12 = 16.8 ms, 3 retries) keep failure tests short.
    let options = ContextOptions { port, cm_response_timeout: 12, cm_max_retries: 3, ..ContextOptions::default() };
    EventChannel::with_options(options).unwrap()
}

fn cap() -> QpCap {
    QpCap { max_send_wr: 16, max_recv_wr: 16, max_send_sge: 2, max_recv_sge: 2, max_inline_data: 64 }
}

/// A listener on 127.0.0.1:`service` of its own channel.
fn listener(port: u16, service: u16, ps: PortSpace, qp_type: QpType) -> (EventChannel, CmId) {
    let ch = channel(port);
    let id = ch.create_id(ps, qp_type).unwrap();
    id.bind_addr(SocketAddr::from(([127, 0, 0, 1], service))).unwrap();
    id.listen(8).unwrap();
    (ch, id)
}

/// An active ID resolved to 127.0.0.1:`service`, with a QP.
fn client(port: u16, service: u16, ps: PortSpace, qp_type: QpType) -> (EventChannel, CmId, Pd) {
    let ch = channel(port);
    let id = ch.create_id(ps, qp_type).unwrap();
    id.resolve_addr(None, SocketAddr::from(([127, 0, 0, 1], service))).unwrap();
    ch.expect(CmEventKind::AddrResolved, T).unwrap();
    id.resolve_route().unwrap();
    ch.expect(CmEventKind::RouteResolved, T).unwrap();
    let pd = id.context().unwrap().alloc_pd().unwrap();
    id.create_qp(&pd, cap()).unwrap();
    (ch, id, pd)
}

#[test]
fn rc_connect_exchange_data_with_the_rdma_verbs_helpers_and_disconnect() {
    let port = test_port();
    let (sch, _listen) = listener(port, 7471, PortSpace::TCP, QpType::Rc);
    let (cch, cid, _cpd) = client(port, 7471, PortSpace::TCP, QpType::Rc);
    let hello = ConnParam {
        private_data: b"hello from the client".to_vec(),
        responder_resources: 4,
        initiator_depth: 4,
        ..ConnParam::default()
    };
    cid.connect(&hello).unwrap();

    let req = sch.expect(CmEventKind::ConnectRequest, T).unwrap();
    assert!(req.private_data.starts_with(b"hello from the client"), "the REQ's private data reaches the listener");
    assert_eq!(req.id.peer_addr().map(|a| a.ip()), Some([127, 0, 0, 1].into()));
    let sid = req.id.clone();
    let spd = sid.context().unwrap().alloc_pd().unwrap();
    sid.create_qp(&spd, cap()).unwrap();
    // rdma_reg_msgs / rdma_post_recv before accepting, as rdma_server does.
    let smsgs = sid.reg_msgs(4096).unwrap();
    sid.post_recv(1, &smsgs, 0..256).unwrap();
    let target = sid.reg_write(4096).unwrap();
    let readable = sid.reg_read(4096).unwrap();
    readable.write(0, b"read me over rdma_cm").unwrap();
    sid.accept(&ConnParam {
        private_data: b"welcome".to_vec(),
        responder_resources: 4,
        initiator_depth: 4,
        ..ConnParam::default()
    })
    .unwrap();

    let est = cch.expect(CmEventKind::Established, T).unwrap();
    assert!(est.private_data.starts_with(b"welcome"), "the REP's private data reaches the client");
    sch.expect(CmEventKind::Established, T).unwrap();
    assert_eq!(cid.qp().unwrap().state(), Some(QpState::Rts));
    assert_eq!(sid.qp().unwrap().state(), Some(QpState::Rts));

    // rdma_post_send + rdma_get_recv_comp.
    let cmsgs = cid.reg_msgs(4096).unwrap();
    cmsgs.write(0, b"a message").unwrap();
    cid.post_send(10, &cmsgs, 0..9, SendFlags::SIGNALED).unwrap();
    assert_eq!(cid.get_send_comp(T).unwrap().wr_id, 10);
    let wc = sid.get_recv_comp(T).unwrap();
    assert_eq!((wc.wr_id, wc.status, wc.byte_len), (1, WcStatus::Success, 9));
    let mut got = [0u8; 9];
    smsgs.read(0, &mut got).unwrap();
    assert_eq!(&got, b"a message");

    // rdma_post_write with inline data and no MR (seed 004).
    let w = target.remote(100..120).unwrap();
    cid.post_write_inline(11, b"inline, no MR", SendFlags::SIGNALED, w.addr, w.rkey).unwrap();
    assert_eq!(cid.get_send_comp(T).unwrap().status, WcStatus::Success);
    let mut got = [0u8; 13];
    target.read(100, &mut got).unwrap();
    assert_eq!(&got, b"inline, no MR");

    // rdma_post_read.
    let r = readable.remote(0..20).unwrap();
    cid.post_read(12, &cmsgs, 1000..1020, SendFlags::SIGNALED, r.addr, r.rkey).unwrap();
    assert_eq!(cid.get_send_comp(T).unwrap().status, WcStatus::Success);
    let mut got = [0u8; 20];
    cmsgs.read(1000, &mut got).unwrap();
    assert_eq!(&got, b"read me over rdma_cm");

    // rdma_post_recvv: one receive over two buffers.
    let sgl = [smsgs.sge(1000..1004).unwrap(), smsgs.sge(2000..2100).unwrap()];
    sid.post_recvv(2, &sgl).unwrap();
    cmsgs.write(0, b"scattered message").unwrap();
    cid.post_send(13, &cmsgs, 0..17, SendFlags::SIGNALED).unwrap();
    cid.get_send_comp(T).unwrap();
    assert_eq!(sid.get_recv_comp(T).unwrap().byte_len, 17);
    let (mut a, mut b) = ([0u8; 4], [0u8; 13]);
    smsgs.read(1000, &mut a).unwrap();
    smsgs.read(2000, &mut b).unwrap();
    assert_eq!((&a, &b), (b"scat", b"tered message"));

    // rdma_disconnect: both sides see DISCONNECTED; QPs go to ERR.
    cid.disconnect().unwrap();
    cch.expect(CmEventKind::Disconnected, T).unwrap();
    sch.expect(CmEventKind::Disconnected, T).unwrap();
    assert_eq!(cid.qp().unwrap().state(), Some(QpState::Err));
    assert_eq!(sid.qp().unwrap().state(), Some(QpState::Err));
}

#[test]
fn the_active_sides_qp_takes_remote_access_once_connected_and_ids_share_a_cq() {
    // The client's QP exists before the exchange, when no access flags are known: connecting
    // re-applies INIT (librdmacm's ucma_modify_qp_rtr), so the server may WRITE, READ and
    // fetch-add into the client's memory. Both client QPs report to one CQ of the caller's.
    let port = test_port();
    let (sch, _listen) = listener(port, 7475, PortSpace::TCP, QpType::Rc);
    let cch = channel(port);
    let ids: Vec<CmId> = (0..2)
        .map(|_| {
            let id = cch.create_id(PortSpace::TCP, QpType::Rc).unwrap();
            id.resolve_addr(None, SocketAddr::from(([127, 0, 0, 1], 7475))).unwrap();
            cch.expect(CmEventKind::AddrResolved, T).unwrap();
            id.resolve_route().unwrap();
            cch.expect(CmEventKind::RouteResolved, T).unwrap();
            id
        })
        .collect();
    let cctx = ids[0].context().unwrap();
    let cpd = cctx.alloc_pd().unwrap();
    let shared_cq = cctx.create_cq(32, None).unwrap();
    let init = QpInit { cap: cap(), ..QpInit::new(QpType::Rc, &shared_cq) };
    for id in &ids {
        id.create_qp_with(&cpd, &init).unwrap();
    }
    assert!(
        ids[0].create_qp_with(&cpd, &QpInit::new(QpType::Uc, &shared_cq)).is_err(),
        "a UC QP on an RC ID is refused"
    );
    let target = cpd.reg_mr(4096, Access::ALL).unwrap();
    target.write(0, b"client memory").unwrap();
    target.write(1024, &41u64.to_ne_bytes()).unwrap();

    let mut servers = Vec::new();
    for id in &ids {
        id.connect(&ConnParam { responder_resources: 4, initiator_depth: 4, ..ConnParam::default() }).unwrap();
        let req = sch.expect(CmEventKind::ConnectRequest, T).unwrap();
        let spd = req.id.context().unwrap().alloc_pd().unwrap();
        req.id.create_qp(&spd, cap()).unwrap();
        req.id.accept(&ConnParam { responder_resources: 4, initiator_depth: 4, ..ConnParam::default() }).unwrap();
        cch.expect(CmEventKind::Established, T).unwrap();
        sch.expect(CmEventKind::Established, T).unwrap();
        servers.push((req.id, spd));
    }

    let (sid, spd) = &servers[1];
    let local = spd.reg_mr(4096, Access::LOCAL_WRITE).unwrap();
    local.write(0, b"server wrote").unwrap();
    let r = target.remote(0..4096).unwrap();
    sid.post_write(1, &local, 0..12, SendFlags::SIGNALED, r.addr + 2048, r.rkey).unwrap();
    assert_eq!(sid.get_send_comp(T).unwrap().status, WcStatus::Success, "WRITE into the active side");
    sid.post_read(2, &local, 100..113, SendFlags::SIGNALED, r.addr, r.rkey).unwrap();
    assert_eq!(sid.get_send_comp(T).unwrap().status, WcStatus::Success, "READ from the active side");
    let sge = [local.sge(200..208).unwrap()];
    let op = SendOp::FetchAdd { remote_addr: r.addr + 1024, rkey: r.rkey, add: 1 };
    sid.qp().unwrap().post_send(&[wr(3, op, &sge)]).unwrap();
    assert_eq!(sid.get_send_comp(T).unwrap().status, WcStatus::Success, "fetch-add on the active side");

    let mut got = [0u8; 12];
    target.read(2048, &mut got).unwrap();
    assert_eq!(&got, b"server wrote");
    let mut got = [0u8; 13];
    local.read(100, &mut got).unwrap();
    assert_eq!(&got, b"client memory");
    assert_eq!(local.read_u64(200).unwrap(), 41);
    assert_eq!(target.read_u64(1024).unwrap(), 42);

    // A SEND from each client QP completes on the one shared CQ.
    let msgs = cpd.reg_mr(64, Access::LOCAL_WRITE).unwrap();
    let mut rbufs = Vec::new();
    for (sid, spd) in &servers {
        let rbuf = spd.reg_mr(64, Access::LOCAL_WRITE).unwrap();
        sid.post_recv(7, &rbuf, 0..64).unwrap();
        rbufs.push(rbuf);
    }
    for (i, id) in ids.iter().enumerate() {
        id.post_send(10 + i as u64, &msgs, 0..8, SendFlags::SIGNALED).unwrap();
    }
    let mut done: Vec<u64> = shared_cq.wait_n(2, T).unwrap().iter().map(|wc| wc.wr_id).collect();
    done.sort_unstable();
    assert_eq!(done, [10, 11]);
}

#[test]
fn reject_carries_private_data_and_a_missing_listener_is_reason_8() {
    let port = test_port();
    let (sch, _listen) = listener(port, 7472, PortSpace::TCP, QpType::Rc);
    let (cch, cid, _pd) = client(port, 7472, PortSpace::TCP, QpType::Rc);
    let msgs = cid.reg_msgs(64).unwrap();
    cid.post_recv(1, &msgs, 0..64).unwrap();
    cid.connect(&ConnParam::default()).unwrap();
    let req = sch.expect(CmEventKind::ConnectRequest, T).unwrap();
    req.id.reject(b"go away").unwrap();
    let rej = cch.expect(CmEventKind::Rejected, T).unwrap();
    assert!(rej.private_data.starts_with(b"go away"), "{:?}", rej.private_data);
    assert!(matches!(rej.status, CmStatus::Rejected(_)));
    rejected_qp_is_in_error(&cid, 1);

    // Nobody listens on 7473: the peer's CM answers REJ 8 (invalid service ID).
    let (cch, cid, _pd) = client(port, 7473, PortSpace::TCP, QpType::Rc);
    let msgs = cid.reg_msgs(64).unwrap();
    cid.post_recv(2, &msgs, 0..64).unwrap();
    cid.connect(&ConnParam::default()).unwrap();
    let rej = cch.expect(CmEventKind::Rejected, T).unwrap();
    assert_eq!(format!("{:?}", rej.status), "Rejected(RejReason(8))");
    rejected_qp_is_in_error(&cid, 2);
    // The ID is spent: what would start another attempt fails (the kernel's EINVAL).
    assert!(cid.resolve_addr(None, SocketAddr::from(([127, 0, 0, 1], 7473))).is_err());
    assert!(cid.resolve_route().is_err());
    assert!(cid.connect(&ConnParam::default()).is_err());
}

/// As librdmacm leaves a rejected ID's QP: in ERR (`ucma_modify_qp_err`), the receive
/// `wr_id` posted before `connect` flushed.
fn rejected_qp_is_in_error(id: &CmId, wr_id: u64) {
    assert_eq!(id.qp().unwrap().state(), Some(QpState::Err));
    let wc = id.get_recv_comp(T).unwrap();
    assert_eq!((wc.wr_id, wc.status), (wr_id, WcStatus::WrFlushErr));
}

#[test]
fn connect_to_an_address_without_a_device_is_unreachable_after_the_retries() {
    let port = test_port();
    let ch = channel(port);
    let id = ch.create_id(PortSpace::TCP, QpType::Rc).unwrap();
    // 127.0.0.77: routable (lo), but no softrdma device answers there.
    id.resolve_addr(None, SocketAddr::from(([127, 0, 0, 77], 7474))).unwrap();
    ch.expect(CmEventKind::AddrResolved, T).unwrap();
    id.resolve_route().unwrap();
    ch.expect(CmEventKind::RouteResolved, T).unwrap();
    let pd = id.context().unwrap().alloc_pd().unwrap();
    id.create_qp(&pd, cap()).unwrap();
    let started = std::time::Instant::now();
    id.connect(&ConnParam::default()).unwrap();
    let e = ch.expect(CmEventKind::Unreachable, T).unwrap();
    assert_eq!(e.status, CmStatus::TimedOut);
    // 4 tries, 16.8 ms apart.
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
}

#[test]
fn ud_service_resolution_then_a_datagram_with_the_grh() {
    let port = test_port();
    let (sch, _listen) = listener(port, 7475, PortSpace::UDP, QpType::Ud);
    let (cch, cid, cpd) = client(port, 7475, PortSpace::UDP, QpType::Ud);
    cid.connect(&ConnParam::default()).unwrap();
    let req = sch.expect(CmEventKind::ConnectRequest, T).unwrap();
    let sid = req.id.clone();
    let spd = sid.context().unwrap().alloc_pd().unwrap();
    let sqp = sid.create_qp(&spd, cap()).unwrap();
    // rdma_create_qp takes a UD QP to RTS itself (no connection to wait for), as
    // librdmacm's ucma_init_ud_qp; the Q_Key is rdma_cm's for UDP.
    assert_eq!(sqp.state(), Some(QpState::Rts));
    assert_eq!(sqp.query().unwrap().0.qkey, QKey(0x0123_4567));
    let smsgs = sid.reg_msgs(4096).unwrap();
    sid.post_recv(5, &smsgs, 0..1024).unwrap();
    sid.accept(&ConnParam::default()).unwrap();

    let est = cch.expect(CmEventKind::Established, T).unwrap();
    let ud = est.ud.expect("UD parameters in ESTABLISHED");
    assert_eq!(ud.remote_qpn, sqp.qpn());
    assert_eq!(cid.qp().unwrap().state(), Some(QpState::Rts));
    let ah = cpd.create_ah(ud.ah).unwrap();
    let cmsgs = cid.reg_msgs(4096).unwrap();
    cmsgs.write(0, b"udaddy says hi").unwrap();
    cid.post_ud_send(1, &cmsgs, 0..14, SendFlags::SIGNALED, &ah, &ud).unwrap();
    assert_eq!(cid.get_send_comp(T).unwrap().status, WcStatus::Success);
    let wc = sid.get_recv_comp(T).unwrap();
    assert_eq!((wc.status, wc.byte_len, wc.grh), (WcStatus::Success, 40 + 14, Some(NetworkHdr::Ipv4)));
    let mut got = [0u8; 14];
    smsgs.read(40, &mut got).unwrap();
    assert_eq!(&got, b"udaddy says hi");
}

#[test]
fn synchronous_endpoints_create_ep_and_get_request() {
    // rdma_server / rdma_client's shape: rdma_create_ep, rdma_get_request, blocking calls.
    let port = test_port();
    let options = ContextOptions { port, cm_response_timeout: 12, ..ContextOptions::default() };
    let listen =
        CmEndpoint::listen_on(SocketAddr::from(([127, 0, 0, 1], 7476)), QpType::Rc, cap(), options.clone(), 4, T)
            .unwrap();
    let server = std::thread::spawn(move || {
        let (ep, req) = listen.get_request().unwrap();
        assert!(req.private_data.starts_with(b"sync hello"));
        let msgs = ep.reg_msgs(64).unwrap();
        ep.post_recv(1, &msgs, 0..64).unwrap();
        ep.accept(&ConnParam::default()).unwrap();
        let wc = ep.get_recv_comp(T).unwrap();
        let mut got = vec![0u8; wc.byte_len as usize];
        msgs.read(0, &mut got).unwrap();
        let event = ep.next_event().unwrap().expect("the client's disconnect");
        assert_eq!(event.kind, CmEventKind::Disconnected);
        got
    });
    let client =
        CmEndpoint::connect_to(SocketAddr::from(([127, 0, 0, 1], 7476)), QpType::Rc, cap(), options, T).unwrap();
    client.connect(&ConnParam { private_data: b"sync hello".to_vec(), ..ConnParam::default() }).unwrap();
    let msgs = client.reg_msgs(64).unwrap();
    msgs.write(0, b"over a synchronous endpoint").unwrap();
    client.post_send(1, &msgs, 0..27, SendFlags::SIGNALED).unwrap();
    assert_eq!(client.get_send_comp(T).unwrap().status, WcStatus::Success);
    client.disconnect().unwrap();
    assert_eq!(server.join().unwrap(), b"over a synchronous endpoint");
}

#[test]
#[allow(clippy::print_stderr)] // says why it skips
fn a_wildcard_bind_that_fails_on_one_device_binds_none() {
    let Some(other) = devices()
        .unwrap()
        .into_iter()
        .find_map(|d| d.addresses().iter().copied().find(|a| a.is_ipv4() && !a.is_loopback()))
    else {
        eprintln!("skipped: no device with a non-loopback IPv4 address to make the wildcard bind fail on");
        return;
    };
    let port = test_port();
    let ch = channel(port);
    let holder = ch.create_id(PortSpace::TCP, QpType::Rc).unwrap();
    holder.bind_addr(SocketAddr::new(other, 7481)).unwrap();
    let id = ch.create_id(PortSpace::TCP, QpType::Rc).unwrap();
    // Binds on lo, then fails on `other`'s device: the lo binding is undone.
    id.bind_addr(SocketAddr::from(([0, 0, 0, 0], 7481))).unwrap_err();
    id.bind_addr(SocketAddr::from(([127, 0, 0, 1], 7481))).expect("nothing left bound by the failed wildcard bind");
}

/// The backlog bounds the requests not yet taken (`rdma_get_cm_event`), as ucma's does: a
/// listener of backlog 1 whose application took a request and leaves it unanswered still
/// takes the next one, and that one connects.
#[test]
fn a_request_taken_and_left_unanswered_leaves_the_backlog() {
    let port = test_port();
    let sch = channel(port);
    let listen = sch.create_id(PortSpace::TCP, QpType::Rc).unwrap();
    listen.bind_addr(SocketAddr::from(([127, 0, 0, 1], 7479))).unwrap();
    listen.listen(1).unwrap();
    let (_c1ch, c1, _c1pd) = client(port, 7479, PortSpace::TCP, QpType::Rc);
    c1.connect(&ConnParam::default()).unwrap();
    let _unanswered = sch.expect(CmEventKind::ConnectRequest, T).unwrap();
    let (c2ch, c2, _c2pd) = client(port, 7479, PortSpace::TCP, QpType::Rc);
    c2.connect(&ConnParam::default()).unwrap();
    let second = sch.expect(CmEventKind::ConnectRequest, T).unwrap();
    let pd = second.id.context().unwrap().alloc_pd().unwrap();
    second.id.create_qp(&pd, cap()).unwrap();
    second.id.accept(&ConnParam::default()).unwrap();
    c2ch.expect(CmEventKind::Established, T).unwrap();
}
