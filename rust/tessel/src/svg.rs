//! SVG Gantt charts, written by hand (no dependency).
//!
//! Devices on the y axis (device 0 at the top), time on the x axis; forward blocks blue,
//! backward orange, weight green, other grey; multi-device blocks hatched; each job labelled
//! with its micro-batch; red vertical lines at the repetend window; an optional panel below
//! with memory over time per device and the capacity line; a title with the makespan, the
//! bubble ratio and the period.

use std::fmt::Write;

use maleki_common::{Error, Result};

use crate::model::{Kind, Schedule, UNLIMITED};
use crate::simulate::{detect_period, memory_timeline};

/// Options of [`to_svg`].
#[derive(Clone, Debug, PartialEq)]
pub struct SvgOptions {
    /// Draw the memory panel.
    pub memory: bool,
    /// Draw red lines at the repetend window (when the schedule has one).
    pub repetend: bool,
    /// Text before the figures in the title.
    pub title: Option<String>,
    /// Width of the time axis in pixels.
    pub width: f64,
}

impl Default for SvgOptions {
    fn default() -> Self {
        SvgOptions {
            memory: true,
            repetend: true,
            title: None,
            width: 960.0,
        }
    }
}

/// Largest number of jobs drawn (an SVG with millions of rectangles helps nobody).
pub const MAX_SVG_JOBS: usize = 200_000;

const LEFT: f64 = 64.0;
const RIGHT: f64 = 16.0;
const TOP: f64 = 44.0;
const ROW: f64 = 24.0;
const AXIS: f64 = 28.0;
const MEM_H: f64 = 130.0;

/// Fill colour of a kind (matplotlib's "tab" palette, as the Python plot uses).
pub fn kind_colour(k: Kind) -> &'static str {
    match k {
        Kind::Forward => "#1f77b4",
        Kind::Backward => "#ff7f0e",
        Kind::Weight => "#2ca02c",
        Kind::Other => "#7f7f7f",
    }
}

const DEVICE_COLOURS: [&str; 10] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A "nice" tick step (1, 2 or 5 times a power of ten) giving about `target` ticks over `span`.
fn tick_step(span: f64, target: f64) -> f64 {
    let raw = (span / target).max(1e-9);
    let mag = 10f64.powf(raw.log10().floor());
    let m = raw / mag;
    let nice = if m <= 1.0 {
        1.0
    } else if m <= 2.0 {
        2.0
    } else if m <= 5.0 {
        5.0
    } else {
        10.0
    };
    (nice * mag).max(1.0)
}

/// The title line: `[title — ]makespan C, bubble ratio x%, P = p`.
pub fn title_line(s: &Schedule, title: Option<&str>) -> String {
    let period = s.period.or_else(|| detect_period(s).map(|p| p.period));
    let mut t = String::new();
    if let Some(x) = title.filter(|x| !x.is_empty()) {
        t.push_str(x);
        t.push_str(" — ");
    }
    let _ = write!(
        t,
        "makespan {}, bubble ratio {:.1}%",
        s.makespan(),
        100.0 * s.bubble_ratio()
    );
    match period {
        Some(p) => {
            let _ = write!(t, ", P = {p}");
        }
        None => t.push_str(", P = –"),
    }
    t
}

