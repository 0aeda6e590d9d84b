//! Test nodes that speak just enough RoCEv2 (UD sends, built and checked with softrdma-wire)
//! to exercise the fabric: a pinging and echoing [`Peer`] with a retransmit timer, a paced
//! fire-and-forget [`Blaster`] and a recording [`Sink`].

#![allow(dead_code, reason = "each test uses some of the helpers")]

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::io::Write;
use std::net::IpAddr;
use std::rc::Rc;
use std::time::Duration;

use softrdma_sim::{Envelope, Node, Time};
use softrdma_wire::{BthRepr, DethRepr, ExtHeaders, ImmDtRepr, Opcode, PKey, Psn, QKey, Qpn, RocePacket, RoceRepr};

/// A ping is a UD SEND; its reply is a UD SEND with immediate, so rules can tell them apart
/// by opcode.
pub(crate) const PING: Opcode = Opcode::UD_SEND_ONLY;
/// See [`PING`].
pub(crate) const REPLY: Opcode = Opcode::UD_SEND_ONLY_WITH_IMMEDIATE;

const QKEY: QKey = QKey(0x1111_1111);
const QPN: u32 = 0x11;

pub(crate) fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

/// Emits a UD packet with PSN `seq` (truncated to 24 bits) and returns its length.
pub(crate) fn emit_ud(envelope: &Envelope, opcode: Opcode, seq: u32, payload: &[u8], buf: &mut [u8]) -> usize {
    let repr = RoceRepr {
        bth: BthRepr {
            opcode,
            solicited_event: false,
            mig_req: false,
            pkey: PKey::DEFAULT,
            fecn: false,
            becn: false,
            dest_qp: Qpn::new(QPN).unwrap(),
            ack_req: false,
            psn: Psn::from_u24_truncating(seq),
        },
        ext: ExtHeaders {
            deth: Some(DethRepr { qkey: QKEY, src_qp: Qpn::new(QPN).unwrap() }),
            imm_dt: (opcode == REPLY).then_some(ImmDtRepr(seq.to_be_bytes())),
            ..Default::default()
        },
        payload,
    };
    repr.emit(envelope, buf).unwrap()
}

fn envelope(src: IpAddr, dst: IpAddr) -> Envelope {
    Envelope::rocev2(src, 0xc000, dst).unwrap()
}

/// Pings its peer `to_ping` times, at most `window` outstanding, retransmitting each after
/// `rto` up to `max_tries` transmissions; answers every ping it receives.
pub(crate) struct Peer {
    pub(crate) me: IpAddr,
    pub(crate) peer: IpAddr,
    pub(crate) to_ping: u32,
    pub(crate) window: usize,
    pub(crate) rto: Duration,
    pub(crate) max_tries: u32,
    pub(crate) echo: bool,
    next_new: u32,
    /// seq -> (retransmit deadline, transmissions so far)
    outstanding: BTreeMap<u32, (Time, u32)>,
    retransmit: VecDeque<u32>,
    replies_due: VecDeque<(IpAddr, u32)>,
    pub(crate) replies: BTreeSet<u32>,
    pub(crate) duplicate_replies: u64,
    pub(crate) pings_received: Vec<u32>,
    pub(crate) icrc_failures: u64,
    pub(crate) malformed: u64,
    pub(crate) retransmits: u64,
    pub(crate) gave_up: u64,
}

impl Peer {
    pub(crate) fn new(me: &str, peer: &str) -> Self {
        Self {
            me: ip(me),
            peer: ip(peer),
            to_ping: 0,
            window: 8,
            rto: Duration::from_micros(50),
            max_tries: u32::MAX,
            echo: true,
            next_new: 0,
            outstanding: BTreeMap::new(),
            retransmit: VecDeque::new(),
            replies_due: VecDeque::new(),
            replies: BTreeSet::new(),
            duplicate_replies: 0,
            pings_received: Vec::new(),
            icrc_failures: 0,
            malformed: 0,
            retransmits: 0,
            gave_up: 0,
        }
    }

    pub(crate) fn pinging(mut self, n: u32) -> Self {
        self.to_ping = n;
        self
    }

    /// Every ping answered.
    pub(crate) fn done(&self) -> bool {
        self.replies.len() == self.to_ping as usize
    }
}

impl Node for Peer {
    fn addresses(&self) -> Vec<IpAddr> {
        vec![self.me]
    }

    fn handle_datagram(&mut self, _now: Time, envelope: &Envelope, payload: &[u8]) {
        if !RocePacket::new_unchecked(payload).verify_icrc(envelope) {
            self.icrc_failures += 1;
            return;
        }
        let Ok(repr) = RocePacket::new_checked(payload).and_then(|p| RoceRepr::parse(&p, envelope).map(|r| r.bth))
        else {
            self.malformed += 1;
            return;
        };
        let seq = repr.psn.value();
        match repr.opcode {
            PING => {
                self.pings_received.push(seq);
                if self.echo {
                    self.replies_due.push_back((envelope.src_ip(), seq));
                }
            }
            REPLY => {
                self.outstanding.remove(&seq);
                if !self.replies.insert(seq) {
                    self.duplicate_replies += 1;
                }
            }
            _ => self.malformed += 1,
        }
    }

    fn handle_timeout(&mut self, now: Time) {
        let due: Vec<u32> = self.outstanding.iter().filter(|(_, (at, _))| *at <= now).map(|(&s, _)| s).collect();
        for seq in due {
            let (deadline, tries) = self.outstanding.get_mut(&seq).unwrap();
            if *tries >= self.max_tries {
                self.outstanding.remove(&seq);
                self.gave_up += 1;
            } else {
                *tries += 1;
                *deadline = now + self.rto;
                self.retransmit.push_back(seq);
                self.retransmits += 1;
            }
        }
    }

