//! Control files (`LAYOUT`, `STATS.json`, `.lock`, ...): read with a size bound, written
//! through a temp name renamed into place.

use super::*;

impl BlockDir {
    /// Reads the control file `name` of the worker directory: `None` if it does not exist.
    /// Refuses a symlink, a non-regular file (a FIFO cannot hang the read) and a file over
    /// `MAX_CONTROL_LEN`; errors name the path and never quote the contents.
    pub fn read_control(&self, name: &str) -> Result<Option<Vec<u8>>> {
        let path = self.full(name);
        let fd = match self.open_file(name, OFlags::RDONLY | OFlags::NOATIME) {
            Err(Errno::PERM) => self.open_file(name, OFlags::RDONLY),
            r => r,
        };
        let fd = match fd {
            Ok(Opened::File(fd, st)) => {
                if st.st_size as u64 > MAX_CONTROL_LEN as u64 {
                    return Err(Error::Corrupt {
                        path,
                        reason: crate::error::CorruptReason::ControlFile(format!(
                            "{} bytes, over the {MAX_CONTROL_LEN} a control file may have",
                            st.st_size
                        )),
                    });
                }
                fd
            }
            Ok(Opened::NotRegular(kind)) => {
                return Err(Error::Corrupt {
                    path,
                    reason: crate::error::CorruptReason::NotRegular(kind),
                });
            }
            Err(Errno::NOENT) => return Ok(None),
            Err(Errno::LOOP) => {
                return Err(Error::Corrupt {
                    path,
                    reason: crate::error::CorruptReason::NotRegular(FileKind::Symlink),
                });
            }
            Err(e) => return Err(Error::from_io(path, io_err(e))),
        };
        let mut out = Vec::new();
        let mut buf = [0u8; 8192];
        loop {
            match rustix::io::read(&fd, &mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    out.extend_from_slice(&buf[..n]);
                    if out.len() > MAX_CONTROL_LEN {
                        return Err(Error::Corrupt {
                            path,
                            reason: crate::error::CorruptReason::ControlFile(
                                "grew over the size a control file may have".into(),
                            ),
                        });
                    }
                }
                Err(Errno::INTR) => {}
                Err(e) => return Err(Error::from_io(path, io_err(e))),
            }
        }
        Ok(Some(out))
    }

    /// A temp name for `stem` (a block's file name or a control file's):
    /// `.tmp.<stem>.<node>.<pid>.<seq>`. The sequence is this directory handle's, starting at
    /// an unpredictable number, so two stores of one process (one node, one pid) differ.
    pub fn temp_name(&self, stem: &str) -> String {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        format!(
            "{TEMP_PREFIX}{stem}.{:016x}.{}.{seq}",
            node_id(),
            std::process::id()
        )
    }

    /// The temp name a control file is written under: `.tmp.<name>.<node>.<pid>.<seq>`.
    pub fn control_temp_name(&self, name: &str) -> String {
        self.temp_name(name)
    }

    /// Writes the control file `name` atomically: a new `O_EXCL | O_NOFOLLOW` temp file
    /// ([`BlockDir::control_temp_name`]), then `rename` over `name` (a symlink at `name` is
    /// replaced, never followed). The temp file is unlinked on any failure.
    pub fn write_control(&self, name: &str, bytes: &[u8]) -> Result<()> {
        let top = Parent::Top(self.fd.as_fd());
        let mut tries = 0;
        let (tmp, fd) = loop {
            let tmp = self.control_temp_name(name);
            match self.create_in(&top, &tmp, OFlags::WRONLY, Mode::from_raw_mode(FILE_MODE)) {
                Ok(fd) => break (tmp, fd),
                // Something already has the name (left by a crash, or planted): another name.
                Err(Errno::EXIST) if tries < 16 => tries += 1,
                Err(e) => return Err(Error::from_io(self.full(&tmp), io_err(e))),
            }
        };
        let written = crate::sys::write_full(fd.as_fd(), 0, &mut [std::io::IoSlice::new(bytes)])
            .and_then(|n| {
                if n == bytes.len() {
                    Ok(())
                } else {
                    Err(std::io::ErrorKind::WriteZero.into())
                }
            })
            .map_err(|e| Error::from_io(self.full(&tmp), e))
            .and_then(|()| {
                self.rename_in(&top, &tmp, name)
                    .map_err(|e| Error::from_io(self.full(name), io_err(e)))
            });
        if written.is_err() {
            let _ = rustix::fs::unlinkat(&self.fd, tmp.as_str(), AtFlags::empty());
        }
        written
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ns::tests::*;

    #[test]
    fn control_files_replace_symlinks_and_leave_no_temp() {
        let (_t, d) = bd();
        let outside = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(outside.path(), b"keep").unwrap();
        std::os::unix::fs::symlink(outside.path(), d.path().join("STATS.json")).unwrap();
        assert!(d.read_control("STATS.json").is_err());
        d.write_control("STATS.json", b"{}").unwrap();
        assert_eq!(std::fs::read(outside.path()).unwrap(), b"keep");
        assert_eq!(d.read_control("STATS.json").unwrap().unwrap(), b"{}");
        let names: Vec<String> = d
            .read_dir("")
            .unwrap()
            .into_iter()
            .map(|e| e.name_str().to_string())
            .collect();
        assert_eq!(names, vec!["STATS.json".to_string()]);
        // A failing rename leaves no temp file behind.
        let f = Arc::new(NsFaults::new());
        f.fail(NsOp::Rename, Errno::NOSPC, 0, 1);
        let d2 = BlockDir::open_with_faults(_t.path(), "w", false, Some(f)).unwrap();
        assert!(matches!(
            d2.write_control("LAYOUT", b"x"),
            Err(Error::NoSpace { .. })
        ));
        assert_eq!(d.read_dir("").unwrap().len(), 1);
    }
}
