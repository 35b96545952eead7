//! Small SVG charts for the reports: line charts (throughput over time, latency CDFs on a log axis) and
//! grouped bar charts (comparisons). Plain SVG 1.1 text, no fonts or native libraries needed, readable in
//! any browser and on GitHub.

use std::fmt::Write;

const WIDTH: f64 = 860.0;
const HEIGHT: f64 = 460.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 230.0;
const TOP: f64 = 44.0;
const BOTTOM: f64 = 56.0;
const COLORS: [&str; 8] = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"];

pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

pub struct LineChart<'a> {
    pub title: &'a str,
    pub x_label: &'a str,
    pub y_label: &'a str,
    pub log_x: bool,
    pub series: Vec<Series>,
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// A "nice" tick step (1, 2 or 5 times a power of ten) giving about `target` ticks over `span`.
fn nice_step(span: f64, target: f64) -> f64 {
    if span <= 0.0 || !span.is_finite() {
        return 1.0;
    }
    let raw = span / target;
    let mag = 10f64.powf(raw.log10().floor());
    let norm = raw / mag;
    let m = if norm < 1.5 {
        1.0
    } else if norm < 3.0 {
        2.0
    } else if norm < 7.0 {
        5.0
    } else {
        10.0
    };
    m * mag
}

fn fmt_tick(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v.abs() >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if v.abs() >= 1e4 {
        format!("{:.0}k", v / 1e3)
    } else if v.abs() >= 1.0 {
        let s = format!("{v:.2}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        format!("{v:.3}").trim_end_matches('0').to_string()
    }
}

fn header(out: &mut String, title: &str) {
    let _ = write!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{}" y="24" font-size="16" text-anchor="middle">{}</text>
"#,
        LEFT + (WIDTH - LEFT - RIGHT) / 2.0,
        esc(title)
    );
}

/// Vertical position of `y` on an axis from 0 to `top`.
fn y_pixel(y: f64, top: f64) -> f64 {
    let plot_h = HEIGHT - TOP - BOTTOM;
    TOP + plot_h - y / top * plot_h
}

/// Draws the horizontal grid and the y ticks for values up to `max`; returns the axis top (a whole tick).
fn y_axis(out: &mut String, max: f64) -> f64 {
    let step = nice_step(max.max(1e-9), 5.0);
    let top = ((max / step).ceil() * step).max(step);
    let mut y = 0.0;
    while y <= top + step / 2.0 {
        let _ = writeln!(
            out,
            r##"<line x1="{LEFT}" x2="{0}" y1="{1}" y2="{1}" stroke="#ddd"/><text x="{2}" y="{3}" text-anchor="end">{4}</text>"##,
            WIDTH - RIGHT,
            y_pixel(y, top),
            LEFT - 6.0,
            y_pixel(y, top) + 4.0,
            fmt_tick(y)
        );
        y += step;
    }
    top
}

/// The plot area's border.
fn frame(out: &mut String) {
    let (plot_w, plot_h) = (WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM);
    let _ =
        writeln!(out, r##"<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#444"/>"##);
}

fn axis_labels(out: &mut String, x_label: &str, y_label: &str) {
    let plot_w = WIDTH - LEFT - RIGHT;
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
        LEFT + plot_w / 2.0,
        HEIGHT - 14.0,
        esc(x_label)
    );
    let cy = TOP + (HEIGHT - TOP - BOTTOM) / 2.0;
    let _ = writeln!(
        out,
        r#"<text x="18" y="{cy}" text-anchor="middle" transform="rotate(-90 18 {cy})">{}</text>"#,
        esc(y_label)
    );
}

fn legend(out: &mut String, names: &[&str]) {
    for (i, name) in names.iter().enumerate() {
        let y = TOP + 10.0 + i as f64 * 20.0;
        let x = WIDTH - RIGHT + 16.0;
        let _ = writeln!(
            out,
            r#"<rect x="{x}" y="{}" width="14" height="4" fill="{}"/><text x="{}" y="{}">{}</text>"#,
            y - 2.0,
            COLORS[i % COLORS.len()],
            x + 20.0,
            y + 4.0,
            esc(name)
        );
    }
}

