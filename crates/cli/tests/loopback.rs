//! `softrdma loopback` end to end: two devices, real UDP sockets on 127.0.0.1 and 127.0.0.2
//! port 4791, RoCEv2 through the kernel. One test function runs every case in turn, because
//! they all need port 4791.

use std::process::Command;

fn softrdma(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_softrdma")).args(args).output().expect("run softrdma")
}

#[test]
fn every_operation_moves_verified_data_over_real_sockets() {
    for (op, size) in [("write", "70000"), ("read", "5000"), ("send", "3000")] {
        let out =
            softrdma(&["loopback", "--json", "--op", op, "-s", size, "-n", "300", "--depth", "4", "--mtu", "1024"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        if stderr.contains("cannot bind") {
            // Port 4791 of 127.0.0.1 is taken by another RoCE stack on this machine.
            println!("SKIP loopback {op}: {}", stderr.trim());
            return;
        }
        assert!(out.status.success(), "{op}: {stderr}");
        let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(r["op"], op);
        assert_eq!(r["iterations"], 300);
        assert_eq!(r["verified"], true, "{op}: data differs");
        assert_eq!(r["icrc_errors"], 0, "{op}: the kernel changed what the ICRC covers");
        assert!(r["gbit_per_sec"].as_f64().unwrap() > 0.0);
        let lat = &r["latency_us"];
        assert!(lat["min"].as_f64().unwrap() <= lat["median"].as_f64().unwrap());
        assert!(lat["median"].as_f64().unwrap() <= lat["max"].as_f64().unwrap());
    }

    // The pcap of a run decodes with every ICRC valid.
    let dir = tempfile::tempdir().unwrap();
    let pcap = dir.path().join("lb.pcap");
    let out = softrdma(&["loopback", "-s", "2000", "-n", "10", "--depth", "1", "--pcap", pcap.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8(out.stdout).unwrap().contains("data verified: yes"));
    let out = softrdma(&["decode", pcap.to_str().unwrap()]);
    let summary = String::from_utf8(out.stderr).unwrap();
    assert!(summary.contains("20 RoCEv2 (20 ICRC ok, 0 bad)"), "{summary}");

    // Bad options: one line, and the right exit status.
    let out = softrdma(&["loopback", "--mtu", "300"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8(out.stderr).unwrap().trim(),
        "softrdma loopback: --mtu 300: use 256, 512, 1024, 2048 or 4096"
    );
    assert_eq!(softrdma(&["loopback", "--depth", "0"]).status.code(), Some(2));
}
