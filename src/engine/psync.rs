//! The `psync` engine: vectored `preadv`/`pwritev` on the calling thread, one request after
//! the other.

use std::io::{self, IoSlice, IoSliceMut};

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

fn errno(e: rustix::io::Errno) -> io::Error {
    io::Error::from_raw_os_error(e.raw_os_error())
}

/// Reads until `bufs` are full or the file ends.
pub(crate) fn read_full(
    fd: std::os::fd::BorrowedFd<'_>,
    offset: u64,
    bufs: &mut [IoSliceMut<'_>],
) -> io::Result<usize> {
    let want: usize = bufs.iter().map(|b| b.len()).sum();
    let mut done = 0usize;
    let mut rest: &mut [IoSliceMut<'_>] = bufs;
    while done < want {
        match rustix::io::preadv(fd, rest, offset + done as u64) {
            Ok(0) => break,
            Ok(n) => {
                done += n;
                IoSliceMut::advance_slices(&mut rest, n);
            }
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(errno(e)),
        }
    }
    Ok(done)
}

/// Writes every byte of `bufs` or fails.
pub(crate) fn write_full(
    fd: std::os::fd::BorrowedFd<'_>,
    offset: u64,
    bufs: &mut [IoSlice<'_>],
) -> io::Result<usize> {
    let want: usize = bufs.iter().map(|b| b.len()).sum();
    let mut done = 0usize;
    let mut rest: &mut [IoSlice<'_>] = bufs;
    while done < want {
        match rustix::io::pwritev(fd, rest, offset + done as u64) {
            Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero)),
            Ok(n) => {
                done += n;
                IoSlice::advance_slices(&mut rest, n);
            }
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(errno(e)),
        }
    }
    Ok(done)
}

impl IoEngine for PsyncEngine {
    fn name(&self) -> &'static str {
        "psync"
    }

    fn submit(&self, batch: &mut [IoRequest<'_>]) -> Vec<io::Result<usize>> {
        batch
            .iter_mut()
            .map(|r| match &mut r.kind {
                IoKind::Read(bufs) => read_full(r.fd, r.offset, bufs),
                IoKind::Write(bufs) => write_full(r.fd, r.offset, bufs),
                IoKind::ReadDevice(_) | IoKind::WriteDevice(_) => {
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
