//! tierkv-stat: what is in a tierkv cache tree, and the live counters of its running stores.
//!
//! Offline (the default): scans `DIR/v1/<worker>/...` read-only (files are opened with
//! `O_NOATIME`, so a scan does not even move the access times the store's recency comes from)
//! and prints files, bytes, shard balance, block sizes, ages, temp/foreign files, symlinks and
//! bad headers. `--verify` reads every block and checks its checksum; `--repair` removes
//! corrupt files and stale temp files. `--live` prints the counters that running stores
//! publish in `STATS.json`; `--watch 1s` refreshes them with rates.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::{Parser, ValueEnum};
use serde::Serialize;
use tierkv::CorruptReason;
use tierkv::inspect::{self, Found, LiveStats, ScanOptions, WorkerDir};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Format {
    Text,
    Json,
    Prometheus,
}

/// Inspect a tierkv cache tree and the live counters of its stores.
#[derive(Parser, Debug)]
#[command(version, long_about = None)]
struct Args {
    /// The cache root (the directory that holds `v1/`).
    dir: PathBuf,
    /// Only this worker.
    #[arg(long)]
    worker: Option<String>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
    /// Same as `--format json`.
    #[arg(long)]
    json: bool,
    /// Read every block and check its checksum; exit 1 if any is corrupt.
    #[arg(long)]
    verify: bool,
    /// Remove corrupt block files and temp files of stores that are not running.
    #[arg(long)]
    repair: bool,
    /// Print the live counters of the running stores instead of scanning.
    #[arg(long)]
    live: bool,
    /// Refresh the live counters every interval (e.g. 1s, 500ms), with rates per second.
    #[arg(long, value_parser = parse_duration)]
    watch: Option<Duration>,
    /// With --watch: stop after this many refreshes.
    #[arg(long)]
    iterations: Option<u64>,
    /// How --repair holds the workers: exclusive (the default: a worker with a running store
    /// is not repaired) or shared (alongside stores in shared mode: only temp files whose
    /// owner is gone are removed, as a shared store's sweep does; docs/shared.md).
    #[arg(long, default_value = "exclusive")]
    sharing: tierkv::Sharing,
    /// With --repair --sharing shared: the age after which another node's temp files count
    /// as abandoned (default 10m).
    #[arg(long, value_parser = parse_duration)]
    temp_lease: Option<Duration>,
}

/// A store that uses a worker, as its stats file says.
#[derive(Debug, Serialize, Clone)]
struct Instance {
    host: String,
    pid: u32,
    node: String,
    sharing: String,
    /// Its stats file was rewritten within three intervals (it is running).
    live: bool,
    updated_unix_ms: u64,
}

/// A shared worker's usage ledger.
#[derive(Debug, Serialize, Clone, Copy)]
struct LedgerUsage {
    bytes: u64,
    files: u64,
}

/// One bar of a histogram.
#[derive(Debug, Serialize, Clone)]
struct Bucket {
    bucket: String,
    count: u64,
}

/// Files per leaf directory.
#[derive(Debug, Default, Serialize, Clone)]
struct ShardBalance {
    leaf_dirs: u64,
    min: u64,
    avg: f64,
    max: u64,
    /// Leaf directories by file count: 0, 1-3, 4-15, 16-63, 64-255, 256-1023, 1024+.
    histogram: Vec<Bucket>,
}

/// A histogram kept under sortable keys (`"<order>: <label>"`), listed in order, every bucket.
fn buckets(keys: &[&str], counts: &BTreeMap<String, u64>) -> Vec<Bucket> {
    keys.iter()
        .map(|k| Bucket {
            bucket: strip_key(k).to_string(),
            count: counts.get(*k).copied().unwrap_or(0),
        })
        .collect()
}

