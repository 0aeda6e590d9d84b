//! The tokio layer: completions and CM events awaited, over real loopback sockets.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use softrdma::asynch::{AsyncCompChannel, AsyncEventChannel, wait_completion};
use softrdma::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_sends_are_awaited_on_the_receiving_side() {
    let port = test_port();
    let a = open([127, 0, 0, 1], port);
    let b = open([127, 0, 0, 1], port);
    let channel = AsyncCompChannel::new(b.create_comp_channel().unwrap()).unwrap();
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let cqa = a.create_cq(256, None).unwrap();
    let cqb = b.create_cq(256, Some(channel.channel())).unwrap();
    let mut init = QpInit::new(QpType::Rc, &cqb);
    init.cap.max_recv_wr = 128;
    let qb = pb.create_qp(&init).unwrap();
    let mut init = QpInit::new(QpType::Rc, &cqa);
    init.cap.max_send_wr = 128;
    let qa = pa.create_qp(&init).unwrap();
    qa.connect(1, &qb.endpoint(0, 2).unwrap(), &ConnectOptions::default()).unwrap();
    qb.connect(2, &qa.endpoint(0, 1).unwrap(), &ConnectOptions::default()).unwrap();
    let mb = pb.reg_mr(100 * 8, Access::LOCAL_WRITE).unwrap();
    for i in 0..100 {
        let s = [mb.sge(i * 8..i * 8 + 8).unwrap()];
        qb.post_recv(&[RecvWr { wr_id: i as u64, sg_list: &s }]).unwrap();
    }
    let sender = tokio::task::spawn_blocking(move || {
        let ma = pa.reg_mr(8, Access::LOCAL_WRITE).unwrap();
        for i in 0..100u64 {
            ma.write(0, &i.to_ne_bytes()).unwrap();
            let s = [ma.sge(0..8).unwrap()];
            qa.post_send(&[wr(i, SendOp::Send, &s)]).unwrap();
            assert_eq!(cqa.wait(WAIT).unwrap().status, WcStatus::Success);
        }
    });
    let received = tokio::time::timeout(Duration::from_secs(20), async {
        let mut got = Vec::new();
        while got.len() < 100 {
            let wc = wait_completion(&cqb, &channel).await.unwrap();
            assert_eq!(wc.status, WcStatus::Success);
            got.push(mb.read_u64(wc.wr_id as usize * 8).unwrap());
        }
        got
    })
    .await
    .expect("100 completions within 20 s");
    assert_eq!(received, (0..100).collect::<Vec<u64>>());
    sender.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cm_events_are_awaited() {
    let port = test_port();
    let options = ContextOptions { port, cm_response_timeout: 12, ..ContextOptions::default() };
    let server = AsyncEventChannel::new(EventChannel::with_options(options.clone()).unwrap()).unwrap();
    let client = AsyncEventChannel::new(EventChannel::with_options(options).unwrap()).unwrap();
    let listen = server.channel().create_id(PortSpace::TCP, QpType::Rc).unwrap();
    listen.bind_addr(SocketAddr::from(([127, 0, 0, 1], 7477))).unwrap();
    listen.listen(4).unwrap();
    let id = client.channel().create_id(PortSpace::TCP, QpType::Rc).unwrap();
    id.resolve_addr(None, SocketAddr::from(([127, 0, 0, 1], 7477))).unwrap();
    assert_eq!(next(&client).await.kind, CmEventKind::AddrResolved);
    id.resolve_route().unwrap();
    assert_eq!(next(&client).await.kind, CmEventKind::RouteResolved);
    id.connect(&ConnParam::default()).unwrap();
    let req = next(&server).await;
    assert_eq!(req.kind, CmEventKind::ConnectRequest);
    req.id.accept(&ConnParam::default()).unwrap();
    // Without QPs the active side sees CONNECT_RESPONSE and completes it itself.
    let resp = next(&client).await;
    assert_eq!(resp.kind, CmEventKind::ConnectResponse, "{:?}", resp.status);
}

async fn next(ch: &AsyncEventChannel) -> CmEvent {
    tokio::time::timeout(Duration::from_secs(10), ch.next_event()).await.expect("an event in time").unwrap()
}
