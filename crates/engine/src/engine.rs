//! The device: its object tables and the verbs.
//!
//! [`Engine`] carries the calling contract.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::IpAddr;

use rand_chacha::ChaCha12Rng;
use rand_core::{Rng, SeedableRng};
use slab::Slab;
use softrdma_wire::{AethRepr, Envelope, Gid, Psn, Qpn, RKey};

use crate::Instant;
use crate::identification::Identifications;
use crate::memory::Memory;
use crate::qp::{Qp, RecvWqe, Ring};
use crate::qp_state::{self, AttrMask};
use crate::verbs::*;

/// What the device is and what it allows (`ibv_device_attr` and the port).
#[derive(Clone, Debug)]
pub struct DeviceConfig {
    /// The GID table: the device's IP addresses, in index order.
    pub addresses: Vec<IpAddr>,
    /// Seeds the R_Key generator.
    pub seed: u64,
    /// First QPN handed out (QPs 0 and 1 are the SMI and GSI). QPNs come from
    /// `qpn_base .. qpn_base + max_qp` (capped at 2^24), wrapping, so a runtime that shares
    /// a host port among several engines gives each one its own range.
    pub qpn_base: u32,
    /// Most QPs; also the size of the QPN range.
    pub max_qp: u32,
    /// Deepest work queue.
    pub max_qp_wr: u32,
    /// Most SGEs per WR.
    pub max_sge: u32,
    /// Deepest CQ.
    pub max_cqe: u32,
    /// Most memory regions.
    pub max_mr: u32,
    /// Most memory windows.
    pub max_mw: u32,
    /// Most inline bytes per send WR.
    pub max_inline_data: u32,
    /// Most outstanding READs/atomics per QP, either direction.
    pub max_qp_rd_atom: u8,
    /// The port MTU (UD messages must fit one packet of it).
    pub port_mtu: Mtu,
    /// Largest message.
    pub max_msg_sz: u32,
    /// The UDP source port of every packet. `None` derives one per flow from the QPNs and
    /// flow label as Linux does (`rdma_get_udp_sport`, 0xC000..=0xFFFF, for ECMP entropy);
    /// `Some(port)` is for a device that sends from one socket, whose port the ICRC must
    /// then cover. Receivers never check it.
    pub udp_source_port: Option<u16>,
    /// The UDP destination port of every packet: 4791, the RoCEv2 port. Only tests that
    /// isolate groups of devices on one host change it, for all of them at once.
    pub udp_port: u16,
    /// RoCEv2 congestion control ([`crate::congestion`]): QPs answer ECN-marked packets and
    /// receive drops with CNPs and pace what they send at the rate CNPs leave them. `None`
    /// (the default): CNPs are neither sent nor obeyed.
    pub congestion: Option<crate::congestion::DcqcnConfig>,
    /// Packets the device's RC QPs together may have sent to one peer address and not yet
    /// seen acknowledged ([`crate::window`]); each QP also stops 128 ahead on its own.
    /// `None` (the default): no limit but each QP's. A runtime sets what the peer's receive
    /// buffer holds.
    pub peer_window: Option<u32>,
    /// Most multicast groups with a QP attached at once (`max_mcast_grp`; rxe: 8192).
    pub max_mcast_grp: u32,
    /// Most QPs attached to one group (`max_mcast_qp_attach`; rxe: 56).
    pub max_mcast_qp_attach: u32,
    /// Most attachments, all groups together (`max_total_mcast_qp_attach`; rxe: 0x70000).
    pub max_total_mcast_qp_attach: u32,
    /// Most XRC domains open at once (`max_xrcds`; ConnectX: 2^24, rxe: none).
    pub max_xrcds: u32,
    /// Leave the ICRC of the QPs' packets to the runtime ([`Transmit::icrc_pending`]), as a
    /// NIC computes it last, on the way out: a packet that crosses no wire (softrdma's
    /// same-host path) needs none. `false` (the default): every packet leaves complete.
    pub defer_icrc: bool,
    /// Build a new RC SEND or RDMA WRITE of one packet, and the packets after the first of
    /// a longer one by value, by the requester's short paths, and take a message of one
    /// packet by the responder's (`true`, the default), which leave out the checks, the
    /// parsing and the construction of headers that only other packets need; or by the
    /// general paths, as every other packet (`false`). Both make the same packets, answers
    /// and completions and leave the same state (a test runs every scenario it draws
    /// through both); `false` tells them apart when one is suspected.
    pub one_packet_short_path: bool,
}

impl Default for DeviceConfig {
    fn default() -> Self {
        Self {
            addresses: vec![IpAddr::from([127, 0, 0, 1])],
            seed: 0,
            qpn_base: 0x11,
            max_qp: 1 << 16,
            max_qp_wr: 1 << 14,
            max_sge: 32,
            max_cqe: 1 << 20,
            max_mr: 1 << 20,
            max_mw: 1 << 20,
            max_inline_data: 256,
            max_qp_rd_atom: 128,
            port_mtu: Mtu::Mtu4096,
            max_msg_sz: 1 << 31,
            udp_source_port: None,
            udp_port: softrdma_wire::ROCEV2_UDP_PORT,
            congestion: None,
            peer_window: None,
            max_mcast_grp: 8192,
            max_mcast_qp_attach: 56,
            max_total_mcast_qp_attach: 0x70000,
            max_xrcds: 1 << 16,
            defer_icrc: false,
            one_packet_short_path: true,
        }
    }
}

/// Packet and error counters, like rxe's `hw_counters`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct Counters {
    /// Datagrams sent.
    pub sent_packets: u64,
    /// Datagrams received and accepted.
    pub rcvd_packets: u64,
    /// Received datagrams that failed to parse (bad ICRC, malformed), dropped.
    pub rcvd_malformed: u64,
    /// Received datagrams whose ICRC matched the envelope as given (every IPv6 one, and
    /// IPv4 with the identification expected: 0, or a same-host GSO segment's index).
    pub rcvd_icrc_exact: u64,
    /// Received IPv4 datagrams whose ICRC matched an identification predicted from the
    /// peer's previous ones ([`crate::identification`]).
    pub rcvd_icrc_predicted: u64,
    /// Received IPv4 datagrams whose ICRC matched an identification solved for, not
    /// predicted (a peer's first packets, or a peer whose identifications are random).
    pub rcvd_icrc_solved: u64,
    /// Received datagrams whose ICRC did not match, or matched only an identification a
    /// trusted peer should not have sent, dropped (also in `rcvd_malformed`).
    pub rcvd_icrc_errors: u64,
    /// Datagrams for a QP that does not exist or is in the wrong state, or from the wrong
    /// peer, or with the wrong Q_Key, or a UD or UC SEND that found no receive posted,
    /// dropped.
    pub rcvd_dropped: u64,
    /// Duplicate requests seen by responders.
    pub duplicate_requests: u64,
    /// Out-of-sequence requests seen by responders.
    pub out_of_sequence: u64,
    /// Packets resent by requesters (each packet of a go-back-N retry counts; a READ
    /// request resent counts once, whatever the PSNs its responses span).
    pub retransmitted_packets: u64,
    /// Local ACK timeouts.
    pub ack_timeouts: u64,
    /// RNR NAKs sent.
    pub rnr_naks_sent: u64,
    /// RNR NAKs received.
    pub rnr_naks_rcvd: u64,
    /// NAKs (not RNR) sent.
    pub naks_sent: u64,
    /// NAKs (not RNR) received.
    pub naks_rcvd: u64,
    /// Requests a responder refused for their R_Key, address range or access rights (RC:
    /// NAK Remote Access Error; UC: the message dropped, no NAK exists), like mlx5's
    /// `resp_remote_access_errors`.
    pub resp_remote_access_errors: u64,
    /// Requests a responder refused as malformed: out of opcode sequence, wrong lengths, no
    /// READ/atomic resources, a misaligned atomic (RC: NAK Invalid Request; UC: dropped).
    pub resp_invalid_requests: u64,
    /// Requests a responder could not carry out (RC: NAK Remote Operational Error; UC:
    /// dropped), such as a receive too short for a SEND.
    pub resp_operational_errors: u64,
    /// Packets to a connected QP from its peer's address but another UDP source port than
    /// the one the peer uses, dropped.
    pub rcvd_wrong_source: u64,
    /// Packets to an authenticated QP whose tag did not verify (forged, corrupted, or from
    /// a peer with other keys), dropped.
    pub rcvd_auth_failures: u64,
    /// CNPs sent (congestion control: ECN-marked packets and receive drops answered).
    pub cnps_sent: u64,
    /// CNPs received and acted on (a QP's rate cut).
    pub cnps_rcvd: u64,
    /// Packets carried by reference whose data this device copied from the sending process
    /// ([`crate::reference`]): each once, a duplicate (taken, not executed again) not.
    pub rcvd_by_reference: u64,
    /// ACKs taken that came beside a packet from a process of this host, not as packets of
    /// their own ([`Engine::allow_acks_beside`]); they count in `rcvd_packets` too, as
    /// the peer's count them in its `sent_packets`.
    pub rcvd_acks_beside: u64,
    /// Requests the requester built by a short path: a new message of one packet, or a
    /// packet after the first of a longer RC SEND or WRITE by value
    /// ([`DeviceConfig::one_packet_short_path`]); they count in `sent_packets` too.
    pub sent_by_short_path: u64,
    /// Requests the responder took by its short path for a message of one packet
    /// ([`DeviceConfig::one_packet_short_path`]); they count in `rcvd_packets` too.
    pub rcvd_by_short_path: u64,
    /// Atomics this device's requesters applied themselves, on a mapping of a responder's
    /// memory that its engine granted ([`crate::direct`]): no packet either way.
    pub direct_atomics: u64,
}

/// A datagram [`Engine::poll_transmit`] wrote.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Transmit {
    /// Where it goes (IPv4 identification 0 and DF set: send it from an unconnected socket
    /// with `IP_PMTUDISC_DO`, which is what the ICRC was computed for).
    pub envelope: Envelope,
    /// Bytes of UDP payload written at the start of the buffer.
    pub len: usize,
    /// The IPv4 TOS / IPv6 traffic class the QP's address vector asks for (DSCP and the
    /// ECN bits; 0 for the device's default). Not covered by the ICRC: the runtime sets it
    /// on the datagram.
    pub traffic_class: u8,
    /// The local QP that sent it (QP1 for the CM's MADs): a capture filtered by QP keeps a
    /// packet its QP sent, which the BTH (naming only the destination QP) does not show.
    pub local_qp: Qpn,
    /// Its last 4 bytes are not its ICRC yet ([`DeviceConfig::defer_icrc`]): before it goes
    /// on a wire, or into a capture, the runtime computes it
    /// ([`RocePacket::fill_icrc`](softrdma_wire::RocePacket::fill_icrc) in `envelope`).
    pub icrc_pending: bool,
    /// Its payload is a list of where its data is in this process, not the data
    /// ([`crate::reference`]): it may go only to a process of this host that copies from
    /// this one, never by a socket.
    pub by_reference: bool,
    /// Its QP may send by reference ([`Engine::allow_by_reference`]).
    pub qp_by_reference: bool,
    /// Its QP may carry ACKs beside its requests ([`Engine::allow_acks_beside`]).
    pub qp_acks_beside: bool,
    /// The ACK its QP owed the peer, carried beside it instead of sent as a packet of its
    /// own ([`Engine::allow_acks_beside`]): the receiving engine takes it, with
    /// [`Engine::handle_ack_beside`], just before this packet.
    pub ack_beside: Option<AckBeside>,
    /// An atomic's answer that a grant goes beside ([`Engine::grant`]): what the
    /// responder's engine vouches for, for its peer to apply the next atomics on the region
    /// itself ([`crate::direct`]). Only for a process of this host that can map the region;
    /// the runtime drops it anywhere else.
    pub grant: bool,
}

/// An ACK carried beside a packet to the QP it is for, in place of an ACK packet that
/// would have gone just before it: what the AETH and BTH of that packet would have said
/// ([`Engine::allow_acks_beside`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct AckBeside {
    /// The PSN it acknowledges.
    pub psn: Psn,
    /// Its syndrome (an ACK: a NAK always goes as a packet) and MSN.
    pub aeth: AethRepr,
}

