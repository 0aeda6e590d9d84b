//! `softrdma res`: what `rdma res show` shows of a kernel device, for every live softrdma
//! context of this host (`softrdma::res` asks each one on its socket).
//!
//! The text follows iproute2's `rdma res show qp|cq|mr|pd|srq|cm_id`: one line per object,
//! `link DEV/PORT` first and `pid N comm NAME` last, attribute names as rdma prints them
//! (`lqpn`, `rqpn`, `sq-psn`, `rq-psn`, `pdn`, `cqn`, `mrlen`...) and softrdma's own after
//! them (`unacked-psn`, `inflight-msgs`, `ack-timeouts`...). QPNs and PSNs are hexadecimal.

use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use serde::Serialize;
use serde_json::{Map, Value};
use softrdma::res::{self, Reply, Snapshot};

use crate::devices::{choose, emit, failure, json, warn};

/// `softrdma res`.
#[derive(clap::Args, Debug)]
pub(crate) struct ResArgs {
    /// What to list: one line per object (default: a count of each per device, as `rdma res`).
    #[arg(value_enum)]
    object: Option<Object>,
    /// Only this device: `softrdma_lo`, or its interface, `lo`.
    #[arg(short = 'd', long = "ib-dev", value_name = "DEV")]
    device: Option<String>,
    /// Only the contexts of this process.
    #[arg(long, value_name = "PID")]
    pid: Option<u32>,
    /// JSON instead of text: one object (per refresh with --watch).
    #[arg(long)]
    json: bool,
    /// Show it again every SECS seconds (default 1) until interrupted (Ctrl-C).
    #[arg(long, value_name = "SECS", num_args = 0..=1, default_missing_value = "1")]
    watch: Option<f64>,
    /// With --watch: stop after N refreshes.
    #[arg(long, value_name = "N", requires = "watch")]
    count: Option<u64>,
}

/// The objects `softrdma res` lists.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Object {
    /// Queue pairs: type, state, PSNs, what is in flight, retries, the peer.
    Qp,
    /// Completion queues: depth, completions queued.
    Cq,
    /// Memory regions: keys (for your own processes, or as root), length, access.
    Mr,
    /// Protection domains.
    Pd,
    /// Shared receive queues.
    Srq,
    /// rdma_cm IDs: state, addresses, port space, QP.
    #[value(name = "cm_id", alias = "cm-id")]
    CmId,
}

/// Runs `softrdma res`.
pub(crate) fn res(args: &ResArgs) -> ExitCode {
    if let Some(secs) = args.watch
        && !(secs.is_finite() && secs > 0.0 && secs <= 86_400.0)
    {
        warn(
            "res",
            &format!("--watch {secs}: give a number of seconds between 0 and 86400 (see `softrdma res --help`)"),
        );
        return ExitCode::from(2);
    }
    let Some(secs) = args.watch else { return once(args) };
    let period = Duration::from_secs_f64(secs);
    let mut shown = 0u64;
    // Until interrupted (SIGINT ends the process), or --count refreshes.
    loop {
        if !args.json {
            let title = match args.object {
                Some(o) => format!("softrdma res {}", object_name(o)),
                None => "softrdma res".to_string(),
            };
            let _ = emit(&format!("Every {secs}s: {title}\n"));
        }
        let code = once(args);
        shown += 1;
        if code != ExitCode::SUCCESS || args.count.is_some_and(|n| shown >= n) {
            return code;
        }
        std::thread::sleep(period);
    }
}

fn object_name(o: Object) -> &'static str {
    match o {
        Object::Qp => "qp",
        Object::Cq => "cq",
        Object::Mr => "mr",
        Object::Pd => "pd",
        Object::Srq => "srq",
        Object::CmId => "cm_id",
    }
}

