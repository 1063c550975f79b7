//! The one error type of the crate.

use std::io;
use std::path::PathBuf;

/// Everything that can go wrong in tierkv.
///
/// A missing block is never an error: lookups report it as a miss. Errors carry the path or
/// key they concern.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A worker id, hash or key that cannot name a block (it would be ambiguous, or escape the
    /// cache root). Nothing was read or written.
    #[error("invalid key: {reason}")]
    InvalidKey {
        /// Why it was rejected.
        reason: String,
    },
    /// A block larger than the configured maximum. Nothing was written.
    #[error("block {key} is {len} bytes, over the configured maximum of {max} bytes")]
    TooLarge {
        /// The key of the rejected block.
        key: String,
        /// Its length.
        len: usize,
        /// The configured maximum (`StoreConfig::max_block_size`).
        max: usize,
    },
    /// The caller's buffer cannot hold the stored block. Nothing was copied.
    #[error("buffer of {have} bytes is too small for block {key} of {need} bytes")]
    BufferTooSmall {
        /// The key that was read.
        key: String,
        /// Bytes the block holds.
        need: usize,
        /// Bytes the buffer holds.
        have: usize,
    },
    /// The filesystem is full (ENOSPC or EDQUOT: no blocks or no inodes left). Nothing
    /// partial was left behind.
    #[error("no space left on the filesystem while writing {path}")]
    NoSpace {
        /// The file or directory that could not be written or created.
        path: PathBuf,
        /// The underlying error (ENOSPC or EDQUOT).
        #[source]
        source: io::Error,
    },
    /// The process or system open-file limit was hit even after the open-file cache was
    /// emptied.
    #[error("too many open files while opening {path} (open-file cache already emptied)")]
    TooManyOpenFiles {
        /// The file that could not be opened.
        path: PathBuf,
        /// The underlying error (EMFILE or ENFILE).
        #[source]
        source: io::Error,
    },
    /// A file of the tree failed its checks (a block's header, length or checksum; a control
    /// file that is not a small regular file). Lookups never return this for a block (a
    /// corrupt block is a miss); opening a store and tools that inspect a tree do.
    #[error("corrupt file {path}: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: CorruptReason,
    },
    /// The store was opened read-only ([`StoreConfig::with_read_only`](crate::StoreConfig::with_read_only)):
    /// it serves reads and writes nothing.
    #[error("store of {path} is read-only: {op} refused")]
    ReadOnly {
        /// The worker directory.
        path: PathBuf,
        /// What was refused.
        op: &'static str,
    },
    /// The tree was written with a different layout than the one configured.
    #[error(
        "layout mismatch in {path}: the tree has {found}, the configuration asks for {configured}"
    )]
    LayoutMismatch {
        /// The layout file.
        path: PathBuf,
        /// The layout recorded in the tree.
        found: String,
        /// The layout in the configuration.
        configured: String,
    },
    /// Another store (in this or another process) holds this worker's directory.
    #[error("worker directory {path} is in use by another store ({holder})")]
    WorkerBusy {
        /// The worker's directory.
        path: PathBuf,
        /// Who holds it, as its `.lock` file says (`pid N on HOST`), or `holder unknown`.
        holder: String,
    },
    /// The operation needs something this store was not built with, e.g. GPU memory with an
    /// engine that moves host memory only. Nothing was read or written.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The configuration is inconsistent.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// Any other I/O error, with the path it concerns.
    #[error("I/O error on {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
}

/// Why a header was rejected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HeaderError {
    /// Fewer than [`HEADER_LEN`](crate::format::HEADER_LEN) bytes.
    #[error("header truncated: {0} bytes")]
    Truncated(usize),
    /// Not a tierkv block file.
    #[error("bad magic")]
    BadMagic,
    /// Written by another format version.
    #[error("unsupported format version {0}")]
    Version(u16),
    /// A field holds a value this version never writes.
    #[error("bad header field: {0}")]
    Field(&'static str),
    /// The header's own check value does not match its fields.
    #[error("header check mismatch")]
    HeaderCheck,
}

/// Why a file of the tree is corrupt.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CorruptReason {
    /// The 128-byte header is invalid.
    #[error("{0}")]
    Header(#[from] HeaderError),
    /// Bytes 128..4096 are not all zero.
    #[error("header padding is not zero")]
    Padding,
    /// The header names another block than the file name.
    #[error("header names block {0}")]
    OtherBlock(String),
    /// The file's length is not `4096 + payload length`.
    #[error("file is {file} bytes, header says {header}")]
    Length {
        /// The file's length (or what could be read of it).
        file: u64,
        /// The length its header implies.
        header: u64,
    },
    /// The payload's blake3 differs from the header's.
    #[error("payload checksum mismatch")]
    Checksum,
    /// Not a regular file (a symlink, FIFO, device, socket or directory).
    #[error("not a regular file but a {0}")]
    NotRegular(crate::sys::FileKind),
    /// A control file (`LAYOUT`, `STATS.json`, `.lock`) that cannot be what it should.
    #[error("{0}")]
    ControlFile(String),
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Classifies an I/O error on `path`: ENOSPC/EDQUOT become [`Error::NoSpace`],
    /// EMFILE/ENFILE [`Error::TooManyOpenFiles`], the rest [`Error::Io`].
    pub fn from_io(path: impl Into<PathBuf>, source: io::Error) -> Self {
        let path = path.into();
        match source.raw_os_error() {
            Some(code)
                if code == rustix::io::Errno::NOSPC.raw_os_error()
                    || code == rustix::io::Errno::DQUOT.raw_os_error() =>
            {
                Error::NoSpace { path, source }
            }
            Some(code)
                if code == rustix::io::Errno::MFILE.raw_os_error()
                    || code == rustix::io::Errno::NFILE.raw_os_error() =>
            {
                Error::TooManyOpenFiles { path, source }
            }
            _ => Error::Io { path, source },
        }
    }

    pub(crate) fn invalid_key(reason: impl Into<String>) -> Self {
        Error::InvalidKey {
            reason: reason.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_errno() {
        let e = Error::from_io("/x", io::Error::from_raw_os_error(28));
        assert!(matches!(e, Error::NoSpace { .. }), "{e}");
        let e = Error::from_io("/x", io::Error::from_raw_os_error(24));
        assert!(matches!(e, Error::TooManyOpenFiles { .. }), "{e}");
        let e = Error::from_io("/x", io::Error::from_raw_os_error(5));
        assert!(matches!(e, Error::Io { .. }), "{e}");
        assert!(e.to_string().contains("/x"));
    }
}
