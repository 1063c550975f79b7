#!/usr/bin/env python3
"""dfs-probe.py — measure, across two client mounts of one shared filesystem, the
semantics a shared block store (tierkv's shared mode) depends on.

Usage (after `tools/dfs.sh up`, which prints the two mount points):

    python3 tools/research/dfs-probe.py --a /mnt/tierkv-dfs/n1 --b /mnt/tierkv-dfs/n2 \
        --local /var/tmp --label coherent [--quick] [--json out.json] > results.md

"a" plays the publishing node (n1), "b" the other node (n2). Every loop is bounded
in count and in time (--max-seconds is a global deadline; each section has its own
cap as well). Python stdlib only. Prints a markdown report on stdout, progress on
stderr. Sections:

  a  visibility of a new name (tmp + rename) on a, seen from b (stat, open+read)
  b  a name read on b, then unlinked on a: how long b still opens/reads it; errors
  c  a name read on b, then replaced by rename (different content) on a: stale
     window on b; torn / empty / mixed reads; plus "inode reuse" (a renames the
     file away and rewrites it in place: can b read the new bytes under the old name?)
  d  O_EXCL create race from both mounts (exactly one winner?)
  e  link() onto an existing name, link() race, rename() onto an existing name,
     renameat2(RENAME_NOREPLACE)
  f  flock and fcntl locks across the two mounts (and flock vs fcntl)
  g  O_DIRECT with 4 KiB-aligned buffers; where an unaligned O_DIRECT write fails
  h  stat of a missing name /s, open+read+close of a 2 MiB file /s, put (write
     2 MiB tmp + rename) /s, on each mount and on the local filesystem
  i  does st_atime advance on read (relatime / noatime)?
  j  statfs f_bavail: how it moves when data is written
  k  openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS) on the volume
"""

import argparse
import ctypes
import errno
import json
import mmap
import os
import pickle
import platform
import select
import signal
import statistics
import struct
import sys
import time

ERRNAME = errno.errorcode

# ----------------------------------------------------------------------------------
# helpers


def log(*a):
    print("dfs-probe:", *a, file=sys.stderr, flush=True)


def now():
    return time.monotonic()


class Deadline:
    def __init__(self, seconds):
        self.end = now() + seconds

    def left(self):
        return self.end - now()

    def over(self):
        return now() >= self.end


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, int(round(p / 100.0 * (len(xs) - 1)))))
    return xs[k]


def ms(x):
    if x is None or x != x:
        return "-"
    return f"{x * 1000:.2f}"


def fmt_rate(n, secs):
    return f"{n / secs:,.0f}" if secs > 0 else "-"


def ename(e):
    return ERRNAME.get(e, str(e))