    fn poll_transmit(&mut self, now: Time, buf: &mut [u8]) -> Option<(Envelope, usize)> {
        if let Some((to, seq)) = self.replies_due.pop_front() {
            let env = envelope(self.me, to);
            return Some((env, emit_ud(&env, REPLY, seq, &seq.to_be_bytes(), buf)));
        }
        let env = envelope(self.me, self.peer);
        let mut ping = [0u8; 16];
        ping[4..].copy_from_slice(b"ping-payload");
        while let Some(seq) = self.retransmit.pop_front() {
            if self.outstanding.contains_key(&seq) {
                ping[..4].copy_from_slice(&seq.to_be_bytes());
                return Some((env, emit_ud(&env, PING, seq, &ping, buf)));
            }
        }
        if self.next_new < self.to_ping && self.outstanding.len() < self.window {
            let seq = self.next_new;
            self.next_new += 1;
            self.outstanding.insert(seq, (now + self.rto, 1));
            ping[..4].copy_from_slice(&seq.to_be_bytes());
            return Some((env, emit_ud(&env, PING, seq, &ping, buf)));
        }
        None
    }

    fn poll_timeout(&self) -> Option<Time> {
        self.outstanding.values().map(|&(at, _)| at).min()
    }
}

/// Sends `total` pings to `peer`, `burst` every `tick`, without waiting for anything; keeps
/// a copy of every payload it sent.
pub(crate) struct Blaster {
    pub(crate) me: IpAddr,
    pub(crate) peer: IpAddr,
    pub(crate) total: u32,
    pub(crate) burst: u32,
    pub(crate) tick: Duration,
    pub(crate) payload_len: usize,
    budget: u32,
    next_tick: Time,
    pub(crate) sent: Vec<Vec<u8>>,
}

impl Blaster {
    pub(crate) fn new(me: &str, peer: &str, total: u32, burst: u32, tick: Duration) -> Self {
        Self {
            me: ip(me),
            peer: ip(peer),
            total,
            burst,
            tick,
            payload_len: 64,
            budget: burst,
            next_tick: Time::ZERO + tick,
            sent: Vec::new(),
        }
    }
}

impl Node for Blaster {
    fn addresses(&self) -> Vec<IpAddr> {
        vec![self.me]
    }

    fn handle_datagram(&mut self, _: Time, _: &Envelope, _: &[u8]) {}

    fn handle_timeout(&mut self, now: Time) {
        self.budget = self.burst;
        self.next_tick = now + self.tick;
    }

    fn poll_transmit(&mut self, _: Time, buf: &mut [u8]) -> Option<(Envelope, usize)> {
        let seq = self.sent.len() as u32;
        if self.budget == 0 || seq >= self.total {
            return None;
        }
        self.budget -= 1;
        let env = envelope(self.me, self.peer);
        let mut payload = vec![0xa5u8; self.payload_len];
        payload[..4].copy_from_slice(&seq.to_be_bytes());
        let len = emit_ud(&env, PING, seq, &payload, buf);
        self.sent.push(buf[..len].to_vec());
        Some((env, len))
    }

    fn poll_timeout(&self) -> Option<Time> {
        (self.sent.len() < self.total as usize).then_some(self.next_tick)
    }
}

/// One datagram a [`Sink`] received.
pub(crate) struct Received {
    pub(crate) at: Time,
    pub(crate) envelope: Envelope,
    pub(crate) payload: Vec<u8>,
    pub(crate) icrc_ok: bool,
}

impl Received {
    pub(crate) fn psn(&self) -> u32 {
        u32::from_be_bytes([0, self.payload[9], self.payload[10], self.payload[11]])
    }
}

/// Receives and keeps everything sent to its addresses.
pub(crate) struct Sink {
    pub(crate) me: Vec<IpAddr>,
    pub(crate) received: Vec<Received>,
}

impl Sink {
    pub(crate) fn new(me: &[&str]) -> Self {
        Self { me: me.iter().map(|s| ip(s)).collect(), received: Vec::new() }
    }

    pub(crate) fn icrc_failures(&self) -> usize {
        self.received.iter().filter(|r| !r.icrc_ok).count()
    }

    pub(crate) fn psns(&self) -> Vec<u32> {
        self.received.iter().map(Received::psn).collect()
    }
}

impl Node for Sink {
    fn addresses(&self) -> Vec<IpAddr> {
        self.me.clone()
    }

    fn handle_datagram(&mut self, now: Time, envelope: &Envelope, payload: &[u8]) {
        let icrc_ok = RocePacket::new_unchecked(payload).verify_icrc(envelope);
        self.received.push(Received { at: now, envelope: *envelope, payload: payload.to_vec(), icrc_ok });
    }

    fn handle_timeout(&mut self, _: Time) {}

    fn poll_transmit(&mut self, _: Time, _: &mut [u8]) -> Option<(Envelope, usize)> {
        None
    }

    fn poll_timeout(&self) -> Option<Time> {
        None
    }
}

/// A `Write` whose bytes the test can read after the fabric wrote them.
#[derive(Clone, Default)]
pub(crate) struct SharedBuf(pub(crate) Rc<RefCell<Vec<u8>>>);

impl SharedBuf {
    pub(crate) fn bytes(&self) -> Vec<u8> {
        self.0.borrow().clone()
    }
}

impl Write for SharedBuf {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.borrow_mut().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