const LEAF_KEYS: [&str; 7] = [
    "a: 0",
    "b: 1-3",
    "c: 4-15",
    "d: 16-63",
    "e: 64-255",
    "f: 256-1023",
    "g: 1024+",
];
const AGE_KEYS: [&str; 5] = ["a: <1m", "b: <1h", "c: <1d", "d: <7d", "e: >=7d"];

#[derive(Debug, Default, Serialize, Clone)]
struct WorkerReport {
    files: u64,
    bytes: u64,
    payload_bytes: u64,
    layout: Option<String>,
    capacity_bytes: Option<u64>,
    capacity_files: Option<u64>,
    shard_balance: ShardBalance,
    /// Block files by payload size: <=4KiB, <=8KiB, ... (powers of two, up to the largest).
    block_sizes: Vec<Bucket>,
    /// Block files by age of last use (the later of atime and mtime): <1m, <1h, <1d, <7d, >=7d.
    ages: Vec<Bucket>,
    #[serde(skip)]
    size_counts: BTreeMap<u64, u64>,
    #[serde(skip)]
    age_counts: BTreeMap<String, u64>,
    temp: u64,
    foreign: u64,
    symlinks: u64,
    /// Files named like a block but outside the directory the layout puts it in.
    misplaced: Vec<PathBuf>,
    bad_header: Vec<PathBuf>,
    corrupt: Vec<PathBuf>,
    /// Files removed by --repair (bad, misplaced and temp files).
    removed: u64,
    #[serde(skip)]
    removed_bad: u64,
    /// Block files not read (O_NOATIME refused; see `errors`).
    not_read: u64,
    /// What could not be read, judged or removed, with its path.
    errors: Vec<ScanError>,
    live: bool,
    /// `exclusive` or `shared` while a store runs (from the stores' stats files and the
    /// lock record), else `null`.
    sharing: Option<String>,
    /// The stores that use the worker (running or not yet swept), from their stats files.
    instances: Vec<Instance>,
    /// A shared worker's usage ledger (`USAGE`), if it has one.
    ledger: Option<LedgerUsage>,
    /// Temp files kept by a shared repair (their owner may still be writing them).
    temp_kept: u64,
}

#[derive(Debug, Default, Serialize)]
struct Report {
    root: PathBuf,
    format_version: u16,
    files: u64,
    bytes: u64,
    temp: u64,
    foreign: u64,
    symlinks: u64,
    bad_header: u64,
    /// True when checksums were verified (`--verify`, `--repair`); otherwise `corrupt` is
    /// always 0, as nothing was checked.
    verified: bool,
    corrupt: u64,
    misplaced: u64,
    not_read: u64,
    errors: u64,
    workers: BTreeMap<String, WorkerReport>,
}

#[path = "../common.rs"]
mod common;

use common::{BoxError, UsageError, parse_duration};

fn main() -> ExitCode {
    common::init_logging();
    let mut args = Args::parse();
    if args.json {
        args.format = Format::Json;
    }
    match run(&args) {
        Ok(code) => code,
        Err(e) => common::exit_for("tierkv-stat", &e),
    }
}

fn run(args: &Args) -> Result<ExitCode, BoxError> {
    if (args.live || args.watch.is_some()) && (args.verify || args.repair) {
        return Err(
            UsageError("--live/--watch and --verify/--repair do not go together".into()).into(),
        );
    }
    if let Some(w) = &args.worker {
        tierkv::WorkerId::new(w).map_err(|e| UsageError(e.to_string()))?;
    }
    let vdir = inspect::version_dir(&args.dir);
    let workers = list_workers(&args.dir, args.worker.as_deref())?;
    if args.live || args.watch.is_some() {
        return live(args, &vdir, &workers);
    }
    let report = scan(args, &workers)?;
    let mut out = std::io::stdout().lock();
    match args.format {
        Format::Json => writeln!(out, "{}", serde_json::to_string_pretty(&report)?)?,
        Format::Text => print_text(&mut Printable(&mut out), &report)?,
        Format::Prometheus => print_scan_prometheus(&mut out, &report)?,
    }
    for w in report.workers.values() {
        for e in &w.errors {
            tracing::error!(path = %e.path.display(), error = %e.error, "could not scan");
        }
    }
    // Non-zero when anything could not be read or judged, when checking found bad files, or
    // when repair left a bad file in place.
    let unrepaired = report.workers.values().any(|w| w.bad_left() > 0);
    Ok(
        if report.errors > 0 || (args.verify || args.repair) && unrepaired {
            ExitCode::from(1)
        } else {
            ExitCode::SUCCESS
        },
    )
}

