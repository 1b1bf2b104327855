//! PNG plots of a run (`all --write-docs` and `scaling --write-docs` write them to `docs/img/`):
//! cold programming time and connect latency against the number of Services, and the scaling
//! curves of issue #19 against Services or nodes; log–log, one line per series.
//!
//! Text is drawn with DejaVu Sans read from the system (Debian's `fonts-dejavu-core`), through
//! plotters' `ab_glyph` renderer, so no font library is linked.

use std::path::Path;

use plotters::prelude::*;
use plotters::style::FontStyle;

/// Where the font comes from.
const FONT_PATH: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";
/// The family name the plots ask for.
const FAMILY: &str = "sans-serif";

/// One line of a chart.
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend text.
    pub label: String,
    /// (x, y) points; x is what the chart's `x_label` names (Services, nodes).
    pub points: Vec<(f64, f64)>,
}

/// What a chart shows.
#[derive(Debug, Clone, Copy)]
pub struct Chart<'a> {
    /// Title above the plot.
    pub title: &'a str,
    /// X-axis description (what is counted: Services, nodes).
    pub x_label: &'a str,
    /// Y-axis description (with unit).
    pub y_label: &'a str,
    /// A target drawn as a dashed horizontal line: (legend text, y). Its y is included in the
    /// axis range, so the reader sees how far the points are from it.
    pub reference: Option<(&'a str, f64)>,
}

/// Makes DejaVu Sans available to plotters. Call once per process: the font's bytes live as
/// long as the process, as plotters' font registry requires.
pub fn load_font() -> Result<(), String> {
    let bytes =
        std::fs::read(FONT_PATH).map_err(|e| format!("reading the plot font {FONT_PATH}: {e}"))?;
    plotters::style::register_font(FAMILY, FontStyle::Normal, Vec::leak(bytes))
        .map_err(|_| format!("{FONT_PATH} is not a usable font"))
}

/// The decades around `values` on a log axis (never empty), so that ticks fall on powers of 10.
fn log_range(values: impl Iterator<Item = f64>) -> std::ops::Range<f64> {
    let (lo, hi) = values
        .filter(|v| v.is_finite() && *v > 0.0)
        .fold((f64::INFINITY, 0.0f64), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
    if !lo.is_finite() {
        return 1.0..10.0;
    }
    let lo = 10f64.powf(lo.log10().floor());
    let hi = 10f64.powf(hi.log10().ceil()).max(lo * 10.0);
    lo..hi
}

/// Draws `series` (log–log) into the PNG at `path`. [`load_font`] must have succeeded.
pub fn line_chart(path: &Path, chart: Chart<'_>, series: &[Series]) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| format!("plotting {}: {e}", path.display());
    let x = log_range(series.iter().flat_map(|s| s.points.iter().map(|p| p.0)));
    let y = log_range(
        series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.1))
            .chain(chart.reference.map(|r| r.1)),
    );
    let root = BitMapBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut ctx = ChartBuilder::on(&root)
        .caption(chart.title, (FAMILY, 22))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(x.clone().log_scale(), y.log_scale())
        .map_err(|e| err(&e))?;
    ctx.configure_mesh()
        .x_desc(chart.x_label)
        .y_desc(chart.y_label)
        .label_style((FAMILY, 14))
        .axis_desc_style((FAMILY, 16))
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| format!("{v}"))
        .draw()
        .map_err(|e| err(&e))?;
    for (i, s) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let points: Vec<(f64, f64)> = s
            .points
            .iter()
            .copied()
            .filter(|(a, b)| *a > 0.0 && *b > 0.0 && b.is_finite())
            .collect();
        ctx.draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
            .map_err(|e| err(&e))?
            .label(s.label.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        ctx.draw_series(
            points
                .into_iter()
                .map(|p| Circle::new(p, 4, color.filled())),
        )
        .map_err(|e| err(&e))?;
    }
    if let Some((label, level)) = chart.reference {
        ctx.draw_series(DashedLineSeries::new(
            [(x.start, level), (x.end, level)],
            8,
            6,
            BLACK.stroke_width(1),
        ))
        .map_err(|e| err(&e))?
        .label(label)
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK));
    }
    ctx.configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font((FAMILY, 14))
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn log_range_spans_whole_decades_and_is_never_empty() {
        let cases: &[(&[f64], std::ops::Range<f64>)] = &[
            (&[1000.0, 30000.0], 1000.0..100000.0),
            (&[1000.0], 1000.0..10000.0),
            (&[], 1.0..10.0),
            (&[0.0, f64::NAN, 4.0], 1.0..10.0),
            (&[0.13, 51.8], 0.1..100.0),
        ];
        for (values, want) in cases {
            assert_eq!(log_range(values.iter().copied()), *want, "{values:?}");
        }
    }

    #[test]
    fn draws_a_png_with_text() {
        load_font().unwrap();
        let path = std::env::temp_dir().join(format!("kpng-bench-plot-{}.png", std::process::id()));
        let series = [
            Series {
                label: "a".into(),
                points: vec![(1000.0, 0.05), (10000.0, 0.3)],
            },
            Series {
                label: "b".into(),
                points: vec![(1000.0, 0.5), (10000.0, 50.0)],
            },
        ];
        line_chart(
            &path,
            Chart {
                title: "cold",
                x_label: "Services",
                y_label: "seconds",
                reference: Some(("target 1 s", 1.0)),
            },
            &series,
        )
        .unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        // A white 900×560 image compresses to almost nothing; lines and text do not.
        assert!(bytes.len() > 8000, "{} bytes", bytes.len());
    }
}
