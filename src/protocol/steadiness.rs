//! Whether the machine was quiet enough during the speed rounds for their figures to mean
//! anything. Two snapshots bracket the rounds: the CPU time of the whole machine
//! (`/proc/stat`), this process's own CPU time and its finished children's (llama-bench
//! included, `/proc/self/stat`), and the load average. What the machine spent that was
//! not this run's (other processes, and time the hypervisor stole) is the measure; the
//! spread of the read-bandwidth probes taken during the rounds is the second. Like
//! hyperfine's warning about outliers, a busy machine gets one line on stderr and a mark
//! on every speed figure in every exporter, never a silent number; the regression gate
//! skips speed for such a run.
//!
//! Pure data: `crate::machine::cpu_snapshot` reads the counters (Linux only; elsewhere
//! nothing is judged and `machine.steadiness` is null).

use serde::{Deserialize, Serialize};

/// Share of all cores' time, in percent, that others may take before a run's speed
/// figures are called unreliable. A quiet 2-core machine measured 0-3 %; one busy loop
/// beside a run takes about 50 %.
pub const MAX_OTHERS_CPU_PCT: f64 = 10.0;
/// Share of all cores' time, in percent, the hypervisor may steal.
pub const MAX_STEAL_PCT: f64 = 10.0;
/// Highest over lowest read probe of the rounds beyond which the memory system was not
/// steady. A shared cloud host that was otherwise quiet drifted by up to 2.3x within one
/// run here (33-78 GB/s), which the paired roofline takes out; a factor beyond this is
/// another tenant's traffic, not drift.
pub const MAX_READ_SPREAD: f64 = 4.0;

/// The machine's CPU counters at one moment (USER_HZ ticks, as /proc reports them).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Snapshot {
    /// Every tick of every core (`cpu` line of /proc/stat, the first eight fields).
    pub total: u64,
    /// Ticks the cores were idle or waiting for I/O.
    pub idle: u64,
    /// Ticks the hypervisor ran something else on these cores.
    pub steal: u64,
    /// This process's user + system ticks and those of its children it has waited for.
    pub own: u64,
    /// The one-minute load average.
    pub load1: f64,
}

impl Snapshot {
    /// The counters from the text of /proc/stat, /proc/self/stat and /proc/loadavg.
    pub fn parse(stat: &str, self_stat: &str, loadavg: &str) -> Option<Snapshot> {
        let cpu = stat.lines().find(|l| l.starts_with("cpu "))?;
        let f: Vec<u64> = cpu
            .split_whitespace()
            .skip(1)
            .map(str::parse)
            .collect::<Result<_, _>>()
            .ok()?;
        // user nice system idle iowait irq softirq steal [guest guest_nice]: guest time
        // is already counted in user and nice.
        if f.len() < 8 {
            return None;
        }
        let total = f[..8].iter().sum();
        // The command name may hold spaces and parentheses: fields follow the last ')'.
        let rest = &self_stat[self_stat.rfind(')')? + 1..];
        let g: Vec<&str> = rest.split_whitespace().collect();
        // After the name: state is field 3, utime..cstime are fields 14..17.
        let tick = |field: usize| g.get(field - 3)?.parse::<u64>().ok();
        let own = tick(14)? + tick(15)? + tick(16)? + tick(17)?;
        let load1 = loadavg.split_whitespace().next()?.parse().ok()?;
        Some(Snapshot {
            total,
            idle: f[3] + f[4],
            steal: f[7],
            own,
            load1,
        })
    }
}

/// How steady the machine was during the speed rounds: `machine.steadiness` in
/// results.json.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Steadiness {
    /// Percent of all cores' time spent on anything but this run (other processes, the
    /// kernel on their behalf, and stolen time).
    pub others_cpu_pct: f64,
    /// Percent of all cores' time the hypervisor stole.
    pub steal_pct: f64,
    /// The higher of the one-minute load averages before and after the rounds.
    pub load_avg: f64,
    /// Highest over lowest read-bandwidth probe taken during the rounds (`None` without
    /// probes).
    pub read_probe_spread: Option<f64>,
    /// Whether the speed figures are unreliable.
    pub noisy: bool,
    /// Why, one phrase per reason (empty when quiet).
    pub reasons: Vec<String>,
}

