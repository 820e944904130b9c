//! Result table: throughput, fraction of the hardware ceiling, comparison
//! with a peer library.

use std::fmt::Write as _;

/// One measured GEMM.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub name: String,
    /// (m, n, k, l): l is the batch count.
    pub shape: (usize, usize, usize, usize),
    /// Our median time, milliseconds.
    pub ms: f64,
    /// Floating-point operations of one call (2·m·n·k·l for a GEMM).
    pub flops: f64,
    /// Bytes that must move to/from DRAM at least once per call.
    pub bytes: f64,
    /// Peer's median time for the same problem, milliseconds; `None` = n/a.
    pub peer_ms: Option<f64>,
    pub peer_name: String,
    /// Hardware ceilings for this data type: dense TFLOP/s and DRAM GB/s.
    pub ceiling_tflops: f64,
    pub ceiling_gbs: f64,
}

/// TFLOP/s achieved by `flops` operations in `ms` milliseconds (NaN if `ms`
/// is not a positive finite number).
pub fn tflops(flops: f64, ms: f64) -> f64 {
    if !(ms.is_finite() && ms > 0.0) {
        return f64::NAN;
    }
    // flops / (ms · 1e-3 s) / 1e12
    flops / ms * 1e-9
}

/// GB/s (10^9 bytes per second) achieved by moving `bytes` in `ms`
/// milliseconds (NaN if `ms` is not a positive finite number).
pub fn gbs(bytes: f64, ms: f64) -> f64 {
    if !(ms.is_finite() && ms > 0.0) {
        return f64::NAN;
    }
    // bytes / (ms · 1e-3 s) / 1e9
    bytes / ms * 1e-6
}

/// Which ceiling bounds a row more tightly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    Compute,
    Bandwidth,
}

impl Row {
    pub fn tflops(&self) -> f64 {
        tflops(self.flops, self.ms)
    }

    pub fn gbs(&self) -> f64 {
        gbs(self.bytes, self.ms)
    }

    /// The larger of (achieved TFLOP/s / ceiling) and (achieved GB/s /
    /// ceiling), as a fraction (1.0 = at the ceiling), with which one it was.
    /// A ceiling that is not positive is ignored; `None` if both are.
    pub fn ceiling_fraction(&self) -> Option<(f64, Bound)> {
        let c = (self.ceiling_tflops > 0.0).then(|| self.tflops() / self.ceiling_tflops);
        let b = (self.ceiling_gbs > 0.0).then(|| self.gbs() / self.ceiling_gbs);
        match (c, b) {
            (Some(c), Some(b)) if b > c => Some((b, Bound::Bandwidth)),
            (Some(c), Some(_)) => Some((c, Bound::Compute)),
            (Some(c), None) => Some((c, Bound::Compute)),
            (None, Some(b)) => Some((b, Bound::Bandwidth)),
            (None, None) => None,
        }
    }

    /// peer_time / our_time: > 1 means we are faster.
    pub fn peer_ratio(&self) -> Option<f64> {
        self.peer_ms.map(|p| p / self.ms)
    }
}

const HEADERS: [&str; 12] = [
    "name",
    "M",
    "N",
    "K",
    "L",
    "time(us)",
    "TFLOP/s",
    "GB/s",
    "%ceil",
    "peer",
    "peer(us)",
    "peer/ours",
];
/// Columns that are left-aligned (text); the others are right-aligned.
const LEFT: [bool; 12] = [
    true, false, false, false, false, false, false, false, false, true, false, false,
];

fn cells(r: &Row) -> [String; 12] {
    let (m, n, k, l) = r.shape;
    let pct = match r.ceiling_fraction() {
        Some((f, Bound::Compute)) => format!("{:.1}% C", 100.0 * f),
        Some((f, Bound::Bandwidth)) => format!("{:.1}% BW", 100.0 * f),
        None => "n/a".to_string(),
    };
    let peer_name = if r.peer_name.is_empty() {
        "-".to_string()
    } else {
        r.peer_name.clone()
    };
    let (peer_us, ratio) = match (r.peer_ms, r.peer_ratio()) {
        (Some(p), Some(q)) => (format!("{:.1}", p * 1e3), format!("{q:.2}x")),
        _ => ("n/a".to_string(), "n/a".to_string()),
    };
    [
        r.name.clone(),
        m.to_string(),
        n.to_string(),
        k.to_string(),
        l.to_string(),
        format!("{:.1}", r.ms * 1e3),
        format!("{:.1}", r.tflops()),
        format!("{:.0}", r.gbs()),
        pct,
        peer_name,
        peer_us,
        ratio,
    ]
}

