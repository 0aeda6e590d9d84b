//! `softrdma devices`, `softrdma devinfo` and `softrdma stats`: what `ibv_devices`,
//! `ibv_devinfo` and rxe's `hw_counters` show, for softrdma's devices.
//!
//! The text follows rdma-core's `ibv_devices` and `ibv_devinfo` (libibverbs/examples) field
//! for field, tabs included, so that it reads the same; `--json` prints everything, `-v`
//! or not, as one JSON object.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{self, Write as _};
use std::process::ExitCode;

use serde::Serialize;
use softrdma::stats::{self, Published};
use softrdma::{Device, DeviceAttr, PortAttr};

/// `softrdma devices`.
#[derive(clap::Args, Debug)]
pub(crate) struct DevicesArgs {
    /// One JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// `softrdma devinfo`.
#[derive(clap::Args, Debug)]
pub(crate) struct DevinfoArgs {
    /// Only this device: `softrdma_lo`, or its interface, `lo` (default: every device).
    #[arg(short = 'd', long = "ib-dev", value_name = "DEV")]
    device: Option<String>,
    /// Also the device's limits (what its engine enforces) and the port's details.
    #[arg(short, long)]
    verbose: bool,
    /// One JSON object instead of text (with everything -v shows).
    #[arg(long)]
    json: bool,
}

/// `softrdma stats`.
#[derive(clap::Args, Debug)]
pub(crate) struct StatsArgs {
    /// Only this device: `softrdma_lo`, or its interface, `lo` (default: every device).
    #[arg(short = 'd', long = "ib-dev", value_name = "DEV")]
    device: Option<String>,
    /// Also each process's counters: pid, command, contexts and UDP ports.
    #[arg(short, long)]
    verbose: bool,
    /// One JSON object instead of text (with the processes, as -v).
    #[arg(long)]
    json: bool,
}

/// Runs `softrdma devices`.
pub(crate) fn devices(args: &DevicesArgs) -> ExitCode {
    let all = match softrdma::devices() {
        Ok(d) => d,
        Err(e) => return failure("devices", &e.to_string()),
    };
    let out = if args.json { json(&DevicesJson::new(&all)) } else { devices_text(&all) };
    emit(&out)
}

/// Runs `softrdma devinfo`.
pub(crate) fn devinfo(args: &DevinfoArgs) -> ExitCode {
    let chosen = match choose("devinfo", args.device.as_deref(), &[]) {
        Ok(d) => d,
        Err(code) => return code,
    };
    let mut infos = Vec::new();
    for d in &chosen {
        match DevInfo::of(d) {
            Ok(i) => infos.push(i),
            Err(e) => return failure("devinfo", &e.to_string()),
        }
    }
    let out = if args.json {
        json(&DevinfoJson { devices: infos.iter().map(DevinfoJsonDevice::new).collect() })
    } else {
        infos.iter().map(|i| devinfo_text(i, args.verbose)).collect()
    };
    emit(&out)
}

/// Runs `softrdma stats`.
pub(crate) fn stats(args: &StatsArgs) -> ExitCode {
    let scan = match stats::scan() {
        Ok(s) => s,
        Err(e) => {
            let dir = stats::stats_dir();
            return failure("stats", &format!("reading {}: {e}", dir.display()));
        }
    };
    let published: Vec<String> = scan.live.iter().map(|p| p.device.clone()).collect();
    let chosen = match choose("stats", args.device.as_deref(), &published) {
        Ok(d) => d,
        Err(code) => return code,
    };
    for (path, why) in &scan.skipped {
        warn("stats", &format!("skipped {}: {why}", path.display()));
    }
    if scan.other_users > 0 {
        warn(
            "stats",
            &format!(
                "{} contexts of other users not shown (their counters are theirs; root sees all)",
                scan.other_users
            ),
        );
    }
    let report = StatsReport::new(&chosen, &scan.live, scan.stale);
    let out = if args.json { json(&report) } else { stats_text(&report, args.verbose) };
    emit(&out)
}

// ---- choosing devices ----------------------------------------------------------------------

/// A device to report on: one of this host's, or only a name found in published counters
/// (a context opened on an interface that is gone, or on a device of its own making).
pub(crate) struct Chosen {
    pub(crate) name: String,
    pub(crate) device: Option<Device>,
}

/// Every device, or the one `wanted` names (as `softrdma_lo` or `lo`), with any device
/// named only in `published` appended. A name that matches nothing is a usage error.
pub(crate) fn choose(command: &str, wanted: Option<&str>, published: &[String]) -> Result<Vec<Chosen>, ExitCode> {
    let host = softrdma::devices().map_err(|e| failure(command, &e.to_string()))?;
    let mut all: Vec<Chosen> =
        host.into_iter().map(|d| Chosen { name: d.name().to_string(), device: Some(d) }).collect();
    for name in published {
        if !all.iter().any(|c| c.name == *name) {
            all.push(Chosen { name: name.clone(), device: None });
        }
    }
    let Some(wanted) = wanted else { return Ok(all) };
    let names: Vec<String> = all.iter().map(|c| c.name.clone()).collect();
    match all.into_iter().find(|c| c.name == wanted || c.device.as_ref().is_some_and(|d| d.interface() == wanted)) {
        Some(c) => Ok(vec![c]),
        None => {
            warn(
                command,
                &format!(
                    "no device {wanted:?}; the devices are {} (see `softrdma devices`; -d takes a name or an interface)",
                    if names.is_empty() { "none".to_string() } else { names.join(", ") }
                ),
            );
            Err(ExitCode::from(2))
        }
    }
}

// ---- devices -------------------------------------------------------------------------------

fn devices_text(all: &[Device]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "    {:<16}\t   node GUID", "device");
    let _ = writeln!(out, "    {:<16}\t----------------", "------");
    for d in all {
        let _ = writeln!(out, "    {:<16}\t{:016x}", d.name(), d.node_guid());
    }
    out
}