fn list_workers(root: &Path, only: Option<&str>) -> Result<Vec<String>, BoxError> {
    let vdir = inspect::version_dir(root);
    let out = match inspect::workers(root) {
        Ok(w) => w,
        Err(tierkv::Error::Io { source, .. })
            if matches!(
                source.raw_os_error(),
                Some(libc::ENOENT | libc::ENOTDIR | libc::ELOOP)
            ) =>
        {
            return Err(UsageError(format!(
                "{} is not a tierkv cache root (no directory {}; a symlink there is not followed)",
                root.display(),
                vdir.display()
            ))
            .into());
        }
        Err(e) => return Err(e.into()),
    };
    let out: Vec<String> = out
        .into_iter()
        .filter(|n| only.is_none_or(|w| w == n))
        .collect();
    if let Some(w) = only {
        if out.is_empty() {
            return Err(UsageError(format!(
                "no worker directory {w:?} under {} (a symlink there is not followed)",
                vdir.display()
            ))
            .into());
        }
    }
    Ok(out)
}

fn read_live(vdir: &Path, worker: &str) -> Option<LiveStats> {
    read_all_live(vdir, worker)
        .into_iter()
        .max_by_key(|(_, l)| (live_fresh(l), l.updated_unix_ms))
        .map(|(_, l)| l)
}

/// The stats files of a worker's stores: `STATS.json` (an exclusive store) and
/// `STATS.<node>.<pid>.json` (one per shared store), with their names.
fn read_all_live(vdir: &Path, worker: &str) -> Vec<(String, LiveStats)> {
    let Some(root) = vdir.parent() else {
        return Vec::new();
    };
    WorkerDir::open(root, worker).map_or_else(|_| Vec::new(), |w| w.live_stats())
}

/// The stores of a worker, its mode, and its ledger.
fn instances_of(dir: &WorkerDir, wr: &mut WorkerReport) {
    for (_, l) in dir.live_stats() {
        wr.instances.push(Instance {
            host: l.host.clone(),
            pid: l.pid,
            node: l.node.clone(),
            sharing: l.sharing.clone(),
            live: live_fresh(&l),
            updated_unix_ms: l.updated_unix_ms,
        });
    }
    let live_mode = |m: &str| wr.instances.iter().any(|i| i.live && i.sharing == m);
    wr.sharing = if live_mode("shared") || (wr.live && dir.holder_is_shared()) {
        Some("shared".into())
    } else if wr.live || live_mode("exclusive") {
        Some("exclusive".into())
    } else {
        None
    };
    wr.ledger = dir.ledger().map(|u| LedgerUsage {
        bytes: u.bytes,
        files: u.files,
    });
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn size_bucket(len: u64) -> u64 {
    let mut b = 4096u64;
    while b < len {
        b *= 2;
    }
    b
}

fn age_bucket(secs: u64) -> &'static str {
    match secs {
        0..60 => "a: <1m",
        60..3600 => "b: <1h",
        3600..86_400 => "c: <1d",
        86_400..604_800 => "d: <7d",
        _ => "e: >=7d",
    }
}

fn leaf_bucket(n: u64) -> &'static str {
    match n {
        0 => "a: 0",
        1..4 => "b: 1-3",
        4..16 => "c: 4-15",
        16..64 => "d: 16-63",
        64..256 => "e: 64-255",
        256..1024 => "f: 256-1023",
        _ => "g: 1024+",
    }
}

