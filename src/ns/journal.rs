//! The event journal of a worker ([`EVENTS_FILE`]): every block stored and every block
//! removed under the worker directory, by any store of any process or node, in one order, for
//! consumers that tail it (an engine's event publisher for a cache-aware router).
//!
//! A bounded ring of fixed-size records after a header page (docs/events.md has the layout):
//! record `seq` lives in slot `seq % capacity`, and the header says the next `seq`. Writers
//! append under the file's `flock` (read-modify-write of whole pages, `O_DIRECT` where the
//! filesystem allows it, so that no client's cache serves another client's older pages, as
//! with the ledger); readers take no lock: each record carries its `seq` and a checksum, so a
//! record overwritten or being written while it is read is told from the one expected.

use super::*;
use crate::key::BlockHash;

use crate::layout::EVENTS_FILE;
/// Records the ring holds: the most events a consumer may fall behind by before it misses
/// some (and resyncs from a listing of the tree). 32,768 records of 128 bytes: 4 MiB on disk.
pub const JOURNAL_CAPACITY: u64 = 32768;

const PAGE: usize = 4096;
const RECORD: usize = 128;
const PER_PAGE: u64 = (PAGE / RECORD) as u64;
const MAGIC: &[u8; 8] = b"TKVEVTS1";
const VERSION: u16 = 1;

/// What happened to a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EventKind {
    /// Its file was published: the block can be read.
    Stored,
    /// Its file is gone: the block cannot be read.
    Removed,
}

/// Why an event happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EventCause {
    /// A put published it.
    Put,
    /// A store evicted it under the capacity (or removed it as the descendant of a removed
    /// block, which no lookup could reach any more).
    Evicted,
    /// A caller removed it (`remove_many`, `discard_many`, `clear`).
    Removed,
    /// A read found it corrupt and removed it.
    Corrupt,
    /// A store found its file gone (removed by hand, or by a store that told no journal).
    Missing,
    /// `tierkv-stat --repair` removed it.
    Repair,
}

impl EventKind {
    /// The kind's name, as docs/events.md and the Python package spell it.
    pub fn name(self) -> &'static str {
        match self {
            EventKind::Stored => "stored",
            EventKind::Removed => "removed",
        }
    }

    fn code(self) -> u8 {
        match self {
            EventKind::Stored => 1,
            EventKind::Removed => 2,
        }
    }

    fn of_code(c: u8) -> Option<Self> {
        match c {
            1 => Some(EventKind::Stored),
            2 => Some(EventKind::Removed),
            _ => None,
        }
    }
}

impl EventCause {
    const ALL: [EventCause; 6] = [
        EventCause::Put,
        EventCause::Evicted,
        EventCause::Removed,
        EventCause::Corrupt,
        EventCause::Missing,
        EventCause::Repair,
    ];

    fn code(self) -> u8 {
        Self::ALL.iter().position(|c| *c == self).unwrap_or(0) as u8 + 1
    }

    fn of_code(c: u8) -> Option<Self> {
        Self::ALL.get(usize::from(c).checked_sub(1)?).copied()
    }

    /// The cause's name, as docs/events.md and the Python package spell it.
    pub fn name(self) -> &'static str {
        match self {
            EventCause::Put => "put",
            EventCause::Evicted => "evicted",
            EventCause::Removed => "removed",
            EventCause::Corrupt => "corrupt",
            EventCause::Missing => "missing",
            EventCause::Repair => "repair",
        }
    }
}

/// One event of the journal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct BlockEvent {
    /// Its place in the worker's order: consecutive, from 0 when the journal was made.
    pub seq: u64,
    /// Stored or removed.
    pub kind: EventKind,
    /// Why.
    pub cause: EventCause,
    /// The block.
    pub hash: BlockHash,
    /// The node of the process that wrote it ([`node_id`]).
    pub node: u64,
    /// That process.
    pub pid: u32,
    /// When, in milliseconds since the epoch.
    pub unix_ms: u64,
}

/// What a read of the journal returned ([`Store::events_since`](crate::Store::events_since)).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct EventsRead {
    /// The events from the first asked that the ring still holds, in order.
    pub events: Vec<BlockEvent>,
    /// The `seq` to ask for next.
    pub next: u64,
    /// Events asked for that the ring no longer holds (written over): the consumer missed
    /// them and resyncs from a listing of the tree.
    pub missed: u64,
    /// The journal's identity, drawn when it was made: another one (the file was removed and
    /// made again, its `seq` from 0) means the consumer resyncs too.
    pub journal_id: u64,
}