#[derive(Serialize)]
struct DevicesJson {
    devices: Vec<DevicesJsonDevice>,
}

#[derive(Serialize)]
struct DevicesJsonDevice {
    device: String,
    interface: String,
    /// 16 hex digits, as `ibv_devices` prints it (a u64 does not fit a JSON number).
    node_guid: String,
}

impl DevicesJson {
    fn new(all: &[Device]) -> Self {
        let devices = all
            .iter()
            .map(|d| DevicesJsonDevice {
                device: d.name().to_string(),
                interface: d.interface().to_string(),
                node_guid: format!("{:016x}", d.node_guid()),
            })
            .collect();
        DevicesJson { devices }
    }
}

// ---- devinfo -------------------------------------------------------------------------------

/// What `devinfo` shows of one device.
struct DevInfo {
    name: String,
    interface: String,
    attr: DeviceAttr,
    port: PortAttr,
    gids: Vec<std::net::IpAddr>,
}

impl DevInfo {
    fn of(c: &Chosen) -> Result<DevInfo, String> {
        let Some(d) = &c.device else {
            return Err(format!("{} is not a device of this host (no interface has that name now)", c.name));
        };
        Ok(DevInfo {
            name: d.name().to_string(),
            interface: d.interface().to_string(),
            attr: d.attributes(),
            port: d.port_attributes(1).map_err(|e| e.to_string())?,
            gids: d.addresses().to_vec(),
        })
    }
}

/// `xxxx:xxxx:xxxx:xxxx`, as `ibv_devinfo` prints a GUID.
fn guid_str(guid: u64) -> String {
    format!("{:04x}:{:04x}:{:04x}:{:04x}", guid >> 48, (guid >> 32) & 0xffff, (guid >> 16) & 0xffff, guid & 0xffff)
}

/// A count the device does not limit.
fn limit(v: Option<u32>) -> String {
    v.map_or_else(|| "unlimited".to_string(), |v| v.to_string())
}

/// The GID as `ibv_devinfo` prints a RoCE v2 GID (`inet_ntop` of the 16 bytes).
fn gid_str(ip: std::net::IpAddr) -> String {
    match ip {
        std::net::IpAddr::V4(v4) => v4.to_ipv6_mapped().to_string(),
        std::net::IpAddr::V6(v6) => v6.to_string(),
    }
}

