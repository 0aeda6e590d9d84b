//! The provider stand-ins (`libmlx5.so.1` from crates/dv, `libefa.so.1` from crates/dv-efa)
//! never keep a program from starting: every Debian program and library on this machine
//! that links either (found by its `DT_NEEDED`) loads over our directory with every
//! symbol bound at once, each stand-in exports every `function@version` the real library
//! does, and the functions answer "not supported" as the real ones do on a device that is
//! not theirs. Skips, saying why, without binutils' `readelf` or the Debian packages.
#![allow(clippy::print_stderr)]
// dlopen/dlvsym and calls through the pointers they return: the C boundary under test.
#![allow(unsafe_code)]

mod common;

use std::collections::BTreeSet;
use std::ffi::{CStr, CString, c_int, c_void};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

const PROVIDERS: [&str; 2] = ["libmlx5.so.1", "libefa.so.1"];
const SYSTEM_LIB: &str = "/usr/lib/x86_64-linux-gnu";
/// Where Debian puts programs and libraries (pyverbs' modules are under /usr/lib/python3).
const SCAN: [&str; 3] = ["/usr/bin", "/usr/sbin", "/usr/lib"];

/// Every regular file under `dir`.
fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let Ok(kind) = entry.file_type() else { continue };
        if kind.is_dir() {
            files(&entry.path(), out);
        } else if kind.is_file() {
            out.push(entry.path());
        }
    }
}

/// The `DT_NEEDED` entries of a 64-bit little-endian ELF file (none for anything else),
/// read from its dynamic section through its program headers: only the headers and the
/// strings are read, not the file.
fn needed(path: &Path) -> Vec<String> {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(path) else { return Vec::new() };
    let mut read_at = |offset: u64, len: usize| -> Option<Vec<u8>> {
        let mut buf = vec![0u8; len];
        f.seek(SeekFrom::Start(offset)).ok()?;
        f.read_exact(&mut buf).ok()?;
        Some(buf)
    };
    let u16_at = |b: &[u8], o: usize| u16::from_le_bytes([b[o], b[o + 1]]) as u64;
    let u32_at = |b: &[u8], o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap()) as u64;
    let u64_at = |b: &[u8], o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
    let Some(eh) = read_at(0, 64) else { return Vec::new() };
    // ELFCLASS64, ELFDATA2LSB.
    if eh[..4] != *b"\x7fELF" || eh[4] != 2 || eh[5] != 1 {
        return Vec::new();
    }
    let (phoff, phentsize, phnum) = (u64_at(&eh, 32), u16_at(&eh, 54), u16_at(&eh, 56));
    let Some(ph) = read_at(phoff, (phentsize * phnum) as usize) else { return Vec::new() };
    // (p_type, p_offset, p_vaddr, p_filesz) of each program header.
    let phdrs: Vec<(u64, u64, u64, u64)> = (0..phnum as usize)
        .map(|i| {
            let o = i * phentsize as usize;
            (u32_at(&ph, o), u64_at(&ph, o + 8), u64_at(&ph, o + 16), u64_at(&ph, o + 32))
        })
        .collect();
    const PT_LOAD: u64 = 1;
    const PT_DYNAMIC: u64 = 2;
    const DT_NEEDED: u64 = 1;
    const DT_STRTAB: u64 = 5;
    let Some(&(_, dyn_off, _, dyn_size)) = phdrs.iter().find(|p| p.0 == PT_DYNAMIC) else { return Vec::new() };
    let Some(dynamic) = read_at(dyn_off, dyn_size as usize) else { return Vec::new() };
    let entries: Vec<(u64, u64)> =
        dynamic.chunks_exact(16).map(|e| (u64_at(e, 0), u64_at(e, 8))).take_while(|e| e.0 != 0).collect();
    let Some(&(_, strtab)) = entries.iter().find(|e| e.0 == DT_STRTAB) else { return Vec::new() };
    // DT_STRTAB is an address: the file offset is where the segment holding it is.
    let Some(&(_, off, vaddr, _)) = phdrs.iter().find(|p| p.0 == PT_LOAD && p.2 <= strtab && strtab < p.2 + p.3) else {
        return Vec::new();
    };
    let strtab = strtab - vaddr + off;
    entries
        .iter()
        .filter(|e| e.0 == DT_NEEDED)
        .filter_map(|&(_, name)| {
            let bytes = read_at(strtab + name, 256)?;
            let end = bytes.iter().position(|&b| b == 0)?;
            Some(String::from_utf8_lossy(&bytes[..end]).into_owned())
        })
        .collect()
}