/// One look: asks the contexts, prints what they answered, warns of those that did not.
fn once(args: &ResArgs) -> ExitCode {
    // The device named must exist (here, or in some process's counters).
    let published: Vec<String> = match softrdma::stats::scan() {
        Ok(s) => s.live.iter().map(|p| p.device.clone()).collect(),
        Err(e) => return failure("res", &format!("reading {}: {e}", softrdma::stats::stats_dir().display())),
    };
    let chosen = match choose("res", args.device.as_deref(), &published) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let names: Vec<String> = chosen.iter().map(|c| c.name.clone()).collect();
    let scan = match res::scan(|p| args.pid.is_none_or(|pid| p.pid == pid) && names.contains(&p.device)) {
        Ok(s) => s,
        Err(e) => return failure("res", &format!("reading {}: {e}", softrdma::stats::stats_dir().display())),
    };
    for (path, why) in &scan.skipped {
        warn("res", &format!("skipped {}: {why}", path.display()));
    }
    if scan.other_users > 0 {
        warn(
            "res",
            &format!(
                "{} contexts of other users not shown (they answer their own user and root only)",
                scan.other_users
            ),
        );
    }
    let (answered, unanswered): (Vec<&Reply>, Vec<&Reply>) = scan.contexts.iter().partition(|r| r.result.is_ok());
    let snaps: Vec<&Snapshot> = answered.iter().filter_map(|r| r.result.as_ref().ok()).collect();
    let out = if args.json {
        let unanswered: Vec<Unanswered> = unanswered.iter().map(|r| Unanswered::of(r)).collect();
        json(&report_json(args.object, &names, &snaps, unanswered))
    } else {
        for r in &unanswered {
            let p = &r.published;
            let why = r.result.as_ref().err().map_or("", String::as_str);
            warn("res", &format!("pid {} ({}) {} UDP port {}: {why}; skipped", p.pid, p.command, p.device, p.port));
        }
        match args.object {
            None => summary_text(&names, &snaps),
            Some(o) => snaps.iter().map(|s| object_text(o, s)).collect(),
        }
    };
    emit(&out)
}

// ---- text ------------------------------------------------------------------------------------

/// `0: softrdma_lo: pd 2 cq 2 qp 2 cm_id 0 mr 2 srq 0 ctx 2`, as `rdma res` counts, per
/// device (`ctx`: contexts, one per open device per process).
fn summary_text(devices: &[String], snaps: &[&Snapshot]) -> String {
    let mut o = String::new();
    for (i, d) in devices.iter().enumerate() {
        let mine: Vec<&&Snapshot> = snaps.iter().filter(|s| s.device == *d).collect();
        let sum = |f: fn(&Snapshot) -> usize| mine.iter().map(|s| f(s)).sum::<usize>();
        let _ = writeln!(
            o,
            "{i}: {d}: pd {} cq {} qp {} cm_id {} mr {} srq {} ctx {}",
            sum(|s| s.pds.len()),
            sum(|s| s.cqs.len()),
            sum(|s| s.qps.len()),
            sum(|s| s.cm_ids.len()),
            sum(|s| s.mrs.len()),
            sum(|s| s.srqs.len()),
            mine.len()
        );
    }
    o
}

fn qpn(v: u32) -> String {
    format!("{v:#08x}")
}

