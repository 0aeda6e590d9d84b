//! The devices as a sysfs-shaped tree of files, for programs that read
//! `/sys/class/infiniband/<dev>/...` rather than ask the verbs.
//!
//! A device in user space cannot add files under `/sys`. So softrdma writes, from the same
//! [`Device`] values `ibv_query_device`, `ibv_query_port`, `ibv_query_gid` and
//! `ibv_query_gid_type` answer from, the files the kernel's `drivers/infiniband/core/sysfs.c`
//! would show for them, laid out as under `/sys`:
//!
//! ```text
//! <root>/class/infiniband/softrdma_lo/{node_type,node_guid,sys_image_guid,fw_ver,...,device/net/lo/}
//! <root>/class/infiniband/softrdma_lo/ports/1/{state,phys_state,link_layer,rate,cap_mask,...}
//! <root>/class/infiniband/softrdma_lo/ports/1/gids/<i>, gid_attrs/types/<i>, gid_attrs/ndevs/<i>
//! <root>/class/infiniband_verbs/uverbs0/{ibdev,abi_version}, abi_version
//! ```
//!
//! `libibverbs.so.1` points `ibv_device.ibdev_path` and `dev_path` there (rdma-core's
//! consumers follow them, and `ibv_read_sysfs_file` reads them); a mount namespace can lay
//! `<root>/class` over `/sys/class` for programs that read the fixed path
//! (`scripts/softrdma-sysfs-ns`). `<root>` is [`sysfs_root`]: per user (a user's processes
//! rewrite each other's files) and per network namespace (which decides the devices, as it
//! does the kernel's `/sys/class/infiniband` in exclusive mode).
//!
//! Every process that lists the devices rewrites the tree, each file by a rename, so a
//! reader sees a whole old or a whole new file. The tree shows the devices as the last
//! process to list them saw them; a device whose interface is gone stays until the
//! directory is removed. Publishing also removes the trees of network namespaces that no
//! process (of this user) and no `/run/netns` mount holds and that were not written for a
//! minute.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::device::{Device, PortAttr};

/// The environment variable naming the directory the per-namespace trees go in (default
/// `/dev/shm/softrdma-<uid>`). Processes that should see each other's trees must agree on it.
pub const SYSFS_DIR_ENV: &str = "SOFTRDMA_SYSFS_DIR";

/// The kernel's `IB_USER_VERBS_ABI_VERSION` (`class/infiniband_verbs/abi_version`) and a
/// device's `uverbsN/abi_version` (rxe's).
const UVERBS_ABI_VERSION: u32 = 6;
const DEVICE_ABI_VERSION: u32 = 1;

/// The root of this network namespace's tree: `<dir>/net-<inode of /proc/self/ns/net>/sys`,
/// `<dir>` from [`SYSFS_DIR_ENV`] or `/dev/shm/softrdma-<uid>`.
pub fn sysfs_root() -> PathBuf {
    let dir = std::env::var_os(SYSFS_DIR_ENV).filter(|v| !v.is_empty()).map_or_else(
        || PathBuf::from(format!("/dev/shm/softrdma-{}", rustix::process::getuid().as_raw())),
        PathBuf::from,
    );
    let netns = fs::metadata("/proc/self/ns/net").map_or(0, |m| m.ino());
    dir.join(format!("net-{netns}")).join("sys")
}

/// `ibv_device.ibdev_path` of `device`: its directory in the tree at `root`.
pub fn ibdev_path(root: &Path, device: &Device) -> PathBuf {
    root.join("class/infiniband").join(device.name())
}

/// `ibv_device.dev_path` of the device listed at `index`: `class/infiniband_verbs/uverbs<index>`.
pub fn dev_path(root: &Path, index: usize) -> PathBuf {
    root.join("class/infiniband_verbs").join(format!("uverbs{index}"))
}

