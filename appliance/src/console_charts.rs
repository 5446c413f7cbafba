//! The console's charts, drawn on the server as SVG: no chart library, no script, a few KB
//! each. Two kinds: a stacked area over time (counts per state, per minute, compliance) and
//! meters (a pool's addresses held of its size). Every chart carries its numbers as a table
//! one click away, for screen readers and for copying. Pure: data in, markup out.

use maud::{Markup, PreEscaped, html};

/// The drawing's size in SVG units (it scales to its box).
const WIDTH: f64 = 600.0;
const HEIGHT: f64 = 140.0;

/// One line of a stacked chart: its name and a value per time.
pub struct Series {
    pub name: String,
    pub values: Vec<u64>,
}

/// A stacked area chart: `times` (Unix ms, oldest first) and the series drawn on each other,
/// first at the bottom. `id` names the figure (tests and links find it by that).
pub fn stacked(id: &str, title: &str, times: &[i64], series: &[Series], now_ms: i64) -> Markup {
    let n = times.len();
    let totals: Vec<u64> = (0..n)
        .map(|i| {
            series
                .iter()
                .map(|s| s.values.get(i).copied().unwrap_or(0))
                .sum()
        })
        .collect();
    let top = totals.iter().copied().max().unwrap_or(0).max(1);
    let x = |i: usize| {
        if n <= 1 {
            WIDTH
        } else {
            i as f64 * WIDTH / (n - 1) as f64
        }
    };
    let y = |v: u64| HEIGHT - v as f64 * HEIGHT / top as f64;
    // Each series' band: its upper edge left to right, then the lower edge back.
    let mut below = vec![0u64; n];
    let mut paths = Vec::new();
    for s in series {
        let above: Vec<u64> = (0..n)
            .map(|i| below[i] + s.values.get(i).copied().unwrap_or(0))
            .collect();
        let mut d = String::new();
        for (i, v) in above.iter().enumerate() {
            d.push_str(&format!(
                "{}{:.1},{:.1}",
                if i == 0 { "M" } else { "L" },
                x(i),
                y(*v)
            ));
        }
        for i in (0..n).rev() {
            d.push_str(&format!("L{:.1},{:.1}", x(i), y(below[i])));
        }
        d.push('Z');
        paths.push(d);
        below = above;
    }
    let span = times.first().map(|t| crate::console_style::ago(now_ms, *t));
    html! {
        figure.chart #(id) {
            figcaption { (title) }
            @if n == 0 {
                p.muted { "No samples yet: one is taken every minute." }
            } @else {
                svg viewBox={ "0 0 " (WIDTH) " " (HEIGHT) } preserveAspectRatio="none" role="img"
                    aria-label={ (title) ": " (summary(series, &totals)) } {
                    @for (i, d) in paths.iter().enumerate() {
                        path class={ "c" (i % 6) } d=(d) {}
                    }
                }
                div.axis { span { (span.unwrap_or_default()) } span { "max " (top) } span { "now" } }
                ul.legend {
                    @for (i, s) in series.iter().enumerate() {
                        li { span class={ "swatch c" (i % 6) } {} (s.name) " " strong { (s.values.last().copied().unwrap_or(0)) } }
                    }
                }
                details {
                    summary { "Data" }
                    table {
                        tr { th { "Time (UTC)" } @for s in series { th { (s.name) } } }
                        @for (i, t) in times.iter().enumerate().rev() {
                            tr {
                                td { (paddock_inspector::node::iso(t.div_euclid(1000))) }
                                @for s in series { td { (s.values.get(i).copied().unwrap_or(0)) } }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The newest value of each series, for the chart's text alternative.
fn summary(series: &[Series], totals: &[u64]) -> String {
    let now: Vec<String> = series
        .iter()
        .map(|s| format!("{} {}", s.name, s.values.last().copied().unwrap_or(0)))
        .collect();
    format!(
        "now {} (total {})",
        now.join(", "),
        totals.last().copied().unwrap_or(0)
    )
}

/// Meters: per row, `used` of `size` as a bar with its share (a DHCP pool's addresses).
pub fn meters(id: &str, title: &str, rows: &[(String, u64, u64)]) -> Markup {
    html! {
        figure.chart #(id) {
            figcaption { (title) }
            @if rows.is_empty() {
                p.muted { "Nothing to show." }
            }
            table.meters {
                tr { th { "What" } th { "Used" } th { "Of" } th { "Share" } }
                @for (label, used, size) in rows {
                    @let share = if *size == 0 { 0.0 } else { *used as f64 * 100.0 / *size as f64 };
                    tr {
                        td { code { (label) } }
                        td { (used) }
                        td { (size) }
                        td {
                            svg.meter viewBox="0 0 100 8" preserveAspectRatio="none" aria-hidden="true" {
                                rect.track width="100" height="8" {}
                                rect class=(meter_class(share)) width=(PreEscaped(format!("{share:.1}"))) height="8" {}
                            }
                            " " (format!("{share:.0} %"))
                        }
                    }
                }
            }
        }
    }
}

/// A meter's colour: fine, getting full (80 %), full (95 %).
fn meter_class(share: f64) -> &'static str {
    if share >= 95.0 {
        "fill bad"
    } else if share >= 80.0 {
        "fill warn"
    } else {
        "fill ok"
    }
}

/// Counts of events per minute over the `minutes` before `now_ms`, oldest first, from each
/// event's time (Unix ms): the buckets' start times and the counts.
pub fn per_minute(events: &[i64], now_ms: i64, minutes: usize) -> (Vec<i64>, Vec<u64>) {
    let minute = 60_000;
    let end = now_ms - now_ms.rem_euclid(minute) + minute;
    let start = end - minutes as i64 * minute;
    let mut counts = vec![0u64; minutes];
    for t in events {
        if (start..end).contains(t)
            && let Ok(i) = usize::try_from((t - start) / minute)
        {
            counts[i] += 1;
        }
    }
    let times = (0..minutes).map(|i| start + i as i64 * minute).collect();
    (times, counts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stacked_chart_draws_each_series_on_the_last_and_tables_its_data() {
        let times = [0, 60_000, 120_000];
        let series = [
            Series {
                name: "healthy".into(),
                values: vec![1, 2, 3],
            },
            Series {
                name: "<error>".into(),
                values: vec![1, 0, 1],
            },
        ];
        let html = stacked("states", "Machines", &times, &series, 180_000).into_string();
        // The top of the stack is the largest total (4), drawn at the top edge.
        assert!(html.contains("M0.0,70.0L300.0,70.0L600.0,0.0"), "{html}");
        assert!(html.contains("max 4"), "{html}");
        assert!(
            html.contains("now healthy 3, &lt;error&gt; 1 (total 4)"),
            "{html}"
        );
        assert!(!html.contains("<error>"), "{html}");
        assert_eq!(html.matches("<tr>").count(), 4, "{html}");
        let empty = stacked("states", "Machines", &[], &[], 0).into_string();
        assert!(empty.contains("No samples yet"), "{empty}");
    }

    #[test]
    fn meters_show_the_share_and_warn_when_nearly_full() {
        let html = meters(
            "pools",
            "DHCP",
            &[
                ("198.18.0.0/24".into(), 9, 10),
                ("198.19.0.0/24".into(), 1, 10),
            ],
        )
        .into_string();
        assert!(
            html.contains("fill warn") && html.contains("fill ok"),
            "{html}"
        );
        assert!(html.contains("90 %") && html.contains("10 %"), "{html}");
    }

    #[test]
    fn events_fall_into_their_minute() {
        let now = 10 * 60_000 + 30_000;
        let (times, counts) =
            per_minute(&[now, now - 60_000, now - 61_000, 0, now + 120_000], now, 3);
        assert_eq!(counts, vec![0, 2, 1]);
        assert_eq!(times, vec![8 * 60_000, 9 * 60_000, 10 * 60_000]);
    }
}