/// Renders rows as an aligned text table (header, rule, one line per row).
pub fn format_table(rows: &[Row]) -> String {
    let body: Vec<[String; 12]> = rows.iter().map(cells).collect();
    let mut widths = HEADERS.map(|h| h.chars().count());
    for r in &body {
        for (w, c) in widths.iter_mut().zip(r.iter()) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cols: &[String]| -> String {
        let mut s = String::new();
        for (i, c) in cols.iter().enumerate() {
            if i > 0 {
                s.push_str("  ");
            }
            let pad = widths[i].saturating_sub(c.chars().count());
            if LEFT[i] {
                s.push_str(c);
                s.extend(std::iter::repeat_n(' ', pad));
            } else {
                s.extend(std::iter::repeat_n(' ', pad));
                s.push_str(c);
            }
        }
        s.trim_end().to_string()
    };
    let mut out = String::new();
    let _ = writeln!(out, "{}", line(&HEADERS.map(String::from)));
    let total: usize = widths.iter().sum::<usize>() + 2 * (widths.len() - 1);
    let _ = writeln!(out, "{}", "-".repeat(total));
    for r in &body {
        let _ = writeln!(out, "{}", line(r));
    }
    out
}

/// Prints [`format_table`] to stdout.
pub fn print_table(rows: &[Row]) {
    print!("{}", format_table(rows));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(name: &str, ms: f64, peer: Option<f64>) -> Row {
        let (m, n, k) = (4096usize, 4096usize, 4096usize);
        Row {
            name: name.into(),
            shape: (m, n, k, 1),
            ms,
            flops: 2.0 * (m * n * k) as f64,
            bytes: (m * k + n * k) as f64 + 2.0 * (m * n) as f64,
            peer_ms: peer,
            peer_name: "cublasLt".into(),
            ceiling_tflops: 989.0,
            ceiling_gbs: 3350.0,
        }
    }

    #[test]
    fn arithmetic() {
        // 1e12 flops in 1 s = 1 TFLOP/s; 1e9 bytes in 1 ms = 1000 GB/s.
        assert!((tflops(1e12, 1000.0) - 1.0).abs() < 1e-12);
        assert!((tflops(2.0 * 4096f64.powi(3), 0.2) - 687.194_767_36).abs() < 1e-6);
        assert!((gbs(1e9, 1.0) - 1000.0).abs() < 1e-9);
        assert!((gbs(3.35e6, 0.001) - 3350.0).abs() < 1e-9);
        assert!(tflops(1.0, 0.0).is_nan());
        assert!(gbs(1.0, -1.0).is_nan());
        assert!(gbs(1.0, f64::NAN).is_nan());
    }

    #[test]
    fn ceiling_and_ratio() {
        let r = row("fp8", 0.2, Some(0.25));
        let (f, b) = r.ceiling_fraction().unwrap();
        assert_eq!(b, Bound::Compute);
        assert!((f - r.tflops() / 989.0).abs() < 1e-12);
        assert!((r.peer_ratio().unwrap() - 1.25).abs() < 1e-12);

        // A GEMV-like shape is bandwidth bound.
        let mut g = row("gemv", 0.02, None);
        g.shape = (1, 8192, 8192, 1);
        g.flops = 2.0 * 8192.0 * 8192.0;
        g.bytes = 8192.0 * 8192.0;
        let (f, b) = g.ceiling_fraction().unwrap();
        assert_eq!(b, Bound::Bandwidth);
        assert!((f - gbs(g.bytes, g.ms) / 3350.0).abs() < 1e-12);
        assert_eq!(g.peer_ratio(), None);

        let mut z = row("z", 1.0, None);
        z.ceiling_gbs = 0.0;
        z.ceiling_tflops = 0.0;
        assert_eq!(z.ceiling_fraction(), None);
    }

    #[test]
    fn table_layout() {
        let rows = vec![
            row("bf16_tn", 0.2, Some(0.25)),
            row("fp8_blockwise_long_name", 0.1, None),
        ];
        let t = format_table(&rows);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 4, "{t}");
        assert!(lines[0].starts_with("name"));
        assert!(lines[1].chars().all(|c| c == '-'));
        // Every column ends at the same offset: right-aligned numeric
        // columns line up, so the header's "K" ends where the rows' "4096" end.
        let hk = lines[0].find(" K ").unwrap() + 2;
        for l in &lines[2..] {
            assert_eq!(&l[hk - 4..hk], "4096", "{t}");
        }
        // Values.
        assert!(lines[2].contains("200.0"), "{t}"); // 0.2 ms = 200 us
        assert!(lines[2].contains("1.25x"), "{t}");
        assert!(lines[2].contains("250.0"), "{t}");
        assert!(lines[2].contains("% C"), "{t}");
        assert!(lines[3].contains("n/a"), "{t}");
        let tf = format!("{:.1}", rows[0].tflops());
        assert!(lines[2].contains(&tf), "{t}");
        // Same width for all data lines' first column (left aligned).
        let name_w = "fp8_blockwise_long_name".len();
        assert_eq!(&lines[2][name_w..name_w + 2], "  ");
        assert!(lines[2].starts_with("bf16_tn "));
        assert!(format_table(&[]).lines().count() == 2);
    }
}