/// The kernel's `%04x:%04x:%04x:%04x` of a GUID.
fn guid_text(guid: u64) -> String {
    format!("{:04x}:{:04x}:{:04x}:{:04x}", guid >> 48, (guid >> 32) & 0xffff, (guid >> 16) & 0xffff, guid & 0xffff)
}

/// The kernel's `%pI6` of a GID: eight groups of four hex digits.
fn gid_text(raw: &[u8; 16]) -> String {
    raw.chunks(2).map(|c| format!("{:02x}{:02x}", c[0], c[1])).collect::<Vec<_>>().join(":")
}

fn state_text(p: &PortAttr) -> String {
    // ib_port_state_to_str: "%d: %s" with DOWN, INIT, ARMED, ACTIVE, ACTIVE_DEFER.
    let name = match p.state as u32 {
        1 => "DOWN",
        2 => "INIT",
        3 => "ARMED",
        4 => "ACTIVE",
        _ => "NOP",
    };
    format!("{}: {name}", p.state as u32)
}

fn phys_state_text(p: &PortAttr) -> String {
    // phys_state_to_str: Sleep, Polling, Disabled, PortConfigurationTraining, LinkUp, ...
    let name = match p.phys_state as u32 {
        2 => "Polling",
        3 => "Disabled",
        5 => "LinkUp",
        _ => "<unknown>",
    };
    format!("{}: {name}", p.phys_state as u32)
}

/// The files of the device listed at `index`, as (path relative to the root, content
/// without the final newline): the device's directory and its `uverbs<index>` entry.
pub fn device_files(device: &Device, index: usize) -> Vec<(String, String)> {
    let a = device.attributes();
    let base = format!("class/infiniband/{}", device.name());
    let mut files = vec![
        (format!("{base}/node_type"), "1: CA".to_owned()),
        (format!("{base}/node_guid"), guid_text(a.node_guid)),
        (format!("{base}/sys_image_guid"), guid_text(a.sys_image_guid)),
        (format!("{base}/fw_ver"), a.fw_ver.clone()),
        (format!("{base}/hca_type"), "softrdma".to_owned()),
        (format!("{base}/board_id"), "softrdma".to_owned()),
        (format!("{base}/hw_rev"), a.hw_ver.to_string()),
        (format!("{base}/node_desc"), format!("softrdma {}", device.interface())),
        (format!("{base}/parent"), device.interface().to_owned()),
        // The netdev under the device, where pyverbs' tests and scripts look it up
        // (`device/net/<ifname>`); the kernel's is the netdev's own directory.
        (format!("{base}/device/net/{}/ifindex", device.interface()), device.interface_index().to_string()),
    ];
    if let Ok(p) = device.port_attributes(1) {
        let port = format!("{base}/ports/1");
        files.extend([
            (format!("{port}/state"), state_text(&p)),
            (format!("{port}/phys_state"), phys_state_text(&p)),
            (format!("{port}/link_layer"), "Ethernet".to_owned()),
            (format!("{port}/rate"), p.rate()),
            (format!("{port}/cap_mask"), format!("0x{:08x}", p.port_cap_flags)),
            (format!("{port}/lid"), "0x0".to_owned()),
            (format!("{port}/sm_lid"), "0x0".to_owned()),
            (format!("{port}/lid_mask_count"), "0".to_owned()),
            (format!("{port}/sm_sl"), "0".to_owned()),
            (format!("{port}/pkeys/0"), "0xffff".to_owned()),
        ]);
        for i in 0..p.gid_tbl_len {
            let Some(gid) = u8::try_from(i).ok().and_then(|i| device.gid(i)) else { break };
            files.push((format!("{port}/gids/{i}"), gid_text(&gid.0)));
            // Every softrdma GID is RoCE v2 (ibv_query_gid_type), on the device's interface.
            files.push((format!("{port}/gid_attrs/types/{i}"), "RoCE v2".to_owned()));
            files.push((format!("{port}/gid_attrs/ndevs/{i}"), device.interface().to_owned()));
        }
    }
    let uverbs = format!("class/infiniband_verbs/uverbs{index}");
    files.extend([
        (format!("{uverbs}/ibdev"), device.name().to_owned()),
        (format!("{uverbs}/abi_version"), DEVICE_ABI_VERSION.to_string()),
        ("class/infiniband_verbs/abi_version".to_owned(), UVERBS_ABI_VERSION.to_string()),
    ]);
    files
}

