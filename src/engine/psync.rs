//! The `psync` engine: vectored `preadv`/`pwritev` on the calling thread, one request after
//! the other.

use std::io;

use super::{IoEngine, IoKind, IoRequest};

/// Positioned, vectored reads and writes from the calling thread. Works with buffered and
/// `O_DIRECT` descriptors alike (for `O_DIRECT` the store passes aligned buffers).
#[derive(Debug, Default, Clone, Copy)]
pub struct PsyncEngine;

impl PsyncEngine {
    /// The engine.
    pub fn new() -> Self {
        PsyncEngine
    }
}

use crate::sys::{read_full, read_full_feeding, write_full};

impl IoEngine for PsyncEngine {
    fn name(&self) -> &'static str {
        "psync"
    }

    fn concurrent_submits(&self) -> bool {
        true
    }

    fn submit(&self, batch: &mut [IoRequest<'_>]) -> Vec<io::Result<usize>> {
        batch
            .iter_mut()
            .map(|r| match (&mut r.kind, &mut r.feed) {
                (IoKind::Read(bufs), Some(feed)) => {
                    read_full_feeding(r.fd, r.offset, bufs, super::FEED_CHUNK, &mut |b| {
                        feed.0.landed(b)
                    })
                }
                (IoKind::Read(bufs), None) => read_full(r.fd, r.offset, bufs),
                (IoKind::Write(bufs), _) => write_full(r.fd, r.offset, bufs),
                (IoKind::ReadDevice(_) | IoKind::WriteDevice(_), _) => {
                    Err(super::device_unsupported(self.name()))
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn contract() {
        super::super::contract::run_all(&super::PsyncEngine::new());
    }
}