/// The open journal of a worker.
#[derive(Debug)]
pub struct Journal {
    fd: OwnedFd,
    path: PathBuf,
    /// Opened for the stores of a shared worker: each append is `fdatasync`ed, so that the
    /// readers of other clients see it at once (GlusterFS's client holds `O_DIRECT` writes
    /// back for about a second otherwise, as it did the ledger's).
    sync: bool,
    /// Threads of this process: `flock` on one open file does not exclude them.
    local: std::sync::Mutex<()>,
    /// How long [`Journal::lock`] waits for another holder.
    wait: std::time::Duration,
}

/// The journal's lock, held while the events it records happen (a file published or
/// unlinked), so that they reach the journal in the order they happened on disk, whichever
/// process or node made them; the events are appended when it drops.
#[derive(Debug)]
pub struct JournalGuard<'a> {
    journal: &'a Journal,
    _local: std::sync::MutexGuard<'a, ()>,
    pending: Vec<(EventKind, EventCause, BlockHash)>,
}

/// The header page's fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Head {
    capacity: u64,
    next: u64,
    id: u64,
}

fn le64(b: &[u8]) -> u64 {
    u64::from_le_bytes(b[..8].try_into().expect("8 bytes"))
}

fn check32(b: &[u8]) -> [u8; 4] {
    let h = blake3::hash(b);
    h.as_bytes()[..4].try_into().expect("4 bytes")
}

impl Head {
    fn encode(&self, page: &mut [u8]) {
        page.fill(0);
        page[..8].copy_from_slice(MAGIC);
        page[8..10].copy_from_slice(&VERSION.to_le_bytes());
        page[10..12].copy_from_slice(&(RECORD as u16).to_le_bytes());
        page[16..24].copy_from_slice(&self.capacity.to_le_bytes());
        page[24..32].copy_from_slice(&self.next.to_le_bytes());
        page[32..40].copy_from_slice(&self.id.to_le_bytes());
        let c = check32(&page[..40]);
        page[40..44].copy_from_slice(&c);
    }

    /// The header, `None` if the page is not one (all zeros: not written yet).
    fn decode(page: &[u8]) -> std::result::Result<Option<Head>, &'static str> {
        if page[..44].iter().all(|&b| b == 0) {
            return Ok(None);
        }
        if &page[..8] != MAGIC {
            return Err("not an event journal (bad magic)");
        }
        if page[40..44] != check32(&page[..40]) {
            return Err("its header's check does not match");
        }
        if u16::from_le_bytes([page[8], page[9]]) != VERSION
            || usize::from(u16::from_le_bytes([page[10], page[11]])) != RECORD
        {
            return Err("a version or record size this build does not read");
        }
        let capacity = le64(&page[16..]);
        if capacity == 0 || capacity % PER_PAGE != 0 || capacity > 1 << 24 {
            return Err("a capacity this build does not read");
        }
        Ok(Some(Head {
            capacity,
            next: le64(&page[24..]),
            id: le64(&page[32..]),
        }))
    }
}

fn encode_record(ev: &BlockEvent, out: &mut [u8]) {
    out.fill(0);
    out[0..8].copy_from_slice(&ev.seq.to_le_bytes());
    out[8] = ev.kind.code();
    out[9] = ev.cause.code();
    out[12..16].copy_from_slice(&ev.pid.to_le_bytes());
    out[16..24].copy_from_slice(&ev.node.to_le_bytes());
    out[24..32].copy_from_slice(&ev.unix_ms.to_le_bytes());
    out[32..64].copy_from_slice(&ev.hash.0);
    let c = check32(&out[..RECORD - 4]);
    out[RECORD - 4..].copy_from_slice(&c);
}

/// The record in `b` if it is whole and valid (whatever its `seq`).
fn decode_record(b: &[u8]) -> Option<BlockEvent> {
    if b[RECORD - 4..] != check32(&b[..RECORD - 4]) {
        return None;
    }
    Some(BlockEvent {
        seq: le64(&b[0..]),
        kind: EventKind::of_code(b[8])?,
        cause: EventCause::of_code(b[9])?,
        pid: u32::from_le_bytes(b[12..16].try_into().ok()?),
        node: le64(&b[16..]),
        unix_ms: le64(&b[24..]),
        hash: BlockHash(b[32..64].try_into().ok()?),
    })
}