impl Steadiness {
    /// Judges the rounds between `start` and `end` on `cores` cores, with the read probes
    /// taken during them.
    pub fn judge(start: &Snapshot, end: &Snapshot, read_probes: &[f64], cores: usize) -> Self {
        let total = end.total.saturating_sub(start.total).max(1) as f64;
        let busy = total - end.idle.saturating_sub(start.idle) as f64;
        let own = end.own.saturating_sub(start.own) as f64;
        let others_cpu_pct = (100.0 * (busy - own) / total).clamp(0.0, 100.0);
        let steal_pct = 100.0 * end.steal.saturating_sub(start.steal) as f64 / total;
        let load_avg = start.load1.max(end.load1);
        let read_probe_spread = spread(read_probes);
        let mut reasons = Vec::new();
        if others_cpu_pct > MAX_OTHERS_CPU_PCT {
            reasons.push(format!(
                "other processes used {others_cpu_pct:.0} % of the {cores} cores' time (load average {load_avg:.1})"
            ));
        }
        if steal_pct > MAX_STEAL_PCT {
            reasons.push(format!(
                "the hypervisor stole {steal_pct:.0} % of the cores' time"
            ));
        }
        if let Some(s) = read_probe_spread.filter(|s| *s > MAX_READ_SPREAD) {
            reasons.push(format!(
                "the memory bandwidth probes varied {s:.1}x between repetitions"
            ));
        }
        Steadiness {
            others_cpu_pct,
            steal_pct,
            load_avg,
            read_probe_spread,
            noisy: !reasons.is_empty(),
            reasons,
        }
    }

    /// The one warning line for a noisy run, `None` when the machine was quiet.
    pub fn warning(&self) -> Option<String> {
        self.noisy.then(|| {
            format!(
                "the machine was not quiet during the speed rounds ({}): every speed figure of this run is marked unreliable; measure speed again with nothing else running",
                self.reasons.join("; ")
            )
        })
    }
}