impl Transmit {
    /// `len` bytes in `envelope` sent by `local_qp`, with their ICRC (`icrc_pending`
    /// false) or not yet; the device's traffic class, data by value.
    pub fn new(envelope: Envelope, len: usize, local_qp: Qpn, icrc_pending: bool) -> Self {
        Self {
            envelope,
            len,
            traffic_class: 0,
            local_qp,
            icrc_pending,
            by_reference: false,
            qp_by_reference: false,
            qp_acks_beside: false,
            ack_beside: None,
            grant: false,
        }
    }
}

#[derive(Debug)]
pub(crate) struct Mr {
    pub(crate) pd: PdId,
    /// Where its bytes are, for the runtime's [`Memory`].
    pub(crate) addr: u64,
    /// The address work requests and peers name its first byte by (`ibv_reg_mr_iova`; 0
    /// for a zero-based region; `addr` for most).
    pub(crate) iova: u64,
    pub(crate) length: u64,
    pub(crate) access: Access,
    pub(crate) keys: MrKeys,
    /// Memory windows bound to it (rxe's `num_mw`): while any is, the region can be neither
    /// deregistered nor reregistered.
    pub(crate) windows: u32,
}

/// A memory window (rxe `rxe_mw.c`). Its R_Key is `index << 8 | key`: the index is fixed
/// at allocation (and is its [`MwId`]), the key is what the last bind chose.
#[derive(Debug)]
pub(crate) struct Mw {
    pd: PdId,
    mw_type: MwType,
    rkey: u32,
    /// `None`: a type 1 window bound with length 0 (rxe: valid, length 0) or a type 2 window
    /// in the free state. Either way no access gets through.
    bound: Option<Bound>,
}

/// What a window is bound to.
#[derive(Debug, Clone, Copy)]
struct Bound {
    /// The region's slot in `Shared::mrs`.
    mr: usize,
    addr: u64,
    length: u64,
    access: Access,
    /// Type 2: the QP it was bound by, the only one it can be reached through.
    qp: Option<Qpn>,
}

/// Why a BIND_MW, LOCAL_INV or SEND_WITH_INV's invalidation failed (the work request
/// completes with `IBV_WC_MW_BIND_ERR` or `IBV_WC_LOC_QP_OP_ERR`; a remote invalidation
/// is a responder class J error). Says what was wrong, for tests and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MwError(pub(crate) &'static str);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Notify {
    Next,
    Solicited,
}

#[derive(Debug)]
pub(crate) struct Cq {
    pub(crate) capacity: u32,
    pub(crate) entries: VecDeque<Wc>,
    pub(crate) notify: Option<Notify>,
    pub(crate) overflowed: bool,
}

#[derive(Debug)]
pub(crate) struct Srq {
    pub(crate) pd: PdId,
    pub(crate) ring: Ring<RecvWqe>,
    pub(crate) max_sge: u32,
    pub(crate) limit: u32,
    /// An XRC SRQ's domain and the CQ its receives complete to.
    pub(crate) xrc: Option<(XrcdId, CqId)>,
}

#[derive(Debug)]
pub(crate) struct Ah {
    pub(crate) pd: PdId,
    pub(crate) av: AddressVector,
}

/// Everything but the QP table, so that a QP and the rest can be borrowed at once.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) config: DeviceConfig,
    rng: ChaCha12Rng,
    /// Each PD's users (MRs, MWs, QPs, SRQs, AHs).
    pub(crate) pds: Slab<u32>,
    pub(crate) mrs: Slab<Mr>,
    lkeys: BTreeMap<u32, usize>,
    rkeys: BTreeMap<u32, usize>,
    /// Memory windows by index (the upper 24 bits of their R_Keys). No MR's lkey or rkey
    /// has an index of a window in its upper 24 bits, so a key names one object at most.
    mws: BTreeMap<u32, Mw>,
    pub(crate) cqs: Slab<Cq>,
    pub(crate) srqs: Slab<Srq>,
    xrcds: Slab<()>,
    pub(crate) ahs: Slab<Ah>,
    pub(crate) ready: VecDeque<Qpn>,
    pub(crate) timers: BTreeSet<(Instant, u32)>,
    pub(crate) events: VecDeque<Event>,
    pub(crate) counters: Counters,
    /// Who sends which IPv4 identifications: the ICRC check's memory.
    pub(crate) identifications: Identifications,
    /// Gather lists of finished receive WQEs, swapped back into ring slots as receives are
    /// taken, so that posting a receive never allocates in steady state.
    pub(crate) sge_pool: Vec<Vec<Sge>>,
    /// CNPs owed: where, and to which QP.
    /// CNPs owed: where, to which QP, and for which of ours.
    pub(crate) cnps: VecDeque<(Envelope, Qpn, Qpn)>,
    /// Each peer's window, shared by the RC QPs that send to it.
    pub(crate) windows: crate::window::PeerWindows,
    /// The latest `now` the engine was given: what completions carry ([`Wc::completed_at`]).
    clock: Option<Instant>,
    /// The multicast groups with a QP attached, and those QPs in the order they attached
    /// (rxe's `mcg` table): what a packet to QPN 0xFFFFFF and a group address reaches.
    pub(crate) mcast: BTreeMap<Gid, Vec<Qpn>>,
    /// The epoch of the grants given ([`Engine::grant_epoch`]).
    pub(crate) grant_epoch: u64,
}

/// A software RDMA device.
///
/// # The sans-IO contract
///
/// [`Engine`] is a whole RDMA NIC with no sockets, clocks, threads or global randomness:
///
/// - **Inputs**: [`handle_datagram`](Engine::handle_datagram) (one received UDP payload and
///   its envelope) and [`handle_timeout`](Engine::handle_timeout), each with `now`; and the
///   verbs ([`post_send`](Engine::post_send), [`modify_qp`](Engine::modify_qp), ...).
/// - **Outputs**: [`poll_transmit`](Engine::poll_transmit) (the next datagram to send),
///   [`poll_timeout`](Engine::poll_timeout) (when to call `handle_timeout` next),
///   [`poll_event`](Engine::poll_event) (completion-channel and asynchronous events) and
///   [`poll_cq`](Engine::poll_cq).
///
/// After any input, call `poll_transmit` until it returns `None`, then `poll_timeout`.
/// Registered memory is reached only through the [`Memory`] passed to the calls that touch
/// it, and only after the engine's own key, bounds and access checks. All randomness (R_Keys)
/// comes from the seed in [`DeviceConfig`].
#[derive(Debug)]
pub struct Engine {
    pub(crate) shared: Shared,
    pub(crate) qps: BTreeMap<u32, Qp>,
    next_qpn: u32,
}

/// Where in the object tables a key check failed; decides the completion status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyError {
    /// No such key, or it belongs to another PD.
    BadKey,
    /// The range leaves the region.
    Bounds,
    /// The region does not allow the access.
    Access,
}

impl Shared {
    /// Checks that `[addr, addr + len)` lies in the MR `lkey` names, in `pd`, with `need`;
    /// where its first byte is in memory.
    pub(crate) fn check_lkey(&self, pd: PdId, lkey: LKey, addr: u64, len: u64, need: Access) -> Result<u64, KeyError> {
        let &index = self.lkeys.get(&lkey.0).ok_or(KeyError::BadKey)?;
        self.check_mr(index, pd, addr, len, need)
    }

    /// The responder's R_Key check for an access of `len` bytes at `va` that needs `need`,
    /// arriving on QP `qpn` of `pd`: `rkey` must name an MR of `pd` that holds the range and
    /// allows the access, or a valid memory window of `pd` (a type 2 one bound by `qpn`)
    /// whose bounds hold it and whose rights allow it. Returns where the first byte is in
    /// memory (the region names its bytes by its iova; a zero-based window from 0).
    pub(crate) fn resolve_rkey(
        &self,
        pd: PdId,
        qpn: Qpn,
        rkey: u32,
        va: u64,
        len: u64,
        need: Access,
    ) -> Result<u64, KeyError> {
        if let Some(&index) = self.rkeys.get(&rkey) {
            return self.check_mr(index, pd, va, len, need);
        }
        // rxe_lookup_mw: the key, the PD, the QP of a type 2 window, a length, the rights.
        let mw = self.mws.get(&(rkey >> 8)).filter(|m| m.rkey == rkey).ok_or(KeyError::BadKey)?;
        let b = mw.bound.as_ref().filter(|_| mw.pd == pd).ok_or(KeyError::BadKey)?;
        if b.qp.is_some_and(|q| q != qpn) {
            return Err(KeyError::BadKey);
        }
        if !b.access.contains(need) {
            return Err(KeyError::Access);
        }
        // The window's bounds (rxe checks only the region's: a window is the narrower).
        let offset =
            if b.access.contains(Access::ZERO_BASED) { va } else { va.checked_sub(b.addr).ok_or(KeyError::Bounds)? };
        if offset.checked_add(len).is_none_or(|end| end > b.length) {
            return Err(KeyError::Bounds);
        }
        let local = b.addr + offset;
        // The region cannot change under a bound window (dereg and rereg refuse), so this
        // holds; checked all the same, as the one place memory is reached through, which
        // gives where the bytes are.
        self.check_mr(b.mr, pd, local, len, Access(0))
    }

    /// The range R_Key `rkey` names, by the addresses peers use: a region's whole range, or
    /// a window's (a zero-based one's from 0). `None` for a key of no region or window of
    /// `pd` reachable through QP `qpn`; what it allows is left to [`resolve_rkey`](Self::resolve_rkey).
    /// The region `rkey` names, if a region does.
    pub(crate) fn region_by_rkey(&self, rkey: u32) -> Option<&Mr> {
        self.rkeys.get(&rkey).map(|&index| &self.mrs[index])
    }

    pub(crate) fn rkey_extent(&self, pd: PdId, qpn: Qpn, rkey: u32) -> Option<(u64, u64)> {
        if let Some(&index) = self.rkeys.get(&rkey) {
            let mr = &self.mrs[index];
            return (mr.pd == pd).then_some((mr.iova, mr.length));
        }
        let mw = self.mws.get(&(rkey >> 8)).filter(|m| m.rkey == rkey && m.pd == pd)?;
        let b = mw.bound.as_ref().filter(|b| b.qp.is_none_or(|q| q == qpn))?;
        Some((if b.access.contains(Access::ZERO_BASED) { 0 } else { b.addr }, b.length))
    }

