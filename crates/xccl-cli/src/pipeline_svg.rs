//! `pipeline.svg`: the measured timeline of one training step of a pipeline, drawn as the
//! familiar diagram: one row per stage, a box per forward `F(i,j)` and backward `B(i,j)`
//! (micro-batch `i`, chunk `j`), or, with a split backward (zb-h1), per input-gradient pass
//! `Bi(i,j)` and weight-gradient pass `W(i,j)`, over time, each kind in its colour with a
//! legend under the chart; the white space between boxes is the bubble.

use std::path::Path;

use plotters::prelude::*;
use serde_json::Value;

/// The kinds of box, by the prefix of their names: forward, whole backward, input-gradient
/// and weight-gradient backward; their colour and their legend.
const PASSES: [(&str, RGBColor, &str); 4] = [
    ("F(", RGBColor(120, 160, 230), "F forward"),
    ("B(", RGBColor(120, 200, 140), "B backward"),
    ("Bi(", RGBColor(240, 180, 90), "Bi input gradient"),
    ("W(", RGBColor(190, 140, 220), "W weight gradient"),
];

/// The entry of [`PASSES`] a box named `name` is drawn with (an unknown name as a
/// backward).
fn pass_of(name: &str) -> usize {
    PASSES.iter().position(|(prefix, ..)| name.starts_with(prefix)).unwrap_or(1)
}

/// Draws the `pipeline` object of a run's summary (its `timeline`: per stage a list of
/// `[name, start ms, duration ms]`) into `path`.
pub fn draw(path: &Path, pipeline: &Value) -> Result<(), String> {
    let lanes: Vec<Vec<(String, f64, f64)>> =
        serde_json::from_value(pipeline["timeline"].clone()).map_err(|e| format!("no timeline: {e}"))?;
    let end = lanes.iter().flatten().map(|(_, s, d)| s + d).fold(0.0, f64::max);
    if lanes.is_empty() || end <= 0.0 {
        return Err("the timeline is empty".into());
    }
    let title = format!(
        "{} - {} stages x {} micro-batches: bubble {:.1}% measured, {:.1}% by the schedule",
        pipeline["schedule"].as_str().unwrap_or("pipeline"),
        lanes.len(),
        pipeline["micro_batches"],
        100.0 * pipeline["bubble_measured"].as_f64().unwrap_or(0.0),
        100.0 * pipeline["bubble_schedule"].as_f64().unwrap_or(0.0),
    );
    let rows = lanes.len() as f64;
    let height = 150 + 60 * lanes.len() as u32;
    let root = SVGBackend::new(path, (1200, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let (area, legend) = root.split_vertically(height - 30);
    // The legend: the kinds of box this timeline has, in a row.
    let mut seen = [false; PASSES.len()];
    for (name, ..) in lanes.iter().flatten() {
        seen[pass_of(name)] = true;
    }
    let mut x = 86;
    for (&(_, color, label), _) in PASSES.iter().zip(seen).filter(|(_, s)| *s) {
        legend.draw(&Rectangle::new([(x, 6), (x + 14, 20)], color.filled())).map_err(|e| e.to_string())?;
        legend
            .draw(&Rectangle::new([(x, 6), (x + 14, 20)], BLACK.stroke_width(1)))
            .map_err(|e| e.to_string())?;
        legend.draw(&Text::new(label, (x + 20, 7), ("sans-serif", 12))).map_err(|e| e.to_string())?;
        x += 40 + 7 * label.len() as i32;
    }
    let mut chart = ChartBuilder::on(&area)
        .caption(title, ("sans-serif", 16))
        .margin(16)
        .x_label_area_size(36)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..end, rows..0.0)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(lanes.len() + 1)
        .y_label_formatter(&|y| {
            if y.fract() == 0.0 && *y < rows { format!("stage {y:.0}") } else { String::new() }
        })
        .x_desc("ms since the step's first forward")
        .draw()
        .map_err(|e| e.to_string())?;
    for (stage, spans) in lanes.iter().enumerate() {
        let y = stage as f64;
        for (name, start, dur) in spans {
            let color = PASSES[pass_of(name)].1;
            let (x0, x1) = (*start, start + dur);
            chart
                .draw_series([Rectangle::new([(x0, y + 0.1), (x1, y + 0.9)], color.filled())])
                .map_err(|e| e.to_string())?;
            chart
                .draw_series([Rectangle::new([(x0, y + 0.1), (x1, y + 0.9)], BLACK.stroke_width(1))])
                .map_err(|e| e.to_string())?;
            // A label where the box is wide enough to hold it.
            if dur / end > 0.002 * name.len() as f64 {
                chart
                    .draw_series([Text::new(name.clone(), (x0 + 0.1 * dur, y + 0.35), ("sans-serif", 11))])
                    .map_err(|e| e.to_string())?;
            }
        }
    }
    root.present().map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_a_box_per_forward_and_backward() {
        let p = serde_json::json!({
            "schedule": "1f1b", "micro_batches": 2, "bubble_measured": 0.3, "bubble_schedule": 0.33,
            "timeline": [[["F(0,0)", 0.0, 1.0], ["F(1,0)", 1.0, 1.0], ["B(0,0)", 3.0, 2.0], ["B(1,0)", 6.0, 2.0]],
                         [["F(0,0)", 1.0, 1.0], ["B(0,0)", 2.0, 2.0], ["F(1,0)", 4.0, 1.0], ["B(1,0)", 5.0, 2.0]]],
        });
        let path = std::env::temp_dir().join(format!("xccl-pipeline-{}.svg", std::process::id()));
        draw(&path, &p).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(svg.contains("stage 1") && svg.contains("bubble 30.0% measured"), "{svg}");
        // Eight boxes, each filled and outlined.
        assert!(svg.matches("<rect").count() >= 16);
        assert!(draw(&path, &serde_json::json!({"timeline": []})).is_err());
    }

    #[test]
    fn draws_split_backwards_in_their_own_colours_with_a_legend() {
        let p = serde_json::json!({
            "schedule": "zb-h1", "micro_batches": 1, "bubble_measured": 0.25, "bubble_schedule": 0.25,
            "timeline": [[["F(0,0)", 0.0, 1.0], ["Bi(0,0)", 3.0, 1.0], ["W(0,0)", 4.0, 1.0]],
                         [["F(0,0)", 1.0, 1.0], ["Bi(0,0)", 2.0, 1.0], ["W(0,0)", 3.0, 1.0]]],
        });
        let path = std::env::temp_dir().join(format!("xccl-pipeline-zb-{}.svg", std::process::id()));
        draw(&path, &p).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let fill = |c: RGBColor| format!("fill=\"#{:02X}{:02X}{:02X}\"", c.0, c.1, c.2);
        let count = |c: RGBColor| svg.matches(&fill(c)).count();
        // Two boxes each of F, Bi and W, plus one in the legend; no whole backward.
        let [f, b, bi, w] = PASSES.map(|(_, c, _)| count(c));
        assert_eq!((f, b, bi, w), (3, 0, 3, 3), "{svg}");
        assert!(svg.contains("Bi input gradient") && svg.contains("W weight gradient"), "{svg}");
        assert!(!svg.contains("B backward") && svg.contains("zb-h1"), "{svg}");
        assert_eq!((pass_of("Bi(2,0)"), pass_of("B(2,0)"), pass_of("W(0,1)"), pass_of("?")), (2, 1, 3, 1));
    }
}
