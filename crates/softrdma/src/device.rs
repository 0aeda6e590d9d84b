//! Devices: one per network interface, as with kernel Soft-RoCE (rxe).
//!
//! A device is named `softrdma_<interface>` (`softrdma_lo`, `softrdma_eth0`), has one port
//! (1) with an Ethernet link layer, and a GID table built from the interface's addresses in
//! a stable order that programs can rely on when they pick a GID by index
//! (`ibv_rc_pingpong -g N`, `ib_write_bw -x N`):
//!
//! 1. the interface's IPv4 addresses, as IPv4-mapped GIDs (`::ffff:a.b.c.d`), in the
//!    kernel's order (the primary address first), so `-g 0` is the IPv4 address;
//! 2. then its global IPv6 addresses, in the kernel's order;
//! 3. then its link-local IPv6 addresses (`fe80::/10`), in the kernel's order. They come
//!    last so that the indexes of 1 and 2 are the ones they were before softrdma listed
//!    link-local GIDs (and stay put when the kernel adds a link-local address).
//!
//! rxe and RoCE NICs list link-local GIDs too, and peers use them. A link-local address
//! names no interface, so packets from and to one need a scope; the device is one
//! interface, so its scope is the interface's index ([`Device::interface_index`]): its
//! sockets on link-local addresses are bound in it, its datagrams to link-local GIDs
//! leave in it, and rdma_cm picks a link-local address's device by it (a `sockaddr_in6`'s
//! `sin6_scope_id`). Every GID is RoCEv2 (rxe lists a RoCE v1 twin of each; softrdma
//! speaks only v2).

use std::net::IpAddr;

use softrdma_engine::{AddressVector, DeviceConfig, Mtu, VerbsError};
use softrdma_wire::Gid;
use softrdma_wire::grh::GrhRepr;

use crate::Error;

/// A softrdma device: a network interface and its addresses (`ibv_device`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Device {
    name: String,
    interface: String,
    /// The interface index (`if_nametoindex`); 0 when the interface is gone.
    index: u32,
    addresses: Vec<IpAddr>,
    mtu: u32,
    mac: [u8; 6],
}

/// Every device of this host (network namespace), one per interface that has an address,
/// `lo` included, in interface-index order.
pub fn devices() -> Result<Vec<Device>, Error> {
    let mut found: Vec<Device> = Vec::new();
    let interfaces =
        if_addrs::get_if_addrs().map_err(|e| Error::Io { what: "listing network interfaces".into(), source: e })?;
    for iface in interfaces {
        let ip = iface.ip();
        match found.iter_mut().find(|d| d.interface == iface.name) {
            Some(d) => d.addresses.push(ip),
            None => {
                let mut d = Device::for_interface(&iface.name, vec![ip]);
                d.index = iface.index.unwrap_or(d.index);
                found.push(d);
            }
        }
    }
    found.sort_by_key(|d| d.index);
    for d in &mut found {
        d.addresses = gid_order(std::mem::take(&mut d.addresses));
    }
    Ok(found)
}

/// An interface's addresses in GID order (module documentation): IPv4, global IPv6,
/// link-local IPv6, each group in the order given (the kernel's: a stable sort keeps it).
fn gid_order(mut addresses: Vec<IpAddr>) -> Vec<IpAddr> {
    addresses.sort_by_key(|a| match a {
        IpAddr::V4(_) => 0,
        IpAddr::V6(v6) if v6.is_unicast_link_local() => 2,
        IpAddr::V6(_) => 1,
    });
    addresses
}

/// The device of interface `interface` (`lo`, `eth0`) or named `name` (`softrdma_lo`).
pub fn device(name: &str) -> Result<Device, Error> {
    let all = devices()?;
    let names: Vec<String> = all.iter().map(|d| d.name.clone()).collect();
    all.into_iter()
        .find(|d| d.name == name || d.interface == name)
        .ok_or_else(|| Error::NoDevice { name: name.to_string(), available: names.join(", ") })
}

