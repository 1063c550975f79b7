//! Blocks to and from GPU memory (`get_many_device`, `put_many_device`).
//!
//! This machine has no GPU. The store's device paths (header sealed from the bytes in the
//! file, checks through the host, publication, failures) run here against real files through
//! `HostAsDevice`, a test engine that stands in for NIXL GDS by treating a `DeviceMem` address
//! as host memory. The real GDS transfer is run by `tools/gds-roundtrip.sh` on a GPU machine.
//! Engines without device support must refuse device memory without touching anything; the
//! nixl engine without a GPU must fail device requests clearly and keep serving host ones.

mod common;

use std::io::{self, IoSlice, IoSliceMut};
use std::sync::Arc;

use common::*;
use tierkv::DeviceMem;
use tierkv::engine::{EngineKind, IoEngine, IoKind, IoRequest, PsyncEngine};
use tierkv::testing::{FaultPlan, FaultyEngine};
use tierkv::{Error, Lookup, Store, StoreConfig, VerifyMode};

/// "Device" memory that is host memory: moves `ReadDevice`/`WriteDevice` with pread/pwrite.
#[derive(Debug, Default)]
struct HostAsDevice {
    inner: PsyncEngine,
}

impl IoEngine for HostAsDevice {
    fn name(&self) -> &'static str {
        "host-as-device"
    }

    fn moves_device_memory(&self) -> bool {
        true
    }

    fn submit(&self, batch: &mut [IoRequest<'_>]) -> Vec<io::Result<usize>> {
        batch
            .iter_mut()
            .map(|r| {
                let (mem, write) = match &r.kind {
                    IoKind::ReadDevice(m) => (*m, false),
                    IoKind::WriteDevice(m) => (*m, true),
                    _ => return self.inner.submit(std::slice::from_mut(r)).pop().unwrap(),
                };
                // cuFile moves unaligned ranges of O_DIRECT files itself; so does this engine,
                // through a second descriptor of the same file without O_DIRECT.
                let fd = std::os::fd::AsRawFd::as_raw_fd(&r.fd);
                let f = std::fs::OpenOptions::new()
                    .read(true)
                    .write(write)
                    .open(format!("/proc/self/fd/{fd}"))?;
                let f = std::os::fd::AsFd::as_fd(&f);
                let mut one = if write {
                    // SAFETY: the tests below build every DeviceMem from a live host buffer
                    // that outlives the store call.
                    let src =
                        unsafe { std::slice::from_raw_parts(mem.addr() as *const u8, mem.len()) };
                    IoRequest::write(f, r.offset, vec![IoSlice::new(src)])
                } else {
                    // SAFETY: as above.
                    let dst =
                        unsafe { std::slice::from_raw_parts_mut(mem.addr() as *mut u8, mem.len()) };
                    IoRequest::read(f, r.offset, vec![IoSliceMut::new(dst)])
                };
                self.inner
                    .submit(std::slice::from_mut(&mut one))
                    .pop()
                    .unwrap()
            })
            .collect()
    }
}

/// A "device" buffer over host memory, for `HostAsDevice`.
fn dev(buf: &mut [u8]) -> DeviceMem {
    // SAFETY: only HostAsDevice dereferences it, while `buf` is alive; engines without device
    // support never touch it.
    unsafe { DeviceMem::new(buf.as_mut_ptr() as u64, buf.len(), 0) }
}

fn store_with(dir: &std::path::Path, engine: Arc<dyn IoEngine>, config: StoreConfig) -> Store {
    Store::open_with_engine(dir, worker("gpu0"), config, engine).unwrap()
}

#[test]
fn device_round_trips_match_host_blocks() {
    for direct in [false, true] {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let store = store_with(
            dir.path(),
            Arc::new(HostAsDevice::default()),
            StoreConfig::default().with_direct_io(direct),
        );
        let keys = keys(&store, 6);
        // Odd sizes: the header is sealed from bytes that do not fill the last page.
        let mut src: Vec<Vec<u8>> = (0..6u64)
            .map(|i| payload(i, 1, 5000 + 700 * i as usize))
            .collect();
        let items: Vec<_> = keys[..3]
            .iter()
            .cloned()
            .zip(src[..3].iter_mut().map(|b| dev(b)))
            .collect();
        for r in store.put_many_device(&items) {
            r.unwrap();
        }
        // Host puts of the others.
        for i in 3..6 {
            store.put(&keys[i], &src[i]).unwrap();
        }
        // Every file is complete and checksummed, whichever memory it came from.
        assert_eq!(check_all_blocks(dir.path()), 6, "direct={direct}");
        assert!(temp_files_under(dir.path()).is_empty());
        // Host reads of device-written blocks, device reads of host-written ones.
        for i in 0..6 {
            let mut host = vec![0u8; 10_000];
            assert_eq!(
                store.get(&keys[i], &mut host).unwrap(),
                Lookup::Hit(src[i].len())
            );
            assert_eq!(
                &host[..src[i].len()],
                &src[i][..],
                "block {i} direct={direct}"
            );
        }
        let mut outs: Vec<Vec<u8>> = (0..7).map(|_| vec![0u8; 10_000]).collect();
        let mut all = keys.clone();
        all.push(store.key(hash(99))); // never stored
        let mems: Vec<DeviceMem> = outs.iter_mut().map(|b| dev(b)).collect();
        let got = store.get_many_device(&all, &mems);
        for i in 0..6 {
            assert_eq!(got[i].as_ref().unwrap(), &Lookup::Hit(src[i].len()));
            assert_eq!(&outs[i][..src[i].len()], &src[i][..], "direct={direct}");
        }
        assert_eq!(got[6].as_ref().unwrap(), &Lookup::Miss);
        // Again, from the open-file cache.
        let got = store.get_many_device(&all[..6], &mems[..6]);
        assert!(got.iter().all(|r| matches!(r, Ok(Lookup::Hit(_)))));
        let s = store.stats();
        assert!(s.fd_cache_hits >= 6, "{s:?}");
        assert_eq!(s.misses, 1);
        // Overwrite from device memory: the new bytes win.
        src[0] = payload(0, 2, 3000);
        let m = dev(&mut src[0]);
        store.put_many_device(&[(keys[0].clone(), m)])[0]
            .as_ref()
            .unwrap();
        let mut back = vec![0u8; 3000];
        assert_eq!(store.get(&keys[0], &mut back).unwrap(), Lookup::Hit(3000));
        assert_eq!(back, src[0]);
    }
}