fn human(b: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if v.fract() == 0.0 {
        format!("{v:.0}{}", units[u])
    } else {
        format!("{v:.1}{}", units[u])
    }
}

fn scan(args: &Args, workers: &[String]) -> Result<Report, BoxError> {
    let progress = indicatif::ProgressBar::new_spinner();
    if !std::io::stderr().is_terminal() {
        progress.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    progress.enable_steady_tick(Duration::from_millis(200));
    let mut report = Report {
        root: args.dir.clone(),
        format_version: tierkv::format::FORMAT_VERSION,
        verified: args.verify || args.repair,
        ..Report::default()
    };
    for w in workers {
        let wr = scan_worker(args, w, &progress);
        report.files += wr.files;
        report.bytes += wr.bytes;
        report.temp += wr.temp;
        report.foreign += wr.foreign;
        report.symlinks += wr.symlinks;
        report.misplaced += wr.misplaced.len() as u64;
        report.bad_header += wr.bad_header.len() as u64;
        report.corrupt += wr.corrupt.len() as u64;
        report.not_read += wr.not_read;
        report.errors += wr.errors.len() as u64;
        report.workers.insert(w.clone(), wr);
    }
    progress.finish_and_clear();
    Ok(report)
}

/// An error the scan met, with its path: counted, printed, and it makes the exit non-zero.
#[derive(Debug, Clone, Serialize)]
struct ScanError {
    path: PathBuf,
    error: String,
}

impl WorkerReport {
    fn error(&mut self, path: PathBuf, error: impl std::fmt::Display) {
        self.errors.push(ScanError {
            path,
            error: error.to_string(),
        });
    }

    /// A file the repair removed (`removed`); `bad`: a bad or misplaced block file.
    fn count_removed(&mut self, removed: bool, bad: bool) {
        if removed {
            self.removed += 1;
            self.removed_bad += u64::from(bad);
        }
    }

    /// Bad files still in the tree after this scan.
    fn bad_left(&self) -> u64 {
        (self.bad_header.len() + self.corrupt.len() + self.misplaced.len()) as u64
            - self.removed_bad
    }
}

/// A worker's scan as one thread saw it: the report, and the block count of each leaf read.
#[derive(Default)]
struct Tally {
    wr: WorkerReport,
    leaves: Vec<u64>,
}

impl Tally {
    /// Counts what the scan found.
    fn found(&mut self, f: Found, now_s: u64, progress: &indicatif::ProgressBar) {
        let wr = &mut self.wr;
        match f {
            Found::Block {
                payload,
                disk_bytes,
                last_used_s,
                ..
            } => {
                progress.inc(1);
                wr.files += 1;
                wr.bytes += disk_bytes;
                wr.payload_bytes += payload;
                *wr.size_counts.entry(size_bucket(payload)).or_default() += 1;
                let age = age_bucket(now_s.saturating_sub(last_used_s));
                *wr.age_counts.entry(age.into()).or_default() += 1;
            }
            Found::Bad {
                path,
                reason,
                removed,
            } => {
                progress.inc(1);
                wr.count_removed(removed, true);
                if matches!(reason, CorruptReason::Checksum) {
                    wr.corrupt.push(path);
                } else {
                    wr.bad_header.push(path);
                }
            }
            Found::Misplaced { path, removed } => {
                wr.count_removed(removed, true);
                wr.misplaced.push(path);
            }
            Found::Temp { removed, kept } => {
                wr.temp += 1;
                wr.temp_kept += u64::from(kept);
                wr.count_removed(removed, false);
            }
            Found::StaleStatsRemoved => wr.count_removed(true, false),
            Found::Symlink => wr.symlinks += 1,
            Found::Foreign => wr.foreign += 1,
            Found::NotRead => {
                progress.inc(1);
                wr.not_read += 1;
            }
            Found::LeafDone { blocks } => self.leaves.push(blocks),
            Found::Error { path, error } => wr.error(path, error),
            _ => {}
        }
    }
}

/// Scans one worker's tree: takes the worker lock for repair, reads what its stores say,
/// walks the tree, and sums up what was found.
fn scan_worker(args: &Args, worker: &str, progress: &indicatif::ProgressBar) -> WorkerReport {
    let mut wr = WorkerReport::default();
    let dir = match WorkerDir::open(&args.dir, worker) {
        Ok(d) => d,
        Err(e) => {
            wr.error(inspect::version_dir(&args.dir).join(worker), e);
            return wr;
        }
    };
    let shared = args.sharing == tierkv::Sharing::Shared;
    // Repair holds the worker lock for the whole scan: no store can open (and write temp
    // files or publish blocks) meanwhile. A worker whose store is running is not repaired.
    let lock = if args.repair {
        match dir.lock_for_repair(args.sharing) {
            Ok(l) => Some(l),
            Err(tierkv::Error::WorkerBusy { path, holder }) => {
                wr.error(
                    path,
                    format!("in use by a running store ({holder}): not repaired"),
                );
                None
            }
            Err(e) => {
                wr.error(dir.path().to_path_buf(), e);
                None
            }
        }
    } else {
        None
    };
    // A store holds the lock (an exclusive one: a shared probe fails), or a shared store's
    // stats file is fresh.
    wr.live = (lock.is_none() || shared) && dir.in_use();
    let live = read_live(&inspect::version_dir(&args.dir), worker);
    instances_of(&dir, &mut wr);
    wr.live |= wr.instances.iter().any(|i| i.live);
    wr.capacity_bytes = live.as_ref().and_then(|l| l.stats.capacity_bytes);
    wr.capacity_files = live.as_ref().and_then(|l| l.stats.capacity_files);
    let layout = match dir.layout() {
        Ok(l) => l,
        Err(e) => {
            wr.error(dir.path().join("LAYOUT"), e);
            None
        }
    };
    wr.layout = layout.map(|l| l.to_string());
    let Some(layout) = layout else {
        // Without a layout nothing can be placed: every entry but the control files is
        // foreign.
        match dir.entries_besides_control_files() {
            Ok(n) => wr.foreign = n,
            Err(e) => wr.error(dir.path().to_path_buf(), e),
        }
        return wr;
    };
    let options = ScanOptions::default().with_verify(args.verify || args.repair);
    let now_s = now_ms() / 1000;
    let tallies = dir.scan(
        layout,
        &options,
        lock.as_ref().map(|l| (l, args.temp_lease)),
        Tally::default,
        |t, f| t.found(f, now_s, progress),
    );
    let mut leaves = Vec::new();
    for t in tallies {
        merge(&mut wr, t.wr);
        leaves.extend(t.leaves);
    }
    if wr.not_read > 0 {
        wr.error(
            dir.path().to_path_buf(),
            format!(
                "{} block files not read: O_NOATIME refused (not their owner), and reading them \
                 would move the access times the store's recency comes from; run as their owner",
                wr.not_read
            ),
        );
    }
    wr.shard_balance = shard_balance(&leaves);
    wr.ages = buckets(&AGE_KEYS, &wr.age_counts);
    let largest = wr.size_counts.keys().last().copied().unwrap_or(4096);
    let mut b = 4096u64;
    while b <= largest {
        wr.block_sizes.push(Bucket {
            bucket: format!("<={}", human(b)),
            count: wr.size_counts.get(&b).copied().unwrap_or(0),
        });
        b *= 2;
    }
    wr.bad_header.sort();
    wr.corrupt.sort();
    wr.misplaced.sort();
    wr
}

/// How evenly the blocks spread over the leaf directories, from each leaf's block count.
fn shard_balance(leaves: &[u64]) -> ShardBalance {
    let mut leaf_counts: BTreeMap<String, u64> = BTreeMap::new();
    for &n in leaves {
        *leaf_counts.entry(leaf_bucket(n).into()).or_default() += 1;
    }
    ShardBalance {
        leaf_dirs: leaves.len() as u64,
        min: leaves.iter().copied().min().unwrap_or(0),
        max: leaves.iter().copied().max().unwrap_or(0),
        avg: if leaves.is_empty() {
            0.0
        } else {
            leaves.iter().sum::<u64>() as f64 / leaves.len() as f64
        },
        histogram: buckets(&LEAF_KEYS, &leaf_counts),
    }
}

fn merge(into: &mut WorkerReport, from: WorkerReport) {
    into.files += from.files;
    into.bytes += from.bytes;
    into.payload_bytes += from.payload_bytes;
    into.temp += from.temp;
    into.foreign += from.foreign;
    into.symlinks += from.symlinks;
    into.removed += from.removed;
    into.removed_bad += from.removed_bad;
    into.not_read += from.not_read;
    into.misplaced.extend(from.misplaced);
    into.errors.extend(from.errors);
    into.bad_header.extend(from.bad_header);
    into.corrupt.extend(from.corrupt);
    for (k, v) in from.size_counts {
        *into.size_counts.entry(k).or_default() += v;
    }
    for (k, v) in from.age_counts {
        *into.age_counts.entry(k).or_default() += v;
    }
}

fn strip_key(k: &str) -> &str {
    k.split_once(": ").map_or(k, |(_, v)| v)
}

/// The corrupt count, or "not verified" when no checksum was checked.
fn corrupt_text(verified: bool, n: u64) -> String {
    if verified {
        n.to_string()
    } else {
        "not verified".into()
    }
}

/// The text report: the totals, then each worker's section.
fn print_text(out: &mut impl Write, r: &Report) -> std::io::Result<()> {
    writeln!(
        out,
        "tierkv cache {} (format v{})",
        r.root.display(),
        r.format_version
    )?;
    writeln!(
        out,
        "total: {} block files, {} on disk; temp {}, foreign {}, symlinks {}, misplaced {}, bad header {}, corrupt {}{}",
        r.files,
        human(r.bytes),
        r.temp,
        r.foreign,
        r.symlinks,
        r.misplaced,
        r.bad_header,
        corrupt_text(r.verified, r.corrupt),
        if r.errors > 0 {
            format!("; {} errors", r.errors)
        } else {
            String::new()
        }
    )?;
    for (w, wr) in &r.workers {
        writeln!(out)?;
        print_worker_head(out, w, wr)?;
        print_worker_tree(out, wr, r.verified)?;
    }
    Ok(())
}

/// A worker's first lines: its files against its capacity, its layout, and the stores that
/// use it.
fn print_worker_head(out: &mut impl Write, w: &str, wr: &WorkerReport) -> std::io::Result<()> {
    let cap = match (wr.capacity_bytes, wr.capacity_files) {
        (Some(c), _) => format!(
            ", capacity {} ({:.0}% used)",
            human(c),
            100.0 * wr.bytes as f64 / c.max(1) as f64
        ),
        (None, Some(f)) => format!(
            ", capacity {f} files ({:.0}% used)",
            100.0 * wr.files as f64 / f.max(1) as f64
        ),
        _ => String::new(),
    };
    writeln!(
        out,
        "worker {w}: {} files, {} on disk ({} payload){cap}{}",
        wr.files,
        human(wr.bytes),
        human(wr.payload_bytes),
        if wr.live { ", store running" } else { "" }
    )?;
    writeln!(
        out,
        "  layout: {}",
        wr.layout.as_deref().unwrap_or("none (no LAYOUT file)")
    )?;
    if let Some(m) = &wr.sharing {
        writeln!(out, "  mode: {m}")?;
    }
    for i in &wr.instances {
        writeln!(
            out,
            "  store: pid {} on {} (node {}), {}, {}",
            i.pid,
            if i.host.is_empty() { "?" } else { &i.host },
            if i.node.is_empty() { "?" } else { &i.node },
            i.sharing,
            if i.live { "running" } else { "not running" }
        )?;
    }
    if let Some(l) = &wr.ledger {
        writeln!(
            out,
            "  shared usage (ledger): {} in {} files",
            human(l.bytes),
            l.files
        )?;
    }
    Ok(())
}

/// A worker's tree: shard balance, block sizes, ages, what is not a good block file (each
/// bad, misplaced or unreadable one by path), and what a repair removed.
fn print_worker_tree(
    out: &mut impl Write,
    wr: &WorkerReport,
    verified: bool,
) -> std::io::Result<()> {
    let sb = &wr.shard_balance;
    writeln!(
        out,
        "  shard balance: {} leaf dirs, files per leaf min {} avg {:.1} max {}",
        sb.leaf_dirs, sb.min, sb.avg, sb.max
    )?;
    let hist = |m: &[Bucket]| {
        m.iter()
            .filter(|b| b.count > 0)
            .map(|b| format!("{} {}", b.bucket, b.count))
            .collect::<Vec<_>>()
            .join(", ")
    };
    writeln!(out, "    leaves by files: {}", hist(&sb.histogram))?;
    writeln!(out, "  block sizes: {}", hist(&wr.block_sizes))?;
    writeln!(out, "  last use: {}", hist(&wr.ages))?;
    writeln!(
        out,
        "  temp {}, foreign {}, symlinks {}, misplaced {}, bad header {}, corrupt {}",
        wr.temp,
        wr.foreign,
        wr.symlinks,
        wr.misplaced.len(),
        wr.bad_header.len(),
        corrupt_text(verified, wr.corrupt.len() as u64)
    )?;
    for p in wr.bad_header.iter().chain(&wr.corrupt) {
        writeln!(out, "    bad: {}", p.display())?;
    }
    for p in &wr.misplaced {
        writeln!(out, "    misplaced: {}", p.display())?;
    }
    for e in &wr.errors {
        writeln!(out, "    error: {}: {}", e.path.display(), e.error)?;
    }
    if wr.removed > 0 {
        writeln!(out, "  repaired: removed {} files", wr.removed)?;
    }
    Ok(())
}

/// (name, help, value of a worker)
type TreeMetric = (&'static str, &'static str, fn(&WorkerReport) -> u64);

/// Per metric: help, counter?, values per worker.
type MetricRows<'a> = BTreeMap<&'static str, (&'static str, bool, Vec<(&'a str, f64)>)>;