impl Device {
    fn for_interface(interface: &str, addresses: Vec<IpAddr>) -> Device {
        let sys = |file: &str| std::fs::read_to_string(format!("/sys/class/net/{interface}/{file}")).ok();
        let mtu = sys("mtu").and_then(|s| s.trim().parse().ok()).unwrap_or(1500);
        let mut mac = [0u8; 6];
        if let Some(text) = sys("address") {
            for (slot, part) in mac.iter_mut().zip(text.trim().split(':')) {
                *slot = u8::from_str_radix(part, 16).unwrap_or(0);
            }
        }
        let index = sys("ifindex").and_then(|s| s.trim().parse().ok()).unwrap_or(0);
        Device { name: format!("softrdma_{interface}"), interface: interface.to_string(), index, addresses, mtu, mac }
    }

    /// A device on `interface` with exactly these addresses as its GID table, in this
    /// order. For tests and for programs that want a subset of an interface's addresses.
    /// Link-local addresses are bound in `interface`'s scope, which must exist then.
    pub fn with_addresses(interface: &str, addresses: Vec<IpAddr>) -> Device {
        Device::for_interface(interface, addresses)
    }

    /// `softrdma_<interface>`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The network interface.
    pub fn interface(&self) -> &str {
        &self.interface
    }

    /// The interface's index (`if_nametoindex`, `ibv_gid_entry.ndev_ifindex`): the scope
    /// (`sin6_scope_id`) of the device's link-local GIDs. 0 if the interface was not there
    /// when the device was made.
    pub fn interface_index(&self) -> u32 {
        self.index
    }

    /// `ip` as a socket address on `port`: a link-local address in this device's scope.
    pub fn socket_addr(&self, ip: IpAddr, port: u16) -> std::net::SocketAddr {
        match ip {
            IpAddr::V6(v6) if v6.is_unicast_link_local() => std::net::SocketAddrV6::new(v6, port, 0, self.index).into(),
            _ => std::net::SocketAddr::new(ip, port),
        }
    }

    /// The GID table as IP addresses, in index order (module documentation).
    pub fn addresses(&self) -> &[IpAddr] {
        &self.addresses
    }

    /// The GID at `index`.
    pub fn gid(&self, index: u8) -> Option<Gid> {
        self.addresses.get(usize::from(index)).map(|ip| Gid::from_ip(*ip))
    }

    /// The index of `ip` in the GID table.
    pub fn gid_index(&self, ip: IpAddr) -> Option<u8> {
        let ip = ip.to_canonical();
        self.addresses.iter().position(|a| *a == ip).and_then(|i| u8::try_from(i).ok())
    }

    /// `ibv_init_ah_from_wc`: the address vector that answers a UD receive, from the 40
    /// bytes its buffer starts with (the IPv4 or IPv6 header standing in for the GRH):
    /// the sender's address as destination, the address it was sent to as source GID,
    /// the received hop limit and traffic class (and IPv6 flow label).
    pub fn reply_av(&self, grh: &[u8]) -> Result<AddressVector, Error> {
        let invalid = |why: String| Error::Verbs(VerbsError::Invalid(why));
        let h = GrhRepr::parse(grh).map_err(|e| {
            invalid(format!("the receive buffer's first 40 bytes are no IPv4 or IPv6 header ({e}); pass the buffer of a UD receive whose completion has IBV_WC_GRH"))
        })?;
        let to = h.dgid().to_ip();
        let sgid_index = self.gid_index(to).ok_or_else(|| {
            invalid(format!(
                "the datagram was sent to {to}, which is not an address of {} ({:?})",
                self.name, self.addresses
            ))
        })?;
        let (hop_limit, traffic_class, flow_label) = match &h {
            GrhRepr::V4(ip) => (ip.time_to_live, ip.dscp.value() << 2 | ip.ecn.value(), 0),
            GrhRepr::V6(ip) => (ip.hop_limit, ip.traffic_class, ip.flow_label.value()),
        };
        Ok(AddressVector { dgid: h.sgid(), sgid_index, hop_limit, traffic_class, flow_label })
    }

