//! The MAD and CM message carried by a UD packet (QP1 traffic), for `softrdma decode`.

use std::fmt::{self, Write as _};
use std::net::{IpAddr, SocketAddr};

use serde::Serialize;
use softrdma_wire::cm::CmMessage;
use softrdma_wire::cma::{CmaHeaderRepr, split_service_id};
use softrdma_wire::mad::{MAD_LEN, MadPacket, MadRepr};

/// A MAD as shown by the decoder.
#[derive(Serialize, Debug)]
pub(crate) struct Mad {
    class: String,
    class_value: u8,
    class_version: u8,
    method: String,
    method_value: u8,
    status: u16,
    transaction_id: u64,
    attribute: String,
    attribute_id: u16,
    attribute_modifier: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    cm: Option<Cm>,
}

/// The CM message of a CM MAD.
#[derive(Serialize, Debug, Default)]
struct Cm {
    message: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    local_comm_id: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    remote_comm_id: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    service_id: Option<u64>,
    /// The sender's QP (REQ, REP), the QP a SIDR_REP points to, or the QP a DREQ is for.
    #[serde(skip_serializing_if = "Option::is_none")]
    qpn: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    starting_psn: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason_value: Option<u16>,
    /// rdma_cm's header in REQ / SIDR_REQ private data: who connects to what.
    #[serde(skip_serializing_if = "Option::is_none")]
    rdma_cm: Option<RdmaCm>,
}

#[derive(Serialize, Debug)]
struct RdmaCm {
    port_space: String,
    src: IpAddr,
    src_port: u16,
    dst: IpAddr,
    dst_port: u16,
}

impl Mad {
    pub(crate) fn write_text(&self, s: &mut String) -> fmt::Result {
        write!(s, " mad={}/{} attr={} tid={:#018x}", self.class, self.method, self.attribute, self.transaction_id)?;
        let Some(cm) = &self.cm else { return Ok(()) };
        write!(s, " cm={}", cm.message)?;
        if let Some(id) = cm.local_comm_id {
            write!(s, " local_comm_id={id:#010x}")?;
        }
        if let Some(id) = cm.remote_comm_id {
            write!(s, " remote_comm_id={id:#010x}")?;
        }
        if let Some(id) = cm.service_id {
            write!(s, " service_id={id:#018x}")?;
        }
        if let Some(qpn) = cm.qpn {
            write!(s, " qpn={qpn:#08x}")?;
        }
        if let Some(psn) = cm.starting_psn {
            write!(s, " start_psn={psn}")?;
        }
        if let Some(reason) = &cm.reason {
            write!(s, " reason={reason}")?;
        }
        if let Some(r) = &cm.rdma_cm {
            let src = SocketAddr::new(r.src, r.src_port);
            let dst = SocketAddr::new(r.dst, r.dst_port);
            write!(s, " rdma_cm={}:{src}→{dst}", r.port_space)?;
        }
        Ok(())
    }
}

/// Reads the MAD in a UD payload, if the payload is one (exactly 256 bytes).
pub(crate) fn decode(payload: &[u8]) -> Option<Mad> {
    if payload.len() != MAD_LEN {
        return None;
    }
    let mad = MadRepr::parse(&MadPacket::new_unchecked(payload)).ok()?;
    let h = &mad.header;
    let hex = |v: u64| format!("{v:#x}");
    Some(Mad {
        class: h.mgmt_class.name().map_or_else(|| hex(h.mgmt_class.0.into()), str::to_string),
        class_value: h.mgmt_class.0,
        class_version: h.class_version,
        method: h.method.name().map_or_else(|| hex(h.method.0.into()), str::to_string),
        method_value: h.method.0,
        status: h.status,
        transaction_id: h.transaction_id,
        attribute: h.attribute_id.name(h.mgmt_class).map_or_else(|| hex(h.attribute_id.0.into()), str::to_string),
        attribute_id: h.attribute_id.0,
        attribute_modifier: h.attribute_modifier,
        cm: CmMessage::parse(&mad).ok().map(|m| cm(&m)),
    })
}

fn cm(message: &CmMessage<'_>) -> Cm {
    let mut cm = Cm {
        message: message.name(),
        local_comm_id: message.local_comm_id(),
        remote_comm_id: message.remote_comm_id(),
        ..Cm::default()
    };
    let rdma_cm = |service_id: u64, private_data: &[u8]| {
        let header = CmaHeaderRepr::parse(private_data).ok()?;
        let (port_space, dst_port) = split_service_id(service_id)?;
        Some(RdmaCm {
            port_space: port_space.to_string(),
            src: header.src_ip()?,
            src_port: header.port,
            dst: header.dst_ip()?,
            dst_port,
        })
    };
    match message {
        CmMessage::Req(r) => {
            cm.service_id = Some(r.service_id);
            cm.qpn = Some(r.local_qpn.value());
            cm.starting_psn = Some(r.starting_psn.value());
            cm.rdma_cm = rdma_cm(r.service_id, r.private_data);
        }
        CmMessage::Rep(r) => {
            cm.qpn = Some(r.local_qpn.value());
            cm.starting_psn = Some(r.starting_psn.value());
        }
        CmMessage::Rej(r) => {
            cm.reason = Some(r.reason.to_string());
            cm.reason_value = Some(r.reason.0);
        }
        CmMessage::Dreq(r) => cm.qpn = Some(r.remote_qpn.value()),
        CmMessage::SidrReq(r) => {
            cm.service_id = Some(r.service_id);
            cm.rdma_cm = rdma_cm(r.service_id, r.private_data);
        }
        CmMessage::SidrRep(r) => {
            cm.service_id = Some(r.service_id);
            cm.qpn = Some(r.qpn.value());
            cm.reason = Some(r.status.to_string());
            cm.reason_value = Some(u16::from(r.status.0));
        }
        _ => {}
    }
    cm
}
