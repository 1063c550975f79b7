//! What the command-line tools share: logging set-up and how an error becomes an exit status.

use std::process::ExitCode;
use std::time::Duration;

/// A usage error found after parsing: reported like clap's, with exit status 2.
#[derive(Debug)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// The tools' error type.
pub type BoxError = Box<dyn std::error::Error>;

/// Logs to stderr, filtered by `RUST_LOG` (default: warnings), in colour only when stderr is a
/// terminal.
pub fn init_logging() {
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
}

/// The exit status for a tool's error, after printing it: a closed pipe (`| head`) is not a
/// failure; bad input (options, worker ids, configuration) is a usage error (2); the rest 1.
pub fn exit_for(tool: &str, e: &BoxError) -> ExitCode {
    if e.downcast_ref::<std::io::Error>()
        .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    {
        return ExitCode::SUCCESS;
    }
    eprintln!("{tool}: {e}");
    let usage = e.is::<UsageError>()
        || matches!(
            e.downcast_ref::<tierkv::Error>(),
            Some(tierkv::Error::Config(_) | tierkv::Error::InvalidKey { .. })
        );
    ExitCode::from(if usage { 2 } else { 1 })
}

/// Parses a positive duration: `15s`, `500ms`, `2m`, `1h` (a bare number is seconds).
#[allow(dead_code)] // not every tool takes durations
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().map_err(|_| format!("bad duration {s:?}"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "" | "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(format!("bad duration unit in {s:?}; use ms, s, m or h")),
    };
    if secs <= 0.0 {
        return Err("the duration must be positive".into());
    }
    // `from_secs_f64` panics past `Duration::MAX`; a duration that rounds to nothing is as
    // much a mistake as zero.
    match Duration::try_from_secs_f64(secs) {
        Ok(d) if !d.is_zero() => Ok(d),
        Ok(_) => Err(format!("bad duration {s:?}: shorter than a nanosecond")),
        Err(_) => Err(format!("bad duration {s:?}: too long")),
    }
}

/// Parses `4096`, `4k`, `64KiB`, `1MiB`, `1m`, `2GiB` (fio's convention: k = 1024).
#[allow(dead_code)] // not every tool takes sizes
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| format!("bad size {s:?}"))?;
    let mult: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        _ => {
            return Err(format!(
                "bad size unit in {s:?}; use k, KiB, m, MiB, g, GiB"
            ));
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("size {s:?} overflows"))
}