    /// The interface MTU in bytes (`/sys/class/net/<if>/mtu`).
    pub fn interface_mtu(&self) -> u32 {
        self.mtu
    }

    /// The port's active MTU as an IB MTU: the largest of 256..4096 whose packets (IP, UDP,
    /// BTH, extended headers and ICRC: at most 108 bytes with IPv6) fit the interface MTU,
    /// as rxe computes it.
    pub fn active_mtu(&self) -> Mtu {
        [Mtu::Mtu4096, Mtu::Mtu2048, Mtu::Mtu1024, Mtu::Mtu512]
            .into_iter()
            .find(|m| m.bytes() + 108 <= self.mtu)
            .unwrap_or(Mtu::Mtu256)
    }

    /// The node GUID: the interface's MAC address as an EUI-64 (`ff:fe` in the middle, the
    /// universal/local bit flipped), as rxe derives it.
    pub fn node_guid(&self) -> u64 {
        let m = self.mac;
        u64::from_be_bytes([m[0] ^ 2, m[1], m[2], 0xff, 0xfe, m[3], m[4], m[5]])
    }

    /// What a context of this device opened now would allow (`ibv_query_device` without
    /// opening it): the same as [`Context::query_device`](crate::Context::query_device).
    pub fn attributes(&self) -> DeviceAttr {
        DeviceAttr::new(self, &self.engine_config())
    }

    /// Port `port` as a context opened now would see it (`ibv_query_port` without opening
    /// the device): the same as [`Context::query_port`](crate::Context::query_port).
    pub fn port_attributes(&self, port: u8) -> Result<PortAttr, Error> {
        PortAttr::new(self, port, &self.engine_config())
    }

    /// The engine limits a context of this device gets: the defaults, the port MTU, and as
    /// many QPs as its slot of the host's QPN space holds (`softrdma_udp::host`).
    fn engine_config(&self) -> DeviceConfig {
        DeviceConfig {
            addresses: self.addresses.clone(),
            max_qp: 1 << softrdma_udp::host::QPN_SLOT_BITS,
            port_mtu: self.active_mtu(),
            ..DeviceConfig::default()
        }
    }

    /// The interface's state: `(up, carrier)`. The operational state (`IFF_RUNNING`) comes
    /// from `getifaddrs`, which answers for this process's network namespace; `/sys/class/net`
    /// answers for the namespace sysfs was mounted in (a process that only `unshare -n`'d
    /// sees the host's interfaces there), so its `flags` count only for an interface of the
    /// same index: an interface administratively up without carrier.
    fn link(&self) -> (bool, bool) {
        let running =
            if_addrs::get_if_addrs().is_ok_and(|all| all.iter().any(|i| i.name == self.interface && i.is_oper_up()));
        let sys = |file: &str| std::fs::read_to_string(format!("/sys/class/net/{}/{file}", self.interface)).ok();
        let same = sys("ifindex").and_then(|i| i.trim().parse::<u32>().ok()) == Some(self.index);
        let flags = sys("flags").and_then(|f| u32::from_str_radix(f.trim().trim_start_matches("0x"), 16).ok());
        let up = running || same && flags.is_some_and(|f| f & 1 != 0); // IFF_UP
        (up, running)
    }
}

