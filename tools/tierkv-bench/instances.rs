//! `--instances N`: N processes of one job on one worker directory, sharing it (each a
//! store with `--sharing shared`), started together; the report gives each instance's figures
//! and the totals.
//!
//! The parent re-runs this program with the same options plus `--instance I/N`,
//! `--sharing shared`, `--output-format json` and a common start time, reads each child's
//! JSON report, and prints the instances and their totals. It fails when an instance fails or
//! reports verify errors.

use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use crate::common::{BoxError, UsageError};
use crate::{Args, OutputFormat};

/// Time the children get to open their stores before the job starts.
const START_DELAY: Duration = Duration::from_secs(3);

/// Parses `I/N` (instance I of N, 0-based).
pub(crate) fn parse_instance(s: &str) -> Result<(usize, usize), String> {
    let (i, n) = s
        .split_once('/')
        .ok_or_else(|| format!("expected I/N, got {s:?}"))?;
    let i: usize = i.parse().map_err(|_| format!("bad instance {i:?}"))?;
    let n: usize = n.parse().map_err(|_| format!("bad instance count {n:?}"))?;
    if n == 0 || i >= n {
        return Err(format!("instance {i} of {n}: need 0 <= I < N"));
    }
    Ok((i, n))
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A child waits for the common start time.
pub(crate) fn wait_for_start(args: &Args) {
    if let Some(at) = args.start_at_ms {
        let now = now_ms();
        if at > now {
            std::thread::sleep(Duration::from_millis(at - now));
        } else if args.instance.is_some() {
            tracing::warn!(late_ms = now - at, "this instance started after the others");
        }
    }
}

/// The command line of the children: this one's options without `--instances`, `--dir` and
/// `--output-format` (set again here), which every child gets.
fn child_args() -> Vec<String> {
    let mut out = Vec::new();
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let (name, inline) = match a.split_once('=') {
            Some((k, v)) if k.starts_with("--") => (k.to_string(), Some(v.to_string())),
            _ => (a.clone(), None),
        };
        let drop_with_value = matches!(
            name.as_str(),
            "--instances" | "--dir" | "--output-format" | "--sharing" | "--progress"
        );
        if drop_with_value {
            if inline.is_none() {
                it.next();
            }
            continue;
        }
        if name == "--keep" {
            continue;
        }
        out.push(a);
    }
    out
}

/// Runs the instances and reports them.
pub(crate) fn run_instances(args: &Args, n: usize) -> Result<(), BoxError> {
    if args.instance.is_some() {
        return Err(UsageError("--instances and --instance do not mix".into()).into());
    }
    if args.workers.is_some() {
        return Err(UsageError(
            "--instances runs N processes on one worker: --workers does not apply".into(),
        )
        .into());
    }
    let (root, _tmp) = crate::run_root(args)?;
    let children = spawn_instances(&root, n)?;
    let (docs, failed) = wait_for_instances(children)?;
    let t = Totals::of(&docs, n, failed.len());
    let verify_errors = t.json["verify_errors"].as_u64().unwrap_or(0);
    let mut out = std::io::stdout().lock();
    match args.output_format {
        OutputFormat::Json => {
            let doc = json!({
                "rw": format!("{:?}", args.rw).to_lowercase(),
                "bs": args.bs,
                "dir": root.display().to_string(),
                "instances": docs,
                "totals": t.json,
            });
            writeln!(out, "{}", serde_json::to_string_pretty(&doc)?)?;
        }
        OutputFormat::Normal => print_instances(&mut out, &docs, &t, n)?,
    }
    drop(out);
    if !failed.is_empty() {
        return Err(format!("{} instances failed: {}", failed.len(), failed.join("; ")).into());
    }
    if verify_errors > 0 {
        return Err(format!("{verify_errors} hits held the wrong bytes (verify errors)").into());
    }
    Ok(())
}

/// Starts the `n` children on `root`, each with this run's options, shared, reporting JSON,
/// and all with the same start time.
fn spawn_instances(root: &Path, n: usize) -> Result<Vec<Child>, BoxError> {
    let exe = std::env::current_exe()?;
    let start_at = now_ms() + START_DELAY.as_millis() as u64;
    let base = child_args();
    let mut children = Vec::with_capacity(n);
    for i in 0..n {
        let child = Command::new(&exe)
            .args(&base)
            .arg("--dir")
            .arg(root)
            .args([
                "--sharing",
                "shared",
                "--output-format",
                "json",
                "--progress",
                "never",
            ])
            .arg(format!("--instance={i}/{n}"))
            .arg(format!("--start-at-ms={start_at}"))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot start instance {i} ({}): {e}", exe.display()))?;
        children.push(child);
    }
    Ok(children)
}