#[test]
fn device_reads_check_blocks_like_host_reads() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with(
        dir.path(),
        Arc::new(HostAsDevice::default()),
        StoreConfig::default().with_verify(VerifyMode::Always),
    );
    let keys = keys(&store, 3);
    for (i, k) in keys.iter().enumerate() {
        store.put(k, &payload(i as u64, 0, 8192)).unwrap();
    }
    // A flipped payload byte: a miss, the file removed.
    let p = store.path_of(&keys[0].hash);
    let mut bytes = std::fs::read(&p).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&p, &bytes).unwrap();
    // A buffer too small: an error, nothing removed.
    let mut small = vec![0u8; 100];
    let mut ok = vec![0u8; 8192];
    let mut gone = vec![0u8; 8192];
    std::fs::remove_file(store.path_of(&keys[2].hash)).unwrap();
    let got = store.get_many_device(&keys, &[dev(&mut ok), dev(&mut small), dev(&mut gone)]);
    assert_eq!(got[0].as_ref().unwrap(), &Lookup::Miss);
    assert!(!p.exists(), "the corrupt file is removed");
    assert!(
        matches!(
            got[1],
            Err(Error::BufferTooSmall {
                need: 8192,
                have: 100,
                ..
            })
        ),
        "{:?}",
        got[1]
    );
    assert!(store.path_of(&keys[1].hash).exists());
    assert_eq!(
        got[2].as_ref().unwrap(),
        &Lookup::Miss,
        "deleted behind our back"
    );
    assert_eq!(store.stats().corrupt, 1);
}

/// A device engine whose reads into device memory come back one byte short, as a file that
/// shrank between the store's checks and the transfer would.
#[derive(Debug, Default)]
struct ShortDeviceReads(HostAsDevice);

impl IoEngine for ShortDeviceReads {
    fn name(&self) -> &'static str {
        "short-device-reads"
    }

    fn moves_device_memory(&self) -> bool {
        true
    }

    fn submit(&self, batch: &mut [IoRequest<'_>]) -> Vec<io::Result<usize>> {
        let device: Vec<bool> = batch
            .iter()
            .map(|r| matches!(r.kind, IoKind::ReadDevice(_)))
            .collect();
        self.0
            .submit(batch)
            .into_iter()
            .zip(device)
            .map(|(r, d)| if d { r.map(|n| n - 1) } else { r })
            .collect()
    }
}

#[test]
fn a_short_device_read_is_a_corrupt_miss() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with(
        dir.path(),
        Arc::new(ShortDeviceReads::default()),
        StoreConfig::default(),
    );
    let k = store.key(hash(1));
    store.put(&k, &payload(1, 0, 5000)).unwrap();
    let mut buf = vec![0u8; 5000];
    let got = store.get_many_device(std::slice::from_ref(&k), &[dev(&mut buf)]);
    assert_eq!(got[0].as_ref().unwrap(), &Lookup::Miss);
    assert_eq!(store.stats().corrupt, 1);
    assert!(!store.path_of(&k.hash).exists(), "removed");
}

