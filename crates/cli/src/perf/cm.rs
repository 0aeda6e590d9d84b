//! `--rdma-cm`: the test's QPs connected through rdma_cm, as perftest's `-R` does, instead
//! of by the numbers the TCP exchange carries.
//!
//! One CM ID per QP. The client resolves each ID toward the server's rdma_cm port (the
//! same number as its TCP port), creates its QP on it with the test's shared CQ, and
//! connects the IDs one after another: REQ, REP, RTU on QP1 for RC and UC, SIDR_REQ and
//! SIDR_REP for UD. Each REQ's private data is the QP's index, so the server pairs the
//! connection with the QP the client described in its `Hello`. What the peer's QPs are
//! (number, first PSN, Q_Key) each side learns from rdma_cm's events, not from the TCP
//! exchange, which still carries the test itself, the memory region and the results.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use softrdma::{CmEvent, CmEventKind, CmId, ConnParam, ContextOptions, EventChannel, PortSpace, QpType};

use super::PerfError;
use super::control::{QpInfo, SideInfo};
use super::run::Side;
use super::spec::{Conn, Spec};

/// How long one rdma_cm step may take (the CM retries a lost MAD well within it).
const STEP: Duration = Duration::from_secs(10);
/// RDMA READ and atomic requests each side accepts and issues at once.
const RD_ATOMIC: u8 = 16;

/// The CM IDs of a test, and the channel their events come to.
pub(crate) struct CmConn {
    channel: EventChannel,
    listen: Option<CmId>,
    ids: Vec<CmId>,
    conn: Conn,
}

fn cm(what: &'static str) -> impl Fn(softrdma::Error) -> PerfError {
    move |e| PerfError::Rdma(format!("{what}: {e}"))
}

fn kinds(conn: Conn) -> (PortSpace, QpType) {
    match conn {
        Conn::Rc => (PortSpace::TCP, QpType::Rc),
        Conn::Uc => (PortSpace::TCP, QpType::Uc),
        Conn::Ud => (PortSpace::UDP, QpType::Ud),
    }
}

/// The test's event channel: authenticated mode if the spec asks for it, the same-host
/// path unless it says `--wire`.
fn channel(spec: &Spec) -> Result<EventChannel, PerfError> {
    let options =
        ContextOptions { authenticate: spec.authenticate, same_host: !spec.wire, ..ContextOptions::default() };
    EventChannel::with_options(options).map_err(cm("rdma_create_event_channel"))
}

impl CmConn {
    /// The client: one ID per QP, resolved from `local` toward the server's `server`
    /// (`rdma_resolve_addr`, `rdma_resolve_route`).
    pub(crate) fn resolve(spec: &Spec, local: IpAddr, server: SocketAddr) -> Result<CmConn, PerfError> {
        let channel = channel(spec)?;
        let (ps, qp_type) = kinds(spec.conn);
        let mut ids = Vec::new();
        for _ in 0..spec.qps {
            let id = channel.create_id(ps, qp_type).map_err(cm("rdma_create_id"))?;
            id.resolve_addr(Some(SocketAddr::new(local, 0)), server).map_err(cm("rdma_resolve_addr"))?;
            expect(&channel, CmEventKind::AddrResolved, "resolving the server's address")?;
            id.resolve_route().map_err(cm("rdma_resolve_route"))?;
            expect(&channel, CmEventKind::RouteResolved, "resolving the route")?;
            ids.push(id);
        }
        Ok(CmConn { channel, listen: None, ids, conn: spec.conn })
    }

    /// The server: listens on `local` (`rdma_bind_addr`, `rdma_listen`).
    pub(crate) fn listen(spec: &Spec, local: SocketAddr) -> Result<CmConn, PerfError> {
        let channel = channel(spec)?;
        let (ps, qp_type) = kinds(spec.conn);
        let id = channel.create_id(ps, qp_type).map_err(cm("rdma_create_id"))?;
        id.bind_addr(local).map_err(|e| {
            PerfError::Usage(format!(
                "rdma_bind_addr {local}: {e} (is another server on this rdma_cm port? pick another -p)"
            ))
        })?;
        id.listen(spec.qps).map_err(cm("rdma_listen"))?;
        Ok(CmConn { channel, listen: Some(id), ids: Vec::new(), conn: spec.conn })
    }

    /// The device context the IDs are bound to: the test's verbs objects must live on it.
    pub(crate) fn context(&self) -> Result<softrdma::Context, PerfError> {
        self.listen
            .as_ref()
            .or(self.ids.first())
            .and_then(CmId::context)
            .ok_or_else(|| PerfError::Rdma("the CM ID is bound to no device".into()))
    }

    /// The client's IDs, to create the QPs on, in order.
    pub(crate) fn ids(&self) -> &[CmId] {
        &self.ids
    }