/// Waits for every child: its JSON report with its pid and status, and a line for each
/// child that failed or reported nothing readable.
fn wait_for_instances(children: Vec<Child>) -> Result<(Vec<Value>, Vec<String>), BoxError> {
    let mut docs = Vec::with_capacity(children.len());
    let mut failed = Vec::new();
    for (i, c) in children.into_iter().enumerate() {
        let pid = c.id();
        let out = c.wait_with_output()?;
        let doc: Option<Value> = serde_json::from_slice(&out.stdout).ok();
        if !out.status.success() || doc.is_none() {
            failed.push(format!("instance {i} (pid {pid}): {}", out.status));
        }
        docs.push(json!({
            "instance": i,
            "pid": pid,
            "status": out.status.code(),
            "result": doc.unwrap_or(Value::Null),
        }));
    }
    Ok((docs, failed))
}

/// The number at `path` in a report, if there is one.
fn num(v: &Value, path: &[&str]) -> Option<f64> {
    let mut v = v;
    for p in path {
        v = v.get(p)?;
    }
    v.as_f64()
}

/// The instances' figures summed.
struct Totals {
    /// As the JSON report gives them.
    json: Value,
    read_bytes: f64,
    write_bytes: f64,
    /// The longest instance's run, seconds.
    max_elapsed: f64,
}

impl Totals {
    /// Sums the reports `docs` of `n` instances, `failed` of which failed.
    fn of(docs: &[Value], n: usize, failed: usize) -> Totals {
        let sum = |f: &dyn Fn(&Value) -> Option<f64>| -> f64 {
            docs.iter().filter_map(|d| f(&d["result"])).sum::<f64>()
        };
        let max_elapsed = docs
            .iter()
            .filter_map(|d| num(&d["result"], &["elapsed_s"]))
            .fold(0.0f64, f64::max)
            .max(1e-9);
        let read_bytes = sum(&|r| num(r, &["read", "io_bytes"]));
        let write_bytes = sum(&|r| num(r, &["write", "io_bytes"]));
        let json = json!({
            "instances": n,
            "hits": sum(&|r| num(r, &["hits"])) as u64,
            "misses": sum(&|r| num(r, &["misses"])) as u64,
            "errors": sum(&|r| num(r, &["errors"])) as u64,
            "verify_errors": sum(&|r| num(r, &["verify_errors"])) as u64,
            "ops": sum(&|r| num(r, &["ops"])) as u64,
            "read_bytes": read_bytes as u64,
            "write_bytes": write_bytes as u64,
            "elapsed_s": max_elapsed,
            "read_bw_bytes_per_sec": read_bytes / max_elapsed,
            "write_bw_bytes_per_sec": write_bytes / max_elapsed,
            "tree_hits": sum(&|r| num(r, &["store", "tree_hits"])) as u64,
            "published_by_others": sum(&|r| num(r, &["store", "published_by_others"])) as u64,
            "failed_instances": failed,
        });
        Totals {
            json,
            read_bytes,
            write_bytes,
            max_elapsed,
        }
    }
}

/// The text report: a line per instance, then the totals.
fn print_instances(
    out: &mut impl Write,
    docs: &[Value],
    t: &Totals,
    n: usize,
) -> std::io::Result<()> {
    for d in docs {
        let r = &d["result"];
        writeln!(
            out,
            "instance {} (pid {}): ops={} hits={} misses={} errors={} verify-errors={} read={:.1} MiB/s write={:.1} MiB/s tree-hits={} published-by-others={}",
            d["instance"],
            d["pid"],
            r["ops"],
            r["hits"],
            r["misses"],
            r["errors"],
            r["verify_errors"],
            num(r, &["read", "bw_bytes_per_sec"]).unwrap_or(0.0) / 1048576.0,
            num(r, &["write", "bw_bytes_per_sec"]).unwrap_or(0.0) / 1048576.0,
            r["store"]["tree_hits"],
            r["store"]["published_by_others"],
        )?;
    }
    let totals = &t.json;
    writeln!(
        out,
        "total: {n} instances hits={} misses={} errors={} verify-errors={} read={:.1} MiB/s write={:.1} MiB/s",
        totals["hits"],
        totals["misses"],
        totals["errors"],
        totals["verify_errors"].as_u64().unwrap_or(0),
        t.read_bytes / t.max_elapsed / 1048576.0,
        t.write_bytes / t.max_elapsed / 1048576.0,
    )
}