/// Writes the tree of `devices` (in their listing order) under [`sysfs_root`]; the root.
/// Refuses a base directory that is a symbolic link or another user's.
pub fn publish(devices: &[Device]) -> io::Result<PathBuf> {
    let root = sysfs_root();
    publish_at(&root, devices)?;
    Ok(root)
}

/// [`publish`] at `root`.
pub fn publish_at(root: &Path, devices: &[Device]) -> io::Result<()> {
    let base = root.parent().and_then(Path::parent).unwrap_or(root);
    fs::DirBuilder::new().recursive(true).mode(0o755).create(base)?;
    let meta = fs::symlink_metadata(base)?;
    let uid = rustix::process::getuid().as_raw();
    if !meta.is_dir() || meta.uid() != uid {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{} is not a directory of user {uid}: not writing the device tree there", base.display()),
        ));
    }
    for (index, device) in devices.iter().enumerate() {
        for (path, text) in device_files(device, index) {
            write_file(&root.join(path), &text)?;
        }
    }
    prune(base, STALE_AFTER);
    Ok(())
}

/// How long a tree of a network namespace that nothing holds any more stays.
const STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

/// The inodes of the network namespaces this process can see held: by a process (its
/// `/proc/<pid>/ns/net`, readable for this user's processes) or by a bind mount
/// (`ip netns add`'s `/run/netns/<name>`).
fn live_netns() -> std::collections::HashSet<u64> {
    let mut live = std::collections::HashSet::new();
    for dir in ["/proc", "/run/netns"] {
        let Ok(entries) = fs::read_dir(dir) else { continue };
        for e in entries.flatten() {
            let path = if dir == "/proc" { e.path().join("ns/net") } else { e.path() };
            if let Ok(m) = fs::metadata(path) {
                live.insert(m.ino());
            }
        }
    }
    live
}

/// Removes the trees under `base` of network namespaces no longer held (see
/// [`live_netns`]) and not written for `stale_after`: each namespace an `unshare -n` or a
/// test made leaves one behind otherwise. Best effort: what cannot be removed stays.
fn prune(base: &Path, stale_after: std::time::Duration) {
    let Ok(entries) = fs::read_dir(base) else { return };
    let live = live_netns();
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(ino) = name.to_str().and_then(|n| n.strip_prefix("net-")).and_then(|n| n.parse::<u64>().ok()) else {
            continue;
        };
        // Every publish renames files into class/infiniband_verbs: its time is the tree's.
        let written = fs::metadata(e.path().join("sys/class/infiniband_verbs")).and_then(|m| m.modified());
        let old = written.map_or(true, |t| t.elapsed().is_ok_and(|age| age > stale_after));
        if !live.contains(&ino) && old {
            let _ = fs::remove_dir_all(e.path());
        }
    }
}