#[test]
fn a_failed_device_write_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Arc::new(FaultyEngine::new(
        Arc::new(HostAsDevice::default()),
        FaultPlan {
            // The first put's two writes (the payload from the device, then the header,
            // both through the engine) pass; every later write fails.
            fail_writes_from: Some(2),
            fail_reads_from: None,
            partial_fraction: 0.0,
            errno: 5,
        },
    ));
    let store = store_with(dir.path(), engine, StoreConfig::default());
    let keys = keys(&store, 3);
    let mut bufs: Vec<Vec<u8>> = (0..3u64).map(|i| payload(i, 0, 4096)).collect();
    let items: Vec<_> = keys
        .iter()
        .cloned()
        .zip(bufs.iter_mut().map(|b| dev(b)))
        .collect();
    let mut res = store.put_many_device(&items[..1]);
    res.extend(store.put_many_device(&items[1..]));
    assert!(res[0].is_ok());
    assert!(matches!(res[1], Err(Error::Io { .. })), "{:?}", res[1]);
    assert!(matches!(res[2], Err(Error::Io { .. })));
    assert_eq!(check_all_blocks(dir.path()), 1);
    assert!(temp_files_under(dir.path()).is_empty());
    assert_eq!(
        store
            .contains_many(&keys)
            .into_iter()
            .map(Result::unwrap)
            .collect::<Vec<_>>(),
        [true, false, false]
    );
}

#[test]
fn host_engines_refuse_device_memory_and_touch_nothing() {
    for kind in [EngineKind::Psync, EngineKind::IoUring] {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(
            dir.path(),
            worker("0"),
            StoreConfig::default().with_engine(kind),
        )
        .unwrap();
        let keys = keys(&store, 2);
        store.put(&keys[0], &payload(0, 0, 4096)).unwrap();
        let before = files_under(dir.path()).len();
        // Never dereferenced: refused before any I/O.
        // SAFETY: see above; no engine here reads device memory.
        let fake = unsafe { DeviceMem::new(0x7000_0000_0000, 4096, 0) };
        for r in store.get_many_device(&keys, &[fake, fake]) {
            assert!(
                matches!(&r, Err(Error::Unsupported(m)) if m.contains("nixl")),
                "{kind}: {r:?}"
            );
        }
        let items = vec![(keys[1].clone(), fake)];
        assert!(matches!(
            store.put_many_device(&items)[0],
            Err(Error::Unsupported(_))
        ));
        assert_eq!(files_under(dir.path()).len(), before);
        assert!(!store.contains_many(&keys[1..]).pop().unwrap().unwrap());
        // The store still serves host memory.
        let mut back = vec![0u8; 4096];
        assert_eq!(store.get(&keys[0], &mut back).unwrap(), Lookup::Hit(4096));
        // And an engine asked directly fails the request, not the batch.
        let f = std::fs::File::open(store.path_of(&keys[0].hash)).unwrap();
        let engine = kind.build().unwrap();
        let mut host = vec![0u8; 16];
        let mut batch = [
            IoRequest::read_device(std::os::fd::AsFd::as_fd(&f), 0, fake),
            IoRequest::read(
                std::os::fd::AsFd::as_fd(&f),
                0,
                vec![IoSliceMut::new(&mut host)],
            ),
        ];
        let res = engine.submit(&mut batch);
        assert_eq!(
            res[0].as_ref().unwrap_err().kind(),
            io::ErrorKind::Unsupported
        );
        assert_eq!(*res[1].as_ref().unwrap(), 16);
    }
}

/// The nixl engine on a machine without a GPU: device requests fail with an error that says
/// what GDS needs; host requests on the same store keep working.
#[cfg(feature = "nixl")]
#[test]
fn nixl_without_a_gpu_fails_device_requests_clearly() {
    if std::path::Path::new("/dev/nvidia0").exists() {
        skip("this machine has a GPU (tools/gds-roundtrip.sh tests GDS there)");
        return;
    }
    let engine = match EngineKind::Nixl.build() {
        Ok(e) => e,
        Err(e) if std::env::var_os("TIERKV_REQUIRE_NIXL").is_none() => {
            skip(&e.to_string());
            return;
        }
        Err(e) => panic!("TIERKV_REQUIRE_NIXL is set and NIXL is missing: {e}"),
    };
    let dir = tempfile::tempdir().unwrap();
    let store = store_with(dir.path(), engine, StoreConfig::default());
    let keys = keys(&store, 2);
    store.put(&keys[0], &payload(0, 0, 4096)).unwrap();
    // SAFETY: no GPU backend can be created here, so nothing dereferences it.
    let fake = unsafe { DeviceMem::new(0x7000_0000_0000, 4096, 0) };
    let got = store.get_many_device(&keys, &[fake, fake]);
    let msg = got[0].as_ref().unwrap_err().to_string();
    eprintln!("the error: {msg}");
    assert!(msg.contains("GDS"), "{msg}");
    assert_eq!(got[1].as_ref().unwrap(), &Lookup::Miss);
    let put = store.put_many_device(&[(keys[1].clone(), fake)]);
    assert!(put[0].is_err());
    assert!(temp_files_under(dir.path()).is_empty());
    assert!(!store.contains_many(&keys[1..]).pop().unwrap().unwrap());
    // Host memory still moves through POSIX.
    let mut back = vec![0u8; 4096];
    assert_eq!(store.get(&keys[0], &mut back).unwrap(), Lookup::Hit(4096));
    assert_eq!(back, payload(0, 0, 4096));
    store.put(&keys[1], &payload(1, 0, 4096)).unwrap();
    assert_eq!(check_all_blocks(dir.path()), 2);
}