fn devinfo_text(i: &DevInfo, verbose: bool) -> String {
    let a = &i.attr;
    let p = &i.port;
    let mut o = String::new();
    let _ = writeln!(o, "hca_id:\t{}", i.name);
    let _ = writeln!(o, "\ttransport:\t\t\tInfiniBand (0)");
    let _ = writeln!(o, "\tfw_ver:\t\t\t\t{}", a.fw_ver);
    let _ = writeln!(o, "\tnode_guid:\t\t\t{}", guid_str(a.node_guid));
    let _ = writeln!(o, "\tsys_image_guid:\t\t\t{}", guid_str(a.sys_image_guid));
    let _ = writeln!(o, "\tvendor_id:\t\t\t0x{:04x}", a.vendor_id);
    let _ = writeln!(o, "\tvendor_part_id:\t\t\t{}", a.vendor_part_id);
    let _ = writeln!(o, "\thw_ver:\t\t\t\t0x{:X}", a.hw_ver);
    let _ = writeln!(o, "\tphys_port_cnt:\t\t\t{}", a.phys_port_cnt);
    if verbose {
        let _ = writeln!(o, "\tmax_mr_size:\t\t\t0x{:x}", a.max_mr_size);
        let _ = writeln!(o, "\tmax_qp:\t\t\t\t{}", a.max_qp);
        let _ = writeln!(o, "\tmax_qp_wr:\t\t\t{}", a.max_qp_wr);
        let _ = writeln!(o, "\tmax_sge:\t\t\t{}", a.max_sge);
        let _ = writeln!(o, "\tmax_sge_rd:\t\t\t{}", a.max_sge_rd);
        let _ = writeln!(o, "\tmax_cq:\t\t\t\t{}", limit(a.max_cq));
        let _ = writeln!(o, "\tmax_cqe:\t\t\t{}", a.max_cqe);
        let _ = writeln!(o, "\tmax_mr:\t\t\t\t{}", a.max_mr);
        let _ = writeln!(o, "\tmax_pd:\t\t\t\t{}", limit(a.max_pd));
        let _ = writeln!(o, "\tmax_qp_rd_atom:\t\t\t{}", a.max_qp_rd_atom);
        let _ = writeln!(o, "\tmax_qp_init_rd_atom:\t\t{}", a.max_qp_init_rd_atom);
        let _ = writeln!(o, "\tatomic_cap:\t\t\t{} ({})", atomic_cap_str(a.atomic_cap), a.atomic_cap as u8);
        let _ = writeln!(o, "\tmax_mw:\t\t\t\t{}", a.max_mw);
        let _ = writeln!(o, "\tmax_mcast_grp:\t\t\t{}", a.max_mcast_grp);
        let _ = writeln!(o, "\tmax_mcast_qp_attach:\t\t{}", a.max_mcast_qp_attach);
        let _ = writeln!(o, "\tmax_total_mcast_qp_attach:\t{}", a.max_total_mcast_qp_attach);
        let _ = writeln!(o, "\tmax_ah:\t\t\t\t{}", limit(a.max_ah));
        let _ = writeln!(o, "\tmax_srq:\t\t\t{}", limit(a.max_srq));
        let _ = writeln!(o, "\tmax_srq_wr:\t\t\t{}", a.max_srq_wr);
        let _ = writeln!(o, "\tmax_srq_sge:\t\t\t{}", a.max_srq_sge);
        let _ = writeln!(o, "\tmax_pkeys:\t\t\t{}", a.max_pkeys);
        let _ = writeln!(o, "\tmax_inline_data:\t\t{}", a.max_inline_data);
    }
    let _ = writeln!(o, "\t\tport:\t1");
    let _ = writeln!(o, "\t\t\tstate:\t\t\t{} ({})", p.state.name(), p.state as u8);
    let _ = writeln!(o, "\t\t\tmax_mtu:\t\t{} ({})", p.max_mtu.bytes(), p.max_mtu as u8);
    let _ = writeln!(o, "\t\t\tactive_mtu:\t\t{} ({})", p.active_mtu.bytes(), p.active_mtu as u8);
    let _ = writeln!(o, "\t\t\tsm_lid:\t\t\t0");
    let _ = writeln!(o, "\t\t\tport_lid:\t\t0");
    let _ = writeln!(o, "\t\t\tport_lmc:\t\t0x00");
    let _ = writeln!(o, "\t\t\tlink_layer:\t\tEthernet");
    if verbose {
        let _ = writeln!(o, "\t\t\tmax_msg_sz:\t\t0x{:x}", p.max_msg_sz);
        let _ = writeln!(o, "\t\t\tpkey_tbl_len:\t\t{}", p.pkey_tbl_len);
        let _ = writeln!(o, "\t\t\tgid_tbl_len:\t\t{}", p.gid_tbl_len);
        let _ = writeln!(o, "\t\t\tphys_state:\t\t{} ({})", p.phys_state.name(), p.phys_state as u8);
    }
    // ibv_devinfo lists the GIDs only with -v; they are what a softrdma user picks a `-g`
    // index from, so they are always shown.
    for (index, ip) in i.gids.iter().enumerate() {
        let _ = writeln!(o, "\t\t\tGID[{index:>3}]:\t\t{}, RoCE v2", gid_str(*ip));
    }
    o.push('\n');
    o
}

