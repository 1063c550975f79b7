//! Reuse of evicted files (exclusive mode, where the filesystem grants write leases): an
//! evicted block's file is renamed into the new block's directory and written in place,
//! instead of unlinking one file and creating another.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::Ordering;

use rustix::fs::OFlags;
use rustix::io::Errno;

use super::Inner;
use crate::index::{Offer, Victim};
use crate::key::{BlockHash, BlockKey};
use crate::ns::{EventCause, EventKind, Parent, join};

/// Turns `O_DIRECT` on for a taken evicted file's descriptor; false if refused.
pub(super) fn add_direct(fd: &OwnedFd) -> bool {
    rustix::fs::fcntl_getfl(fd)
        .and_then(|flags| rustix::fs::fcntl_setfl(fd, flags | OFlags::DIRECT))
        .is_ok()
}

/// What became of an evicted block's file offered for reuse.
enum Taken<'a> {
    /// Taken: the put writes into it.
    Spare(Spare<'a>),
    /// Held open elsewhere: unlinked (under its temp name), its eviction complete.
    Unlinked,
    /// Not taken, nothing done: left to [`Inner::unlink_victims`].
    Not,
}

/// An evicted block's file taken for a put: renamed to a temp name in the new block's
/// directory and opened there, under a write lease (no other descriptor on the machine
/// holds it, and an `open` racing the reuse waits until the file holds the new block).
pub(super) struct Spare<'a> {
    pub(super) parent: Parent<'a>,
    pub(super) name: String,
    pub(super) fd: OwnedFd,
    /// Its length once taken: as evicted, or 0 if its pages were dropped by truncating it.
    pub(super) len: u64,
    /// When its lease was taken.
    pub(super) leased: std::time::Instant,
}