/// The files on this machine that link a provider library.
fn linkers() -> Vec<PathBuf> {
    let mut all = Vec::new();
    for dir in SCAN {
        files(Path::new(dir), &mut all);
    }
    all.into_iter().filter(|path| needed(path).iter().any(|n| PROVIDERS.contains(&n.as_str()))).collect()
}

/// Loads `path` over the libraries in `lib` with every symbol bound at once; what the
/// loader said, if it failed.
fn load(path: &Path, lib: &Path) -> Result<(), String> {
    let name = path.file_name().unwrap().to_string_lossy();
    let mut cmd = if name.contains(".so") {
        // A library: dlopen with RTLD_NOW, from Python, so pyverbs' modules find libpython's
        // symbols too.
        // Debian's interpreter, the one pyverbs is built for, before any other on the PATH.
        let python = if Path::new("/usr/bin/python3").exists() { "/usr/bin/python3" } else { "python3" };
        let mut c = Command::new(python);
        c.args(["-c", "import ctypes, os, sys; ctypes.CDLL(sys.argv[1], mode=os.RTLD_NOW)"]).arg(path);
        c
    } else {
        // A program: the loader maps and relocates it and its libraries, then stops
        // (`ldd -r`), so nothing of the program runs.
        let mut c = Command::new(path);
        c.env("LD_TRACE_LOADED_OBJECTS", "1").env("LD_WARN", "1");
        c
    };
    let out = cmd.env("LD_LIBRARY_PATH", lib).env("LD_BIND_NOW", "1").output().map_err(|e| format!("{name}: {e}"))?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let bad: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("not found") || l.contains("undefined symbol") || l.contains("Error"))
        .collect();
    if out.status.success() && bad.is_empty() { Ok(()) } else { Err(format!("{}: {}", path.display(), text.trim())) }
}

#[test]
fn every_debian_program_and_library_that_links_a_provider_loads() {
    if !installed("python3") {
        eprintln!("SKIP: python3 is not installed (it dlopens the libraries)");
        return;
    }
    let files = linkers();
    if files.is_empty() {
        eprintln!(
            "SKIP: nothing on this machine links libmlx5.so.1 or libefa.so.1 (apt-get install perftest libfabric1 libucx0 python3-pyverbs)"
        );
        return;
    }
    let lib = lib_dir("providers");
    assert!(lib.dv, "the provider stand-ins were not built");
    let failed: Vec<String> = files.iter().filter_map(|f| load(f, &lib.path).err()).collect();
    eprintln!("{} files link a provider; {} failed to load", files.len(), failed.len());
    assert!(failed.is_empty(), "failed to load over {}:\n{}", lib.path.display(), failed.join("\n"));
}

/// `function@version` (`@@` for the default) of every function an ELF file defines.
fn exports(path: &Path) -> BTreeSet<String> {
    let out = Command::new("readelf").arg("-W").arg("--dyn-syms").arg(path).output().expect("running readelf");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 8 && f[3] == "FUNC" && f[6] != "UND").then(|| f[7].to_string())
        })
        .collect()
}

#[test]
fn each_stand_in_exports_what_the_real_library_does() {
    if !installed("readelf") {
        eprintln!("SKIP: readelf is not installed (apt-get install binutils)");
        return;
    }
    let lib = lib_dir("providers-exports");
    for name in PROVIDERS {
        let real = Path::new(SYSTEM_LIB).join(name);
        if !real.exists() {
            eprintln!("SKIP {name}: {} is not installed (apt-get install ibverbs-providers)", real.display());
            continue;
        }
        let want = exports(&real);
        let have = exports(&lib.path.join(name));
        let missing: Vec<&String> = want.difference(&have).collect();
        assert!(missing.is_empty(), "our {name} lacks {missing:?} (run scripts/gen-dv-symbols)");
        assert!(want.iter().any(|s| s.contains("@@")), "read nothing from {}", real.display());
    }
}

/// A function of a library opened with dlopen, at a version.
struct Lib(*mut c_void);

impl Lib {
    fn open(path: &Path) -> Lib {
        let c = CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: c is a NUL-terminated path; the stand-ins have no constructors to run.
        let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(!handle.is_null(), "dlopen {}: {}", path.display(), dlerror());
        Lib(handle)
    }