/// The file offset of the page holding slot `slot`.
fn page_of(slot: u64) -> u64 {
    PAGE as u64 * (1 + slot / PER_PAGE)
}

impl Journal {
    /// The journal's path, for messages.
    #[cfg(test)]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Takes the journal's lock (waiting at most its wait; see [`JournalGuard`]).
    pub fn lock(&self) -> Result<JournalGuard<'_>> {
        let local = self.local.lock().unwrap_or_else(|e| e.into_inner());
        super::ledger::flock_waiting(&self.fd, &self.path, self.wait, "the event journal")?;
        Ok(JournalGuard {
            journal: self,
            _local: local,
            pending: Vec::new(),
        })
    }

    fn read_page(&self, at: u64, page: &mut [u8]) -> Result<()> {
        let n = crate::sys::read_full(self.fd.as_fd(), at, &mut [std::io::IoSliceMut::new(page)])
            .map_err(|e| Error::from_io(&self.path, e))?;
        // Past the end (a sparse ring not written that far): zeros.
        page[n..].fill(0);
        Ok(())
    }

    fn write_page(&self, at: u64, page: &[u8]) -> Result<()> {
        let n = crate::sys::write_full(self.fd.as_fd(), at, &mut [std::io::IoSlice::new(page)])
            .map_err(|e| Error::from_io(&self.path, e))?;
        if n != page.len() {
            return Err(Error::from_io(
                &self.path,
                std::io::ErrorKind::WriteZero.into(),
            ));
        }
        Ok(())
    }

    fn corrupt(&self, why: &str) -> Error {
        Error::Corrupt {
            path: self.path.clone(),
            reason: crate::error::CorruptReason::ControlFile(why.into()),
        }
    }

    /// Where the journal ends now: its `next` and `journal_id`, no events (a consumer that
    /// starts here is told what happens from now on). Read without the lock.
    pub fn end(&self) -> Result<EventsRead> {
        let mut page = crate::buf::AlignedBuf::zeroed(PAGE);
        self.read_page(0, &mut page)?;
        Ok(match Head::decode(&page).map_err(|w| self.corrupt(w))? {
            Some(head) => EventsRead {
                next: head.next,
                journal_id: head.id,
                ..EventsRead::default()
            },
            None => EventsRead::default(),
        })
    }

    /// The events from `from` on (at most `max`), read without the lock.
    pub fn read_since(&self, from: u64, max: usize) -> Result<EventsRead> {
        let mut page = crate::buf::AlignedBuf::zeroed(PAGE);
        self.read_page(0, &mut page)?;
        let Some(head) = Head::decode(&page).map_err(|w| self.corrupt(w))? else {
            return Ok(EventsRead::default());
        };
        let mut out = EventsRead {
            next: head.next,
            journal_id: head.id,
            ..EventsRead::default()
        };
        // Asked from past the end: another journal's seq (this one was made again).
        let start = if from > head.next {
            0
        } else {
            from.max(head.next.saturating_sub(head.capacity))
        };
        out.missed = start.saturating_sub(from);
        let end = head.next.min(start.saturating_add(max as u64));
        let mut seq = start;
        let mut loaded = u64::MAX;
        while seq < end {
            let slot = seq % head.capacity;
            if page_of(slot) != loaded {
                self.read_page(page_of(slot), &mut page)?;
                loaded = page_of(slot);
            }
            let at = (slot % PER_PAGE) as usize * RECORD;
            match decode_record(&page[at..at + RECORD]) {
                Some(ev) if ev.seq == seq => out.events.push(ev),
                // Written over since the header was read (the ring went round): missed.
                Some(ev) if ev.seq > seq => {
                    out.missed += end - seq;
                    break;
                }
                // Being written: the rest is read next time.
                _ => {
                    out.next = seq;
                    return Ok(out);
                }
            }
            seq += 1;
        }
        out.next = end;
        Ok(out)
    }
}

