//! Who is running: this node's id (boot id, pid namespace, host name), and whether a pid
//! is alive here.

/// This node's identity in names of temp and stats files: 64 bits of the blake3 hash of the
/// host name, the kernel's boot id and the pid namespace. Processes with equal ids see each
/// other's pids (so a temp file's owner can be checked with `kill(pid, 0)`); a reboot, another
/// host or another pid namespace (a container) is another node. Where the boot id or the pid
/// namespace cannot be read (no /proc, or another /proc mounted over it), this process is a
/// node of its own (`node_id_of`).
pub fn node_id() -> u64 {
    static ID: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *ID.get_or_init(|| {
        let boot_id = std::fs::read("/proc/sys/kernel/random/boot_id").ok();
        let pid_ns = std::fs::read_link("/proc/self/ns/pid")
            .ok()
            .map(|p| p.into_os_string().into_encoded_bytes());
        node_id_of(&host_name(), boot_id.as_deref(), pid_ns.as_deref())
    })
}

/// The node id of a process on host `host` whose boot id and pid namespace link read as
/// given. Without either, processes of two pid namespaces (two containers, `unshare -p` with
/// a tmpfs over /proc) could share an id and take each other's live pids for dead ones (or a
/// reboot could keep the id, and a dead writer's pid pass for a live one): the id then also
/// hashes 16 random bytes drawn for this call, so that no other process has it.
pub fn node_id_of(host: &str, boot_id: Option<&[u8]>, pid_ns: Option<&[u8]>) -> u64 {
    let mut h = blake3::Hasher::new();
    h.update(host.as_bytes());
    h.update(b"\0");
    match (boot_id, pid_ns) {
        (Some(b), Some(p)) if !b.is_empty() && !p.is_empty() => {
            h.update(b);
            h.update(b"\0");
            h.update(p);
        }
        _ => {
            h.update(b"\0alone\0");
            h.update(&process_nonce());
        }
    }
    let b = h.finalize();
    u64::from_le_bytes(b.as_bytes()[..8].try_into().expect("8 bytes"))
}

/// 16 random bytes: two hashes of std's `RandomState`, whose keys come from the operating
/// system's random source (and differ for each `RandomState` made).
fn process_nonce() -> [u8; 16] {
    use std::hash::BuildHasher;
    let mut n = [0u8; 16];
    n[..8].copy_from_slice(&std::hash::RandomState::new().hash_one(0u8).to_le_bytes());
    n[8..].copy_from_slice(&std::hash::RandomState::new().hash_one(1u8).to_le_bytes());
    n
}

/// True if a process `pid` exists on this node (`kill(pid, 0)`: alive unless `ESRCH`).
pub fn pid_alive(pid: u32) -> bool {
    let Ok(p) = i32::try_from(pid) else {
        return false;
    };
    if p <= 0 {
        return false;
    }
    // SAFETY: signal 0 sends nothing; kill only checks that the process exists.
    let rc = unsafe { libc::kill(p, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// The host name (`gethostname`), for messages and lock records.
pub fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: `buf` is valid for `buf.len()` bytes; gethostname writes at most that many and
    // we read only up to the first NUL within the buffer.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// Where the kernel gives the id of its current boot: a random UUID drawn at every boot, the
/// same for every process and container on this kernel.
pub const BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";

/// This machine's boot id (16 bytes of [`BOOT_ID_PATH`]), read once per process; `None` where
/// it cannot be read or parsed (then every file counts as written before this boot).
pub fn boot_id() -> Option<[u8; 16]> {
    static BOOT: std::sync::OnceLock<Option<[u8; 16]>> = std::sync::OnceLock::new();
    *BOOT.get_or_init(|| {
        let text = std::fs::read_to_string(BOOT_ID_PATH).ok()?;
        parse_boot_id(&text)
    })
}

/// Parses the kernel's text form of a boot id (`8-4-4-4-12` hex digits and a newline).
pub fn parse_boot_id(text: &str) -> Option<[u8; 16]> {
    let hex: Vec<u8> = text.trim().bytes().filter(|&c| c != b'-').collect();
    if hex.len() != 32 || text.trim().len() != 36 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, pair) in hex.chunks(2).enumerate() {
        let s = std::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(s, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where /proc answers, the node id is the hash of the host, the boot id and the pid
    /// namespace (the same in every process of this node and namespace).
    #[test]
    fn the_node_id_hashes_what_proc_says() {
        let boot = std::fs::read("/proc/sys/kernel/random/boot_id").unwrap();
        let ns = std::fs::read_link("/proc/self/ns/pid")
            .unwrap()
            .into_os_string()
            .into_encoded_bytes();
        assert_eq!(node_id(), node_id_of(&host_name(), Some(&boot), Some(&ns)));
    }

    /// Two stores in `unshare -mpf` namespaces with a tmpfs over /proc read
    /// no boot id and no pid namespace, and shared one node id.
    #[test]
    fn without_a_boot_id_or_a_pid_namespace_each_process_is_its_own_node() {
        let (boot, ns) = (&b"0f1e2d3c-4b5a"[..], &b"pid:[4026531836]"[..]);
        // Both known: the same node for every process that reads them.
        assert_eq!(
            node_id_of("h", Some(boot), Some(ns)),
            node_id_of("h", Some(boot), Some(ns))
        );
        assert_ne!(
            node_id_of("h", Some(boot), Some(ns)),
            node_id_of("h", Some(boot), Some(b"pid:[4026532000]"))
        );
        assert_ne!(
            node_id_of("h", Some(boot), Some(ns)),
            node_id_of("g", Some(boot), Some(ns))
        );
        // Either missing (or empty): never the id of another process.
        for (b, p) in [
            (None, Some(ns)),
            (Some(boot), None),
            (None, None),
            (Some(&b""[..]), Some(ns)),
        ] {
            assert_ne!(node_id_of("h", b, p), node_id_of("h", b, p), "{b:?} {p:?}");
        }
    }

    #[test]
    fn boot_ids_parse_from_the_kernels_text() {
        let id = parse_boot_id("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0\n").unwrap();
        assert_eq!(id[0], 0x0f);
        assert_eq!(id[15], 0xf0);
        assert_eq!(parse_boot_id("0f1e2d3c4b5a69788796a5b4c3d2e1f0"), None);
        assert_eq!(parse_boot_id("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1fz"), None);
        assert_eq!(parse_boot_id(""), None);
        // This machine's, read twice, is the same.
        let here = boot_id().expect("a Linux kernel gives its boot id");
        assert_eq!(Some(here), boot_id());
        assert_ne!(here, [0; 16]);
    }
}