fn atomic_cap_str(cap: softrdma::AtomicCap) -> &'static str {
    match cap {
        softrdma::AtomicCap::None => "ATOMIC_NONE",
        softrdma::AtomicCap::Hca => "ATOMIC_HCA",
        softrdma::AtomicCap::Glob => "ATOMIC_GLOB",
    }
}

#[derive(Serialize)]
struct DevinfoJson {
    devices: Vec<DevinfoJsonDevice>,
}

#[derive(Serialize)]
struct DevinfoJsonDevice {
    hca_id: String,
    interface: String,
    transport: &'static str,
    transport_value: u8,
    fw_ver: String,
    node_guid: String,
    sys_image_guid: String,
    vendor_id: u32,
    vendor_part_id: u32,
    hw_ver: u32,
    phys_port_cnt: u8,
    /// The engine's limits; `null` where it sets none (bounded by memory only).
    limits: Limits,
    ports: Vec<PortJson>,
}

#[derive(Serialize)]
struct Limits {
    max_mr_size: u64,
    max_qp: u32,
    max_qp_wr: u32,
    max_sge: u32,
    max_sge_rd: u32,
    max_cq: Option<u32>,
    max_cqe: u32,
    max_mr: u32,
    max_pd: Option<u32>,
    max_qp_rd_atom: u8,
    max_qp_init_rd_atom: u8,
    atomic_cap: &'static str,
    max_mw: u32,
    max_mcast_grp: u32,
    max_mcast_qp_attach: u32,
    max_total_mcast_qp_attach: u32,
    max_ah: Option<u32>,
    max_srq: Option<u32>,
    max_srq_wr: u32,
    max_srq_sge: u32,
    max_pkeys: u16,
    max_inline_data: u32,
}

#[derive(Serialize)]
struct PortJson {
    port: u8,
    state: &'static str,
    state_value: u8,
    phys_state: &'static str,
    phys_state_value: u8,
    max_mtu: u32,
    active_mtu: u32,
    link_layer: &'static str,
    max_msg_sz: u32,
    pkey_tbl_len: u16,
    gid_tbl_len: u32,
    gids: Vec<GidJson>,
}

#[derive(Serialize)]
struct GidJson {
    index: usize,
    gid: String,
    #[serde(rename = "type")]
    gid_type: &'static str,
}