fn print_scan_prometheus(out: &mut impl Write, r: &Report) -> std::io::Result<()> {
    let metrics: [TreeMetric; 6] = [
        ("tierkv_tree_files", "Block files in the tree.", |w| w.files),
        (
            "tierkv_tree_bytes",
            "On-disk bytes of the block files.",
            |w| w.bytes,
        ),
        ("tierkv_tree_temp_files", "Temp files in the tree.", |w| {
            w.temp
        }),
        (
            "tierkv_tree_foreign_files",
            "Files that are not the store's.",
            |w| w.foreign,
        ),
        ("tierkv_tree_symlinks", "Symlinks in the tree.", |w| {
            w.symlinks
        }),
        (
            "tierkv_tree_bad_files",
            "Block files with a bad header or checksum.",
            |w| (w.bad_header.len() + w.corrupt.len()) as u64,
        ),
    ];
    for (name, help, f) in metrics {
        writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge")?;
        for (w, wr) in &r.workers {
            writeln!(out, "{name}{{worker=\"{}\"}} {}", escape_label(w), f(wr))?;
        }
    }
    Ok(())
}

/// A writer for text meant for a terminal: control characters other than line feed and tab
/// (escape sequences, carriage returns, C1 controls such as U+009B, DEL) are written as
/// `\u{..}`, so a name taken from a file of the tree (a STATS file's host or policy, a path)
/// cannot move the cursor, clear the screen or hide a line.
struct Printable<W: Write>(W);