/// The lines of one context's objects of kind `o`.
fn object_text(o: Object, s: &Snapshot) -> String {
    let link = format!("link {}/1", s.device);
    let tail = format!("pid {} comm {}", s.pid, s.command);
    let mut out = String::new();
    match o {
        Object::Qp => {
            for q in &s.qps {
                let mut l = format!("{link} lqpn {}", qpn(q.lqpn));
                if let Some(p) = &q.peer {
                    let _ = write!(l, " rqpn {}", qpn(p.rqpn));
                }
                let _ = write!(
                    l,
                    " type {} state {} sq-psn {} rq-psn {} unacked-psn {} pdn {} scqn {} rcqn {}",
                    q.qp_type,
                    q.state,
                    qpn(q.sq_psn),
                    qpn(q.rq_psn),
                    qpn(q.unacked_psn),
                    q.pdn,
                    q.scqn,
                    q.rcqn
                );
                if let Some(srqn) = q.srqn {
                    let _ = write!(l, " srqn {srqn}");
                }
                let _ = write!(
                    l,
                    " path-mtu {} sq {}/{} rq {}/{} inflight-msgs {} inflight-pkts {} retries {}/{} rnr-retries {}/{} \
                     ack-timeouts {} retransmits {} rnr-naks-rcvd {} rnr-naks-sent {} naks-rcvd {} naks-sent {}",
                    q.path_mtu,
                    q.sq_posted,
                    q.sq_depth,
                    q.rq_posted,
                    q.rq_depth,
                    q.msgs_in_flight,
                    q.pkts_in_flight,
                    q.retries_left,
                    q.retry_cnt,
                    q.rnr_retries_left,
                    q.rnr_retry,
                    q.ack_timeouts,
                    q.retransmitted_pkts,
                    q.rnr_naks_rcvd,
                    q.rnr_naks_sent,
                    q.naks_rcvd,
                    q.naks_sent
                );
                if q.rnr_waiting {
                    l.push_str(" rnr-waiting");
                }
                if let Some(p) = &q.peer {
                    let _ = write!(l, " dgid {}", p.gid);
                    if let Some(port) = p.udp_port {
                        let _ = write!(l, " dport {port}");
                    }
                }
                if q.qp_type == "UD" {
                    let _ = write!(l, " qkey {:#x}", q.qkey);
                }
                if q.authenticated {
                    l.push_str(" authenticated");
                }
                let _ = writeln!(out, "{l} {tail}");
            }
        }
        Object::Cq => {
            for c in &s.cqs {
                let armed = if c.armed { " armed" } else { "" };
                let overflowed = if c.overflowed { " overflowed" } else { "" };
                let _ = writeln!(
                    out,
                    "{link} cqn {} cqe {} entries {} users {}{armed}{overflowed} {tail}",
                    c.cqn, c.cqe, c.entries, c.users
                );
            }
        }
        Object::Mr => {
            for m in &s.mrs {
                let mut l = format!("{link} mrn {}", m.mrn);
                if let (Some(lkey), Some(rkey)) = (m.lkey, m.rkey) {
                    let _ = write!(l, " rkey {rkey:#x} lkey {lkey:#x}");
                }
                if let Some(iova) = m.iova {
                    let _ = write!(l, " iova {iova:#x}");
                }
                let _ = writeln!(out, "{l} mrlen {} access {} pdn {} {tail}", m.mrlen, m.access, m.pdn);
            }
        }
        Object::Pd => {
            for p in &s.pds {
                let _ = writeln!(out, "{link} pdn {} users {} {tail}", p.pdn, p.users);
            }
        }
        Object::Srq => {
            for q in &s.srqs {
                let mut l = format!(
                    "{link} srqn {} type {} wqe {} posted {} max-sge {} limit {} pdn {}",
                    q.srqn, q.srq_type, q.wqe, q.posted, q.max_sge, q.limit, q.pdn
                );
                if let (Some(x), Some(c)) = (q.xrcd, q.cqn) {
                    let _ = write!(l, " xrcdn {x} cqn {c}");
                }
                if !q.lqpns.is_empty() {
                    let list: Vec<String> = q.lqpns.iter().map(|&n| qpn(n)).collect();
                    let _ = write!(l, " lqpn {}", list.join(","));
                }
                let _ = writeln!(out, "{l} {tail}");
            }
        }
        Object::CmId => {
            for c in &s.cm_ids {
                let mut l = format!("{link} cm-idn {}", c.cm_idn);
                if let Some(n) = c.lqpn {
                    let _ = write!(l, " lqpn {}", qpn(n));
                }
                if let Some(n) = c.rqpn {
                    let _ = write!(l, " rqpn {}", qpn(n));
                }
                let _ = write!(l, " qp-type {} state {} cm-state {} ps {}", c.qp_type, c.state, c.cm_state, c.ps);
                if c.passive {
                    l.push_str(" passive");
                }
                if let Some(a) = &c.src_addr {
                    let _ = write!(l, " src-addr {a}");
                }
                if let Some(a) = &c.dst_addr {
                    let _ = write!(l, " dst-addr {a}");
                }
                let _ = writeln!(out, "{l} {tail}");
            }
        }
    }
    if s.truncated {
        let _ =
            writeln!(out, "{link} ... more objects than an answer holds ({} of each at most) {tail}", res::MAX_ROWS);
    }
    out
}

// ---- JSON ------------------------------------------------------------------------------------

/// A context that did not answer, and why.
#[derive(Serialize)]
struct Unanswered {
    pid: u32,
    command: String,
    device: String,
    port: u16,
    error: String,
}

impl Unanswered {
    fn of(r: &Reply) -> Self {
        let p = &r.published;
        Unanswered {
            pid: p.pid,
            command: p.command.clone(),
            device: p.device.clone(),
            port: p.port,
            error: r.result.as_ref().err().cloned().unwrap_or_default(),
        }
    }
}