impl JournalGuard<'_> {
    /// Records an event, appended (in the order recorded) when the guard drops.
    pub fn record(&mut self, kind: EventKind, cause: EventCause, hash: BlockHash) {
        self.pending.push((kind, cause, hash));
    }

    /// Appends the recorded events: reads the header (making it if the file is new, or making
    /// it again if it is not a journal this build reads), writes their pages, then the
    /// header with the next `seq`.
    fn append(&mut self) -> Result<()> {
        let j = self.journal;
        let mut head_page = crate::buf::AlignedBuf::zeroed(PAGE);
        j.read_page(0, &mut head_page)?;
        let head = match Head::decode(&head_page) {
            Ok(Some(h)) => h,
            bad => {
                if let Err(why) = bad {
                    tracing::warn!(path = %j.path.display(), why, "the event journal is unreadable: made again (consumers resync)");
                }
                let mut id = [0u8; 8];
                let seed = format!(
                    "{}.{}.{:?}",
                    node_id(),
                    std::process::id(),
                    std::time::SystemTime::now()
                );
                id.copy_from_slice(&blake3::hash(seed.as_bytes()).as_bytes()[..8]);
                // The file takes its full length at once (sparse): a distributed filesystem's
                // client that caches a file's size (GlusterFS's, for a second) would read
                // records past a size it cached as zeros.
                let len = page_of(JOURNAL_CAPACITY);
                rustix::fs::ftruncate(&j.fd, len)
                    .map_err(|e| Error::from_io(&j.path, io_err(e)))?;
                Head {
                    capacity: JOURNAL_CAPACITY,
                    next: 0,
                    id: u64::from_le_bytes(id),
                }
            }
        };
        let (node, pid) = (node_id(), std::process::id());
        let unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let mut page = crate::buf::AlignedBuf::zeroed(PAGE);
        let mut loaded: Option<u64> = None;
        let n = self.pending.len() as u64;
        for (i, &(kind, cause, hash)) in self.pending.iter().enumerate() {
            let seq = head.next + i as u64;
            let slot = seq % head.capacity;
            let at = page_of(slot);
            if loaded != Some(at) {
                if let Some(prev) = loaded {
                    j.write_page(prev, &page)?;
                }
                // The page's other records stay: older events still in the ring.
                j.read_page(at, &mut page)?;
                loaded = Some(at);
            }
            let ev = BlockEvent {
                seq,
                kind,
                cause,
                hash,
                node,
                pid,
                unix_ms,
            };
            let off = (slot % PER_PAGE) as usize * RECORD;
            encode_record(&ev, &mut page[off..off + RECORD]);
        }
        if let Some(prev) = loaded {
            j.write_page(prev, &page)?;
        }
        Head {
            next: head.next + n,
            ..head
        }
        .encode(&mut head_page);
        j.write_page(0, &head_page)?;
        if j.sync {
            rustix::fs::fdatasync(&j.fd).map_err(|e| Error::from_io(&j.path, io_err(e)))?;
        }
        Ok(())
    }
}

impl Drop for JournalGuard<'_> {
    fn drop(&mut self) {
        if !self.pending.is_empty() {
            if let Err(e) = self.append() {
                tracing::warn!(error = %e, events = self.pending.len(),
                    "could not append to the event journal: its consumers miss these events");
            }
        }
        let _ = rustix::fs::flock(&self.journal.fd, FlockOperation::Unlock);
    }
}