def content(tag, size, gen=0):
    """size bytes; every 4 KiB block starts with a 16-byte header naming the tag,
    the generation and the block index, so a mixed or shifted read is detectable."""
    blk = 4096
    out = bytearray(size)
    fill = bytes([(gen * 37 + 11) & 0xFF]) * blk
    for off in range(0, size, blk):
        n = min(blk, size - off)
        out[off:off + n] = fill[:n]
        hdr = struct.pack("<4sII4s", tag[:4].ljust(4, b"_"), gen, off // blk, b"TKV!")
        out[off:off + min(16, n)] = hdr[:min(16, n)]
    return bytes(out)


def classify(data, size, old_gen, new_gen, tag):
    """'old', 'new', 'empty', 'short' (truncated), 'mixed' or 'garbage'."""
    if len(data) == 0:
        return "empty"
    gens = set()
    for off in range(0, len(data) - 15, 4096):
        t, gen, idx, magic = struct.unpack_from("<4sII4s", data, off)
        if magic != b"TKV!" or idx != off // 4096 or t != tag[:4].ljust(4, b"_"):
            return "garbage"
        gens.add(gen)
    if len(data) != size:
        return "short"
    if len(gens) > 1:
        return "mixed"
    g = gens.pop()
    if data != content(tag, size, g):
        return "garbage"
    return "old" if g == old_gen else ("new" if g == new_gen else "garbage")


def write_file(path, data, fsync=False):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        mv = memoryview(data)
        while mv:
            n = os.write(fd, mv)
            mv = mv[n:]
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def publish(dirpath, name, data, fsync=False):
    """tierkv's publish: write a temp file, rename it onto the final name."""
    tmp = os.path.join(dirpath, f".tmp-{os.getpid()}-{name}")
    write_file(tmp, data, fsync)
    os.rename(tmp, os.path.join(dirpath, name))


def read_all(path, bufsize=1 << 21):
    """open + read to EOF + close; returns (bytes, None) or (None, 'ERRNO@stage')."""
    stage = "open"
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        return None, f"{ename(e.errno)}@open"
    chunks = []
    err = None
    try:
        stage = "read"
        while True:
            b = os.read(fd, bufsize)
            if not b:
                break
            chunks.append(b)
    except OSError as e:
        err = f"{ename(e.errno)}@{stage}"
    try:
        os.close(fd)
    except OSError as e:
        if err is None:
            err = f"{ename(e.errno)}@close"
    if err:
        return None, err
    return b"".join(chunks), None


def try_stat(path):
    try:
        os.stat(path)
        return None
    except OSError as e:
        return ename(e.errno)


class Counter(dict):
    def add(self, k, n=1):
        self[k] = self.get(k, 0) + n

    def fmt(self):
        if not self:
            return "none"
        return ", ".join(f"{k} x{v}" for k, v in sorted(self.items()))


# ----------------------------------------------------------------------------------
# forked workers (one per mount) for races and locks


class Worker:
    """A forked child executing small operations sent over a pipe; keeps state
    (open descriptors) between calls. Ops may be scheduled at a common monotonic
    time so that the two workers act simultaneously."""

    def __init__(self, name):
        self.name = name
        r1, w1 = os.pipe()
        r2, w2 = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(w1)
            os.close(r2)
            self._serve(r1, w2)
            os._exit(0)
        os.close(r1)
        os.close(w2)
        self.pid, self.w, self.r = pid, w1, r2

    @staticmethod
    def _send(fd, obj):
        b = pickle.dumps(obj)
        os.write(fd, struct.pack("<I", len(b)) + b)

    @staticmethod
    def _recv(fd, timeout=None):
        if timeout is not None:
            rr, _, _ = select.select([fd], [], [], timeout)
            if not rr:
                raise TimeoutError
        hdr = b""
        while len(hdr) < 4:
            c = os.read(fd, 4 - len(hdr))
            if not c:
                raise EOFError
            hdr += c
        (n,) = struct.unpack("<I", hdr)
        b = b""
        while len(b) < n:
            c = os.read(fd, n - len(b))
            if not c:
                raise EOFError
            b += c
        return pickle.loads(b)

    def _serve(self, r, w):
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        fds = {}
        while True:
            try:
                op, args, at = self._recv(r)
            except EOFError:
                return
            if op == "quit":
                return
            while at is not None and now() < at:
                pass
            t = now()
            try:
                res = ("ok", getattr(self, "op_" + op)(fds, *args))
            except OSError as e:
                res = ("err", ename(e.errno))
            except Exception as e:  # noqa: BLE001 - reported, not hidden
                res = ("exc", repr(e))
            self._send(w, (res, t, now()))

    # --- operations (run in the child)
    @staticmethod
    def op_excl(fds, path):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        return "created"

    @staticmethod
    def op_link(fds, src, dst):
        os.link(src, dst)
        return "linked"

    @staticmethod
    def op_write(fds, path, data):
        write_file(path, data)
        return len(data)

    @staticmethod
    def op_lock(fds, key, path, kind, blocking):
        fd = fds.get(key)
        if fd is None:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            fds[key] = fd
        import fcntl
        if kind == "flock":
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        else:
            fcntl.lockf(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        return "locked"

    @staticmethod
    def op_unlock(fds, key, kind):
        import fcntl
        fd = fds[key]
        if kind == "flock":
            fcntl.flock(fd, fcntl.LOCK_UN)
        else:
            fcntl.lockf(fd, fcntl.LOCK_UN)
        return "unlocked"

    @staticmethod
    def op_close(fds, key):
        fd = fds.pop(key, None)
        if fd is not None:
            os.close(fd)
        return "closed"

    @staticmethod
    def op_lockcycle(fds, path, kind, seconds, maxn):
        """lock+unlock repeatedly: uncontended lock round trips per second."""
        import fcntl
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        n = 0
        t0 = now()
        while n < maxn and now() - t0 < seconds:
            if kind == "flock":
                fcntl.flock(fd, fcntl.LOCK_EX)
                fcntl.flock(fd, fcntl.LOCK_UN)
            else:
                fcntl.lockf(fd, fcntl.LOCK_EX)
                fcntl.lockf(fd, fcntl.LOCK_UN)
            n += 1
        os.close(fd)
        return (n, now() - t0)

    # --- parent side
    def call(self, op, *args, at=None, timeout=30):
        self._send(self.w, (op, args, at))
        return self._recv(self.r, timeout)

    def start(self, op, *args, at=None):
        self._send(self.w, (op, args, at))

    def result(self, timeout=30):
        return self._recv(self.r, timeout)

    def stop(self):
        try:
            self._send(self.w, ("quit", (), None))
        except OSError:
            pass
        for _ in range(50):
            p, _ = os.waitpid(self.pid, os.WNOHANG)
            if p:
                break
            time.sleep(0.02)
        else:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        os.close(self.w)
        os.close(self.r)


# ----------------------------------------------------------------------------------
# sections


class Probe:
    def __init__(self, args):
        self.args = args
        self.dl = Deadline(args.max_seconds)
        tag = f"probe-{os.getpid()}-{int(time.time())}"
        self.da = os.path.join(args.a, tag)   # same dir, seen through mount a
        self.db = os.path.join(args.b, tag)   # ... and through mount b
        self.dlocal = os.path.join(args.local, tag + "-local")
        os.makedirs(self.da)
        os.makedirs(self.dlocal)
        t0 = now()
        while not os.path.isdir(self.db):
            if now() - t0 > 10:
                raise SystemExit(f"{self.db} not visible through mount b after 10 s")
            time.sleep(0.01)
        self.md = []
        self.raw = {}

    def out(self, s=""):
        self.md.append(s)

    def cap(self, seconds):
        return Deadline(max(0.0, min(seconds, self.dl.left())))

    # (a) ------------------------------------------------------------------------
    def sec_a(self):
        n = self.args.trials
        size = 64 * 1024
        rows = []
        for variant in ("fresh", "after-miss"):
            st_lat, rd_lat, first_stat, first_read = [], [], 0, 0
            errs, bad, timeouts, done = Counter(), 0, 0, 0
            cap = self.cap(60)
            for i in range(n):
                if cap.over():
                    break
                name = f"a-{variant}-{i}"
                pb = os.path.join(self.db, name)
                if variant == "after-miss":
                    # b looks the name up (a miss) before a publishes it: what the
                    # index-as-cache does when a key is not (yet) there.
                    e = try_stat(pb)
                    if e != "ENOENT":
                        errs.add(f"pre-miss:{e}")
                data = content(b"a", size, i)
                publish(self.da, name, data)
                t0 = now()
                # stat visibility
                k = 0
                while True:
                    e = try_stat(pb)
                    k += 1
                    if e is None:
                        st_lat.append(now() - t0)
                        first_stat += k == 1
                        break
                    if e != "ENOENT":
                        errs.add(f"stat:{e}")
                    if now() - t0 > 5:
                        timeouts += 1
                        break
                # open+read visibility, checking content
                t1 = now()
                k = 0
                while True:
                    d, e = read_all(pb)
                    k += 1
                    if e is None:
                        if d == data:
                            rd_lat.append(now() - t0)
                            first_read += k == 1
                            break
                        bad += 1
                    elif not e.startswith("ENOENT@open"):
                        errs.add(e)
                    if now() - t1 > 5:
                        timeouts += 1
                        break
                done += 1
            rows.append((variant, done, first_stat, st_lat, first_read, rd_lat, bad, timeouts, errs))
            self.raw[f"a_{variant}"] = {"stat_s": st_lat, "read_s": rd_lat, "errors": dict(errs)}
        self.out("### (a) New name published on a (tmp + rename), first seen from b")
        self.out()
        self.out("Time from rename() returning on a to the first successful stat / correct open+read on b "
                 "(polling back to back; the figure includes one lookup's latency). "
                 "*after-miss*: b had looked the name up (ENOENT) just before a published it.")
        self.out()
        self.out("| variant | trials | stat ok 1st try | stat p50 ms | p99 ms | max ms | read ok 1st try | read p50 ms | p99 ms | max ms | wrong bytes | >5 s | other errors |")
        self.out("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
        for v, d, fs, sl, fr, rl, bad, to, errs in rows:
            self.out(f"| {v} | {d} | {fs} | {ms(pct(sl, 50))} | {ms(pct(sl, 99))} | {ms(max(sl) if sl else None)} | "
                     f"{fr} | {ms(pct(rl, 50))} | {ms(pct(rl, 99))} | {ms(max(rl) if rl else None)} | {bad} | {to} | {errs.fmt()} |")
        self.out()

    # (b) ------------------------------------------------------------------------
    def sec_b(self):
        n = self.args.trials_slow
        size = 256 * 1024
        # two groups: b holds no descriptor / b holds an open descriptor across the unlink
        G = {g: dict(windows=[], stale=0, wrong=0, timeouts=0, done=0, err_trials=Counter(), err_attempts=Counter(),
                     held_ok=0, held_err=Counter()) for g in ("no fd held", "fd held across unlink")}
        pre = Counter()
        cap = self.cap(90)
        for i in range(n):
            if cap.over():
                break
            g = G["fd held across unlink" if i % 2 else "no fd held"]
            name = f"b-{i}"
            pa, pb = os.path.join(self.da, name), os.path.join(self.db, name)
            data = content(b"b", size, i)
            publish(self.da, name, data)
            d, e = read_all(pb)
            t_wait = now()
            while e is not None and now() - t_wait < 5:
                d, e = read_all(pb)
            if d != data:
                pre.add(f"{e or 'wrong'}")
                continue
            hold = os.open(pb, os.O_RDONLY) if i % 2 else None
            os.unlink(pa)
            t0 = now()
            last_ok = None
            seen = set()
            while True:
                d, e = read_all(pb)
                if e is None:
                    last_ok = now() - t0
                    if d != data:
                        g["wrong"] += 1
                elif e == "ENOENT@open":
                    break
                else:
                    seen.add(e)
                    g["err_attempts"].add(e)
                if now() - t0 > 5:
                    g["timeouts"] += 1
                    break
            for e in seen:
                g["err_trials"].add(e)
            g["windows"].append(last_ok if last_ok is not None else 0.0)
            g["stale"] += last_ok is not None
            if hold is not None:
                try:
                    chunks = []
                    os.lseek(hold, 0, os.SEEK_SET)
                    while True:
                        b = os.read(hold, 1 << 20)
                        if not b:
                            break
                        chunks.append(b)
                    if b"".join(chunks) == data:
                        g["held_ok"] += 1
                    else:
                        g["held_err"].add("wrong/short")
                except OSError as ex:
                    g["held_err"].add(f"{ename(ex.errno)}@read")
                try:
                    os.close(hold)
                except OSError as ex:
                    g["held_err"].add(f"{ename(ex.errno)}@close")
            g["done"] += 1
        self.raw["b"] = {k: {"window_s": v["windows"], "err_trials": dict(v["err_trials"]),
                             "err_attempts": dict(v["err_attempts"])} for k, v in G.items()}
        self.out("### (b) Name read on b, then unlinked on a")
        self.out()
        self.out("After unlink() returns on a, b repeatedly opens+reads the name until ENOENT at open. *window*: time "
                 "of b's last successful (whole, correct) read after the unlink (0 = never read again). Errors: "
                 "trials in which the error appeared (attempts). Odd trials: b also holds a descriptor opened before "
                 "the unlink and reads it whole afterwards.")
        self.out()
        self.out("| b on the name | trials | trials b still read it | window p50 ms | p99 ms | max ms | wrong bytes | >5 s | errors before ENOENT: trials (attempts) | held fd: whole reads | held fd errors |")
        self.out("|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---|")
        for k, v in G.items():
            et = ", ".join(f"{e} {c} ({v['err_attempts'][e]})" for e, c in sorted(v["err_trials"].items())) or "none"
            held = f"{v['held_ok']}/{v['done']}" if k != "no fd held" else "-"
            self.out(f"| {k} | {v['done']} | {v['stale']} | {ms(pct(v['windows'], 50))} | {ms(pct(v['windows'], 99))} | "
                     f"{ms(max(v['windows']) if v['windows'] else None)} | {v['wrong']} | {v['timeouts']} | {et} | {held} | "
                     f"{v['held_err'].fmt() if k != 'no fd held' else '-'} |")
        if pre:
            self.out(f"\n(pre-read failures, trial skipped: {pre.fmt()})")
        self.out()

    # (c) ------------------------------------------------------------------------
    def sec_c(self):
        n = self.args.trials_slow
        size = 256 * 1024
        kinds, errs, err_trials = Counter(), Counter(), Counter()  # errs: attempts
        windows, stale_trials, done, timeouts = [], 0, 0, 0
        cap = self.cap(90)
        for i in range(n):
            if cap.over():
                break
            name = f"c-{i}"
            pb = os.path.join(self.db, name)
            old, new = 2 * i, 2 * i + 1
            publish(self.da, name, content(b"c", size, old))
            d, e = read_all(pb)
            t_wait = now()
            while (e is not None or classify(d, size, old, new, b"c") != "old") and now() - t_wait < 5:
                d, e = read_all(pb)
            if e is not None:
                errs.add(f"pre-read:{e}")
                continue
            publish(self.da, name, content(b"c", size, new))
            t0 = now()
            last_old = None
            seen = set()
            while True:
                d, e = read_all(pb)
                if e is not None:
                    errs.add(e)
                    seen.add(e)
                else:
                    k = classify(d, size, old, new, b"c")
                    kinds.add(k)
                    if k == "new":
                        break
                    if k == "old":
                        last_old = now() - t0
                if now() - t0 > 5:
                    timeouts += 1
                    break
            for e in seen:
                err_trials.add(e)
            if last_old is not None:
                stale_trials += 1
                windows.append(last_old)
            else:
                windows.append(0.0)
            done += 1
        self.raw["c"] = {"window_s": windows, "kinds": dict(kinds), "errors": dict(errs)}

        # inode reuse: a renames the file away and rewrites it in place; b, which had
        # read it under the old name, opens the old name again.
        reuse_n = min(self.args.trials_slow, 30)
        reuse = Counter()
        reuse_err = Counter()
        cap = self.cap(40)
        rdone = 0
        for i in range(reuse_n):
            if cap.over():
                break
            name, other = f"r-{i}", f"r-{i}-reused"
            pa, pb = os.path.join(self.da, name), os.path.join(self.db, name)
            publish(self.da, name, content(b"r", size, 1))
            d, e = read_all(pb)
            if e is not None:
                reuse_err.add(f"pre-read:{e}")
                continue
            os.rename(pa, os.path.join(self.da, other))
            fd = os.open(os.path.join(self.da, other), os.O_WRONLY)
            os.pwrite(fd, content(b"r", size, 2), 0)
            os.close(fd)
            t0 = now()
            seen = set()
            while now() - t0 < 1.5:
                d, e = read_all(pb)
                if e is not None:
                    seen.add(e)
                    if e == "ENOENT@open":
                        break
                else:
                    seen.add(classify(d, size, 1, 2, b"r"))
            for s in seen:
                reuse.add(s)
            rdone += 1
        self.raw["c_reuse"] = {"seen": dict(reuse)}

        self.out("### (c) Name read on b, then replaced by rename (new content) on a")
        self.out()
        self.out("After rename() of the new version returns on a, b repeatedly opens+reads the name until it reads the "
                 "new content. *stale window*: time of b's last read of the old content.")
        self.out()
        self.out("| trials | trials with a stale read | stale window p50 ms | p99 ms | max ms | reads by kind (attempts) | errors: trials (attempts) | >5 s |")
        self.out("|---:|---:|---:|---:|---:|---|---|---:|")
        et = ", ".join(f"{e} {c} ({errs[e]})" for e, c in sorted(err_trials.items())) or "none"
        self.out(f"| {done} | {stale_trials} | {ms(pct(windows, 50))} | {ms(pct(windows, 99))} | "
                 f"{ms(max(windows) if windows else None)} | {kinds.fmt()} | {et} | {timeouts} |")
        self.out()
        self.out(f"Inode reuse ({rdone} trials): a renames `r-i` to `r-i-reused` and pwrite()s new content into it; "
                 "b, which had read `r-i`, re-opens `r-i` for 1.5 s. Outcomes seen (trials): "
                 f"{reuse.fmt()} ('new' under the old name = wrong bytes for a content-addressed reader).")
        self.out()

    # (d) ------------------------------------------------------------------------
    def race(self, wa, wb, op, args_a, args_b):
        at = now() + 0.004
        wa.start(op, *args_a, at=at)
        wb.start(op, *args_b, at=at)
        return wa.result(), wb.result()

    def sec_d(self, wa, wb, wl1, wl2):
        rows = []
        for label, x, y, da, db in (("a vs b (volume)", wa, wb, self.da, self.db),
                                    ("local (2 processes)", wl1, wl2, self.dlocal, self.dlocal)):
            n = self.args.trials
            winners = Counter()
            errs = Counter()
            skew = []
            done = 0
            cap = self.cap(40)
            for i in range(n):
                if cap.over():
                    break
                name = f"d-{i}"
                (ra, ta, ea), (rb, tb, eb) = self.race(x, y, "excl", (os.path.join(da, name),), (os.path.join(db, name),))
                skew.append(abs(ta - tb))
                w = (ra[0] == "ok") + (rb[0] == "ok")
                winners.add(f"{w} winner{'s' if w != 1 else ''}")
                for r in (ra, rb):
                    if r[0] != "ok" and r[1] != "EEXIST":
                        errs.add(r[1])
                done += 1
            rows.append((label, done, winners, errs, pct(skew, 50)))
        self.raw["d"] = [(r[0], r[1], dict(r[2]), dict(r[3])) for r in rows]
        self.out("### (d) O_CREAT|O_EXCL race on one name from both sides")
        self.out()
        self.out("| where | trials | outcome | errors other than EEXIST | start skew p50 ms |")
        self.out("|---|---:|---|---|---:|")
        for label, d, w, e, s in rows:
            self.out(f"| {label} | {d} | {w.fmt()} | {e.fmt()} | {ms(s)} |")
        self.out()

    # (e) ------------------------------------------------------------------------
    def sec_e(self, wa, wb):
        res = []
        # link onto an existing name
        pa = os.path.join(self.da, "e-exist")
        publish(self.da, "e-exist", content(b"e", 4096, 1))
        write_file(os.path.join(self.da, "e-tmp"), content(b"e", 4096, 2))
        try:
            os.link(os.path.join(self.da, "e-tmp"), pa)
            res.append(("link(tmp, existing) on a", "SUCCEEDED (replaced?)"))
        except OSError as e:
            res.append(("link(tmp, existing) on a", ename(e.errno)))
        # link count visible from b
        os.link(os.path.join(self.da, "e-tmp"), os.path.join(self.da, "e-new"))
        try:
            st = os.stat(os.path.join(self.db, "e-new"))
            res.append(("st_nlink of a linked name, seen from b", str(st.st_nlink)))
        except OSError as e:
            res.append(("st_nlink of a linked name, seen from b", ename(e.errno)))
        os.unlink(os.path.join(self.da, "e-tmp"))
        d, e = read_all(os.path.join(self.db, "e-new"))
        res.append(("b reads the linked name after a unlinks the tmp", "whole" if d == content(b"e", 4096, 2) else str(e)))
        # link race: both link their own tmp onto one name
        n = self.args.trials
        winners = Counter()
        errs = Counter()
        wrong = 0
        cap = self.cap(40)
        done = 0
        for i in range(n):
            if cap.over():
                break
            ta, tb = os.path.join(self.da, f"e-ta-{i}"), os.path.join(self.db, f"e-tb-{i}")
            write_file(ta, content(b"e", 4096, 10))
            write_file(tb, content(b"e", 4096, 20))
            (ra, _, _), (rb, _, _) = self.race(wa, wb, "link", (ta, os.path.join(self.da, f"e-l-{i}")),
                                               (tb, os.path.join(self.db, f"e-l-{i}")))
            w = (ra[0] == "ok") + (rb[0] == "ok")
            winners.add(f"{w} winner{'s' if w != 1 else ''}")
            for r in (ra, rb):
                if r[0] != "ok" and r[1] != "EEXIST":
                    errs.add(r[1])
            # both sides must now read the winner's content
            want = content(b"e", 4096, 10) if ra[0] == "ok" else content(b"e", 4096, 20)
            for dd in (self.da, self.db):
                d, e = read_all(os.path.join(dd, f"e-l-{i}"))
                if d != want:
                    wrong += 1
            done += 1
        res.append((f"link() race onto one name, {done} trials", f"{winners.fmt()}; errors {errs.fmt()}; "
                    f"reads not the winner's bytes: {wrong}"))
        # rename onto existing: replaces, content from b
        publish(self.da, "e-ren", content(b"e", 4096, 30))
        read_all(os.path.join(self.db, "e-ren"))
        publish(self.da, "e-ren", content(b"e", 4096, 31))
        d, e = read_all(os.path.join(self.db, "e-ren"))
        res.append(("rename(tmp, existing) on a, then b reads", "new content" if d == content(b"e", 4096, 31)
                    else ("old content" if d == content(b"e", 4096, 30) else str(e))))
        # renameat2(RENAME_NOREPLACE)
        libc = ctypes.CDLL(None, use_errno=True)
        AT_FDCWD = -100
        SYS_renameat2 = {"x86_64": 316, "aarch64": 276}.get(platform.machine())
        for label, dd in (("volume", self.da), ("local", self.dlocal)):
            src = os.path.join(dd, "e-nr-src")
            dst = os.path.join(dd, "e-nr-dst")
            write_file(src, b"x")
            write_file(dst, b"y")
            if SYS_renameat2 is None:
                res.append((f"renameat2(RENAME_NOREPLACE) onto existing ({label})", "not tried (arch)"))
                continue
            r = libc.syscall(SYS_renameat2, AT_FDCWD, src.encode(), AT_FDCWD, dst.encode(), 1)
            en = ctypes.get_errno()
            out1 = "SUCCEEDED (replaced)" if r == 0 else ename(en)
            os.unlink(dst)
            r = libc.syscall(SYS_renameat2, AT_FDCWD, src.encode(), AT_FDCWD, dst.encode(), 1)
            en = ctypes.get_errno()
            out2 = "ok" if r == 0 else ename(en)
            res.append((f"renameat2(RENAME_NOREPLACE) ({label}): onto existing / onto free name", f"{out1} / {out2}"))
        self.raw["e"] = res
        self.out("### (e) link() and rename() onto existing names")
        self.out()
        self.out("| check | result |")
        self.out("|---|---|")
        for k, v in res:
            self.out(f"| {k} | {v} |")
        self.out()

    # (f) ------------------------------------------------------------------------
    def sec_f(self, wa, wb, wl1, wl2):
        res = []
        for kind in ("flock", "fcntl"):
            for label, x, y, da, db in (("a vs b", wa, wb, self.da, self.db),
                                        ("local", wl1, wl2, self.dlocal, self.dlocal)):
                p1, p2 = os.path.join(da, f"f-{kind}"), os.path.join(db, f"f-{kind}")
                r1 = x.call("lock", "k", p1, kind, False)[0]
                r2 = y.call("lock", "k", p2, kind, False)[0]
                # blocking attempt from y; x releases after 200 ms
                y.start("lock", "k", p2, kind, True)
                time.sleep(0.2)
                t_rel = now()
                x.call("unlock", "k", kind)
                try:
                    r3, t3s, t3e = y.result(timeout=10)
                    wake = t3e - t_rel
                except TimeoutError:
                    r3, wake = ("err", "TIMEOUT"), None
                y.call("unlock", "k", kind)
                x.call("close", "k")
                y.call("close", "k")
                res.append((kind, label, r1, r2, r3, wake))
        # flock on one side vs fcntl on the other
        cross = []
        for k1, k2 in (("flock", "fcntl"), ("fcntl", "flock")):
            p1, p2 = os.path.join(self.da, f"f-x-{k1}"), os.path.join(self.db, f"f-x-{k1}")
            r1 = wa.call("lock", "k", p1, k1, False)[0]
            r2 = wb.call("lock", "k", p2, k2, False)[0]
            wa.call("close", "k")
            wb.call("close", "k")
            cross.append((k1, k2, r1, r2))
        # uncontended lock round trips per second
        rates = []
        for kind in ("flock", "fcntl"):
            for label, x, dd in (("volume", wa, self.da), ("local", wl1, self.dlocal)):
                (st, val), _, _ = x.call("lockcycle", os.path.join(dd, f"f-rate-{kind}"), kind, 1.5, 20000)
                if st == "ok":
                    rates.append((kind, label, fmt_rate(val[0], val[1])))
                else:
                    rates.append((kind, label, str(val)))
        self.raw["f"] = {"res": [(a, b, c, d, e, f) for a, b, c, d, e, f in res], "cross": cross, "rates": rates}
        self.out("### (f) Locks across the two mounts")
        self.out()
        self.out("x takes the lock (non-blocking), y tries non-blocking (should fail EAGAIN), then y blocks while x "
                 "releases after 200 ms; *wake* = time from x's unlock returning to y's lock returning.")
        self.out()
        self.out("| lock | where | x non-blocking | y non-blocking while held | y blocking | wake ms |")
        self.out("|---|---|---|---|---|---:|")
        for kind, label, r1, r2, r3, wake in res:
            self.out(f"| {kind} | {label} | {r1[1]} | {r2[1]} | {r3[1]} | {ms(wake)} |")
        self.out()
        self.out("| a holds | b tries (non-blocking) | a | b |")
        self.out("|---|---|---|---|")
        for k1, k2, r1, r2 in cross:
            self.out(f"| {k1} | {k2} | {r1[1]} | {r2[1]} |")
        self.out()
        self.out("| lock | where | uncontended lock+unlock /s |")
        self.out("|---|---|---:|")
        for kind, label, r in rates:
            self.out(f"| {kind} | {label} | {r} |")
        self.out()

    # (g) ------------------------------------------------------------------------
    def sec_g(self):
        res = []
        size = 2 << 20
        buf = mmap.mmap(-1, size)          # page-aligned
        data = content(b"g", size, 5)
        buf[:] = data
        pa = os.path.join(self.da, "g-direct")
        pb = os.path.join(self.db, "g-direct")
        try:
            fd = os.open(pa, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
            t0 = now()
            n = os.write(fd, buf)
            tw = now() - t0
            os.close(fd)
            res.append(("O_DIRECT write 2 MiB (aligned) on a", f"wrote {n} B in {ms(tw)} ms"))
        except OSError as e:
            res.append(("O_DIRECT write 2 MiB (aligned) on a", ename(e.errno)))
        rbuf = mmap.mmap(-1, size)
        try:
            fd = os.open(pb, os.O_RDONLY | os.O_DIRECT)
            t0 = now()
            n = os.readv(fd, [rbuf])
            tr = now() - t0
            os.close(fd)
            res.append(("O_DIRECT read 2 MiB on b of a's O_DIRECT write", f"{n} B, {'bytes match' if rbuf[:] == data else 'MISMATCH'}, {ms(tr)} ms"))
        except OSError as e:
            res.append(("O_DIRECT read 2 MiB on b of a's O_DIRECT write", ename(e.errno)))
        # O_DIRECT read rate
        cap = self.cap(3)
        cnt = 0
        t0 = now()
        while not cap.over() and cnt < 2000:
            fd = os.open(pb, os.O_RDONLY | os.O_DIRECT)
            os.readv(fd, [rbuf])
            os.close(fd)
            cnt += 1
        el = now() - t0
        res.append(("O_DIRECT open+read 2 MiB+close on b, repeated", f"{fmt_rate(cnt, el)}/s = {cnt * size / el / 2**20:,.0f} MiB/s"))
        # unaligned O_DIRECT write: where does it fail?
        for label, dd in (("volume", self.da), ("local", self.dlocal)):
            p = os.path.join(dd, "g-unaligned")
            stage = "open"
            outc = "no error at all"
            try:
                fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
                try:
                    stage = "write"
                    os.write(fd, b"z" * 1000)    # unaligned length and (likely) buffer
                    stage = "fsync"
                    os.fsync(fd)
                    stage = "close"
                finally:
                    if stage == "close":
                        os.close(fd)
                    else:
                        try:
                            os.close(fd)
                        except OSError as e:
                            outc = f"{ename(e.errno)} at close (after error at {stage})"
                            raise
            except OSError as e:
                if outc == "no error at all":
                    outc = f"{ename(e.errno)} at {stage}"
            res.append((f"unaligned O_DIRECT write of 1000 B ({label})", outc))
        # O_DIRECT buffered mix: b reads buffered after a direct write of new content
        buf[:] = content(b"g", size, 6)
        fd = os.open(pa, os.O_WRONLY | os.O_DIRECT)
        os.write(fd, buf)
        os.close(fd)
        d, e = read_all(pb)
        res.append(("buffered read on b right after a's O_DIRECT overwrite",
                    "new bytes" if d == content(b"g", size, 6) else ("old bytes" if d == data else str(e))))
        self.raw["g"] = res
        self.out("### (g) O_DIRECT")
        self.out()
        self.out("| check | result |")
        self.out("|---|---|")
        for k, v in res:
            self.out(f"| {k} | {v} |")
        self.out()

    # (h) ------------------------------------------------------------------------
    def sec_h(self):
        size = 2 << 20
        nfiles = 16
        secs = self.args.rate_seconds
        rows = []
        data = [content(b"h", size, i) for i in range(nfiles)]
        for i in range(nfiles):
            publish(self.da, f"h-{i}", data[i])
            publish(self.dlocal, f"h-{i}", data[i])

        def rate(fn, maxn):
            cap = self.cap(secs)
            n = 0
            lat = []
            errs = Counter()
            t0 = now()
            while n < maxn and not cap.over():
                t = now()
                e = fn(n)
                lat.append(now() - t)
                if e:
                    errs.add(e)
                n += 1
            el = now() - t0
            return n, el, lat, errs

        for label, dd in (("a (n1, publisher)", self.da), ("b (n2)", self.db), ("local", self.dlocal)):
            n, el, lat, errs = rate(lambda k: (None if try_stat(os.path.join(dd, f"miss-{k}")) == "ENOENT" else "not-ENOENT"), 200000)
            rows.append(("stat of a missing name", label, n, el, lat, errs))
            n, el, lat, errs = rate(lambda k: (None if try_stat(os.path.join(dd, f"h-{k % nfiles}")) is None else "stat-err"), 200000)
            rows.append(("stat of an existing name", label, n, el, lat, errs))

            def rd(k, dd=dd):
                d, e = read_all(os.path.join(dd, f"h-{k % nfiles}"))
                if e:
                    return e
                return None if len(d) == size else "short"
            n, el, lat, errs = rate(rd, 100000)
            rows.append(("open+read 2 MiB+close", label, n, el, lat, errs))
        # put rate: 2 MiB tmp + rename (a and local), bounded to 64 files each
        for label, dd in (("a (n1)", self.da), ("local", self.dlocal)):
            def put(k, dd=dd):
                publish(dd, f"hp-{k}", data[k % nfiles])
                return None
            n, el, lat, errs = rate(put, 64)
            rows.append(("put 2 MiB (write tmp + rename)", label, n, el, lat, errs))
        self.raw["h"] = [(a, b, c, d, {"p50": pct(e, 50), "p99": pct(e, 99)}, dict(f)) for a, b, c, d, e, f in rows]
        self.out(f"### (h) Rates, one thread, {secs:g} s per cell (16 files of 2 MiB, round robin)")
        self.out()
        self.out("| operation | where | ops | ops/s | MiB/s | p50 ms | p99 ms | errors |")
        self.out("|---|---|---:|---:|---:|---:|---:|---|")
        for op, label, n, el, lat, errs in rows:
            mib = f"{n * size / el / 2**20:,.0f}" if "2 MiB" in op else ""
            self.out(f"| {op} | {label} | {n} | {fmt_rate(n, el)} | {mib} | {ms(pct(lat, 50))} | {ms(pct(lat, 99))} | {errs.fmt()} |")
        self.out()

    # (i) ------------------------------------------------------------------------
    def sec_i(self):
        res = []
        for label, da, db in (("volume (read on b)", self.da, self.db), ("local", self.dlocal, self.dlocal)):
            p = os.path.join(da, "i-atime")
            write_file(p, content(b"i", 65536, 1))
            old = time.time() - 3 * 86400
            os.utime(p, (old, old))
            time.sleep(0.05)
            pb = os.path.join(db, "i-atime")
            st0 = os.stat(pb)
            read_all(pb)
            time.sleep(1.1)   # outlast a 1 s attribute cache
            st1 = os.stat(pb)
            st1a = os.stat(p)
            res.append((label, "old atime 3 days, mtime 3 days", time.strftime("%Y-%m-%d %H:%M", time.localtime(st0.st_atime)),
                        time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(st1.st_atime)),
                        time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(st1a.st_atime)),
                        "yes" if st1.st_atime > old + 60 else "no"))
            # second read, atime now recent: relatime would not update again
            a1 = st1.st_atime
            time.sleep(1.1)
            read_all(pb)
            time.sleep(1.1)
            st2 = os.stat(pb)
            res.append((label, "second read 2 s later", "", time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(st2.st_atime)), "",
                        "yes" if st2.st_atime > a1 else "no"))
        self.raw["i"] = res
        self.out("### (i) Does st_atime advance on read?")
        self.out()
        self.out("| fs | case | atime before | atime after (reader's view) | atime after (writer's view) | advanced |")
        self.out("|---|---|---|---|---|---|")
        for r in res:
            self.out("| " + " | ".join(r) + " |")
        self.out()

    # (j) ------------------------------------------------------------------------
    def sec_j(self):
        def avail(p):
            s = os.statvfs(p)
            return s.f_bavail * s.f_frsize, s.f_blocks * s.f_frsize, s.f_frsize
        mb = self.args.statfs_mib
        a0, tot, frs = avail(self.da)
        b0, _, _ = avail(self.db)
        l0, ltot, lfrs = avail(self.args.local)
        chunk = content(b"j", 1 << 20, 1)
        p = os.path.join(self.da, "j-fill")
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        for _ in range(mb):
            os.write(fd, chunk)
        os.fsync(fd)
        os.close(fd)
        t0 = now()
        a1, _, _ = avail(self.da)
        b1, _, _ = avail(self.db)
        l1, _, _ = avail(self.args.local)
        time.sleep(1.0)
        a2, _, _ = avail(self.da)
        b2, _, _ = avail(self.db)
        os.unlink(p)
        time.sleep(1.0)
        a3, _, _ = avail(self.da)
        b3, _, _ = avail(self.db)
        M = 2**20
        self.raw["j"] = dict(a0=a0, a1=a1, a2=a2, a3=a3, b0=b0, b1=b1, b2=b2, b3=b3, l0=l0, l1=l1, tot=tot, ltot=ltot)
        self.out(f"### (j) statfs f_bavail while writing {mb} MiB on a (fsync'd), then unlinking")
        self.out()
        self.out(f"Volume: f_blocks*f_frsize = {tot / 2**30:,.1f} GiB (f_frsize {frs}); brick filesystem ({self.args.local}): "
                 f"{ltot / 2**30:,.1f} GiB (f_frsize {lfrs}). Deltas in MiB (negative = space used).")
        self.out()
        self.out("| view | after write | after write + 1 s | after unlink + 1 s |")
        self.out("|---|---:|---:|---:|")
        self.out(f"| volume via a | {(a1 - a0) / M:,.0f} | {(a2 - a0) / M:,.0f} | {(a3 - a0) / M:,.0f} |")
        self.out(f"| volume via b | {(b1 - b0) / M:,.0f} | {(b2 - b0) / M:,.0f} | {(b3 - b0) / M:,.0f} |")
        self.out(f"| brick fs (local statvfs) | {(l1 - l0) / M:,.0f} | | |")
        self.out()
        self.out("(the machine's disk is shared with other work: deltas of the brick filesystem include their writes)")
        self.out()

    # (k) ------------------------------------------------------------------------
    def sec_k(self):
        SYS_openat2 = 437
        libc = ctypes.CDLL(None, use_errno=True)

        class OpenHow(ctypes.Structure):
            _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]

        RESOLVE_NO_SYMLINKS, RESOLVE_BENEATH = 0x04, 0x08
        res = []
        for label, dd in (("volume (b)", self.db), ("local", self.dlocal)):
            src = self.da if dd == self.db else self.dlocal
            write_file(os.path.join(src, "k-file"), b"k")
            try:
                os.symlink("k-file", os.path.join(src, "k-link"))
            except FileExistsError:
                pass
            dfd = os.open(dd, os.O_RDONLY | os.O_DIRECTORY)
            outs = []
            for name in ("k-file", "k-link", "../k-escape", "k-missing"):
                how = OpenHow(os.O_RDONLY, 0, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)
                fd = libc.syscall(SYS_openat2, dfd, name.encode(), ctypes.byref(how), ctypes.sizeof(how))
                if fd >= 0:
                    os.close(fd)
                    outs.append(f"{name}: ok")
                else:
                    outs.append(f"{name}: {ename(ctypes.get_errno())}")
            os.close(dfd)
            res.append((label, "; ".join(outs)))
        self.raw["k"] = res
        self.out("### (k) openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)")
        self.out()
        self.out("| fs | results |")
        self.out("|---|---|")
        for k, v in res:
            self.out(f"| {k} | {v} |")
        self.out()

    def cleanup(self):
        import shutil
        for d in (self.da, self.dlocal):
            shutil.rmtree(d, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, help="mount point of node a (publisher), e.g. /mnt/tierkv-dfs/n1")
    ap.add_argument("--b", required=True, help="mount point of node b, same volume, e.g. /mnt/tierkv-dfs/n2")
    ap.add_argument("--local", default="/var/tmp", help="a local filesystem for comparison (default /var/tmp)")
    ap.add_argument("--label", default="", help="label for the report (e.g. coherent / defaults)")
    ap.add_argument("--trials", type=int, default=200, help="trials for (a), (d), (e) (default 200)")
    ap.add_argument("--trials-slow", type=int, default=60, help="trials for (b), (c) (default 60)")
    ap.add_argument("--rate-seconds", type=float, default=2.0, help="seconds per rate cell in (h)")
    ap.add_argument("--statfs-mib", type=int, default=128, help="MiB written in (j)")
    ap.add_argument("--max-seconds", type=float, default=900, help="global deadline (default 900)")
    ap.add_argument("--sections", default="abcdefghijk", help="which sections to run")
    ap.add_argument("--quick", action="store_true", help="few trials (smoke test)")
    ap.add_argument("--json", help="also write raw figures to this JSON file")
    args = ap.parse_args()
    if args.quick:
        args.trials, args.trials_slow, args.rate_seconds, args.statfs_mib = 20, 8, 0.5, 16
    t_start = now()
    p = Probe(args)
    workers = []
    try:
        wa, wb, wl1, wl2 = Worker("a"), Worker("b"), Worker("l1"), Worker("l2")
        workers = [wa, wb, wl1, wl2]
        for s in args.sections:
            if p.dl.over():
                p.out(f"(global deadline reached before section {s})")
                break
            log(f"section {s} ({now() - t_start:.1f} s)")
            if s == "d":
                p.sec_d(wa, wb, wl1, wl2)
            elif s == "e":
                p.sec_e(wa, wb)
            elif s == "f":
                p.sec_f(wa, wb, wl1, wl2)
            else:
                getattr(p, "sec_" + s)()
    finally:
        for w in workers:
            w.stop()
        p.cleanup()
    u = os.uname()
    hdr = [f"## dfs-probe: {args.label or 'unlabelled'}", "",
           f"`{' '.join(sys.argv)}`", "",
           f"Machine: {u.sysname} {u.release} {u.machine}, {os.cpu_count()} CPUs; a={args.a}, b={args.b}, "
           f"local={args.local}; run took {now() - t_start:.0f} s.", ""]
    print("\n".join(hdr + p.md))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"label": args.label, "argv": sys.argv, "raw": p.raw}, f, indent=1, default=str)


if __name__ == "__main__":
    main()