/// Highest over lowest of positive, finite samples; `None` with fewer than two.
fn spread(samples: &[f64]) -> Option<f64> {
    let ok: Vec<f64> = samples
        .iter()
        .copied()
        .filter(|x| x.is_finite() && *x > 0.0)
        .collect();
    if ok.len() < 2 {
        return None;
    }
    let hi = ok.iter().copied().fold(f64::MIN, f64::max);
    let lo = ok.iter().copied().fold(f64::MAX, f64::min);
    Some(hi / lo)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(total: u64, idle: u64, steal: u64, own: u64, load1: f64) -> Snapshot {
        Snapshot {
            total,
            idle,
            steal,
            own,
            load1,
        }
    }

    #[test]
    fn parses_proc_files() {
        let stat = "cpu  1000 20 300 5000 40 5 6 7 0 0\ncpu0 500 10 150 2500 20 2 3 3 0 0\n";
        // A command name with a space and a parenthesis.
        let self_stat =
            "4242 (kwk (eval)) R 1 4242 4242 0 -1 4194304 100 0 0 0 250 50 30 20 20 0 3 0 1 2 3";
        let s = Snapshot::parse(stat, self_stat, "1.50 0.80 0.40 2/300 4242\n").unwrap();
        assert_eq!(s.total, 1000 + 20 + 300 + 5000 + 40 + 5 + 6 + 7);
        assert_eq!(s.idle, 5040);
        assert_eq!(s.steal, 7);
        assert_eq!(s.own, 250 + 50 + 30 + 20);
        assert_eq!(s.load1, 1.5);
        assert!(Snapshot::parse("intr 1 2", self_stat, "1 1 1").is_none());
    }

    #[test]
    fn a_quiet_run_is_not_flagged() {
        // 2 cores × 100 s: this run used 196 s, the machine was busy 198 s.
        let a = snap(0, 0, 0, 0, 1.9);
        let b = snap(20_000, 200, 0, 19_600, 2.0);
        // The Zen 5's drift in a quiet run: 33-78 GB/s.
        let s = Steadiness::judge(&a, &b, &[33.3, 60.0, 77.7], 2);
        assert!(!s.noisy, "{s:?}");
        assert!((s.others_cpu_pct - 1.0).abs() < 1e-9);
        assert!(s.warning().is_none());
    }

    #[test]
    fn busy_loops_beside_the_run_are_flagged() {
        // Two busy loops on the 2 cores: the run got half the time.
        let a = snap(0, 0, 0, 0, 2.0);
        let b = snap(20_000, 0, 0, 10_000, 4.1);
        let s = Steadiness::judge(&a, &b, &[70.0, 12.0, 10.0], 2);
        assert!(s.noisy);
        let w = s.warning().unwrap();
        assert!(w.contains("other processes used 50 %"), "{w}");
        assert!(w.contains("load average 4.1"), "{w}");
        assert!(w.contains("varied 7.0x"), "{w}");
    }

    /// Two runs recorded on this project's 2-core Zen 5 (2026-12-05, `--chunks 2 --reps 2`,
    /// float32, int8 and llama.cpp's Q8_0 with llama-bench): the read probes as the runs
    /// took them, and counter deltas with the shares /proc gave (the first beside two
    /// busy loops: others 55.3 %, load 3.1; the second quiet: 0.35 %, load 2.72). Under
    /// load the probes halved but stayed as steady as a quiet run's, so the CPU share is
    /// what tells the two apart.
    #[test]
    fn recorded_runs_busy_and_quiet() {
        let busy_probes = [
            29.5, 30.8, 60.8, 21.6, 32.4, 31.7, 29.3, 29.2, 30.5, 31.7, 32.6, 31.9, 30.5, 29.3,
            29.5,
        ];
        let quiet_probes = [
            58.3, 37.2, 37.1, 36.7, 65.5, 63.0, 65.4, 60.5, 59.7, 63.4, 64.7, 64.0, 58.0, 61.5,
            62.4,
        ];
        let busy = Steadiness::judge(
            &snap(0, 0, 0, 0, 2.0),
            &snap(10_000, 0, 2, 4_472, 3.1),
            &busy_probes,
            2,
        );
        assert!(busy.noisy, "{busy:?}");
        assert_eq!(busy.reasons.len(), 1, "{busy:?}");
        assert!(busy.reasons[0].starts_with("other processes used 55 %"));
        let quiet = Steadiness::judge(
            &snap(0, 0, 0, 0, 2.0),
            &snap(10_000, 300, 3, 9_665, 2.72),
            &quiet_probes,
            2,
        );
        assert!(!quiet.noisy, "{quiet:?}");
        assert!(quiet.read_probe_spread.unwrap() < MAX_READ_SPREAD);
    }

    #[test]
    fn stolen_time_is_flagged() {
        let a = snap(0, 0, 0, 0, 2.0);
        let b = snap(10_000, 0, 2_000, 8_000, 2.0);
        let s = Steadiness::judge(&a, &b, &[], 2);
        assert!(s.noisy);
        assert!((s.steal_pct - 20.0).abs() < 1e-9);
        assert_eq!(s.read_probe_spread, None);
        assert_eq!(s.reasons.len(), 2, "{:?}", s.reasons);
    }

    #[test]
    fn counters_that_run_backwards_do_not_panic() {
        let a = snap(100, 50, 5, 40, 0.0);
        let b = snap(90, 40, 0, 30, 0.0);
        let s = Steadiness::judge(&a, &b, &[f64::NAN, 0.0, 5.0], 2);
        assert!(s.others_cpu_pct.is_finite());
        assert_eq!(s.read_probe_spread, None);
    }
}