/// Draws the schedule as an SVG document.
pub fn to_svg(s: &Schedule, o: &SvgOptions) -> Result<String> {
    let p = &*s.premise;
    let (n, nd) = (p.nblocks(), p.ndevs());
    if s.nmicros * n > MAX_SVG_JOBS {
        return Err(Error::invalid(
            "schedule",
            format!(
                "{} jobs are too many to draw (at most {MAX_SVG_JOBS})",
                s.nmicros * n
            ),
        ));
    }
    if !(o.width.is_finite() && (50.0..=100_000.0).contains(&o.width)) {
        return Err(Error::invalid(
            "width",
            format!("must be in [50, 100000] pixels, got {}", o.width),
        ));
    }
    let t0 = s.starts.iter().copied().min().unwrap_or(0).min(0);
    let c = s.makespan().max(t0 + 1);
    let span = (c - t0) as f64;
    let sx = o.width / span;
    let x = |t: i64| LEFT + (t - t0) as f64 * sx;
    let gantt_h = nd as f64 * ROW;
    let mem_top = TOP + gantt_h + AXIS + 16.0;
    let height = if o.memory {
        mem_top + MEM_H + AXIS
    } else {
        TOP + gantt_h + AXIS
    };
    let width = LEFT + o.width + RIGHT;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.0} {height:.0}" font-family="DejaVu Sans, Arial, sans-serif">"##
    );
    out.push_str(
        r##"<defs><pattern id="hatch" patternUnits="userSpaceOnUse" width="6" height="6" patternTransform="rotate(45)"><line x1="0" y1="0" x2="0" y2="6" stroke="#000" stroke-opacity="0.35" stroke-width="2"/></pattern></defs>"##,
    );
    out.push('\n');
    let _ = writeln!(out, r##"<rect width="100%" height="100%" fill="white"/>"##);
    let _ = writeln!(
        out,
        r##"<text x="{LEFT}" y="20" font-size="14" font-weight="bold">{}</text>"##,
        esc(&title_line(s, o.title.as_deref()))
    );
    // Legend of kinds present.
    let mut lx = width - RIGHT;
    for k in [Kind::Other, Kind::Weight, Kind::Backward, Kind::Forward] {
        if p.blocks().iter().any(|b| b.kind == k) {
            lx -= 78.0;
            let _ = writeln!(
                out,
                r##"<rect x="{lx:.1}" y="28" width="10" height="10" fill="{}"/><text x="{:.1}" y="37" font-size="10">{}</text>"##,
                kind_colour(k),
                lx + 13.0,
                k.as_str()
            );
        }
    }
    if p.blocks().iter().any(|b| b.devices.len() > 1) {
        lx -= 96.0;
        let _ = writeln!(
            out,
            r##"<rect x="{lx:.1}" y="28" width="10" height="10" fill="#bbb"/><rect x="{lx:.1}" y="28" width="10" height="10" fill="url(#hatch)"/><text x="{:.1}" y="37" font-size="10">multi-device</text>"##,
            lx + 13.0
        );
    }
    // Device rows.
    for d in 0..nd {
        let y = TOP + d as f64 * ROW;
        let _ = writeln!(
            out,
            r##"<rect x="{LEFT}" y="{y:.1}" width="{:.1}" height="{ROW}" fill="{}"/><text x="{:.1}" y="{:.1}" font-size="11" text-anchor="end">dev {d}</text>"##,
            o.width,
            if d % 2 == 0 { "#f7f7f7" } else { "#efefef" },
            LEFT - 6.0,
            y + ROW * 0.65
        );
    }
    // Jobs.
    for j in 0..s.nmicros {
        for g in 0..n {
            let b = p.block(g);
            let (x0, w) = (x(s.start(j, g)), b.span as f64 * sx);
            let label = j.to_string();
            let fs = (w / (0.62 * label.len() as f64 + 0.4))
                .min(ROW * 0.55)
                .min(12.0);
            for &d in &b.devices {
                let y = TOP + d as f64 * ROW + 2.0;
                let h = ROW - 4.0;
                let _ = write!(
                    out,
                    r##"<rect x="{x0:.2}" y="{y:.1}" width="{w:.2}" height="{h:.1}" fill="{}" stroke="white" stroke-width="{:.2}"><title>{} mb {j} [{}, {})</title></rect>"##,
                    kind_colour(b.kind),
                    (0.08 * w).min(0.8),
                    esc(&b.name),
                    s.start(j, g),
                    s.end(j, g)
                );
                if b.devices.len() > 1 {
                    let _ = write!(
                        out,
                        r##"<rect x="{x0:.2}" y="{y:.1}" width="{w:.2}" height="{h:.1}" fill="url(#hatch)"/>"##
                    );
                }
                if fs >= 5.0 {
                    let _ = write!(
                        out,
                        r##"<text x="{:.2}" y="{:.2}" font-size="{fs:.1}" fill="white" text-anchor="middle">{label}</text>"##,
                        x0 + w / 2.0,
                        y + h / 2.0 + fs * 0.36
                    );
                }
                out.push('\n');
            }
        }
    }
    // Time axis.
    let axis = |out: &mut String, y: f64| {
        let step = tick_step(span, 12.0);
        let _ = writeln!(
            out,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#333"/>"##,
            LEFT + o.width
        );
        let first = (t0 as f64 / step).ceil() * step;
        let mut t = first;
        while t <= c as f64 + 1e-9 {
            let xt = LEFT + (t - t0 as f64) * sx;
            let _ = writeln!(
                out,
                r##"<line x1="{xt:.1}" y1="{y:.1}" x2="{xt:.1}" y2="{:.1}" stroke="#333"/><text x="{xt:.1}" y="{:.1}" font-size="10" text-anchor="middle">{}</text>"##,
                y + 4.0,
                y + 15.0,
                t as i64
            );
            t += step;
        }
    };
    axis(&mut out, TOP + gantt_h);
    // Repetend window.
    let rep_lines = |out: &mut String, y0: f64, y1: f64| {
        if let (true, Some((a, b))) = (o.repetend, s.repetend) {
            for t in [a, b] {
                let xt = x(t);
                let _ = writeln!(
                    out,
                    r##"<line x1="{xt:.2}" y1="{y0:.1}" x2="{xt:.2}" y2="{y1:.1}" stroke="red" stroke-width="1.5"/>"##
                );
            }
        }
    };
    rep_lines(&mut out, TOP - 4.0, TOP + gantt_h + 4.0);
    // Memory panel.
    if o.memory {
        let lines: Vec<(Vec<i64>, Vec<i64>)> = (0..nd)
            .map(|d| memory_timeline(s, d, s.convention))
            .collect();
        let finite_caps: Vec<i64> = s
            .memory
            .iter()
            .copied()
            .filter(|&m| m != UNLIMITED)
            .collect();
        let top = lines
            .iter()
            .flat_map(|l| l.1.iter().copied())
            .chain(finite_caps.iter().copied())
            .max()
            .unwrap_or(0)
            .max(1);
        let bottom = lines
            .iter()
            .flat_map(|l| l.1.iter().copied())
            .min()
            .unwrap_or(0)
            .min(0);
        let sy = MEM_H / (top - bottom) as f64;
        let y = |m: i64| mem_top + MEM_H - (m - bottom) as f64 * sy;
        let _ = writeln!(
            out,
            r##"<rect x="{LEFT}" y="{mem_top:.1}" width="{:.1}" height="{MEM_H}" fill="#fafafa" stroke="#ccc"/><text x="{:.1}" y="{:.1}" font-size="11" text-anchor="end" transform="rotate(-90 {:.1} {:.1})">memory</text>"##,
            o.width,
            LEFT - 34.0,
            mem_top + MEM_H / 2.0,
            LEFT - 34.0,
            mem_top + MEM_H / 2.0
        );
        let mstep = tick_step((top - bottom) as f64, 4.0);
        let mut m = (bottom as f64 / mstep).ceil() * mstep;
        while m <= top as f64 + 1e-9 {
            let ym = y(m as i64);
            let _ = writeln!(
                out,
                r##"<line x1="{:.1}" y1="{ym:.1}" x2="{LEFT}" y2="{ym:.1}" stroke="#333"/><text x="{:.1}" y="{:.1}" font-size="10" text-anchor="end">{}</text>"##,
                LEFT - 4.0,
                LEFT - 6.0,
                ym + 3.5,
                m as i64
            );
            m += mstep;
        }
        let mut caps: Vec<i64> = finite_caps.clone();
        caps.sort_unstable();
        caps.dedup();
        for cap in caps {
            let yc = y(cap);
            let _ = writeln!(
                out,
                r##"<line x1="{LEFT}" y1="{yc:.1}" x2="{:.1}" y2="{yc:.1}" stroke="#d62728" stroke-dasharray="6 3"/><text x="{:.1}" y="{:.1}" font-size="10" fill="#d62728" text-anchor="end">cap {cap}</text>"##,
                LEFT + o.width,
                LEFT + o.width - 2.0,
                yc - 3.0
            );
        }
        for (d, (times, levels)) in lines.iter().enumerate() {
            let mut pts = String::new();
            for k in 0..times.len() {
                let xa = x(times[k]);
                let xb = if k + 1 < times.len() {
                    x(times[k + 1])
                } else {
                    x(c)
                };
                let ym = y(levels[k]) - d as f64 * 0.6; // tiny offset keeps equal lines visible
                let _ = write!(pts, "{xa:.2},{ym:.2} {xb:.2},{ym:.2} ");
            }
            let col = DEVICE_COLOURS[d % DEVICE_COLOURS.len()];
            let _ = writeln!(
                out,
                r##"<polyline points="{pts}" fill="none" stroke="{col}" stroke-width="1.4"/>"##
            );
            if nd <= 16 {
                let _ = writeln!(
                    out,
                    r##"<text x="{:.1}" y="{:.1}" font-size="9" fill="{col}">dev {d}</text>"##,
                    LEFT + 4.0 + (d % 8) as f64 * 40.0,
                    mem_top + 10.0 + (d / 8) as f64 * 10.0
                );
            }
        }
        axis(&mut out, mem_top + MEM_H);
        rep_lines(&mut out, mem_top, mem_top + MEM_H);
    }
    out.push_str("</svg>\n");
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::baselines::baseline;
    use crate::premises::{builtin, Options};
    use std::sync::Arc;

    #[test]
    fn draws_every_job_and_the_title() {
        let p = Arc::new(builtin("mshape", 4, &Options::default()).unwrap());
        let mut s = baseline("1f1b+", p, 6).unwrap().schedule;
        s.repetend = Some((10, 22));
        s.memory = vec![6; 4];
        let svg = to_svg(
            &s,
            &SvgOptions {
                title: Some("1F1B+ <mshape>".into()),
                ..Default::default()
            },
        )
        .unwrap();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        // One rectangle per job and device (T blocks span 4 devices), plus hatches for them.
        let per_mb: usize = s.premise.blocks().iter().map(|b| b.devices.len()).sum();
        assert_eq!(svg.matches("<title>").count(), 6 * per_mb);
        assert_eq!(
            svg.matches(r##"fill="url(#hatch)"/>"##).count(),
            6 * 2 * 4 + 1
        );
        assert!(svg.contains(&format!("makespan {}", s.makespan())));
        assert!(svg.contains("1F1B+ &lt;mshape&gt;"));
        assert_eq!(svg.matches(r##"stroke="red""##).count(), 4);
        assert!(svg.contains("cap 6"));
        let no_mem = to_svg(
            &s,
            &SvgOptions {
                memory: false,
                repetend: false,
                ..Default::default()
            },
        )
        .unwrap();
        assert!(!no_mem.contains("polyline") && !no_mem.contains(r##"stroke="red""##));
        assert!(to_svg(
            &s,
            &SvgOptions {
                width: f64::NAN,
                ..Default::default()
            }
        )
        .is_err());
    }
}