/// A line chart; a log x axis is drawn in decades (values must be positive).
pub fn line_chart(c: &LineChart) -> String {
    let mut out = String::new();
    header(&mut out, c.title);
    let pts = c.series.iter().flat_map(|s| s.points.iter()).filter(|p| p.0.is_finite() && p.1.is_finite());
    let pts: Vec<(f64, f64)> = pts.filter(|p| !c.log_x || p.0 > 0.0).copied().collect();
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let tx = |x: f64| if c.log_x { x.log10() } else { x };
    let (mut x0, mut x1) = pts.iter().fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(tx(p.0)), b.max(tx(p.0))));
    let y1 = pts.iter().fold(0.0f64, |m, p| m.max(p.1));
    if pts.is_empty() {
        (x0, x1) = (0.0, 1.0);
    }
    if c.log_x {
        (x0, x1) = (x0.floor(), x1.ceil().max(x0.floor() + 1.0));
    } else {
        x0 = x0.min(0.0);
        if x1 <= x0 {
            x1 = x0 + 1.0;
        }
    }
    let y1 = y_axis(&mut out, y1);
    let px = |x: f64| LEFT + (tx(x) - x0) / (x1 - x0) * plot_w;
    let py = |y: f64| y_pixel(y, y1);
    let x_ticks: Vec<f64> = if c.log_x {
        (x0 as i32..=x1 as i32).map(|e| 10f64.powi(e)).collect()
    } else {
        let step = nice_step(x1 - x0, 8.0);
        (0..=((x1 - x0) / step).floor() as i64).map(|i| x0 + i as f64 * step).collect()
    };
    for x in x_ticks {
        let _ = writeln!(
            out,
            r##"<line x1="{0}" x2="{0}" y1="{TOP}" y2="{1}" stroke="#eee"/><text x="{0}" y="{2}" text-anchor="middle">{3}</text>"##,
            px(x),
            TOP + plot_h,
            TOP + plot_h + 18.0,
            fmt_tick(x)
        );
    }
    frame(&mut out);
    for (i, s) in c.series.iter().enumerate() {
        let path: Vec<String> = s
            .points
            .iter()
            .filter(|p| p.0.is_finite() && p.1.is_finite() && (!c.log_x || p.0 > 0.0))
            .map(|p| format!("{:.1},{:.1}", px(p.0), py(p.1)))
            .collect();
        if !path.is_empty() {
            let _ = writeln!(
                out,
                r#"<polyline fill="none" stroke="{}" stroke-width="2" points="{}"/>"#,
                COLORS[i % COLORS.len()],
                path.join(" ")
            );
        }
    }
    axis_labels(&mut out, c.x_label, c.y_label);
    legend(&mut out, &c.series.iter().map(|s| s.name.as_str()).collect::<Vec<_>>());
    out.push_str("</svg>\n");
    out
}

/// Grouped bars: one group per category, one bar per series (each series has one value per category).
pub fn bar_chart(title: &str, y_label: &str, categories: &[String], series: &[(String, Vec<f64>)]) -> String {
    let mut out = String::new();
    header(&mut out, title);
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let max = series.iter().flat_map(|s| s.1.iter()).copied().filter(|v| v.is_finite()).fold(0.0f64, f64::max);
    let top = y_axis(&mut out, max);
    let py = |y: f64| y_pixel(y, top);
    let groups = categories.len().max(1) as f64;
    let group_w = plot_w / groups;
    let bar_w = group_w * 0.8 / series.len().max(1) as f64;
    for (g, cat) in categories.iter().enumerate() {
        let gx = LEFT + g as f64 * group_w + group_w * 0.1;
        for (i, (_, values)) in series.iter().enumerate() {
            let v = values.get(g).copied().filter(|v| v.is_finite()).unwrap_or(0.0);
            let _ = writeln!(
                out,
                r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{}"/>"#,
                gx + i as f64 * bar_w,
                py(v),
                bar_w.max(1.0),
                (TOP + plot_h - py(v)).max(0.0),
                COLORS[i % COLORS.len()]
            );
        }
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{}</text>"#,
            LEFT + g as f64 * group_w + group_w / 2.0,
            TOP + plot_h + 18.0,
            esc(cat)
        );
    }
    frame(&mut out);
    axis_labels(&mut out, "", y_label);
    legend(&mut out, &series.iter().map(|s| s.0.as_str()).collect::<Vec<_>>());
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charts_are_well_formed_even_when_empty_or_odd() {
        let c = LineChart {
            title: "a <b> & c",
            x_label: "x",
            y_label: "y",
            log_x: true,
            series: vec![
                Series { name: "GET".into(), points: vec![(120.0, 0.5), (3400.0, 0.99), (0.0, 1.0), (f64::NAN, 1.0)] },
                Series { name: "empty".into(), points: vec![] },
            ],
        };
        let svg = line_chart(&c);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert!(svg.contains("a &lt;b&gt; &amp; c"));
        assert!(!svg.contains("NaN") && !svg.contains("inf"));
        let empty = line_chart(&LineChart { title: "", x_label: "", y_label: "", log_x: false, series: vec![] });
        assert!(!empty.contains("NaN"));
        let bars = bar_chart("t", "ops/s", &["GET".into()], &[("a".into(), vec![1.0]), ("b".into(), vec![f64::NAN])]);
        assert!(bars.contains("<rect") && !bars.contains("NaN"));
    }

    #[test]
    fn nice_steps() {
        assert_eq!(nice_step(100.0, 5.0), 20.0);
        assert_eq!(nice_step(7.0, 5.0), 1.0);
        assert_eq!(nice_step(30.0, 5.0), 5.0);
        assert_eq!(nice_step(0.0, 5.0), 1.0);
    }
}
