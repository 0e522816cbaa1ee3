//! The soak's samples as an SVG: one panel each for host RSS, open descriptors and engine
//! memory over time, each scaled from zero so that a flat line looks flat. Written by hand: a
//! plot library would be the project's largest dependency for three polylines.

use super::soak::{Sample, SoakReport};

const WIDTH: f64 = 720.0;
const PANEL: f64 = 160.0;
const MARGIN: f64 = 56.0;

/// A panel's title and the value it plots.
type Panel = (&'static str, fn(&Sample) -> Option<f64>);

pub fn svg(report: &SoakReport) -> String {
    let panels: [Panel; 3] = [
        ("host RSS (MiB)", |s| s.rss_mib),
        ("open descriptors", |s| s.open_fds.map(|n| n as f64)),
        ("engine memory (MiB)", |s| s.engine_memory_mib),
    ];
    let height = panels.len() as f64 * (PANEL + MARGIN) + MARGIN;
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height}\" font-family=\"sans-serif\" \
         font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{MARGIN}\" y=\"20\" \
         font-size=\"14\">soak: {} clients, {:.0} min, {}</text>\n",
        report.clients,
        report.duration_s / 60.0,
        escape(&report.url)
    );
    let span = report.samples.last().map_or(1.0, |s| s.elapsed_s.max(1.0));
    for (i, (title, value)) in panels.iter().enumerate() {
        let top = MARGIN + i as f64 * (PANEL + MARGIN);
        let points: Vec<(f64, f64)> = report.samples.iter().filter_map(|s| Some((s.elapsed_s, value(s)?))).collect();
        let max = points.iter().map(|p| p.1).fold(0.0f64, f64::max).max(1.0) * 1.1;
        let plot_w = WIDTH - 2.0 * MARGIN;
        out.push_str(&format!(
            "<text x=\"{MARGIN}\" y=\"{}\">{title}</text>\n<rect x=\"{MARGIN}\" y=\"{top}\" width=\"{plot_w}\" \
             height=\"{PANEL}\" fill=\"none\" stroke=\"#888\"/>\n<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{max:.0}\
             </text>\n<text x=\"{}\" y=\"{}\" text-anchor=\"end\">0</text>\n<text x=\"{}\" y=\"{}\" \
             text-anchor=\"end\">{:.0} min</text>\n",
            top - 6.0,
            MARGIN - 4.0,
            top + 10.0,
            MARGIN - 4.0,
            top + PANEL,
            WIDTH - MARGIN,
            top + PANEL + 14.0,
            span / 60.0
        ));
        if points.is_empty() {
            out.push_str(&format!("<text x=\"{}\" y=\"{}\">not sampled</text>\n", MARGIN + 8.0, top + PANEL / 2.0));
            continue;
        }
        let path: Vec<String> = points
            .iter()
            .map(|(t, v)| format!("{:.1},{:.1}", MARGIN + t / span * plot_w, top + PANEL - v / max * PANEL))
            .collect();
        out.push_str(&format!(
            "<polyline fill=\"none\" stroke=\"#1f5fbf\" stroke-width=\"1.5\" points=\"{}\"/>\n",
            path.join(" ")
        ));
    }
    out.push_str("</svg>\n");
    out
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}
