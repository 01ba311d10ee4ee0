//! Plots for `eval` with a plot directory, written as plain SVG (no font or drawing library needed):
//! predicted score against measured relative throughput per task, and top-k curves.

use std::fmt::Write as _;
use std::path::Path;

use crate::error::{Context, Result};
use tessel_model::Ranked;
use tessel_model::metrics::top_k_score;

const W: f64 = 900.0;

fn header(out: &mut String, w: f64, h: f64, title: &str) {
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(out, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        out,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>"#,
        w / 2.0,
        escape(title)
    );
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// One panel per task (up to 16): x = the model's score (rank-normalised), y = throughput
/// relative to the task's best.
pub fn scatter(path: &Path, tasks: &[(String, Ranked)]) -> Result<()> {
    let shown: Vec<&(String, Ranked)> = tasks.iter().take(16).collect();
    let cols = 4usize;
    let rows = shown.len().div_ceil(cols).max(1);
    let (pw, ph) = (W / cols as f64, 200.0);
    let h = 40.0 + rows as f64 * ph;
    let mut out = String::new();
    header(
        &mut out,
        W,
        h,
        "measured relative throughput (y) against the model's rank (x), per task",
    );
    for (n, (name, t)) in shown.iter().enumerate() {
        let (x0, y0) = (
            (n % cols) as f64 * pw + 40.0,
            40.0 + (n / cols) as f64 * ph + 10.0,
        );
        let (iw, ih) = (pw - 60.0, ph - 60.0);
        let _ = writeln!(
            out,
            r##"<rect x="{x0}" y="{y0}" width="{iw}" height="{ih}" fill="none" stroke="#999"/>"##
        );
        // `workload @ target @ machine`: the workload and the platform fit under a panel.
        let mut parts = name.split(" @ ");
        let (spec, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        let spec: String = spec.chars().take(44).collect();
        let label = format!("{spec} [{target}]");
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{}" text-anchor="middle" font-size="7">{}</text>"#,
            x0 + iw / 2.0,
            y0 + ih + 14.0,
            escape(&label)
        );
        for (v, dy) in [("1", 4.0), ("0", ih + 4.0)] {
            let _ = writeln!(
                out,
                r#"<text x="{}" y="{}" text-anchor="end" font-size="9">{v}</text>"#,
                x0 - 4.0,
                y0 + dy
            );
        }
        let best = t.latency.iter().copied().fold(f64::INFINITY, f64::min);
        // Rank of each score among the task's, 0 = lowest, so outliers do not squash the axis.
        let mut order: Vec<usize> = (0..t.predicted.len()).collect();
        order.sort_by(|&a, &b| t.predicted[a].total_cmp(&t.predicted[b]));
        let denom = (order.len().max(2) - 1) as f64;
        for (rank, &i) in order.iter().enumerate() {
            let x = x0 + iw * rank as f64 / denom;
            let y = y0 + ih * (1.0 - best / t.latency[i]);
            let _ = writeln!(
                out,
                r##"<circle cx="{x:.1}" cy="{y:.1}" r="2" fill="#1f77b4" fill-opacity="0.6"/>"##
            );
        }
    }
    out.push_str("</svg>\n");
    std::fs::write(path, out).with_context(|| format!("writing {}", path.display()))
}

/// Top-k score against k for each ranking (model, ridge, random).
pub fn top_k(path: &Path, curves: &[(&str, &[Ranked])]) -> Result<()> {
    let (h, x0, y0, iw, ih) = (420.0, 70.0, 50.0, W - 120.0, 300.0);
    let ks: Vec<usize> = (1..=32).collect();
    let mut out = String::new();
    header(
        &mut out,
        W,
        h,
        "top-k score (1.0 = the best candidate is among the model's k first)",
    );
    let _ = writeln!(
        out,
        r##"<rect x="{x0}" y="{y0}" width="{iw}" height="{ih}" fill="none" stroke="#999"/>"##
    );
    for tick in 0..=5 {
        let v = tick as f64 / 5.0;
        let y = y0 + ih * (1.0 - v);
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{:.1}" text-anchor="end">{v:.1}</text>"#,
            x0 - 6.0,
            y + 4.0
        );
    }
    for &k in &[1usize, 5, 10, 20, 32] {
        let x = x0 + iw * (k - 1) as f64 / 31.0;
        let _ = writeln!(
            out,
            r#"<text x="{x:.1}" y="{}" text-anchor="middle">k={k}</text>"#,
            y0 + ih + 16.0
        );
    }
    let colors = ["#1f77b4", "#ff7f0e", "#7f7f7f", "#2ca02c"];
    for (c, (name, tasks)) in curves.iter().enumerate() {
        let pts: Vec<String> = ks
            .iter()
            .map(|&k| {
                let x = x0 + iw * (k - 1) as f64 / 31.0;
                let y = y0 + ih * (1.0 - top_k_score(tasks, k));
                format!("{x:.1},{y:.1}")
            })
            .collect();
        let color = colors[c % colors.len()];
        let _ = writeln!(
            out,
            r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2"/>"#,
            pts.join(" ")
        );
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{}" fill="{color}">{}</text>"#,
            x0 + iw - 80.0,
            y0 + ih - 60.0 + 16.0 * c as f64,
            escape(name)
        );
    }
    out.push_str("</svg>\n");
    std::fs::write(path, out).with_context(|| format!("writing {}", path.display()))
}

/// PNG copies of the SVG files where `rsvg-convert` (Debian's librsvg2-bin) is installed;
/// returns why not otherwise.
pub fn png_copies(svgs: &[&Path]) -> Result<(), String> {
    for svg in svgs {
        let png = svg.with_extension("png");
        let status = std::process::Command::new("rsvg-convert")
            .arg(svg)
            .arg("-o")
            .arg(&png)
            .status()
            .map_err(|e| format!("rsvg-convert (librsvg2-bin) not available: {e}"))?;
        if !status.success() {
            return Err(format!("rsvg-convert failed on {}", svg.display()));
        }
    }
    Ok(())
}
