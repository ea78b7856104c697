//! `pipeline.svg`: the measured timeline of one training step of a pipeline, drawn as the
//! familiar diagram: one row per stage, a box per forward `F(i,j)` and backward `B(i,j)`
//! (micro-batch `i`, chunk `j`) over time; the white space between boxes is the bubble.

use std::path::Path;

use plotters::prelude::*;
use serde_json::Value;

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
    let root = SVGBackend::new(path, (1200, 120 + 60 * lanes.len() as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut chart = ChartBuilder::on(&root)
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
    let forward = RGBColor(120, 160, 230);
    let backward = RGBColor(120, 200, 140);
    for (stage, spans) in lanes.iter().enumerate() {
        let y = stage as f64;
        for (name, start, dur) in spans {
            let color = if name.starts_with('F') { forward } else { backward };
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
}