impl Inner {
    /// Exclusive mode with reuse on: takes the files of `victims` for the new blocks
    /// `targets` (key, bytes reserved for it), each the first victim that fits in its room
    /// (see [`Spare`]); victims left over, and those whose file cannot be taken, are
    /// unlinked as usual. One entry per target.
    pub(super) fn reuse_victims<'s>(
        &'s self,
        victims: Vec<Victim>,
        targets: &[(&BlockKey, u64)],
    ) -> (Vec<Option<Spare<'s>>>, bool) {
        // A taken victim's file leaves its name: the block is removed.
        let mut journal = self.journal_lock();
        let mut spares = Vec::with_capacity(targets.len());
        let mut unlink = Vec::new();
        let mut victims: Vec<Option<Victim>> = victims.into_iter().map(Some).collect();
        for &(key, room) in targets {
            // Reuse may have stopped at the previous victim (no leases here).
            if !self.publish.reuse.load(Ordering::Relaxed) {
                break;
            }
            // A victim no larger than the room reserved for the new block: until the put
            // has written and cut it, the file keeps the victim's size, and the bound must
            // hold at every instant.
            let Some(v) = victims
                .iter_mut()
                .find(|v| v.is_some_and(|v| v.bytes <= room))
                .and_then(Option::take)
            else {
                spares.push(None);
                continue;
            };
            let taken = self.take_victim(&v, key);
            if let (Some(j), Taken::Spare(_) | Taken::Unlinked) = (&mut journal, &taken) {
                j.record(EventKind::Removed, EventCause::Evicted, v.hash);
            }
            match taken {
                Taken::Spare(spare) => spares.push(Some(spare)),
                Taken::Unlinked => spares.push(None),
                Taken::Not => {
                    spares.push(None);
                    unlink.push(v);
                }
            }
        }
        unlink.extend(victims.into_iter().flatten());
        drop(journal);
        let stuck = self.unlink_victims(unlink);
        (spares, stuck)
    }

    /// A batch's victims that could not be unlinked still take their room: while the
    /// capacity is exceeded, the batch's last reservation is declined, as not admitted (a
    /// suffix of the batch, so no block is kept whose chain parent was declined); a file taken
    /// for it is unlinked. `offers` are the batch's, `spares` one per reservation (or fewer:
    /// none past the end); `spares` loses what is declined.
    pub(super) fn shed_over_bound(
        &self,
        offered: &[(BlockHash, u64)],
        offers: &mut [Offer],
        spares: &mut Vec<Option<Spare<'_>>>,
    ) {
        let reserved: Vec<usize> = (0..offers.len())
            .filter(|&i| matches!(offers[i], Offer::Reserved | Offer::Replace { .. }))
            .collect();
        spares.resize_with(reserved.len(), || None);
        for &i in reserved.iter().rev() {
            if !self.index.over_bound() {
                break;
            }
            tracing::debug!(block = %offered[i].0,
                "not admitted: evicted files that could not be unlinked hold its room");
            if let Some(Some(spare)) = spares.pop() {
                let Spare {
                    parent, name, fd, ..
                } = spare;
                drop(fd);
                if let Err(e) = self.ns.unlink_in(&parent, &name, None) {
                    tracing::warn!(path = %self.path(&join(self.layout.rel_path(&offered[i].0).dir(), &name)).display(),
                        error = %e, "could not unlink an evicted file taken for a declined put");
                }
            }
            self.index.decline(&offered[i].0, offers[i]);
            offers[i] = Offer::NotAdmitted;
        }
    }

    /// Takes the file of victim `v` for the new block `key`, under the victim's stripe lock
    /// (as an unlink would): renamed to a temp name in `key`'s directory, opened, and
    /// leased. [`Taken::Not`] leaves the victim to [`Inner::unlink_victims`]: published
    /// again, its file missing or not a regular file, or an error. A file that another
    /// descriptor holds is unlinked here, under its temp name ([`Taken::Unlinked`]).
    fn take_victim<'s>(&'s self, v: &Victim, key: &BlockKey) -> Taken<'s> {
        let _stripe = self.lock_stripe(self.stripe_of(&v.hash));
        if self.index.contains(&v.hash) {
            return Taken::Not;
        }
        self.fds.invalidate(&v.hash);
        let from = self.layout.rel_path(&v.hash);
        let to = self.layout.rel_path(&key.hash);
        let Ok(from_parent) = self.ns.parent(from.dir()) else {
            return Taken::Not;
        };
        let Ok(to_parent) = self.block_dir(to.dir()) else {
            return Taken::Not;
        };
        let name = self.ns.temp_name(to.file_name());
        let direct = self.direct_flag();
        let taken = self.ns.take_file(
            &from_parent,
            from.file_name(),
            &to_parent,
            &name,
            OFlags::RDWR | direct,
        );
        let (fd, st) = match taken {
            // A file that may not be written in place ([`rewritable`]) goes, as an unlink
            // would take it.
            Ok(Some((fd, st))) if !rewritable(&st) => {
                drop(fd);
                return self.unlink_taken(v, &to_parent, &join(to.dir(), &name), &st);
            }
            Ok(Some(t)) => t,
            Ok(None) => return Taken::Not,
            Err(e) => {
                tracing::debug!(path = %self.path(from.as_str()).display(), error = %e,
                    "could not take an evicted block's file: unlinking it");
                return Taken::Not;
            }
        };
        let leased = std::time::Instant::now();
        let lease = self.ns.take_lease(fd.as_fd());
        if !matches!(lease, Ok(true)) {
            // No leases here (a network filesystem, leases disabled): reuse stops. A file of
            // another owner (EACCES without CAP_LEASE) is only this file's refusal.
            match lease {
                Err(e) if !matches!(e, Errno::ACCESS | Errno::PERM) => {
                    tracing::info!(path = %self.path(&join(to.dir(), &name)).display(), error = %e,
                        "no write lease on an evicted file: evicted files are unlinked from now on");
                    self.publish.reuse.store(false, Ordering::Relaxed);
                }
                _ => {}
            }
            drop(fd);
            return self.unlink_taken(v, &to_parent, &join(to.dir(), &name), &st);
        }
        // Buffered: the write must never go into a cached page a reader may still hold (a
        // pipe that `splice` or `sendfile` filled from it keeps the old bytes): such pages
        // leave the file first (`drop_pages`). An `O_DIRECT` write goes to the disk's blocks,
        // not into cached pages.
        let mut len = st.st_size as u64;
        if direct.is_empty() {
            match crate::ns::drop_pages(fd.as_fd(), len) {
                Ok(crate::ns::PagesDropped::Truncated) => len = 0,
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(path = %self.path(&join(to.dir(), &name)).display(), error = %e,
                        "could not drop an evicted file's cached pages for reuse: unlinking it");
                    drop(fd);
                    return self.unlink_taken(v, &to_parent, &join(to.dir(), &name), &st);
                }
            }
        }
        self.index.drained(std::slice::from_ref(v));
        Taken::Spare(Spare {
            parent: to_parent,
            name,
            fd,
            len,
            leased,
        })
    }

    /// Unlinks victim `v`'s file where [`Inner::take_victim`] moved it (`rel`, in `parent`;
    /// only if it is still the inode `st` describes), completing its eviction.
    fn unlink_taken<'s>(
        &self,
        v: &Victim,
        parent: &Parent<'_>,
        rel: &str,
        st: &rustix::fs::Stat,
    ) -> Taken<'s> {
        let (_, name) = crate::ns::split(rel);
        if let Err(e) = self
            .ns
            .unlink_in(parent, name, Some(crate::ns::Inode::of(st)))
        {
            tracing::warn!(path = %self.path(rel).display(), error = %e,
                "could not unlink an evicted block");
        }
        self.index.drained(std::slice::from_ref(v));
        Taken::Unlinked
    }
}

/// True if an evicted file `st` may be written in place for a new block:
/// - no other name links it (a hard link, in the tree or outside it), since writing it would
///   change what that name holds;
/// - it is a file this process could have made as the store makes its block files: owned by
///   the effective user, no set-id or sticky bit, writable by its owner alone. Otherwise its
///   owner and mode would pass to the new block, and whoever may write it could change a
///   published block.
fn rewritable(st: &rustix::fs::Stat) -> bool {
    st.st_nlink == 1 && st.st_uid == rustix::process::geteuid().as_raw() && st.st_mode & 0o7022 == 0
}
