//! `softrdma decode`: one line per RoCEv2 packet of a capture, as text or JSON.

use std::fmt::{self, Write as _};
use std::io::{self, Write};
use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use serde::Serialize;
use softrdma_pcap::{CaptureError, CaptureReader, Frame};
use softrdma_wire::datagram::UdpDatagram;
use softrdma_wire::{RocePacket, RoceRepr, Syndrome};

pub(crate) mod follow;
mod mad;

/// Output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Format {
    /// Human-readable, one line per packet.
    Text,
    /// One JSON object per line.
    Json,
}

/// Why decoding stopped.
#[derive(Debug)]
pub(crate) enum DecodeError {
    /// The capture could not be opened or read.
    Capture(CaptureError),
    /// Standard output failed.
    Output(io::Error),
    /// `--follow` found nothing to follow; the message says what the capture holds.
    Follow(String),
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Capture(e) => write!(f, "{e}"),
            DecodeError::Output(e) => write!(f, "cannot write output: {e}"),
            DecodeError::Follow(e) => f.write_str(e),
        }
    }
}

impl From<io::Error> for DecodeError {
    fn from(e: io::Error) -> Self {
        DecodeError::Output(e)
    }
}

/// What a capture held.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Summary {
    pub(crate) frames: usize,
    pub(crate) roce: usize,
    pub(crate) icrc_bad: usize,
    pub(crate) skipped: usize,
    pub(crate) malformed: usize,
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} frames: {} RoCEv2 ({} ICRC ok, {} bad), {} other skipped, {} malformed",
            self.frames,
            self.roce,
            self.roce - self.icrc_bad,
            self.icrc_bad,
            self.skipped,
            self.malformed
        )
    }
}

/// One output line.
#[derive(Serialize, Debug)]
#[serde(untagged)]
pub(crate) enum Line {
    /// A RoCEv2 packet.
    Packet(Box<PacketLine>),
    /// A frame that claims to be RoCEv2 but breaks the format.
    Malformed(MalformedLine),
}

/// A frame that could not be decoded, and why.
#[derive(Serialize, Debug)]
pub(crate) struct MalformedLine {
    frame: usize,
    time: f64,
    malformed: String,
}

/// A decoded RoCEv2 packet. Numbers are numbers in JSON; text shows keys and QPNs in hex.
#[derive(Serialize, Debug)]
pub(crate) struct PacketLine {
    frame: usize,
    /// Seconds since the first frame of the capture.
    time: f64,
    /// Seconds since the Unix epoch.
    timestamp: f64,
    src: IpAddr,
    src_port: u16,
    dst: IpAddr,
    dst_port: u16,
    opcode: String,
    opcode_value: u8,
    dest_qp: u32,
    psn: u32,
    ack_req: bool,
    solicited_event: bool,
    mig_req: bool,
    fecn: bool,
    becn: bool,
    pkey: u16,
    pad: u8,
    /// An XRC request's target SRQ (XRCETH).
    #[serde(skip_serializing_if = "Option::is_none")]
    xrc_srqn: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reth: Option<Reth>,
    #[serde(skip_serializing_if = "Option::is_none")]
    aeth: Option<Aeth>,
    #[serde(skip_serializing_if = "Option::is_none")]
    deth: Option<Deth>,
    #[serde(skip_serializing_if = "Option::is_none")]
    atomic_eth: Option<AtomicEth>,
    #[serde(skip_serializing_if = "Option::is_none")]
    atomic_ack_eth: Option<AtomicAckEth>,
    #[serde(skip_serializing_if = "Option::is_none")]
    imm_data: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ieth: Option<Ieth>,
    #[serde(skip_serializing_if = "Option::is_none")]
    feth: Option<Feth>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mad: Option<mad::Mad>,
    payload_len: usize,
    icrc: &'static str,
    /// The four ICRC bytes as they travel, in hex (as Wireshark shows them).
    icrc_wire: String,
}

#[derive(Serialize, Debug)]
struct Reth {
    va: u64,
    rkey: u32,
    dma_length: u32,
}

#[derive(Serialize, Debug)]
struct Aeth {
    /// ACK, RNR_NAK, NAK or RESERVED.
    kind: &'static str,
    syndrome: u8,
    #[serde(skip_serializing_if = "Option::is_none")]
    credit_code: Option<u8>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rnr_timer: Option<u8>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rnr_delay_us: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    nak: Option<String>,
    msn: u32,
}

#[derive(Serialize, Debug)]
struct Deth {
    qkey: u32,
    src_qp: u32,
}

#[derive(Serialize, Debug)]
struct AtomicEth {
    va: u64,
    rkey: u32,
    swap_add: u64,
    compare: u64,
}

#[derive(Serialize, Debug)]
struct AtomicAckEth {
    original_data: u64,
}

#[derive(Serialize, Debug)]
struct Ieth {
    rkey: u32,
}