    /// Executes a BIND_MW work request of QP `qpn` (in `qp_pd`): binds window `id` as `bind`
    /// says, its new R_Key's low 8 bits from `new_rkey`. The checks are rxe's
    /// (`rxe_check_bind_mw`), plus the region's PD, which must be the window's (the
    /// `ibv_bind_mw` inline's EPERM check, for both types).
    pub(crate) fn bind_mw(
        &mut self,
        qp_pd: PdId,
        qpn: Qpn,
        id: MwId,
        new_rkey: u32,
        bind: &MwBind,
    ) -> Result<(), MwError> {
        const SUPPORTED: u32 = Access::ALL.0 | Access::MW_BIND.0 | Access::ZERO_BASED.0;
        let mw = self.mws.get(&id.0).ok_or(MwError("no such window (deallocated?)"))?;
        let mr_index = if bind.length > 0 {
            Some(*self.lkeys.get(&bind.mr.0).ok_or(MwError("no region has that lkey"))?)
        } else {
            None
        };
        if bind.access.0 & !SUPPORTED != 0 {
            return Err(MwError("unsupported access flags"));
        }
        let zero_based = bind.access.contains(Access::ZERO_BASED);
        match mw.mw_type {
            // o10-36.2.2
            MwType::Type1 if zero_based => return Err(MwError("a type 1 window cannot be zero based")),
            MwType::Type1 => {}
            MwType::Type2 => {
                if mw.bound.is_some() {
                    return Err(MwError("a type 2 window must be invalidated before it is bound again"));
                }
                if qp_pd != mw.pd {
                    return Err(MwError("the QP's PD is not the window's (C10-72)"));
                }
                if mr_index.is_none() {
                    return Err(MwError("a type 2 window cannot be bound with length 0"));
                }
            }
        }
        if let Some(index) = mr_index {
            let mr = &self.mrs[index];
            if mr.pd != mw.pd {
                return Err(MwError("the region's PD is not the window's"));
            }
            if !mr.access.contains(Access::MW_BIND) {
                return Err(MwError("the region was not registered with MW_BIND (C10-73)"));
            }
            let writable = Access(Access::REMOTE_WRITE.0 | Access::REMOTE_ATOMIC.0);
            if bind.access.0 & writable.0 != 0 && !mr.access.contains(Access::LOCAL_WRITE) {
                return Err(MwError("a writable window needs a region with LOCAL_WRITE (C10-74)"));
            }
            let inside = bind.addr >= mr.iova
                && bind.addr.checked_add(bind.length).is_some_and(|end| end <= mr.iova + mr.length);
            if !inside {
                return Err(MwError("the window leaves the region (C10-75)"));
            }
        }
        let mw_type = mw.mw_type;
        let old = self.mws.get_mut(&id.0).and_then(|m| m.bound.take());
        if let Some(old) = old {
            self.mrs[old.mr].windows -= 1;
        }
        if let Some(index) = mr_index {
            self.mrs[index].windows += 1;
        }
        let mw = self.mws.get_mut(&id.0).expect("looked up above");
        mw.rkey = (mw.rkey & !0xff) | (new_rkey & 0xff);
        mw.bound = mr_index.map(|mr| Bound {
            mr,
            addr: bind.addr,
            length: bind.length,
            access: bind.access,
            qp: (mw_type == MwType::Type2).then_some(qpn),
        });
        Ok(())
    }

    /// Invalidates what `rkey` names, for a LOCAL_INV of QP `qpn` (in `pd`) or, `remote`,
    /// the IETH of a SEND_WITH_INV it received. Only a bound type 2 window of `pd` can be
    /// invalidated, and remotely only through the QP it is bound to. Regions cannot: rxe
    /// invalidates only fast-registration MRs, which user space has none of.
    pub(crate) fn invalidate(&mut self, pd: PdId, qpn: Qpn, rkey: u32, remote: bool) -> Result<(), MwError> {
        if self.rkeys.contains_key(&rkey) || self.lkeys.contains_key(&rkey) {
            return Err(MwError("a registered region cannot be invalidated"));
        }
        let mw =
            self.mws.get_mut(&(rkey >> 8)).filter(|m| m.rkey == rkey).ok_or(MwError("no window has that R_Key"))?;
        if mw.mw_type == MwType::Type1 {
            return Err(MwError("a type 1 window cannot be invalidated (o10-37.2.26)"));
        }
        if mw.pd != pd {
            return Err(MwError("the window is of another PD"));
        }
        let Some(b) = mw.bound else { return Err(MwError("the window is not bound")) };
        if remote && b.qp != Some(qpn) {
            return Err(MwError("the window is bound to another QP"));
        }
        mw.bound = None;
        self.mrs[b.mr].windows -= 1;
        Ok(())
    }

    /// Unbinds every window bound to the region in slot `mr` (type 2 ones become free).
    fn unbind_windows_of_mr(&mut self, mr: usize) {
        for mw in self.mws.values_mut() {
            if mw.bound.is_some_and(|b| b.mr == mr) {
                mw.bound = None;
            }
        }
        self.mrs[mr].windows = 0;
    }

    fn check_mr(&self, index: usize, pd: PdId, addr: u64, len: u64, need: Access) -> Result<u64, KeyError> {
        let mr = &self.mrs[index];
        if mr.pd != pd {
            return Err(KeyError::BadKey);
        }
        let end = addr.checked_add(len).ok_or(KeyError::Bounds)?;
        if addr < mr.iova || end > mr.iova + mr.length {
            return Err(KeyError::Bounds);
        }
        if !mr.access.contains(need) {
            return Err(KeyError::Access);
        }
        Ok(mr.addr + (addr - mr.iova))
    }

    /// Keeps `now` as the engine's clock, if it is the latest it was given.
    pub(crate) fn tick(&mut self, now: Instant) {
        self.clock = Some(self.clock.map_or(now, |c| c.max(now)));
    }

    /// Adds a completion to `cq`, stamped with the engine's clock, raising the completion
    /// event if the CQ is armed for it.
    pub(crate) fn push_cqe(&mut self, cq: CqId, mut wc: Wc) {
        wc.completed_at = self.clock;
        let Some(c) = self.cqs.get_mut(cq.0 as usize) else { return };
        if c.overflowed {
            return;
        }
        if c.entries.len() >= c.capacity as usize {
            // IBA 11.4.2.1: a CQ overrun is an affiliated asynchronous error.
            c.overflowed = true;
            self.events.push_back(Event::Async(AsyncEvent::CqError(cq)));
            return;
        }
        let wakes = match c.notify {
            Some(Notify::Next) => true,
            Some(Notify::Solicited) => wc.solicited || wc.status != WcStatus::Success,
            None => false,
        };
        c.entries.push_back(wc);
        if wakes {
            c.notify = None;
            self.events.push_back(Event::Completion(cq));
        }
    }

    /// Registers `qp`'s current deadline in the timer set.
    ///
    /// The local ACK timer moves later with almost every ACK. Like rxe, which "kicks it down
    /// the road", an earlier registration is kept rather than replaced: when it fires,
    /// [`Engine::handle_timeout`] finds nothing due and registers the QP's true deadline.
    /// One spurious wake-up per timeout period costs far less than two tree operations per
    /// ACK. Each QP has at most one entry in the set.
    pub(crate) fn update_timer(&mut self, qp: &mut Qp) {
        let deadline = qp.deadline();
        match (qp.timer, deadline) {
            (Some(registered), Some(new)) if new >= registered => {}
            (Some(_), None) => {}
            (old, new) => {
                if let Some(old) = old {
                    self.timers.remove(&(old, qp.qpn.value()));
                }
                if let Some(new) = new {
                    self.timers.insert((new, qp.qpn.value()));
                }
                qp.timer = new;
            }
        }
    }

    /// Counts the packets `qp` has sent and not yet seen acknowledged in its peer's window
    /// ([`crate::window`]): an RC QP that sends, none otherwise.
    pub(crate) fn count_window(&mut self, qp: &mut Qp) {
        let sending = qp.qp_type.is_reliable() && matches!(qp.state, QpState::Rts | QpState::Sqd);
        let outstanding = if sending { qp.comp.psn.distance_to(qp.req.psn).max(0).unsigned_abs() } else { 0 };
        if !sending {
            self.windows.release(&mut qp.window);
        }
        let peer = qp.peer_ip();
        self.windows.recount(&mut qp.window, peer, outstanding);
    }

    /// Puts `qp` in the transmit round-robin.
    pub(crate) fn schedule(&mut self, qp: &mut Qp) {
        if !qp.in_ready {
            qp.in_ready = true;
            self.ready.push_back(qp.qpn);
        }
    }

    /// Puts `qp` at the head of the transmit round-robin: it sends next.
    pub(crate) fn schedule_first(&mut self, qp: &mut Qp) {
        if !qp.in_ready {
            qp.in_ready = true;
            self.ready.push_front(qp.qpn);
        }
    }

    /// A receive WQE for `qp`: from its SRQ or its own queue.
    pub(crate) fn take_recv(&mut self, qp: &mut Qp) -> Option<(RecvWqe, bool)> {
        if let Some(srq_id) = qp.srq {
            let srq = self.srqs.get_mut(srq_id.0 as usize)?;
            if srq.ring.is_empty() {
                return None;
            }
            let wqe = take_head(&mut srq.ring, &mut self.sge_pool);
            if srq.limit > 0 && srq.ring.len() < srq.limit {
                // IBA 10.2.9.2: the limit event fires once, then the limit disarms.
                srq.limit = 0;
                self.events.push_back(Event::Async(AsyncEvent::SrqLimitReached(srq_id)));
            }
            return Some((wqe, true));
        }
        if qp.rq.is_empty() {
            return None;
        }
        Some((take_head(&mut qp.rq, &mut self.sge_pool), false))
    }

    /// Keeps the gather list of a finished receive WQE for reuse (bounded).
    pub(crate) fn recycle(&mut self, mut wqe: RecvWqe) {
        if self.sge_pool.len() < 4096 {
            wqe.sges.clear();
            self.sge_pool.push(wqe.sges);
        }
    }

    /// Returns a receive WQE taken for a message that was then dropped: to the head of the
    /// QP's queue, or, if it came from an SRQ (which cannot take it back), completed in
    /// error.
    pub(crate) fn give_back_recv(&mut self, qp: &mut Qp, wqe: RecvWqe, from_srq: bool) {
        if from_srq {
            let wc = crate::completer::error_wc(qp.qpn, wqe.wr_id, WcOpcode::Recv, WcStatus::LocLenErr);
            self.push_cqe(qp.recv_cq, wc);
        } else {
            qp.rq.unpop(wqe);
        }
    }

    /// The envelope from a local GID index to `dgid`, with the RoCEv2 UDP source port.
    pub(crate) fn envelope_for(&self, av: &AddressVector, src_port: u16) -> Option<Envelope> {
        let src = *self.config.addresses.get(usize::from(av.sgid_index))?;
        Some(
            Envelope::rocev2(src, self.config.udp_source_port.unwrap_or(src_port), av.dgid.to_ip())?
                .with_dst_port(self.config.udp_port),
        )
    }

    /// The envelope of an answer to a packet that came in `received`: from the address it
    /// was sent to, to the one it came from.
    pub(crate) fn reply_envelope(&self, received: &Envelope) -> Option<Envelope> {
        let port = self.config.udp_source_port.unwrap_or(0xc000);
        Some(Envelope::rocev2(received.dst_ip(), port, received.src_ip())?.with_dst_port(self.config.udp_port))
    }

    pub(crate) fn is_local(&self, ip: IpAddr) -> bool {
        self.config.addresses.contains(&ip)
    }
}

/// Takes the receive WQE at the head of `ring`, leaving a pooled gather list in its slot so
/// that the next post into it does not allocate.
fn take_head(ring: &mut Ring<RecvWqe>, pool: &mut Vec<Vec<Sge>>) -> RecvWqe {
    let spare = RecvWqe { sges: pool.pop().unwrap_or_default(), ..RecvWqe::default() };
    let wqe = std::mem::replace(ring.get_mut(ring.head()), spare);
    ring.pop();
    wqe
}

/// The UDP source port Linux derives for a flow (`include/rdma/ib_verbs.h:
/// rdma_get_udp_sport`): a flow label, or a hash of the two QPNs when it is 0, folded into
/// 0xC000..=0xFFFF.
pub fn udp_source_port(flow_label: u32, local_qpn: u32, remote_qpn: u32) -> u16 {
    let fl = if flow_label == 0 {
        let mut v = u64::from(local_qpn) * u64::from(remote_qpn);
        v ^= v >> 20;
        v ^= v >> 40;
        (v & 0xf_ffff) as u32
    } else {
        flow_label & 0xf_ffff
    };
    (((fl & 0x3fff) ^ ((fl & 0xf_c000) >> 14)) | 0xc000) as u16
}

fn invalid(msg: impl Into<String>) -> VerbsError {
    VerbsError::Invalid(msg.into())
}

impl Engine {
    /// A device with `config`.
    pub fn new(config: DeviceConfig) -> Self {
        let rng = ChaCha12Rng::seed_from_u64(config.seed);
        let next_qpn = config.qpn_base;
        let windows = crate::window::PeerWindows::new(config.peer_window);
        Self {
            shared: Shared {
                config,
                rng,
                pds: Slab::new(),
                mrs: Slab::new(),
                lkeys: BTreeMap::new(),
                rkeys: BTreeMap::new(),
                mws: BTreeMap::new(),
                cqs: Slab::new(),
                srqs: Slab::new(),
                xrcds: Slab::new(),
                ahs: Slab::new(),
                ready: VecDeque::with_capacity(1024),
                timers: BTreeSet::new(),
                events: VecDeque::new(),
                counters: Counters::default(),
                identifications: Identifications::default(),
                sge_pool: Vec::new(),
                cnps: VecDeque::new(),
                windows,
                clock: None,
                mcast: BTreeMap::new(),
                grant_epoch: 0,
            },
            qps: BTreeMap::new(),
            next_qpn,
        }
    }

