//! Devices: one per network interface, as with kernel Soft-RoCE (rxe).
//!
//! A device is named `softrdma_<interface>` (`softrdma_lo`, `softrdma_eth0`), has one port
//! (1) with an Ethernet link layer, and a GID table built from the interface's addresses in
//! a stable order that programs can rely on when they pick a GID by index
//! (`ibv_rc_pingpong -g N`, `ib_write_bw -x N`):
//!
//! 1. the interface's IPv4 addresses, as IPv4-mapped GIDs (`::ffff:a.b.c.d`), in the
//!    kernel's order (the primary address first), so `-g 0` is the IPv4 address;
//! 2. then its global IPv6 addresses, in the kernel's order.
//!
//! Link-local IPv6 addresses (`fe80::/10`) are left out: a RoCEv2 packet to one needs a
//! scope, which a GID cannot carry. Every GID is RoCEv2 (rxe lists a RoCE v1 twin of each;
//! softrdma speaks only v2).

use std::net::IpAddr;

use softrdma_engine::Mtu;
use softrdma_wire::Gid;

use crate::Error;

/// A softrdma device: a network interface and its addresses (`ibv_device`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Device {
    name: String,
    interface: String,
    addresses: Vec<IpAddr>,
    mtu: u32,
    mac: [u8; 6],
}

/// Every device of this host (network namespace), one per interface that has an address,
/// `lo` included, in interface-index order.
pub fn devices() -> Result<Vec<Device>, Error> {
    let mut found: Vec<(u32, Device)> = Vec::new();
    let interfaces =
        if_addrs::get_if_addrs().map_err(|e| Error::Io { what: "listing network interfaces".into(), source: e })?;
    for iface in interfaces {
        let ip = iface.ip();
        if let IpAddr::V6(v6) = ip {
            if v6.segments()[0] & 0xffc0 == 0xfe80 {
                continue;
            }
        }
        let index = iface.index.unwrap_or(u32::MAX);
        match found.iter_mut().find(|(_, d)| d.interface == iface.name) {
            Some((_, d)) => d.addresses.push(ip),
            None => found.push((index, Device::for_interface(&iface.name, vec![ip]))),
        }
    }
    found.sort_by_key(|(index, _)| *index);
    let mut out: Vec<Device> = found.into_iter().map(|(_, d)| d).collect();
    for d in &mut out {
        // IPv4 first, each family in the kernel's order (a stable sort keeps it).
        d.addresses.sort_by_key(|a| a.is_ipv6());
    }
    Ok(out)
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
        Device { name: format!("softrdma_{interface}"), interface: interface.to_string(), addresses, mtu, mac }
    }

    /// A device on `interface` with exactly these addresses as its GID table, in this
    /// order. For tests and for programs that want a subset of an interface's addresses.
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
    fn unknown_device_error_lists_the_devices() {
        let e = device("no-such-interface").unwrap_err().to_string();
        assert!(e.contains("no-such-interface") && e.contains("softrdma_lo"), "{e}");
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