/// Without an object: each device's counts and every context's whole snapshot. With one:
/// its rows, each with the context's `device`, `port`, `pid` and `comm`, under the
/// object's name in the plural (`qps`, `cm_ids`).
fn report_json(object: Option<Object>, devices: &[String], snaps: &[&Snapshot], unanswered: Vec<Unanswered>) -> Value {
    let mut top = Map::new();
    match object {
        None => {
            let counts: Vec<Value> = devices
                .iter()
                .map(|d| {
                    let mine: Vec<&&Snapshot> = snaps.iter().filter(|s| s.device == *d).collect();
                    let sum = |f: fn(&Snapshot) -> usize| mine.iter().map(|s| f(s)).sum::<usize>();
                    serde_json::json!({
                        "device": d,
                        "pd": sum(|s| s.pds.len()),
                        "cq": sum(|s| s.cqs.len()),
                        "qp": sum(|s| s.qps.len()),
                        "cm_id": sum(|s| s.cm_ids.len()),
                        "mr": sum(|s| s.mrs.len()),
                        "srq": sum(|s| s.srqs.len()),
                        "ctx": mine.len(),
                    })
                })
                .collect();
            top.insert("devices".into(), Value::Array(counts));
            top.insert("contexts".into(), serde_json::to_value(snaps).unwrap_or_default());
        }
        Some(o) => {
            let key = format!("{}s", object_name(o));
            let mut rows = Vec::new();
            for s in snaps {
                let table = match o {
                    Object::Qp => serde_json::to_value(&s.qps),
                    Object::Cq => serde_json::to_value(&s.cqs),
                    Object::Mr => serde_json::to_value(&s.mrs),
                    Object::Pd => serde_json::to_value(&s.pds),
                    Object::Srq => serde_json::to_value(&s.srqs),
                    Object::CmId => serde_json::to_value(&s.cm_ids),
                };
                let Ok(Value::Array(table)) = table else { continue };
                for mut row in table {
                    if let Value::Object(m) = &mut row {
                        m.insert("device".into(), s.device.clone().into());
                        m.insert("port".into(), s.port.into());
                        m.insert("pid".into(), s.pid.into());
                        m.insert("comm".into(), s.command.clone().into());
                        if o == Object::Mr {
                            m.insert("keys_shown".into(), s.keys_shown.into());
                        }
                    }
                    rows.push(row);
                }
            }
            top.insert(key, Value::Array(rows));
        }
    }
    top.insert("unanswered".into(), serde_json::to_value(unanswered).unwrap_or_default());
    Value::Object(top)
}

#[cfg(test)]
mod tests {
    use softrdma::res::{CmIdRow, CqRow, MrRow, PdRow, PeerRow, QpRow};

    use super::*;

    fn snapshot(keys: bool) -> Snapshot {
        Snapshot {
            version: res::ANSWER_VERSION,
            pid: 1234,
            uid: 1000,
            command: "app".into(),
            device: "softrdma_lo".into(),
            port: 4791,
            keys_shown: keys,
            truncated: false,
            pds: vec![PdRow { pdn: 0, users: 2 }],
            cqs: vec![CqRow { cqn: 0, cqe: 256, entries: 3, users: 1, armed: true, overflowed: false }],
            qps: vec![QpRow {
                lqpn: 0x2000,
                qp_type: "RC".into(),
                state: "RTS".into(),
                pdn: 0,
                scqn: 0,
                rcqn: 0,
                srqn: None,
                path_mtu: 4096,
                sq_psn: 0x66,
                unacked_psn: 0x64,
                rq_psn: 0xc8,
                sq_posted: 1,
                sq_depth: 128,
                rq_posted: 0,
                rq_depth: 128,
                msgs_in_flight: 1,
                pkts_in_flight: 2,
                rd_atomic_in_flight: 0,
                timeout: 14,
                retry_cnt: 7,
                retries_left: 6,
                rnr_retry: 7,
                rnr_retries_left: 7,
                rnr_waiting: false,
                ack_timeouts: 1,
                retransmitted_pkts: 2,
                rnr_naks_rcvd: 0,
                rnr_naks_sent: 0,
                naks_rcvd: 0,
                naks_sent: 0,
                peer: Some(PeerRow {
                    gid: "::ffff:127.0.0.1".into(),
                    rqpn: 0x4000,
                    local_ip: Some("127.0.0.1".into()),
                    udp_port: Some(4791),
                    peer_udp_port: Some(4791),
                }),
                qkey: 0,
                authenticated: false,
            }],
            mrs: vec![MrRow {
                mrn: 0,
                pdn: 0,
                lkey: keys.then_some(0x1234),
                rkey: keys.then_some(0xabcd),
                iova: keys.then_some(0x7f00_0000_0000),
                mrlen: 4096,
                access: "LOCAL_WRITE".into(),
                windows: 0,
            }],
            srqs: vec![],
            cm_ids: vec![CmIdRow {
                cm_idn: 1,
                state: "LISTEN".into(),
                cm_state: "LISTEN".into(),
                ps: "TCP".into(),
                qp_type: "RC".into(),
                lqpn: None,
                rqpn: None,
                src_addr: Some("127.0.0.1:7471".into()),
                dst_addr: None,
                passive: false,
                service_id: "0x0000000001061d2f".into(),
            }],
        }
    }