    /// The device's configuration.
    pub fn config(&self) -> &DeviceConfig {
        &self.shared.config
    }

    /// The packet and error counters.
    pub fn counters(&self) -> Counters {
        self.shared.counters
    }

    /// The GID at `index`.
    pub fn gid(&self, index: u8) -> Option<Gid> {
        self.shared.config.addresses.get(usize::from(index)).map(|&ip| Gid::from_ip(ip))
    }

    // ---- protection domains and memory regions -------------------------------------------

    /// `ibv_alloc_pd`.
    pub fn alloc_pd(&mut self) -> PdId {
        PdId(self.shared.pds.insert(0) as u32)
    }

    /// `ibv_dealloc_pd`. Fails while MRs, MWs, QPs, SRQs or AHs use it.
    pub fn dealloc_pd(&mut self, pd: PdId) -> Result<(), VerbsError> {
        let users = self.shared.pds.get(pd.0 as usize).copied().ok_or(VerbsError::NotFound { kind: "PD", id: pd.0 })?;
        if users > 0 {
            return Err(VerbsError::Busy(format!("PD {} still has {users} MRs, MWs, QPs, SRQs or AHs", pd.0)));
        }
        self.shared.pds.remove(pd.0 as usize);
        Ok(())
    }

    fn pd_use(&mut self, pd: PdId, delta: i32) -> Result<(), VerbsError> {
        let users = self.shared.pds.get_mut(pd.0 as usize).ok_or(VerbsError::NotFound { kind: "PD", id: pd.0 })?;
        *users = users.saturating_add_signed(delta);
        Ok(())
    }

    /// `ibv_reg_mr`: registers `[addr, addr + length)` with `access`. The R_Key is random.
    ///
    /// IBA 10.6.3.1: remote write or atomic access needs local write too.
    pub fn reg_mr(&mut self, pd: PdId, addr: u64, length: u64, access: Access) -> Result<MrKeys, VerbsError> {
        self.reg_mr_iova(pd, addr, length, addr, access)
    }

    /// `ibv_reg_mr_iova`: registers the `length` bytes at `addr` in memory, which work
    /// requests and peers name `[iova, iova + length)` (0 for a zero-based region,
    /// `IBV_ACCESS_ZERO_BASED`); otherwise as [`reg_mr`](Self::reg_mr).
    pub fn reg_mr_iova(
        &mut self,
        pd: PdId,
        addr: u64,
        length: u64,
        iova: u64,
        access: Access,
    ) -> Result<MrKeys, VerbsError> {
        if iova.checked_add(length).is_none() {
            return Err(invalid(format!("the region's iova {iova:#x} + {length} wraps around the address space")));
        }
        if (access.contains(Access::REMOTE_WRITE) || access.contains(Access::REMOTE_ATOMIC))
            && !access.contains(Access::LOCAL_WRITE)
        {
            return Err(invalid("REMOTE_WRITE and REMOTE_ATOMIC need LOCAL_WRITE too (IBA 10.6.3.1)"));
        }
        if addr.checked_add(length).is_none() {
            return Err(invalid(format!("the region {addr:#x} + {length} wraps around the address space")));
        }
        if self.shared.mrs.len() as u32 >= self.shared.config.max_mr {
            return Err(VerbsError::NoResources(format!(
                "the device's max_mr ({}) MRs exist",
                self.shared.config.max_mr
            )));
        }
        self.pd_use(pd, 1)?;
        let lkey = self.fresh_key(true);
        let rkey = self.fresh_key(false);
        let keys = MrKeys { lkey: LKey(lkey), rkey: RKey(rkey) };
        let index = self.shared.mrs.insert(Mr { pd, addr, iova, length, access, keys, windows: 0 });
        self.shared.lkeys.insert(lkey, index);
        self.shared.rkeys.insert(rkey, index);
        Ok(keys)
    }

    /// A random key not in use (and never 0, which some programs treat as "none"), whose
    /// upper 24 bits are no memory window's.
    fn fresh_key(&mut self, local: bool) -> u32 {
        loop {
            let k = self.shared.rng.next_u32();
            let taken = if local { self.shared.lkeys.contains_key(&k) } else { self.shared.rkeys.contains_key(&k) };
            if k != 0 && !taken && !self.shared.mws.contains_key(&(k >> 8)) {
                return k;
            }
        }
    }

    /// `ibv_rereg_mr`: moves the region `lkey` names to another PD, another range or other
    /// access rights (each `None` keeps what it had); its keys stay. Checked as `reg_mr`
    /// checks a new region; nothing changes on an error. Every packet and WR is checked
    /// against the region as it is when it arrives, so what was in flight meets the new
    /// rights. Refused while memory windows are bound to the region: each was checked
    /// against it as it is (its range, MW_BIND, LOCAL_WRITE) when it was bound.
    pub fn rereg_mr(
        &mut self,
        lkey: LKey,
        pd: Option<PdId>,
        range: Option<(u64, u64)>,
        access: Option<Access>,
    ) -> Result<(), VerbsError> {
        let index = *self.shared.lkeys.get(&lkey.0).ok_or(VerbsError::NotFound { kind: "MR", id: lkey.0 })?;
        let mr = &self.shared.mrs[index];
        if mr.windows > 0 {
            return Err(invalid(format!(
                "{} memory windows are bound to the region; invalidate them first",
                mr.windows
            )));
        }
        let (old_pd, (addr, length), access) =
            (mr.pd, range.unwrap_or((mr.addr, mr.length)), access.unwrap_or(mr.access));
        if (access.contains(Access::REMOTE_WRITE) || access.contains(Access::REMOTE_ATOMIC))
            && !access.contains(Access::LOCAL_WRITE)
        {
            return Err(invalid("REMOTE_WRITE and REMOTE_ATOMIC need LOCAL_WRITE too (IBA 10.6.3.1)"));
        }
        if addr.checked_add(length).is_none() {
            return Err(invalid(format!("the region {addr:#x} + {length} wraps around the address space")));
        }
        let new_pd = pd.unwrap_or(old_pd);
        if new_pd != old_pd {
            self.pd_use(new_pd, 1)?;
            self.pd_use(old_pd, -1)?;
        }
        self.shared.void_grants();
        let mr = &mut self.shared.mrs[index];
        let iova = if range.is_some() { addr } else { mr.iova };
        (mr.pd, mr.addr, mr.iova, mr.length, mr.access) = (new_pd, addr, iova, length, access);
        Ok(())
    }

    /// `ibv_dereg_mr`. Afterwards no access through its keys succeeds: the engine checks
    /// keys on every packet, so nothing in flight can reach the memory once this returns.
    /// Refused (`EINVAL`) while memory windows are bound to the region, as rxe does (IBA
    /// 10.6.7.2.6); [`dereg_mr_unbinding`](Self::dereg_mr_unbinding) unbinds them instead.
    pub fn dereg_mr(&mut self, lkey: LKey) -> Result<(), VerbsError> {
        let index = *self.shared.lkeys.get(&lkey.0).ok_or(VerbsError::NotFound { kind: "MR", id: lkey.0 })?;
        let windows = self.shared.mrs[index].windows;
        if windows > 0 {
            return Err(invalid(format!(
                "{windows} memory windows are bound to the region (IBA 10.6.7.2.6); invalidate or unbind them first"
            )));
        }
        self.dereg_mr_unbinding(lkey)
    }

    /// `ibv_dereg_mr` that first unbinds every memory window bound to the region (type 1
    /// windows are left bound with length 0, type 2 ones free), so that it never fails for
    /// them: for an owner of the memory that frees it next.
    pub fn dereg_mr_unbinding(&mut self, lkey: LKey) -> Result<(), VerbsError> {
        let index = self.shared.lkeys.remove(&lkey.0).ok_or(VerbsError::NotFound { kind: "MR", id: lkey.0 })?;
        self.shared.void_grants();
        if self.shared.mrs[index].windows > 0 {
            self.shared.unbind_windows_of_mr(index);
        }
        let mr = self.shared.mrs.remove(index);
        self.shared.rkeys.remove(&mr.keys.rkey.0);
        self.pd_use(mr.pd, -1)
    }

    // ---- memory windows ----------------------------------------------------------------

    /// `ibv_alloc_mw`: a window of `mw_type` in `pd`, unbound (type 2: free). Returns its
    /// handle and its R_Key, whose low 8 bits are random until a bind chooses them.
    pub fn alloc_mw(&mut self, pd: PdId, mw_type: MwType) -> Result<(MwId, RKey), VerbsError> {
        if self.shared.mws.len() as u32 >= self.shared.config.max_mw {
            return Err(VerbsError::NoResources(format!(
                "the device's max_mw ({}) windows exist",
                self.shared.config.max_mw
            )));
        }
        self.pd_use(pd, 1)?;
        let index = loop {
            let i = self.shared.rng.next_u32() & 0xff_ffff;
            let (lo, hi) = (i << 8, i << 8 | 0xff);
            let taken = self.shared.mws.contains_key(&i)
                || self.shared.lkeys.range(lo..=hi).next().is_some()
                || self.shared.rkeys.range(lo..=hi).next().is_some();
            if i != 0 && !taken {
                break i;
            }
        };
        let rkey = index << 8 | (self.shared.rng.next_u32() & 0xff);
        self.shared.mws.insert(index, Mw { pd, mw_type, rkey, bound: None });
        Ok((MwId(index), RKey(rkey)))
    }

    /// `ibv_dealloc_mw`: the window is gone, and with it any access through it; a BIND_MW
    /// still queued for it fails.
    pub fn dealloc_mw(&mut self, mw: MwId) -> Result<(), VerbsError> {
        let w = self.shared.mws.remove(&mw.0).ok_or(VerbsError::NotFound { kind: "MW", id: mw.0 })?;
        if let Some(b) = w.bound {
            self.shared.mrs[b.mr].windows -= 1;
        }
        self.pd_use(w.pd, -1)
    }

    /// The window's type, R_Key and binding now.
    pub fn query_mw(&self, mw: MwId) -> Option<MwInfo> {
        let w = self.shared.mws.get(&mw.0)?;
        Some(MwInfo {
            pd: w.pd,
            mw_type: w.mw_type,
            rkey: RKey(w.rkey),
            binding: w.bound.map(|b| MwBinding {
                mr: self.shared.mrs[b.mr].keys.lkey,
                addr: b.addr,
                length: b.length,
                access: b.access,
                qp: b.qp,
            }),
        })
    }

    // ---- completion queues ---------------------------------------------------------------

    /// `ibv_create_cq` with room for `cqe` completions.
    pub fn create_cq(&mut self, cqe: u32) -> Result<CqId, VerbsError> {
        if cqe == 0 || cqe > self.shared.config.max_cqe {
            return Err(invalid(format!("cqe = {cqe}; it must be 1..={}", self.shared.config.max_cqe)));
        }
        let cq = Cq {
            capacity: cqe,
            entries: VecDeque::with_capacity(cqe.min(4096) as usize),
            notify: None,
            overflowed: false,
        };
        Ok(CqId(self.shared.cqs.insert(cq) as u32))
    }

    /// `ibv_resize_cq`: CQ `cq` holds up to `cqe` completions from now on (1 to the
    /// device's `max_cqe`). The completions it holds stay; fewer room than they take is
    /// EINVAL, as rdma-core's providers answer. Returns the new size.
    pub fn resize_cq(&mut self, cq: CqId, cqe: u32) -> Result<u32, VerbsError> {
        let max = self.shared.config.max_cqe;
        let c = self.shared.cqs.get_mut(cq.0 as usize).ok_or(VerbsError::NotFound { kind: "CQ", id: cq.0 })?;
        if cqe == 0 || cqe > max {
            return Err(invalid(format!("resize_cq: cqe = {cqe}; it must be 1..={max}")));
        }
        if (cqe as usize) < c.entries.len() {
            return Err(invalid(format!(
                "resize_cq: cqe = {cqe} is fewer than the {} completions the CQ holds; poll them first",
                c.entries.len()
            )));
        }
        c.capacity = cqe;
        Ok(cqe)
    }