/// What a device is and allows (`ibv_device_attr`). Every limit is one the engine
/// enforces; a resource it does not count is `None` (bounded only by memory).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceAttr {
    /// The "firmware" version: softrdma's own.
    pub fw_ver: String,
    /// [`Device::node_guid`].
    pub node_guid: u64,
    /// The node GUID again (one node per system image, as rxe).
    pub sys_image_guid: u64,
    /// 0xffffff: no IEEE OUI (as rxe).
    pub vendor_id: u32,
    /// 0.
    pub vendor_part_id: u32,
    /// 0.
    pub hw_ver: u32,
    /// Ports: 1.
    pub phys_port_cnt: u8,
    /// Largest memory region: any range of the address space that does not wrap.
    pub max_mr_size: u64,
    /// Most QPs per context (its slot of the host's QPN space).
    pub max_qp: u32,
    /// Deepest send or receive queue.
    pub max_qp_wr: u32,
    /// Most scatter/gather entries per work request.
    pub max_sge: u32,
    /// Most scatter/gather entries per RDMA READ (the same limit).
    pub max_sge_rd: u32,
    /// Most CQs.
    pub max_cq: Option<u32>,
    /// Deepest CQ.
    pub max_cqe: u32,
    /// Most memory regions.
    pub max_mr: u32,
    /// Most protection domains.
    pub max_pd: Option<u32>,
    /// Most outstanding RDMA READs and atomics a QP answers (`max_dest_rd_atomic`).
    pub max_qp_rd_atom: u8,
    /// Most outstanding RDMA READs and atomics a QP initiates (`max_rd_atomic`).
    pub max_qp_init_rd_atom: u8,
    /// Atomics are atomic with respect to this device's other operations.
    pub atomic_cap: AtomicCap,
    /// Most memory windows (type 1 and type 2B, as rxe).
    pub max_mw: u32,
    /// Most multicast groups with a QP attached (rxe's 8192).
    pub max_mcast_grp: u32,
    /// Most QPs attached to one multicast group (rxe's 56).
    pub max_mcast_qp_attach: u32,
    /// Most multicast attachments, all groups together (rxe's 0x70000).
    pub max_total_mcast_qp_attach: u32,
    /// Most address handles.
    pub max_ah: Option<u32>,
    /// Most shared receive queues.
    pub max_srq: Option<u32>,
    /// Deepest SRQ.
    pub max_srq_wr: u32,
    /// Most scatter/gather entries per SRQ receive.
    pub max_srq_sge: u32,
    /// P_Key table entries: one, the default P_Key 0xffff.
    pub max_pkeys: u16,
    /// Most inline bytes per send work request (`max_inline_data`).
    pub max_inline_data: u32,
}

impl DeviceAttr {
    pub(crate) fn new(device: &Device, c: &DeviceConfig) -> DeviceAttr {
        DeviceAttr {
            fw_ver: env!("CARGO_PKG_VERSION").to_string(),
            node_guid: device.node_guid(),
            sys_image_guid: device.node_guid(),
            vendor_id: 0xff_ffff,
            vendor_part_id: 0,
            hw_ver: 0,
            phys_port_cnt: 1,
            // `Engine::reg_mr` refuses only a range that wraps.
            max_mr_size: u64::MAX,
            max_qp: c.max_qp,
            max_qp_wr: c.max_qp_wr,
            max_sge: c.max_sge,
            max_sge_rd: c.max_sge,
            max_cq: None,
            max_cqe: c.max_cqe,
            max_mr: c.max_mr,
            max_pd: None,
            max_qp_rd_atom: c.max_qp_rd_atom,
            max_qp_init_rd_atom: c.max_qp_rd_atom,
            atomic_cap: AtomicCap::Hca,
            max_mw: c.max_mw,
            max_mcast_grp: c.max_mcast_grp,
            max_mcast_qp_attach: c.max_mcast_qp_attach,
            max_total_mcast_qp_attach: c.max_total_mcast_qp_attach,
            max_ah: None,
            max_srq: None,
            max_srq_wr: c.max_qp_wr,
            max_srq_sge: c.max_sge,
            max_pkeys: 1,
            max_inline_data: c.max_inline_data,
        }
    }
}

/// How atomic the device's atomic operations are (`ibv_atomic_cap`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtomicCap {
    /// No atomics (`IBV_ATOMIC_NONE`, 0).
    None = 0,
    /// Atomic with respect to the device's own operations (`IBV_ATOMIC_HCA`, 1).
    Hca = 1,
    /// Atomic with respect to every device and the CPUs (`IBV_ATOMIC_GLOB`, 2).
    Glob = 2,
}