/// Writes `text` and a newline to `path` by a rename, so readers see a whole file.
fn write_file(path: &Path, text: &str) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    fs::DirBuilder::new().recursive(true).mode(0o755).create(dir)?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let mut f = fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o644).open(&tmp)?;
    f.write_all(format!("{text}\n").as_bytes())?;
    drop(f);
    fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lo_as_the_kernel_would_show_it() {
        let lo = crate::device("lo").unwrap();
        let files: std::collections::HashMap<String, String> = device_files(&lo, 3).into_iter().collect();
        let f = |p: &str| files.get(&format!("class/infiniband/softrdma_lo/{p}")).map(String::as_str);
        assert_eq!(f("ports/1/gids/0"), Some("0000:0000:0000:0000:0000:ffff:7f00:0001"));
        assert_eq!(f("ports/1/gid_attrs/types/0"), Some("RoCE v2"));
        assert_eq!(f("ports/1/gid_attrs/ndevs/0"), Some("lo"));
        assert_eq!(f("ports/1/link_layer"), Some("Ethernet"));
        assert_eq!(f("ports/1/rate"), Some("100 Gb/sec (4X EDR)"));
        assert_eq!(f("ports/1/cap_mask"), Some("0x04010000"));
        assert_eq!(f("node_type"), Some("1: CA"));
        assert_eq!(f("node_guid"), Some(guid_text(lo.node_guid()).as_str()));
        assert_eq!(f("device/net/lo/ifindex"), Some(lo.interface_index().to_string().as_str()));
        let state = f("ports/1/state").unwrap();
        assert!(state == "4: ACTIVE" || state == "1: DOWN", "{state}");
        assert_eq!(files.get("class/infiniband_verbs/uverbs3/ibdev").map(String::as_str), Some("softrdma_lo"));
        let gids = files.keys().filter(|k| k.contains("/gids/")).count();
        assert_eq!(gids, lo.addresses().len(), "one file per GID");
    }

    #[test]
    fn publish_writes_whole_files_and_refuses_a_foreign_base() {
        let dir = std::env::temp_dir().join(format!("softrdma-sysfs-test-{}", std::process::id()));
        let root = dir.join("net-1/sys");
        let lo = crate::device("lo").unwrap();
        publish_at(&root, std::slice::from_ref(&lo)).unwrap();
        let text = fs::read_to_string(root.join("class/infiniband/softrdma_lo/ports/1/gids/0")).unwrap();
        assert_eq!(text, "0000:0000:0000:0000:0000:ffff:7f00:0001\n");
        assert_eq!(fs::read_to_string(dev_path(&root, 0).join("ibdev")).unwrap(), "softrdma_lo\n");
        assert!(ibdev_path(&root, &lo).join("node_guid").exists());
        let leftovers: Vec<_> = fs::read_dir(root.join("class/infiniband/softrdma_lo"))
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty(), "no temporary files left: {leftovers:?}");
        // A base that is a symbolic link (someone else's directory, say) is refused.
        let _ = fs::remove_dir_all(&dir);
        let elsewhere = std::env::temp_dir().join(format!("softrdma-sysfs-elsewhere-{}", std::process::id()));
        fs::create_dir_all(&elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &dir).unwrap();
        let err = publish_at(&root, std::slice::from_ref(&lo)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied, "{err}");
        let _ = fs::remove_file(&dir);
        let _ = fs::remove_dir_all(&elsewhere);
    }

    #[test]
    fn the_trees_of_namespaces_nothing_holds_are_pruned_once_stale() {
        let base = std::env::temp_dir().join(format!("softrdma-sysfs-prune-{}", std::process::id()));
        let lo = crate::device("lo").unwrap();
        let mine = fs::metadata("/proc/self/ns/net").unwrap().ino();
        // 1 is no network namespace's inode (the root directory's of a file system is 2).
        for ino in [1, mine] {
            publish_at(&base.join(format!("net-{ino}/sys")), std::slice::from_ref(&lo)).unwrap();
        }
        prune(&base, STALE_AFTER);
        assert!(base.join("net-1").exists(), "a tree written just now stays, held or not");
        prune(&base, std::time::Duration::ZERO);
        assert!(!base.join("net-1").exists(), "a stale tree of a namespace nothing holds goes");
        assert!(base.join(format!("net-{mine}/sys/class/infiniband/softrdma_lo")).exists(), "this namespace's stays");
        let _ = fs::remove_dir_all(&base);
    }
}