impl<W: Write> Write for Printable<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        if !text
            .chars()
            .any(|c| c.is_control() && c != '\n' && c != '\t')
        {
            self.0.write_all(text.as_bytes())?;
            return Ok(buf.len());
        }
        let mut clean = String::with_capacity(text.len() + 8);
        for c in text.chars() {
            if c.is_control() && c != '\n' && c != '\t' {
                clean.push_str(&c.escape_unicode().to_string());
            } else {
                clean.push(c);
            }
        }
        self.0.write_all(clean.as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

/// A Prometheus label value as the text exposition format writes it: backslash, double
/// quote and line feed escaped (`\\`, `\"`, `\n`), so that a name taken from a STATS file
/// (a host name, a worker id) cannot end the label or start a metric line of its own.
fn escape_label(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

mod live;
use live::live;

fn live_fresh(l: &LiveStats) -> bool {
    l.open && now_ms().saturating_sub(l.updated_unix_ms) <= 3 * l.interval_ms.max(1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_buckets() {
        assert_eq!(parse_duration("1s").unwrap(), Duration::from_secs(1));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert!(parse_duration("0s").is_err() && parse_duration("soon").is_err());
        assert_eq!(size_bucket(1), 4096);
        assert_eq!(size_bucket(4097), 8192);
        assert_eq!(leaf_bucket(0), "a: 0");
        assert_eq!(leaf_bucket(1500), "g: 1024+");
        assert_eq!(strip_key(age_bucket(30)), "<1m");
        assert_eq!(strip_key(age_bucket(8 * 86_400)), ">=7d");
        assert_eq!(human(10 << 20), "10MiB");
    }

    #[test]
    fn out_of_range_durations_are_errors_not_panics() {
        assert!(parse_duration("99999999999999999999999s").is_err());
        assert!(parse_duration("99999999999999999999999h").is_err());
        assert!(parse_duration("0.0000000000001s").is_err());
        assert_eq!(
            parse_duration("0.000000001s").unwrap(),
            Duration::from_nanos(1)
        );
    }

    #[test]
    fn text_output_escapes_control_characters() {
        let mut buf = Vec::new();
        let hostile = "policy \x1b[2J\x1b]0;owned\x07 \u{9b}31m\rhidden\x7f";
        writeln!(Printable(&mut buf), "worker 0: {hostile}\tok").unwrap();
        let out = String::from_utf8(buf).unwrap();
        assert!(
            !out.chars()
                .any(|c| c.is_control() && c != '\n' && c != '\t'),
            "{out:?}"
        );
        assert!(
            out.contains("\\u{1b}[2J") && out.contains("\\u{9b}31m"),
            "{out}"
        );
        assert!(out.ends_with("\tok\n"), "{out:?}");
        let mut plain = Vec::new();
        writeln!(Printable(&mut plain), "worker 0/h\u{e9}te:12 running").unwrap();
        assert_eq!(plain, "worker 0/h\u{e9}te:12 running\n".as_bytes());
    }

    #[test]
    fn prometheus_label_values_are_escaped() {
        // A STATS file's host that would end the label and inject a metric line.
        let hostile = "evil\"} 1\ntierkv_hits_total{worker=\"0";
        assert_eq!(
            escape_label(hostile),
            "evil\\\"} 1\\ntierkv_hits_total{worker=\\\"0"
        );
        assert_eq!(escape_label("a\\b"), "a\\\\b");
        assert_eq!(escape_label("0/host:12"), "0/host:12");
        assert!(!escape_label(hostile).contains('\n'));
    }
}