/// A port's attributes (`ibv_port_attr`). softrdma ports have an Ethernet link layer,
/// no LIDs and no subnet manager; every GID is RoCE v2.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PortAttr {
    /// Active when the interface is up with a carrier, as rxe decides.
    pub state: PortState,
    /// The physical state that goes with it.
    pub phys_state: PhysState,
    /// Largest MTU the device supports: 4096.
    pub max_mtu: Mtu,
    /// The MTU the interface allows ([`Device::active_mtu`]).
    pub active_mtu: Mtu,
    /// GIDs: one per address ([`Device::addresses`]).
    pub gid_tbl_len: u32,
    /// P_Keys: one.
    pub pkey_tbl_len: u16,
    /// Largest message.
    pub max_msg_sz: u32,
    /// `IBV_PORT_CM_SUP | IBV_PORT_IP_BASED_GIDS`, as rxe.
    pub port_cap_flags: u32,
    /// Link width, IB-encoded: 2 (4X).
    pub active_width: u8,
    /// Per-lane speed, IB-encoded: 32 (EDR, 25 Gb/s): nominal, as rxe reports its netdev's.
    pub active_speed: u8,
}

impl PortAttr {
    /// The link rate as sysfs `ports/N/rate` says it (`100 Gb/sec (4X EDR)`).
    pub fn rate(&self) -> String {
        let lanes = match self.active_width {
            1 => 1,
            2 => 4,
            4 => 8,
            8 => 12,
            16 => 2,
            _ => 0,
        };
        let (tenths, name) = match self.active_speed {
            1 => (25, "SDR"),
            2 => (50, "DDR"),
            4 | 8 => (100, "QDR"),
            16 => (140, "FDR"),
            32 => (250, "EDR"),
            64 => (500, "HDR"),
            128 => (1000, "NDR"),
            _ => (0, "?"),
        };
        let total = lanes * tenths;
        let gbps = if total % 10 == 0 { format!("{}", total / 10) } else { format!("{}.{}", total / 10, total % 10) };
        format!("{gbps} Gb/sec ({lanes}X {name})")
    }
}

impl PortAttr {
    pub(crate) fn new(device: &Device, port: u8, c: &DeviceConfig) -> Result<PortAttr, Error> {
        if port != 1 {
            return Err(Error::Verbs(softrdma_engine::VerbsError::Invalid(format!(
                "port {port}: a softrdma device has one port, 1"
            ))));
        }
        let (up, carrier) = device.link();
        Ok(PortAttr {
            state: if carrier { PortState::Active } else { PortState::Down },
            phys_state: match (up, carrier) {
                (_, true) => PhysState::LinkUp,
                (true, false) => PhysState::Polling,
                (false, _) => PhysState::Disabled,
            },
            max_mtu: Mtu::Mtu4096,
            active_mtu: c.port_mtu,
            gid_tbl_len: c.addresses.len() as u32,
            pkey_tbl_len: 1,
            max_msg_sz: c.max_msg_sz,
            port_cap_flags: (1 << 16) | (1 << 26),
            active_width: 2,
            active_speed: 32,
        })
    }
}

/// A port's logical state (`ibv_port_state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortState {
    /// `IBV_PORT_DOWN` (1).
    Down = 1,
    /// `IBV_PORT_ACTIVE` (4).
    Active = 4,
}

impl PortState {
    /// As `ibv_devinfo` prints it: `PORT_ACTIVE`.
    pub fn name(self) -> &'static str {
        match self {
            PortState::Down => "PORT_DOWN",
            PortState::Active => "PORT_ACTIVE",
        }
    }
}

/// A port's physical state (IBA 14.2.5.6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PhysState {
    /// The interface is up, without a carrier (2).
    Polling = 2,
    /// The interface is down (3).
    Disabled = 3,
    /// Up with a carrier (5).
    LinkUp = 5,
}