    /// `ibv_destroy_cq`. Fails while a QP or SRQ uses it.
    pub fn destroy_cq(&mut self, cq: CqId) -> Result<(), VerbsError> {
        if !self.shared.cqs.contains(cq.0 as usize) {
            return Err(VerbsError::NotFound { kind: "CQ", id: cq.0 });
        }
        if let Some(qp) =
            self.qps.values().find(|q| q.qp_type != QpType::XrcTgt && (q.send_cq == cq || q.recv_cq == cq))
        {
            return Err(VerbsError::Busy(format!("CQ {} is used by QP {}", cq.0, qp.qpn)));
        }
        if let Some((i, _)) = self.shared.srqs.iter().find(|(_, s)| s.xrc.is_some_and(|(_, c)| c == cq)) {
            return Err(VerbsError::Busy(format!("CQ {} is used by XRC SRQ {i}", cq.0)));
        }
        self.shared.cqs.remove(cq.0 as usize);
        Ok(())
    }

    /// Whether `cq` holds a completion (what [`poll_cq`](Self::poll_cq) would return).
    #[must_use]
    pub fn cq_ready(&self, cq: CqId) -> bool {
        self.shared.cqs.get(cq.0 as usize).is_some_and(|c| !c.entries.is_empty())
    }

    /// `ibv_poll_cq` for one completion.
    #[must_use]
    pub fn poll_cq(&mut self, cq: CqId) -> Option<Wc> {
        self.shared.cqs.get_mut(cq.0 as usize)?.entries.pop_front()
    }

    /// `ibv_req_notify_cq`: the next completion (or, with `solicited_only`, the next solicited
    /// or error completion) raises [`Event::Completion`].
    pub fn req_notify_cq(&mut self, cq: CqId, solicited_only: bool) -> Result<(), VerbsError> {
        let c = self.shared.cqs.get_mut(cq.0 as usize).ok_or(VerbsError::NotFound { kind: "CQ", id: cq.0 })?;
        c.notify = Some(if solicited_only { Notify::Solicited } else { Notify::Next });
        Ok(())
    }