    #[test]
    fn lines_read_as_rdma_res_shows_them() {
        let s = snapshot(true);
        assert_eq!(
            object_text(Object::Qp, &s),
            "link softrdma_lo/1 lqpn 0x002000 rqpn 0x004000 type RC state RTS sq-psn 0x000066 rq-psn 0x0000c8 \
             unacked-psn 0x000064 pdn 0 scqn 0 rcqn 0 path-mtu 4096 sq 1/128 rq 0/128 inflight-msgs 1 inflight-pkts 2 \
             retries 6/7 rnr-retries 7/7 ack-timeouts 1 retransmits 2 rnr-naks-rcvd 0 rnr-naks-sent 0 naks-rcvd 0 \
             naks-sent 0 dgid ::ffff:127.0.0.1 dport 4791 pid 1234 comm app\n"
        );
        assert_eq!(
            object_text(Object::Cq, &s),
            "link softrdma_lo/1 cqn 0 cqe 256 entries 3 users 1 armed pid 1234 comm app\n"
        );
        assert_eq!(
            object_text(Object::Mr, &s),
            "link softrdma_lo/1 mrn 0 rkey 0xabcd lkey 0x1234 iova 0x7f0000000000 mrlen 4096 access LOCAL_WRITE pdn 0 \
             pid 1234 comm app\n"
        );
        assert_eq!(
            object_text(Object::Mr, &snapshot(false)),
            "link softrdma_lo/1 mrn 0 mrlen 4096 access LOCAL_WRITE pdn 0 pid 1234 comm app\n",
            "no keys, no address for another user"
        );
        assert_eq!(object_text(Object::Pd, &s), "link softrdma_lo/1 pdn 0 users 2 pid 1234 comm app\n");
        assert_eq!(
            object_text(Object::CmId, &s),
            "link softrdma_lo/1 cm-idn 1 qp-type RC state LISTEN cm-state LISTEN ps TCP src-addr 127.0.0.1:7471 \
             pid 1234 comm app\n"
        );
        let devices = ["softrdma_lo".to_string(), "softrdma_eth0".to_string()];
        assert_eq!(
            summary_text(&devices, &[&s, &s]),
            "0: softrdma_lo: pd 2 cq 2 qp 2 cm_id 2 mr 2 srq 0 ctx 2\n1: softrdma_eth0: pd 0 cq 0 qp 0 cm_id 0 mr 0 srq 0 ctx 0\n"
        );
    }

    #[test]
    fn json_rows_carry_their_context() {
        let s = snapshot(false);
        let v = report_json(Some(Object::Mr), &["softrdma_lo".into()], &[&s], Vec::new());
        assert_eq!(v["mrs"][0]["pid"], 1234);
        assert_eq!(v["mrs"][0]["keys_shown"], false);
        assert_eq!(v["mrs"][0]["rkey"], Value::Null);
        let v = report_json(None, &["softrdma_lo".into()], &[&s], Vec::new());
        assert_eq!(v["devices"][0]["qp"], 1);
        assert_eq!(v["contexts"][0]["qps"][0]["state"], "RTS");
        assert_eq!(v["unanswered"], Value::Array(vec![]));
    }
}
