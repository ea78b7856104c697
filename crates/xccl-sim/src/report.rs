//! What a simulation shows: the busiest links, and a heat map of the traffic between nodes
//! as SVG.

use std::fmt::Write;

use crate::topology::Topology;

/// The `top` links that carried the most bytes: `(link, bytes, utilisation over `time`)`.
pub fn busiest(topo: &Topology, carried: &[f64], time: f64, top: usize) -> Vec<(usize, f64, f64)> {
    let mut v: Vec<(usize, f64, f64)> = carried
        .iter()
        .enumerate()
        .filter(|(_, b)| **b > 0.0)
        .map(|(l, &b)| (l, b, if time > 0.0 { b / (topo.links[l].bw * time) } else { 0.0 }))
        .collect();
    v.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    v.truncate(top);
    v
}

/// A heat map of the bytes each link carried, as a matrix of sending node × receiving node
/// (nodes binned so that the picture has at most 128 cells a side), with the busiest links
/// listed beside it.
pub fn heat_map_svg(topo: &Topology, carried: &[f64], time: f64, title: &str) -> String {
    let bins = topo.nodes.clamp(1, 128);
    let per = topo.nodes.div_ceil(bins);
    let mut cells = vec![0.0f64; bins * bins];
    for (l, &b) in carried.iter().enumerate() {
        let link = &topo.links[l];
        cells[(link.from / per) * bins + link.to / per] += b;
    }
    let max = cells.iter().copied().fold(0.0, f64::max).max(1.0);
    let cell = (512 / bins).max(2);
    let side = cell * bins;
    let (w, h) = (side + 460, side + 90);
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">
<text x="10" y="20" font-size="14">{}</text>
<text x="10" y="{}">sending node (rows) × receiving node (columns){}; colour: bytes carried (log scale, max {:.3e})</text>
<g transform="translate(10,40)">
"#,
        escape(title),
        h - 10,
        if per > 1 { format!(", {per} nodes per cell") } else { String::new() },
        max
    );
    for (i, &b) in cells.iter().enumerate() {
        if b <= 0.0 {
            continue;
        }
        let x = (b.ln() / max.ln()).clamp(0.0, 1.0);
        let (r, g, bl) = ((255.0 * x) as u8, (64.0 + 128.0 * (1.0 - x)) as u8, (255.0 * (1.0 - x)) as u8);
        let _ = writeln!(
            s,
            r#"<rect x="{}" y="{}" width="{cell}" height="{cell}" fill="rgb({r},{g},{bl})"/>"#,
            (i % bins) * cell,
            (i / bins) * cell
        );
    }
    let _ =
        writeln!(s, r#"<rect x="0" y="0" width="{side}" height="{side}" fill="none" stroke="black"/></g>"#);
    let _ = writeln!(
        s,
        r#"<g transform="translate({},50)"><text font-weight="bold">busiest links</text>"#,
        side + 30
    );
    for (k, (l, b, u)) in busiest(topo, carried, time, 24).into_iter().enumerate() {
        let link = &topo.links[l];
        let _ = writeln!(
            s,
            r#"<text y="{}">{} {} → {}: {:.3e} B, {:.0}% busy</text>"#,
            18 * (k + 1),
            link.kind,
            link.from,
            link.to,
            b,
            u * 100.0
        );
    }
    s += "</g>\n</svg>\n";
    s
}

fn escape(t: &str) -> String {
    t.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}