impl DevinfoJsonDevice {
    fn new(i: &DevInfo) -> Self {
        let (a, p) = (&i.attr, &i.port);
        DevinfoJsonDevice {
            hca_id: i.name.clone(),
            interface: i.interface.clone(),
            transport: "InfiniBand",
            transport_value: 0,
            fw_ver: a.fw_ver.clone(),
            node_guid: format!("{:016x}", a.node_guid),
            sys_image_guid: format!("{:016x}", a.sys_image_guid),
            vendor_id: a.vendor_id,
            vendor_part_id: a.vendor_part_id,
            hw_ver: a.hw_ver,
            phys_port_cnt: a.phys_port_cnt,
            limits: Limits {
                max_mr_size: a.max_mr_size,
                max_qp: a.max_qp,
                max_qp_wr: a.max_qp_wr,
                max_sge: a.max_sge,
                max_sge_rd: a.max_sge_rd,
                max_cq: a.max_cq,
                max_cqe: a.max_cqe,
                max_mr: a.max_mr,
                max_pd: a.max_pd,
                max_qp_rd_atom: a.max_qp_rd_atom,
                max_qp_init_rd_atom: a.max_qp_init_rd_atom,
                atomic_cap: atomic_cap_str(a.atomic_cap),
                max_mw: a.max_mw,
                max_mcast_grp: a.max_mcast_grp,
                max_mcast_qp_attach: a.max_mcast_qp_attach,
                max_total_mcast_qp_attach: a.max_total_mcast_qp_attach,
                max_ah: a.max_ah,
                max_srq: a.max_srq,
                max_srq_wr: a.max_srq_wr,
                max_srq_sge: a.max_srq_sge,
                max_pkeys: a.max_pkeys,
                max_inline_data: a.max_inline_data,
            },
            ports: vec![PortJson {
                port: 1,
                state: p.state.name(),
                state_value: p.state as u8,
                phys_state: p.phys_state.name(),
                phys_state_value: p.phys_state as u8,
                max_mtu: p.max_mtu.bytes(),
                active_mtu: p.active_mtu.bytes(),
                link_layer: "Ethernet",
                max_msg_sz: p.max_msg_sz,
                pkey_tbl_len: p.pkey_tbl_len,
                gid_tbl_len: p.gid_tbl_len,
                gids: i
                    .gids
                    .iter()
                    .enumerate()
                    .map(|(index, ip)| GidJson { index, gid: gid_str(*ip), gid_type: "RoCE v2" })
                    .collect(),
            }],
        }
    }
}

// ---- stats ---------------------------------------------------------------------------------

/// Counters by name, in the order first seen (this build's order first).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Tally(Vec<(String, u64)>);

impl Tally {
    fn zero() -> Self {
        Tally(softrdma::Counters::default().named().iter().map(|&(n, _)| (n.to_string(), 0)).collect())
    }

    fn add(&mut self, counters: &[(String, u64)]) {
        for (name, v) in counters {
            match self.0.iter_mut().find(|(n, _)| n == name) {
                Some((_, total)) => *total = total.wrapping_add(*v),
                None => self.0.push((name.clone(), *v)),
            }
        }
    }
}

impl Serialize for Tally {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (n, v) in &self.0 {
            m.serialize_entry(n, v)?;
        }
        m.end()
    }
}

#[derive(Serialize)]
struct StatsReport {
    /// Where the counters were read from.
    dir: String,
    devices: Vec<DeviceStats>,
    /// Files of processes that are gone, removed by this run.
    stale_removed: usize,
}

#[derive(Serialize)]
struct DeviceStats {
    device: String,
    processes: usize,
    contexts: usize,
    counters: Tally,
    per_process: Vec<ProcessStats>,
}

#[derive(Serialize)]
struct ProcessStats {
    pid: u32,
    command: String,
    contexts: usize,
    ports: Vec<u16>,
    counters: Tally,
}

impl StatsReport {
    fn new(chosen: &[Chosen], live: &[Published], stale: usize) -> Self {
        let devices = chosen
            .iter()
            .map(|c| {
                let mut by_pid: BTreeMap<u32, ProcessStats> = BTreeMap::new();
                let mut counters = Tally::zero();
                let mut contexts = 0;
                for p in live.iter().filter(|p| p.device == c.name) {
                    contexts += 1;
                    counters.add(&p.counters);
                    let entry = by_pid.entry(p.pid).or_insert_with(|| ProcessStats {
                        pid: p.pid,
                        command: p.command.clone(),
                        contexts: 0,
                        ports: Vec::new(),
                        counters: Tally::zero(),
                    });
                    entry.contexts += 1;
                    entry.counters.add(&p.counters);
                    if !entry.ports.contains(&p.port) {
                        entry.ports.push(p.port);
                    }
                }
                DeviceStats {
                    device: c.name.clone(),
                    processes: by_pid.len(),
                    contexts,
                    counters,
                    per_process: by_pid.into_values().collect(),
                }
            })
            .collect();
        StatsReport { dir: stats::stats_dir().display().to_string(), devices, stale_removed: stale }
    }
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// One counter a line, the values right-aligned in one column: the names' column as wide
/// as the longest name and a space (24 at least), so that none pushes its value out of line
/// (`resp_remote_access_errors` did).
fn tally_text(o: &mut String, t: &Tally, indent: &str) {
    let width = t.0.iter().map(|(name, _)| name.len() + 1).max().unwrap_or(0).max(24);
    for (name, v) in &t.0 {
        let _ = writeln!(o, "{indent}{name:<width$}{v:>16}");
    }
}

fn stats_text(r: &StatsReport, verbose: bool) -> String {
    let mut o = String::new();
    for d in &r.devices {
        if d.contexts == 0 {
            let _ = writeln!(o, "{}: no process has it open", d.device);
            continue;
        }
        let _ = writeln!(
            o,
            "{}: {}, {}",
            d.device,
            plural(d.processes, "process", "processes"),
            plural(d.contexts, "context", "contexts")
        );
        tally_text(&mut o, &d.counters, "    ");
        if verbose {
            for p in &d.per_process {
                let ports: Vec<String> = p.ports.iter().map(u16::to_string).collect();
                let _ = writeln!(
                    o,
                    "  pid {} ({}): {}, UDP port {}",
                    p.pid,
                    p.command,
                    plural(p.contexts, "context", "contexts"),
                    ports.join(", ")
                );
                tally_text(&mut o, &p.counters, "    ");
            }
        }
    }
    if verbose && r.stale_removed > 0 {
        let _ = writeln!(
            o,
            "({} of processes that are gone removed from {})",
            plural(r.stale_removed, "file", "files"),
            r.dir
        );
    }
    o
}

// ---- output --------------------------------------------------------------------------------

pub(crate) fn json<T: Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_default() + "\n"
}