    /// The client: connects every ID in turn (`rdma_connect`) and returns the server's QPs
    /// as rdma_cm reported them, with the Q_Key its UD QPs take.
    pub(crate) fn connect(&self, side: &Side) -> Result<(Vec<QpInfo>, Option<u32>), PerfError> {
        let mut qps = Vec::new();
        let mut qkey = None;
        for (i, id) in self.ids.iter().enumerate() {
            let param = ConnParam {
                private_data: (i as u32).to_le_bytes().to_vec(),
                responder_resources: RD_ATOMIC,
                initiator_depth: RD_ATOMIC,
                retry_count: 7,
                rnr_retry_count: 7,
                ..ConnParam::default()
            };
            id.connect(&param).map_err(cm("rdma_connect"))?;
            let ev = expect(&self.channel, CmEventKind::Established, "connecting a QP through rdma_cm")?;
            match (&ev.ud, &ev.param) {
                (Some(ud), _) => {
                    qkey = Some(ud.qkey);
                    qps.push(QpInfo { qpn: ud.remote_qpn, psn: 0 });
                }
                (None, Some(p)) => qps.push(QpInfo { qpn: p.qp_num, psn: side.expected_psn(i)? }),
                (None, None) => return Err(PerfError::Rdma("ESTABLISHED without the peer's parameters".into())),
            }
        }
        Ok((qps, qkey))
    }

    /// The server: accepts one connection per QP of `client` (what its `Hello` said),
    /// creating each QP on the request's ID (`rdma_accept`), and returns the client's QPs
    /// as rdma_cm reported them.
    pub(crate) fn accept(&mut self, side: &mut Side, client: &SideInfo) -> Result<Vec<QpInfo>, PerfError> {
        let mut qps = Vec::new();
        for i in 0..client.qps.len() {
            let ev = expect(&self.channel, CmEventKind::ConnectRequest, "waiting for the client's rdma_connect")?;
            let index = <[u8; 4]>::try_from(ev.private_data.get(..4).unwrap_or_default()).ok().map(u32::from_le_bytes);
            if index != Some(i as u32) {
                let _ = ev.id.reject(b"softrdma perf: unexpected connection");
                return Err(PerfError::Peer(format!(
                    "connection request {i} carries private data {:02x?}, not the QP index {i}",
                    ev.private_data
                )));
            }
            side.add_cm_qp(&ev.id)?;
            let param =
                ConnParam { responder_resources: RD_ATOMIC, initiator_depth: RD_ATOMIC, ..ConnParam::default() };
            ev.id.accept(&param).map_err(cm("rdma_accept"))?;
            match (&ev.param, self.conn) {
                (Some(p), Conn::Rc | Conn::Uc) => {
                    if p.qp_num != client.qps[i].qpn {
                        return Err(PerfError::Peer(format!(
                            "rdma_cm connects QP {:#x}, but the client described QP {:#x}",
                            p.qp_num, client.qps[i].qpn
                        )));
                    }
                    expect(&self.channel, CmEventKind::Established, "waiting for the client's RTU")?;
                    qps.push(QpInfo { qpn: p.qp_num, psn: side.expected_psn(i)? });
                }
                // SIDR carries no QP number of the requester: the client's Hello does.
                _ => qps.push(client.qps[i]),
            }
            self.ids.push(ev.id);
        }
        Ok(qps)
    }

    /// Ends the connections: the client disconnects (DREQ) and waits for the DREPs, the
    /// server waits for the DREQs and answers them. UD has nothing to end.
    pub(crate) fn close(&self, active: bool) -> Result<(), PerfError> {
        if self.conn == Conn::Ud {
            return Ok(());
        }
        if active {
            for id in &self.ids {
                id.disconnect().map_err(cm("rdma_disconnect"))?;
            }
        }
        for _ in &self.ids {
            let ev = expect(&self.channel, CmEventKind::Disconnected, "waiting for the peer's disconnect")?;
            if !active {
                ev.id.disconnect().map_err(cm("rdma_disconnect"))?;
            }
        }
        Ok(())
    }
}

/// The next event on `channel`, which must be `kind`.
fn expect(channel: &EventChannel, kind: CmEventKind, doing: &str) -> Result<CmEvent, PerfError> {
    match channel.get_cm_event(Some(STEP)) {
        Ok(Some(ev)) if ev.kind == kind => Ok(ev),
        Ok(Some(ev)) if matches!(ev.kind, CmEventKind::Rejected | CmEventKind::Unreachable) => {
            Err(PerfError::Unreachable(format!("{doing}: {:?} ({:?})", ev.kind, ev.status)))
        }
        Ok(Some(ev)) => {
            Err(PerfError::Peer(format!("{doing}: expected {kind:?}, got {:?} ({:?})", ev.kind, ev.status)))
        }
        Ok(None) => Err(PerfError::Peer(format!("{doing}: no {kind:?} within {STEP:?}"))),
        Err(e) => Err(PerfError::Rdma(format!("{doing}: rdma_get_cm_event: {e}"))),
    }
}