impl PhysState {
    /// As `ibv_devinfo` prints it: `LINK_UP`.
    pub fn name(self) -> &'static str {
        match self {
            PhysState::Polling => "POLLING",
            PhysState::Disabled => "DISABLED",
            PhysState::LinkUp => "LINK_UP",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_a_device_with_ipv4_first() {
        let lo = device("lo").expect("every Linux host has lo");
        assert_eq!(lo.name(), "softrdma_lo");
        assert_eq!(lo.addresses()[0], IpAddr::from([127, 0, 0, 1]), "GID 0 is the IPv4 address");
        assert_eq!(lo.gid_index(IpAddr::from([127, 0, 0, 1])), Some(0));
        assert_eq!(lo.gid(0), Some(Gid::from_ip(IpAddr::from([127, 0, 0, 1]))));
        assert_eq!(device("softrdma_lo").unwrap(), lo);
    }

    #[test]
    fn gid_order_is_ipv4_then_global_ipv6_then_link_local_each_in_kernel_order() {
        // As getifaddrs may list them: families mixed, link-local between global addresses.
        let kernel = ["fe80::2", "fd00::1", "10.0.0.1", "fe80::1", "2001:db8::1", "10.0.0.2", "febf::9"];
        let order = gid_order(kernel.iter().map(|s| ip(s)).collect());
        let want = ["10.0.0.1", "10.0.0.2", "fd00::1", "2001:db8::1", "fe80::2", "fe80::1", "febf::9"];
        assert_eq!(order, want.iter().map(|s| ip(s)).collect::<Vec<_>>());
    }

    #[test]
    fn a_link_local_socket_address_carries_the_interface_index() {
        let lo = device("lo").unwrap();
        assert!(lo.interface_index() > 0, "lo has an index");
        let ll = lo.socket_addr(ip("fe80::1"), 4791);
        assert_eq!(ll, std::net::SocketAddrV6::new("fe80::1".parse().unwrap(), 4791, 0, lo.interface_index()).into());
        assert_eq!(lo.socket_addr(ip("fd00::1"), 7), "[fd00::1]:7".parse().unwrap(), "no scope off the link");
        assert_eq!(lo.socket_addr(IpAddr::from([127, 0, 0, 1]), 7), "127.0.0.1:7".parse().unwrap());
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn unknown_device_error_lists_the_devices() {
        let e = device("no-such-interface").unwrap_err().to_string();
        assert!(e.contains("no-such-interface") && e.contains("softrdma_lo"), "{e}");
    }

    #[test]
    fn loopback_port_is_active_and_limits_are_the_engines() {
        let lo = device("lo").unwrap();
        let port = lo.port_attributes(1).unwrap();
        assert_eq!((port.state, port.phys_state), (PortState::Active, PhysState::LinkUp), "lo is up with a carrier");
        assert_eq!(port.gid_tbl_len as usize, lo.addresses().len());
        let e = lo.port_attributes(2).unwrap_err().to_string();
        assert!(e.contains("port 2") && e.contains("one port, 1"), "{e}");
        let attr = lo.attributes();
        let engine = DeviceConfig::default();
        assert_eq!((attr.max_qp_wr, attr.max_sge, attr.max_cqe), (engine.max_qp_wr, engine.max_sge, engine.max_cqe));
        assert_eq!(attr.max_qp, 8192, "one slot of the host's QPN space");
        assert_eq!(attr.node_guid, lo.node_guid());
    }

    #[test]
    fn mtu_and_guid_follow_rxe() {
        let mut d = Device::with_addresses("x", vec![IpAddr::from([10, 0, 0, 1])]);
        d.mtu = 1500;
        assert_eq!(d.active_mtu(), Mtu::Mtu1024);
        d.mtu = 9000;
        assert_eq!(d.active_mtu(), Mtu::Mtu4096);
        d.mac = [0x52, 0x54, 0x00, 0x12, 0x34, 0x56];
        assert_eq!(d.node_guid(), 0x5054_00ff_fe12_3456);
    }
}
