//! The one walk of a worker's tree: every entry classified by one rule for its kind, for the
//! store's open-time sweep (`store::sweep`) and `tierkv-stat` alike.
//!
//! The walk lists each directory through the namespace layer (so no symlink is followed) and
//! hands each entry to a [`Visitor`] under one of these kinds:
//!
//! | entry | where | kind |
//! |---|---|---|
//! | symlink (or a directory replaced by one since its parent was listed) | anywhere | [`Visitor::symlink`] |
//! | directory named as a shard | above the leaves | descended into |
//! | any other directory, FIFO, device, socket | anywhere | [`Visitor::foreign`] |
//! | file named as a block | the leaf its layout puts it in | [`Visitor::block`] |
//! | file named as a block | anywhere else | [`Visitor::misplaced`] |
//! | a block's temp file | a leaf | [`Visitor::temp`] |
//! | a control file's temp file | the worker directory | [`Visitor::temp`] |
//! | a control file or a store's stats file | the worker directory | [`Visitor::meta`] |
//! | any other file | anywhere | [`Visitor::foreign`] |
//!
//! The worker directory is listed on the calling thread; the shard directories below it are
//! walked depth first by up to `threads` threads, each with a visitor of its own.

use std::path::PathBuf;
use std::sync::Mutex;

use rustix::io::Errno;

use super::{BlockDir, FileKind, Parent, join};
use crate::key::BlockHash;
use crate::layout::{EntryName, Layout};

/// Where an entry was found: the directory's descriptor and path, and the entry's name.
pub struct At<'a> {
    /// The worker's namespace.
    pub ns: &'a BlockDir,
    /// The directory holding the entry (for `*_in` operations on it).
    pub parent: &'a Parent<'a>,
    /// The directory, relative to the worker directory (`""` for the worker directory).
    pub dir: &'a str,
    /// The entry's name in it.
    pub name: &'a str,
}

impl At<'_> {
    /// The entry's path relative to the worker directory.
    pub fn rel(&self) -> String {
        join(self.dir, self.name)
    }

    /// The entry's full path, for messages.
    pub fn path(&self) -> PathBuf {
        self.ns.full(&self.rel())
    }
}

/// What a walk does with each kind of entry (the table in the module docs says which is which).
pub trait Visitor {
    /// A file named as a block, in the leaf directory its layout puts it in. Only its name was
    /// read: it may have been replaced or removed since the listing.
    fn block(&mut self, at: &At<'_>, hash: BlockHash);
    /// A file named as a block somewhere else than its layout puts it: never served.
    fn misplaced(&mut self, at: &At<'_>, hash: BlockHash);
    /// A temp file of a block being put (in a leaf) or of a control file being rewritten (in
    /// the worker directory).
    fn temp(&mut self, at: &At<'_>);
    /// A control file or a shared store's stats file, in the worker directory.
    fn meta(&mut self, at: &At<'_>);
    /// A symlink, never followed.
    fn symlink(&mut self);
    /// An entry that does not belong to the layout, left alone.
    fn foreign(&mut self);
    /// A directory that could not be listed.
    fn unreadable(&mut self, path: PathBuf, err: Errno);
    /// Every entry of the leaf directory `dir` has been visited.
    fn leaf_done(&mut self, dir: &str) {
        let _ = dir;
    }
}

/// Walks the tree of `ns` laid out as `layout`: the worker directory on this thread with a
/// visitor from `make`, the shard directories below it on up to `threads` threads (no more
/// than the machine's cores), each with a visitor from `make`. Returns every visitor, the
/// worker directory's first.
pub fn walk<V: Visitor + Send>(
    ns: &BlockDir,
    layout: Layout,
    threads: usize,
    make: impl Fn() -> V + Sync,
) -> Vec<V> {
    let mut top = make();
    let mut subdirs = Vec::new();
    walk_dir(ns, layout, "", 0, &mut top, &mut subdirs);
    let mut visitors = vec![top];
    if subdirs.is_empty() {
        return visitors;
    }
    visitors.extend(in_parallel(subdirs, threads, &make, |d, v: &mut V| {
        let mut stack: Vec<(String, u8)> = vec![(d, 1)];
        // Deeper levels are walked by the same thread, depth first.
        while let Some((dir, level)) = stack.pop() {
            let mut more = Vec::new();
            walk_dir(ns, layout, &dir, level, v, &mut more);
            stack.extend(more.into_iter().map(|m| (m, level + 1)));
        }
    }));
    visitors
}

/// Lists the directory `dir` at `level` (0: the worker directory) and hands each entry to `v`
/// by its kind; shard directories to descend into are pushed on `subdirs`.
fn walk_dir<V: Visitor>(
    ns: &BlockDir,
    layout: Layout,
    dir: &str,
    level: u8,
    v: &mut V,
    subdirs: &mut Vec<String>,
) {
    let (parent, entries) = match ns.list(dir) {
        Ok(x) => x,
        // Replaced by a symlink since its parent was listed: not followed.
        Err(Errno::LOOP) => return v.symlink(),
        Err(e) => return v.unreadable(ns.full(dir), e),
    };
    let is_leaf = level == layout.depth;
    for entry in entries {
        let name = entry.name_str();
        let at = At {
            ns,
            parent: &parent,
            dir,
            name,
        };
        match entry.kind {
            FileKind::Symlink => v.symlink(),
            FileKind::Dir if !is_leaf && layout.is_shard_dir(name) => subdirs.push(at.rel()),
            FileKind::Dir | FileKind::Special => v.foreign(),
            FileKind::File => match Layout::classify(name) {
                EntryName::Block(hash) if is_leaf && layout.rel_path(&hash).dir() == dir => {
                    v.block(&at, hash);
                }
                EntryName::Block(hash) => v.misplaced(&at, hash),
                EntryName::Temp if is_leaf => v.temp(&at),
                EntryName::ControlTemp if level == 0 => v.temp(&at),
                EntryName::Meta if level == 0 => v.meta(&at),
                _ => v.foreign(),
            },
        }
    }
    if is_leaf {
        v.leaf_done(dir);
    }
}

/// Runs `job` over `items` on up to `max_threads` threads (no more than the machine's cores or
/// the items): each thread takes the next item from a shared queue and folds what it finds
/// into a result of its own (from `make`), and the threads' results are returned.
fn in_parallel<T: Send, R: Send>(
    items: Vec<T>,
    max_threads: usize,
    make: &(impl Fn() -> R + Sync),
    job: impl Fn(T, &mut R) + Sync,
) -> Vec<R> {
    let threads = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .clamp(1, max_threads.max(1))
        .min(items.len());
    let queue = Mutex::new(items);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut r = make();
                    loop {
                        let next = queue.lock().unwrap_or_else(|e| e.into_inner()).pop();
                        let Some(item) = next else { break };
                        job(item, &mut r);
                    }
                    r
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("walk thread panicked"))
            .collect()
    })
}
