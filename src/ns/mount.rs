//! Which filesystem holds a tree, and whether other nodes can mount it: what tells a router
//! "on this node's disk" from "on the shared tree" (docs/events.md, "Locality").

use std::path::Path;

use crate::error::{Error, Result};

/// The filesystem a path is on, as this node mounts it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Filesystem {
    /// Its type as the kernel names it in `/proc/self/mountinfo` (`ext4`, `xfs`, `tmpfs`,
    /// `nfs4`, `fuse.glusterfs`, ...), or from `statfs`'s magic number where that file cannot
    /// be read; `unknown` if neither says.
    pub kind: String,
    /// A network or cluster filesystem, which other nodes mount too: its blocks are on the
    /// shared tree, remote to every engine, not on one node's disk.
    pub network: bool,
}

/// Network and cluster filesystems, by their mountinfo type (FUSE ones as `fuse.<name>`).
const NETWORK: &[&str] = &[
    "nfs",
    "nfs4",
    "cifs",
    "smb3",
    "smbfs",
    "ceph",
    "glusterfs",
    "lustre",
    "gpfs",
    "beegfs",
    "gfs2",
    "ocfs2",
    "afs",
    "9p",
    "orangefs",
    "pvfs2",
    "juicefs",
    "wekafs",
    "virtiofs",
];
const NETWORK_FUSE: &[&str] = &[
    "glusterfs",
    "ceph",
    "ceph-fuse",
    "juicefs",
    "sshfs",
    "s3fs",
    "gcsfuse",
    "weka",
    "beegfs",
    "lustre",
    "moosefs",
    "mfs",
    "seaweedfs",
    "alluxio-fuse",
    "goofys",
    "rclone",
    "cvmfs2",
];

/// `statfs` magic numbers of the filesystems above, for a node without a readable
/// mountinfo (`statfs(2)`, `linux/magic.h`).
const MAGIC: &[(i64, &str)] = &[
    (0x6969, "nfs"),
    (0xFF53_4D42, "cifs"),
    (0xFE53_4D42, "smb3"),
    (0x00C3_6400, "ceph"),
    (0x0BD0_0BD0, "lustre"),
    (0x4750_4653, "gpfs"),
    (0x0119_8101, "gfs2"),
    (0x7461_636f, "ocfs2"),
    (0x0102_1997, "9p"),
    (0x6573_5546, "fuse"),
    (0xEF53, "ext4"),
    (0x5846_5342, "xfs"),
    (0x0102_1994, "tmpfs"),
    (0x9123_683E, "btrfs"),
    (0x794c_7630, "overlay"),
    (0x2FC1_2FC1, "zfs"),
];

/// Whether a filesystem of mountinfo type `kind` is one other nodes mount too.
fn is_network(kind: &str) -> bool {
    match kind.strip_prefix("fuse.") {
        Some(sub) => NETWORK_FUSE.contains(&sub),
        None => NETWORK.contains(&kind),
    }
}

/// The filesystem `path` is on: the last mount of `/proc/self/mountinfo` whose device is the
/// path's (a later mount hides an earlier one), else `statfs`'s magic number. An error
/// (the path cannot be `stat`ed) names it.
pub fn filesystem(path: &Path) -> Result<Filesystem> {
    let st = rustix::fs::stat(path).map_err(|e| Error::from_io(path, super::io_err(e)))?;
    let dev = format!(
        "{}:{}",
        rustix::fs::major(st.st_dev),
        rustix::fs::minor(st.st_dev)
    );
    let from_mounts = std::fs::read_to_string("/proc/self/mountinfo")
        .ok()
        .and_then(|text| mount_type(&text, &dev));
    let kind = match from_mounts {
        Some(kind) => kind,
        None => match rustix::fs::statfs(path) {
            // `f_type`'s width differs between architectures.
            #[allow(clippy::unnecessary_cast)]
            Ok(fs) => magic_name(fs.f_type as i64).to_string(),
            Err(e) => return Err(Error::from_io(path, super::io_err(e))),
        },
    };
    Ok(Filesystem {
        network: is_network(&kind),
        kind,
    })
}

/// The filesystem type of `statfs` magic number `magic`, `unknown` if it is not in [`MAGIC`].
fn magic_name(magic: i64) -> &'static str {
    MAGIC
        .iter()
        .find(|(m, _)| *m == magic)
        .map_or("unknown", |(_, name)| name)
}

/// The type of the last mount of device `dev` (`major:minor`) in mountinfo `text`
/// (`proc_pid_mountinfo(5)`: the third field is the device; the type follows the ` - `).
fn mount_type(text: &str, dev: &str) -> Option<String> {
    text.lines()
        .filter(|line| line.split(' ').nth(2) == Some(dev))
        .filter_map(|line| line.split_once(" - ")?.1.split(' ').next())
        .next_back()
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
22 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw
40 22 0:45 / /mnt/kv rw,relatime shared:20 - fuse.glusterfs localhost:/tierkv rw,user_id=0
41 22 0:46 / /mnt/nfs rw,relatime shared:21 - nfs4 srv:/export rw,vers=4.2
42 22 0:45 / /mnt/kv2 rw,relatime shared:22 - tmpfs tmpfs rw
";

    #[test]
    fn the_last_mount_of_the_device_names_the_type() {
        assert_eq!(mount_type(MOUNTINFO, "259:2").as_deref(), Some("ext4"));
        assert_eq!(mount_type(MOUNTINFO, "0:46").as_deref(), Some("nfs4"));
        assert_eq!(mount_type(MOUNTINFO, "0:45").as_deref(), Some("tmpfs"));
        assert_eq!(mount_type(MOUNTINFO, "8:1"), None);
    }

    #[test]
    fn network_and_cluster_filesystems_are_told_from_local_ones() {
        for kind in [
            "fuse.glusterfs",
            "nfs4",
            "nfs",
            "ceph",
            "lustre",
            "fuse.juicefs",
        ] {
            assert!(is_network(kind), "{kind}");
        }
        for kind in [
            "ext4",
            "xfs",
            "tmpfs",
            "btrfs",
            "overlay",
            "fuse.fuse-overlayfs",
            "fuse",
        ] {
            assert!(!is_network(kind), "{kind}");
        }
    }

    #[test]
    fn statfs_names_the_type_mountinfo_names() {
        let dir = tempfile::tempdir().unwrap();
        let fs = filesystem(dir.path()).unwrap();
        #[allow(clippy::unnecessary_cast)]
        let magic = rustix::fs::statfs(dir.path()).unwrap().f_type as i64;
        if MAGIC.iter().any(|(_, name)| *name == fs.kind) {
            assert_eq!(magic_name(magic), fs.kind);
        }
        assert_eq!(magic_name(0x6969), "nfs");
        assert_eq!(magic_name(0x1234_5678), "unknown");
    }

    #[test]
    fn a_local_directory_is_not_on_a_network_filesystem() {
        let dir = tempfile::tempdir().unwrap();
        let fs = filesystem(dir.path()).unwrap();
        assert!(!fs.network, "{fs:?}");
        assert_ne!(fs.kind, "unknown");
        let missing = dir.path().join("gone");
        let err = filesystem(&missing).unwrap_err().to_string();
        assert!(err.contains("gone"), "{err}");
    }
}