#[derive(Serialize, Debug)]
struct Feth {
    selectivity: u8,
    placement_type: u8,
}

/// Decodes `path` and writes one line per RoCEv2 frame to `out`.
pub(crate) fn run(path: &Path, format: Format, out: &mut impl Write) -> Result<Summary, DecodeError> {
    let reader = CaptureReader::open(path).map_err(DecodeError::Capture)?;
    let mut summary = Summary::default();
    let mut first: Option<Duration> = None;
    let mut text = String::new();
    for (index, frame) in reader.enumerate() {
        let frame = frame.map_err(DecodeError::Capture)?;
        summary.frames += 1;
        let start = *first.get_or_insert(frame.timestamp);
        let Some(line) = decode_frame(index + 1, &frame, start) else {
            summary.skipped += 1;
            continue;
        };
        match &line {
            Line::Packet(p) => {
                summary.roce += 1;
                if p.icrc != "ok" {
                    summary.icrc_bad += 1;
                }
            }
            Line::Malformed(_) => summary.malformed += 1,
        }
        match format {
            Format::Json => {
                serde_json::to_writer(&mut *out, &line).map_err(io::Error::from)?;
                out.write_all(b"\n")?;
            }
            Format::Text => {
                text.clear();
                write_text(&mut text, &line).expect("writing to a String cannot fail");
                out.write_all(text.as_bytes())?;
            }
        }
    }
    Ok(summary)
}

/// Decodes one frame: `None` when it is not RoCEv2 at all.
pub(crate) fn decode_frame(number: usize, frame: &Frame, start: Duration) -> Option<Line> {
    let time = frame.timestamp.saturating_sub(start).as_secs_f64();
    let malformed = |reason: String| Some(Line::Malformed(MalformedLine { frame: number, time, malformed: reason }));
    let ip = frame.ip_packet().ok()?;
    let dgram = match UdpDatagram::parse(ip) {
        Ok(d) if d.is_roce() => d,
        Ok(_) | Err(softrdma_wire::Error::NotRoce) => return None,
        Err(e) => {
            // A broken IP or UDP header: only worth reporting if it was headed for 4791.
            return if looks_like_roce(ip) { malformed(e.to_string()) } else { None };
        }
    };
    if frame.data.len() < frame.orig_len as usize {
        return malformed(format!("captured {} of {} bytes (snap length too small)", frame.data.len(), frame.orig_len));
    }
    let packet = match RocePacket::new_checked(dgram.payload) {
        Ok(p) => p,
        Err(e) => return malformed(e.to_string()),
    };
    let envelope = dgram.envelope();
    let icrc_ok = packet.verify_icrc(&envelope);
    let repr = match RoceRepr::parse_ignoring_icrc(&packet) {
        Ok(r) => r,
        Err(e) => {
            let icrc = if icrc_ok { "ok" } else { "BAD" };
            return malformed(format!("{e} (icrc={icrc})"));
        }
    };
    let bth = &repr.bth;
    let ext = &repr.ext;
    let line = PacketLine {
        frame: number,
        time,
        timestamp: frame.timestamp.as_secs_f64(),
        src: envelope.src_ip(),
        src_port: envelope.src_port(),
        dst: envelope.dst_ip(),
        dst_port: envelope.dst_port(),
        opcode: bth.opcode.to_string(),
        opcode_value: bth.opcode.0,
        dest_qp: bth.dest_qp.value(),
        psn: bth.psn.value(),
        ack_req: bth.ack_req,
        solicited_event: bth.solicited_event,
        mig_req: bth.mig_req,
        fecn: bth.fecn,
        becn: bth.becn,
        pkey: bth.pkey.0,
        pad: packet.bth().pad_count(),
        xrc_srqn: ext.xrceth.map(|x| x.srqn),
        reth: ext.reth.map(|r| Reth { va: r.virtual_address, rkey: r.rkey.0, dma_length: r.dma_length }),
        aeth: ext.aeth.map(|a| aeth(a.syndrome, a.msn.value())),
        deth: ext.deth.map(|d| Deth { qkey: d.qkey.0, src_qp: d.src_qp.value() }),
        atomic_eth: ext.atomic_eth.map(|a| AtomicEth {
            va: a.virtual_address,
            rkey: a.rkey.0,
            swap_add: a.swap_add,
            compare: a.compare,
        }),
        atomic_ack_eth: ext.atomic_ack_eth.map(|a| AtomicAckEth { original_data: a.original_data }),
        imm_data: ext.imm_dt.map(|i| i.value()),
        ieth: ext.ieth.map(|i| Ieth { rkey: i.rkey.0 }),
        feth: ext.feth.map(|f| Feth { selectivity: f.selectivity, placement_type: f.placement_type }),
        mad: ext.deth.is_some().then(|| mad::decode(repr.payload)).flatten(),
        payload_len: repr.payload.len(),
        icrc: if icrc_ok { "ok" } else { "BAD" },
        icrc_wire: hex4(packet.icrc().to_le_bytes()),
    };
    Some(Line::Packet(Box::new(line)))
}