    fn sym(&self, name: &str, version: &str) -> *mut c_void {
        let (n, v) = (CString::new(name).unwrap(), CString::new(version).unwrap());
        // SAFETY: self.0 is a live handle; both strings are NUL-terminated.
        let f = unsafe { libc::dlvsym(self.0, n.as_ptr(), v.as_ptr()) };
        assert!(!f.is_null(), "{name}@{version}: {}", dlerror());
        f
    }
}

fn dlerror() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string valid until the next dl call.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        return "no error".into();
    }
    // SAFETY: not NULL, so a NUL-terminated string, read before any other dl call.
    unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
}

fn errno() -> c_int {
    std::io::Error::last_os_error().raw_os_error().unwrap()
}

#[test]
fn the_stand_ins_answer_not_supported() {
    let lib = lib_dir("providers-calls");
    assert!(lib.dv, "the provider stand-ins were not built");
    let mlx5 = Lib::open(&lib.path.join("libmlx5.so.1"));
    let efa = Lib::open(&lib.path.join("libefa.so.1"));
    let mut attr = [0u8; 512];
    let arg = attr.as_mut_ptr().cast::<c_void>();
    // SAFETY: each pointer is the function of that name, whose C signature the transmute
    // names (trailing arguments dropped, which the C calling convention allows); the
    // stand-ins read none of their arguments.
    unsafe {
        let is_supported: extern "C" fn(*mut c_void) -> bool =
            std::mem::transmute(mlx5.sym("mlx5dv_is_supported", "MLX5_1.8"));
        assert!(!is_supported(arg), "mlx5dv_is_supported says softrdma's device is mlx5");

        let open: extern "C" fn(*mut c_void, *mut c_void) -> *mut c_void =
            std::mem::transmute(mlx5.sym("mlx5dv_open_device", "MLX5_1.7"));
        *libc::__errno_location() = 0;
        assert!(open(arg, arg).is_null());
        assert_eq!(errno(), libc::EOPNOTSUPP, "mlx5dv_open_device's errno");

        let query: extern "C" fn(*mut c_void, *mut c_void) -> c_int =
            std::mem::transmute(mlx5.sym("mlx5dv_query_device", "MLX5_1.0"));
        assert_eq!(query(arg, arg), libc::EOPNOTSUPP, "mlx5dv_query_device");

        // Both versions of mlx5dv_init_obj: the default and the compatibility one.
        for v in ["MLX5_1.2", "MLX5_1.0"] {
            let init: extern "C" fn(*mut c_void, u64) -> c_int = std::mem::transmute(mlx5.sym("mlx5dv_init_obj", v));
            assert_eq!(init(arg, 1), libc::EOPNOTSUPP, "mlx5dv_init_obj@{v}");
        }

        let get_event: extern "C" fn(*mut c_void, *mut c_void, usize) -> isize =
            std::mem::transmute(mlx5.sym("mlx5dv_devx_get_event", "MLX5_1.11"));
        *libc::__errno_location() = 0;
        assert_eq!(get_event(arg, arg, 0), -1, "mlx5dv_devx_get_event");
        assert_eq!(errno(), libc::EOPNOTSUPP, "mlx5dv_devx_get_event's errno");

        let efa_query: extern "C" fn(*mut c_void, *mut c_void, u32) -> c_int =
            std::mem::transmute(efa.sym("efadv_query_device", "EFA_1.1"));
        assert_eq!(efa_query(arg, arg, 0), libc::EOPNOTSUPP, "efadv_query_device");

        let efa_cq: extern "C" fn(*mut c_void, *mut c_void, *mut c_void, u32) -> *mut c_void =
            std::mem::transmute(efa.sym("efadv_create_cq", "EFA_1.2"));
        *libc::__errno_location() = 0;
        assert!(efa_cq(arg, arg, arg, 0).is_null());
        assert_eq!(errno(), libc::EOPNOTSUPP, "efadv_create_cq's errno");
    }
    // Two objects now: libefa has no mlx5 function, and the other way round.
    let n = CString::new("mlx5dv_is_supported").unwrap();
    // SAFETY: efa.0 is a live handle; n is NUL-terminated.
    assert!(unsafe { libc::dlsym(efa.0, n.as_ptr()) }.is_null(), "libefa.so.1 exports mlx5dv_is_supported");
}