/// Writes `out` to standard output; a closed pipe (`| head`) is not an error.
pub(crate) fn emit(out: &str) -> ExitCode {
    let mut stdout = io::stdout().lock();
    match stdout.write_all(out.as_bytes()).and_then(|()| stdout.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => failure("output", &e.to_string()),
    }
}

pub(crate) fn warn(command: &str, message: &str) {
    #[allow(clippy::print_stderr)]
    {
        eprintln!("softrdma {command}: {message}");
    }
}

pub(crate) fn failure(command: &str, message: &str) -> ExitCode {
    warn(command, message);
    ExitCode::FAILURE
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;

    fn lo_like() -> DevInfo {
        let d = Device::with_addresses("lo", vec![IpAddr::from([127, 0, 0, 1]), "fd00::5".parse().unwrap()]);
        DevInfo {
            name: "softrdma_lo".into(),
            interface: "lo".into(),
            attr: d.attributes(),
            port: d.port_attributes(1).unwrap(),
            gids: d.addresses().to_vec(),
        }
    }

    #[test]
    fn guids_print_as_ibv_devinfo_and_ibv_devices_do() {
        assert_eq!(guid_str(0x5054_00ff_fe12_3456), "5054:00ff:fe12:3456");
        assert_eq!(guid_str(0x0200_00ff_fe00_0000), "0200:00ff:fe00:0000");
        let d = Device::with_addresses("lo", vec![IpAddr::from([127, 0, 0, 1])]);
        let text = devices_text(std::slice::from_ref(&d));
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "    device          \t   node GUID");
        assert_eq!(lines[1], "    ------          \t----------------");
        assert_eq!(lines[2], format!("    softrdma_lo     \t{:016x}", d.node_guid()));
    }

    #[test]
    fn gids_print_as_inet_ntop_with_their_type() {
        assert_eq!(gid_str(IpAddr::from([127, 0, 0, 1])), "::ffff:127.0.0.1");
        assert_eq!(gid_str("fd00::5".parse().unwrap()), "fd00::5");
        let text = devinfo_text(&lo_like(), false);
        assert!(text.contains("\t\t\tGID[  0]:\t\t::ffff:127.0.0.1, RoCE v2\n"), "{text}");
        assert!(text.contains("\t\t\tGID[  1]:\t\tfd00::5, RoCE v2\n"), "{text}");
    }

    #[test]
    fn devinfo_follows_ibv_devinfo_line_for_line() {
        let text = devinfo_text(&lo_like(), false);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "hca_id:\tsoftrdma_lo");
        assert_eq!(lines[1], "\ttransport:\t\t\tInfiniBand (0)");
        assert_eq!(lines[5], "\tvendor_id:\t\t\t0xffffff");
        assert_eq!(lines[8], "\tphys_port_cnt:\t\t\t1");
        assert_eq!(lines[9], "\t\tport:\t1");
        assert_eq!(lines[10], "\t\t\tstate:\t\t\tPORT_ACTIVE (4)");
        assert_eq!(lines[11], "\t\t\tmax_mtu:\t\t4096 (5)");
        assert!(lines[12].starts_with("\t\t\tactive_mtu:\t\t"));
        assert_eq!(lines[16], "\t\t\tlink_layer:\t\tEthernet");
        assert!(!text.contains("max_qp"), "limits only with -v");
        let verbose = devinfo_text(&lo_like(), true);
        for line in [
            "\tmax_qp:\t\t\t\t8192\n",
            "\tmax_qp_wr:\t\t\t16384\n",
            "\tmax_sge:\t\t\t32\n",
            "\tmax_cq:\t\t\t\tunlimited\n",
            "\tmax_cqe:\t\t\t1048576\n",
            "\tmax_qp_rd_atom:\t\t\t128\n",
            "\tatomic_cap:\t\t\tATOMIC_HCA (1)\n",
            "\tmax_inline_data:\t\t256\n",
            "\t\t\tmax_msg_sz:\t\t0x80000000\n",
            "\t\t\tphys_state:\t\tLINK_UP (5)\n",
        ] {
            assert!(verbose.contains(line), "{line:?} missing from\n{verbose}");
        }
    }

    fn published(pid: u32, device: &str, port: u16, sent: u64) -> Published {
        Published {
            pid,
            command: format!("app{pid}"),
            device: device.into(),
            port,
            counters: vec![
                ("sent_packets".into(), sent),
                ("rcvd_packets".into(), 1),
                ("future_counter".into(), 5),
                ("resp_remote_access_errors".into(), 0),
            ],
        }
    }

    #[test]
    fn stats_sum_per_device_and_per_process() {
        let chosen = [
            Chosen { name: "softrdma_lo".into(), device: None },
            Chosen { name: "softrdma_eth0".into(), device: None },
        ];
        let live = [
            published(10, "softrdma_lo", 4791, 100),
            published(10, "softrdma_lo", 5000, 20),
            published(11, "softrdma_lo", 4791, 3),
            published(12, "softrdma_eth1", 4791, 1000),
        ];
        let r = StatsReport::new(&chosen, &live, 2);
        let lo = &r.devices[0];
        assert_eq!((lo.processes, lo.contexts), (2, 3));
        let get = |t: &Tally, n: &str| t.0.iter().find(|(k, _)| k == n).map(|&(_, v)| v);
        assert_eq!(get(&lo.counters, "sent_packets"), Some(123));
        assert_eq!(get(&lo.counters, "rcvd_packets"), Some(3));
        assert_eq!(get(&lo.counters, "future_counter"), Some(15), "a counter this build does not know is summed too");
        assert_eq!(get(&lo.counters, "ack_timeouts"), Some(0));
        assert_eq!(lo.per_process[0].pid, 10);
        assert_eq!(get(&lo.per_process[0].counters, "sent_packets"), Some(120));
        assert_eq!(lo.per_process[0].ports, [4791, 5000]);
        assert_eq!(r.devices[1].contexts, 0);

        let text = stats_text(&r, true);
        assert!(text.contains("softrdma_lo: 2 processes, 3 contexts\n"), "{text}");
        assert!(text.contains(&format!("    {:<26}{:>16}\n", "sent_packets", 123)), "{text}");
        // Every counter's value ends in the same column, the longest name's included.
        let widths: std::collections::BTreeSet<usize> =
            text.lines().take_while(|l| !l.starts_with("  pid")).skip(1).map(str::len).collect();
        assert_eq!(widths.len(), 1, "values out of line: {text}");
        assert!(text.contains("  pid 10 (app10): 2 contexts, UDP port 4791, 5000\n"), "{text}");
        assert!(text.contains("softrdma_eth0: no process has it open\n"), "{text}");
        assert!(text.contains("(2 files of processes that are gone removed from"), "{text}");
        assert!(!stats_text(&r, false).contains("pid 10"), "processes only with -v");

        let v: serde_json::Value = serde_json::from_str(&json(&r)).unwrap();
        assert_eq!(v["devices"][0]["counters"]["sent_packets"], 123);
        assert_eq!(v["devices"][0]["per_process"][1]["pid"], 11);
        assert_eq!(v["stale_removed"], 2);
    }
}
