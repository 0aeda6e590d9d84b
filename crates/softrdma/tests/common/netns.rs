//! Two test hosts: network namespaces joined by a veth pair, made by the test that uses them
//! and removed when it drops them. Where they cannot be made (not root, no iproute2, no
//! permission to make a namespace) [`NetnsPair::create_or_skip`] says why and the test
//! skips; anything failing after the first namespace exists is a failure.

#![allow(clippy::print_stderr)] // tests say why they skip

use std::process::Command;

/// Runs a command; its standard output, or what failed.
pub fn run(args: &[&str]) -> Result<String, String> {
    let out = Command::new(args[0]).args(&args[1..]).output().map_err(|e| format!("{}: {e}", args[0]))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!("{}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// Namespaces `names[i]`, each holding veth end `ifaces[i]`, up, with `lo` up and no
/// address but those the test adds (no automatic link-local address).
pub struct NetnsPair {
    pub names: [String; 2],
    pub ifaces: [&'static str; 2],
}

impl NetnsPair {
    /// The pair for test `tag` (names unique per process and tag), or `None` having said
    /// why it cannot be made here.
    pub fn create_or_skip(tag: &str, ifaces: [&'static str; 2]) -> Option<NetnsPair> {
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: creating network namespaces needs root");
            return None;
        }
        let names = ["a", "b"].map(|side| format!("srdma-{}-{tag}-{side}", std::process::id() % 100_000));
        for n in &names {
            let _ = run(&["ip", "netns", "del", n]);
        }
        // Root without the capability (some containers) cannot make a namespace: that is
        // the environment, not softrdma.
        if let Err(e) = run(&["ip", "netns", "add", &names[0]]) {
            eprintln!("skipped: `ip netns add` is not possible here: {e}");
            return None;
        }
        let pair = NetnsPair { names, ifaces };
        pair.build().unwrap_or_else(|e| panic!("building two namespaces joined by veth: {e}"));
        Some(pair)
    }

    fn build(&self) -> Result<(), String> {
        let [a, b] = [&self.names[0], &self.names[1]];
        run(&["ip", "netns", "add", b])?;
        run(&["ip", "link", "add", self.ifaces[0], "netns", a, "type", "veth", "peer", self.ifaces[1], "netns", b])?;
        for (n, dev) in self.names.iter().zip(self.ifaces) {
            run(&["ip", "-n", n, "link", "set", "lo", "up"])?;
            run(&["ip", "-n", n, "link", "set", dev, "addrgenmode", "none"])?;
            run(&["ip", "-n", n, "link", "set", dev, "up"])?;
        }
        Ok(())
    }

    /// Adds `cidr` to side `i`'s veth end. IPv6 addresses skip duplicate address detection
    /// (usable at once); add them once the link is up (as it is here): one added while its
    /// link was down answers no neighbour solicitation for about a second.
    pub fn add_address(&self, i: usize, cidr: &str) {
        let mut args = vec!["ip", "-n", &self.names[i], "addr", "add", cidr, "dev", self.ifaces[i]];
        if cidr.contains(':') {
            args.push("nodad");
        }
        run(&args).unwrap_or_else(|e| panic!("{e}"));
    }

    /// Runs `args` inside side `i`'s namespace.
    pub fn exec(&self, i: usize, args: &[&str]) -> Result<String, String> {
        let mut full = vec!["ip", "netns", "exec", &self.names[i]];
        full.extend_from_slice(args);
        run(&full)
    }

    /// The interface index of side `i`'s veth end, in its namespace.
    pub fn ifindex(&self, i: usize) -> u32 {
        let out = run(&["ip", "-n", &self.names[i], "-o", "link", "show", "dev", self.ifaces[i]]).unwrap();
        out.split(':').next().unwrap().trim().parse().unwrap()
    }
}

impl Drop for NetnsPair {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = Command::new("ip").args(["netns", "del", n]).output();
        }
    }
}