    /// The next completion-channel or asynchronous event.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<Event> {
        self.shared.events.pop_front()
    }

    // ---- address handles and shared receive queues --------------------------------------

    /// `ibv_create_ah`.
    pub fn create_ah(&mut self, pd: PdId, av: AddressVector) -> Result<AhId, VerbsError> {
        if self.shared.envelope_for(&av, 0).is_none() {
            return Err(invalid(format!(
                "no route for the AV: sgid_index {} must name a local address of the same IP version as {}",
                av.sgid_index, av.dgid
            )));
        }
        self.pd_use(pd, 1)?;
        Ok(AhId(self.shared.ahs.insert(Ah { pd, av }) as u32))
    }

    /// `ibv_destroy_ah`.
    pub fn destroy_ah(&mut self, ah: AhId) -> Result<(), VerbsError> {
        let a = self.shared.ahs.try_remove(ah.0 as usize).ok_or(VerbsError::NotFound { kind: "AH", id: ah.0 })?;
        self.pd_use(a.pd, -1)
    }

    /// `ibv_create_srq` with `max_wr` receives of up to `max_sge` SGEs each.
    pub fn create_srq(&mut self, pd: PdId, max_wr: u32, max_sge: u32) -> Result<SrqId, VerbsError> {
        if max_wr == 0 || max_wr > self.shared.config.max_qp_wr || max_sge > self.shared.config.max_sge {
            return Err(invalid(format!(
                "max_wr {max_wr} / max_sge {max_sge}: limits are 1..={} and {}",
                self.shared.config.max_qp_wr, self.shared.config.max_sge
            )));
        }
        self.pd_use(pd, 1)?;
        let ring = Ring::new(max_wr, || RecvWqe { sges: Vec::with_capacity(max_sge as usize), ..RecvWqe::default() });
        Ok(SrqId(self.shared.srqs.insert(Srq { pd, ring, max_sge, limit: 0, xrc: None }) as u32))
    }

    /// `ibv_create_srq_ex` with `IBV_SRQT_XRC`: an SRQ of XRC domain `xrcd` whose receives
    /// complete to `cq`. The XRC TGT QPs of the domain take a message's receive from it
    /// when the message's XRCETH names its number (the [`SrqId`]'s value), and check the
    /// message's memory accesses against its PD `pd`.
    pub fn create_xrc_srq(
        &mut self,
        pd: PdId,
        xrcd: XrcdId,
        cq: CqId,
        max_wr: u32,
        max_sge: u32,
    ) -> Result<SrqId, VerbsError> {
        if !self.shared.xrcds.contains(xrcd.0 as usize) {
            return Err(VerbsError::NotFound { kind: "XRC domain", id: xrcd.0 });
        }
        if !self.shared.cqs.contains(cq.0 as usize) {
            return Err(VerbsError::NotFound { kind: "CQ", id: cq.0 });
        }
        let srq = self.create_srq(pd, max_wr, max_sge)?;
        self.shared.srqs[srq.0 as usize].xrc = Some((xrcd, cq));
        Ok(srq)
    }

    /// The XRC domain and CQ of an XRC SRQ; `None` for another SRQ or none.
    pub fn xrc_srq(&self, srq: SrqId) -> Option<(XrcdId, CqId)> {
        self.shared.srqs.get(srq.0 as usize)?.xrc
    }

    /// `ibv_open_xrcd`: a new XRC domain.
    pub fn alloc_xrcd(&mut self) -> Result<XrcdId, VerbsError> {
        if self.shared.xrcds.len() as u32 >= self.shared.config.max_xrcds {
            return Err(VerbsError::NoResources(format!(
                "the device's max_xrcds ({}) domains are open",
                self.shared.config.max_xrcds
            )));
        }
        Ok(XrcdId(self.shared.xrcds.insert(()) as u32))
    }

    /// How many XRC SRQs and XRC TGT QPs belong to domain `xrcd`.
    pub fn xrcd_users(&self, xrcd: XrcdId) -> usize {
        let srqs = self.shared.srqs.iter().filter(|(_, s)| s.xrc.is_some_and(|(d, _)| d == xrcd)).count();
        srqs + self.qps.values().filter(|q| q.xrcd == Some(xrcd)).count()
    }

    /// `ibv_close_xrcd`. Fails (EBUSY) while an XRC SRQ or an XRC TGT QP belongs to it.
    pub fn dealloc_xrcd(&mut self, xrcd: XrcdId) -> Result<(), VerbsError> {
        if !self.shared.xrcds.contains(xrcd.0 as usize) {
            return Err(VerbsError::NotFound { kind: "XRC domain", id: xrcd.0 });
        }
        if let Some((i, _)) = self.shared.srqs.iter().find(|(_, s)| s.xrc.is_some_and(|(d, _)| d == xrcd)) {
            return Err(VerbsError::Busy(format!("XRC domain {} has SRQ {i}; destroy it first", xrcd.0)));
        }
        if let Some(qp) = self.qps.values().find(|q| q.xrcd == Some(xrcd)) {
            return Err(VerbsError::Busy(format!("XRC domain {} has XRC TGT QP {}; destroy it first", xrcd.0, qp.qpn)));
        }
        self.shared.xrcds.remove(xrcd.0 as usize);
        Ok(())
    }

    /// `ibv_create_qp_ex` with `IBV_QPT_XRC_RECV`: an XRC TGT QP of domain `xrcd`. It has no
    /// PD, CQs or queues of its own: each request names the XRC SRQ of the domain whose
    /// receive, PD and CQ serve it. It starts in RESET.
    pub fn create_xrc_tgt_qp(&mut self, xrcd: XrcdId) -> Result<Qpn, VerbsError> {
        if !self.shared.xrcds.contains(xrcd.0 as usize) {
            return Err(VerbsError::NotFound { kind: "XRC domain", id: xrcd.0 });
        }
        self.room_for_a_qp()?;
        // Until a request names an SRQ, its PD and CQs are none that exist: nothing can
        // reach memory or complete through it.
        let init = QpInitAttr {
            pd: PdId(u32::MAX),
            send_cq: CqId(u32::MAX),
            recv_cq: CqId(u32::MAX),
            srq: None,
            qp_type: QpType::XrcTgt,
            cap: QpCap { max_send_wr: 0, max_recv_wr: 0, max_send_sge: 0, max_recv_sge: 0, max_inline_data: 0 },
            sq_sig_all: false,
        };
        let qpn = self.allocate_qpn();
        let mut qp = Qp::new(qpn, init.pd, &init);
        qp.xrcd = Some(xrcd);
        self.qps.insert(qpn.value(), qp);
        Ok(qpn)
    }

    /// `ibv_modify_srq` with `IBV_SRQ_LIMIT`: arms the limit event for when fewer than
    /// `limit` receives remain.
    pub fn arm_srq_limit(&mut self, srq: SrqId, limit: u32) -> Result<(), VerbsError> {
        let s = self.shared.srqs.get_mut(srq.0 as usize).ok_or(VerbsError::NotFound { kind: "SRQ", id: srq.0 })?;
        if limit > s.ring.capacity() {
            return Err(invalid(format!("srq_limit {limit} exceeds the SRQ's depth {}", s.ring.capacity())));
        }
        s.limit = limit;
        Ok(())
    }

    /// `ibv_destroy_srq`. Fails while a QP uses it (an XRC TGT QP in the middle of a
    /// message into it).
    pub fn destroy_srq(&mut self, srq: SrqId) -> Result<(), VerbsError> {
        if let Some(qp) =
            self.qps.values().find(|q| q.srq == Some(srq) && (q.qp_type != QpType::XrcTgt || q.resp.in_message()))
        {
            return Err(VerbsError::Busy(format!("SRQ {} is used by QP {}", srq.0, qp.qpn)));
        }
        let s = self.shared.srqs.try_remove(srq.0 as usize).ok_or(VerbsError::NotFound { kind: "SRQ", id: srq.0 })?;
        self.pd_use(s.pd, -1)
    }

    /// `ibv_post_srq_recv`.
    pub fn post_srq_recv(&mut self, srq: SrqId, wrs: &[RecvWr<'_>]) -> Result<(), PostError> {
        let s = self
            .shared
            .srqs
            .get_mut(srq.0 as usize)
            .ok_or_else(|| PostError { index: 0, kind: PostErrorKind::Invalid(format!("no such SRQ {}", srq.0)) })?;
        for (index, wr) in wrs.iter().enumerate() {
            if s.ring.is_full() {
                return Err(PostError { index, kind: PostErrorKind::QueueFull { depth: s.ring.capacity() } });
            }
            if wr.sg_list.len() > s.max_sge as usize {
                return Err(PostError {
                    index,
                    kind: PostErrorKind::Invalid(format!(
                        "{} SGEs; the SRQ was created with max_sge = {}",
                        wr.sg_list.len(),
                        s.max_sge
                    )),
                });
            }
            fill_recv(s.ring.next_free(), wr);
            s.ring.commit();
        }
        Ok(())
    }

    // ---- queue pairs ---------------------------------------------------------------------

    /// `ibv_create_qp`. The QP starts in RESET.
    pub fn create_qp(&mut self, init: &QpInitAttr) -> Result<Qpn, VerbsError> {
        let c = &self.shared.config;
        let cap = init.cap;
        if cap.max_send_wr == 0 || cap.max_send_wr > c.max_qp_wr || cap.max_recv_wr > c.max_qp_wr {
            return Err(invalid(format!(
                "max_send_wr {} / max_recv_wr {}: limits are 1..={} and {}",
                cap.max_send_wr, cap.max_recv_wr, c.max_qp_wr, c.max_qp_wr
            )));
        }
        if cap.max_send_sge > c.max_sge || cap.max_recv_sge > c.max_sge {
            return Err(invalid(format!("max_send_sge / max_recv_sge must be at most {}", c.max_sge)));
        }
        if cap.max_inline_data > c.max_inline_data {
            return Err(invalid(format!(
                "max_inline_data {} exceeds the device's {}",
                cap.max_inline_data, c.max_inline_data
            )));
        }
        self.room_for_a_qp()?;
        if init.qp_type == QpType::Gsi {
            return Err(invalid("the GSI QP (QP1) belongs to the connection manager"));
        }
        if init.qp_type == QpType::XrcTgt {
            return Err(invalid("an XRC TGT QP belongs to an XRC domain: create it with create_xrc_tgt_qp"));
        }
        if init.qp_type == QpType::XrcIni && (init.srq.is_some() || cap.max_recv_wr > 0 || cap.max_recv_sge > 0) {
            return Err(invalid("an XRC INI (XRC_SEND) QP receives nothing: no SRQ, max_recv_wr and max_recv_sge 0"));
        }
        for cq in [init.send_cq, init.recv_cq] {
            if !self.shared.cqs.contains(cq.0 as usize) {
                return Err(VerbsError::NotFound { kind: "CQ", id: cq.0 });
            }
        }
        if let Some(srq) = init.srq {
            match self.shared.srqs.get(srq.0 as usize) {
                None => return Err(VerbsError::NotFound { kind: "SRQ", id: srq.0 }),
                // ib_uverbs_create_qp: EINVAL. Its receives are for the requests that name it.
                Some(s) if s.xrc.is_some() => {
                    return Err(invalid(format!(
                        "SRQ {} is an XRC SRQ: only the XRC TGT QPs of its domain take its receives, for the \
                         requests that name it",
                        srq.0
                    )));
                }
                Some(_) => {}
            }
        }
        self.pd_use(init.pd, 1)?;
        let qpn = self.allocate_qpn();
        // As rxe (rxe_qp_init_req): a send WQE holds max_send_sge SGEs or that many bytes
        // inline, whichever is more, so a QP asked for no inline data still sends 16 bytes
        // per SGE inline (rdma_xclient sends 16 inline bytes with max_inline_data 0).
        let inline =
            cap.max_inline_data.max(cap.max_send_sge.saturating_mul(16)).min(self.shared.config.max_inline_data);
        let init = &QpInitAttr { cap: QpCap { max_inline_data: inline, ..cap }, ..*init };
        let mut qp = Qp::new(qpn, init.pd, init);
        if qp.qp_type == QpType::Ud {
            qp.attr.path_mtu = self.shared.config.port_mtu;
        }
        self.qps.insert(qpn.value(), qp);
        Ok(qpn)
    }

    /// ENOMEM ([`VerbsError::NoResources`]) when the device's `max_qp` QPs exist.
    fn room_for_a_qp(&self) -> Result<(), VerbsError> {
        let max = self.shared.config.max_qp;
        if self.qps.len() as u32 >= max {
            return Err(VerbsError::NoResources(format!("the device's max_qp ({max}) QPs exist")));
        }
        Ok(())
    }

    fn allocate_qpn(&mut self) -> Qpn {
        loop {
            let n = self.next_qpn;
            let c = &self.shared.config;
            let end = c.qpn_base.saturating_add(c.max_qp).min(Qpn::MAX.value() + 1);
            self.next_qpn = if n + 1 >= end { c.qpn_base } else { n + 1 };
            if !self.qps.contains_key(&n) {
                return Qpn::from_u24_truncating(n);
            }
        }
    }

    /// `ibv_destroy_qp`. Its outstanding WRs are discarded without completions; packets
    /// still addressed to it are dropped. The type 2 windows bound to it become free (rxe
    /// keeps them valid but unreachable; a QP that reused the QPN must not reach them).
    pub fn destroy_qp(&mut self, qpn: Qpn) -> Result<(), VerbsError> {
        let mut qp = self.qps.remove(&qpn.value()).ok_or(VerbsError::NotFound { kind: "QP", id: qpn.value() })?;
        let sh = &mut self.shared;
        sh.void_grants();
        for mw in sh.mws.values_mut() {
            if let Some(b) = mw.bound.filter(|b| b.qp == Some(qpn)) {
                mw.bound = None;
                sh.mrs[b.mr].windows -= 1;
            }
        }
        // Its multicast attachments go with it, as uverbs detaches a QP it destroys.
        self.shared.mcast.retain(|_, qps| {
            qps.retain(|&q| q != qpn);
            !qps.is_empty()
        });
        qp.comp.retransmit_at = None;
        qp.comp.rnr_wait_until = None;
        self.shared.update_timer(&mut qp);
        self.shared.windows.forget(qpn, &mut qp.window);
        self.wake_window_waiters();
        if qp.qp_type == QpType::XrcTgt {
            // Its PD and CQs were its SRQs'; a receive it had taken completes flushed.
            if let crate::qp::InMessage::Send { wqe, .. } = core::mem::take(&mut qp.resp.current) {
                let wc = crate::completer::flush_wc(qp.qpn, wqe.wr_id, WcOpcode::Recv);
                self.shared.push_cqe(qp.recv_cq, wc);
            }
            return Ok(());
        }
        self.pd_use(qp.pd, -1)
    }

    /// `ibv_attach_mcast`: UD QP `qpn` receives, from now on, a copy of every packet to QPN
    /// 0xFFFFFF ([`Qpn::MULTICAST`]) whose destination is group `gid` (an IPv4-mapped
    /// `::ffff:224.0.0.0/4` or an `ff00::/8` GID), if its Q_Key matches, as any UD receive.
    /// Attaching a QP twice to one group is no error (rxe). EINVAL ([`VerbsError::Invalid`])
    /// for a GID that is no multicast group or a QP that is not UD; ENOMEM
    /// ([`VerbsError::NoResources`]) past `max_mcast_grp` groups, `max_mcast_qp_attach` QPs
    /// in the group or `max_total_mcast_qp_attach` attachments in all.
    ///
    /// The engine keeps the table; joining the group on the network (IGMP/MLD, the sockets
    /// that receive it) is the runtime's, which reads [`mcast_groups`](Self::mcast_groups).
    pub fn attach_mcast(&mut self, qpn: Qpn, gid: Gid) -> Result<(), VerbsError> {
        let qp = self.qps.get(&qpn.value()).ok_or(VerbsError::NotFound { kind: "QP", id: qpn.value() })?;
        if !gid.is_multicast() {
            return Err(invalid(format!(
                "attach_mcast: {gid} is not a multicast GID (ff00::/8 or ::ffff:224.0.0.0/4)"
            )));
        }
        if qp.qp_type != QpType::Ud {
            return Err(invalid(format!(
                "attach_mcast: QP {qpn} is {:?}; only UD QPs join multicast groups",
                qp.qp_type
            )));
        }
        let c = &self.shared.config;
        let (max_grp, max_qps, max_total) = (c.max_mcast_grp, c.max_mcast_qp_attach, c.max_total_mcast_qp_attach);
        let total: usize = self.shared.mcast.values().map(Vec::len).sum();
        let groups = self.shared.mcast.len();
        let qps = self.shared.mcast.get(&gid);
        if qps.is_some_and(|q| q.contains(&qpn)) {
            return Ok(());
        }
        if qps.is_none() && groups >= max_grp as usize {
            return Err(VerbsError::NoResources(format!("the device's max_mcast_grp ({max_grp}) groups have QPs")));
        }
        if qps.is_some_and(|q| q.len() >= max_qps as usize) {
            return Err(VerbsError::NoResources(format!(
                "group {gid} has max_mcast_qp_attach ({max_qps}) QPs attached"
            )));
        }
        if total >= max_total as usize {
            return Err(VerbsError::NoResources(format!(
                "the device has max_total_mcast_qp_attach ({max_total}) attachments"
            )));
        }
        self.shared.mcast.entry(gid).or_default().push(qpn);
        Ok(())
    }

    /// `ibv_detach_mcast`: QP `qpn` no longer receives group `gid`'s packets. EINVAL, as
    /// rxe's, when the QP is not attached to it (or the group has no QP).
    pub fn detach_mcast(&mut self, qpn: Qpn, gid: Gid) -> Result<(), VerbsError> {
        if !self.qps.contains_key(&qpn.value()) {
            return Err(VerbsError::NotFound { kind: "QP", id: qpn.value() });
        }
        let not_attached = || invalid(format!("detach_mcast: QP {qpn} is not attached to {gid}"));
        let qps = self.shared.mcast.get_mut(&gid).ok_or_else(not_attached)?;
        let at = qps.iter().position(|&q| q == qpn).ok_or_else(not_attached)?;
        qps.remove(at);
        if qps.is_empty() {
            self.shared.mcast.remove(&gid);
        }
        Ok(())
    }

    /// The multicast groups at least one QP is attached to, in GID order: those the
    /// runtime must receive.
    pub fn mcast_groups(&self) -> impl Iterator<Item = Gid> + '_ {
        self.shared.mcast.keys().copied()
    }

    /// The QPs attached to group `gid`, in the order they attached.
    pub fn mcast_members(&self, gid: Gid) -> &[Qpn] {
        self.shared.mcast.get(&gid).map_or(&[], Vec::as_slice)
    }

    /// Schedules the QPs that waited for room in a peer's window and may now have it.
    pub(crate) fn wake_window_waiters(&mut self) {
        while let Some((qpn, peer, burst)) = self.shared.windows.pop_woken() {
            match self.qps.get_mut(&qpn.value()) {
                Some(qp) => {
                    self.shared.windows.woken(&mut qp.window, peer, burst);
                    self.shared.schedule(qp);
                }
                None => self.shared.windows.unhold(peer, burst),
            }
        }
    }

    /// `ibv_advise_mr`'s check of one SGE: the region `lkey` names is one of `pd`'s,
    /// registered on demand ([`Access::ON_DEMAND`]), and holds `[addr, addr + len)`.
    pub fn check_on_demand(&self, pd: PdId, lkey: LKey, addr: u64, len: u64) -> Result<(), VerbsError> {
        match self.shared.check_lkey(pd, lkey, addr, len, Access::ON_DEMAND) {
            Ok(_) => Ok(()),
            Err(KeyError::BadKey) => Err(invalid(format!("lkey {:#x} names no memory region of this PD", lkey.0))),
            Err(KeyError::Access) => Err(invalid(format!(
                "lkey {:#x} names a region registered without IBV_ACCESS_ON_DEMAND; only those take advice",
                lkey.0
            ))),
            Err(KeyError::Bounds) => {
                let mr = &self.shared.mrs[self.shared.lkeys[&lkey.0]];
                Err(invalid(format!(
                    "{len} bytes at {addr:#x} leave the region lkey {:#x} names ({} bytes at {:#x})",
                    lkey.0, mr.length, mr.iova
                )))
            }
        }
    }

    /// How many QPs exist.
    pub fn qp_count(&self) -> usize {
        self.qps.len()
    }

    /// The QP's state.
    pub fn qp_state(&self, qpn: Qpn) -> Option<QpState> {
        self.qps.get(&qpn.value()).map(|q| q.state)
    }

    /// `ibv_query_qp`: the QP's current attributes.
    pub fn query_qp(&self, qpn: Qpn) -> Option<(QpAttr, QpCap)> {
        self.qps.get(&qpn.value()).map(|q| (QpAttr { qp_state: q.state, cur_qp_state: q.state, ..q.attr }, q.cap))
    }

    /// `ibv_modify_qp`: checks the transition and the attribute mask against the IBTA table
    /// (naming any missing or unexpected bit), checks each value, then applies them.
    pub fn modify_qp(&mut self, qpn: Qpn, attr: &QpAttr, mask: AttrMask) -> Result<(), VerbsError> {
        let config = &self.shared.config;
        let qp = self.qps.get_mut(&qpn.value()).ok_or(VerbsError::NotFound { kind: "QP", id: qpn.value() })?;
        let next_state = mask.contains(AttrMask::STATE).then_some(attr.qp_state);
        let claimed = mask.contains(AttrMask::CUR_STATE).then_some(attr.cur_qp_state);
        let next = qp_state::check_modify(qp.qp_type, qp.state, next_state, mask, claimed)?;

        // Values, before anything changes.
        if mask.contains(AttrMask::PORT) && attr.port_num != 1 {
            return Err(invalid(format!("port_num {}: the device has one port, 1", attr.port_num)));
        }
        if mask.contains(AttrMask::PKEY_INDEX) && attr.pkey_index != 0 {
            return Err(invalid(format!("pkey_index {}: the P_Key table has one entry, 0 (0xffff)", attr.pkey_index)));
        }
        if mask.contains(AttrMask::TIMEOUT) && attr.timeout > 31 {
            return Err(invalid(format!("timeout {} is a 5-bit exponent (0..=31)", attr.timeout)));
        }
        if mask.contains(AttrMask::RETRY_CNT) && attr.retry_cnt > 7 {
            return Err(invalid(format!("retry_cnt {} is 3 bits (0..=7)", attr.retry_cnt)));
        }
        if mask.contains(AttrMask::RNR_RETRY) && attr.rnr_retry > 7 {
            return Err(invalid(format!("rnr_retry {} is 3 bits (0..=7, 7 = forever)", attr.rnr_retry)));
        }
        if mask.contains(AttrMask::MIN_RNR_TIMER) && attr.min_rnr_timer > 31 {
            return Err(invalid(format!("min_rnr_timer {} is a 5-bit code (0..=31)", attr.min_rnr_timer)));
        }
        for (bit, v, name) in [
            (AttrMask::MAX_QP_RD_ATOMIC, attr.max_rd_atomic, "max_rd_atomic"),
            (AttrMask::MAX_DEST_RD_ATOMIC, attr.max_dest_rd_atomic, "max_dest_rd_atomic"),
        ] {
            if mask.contains(bit) && v > config.max_qp_rd_atom {
                return Err(invalid(format!(
                    "{name} {v} exceeds the device's max_qp_rd_atom {}",
                    config.max_qp_rd_atom
                )));
            }
        }
        for (bit, v, name) in [(AttrMask::RQ_PSN, attr.rq_psn, "rq_psn"), (AttrMask::SQ_PSN, attr.sq_psn, "sq_psn")] {
            if mask.contains(bit) && Psn::new(v).is_none() {
                return Err(invalid(format!("{name} {v:#x} does not fit in 24 bits")));
            }
        }
        if mask.contains(AttrMask::DEST_QPN) && Qpn::new(attr.dest_qp_num).is_none() {
            return Err(invalid(format!("dest_qp_num {:#x} does not fit in 24 bits", attr.dest_qp_num)));
        }
        if mask.contains(AttrMask::PATH_MTU) && attr.path_mtu > config.port_mtu {
            return Err(invalid(format!("path_mtu {:?} exceeds the port's {:?}", attr.path_mtu, config.port_mtu)));
        }
        if mask.contains(AttrMask::AV) {
            let Some(av) = attr.ah_attr else {
                return Err(invalid("IBV_QP_AV is set but no address vector was given"));
            };
            if self.shared.envelope_for(&av, 0).is_none() {
                return Err(invalid(format!(
                    "no route for the AV: sgid_index {} must name a local address of the same IP version as {}",
                    av.sgid_index, av.dgid
                )));
            }
        }

        // Apply.
        let a = &mut qp.attr;
        macro_rules! take {
            ($bit:ident, $field:ident) => {
                if mask.contains(AttrMask::$bit) {
                    a.$field = attr.$field;
                }
            };
        }
        take!(ACCESS_FLAGS, qp_access_flags);
        take!(PKEY_INDEX, pkey_index);
        take!(PORT, port_num);
        take!(QKEY, qkey);
        take!(PATH_MTU, path_mtu);
        take!(TIMEOUT, timeout);
        take!(RETRY_CNT, retry_cnt);
        take!(RNR_RETRY, rnr_retry);
        take!(RQ_PSN, rq_psn);
        take!(MAX_QP_RD_ATOMIC, max_rd_atomic);
        take!(MIN_RNR_TIMER, min_rnr_timer);
        take!(SQ_PSN, sq_psn);
        take!(MAX_DEST_RD_ATOMIC, max_dest_rd_atomic);
        take!(DEST_QPN, dest_qp_num);
        take!(EN_SQD_ASYNC_NOTIFY, en_sqd_async_notify);
        if mask.contains(AttrMask::AV) {
            if qp.av() != attr.ah_attr {
                qp.peer_port = None; // another peer (a path migration is the only legal case)
            }
            qp.set_av(attr.ah_attr);
            // A new peer: the runtime decides again whether it copies from this process,
            // and whether it takes ACKs beside packets.
            qp.by_reference = false;
            qp.acks_beside = false;
            qp.attr.ah_attr = attr.ah_attr;
        }
        if let Some(av) = qp.av() {
            let port = udp_source_port(av.flow_label, qp.qpn.value(), qp.attr.dest_qp_num);
            qp.envelope = self.shared.envelope_for(&av, port);
        }
        if mask.contains(AttrMask::RETRY_CNT) {
            qp.comp.retry_left = attr.retry_cnt;
        }
        if mask.contains(AttrMask::RNR_RETRY) {
            qp.comp.rnr_retry_left = attr.rnr_retry;
        }
        if mask.contains(AttrMask::RQ_PSN) {
            qp.resp.psn = Psn::from_u24_truncating(attr.rq_psn);
        }
        if mask.contains(AttrMask::SQ_PSN) {
            qp.req.psn = Psn::from_u24_truncating(attr.sq_psn);
            qp.req.sent_end = qp.req.psn;
            qp.comp.psn = qp.req.psn;
        }

        let previous = qp.state;
        // Its state, its access flags or its peer may have changed.
        self.shared.void_grants();
        if next != previous {
            tracing::debug!(target: "softrdma::qp", qpn = qpn.value(), "QP {qpn} {previous} → {next} (modify_qp)");
        }
        if next == QpState::Err && previous != QpState::Err {
            // Before the state changes, so that enter_error sees a QP newly failing.
            crate::completer::enter_error(qp, &mut self.shared, None);
        }
        qp.state = next;
        if next != QpState::Sqd {
            qp.sq_drained_reported = false;
        }
        match next {
            QpState::Reset if previous != QpState::Reset => {
                // Everything outstanding is discarded without completions (IBA 10.3.1), and
                // the completions of the QP's still in its CQs (the flushes of an error)
                // go too, as a ConnectX's driver cleans them (mlx5_ib_cq_clean): a QP
                // brought back through RESET starts with none of its past in its CQs.
                // An XRC TGT QP has no CQ: its completions are its SRQs', for receives
                // gone from queues other QPs share, and stay (the kernel's mlx5 skips
                // IB_QPT_XRC_TGT; libmlx5 has no recv_cq to clean for it). Its `recv_cq`
                // is only the CQ of the SRQ its latest request named.
                if qp.qp_type != QpType::XrcTgt {
                    for cq in [qp.send_cq, qp.recv_cq] {
                        if let Some(c) = self.shared.cqs.get_mut(cq.0 as usize) {
                            c.entries.retain(|wc| wc.qp_num != qp.qpn);
                        }
                    }
                }
                qp.sq.clear();
                qp.rq.clear();
                qp.req = Default::default();
                qp.req.next = qp.sq.tail();
                qp.comp = Default::default();
                qp.resp = crate::qp::Responder { out: VecDeque::with_capacity(64), ..Default::default() };
                qp.set_av(None);
                qp.attr = QpAttr { path_mtu: qp.attr.path_mtu, ..QpAttr::default() };
                qp.envelope = None;
                qp.peer_port = None;
                qp.keys = None;
                qp.by_reference = false;
                qp.acks_beside = false;
                qp.cc = None;
                self.shared.update_timer(qp);
            }
            QpState::Sqd => crate::completer::check_drained(qp, &mut self.shared),
            QpState::Rts | QpState::Sqe => self.shared.schedule(qp),
            _ => {}
        }
        self.shared.count_window(qp);
        self.wake_window_waiters();
        Ok(())
    }

    /// The receiver lost datagrams at `now` before the engine saw them (its socket's drop
    /// counter rose): with congestion control on, every QP that received in the last
    /// [`RECENT_RX`](crate::congestion::RECENT_RX) sends its peer a CNP (each at most once
    /// per [`CNP_INTERVAL`](crate::congestion::CNP_INTERVAL)), as a NIC answers an
    /// ECN-marked packet.
    pub fn handle_receive_drops(&mut self, now: Instant) {
        self.shared.tick(now);
        if self.shared.config.congestion.is_none() {
            return;
        }
        for qp in self.qps.values_mut() {
            let peer = crate::responder::cnp_peer(qp);
            let Some(cc) = qp.cc.as_deref_mut() else { continue };
            let Some((envelope, dest)) = peer.filter(|_| cc.received_since(now)) else { continue };
            if cc.np.on_congestion(now) {
                self.shared.cnps.push_back((envelope, dest, qp.qpn));
            }
        }
    }

    /// Puts RC or UC QP `qpn` in authenticated mode ([`crate::auth`]): from now on it tags
    /// every packet it sends with `keys.send` and drops every packet whose tag does not
    /// verify with `keys.receive`. Only before the QP can receive (RESET or INIT), so that
    /// no packet of the connection goes unchecked; a move to RESET ends the mode.
    pub fn set_qp_keys(&mut self, qpn: Qpn, keys: crate::auth::PacketKeys) -> Result<(), VerbsError> {
        let qp = self.qps.get_mut(&qpn.value()).ok_or_else(|| VerbsError::Invalid(format!("no such QP {qpn}")))?;
        if !matches!(qp.qp_type, QpType::Rc | QpType::Uc) {
            return Err(VerbsError::Invalid(format!(
                "QP {qpn} is {:?}: only RC and UC QPs authenticate their packets",
                qp.qp_type
            )));
        }
        if !matches!(qp.state, QpState::Reset | QpState::Init) {
            return Err(VerbsError::Invalid(format!(
                "QP {qpn} is in {:?}: give it its packet keys in RESET or INIT, before RTR",
                qp.state
            )));
        }
        qp.keys = Some(Box::new(crate::auth::Sealer::new(&keys)));
        Ok(())
    }

    /// Lets RC QP `qpn` send its long SENDs and WRITEs by reference ([`crate::reference`]),
    /// or stops it (messages already started keep their carriage). The runtime allows it
    /// once it knows the QP's peer is a process of this host that copies from this one,
    /// and every packet of the QP then goes that way; an authenticated QP never does.
    /// Moving to RESET or to another peer's AV stops it. Returns whether the QP exists.
    pub fn allow_by_reference(&mut self, qpn: Qpn, allow: bool) -> bool {
        let Some(qp) = self.qps.get_mut(&qpn.value()) else { return false };
        qp.by_reference = allow && qp.qp_type == QpType::Rc;
        true
    }

    /// Lets RC QP `qpn` carry the plain ACK it owes its peer beside its next request, when
    /// it sends one in the same call, rather than as a packet of its own
    /// ([`Transmit::ack_beside`]), or stops it. The runtime allows it once it knows the
    /// QP's peer is a process of this host whose inbox takes them (between processes a
    /// request answered at once, as in a ping-pong, half the packets were such ACKs); an
    /// authenticated QP never does. Moving to RESET or to another peer's AV stops it.
    /// Returns whether the QP exists.
    pub fn allow_acks_beside(&mut self, qpn: Qpn, allow: bool) -> bool {
        let Some(qp) = self.qps.get_mut(&qpn.value()) else { return false };
        qp.acks_beside = allow && qp.qp_type == QpType::Rc;
        true
    }

    /// Whether QP `qpn` is in authenticated mode.
    pub fn qp_authenticated(&self, qpn: Qpn) -> bool {
        self.qps.get(&qpn.value()).is_some_and(|qp| qp.keys.is_some())
    }

    /// `ibv_post_recv`: posts `wrs` in order; on failure, [`PostError::index`] is the first
    /// WR not posted (`*bad_wr`) and every WR before it was posted.
    pub fn post_recv(&mut self, qpn: Qpn, wrs: &[RecvWr<'_>]) -> Result<(), PostError> {
        let bad = |index, msg: String| PostError { index, kind: PostErrorKind::Invalid(msg) };
        let qp = self.qps.get_mut(&qpn.value()).ok_or_else(|| bad(0, format!("no such QP {qpn}")))?;
        if matches!(qp.qp_type, QpType::XrcIni | QpType::XrcTgt) {
            return Err(bad(0, format!("{} QP {qpn} has no receive queue; post receives to an XRC SRQ", qp.qp_type)));
        }
        if let Some(srq) = qp.srq {
            // ibv_post_recv(3): a QP with an SRQ takes receives only through ibv_post_srq_recv.
            return Err(bad(0, format!("QP {qpn} uses SRQ {}; post receives with post_srq_recv", srq.0)));
        }
        if qp.state == QpState::Reset {
            return Err(bad(0, format!("QP {qpn} is in RESET; move it to INIT before posting receives")));
        }
        for (index, wr) in wrs.iter().enumerate() {
            if wr.sg_list.len() > qp.cap.max_recv_sge as usize {
                return Err(bad(
                    index,
                    format!(
                        "{} SGEs; the QP was created with max_recv_sge = {}",
                        wr.sg_list.len(),
                        qp.cap.max_recv_sge
                    ),
                ));
            }
            if qp.state == QpState::Err {
                // Posted to a QP in error: completes at once, flushed (IBA 10.8.3.3).
                let wc = crate::completer::flush_wc(qp.qpn, wr.wr_id, WcOpcode::Recv);
                self.shared.push_cqe(qp.recv_cq, wc);
                continue;
            }
            if qp.rq.is_full() {
                return Err(PostError { index, kind: PostErrorKind::QueueFull { depth: qp.rq.capacity() } });
            }
            fill_recv(qp.rq.next_free(), wr);
            qp.rq.commit();
        }
        Ok(())
    }

    /// `ibv_post_send`: posts `wrs` in order; on failure, [`PostError::index`] is the first
    /// WR not posted (`*bad_wr`) and every WR before it was posted. Inline data is copied
    /// from `mem` now, so the buffers may be reused as soon as this returns.
    pub fn post_send<M: Memory + ?Sized>(&mut self, qpn: Qpn, wrs: &[SendWr<'_>], mem: &M) -> Result<(), PostError> {
        let Some(qp) = sending_qp(&mut self.qps, qpn) else { return Err(not_sending(&self.qps, qpn)) };
        let result = post_sends(qp, wrs, mem, &mut self.shared);
        // What was posted before a bad WR goes out.
        self.shared.schedule(qp);
        result
    }
}

impl Engine {
    /// `ibv_wr_complete` (the `ibv_wr_*` API): posts all of `wrs` or, if any of them could
    /// not be posted, none (the error's index names the first that could not).
    pub fn post_send_all<M: Memory + ?Sized>(
        &mut self,
        qpn: Qpn,
        wrs: &[SendWr<'_>],
        mem: &M,
    ) -> Result<(), PostError> {
        let bad = |index, msg: String| PostError { index, kind: PostErrorKind::Invalid(msg) };
        let qp = self.qps.get(&qpn.value()).ok_or_else(|| bad(0, format!("no such QP {qpn}")))?;
        let flushing = matches!(qp.state, QpState::Err | QpState::Sqe);
        let mut scratch = Vec::new();
        for (index, wr) in wrs.iter().enumerate() {
            validate_send(qp, wr, &self.shared).map_err(|m| bad(index, m))?;
            if !flushing && qp.sq.len() as usize + index >= qp.sq.capacity() as usize {
                return Err(PostError { index, kind: PostErrorKind::QueueFull { depth: qp.sq.capacity() } });
            }
            if wr.flags.contains(SendFlags::INLINE) {
                for (i, sge) in wr.sg_list.iter().enumerate() {
                    scratch.resize(sge.length as usize, 0);
                    if mem.read(sge.addr, &mut scratch).is_err() {
                        return Err(bad(
                            index,
                            format!("inline SGE {i} at {:#x} (+{}) is not readable", sge.addr, sge.length),
                        ));
                    }
                }
            }
        }
        self.post_send(qpn, wrs, mem)
    }
}

/// The QP `qpn`, if a post may go to it (it is past RTR); else what is wrong
/// ([`not_sending`]).
#[inline]
pub(crate) fn sending_qp(qps: &mut BTreeMap<u32, Qp>, qpn: Qpn) -> Option<&mut Qp> {
    qps.get_mut(&qpn.value()).filter(|qp| !matches!(qp.state, QpState::Reset | QpState::Init | QpState::Rtr))
}

/// Why a post to `qpn` could not go ([`sending_qp`] found none).
#[cold]
pub(crate) fn not_sending(qps: &BTreeMap<u32, Qp>, qpn: Qpn) -> PostError {
    let msg = match qps.get(&qpn.value()) {
        None => format!("no such QP {qpn}"),
        Some(qp) => format!("QP {qpn} is in {:?}; post_send needs RTS", qp.state),
    };
    PostError { index: 0, kind: PostErrorKind::Invalid(msg) }
}

/// The loop of [`Engine::post_send`], which schedules the QP whatever it returns.
#[inline]
pub(crate) fn post_sends<M: Memory + ?Sized>(
    qp: &mut Qp,
    wrs: &[SendWr<'_>],
    mem: &M,
    shared: &mut Shared,
) -> Result<(), PostError> {
    let bad = |index, msg: String| PostError { index, kind: PostErrorKind::Invalid(msg) };
    for (index, wr) in wrs.iter().enumerate() {
        validate_send(qp, wr, shared).map_err(|m| bad(index, m))?;
        if matches!(qp.state, QpState::Err | QpState::Sqe) {
            // IBA 10.8.3.3: sends posted in ERR or SQE complete at once, flushed.
            let wc = crate::completer::flush_wc(qp.qpn, wr.wr_id, wr.op.wc_opcode());
            shared.push_cqe(qp.send_cq, wc);
            continue;
        }
        if qp.sq.is_full() {
            return Err(PostError { index, kind: PostErrorKind::QueueFull { depth: qp.sq.capacity() } });
        }
        let sig_all = qp.sq_sig_all;
        let slot = qp.sq.next_free();
        slot.wr_id = wr.wr_id;
        slot.op = Some(wr.op);
        slot.sges.clear();
        slot.inline.clear();
        slot.is_inline = wr.flags.contains(SendFlags::INLINE);
        slot.length = wr.sg_list.iter().map(|s| s.length).sum();
        slot.signaled = sig_all || wr.flags.contains(SendFlags::SIGNALED);
        slot.solicited = wr.flags.contains(SendFlags::SOLICITED);
        slot.fence = wr.flags.contains(SendFlags::FENCE);
        slot.ud = wr.ud;
        slot.xrc_srqn = wr.xrc_srqn.unwrap_or(0);
        slot.started = false;
        slot.carriage = crate::qp::Carriage::Undecided;
        slot.npkts = 0;
        slot.read_done = 0;
        slot.status = None;
        if slot.is_inline {
            for (i, sge) in wr.sg_list.iter().enumerate() {
                let at = slot.inline.len();
                slot.inline.resize(at + sge.length as usize, 0);
                if mem.read(sge.addr, &mut slot.inline[at..]).is_err() {
                    return Err(bad(
                        index,
                        format!("inline SGE {i} at {:#x} (+{}) is not readable", sge.addr, sge.length),
                    ));
                }
            }
        } else {
            slot.sges.extend_from_slice(wr.sg_list);
        }
        qp.sq.commit();
    }
    Ok(())
}

fn fill_recv(slot: &mut RecvWqe, wr: &RecvWr<'_>) {
    slot.wr_id = wr.wr_id;
    slot.sges.clear();
    slot.sges.extend_from_slice(wr.sg_list);
    slot.length = wr.sg_list.iter().map(|s| s.length).sum();
}

const XRC_TGT_SENDS_NOTHING: &str = "an XRC TGT (XRC_RECV) QP has no send queue";

/// The checks `ibv_post_send` makes before queueing a WR (they fail with `EINVAL`).
fn validate_send(qp: &Qp, wr: &SendWr<'_>, shared: &Shared) -> Result<(), String> {
    if qp.qp_type == QpType::XrcTgt {
        return Err(XRC_TGT_SENDS_NOTHING.into());
    }
    if wr.sg_list.len() > qp.cap.max_send_sge as usize {
        return Err(format!(
            "{} SGEs; the QP was created with max_send_sge = {}",
            wr.sg_list.len(),
            qp.cap.max_send_sge
        ));
    }
    let length: u64 = wr.sg_list.iter().map(|s| u64::from(s.length)).sum();
    if length > u64::from(shared.config.max_msg_sz) {
        return Err(format!("{length} bytes exceeds the largest message, {}", shared.config.max_msg_sz));
    }
    let inline = wr.flags.contains(SendFlags::INLINE);
    if wr.op.is_local() && !wr.sg_list.is_empty() {
        return Err("BIND_MW and LOCAL_INV take no SGEs (num_sge must be 0)".into());
    }
    if inline {
        if wr.op.is_read_or_atomic() || wr.op.is_local() {
            return Err("IBV_SEND_INLINE applies to SEND and RDMA WRITE only".into());
        }
        if length > u64::from(qp.cap.max_inline_data) {
            return Err(format!(
                "{length} inline bytes; the QP was created with max_inline_data = {}",
                qp.cap.max_inline_data
            ));
        }
    }
    if wr.op.is_atomic() && length != 8 {
        return Err(format!("an atomic's local buffer must be 8 bytes, not {length}"));
    }
    if let SendOp::Flush { placement, level, .. } = wr.op {
        if !wr.sg_list.is_empty() {
            return Err("FLUSH takes no SGEs (num_sge must be 0)".into());
        }
        if !SendOp::flush_placement_is_defined(placement) {
            return Err(format!("FLUSH type {placement:#x}: IBV_FLUSH_GLOBAL (1), IBV_FLUSH_PERSISTENT (2) or both"));
        }
        if level > SendOp::FLUSH_MR {
            return Err(format!("FLUSH level {level}: IBV_FLUSH_RANGE (0) or IBV_FLUSH_MR (1)"));
        }
    }
    if matches!(wr.op, SendOp::AtomicWrite { .. }) && !wr.sg_list.is_empty() {
        return Err("ATOMIC_WRITE carries its 8 bytes in the work request and takes no SGEs".into());
    }
    match qp.qp_type {
        QpType::Ud | QpType::Gsi => {
            if !matches!(wr.op, SendOp::Send | SendOp::SendWithImm { .. }) {
                return Err("UD QPs support SEND and SEND_WITH_IMM only".into());
            }
            let Some(dest) = wr.ud else {
                return Err("a UD send needs a destination (wr.ud: AH, remote QPN, remote Q_Key)".into());
            };
            if !shared.ahs.contains(dest.ah.0 as usize) {
                return Err(format!("no such AH {}", dest.ah.0));
            }
            if length > u64::from(qp.mtu()) {
                return Err(format!("{length} bytes does not fit one UD packet of the port MTU, {}", qp.mtu()));
            }
        }
        QpType::Uc => {
            if wr.op.is_read_or_atomic() {
                return Err("UC QPs support SEND and RDMA WRITE only (and BIND_MW, LOCAL_INV)".into());
            }
            if matches!(wr.op, SendOp::SendWithInv { .. }) {
                return Err("SEND_WITH_INV is RC only: no UC opcode carries an IETH".into());
            }
        }
        QpType::XrcIni => {
            let Some(srqn) = wr.xrc_srqn else {
                return Err("an XRC send names the XRC SRQ at the target (wr.qp_type.xrc.remote_srqn)".into());
            };
            if srqn > 0xff_ffff {
                return Err(format!("remote_srqn {srqn:#x} does not fit in 24 bits"));
            }
            if matches!(wr.op, SendOp::AtomicWrite { .. } | SendOp::Flush { .. }) {
                return Err("ATOMIC_WRITE and FLUSH have no XRC opcode".into());
            }
        }
        QpType::XrcTgt => return Err(XRC_TGT_SENDS_NOTHING.into()),
        QpType::Rc => {}
    }
    Ok(())
}