fn hex4(b: [u8; 4]) -> String {
    format!("{:02x}{:02x}{:02x}{:02x}", b[0], b[1], b[2], b[3])
}

/// Whether a damaged IP packet still shows UDP to port 4791 at the usual offsets.
fn looks_like_roce(ip: &[u8]) -> bool {
    let (proto, udp_at) = match ip.first().map(|b| b >> 4) {
        Some(4) => (ip.get(9), usize::from(ip[0] & 0x0f) * 4),
        Some(6) => (ip.get(6), 40),
        _ => return false,
    };
    proto == Some(&17) && ip.get(udp_at + 2..udp_at + 4) == Some(&softrdma_wire::ROCEV2_UDP_PORT.to_be_bytes()[..])
}

fn aeth(syndrome: Syndrome, msn: u32) -> Aeth {
    let mut a = Aeth {
        kind: "",
        syndrome: syndrome.to_u8(),
        credit_code: None,
        rnr_timer: None,
        rnr_delay_us: None,
        nak: None,
        msn,
    };
    match syndrome {
        Syndrome::Ack { credit_code } => {
            a.kind = "ACK";
            a.credit_code = Some(credit_code);
        }
        Syndrome::RnrNak(t) => {
            a.kind = "RNR_NAK";
            a.rnr_timer = Some(t.code());
            a.rnr_delay_us = Some(t.delay_us());
        }
        Syndrome::Nak(code) => {
            a.kind = "NAK";
            a.nak = Some(code.to_string());
        }
        Syndrome::Reserved(_) => a.kind = "RESERVED",
    }
    a
}

fn write_text(s: &mut String, line: &Line) -> fmt::Result {
    let p = match line {
        Line::Malformed(m) => return writeln!(s, "{:>6} {:>11.6} malformed: {}", m.frame, m.time, m.malformed),
        Line::Packet(p) => p,
    };
    let src = std::net::SocketAddr::new(p.src, p.src_port);
    let dst = std::net::SocketAddr::new(p.dst, p.dst_port);
    write!(s, "{:>6} {:>11.6} {src} → {dst} {} dqp={:#08x} psn={}", p.frame, p.time, p.opcode, p.dest_qp, p.psn)?;
    write!(s, " ackreq={}", u8::from(p.ack_req))?;
    for (set, name) in [(p.solicited_event, "se"), (p.mig_req, "mig"), (p.fecn, "fecn"), (p.becn, "becn")] {
        if set {
            write!(s, " {name}")?;
        }
    }
    if p.pkey != 0xffff {
        write!(s, " pkey={:#06x}", p.pkey)?;
    }
    if let Some(f) = &p.feth {
        write!(s, " selectivity={} placement={}", f.selectivity, f.placement_type)?;
    }
    if let Some(r) = &p.reth {
        write!(s, " va={:#x} rkey={:#010x} dmalen={}", r.va, r.rkey, r.dma_length)?;
    }
    if let Some(a) = &p.aeth {
        match a.kind {
            "ACK" => write!(s, " aeth=ACK credits={:#04x}", a.credit_code.unwrap_or_default())?,
            "RNR_NAK" => write!(
                s,
                " aeth=RNR_NAK timer={} ({}us)",
                a.rnr_timer.unwrap_or_default(),
                a.rnr_delay_us.unwrap_or_default()
            )?,
            "NAK" => write!(s, " aeth=NAK({})", a.nak.as_deref().unwrap_or_default())?,
            _ => write!(s, " aeth=RESERVED({:#04x})", a.syndrome)?,
        }
        write!(s, " msn={}", a.msn)?;
    }
    if let Some(d) = &p.deth {
        write!(s, " qkey={:#010x} srcqp={:#08x}", d.qkey, d.src_qp)?;
    }
    if let Some(a) = &p.atomic_eth {
        write!(s, " va={:#x} rkey={:#010x} swap_add={:#x} compare={:#x}", a.va, a.rkey, a.swap_add, a.compare)?;
    }
    if let Some(a) = &p.atomic_ack_eth {
        write!(s, " orig={:#x}", a.original_data)?;
    }
    if let Some(imm) = p.imm_data {
        write!(s, " imm={imm:#010x}")?;
    }
    if let Some(srqn) = p.xrc_srqn {
        write!(s, " xrc_srqn={srqn:#08x}")?;
    }
    if let Some(i) = &p.ieth {
        write!(s, " inv_rkey={:#010x}", i.rkey)?;
    }
    if let Some(m) = &p.mad {
        m.write_text(s)?;
    }
    writeln!(s, " len={} icrc={}", p.payload_len, p.icrc)
}