impl BlockDir {
    /// Opens the worker's event journal (a regular file beneath the worker directory; a
    /// symlink or FIFO there is refused), making it if `create`; `None` if it does not exist
    /// and is not to be made. Its lock waits at most `wait`. Read-only unless `writable`.
    /// With `direct`, opened `O_DIRECT` where the filesystem allows it: what the stores of a
    /// shared worker (on several nodes of a distributed filesystem) and readers elsewhere
    /// need, so that no client's cache serves another's older pages. An exclusive store, the
    /// only writer, writes through the page cache (a reader on this node reads the same
    /// pages; `O_DIRECT` readers see its writes, as the kernel writes back what they read).
    pub fn open_journal(
        &self,
        create: bool,
        writable: bool,
        direct: bool,
        wait: std::time::Duration,
    ) -> Result<Option<Journal>> {
        let access = if writable {
            OFlags::RDWR
        } else {
            OFlags::RDONLY
        };
        // Synced where the stores share the worker, whether or not `O_DIRECT` was granted.
        let sync = direct && writable;
        let opened = self.open_shared_file(EVENTS_FILE, create && writable, access, direct)?;
        Ok(opened.map(|(fd, _)| Journal {
            fd,
            path: self.full(EVENTS_FILE),
            sync,
            local: std::sync::Mutex::new(()),
            wait,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ns::tests::*;

    fn h(i: u64) -> BlockHash {
        BlockHash::of_engine_key(b"journal", &i.to_le_bytes())
    }

    fn append(j: &Journal, from: u64, n: u64) {
        let mut g = j.lock().unwrap();
        for i in from..from + n {
            let kind = if i % 3 == 2 {
                EventKind::Removed
            } else {
                EventKind::Stored
            };
            g.record(kind, EventCause::ALL[(i % 6) as usize], h(i));
        }
    }

    /// Events come back in order with their seq, kinds, causes and hashes; a reader that
    /// falls more than the ring behind is told how many it missed, and the rest are whole.
    #[test]
    fn events_come_back_in_order_and_a_reader_behind_the_ring_is_told_what_it_missed() {
        let (_t, d) = bd();
        assert!(
            d.open_journal(false, true, true, std::time::Duration::from_secs(1))
                .unwrap()
                .is_none()
        );
        let j = d
            .open_journal(true, true, false, std::time::Duration::from_secs(1))
            .unwrap()
            .unwrap();
        assert_eq!(j.read_since(0, 100).unwrap(), EventsRead::default());
        append(&j, 0, 5);
        append(&j, 5, 40);
        let r = j.read_since(0, 1000).unwrap();
        assert_eq!((r.next, r.missed, r.events.len()), (45, 0, 45));
        for (i, ev) in r.events.iter().enumerate() {
            let i = i as u64;
            assert_eq!((ev.seq, ev.hash), (i, h(i)));
            assert_eq!(ev.cause, EventCause::ALL[(i % 6) as usize]);
            assert_eq!(ev.kind == EventKind::Removed, i % 3 == 2);
            assert_eq!((ev.node, ev.pid), (node_id(), std::process::id()));
        }
        let r2 = j.read_since(40, 3).unwrap();
        assert_eq!(
            (r2.next, r2.events.iter().map(|e| e.seq).collect::<Vec<_>>()),
            (43, vec![40, 41, 42])
        );
        // A reader of another handle (another process) sees the same.
        let ro = d
            .open_journal(false, false, true, std::time::Duration::from_secs(1))
            .unwrap()
            .unwrap();
        assert_eq!(ro.read_since(0, 1000).unwrap(), r);
        // Round the ring: the first events are gone, the reader of 0 is told.
        let cap = JOURNAL_CAPACITY;
        append(&j, 45, cap);
        let r = j.read_since(0, usize::MAX).unwrap();
        assert_eq!((r.next, r.missed), (cap + 45, 45));
        assert_eq!(r.events.len() as u64, cap);
        assert!(
            r.events
                .iter()
                .enumerate()
                .all(|(i, e)| e.seq == 45 + i as u64 && e.hash == h(45 + i as u64))
        );
        assert_eq!(r.journal_id, ro.read_since(0, 0).unwrap().journal_id);
        // A file of the right size: the ring's pages and the header.
        let len = std::fs::metadata(j.path()).unwrap().len();
        assert_eq!(len, PAGE as u64 * (1 + cap / PER_PAGE));
    }

    /// A torn or foreign record stops the read there (read again later); a journal whose
    /// header is not one is made again with another identity.
    #[test]
    fn a_torn_record_is_not_read_and_a_broken_journal_is_made_again() {
        let (t, d) = bd();
        let wait = std::time::Duration::from_secs(1);
        let j = d.open_journal(true, true, true, wait).unwrap().unwrap();
        append(&j, 0, 10);
        let id = j.read_since(0, 0).unwrap().journal_id;
        let path = t.path().join("v1/w").join(EVENTS_FILE);
        let mut bytes = std::fs::read(&path).unwrap();
        // Record 4's hash, one byte.
        bytes[PAGE + 4 * RECORD + 40] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let r = j.read_since(0, 100).unwrap();
        assert_eq!((r.events.len(), r.next), (4, 4));
        // The header, one byte: made again on the next append.
        bytes[30] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        assert!(j.read_since(0, 1).is_err());
        append(&j, 0, 2);
        let r = j.read_since(0, 100).unwrap();
        assert_eq!(r.events.len(), 2);
        assert_ne!(r.journal_id, id);
    }
}
