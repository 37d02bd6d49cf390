//! Timelines of the streams: what ran where and when, written as a Chrome trace (opens in
//! Perfetto or `chrome://tracing`) and as an SVG picture.
//!
//! A [`Timeline`] is a list of [`Span`]s, each on a named track (one per compute stream and
//! per copy stream). Times are microseconds from a common origin; where they come from
//! (host clocks on the CPU backend, CUDA event times on the GPU) is the recorder's business.
//!
//! # Examples
//!
//! ```
//! use rtx::timeline::{Span, Timeline};
//! let mut t = Timeline::new();
//! let s0 = t.track("cuda:0 stream 0");
//! t.push(Span { track: s0, name: "matmul".into(), detail: "[512, 256]".into(), start_us: 0.0, dur_us: 12.5 });
//! let json = t.to_chrome_trace();
//! assert!(json.contains("\"name\":\"matmul\""));
//! assert!(t.to_svg(800).starts_with("<svg"));
//! ```

use std::fmt::Write as _;

/// One interval on a track.
#[derive(Clone, Debug, PartialEq)]
pub struct Span {
    /// Index of the track (from [`Timeline::track`]).
    pub track: usize,
    /// What ran (an op's name).
    pub name: String,
    /// Extra facts shown with it (shapes, dtype).
    pub detail: String,
    /// Start, in microseconds from the timeline's origin.
    pub start_us: f64,
    /// Duration in microseconds.
    pub dur_us: f64,
}

/// Named tracks and the spans on them.
#[derive(Clone, Debug, Default)]
pub struct Timeline {
    tracks: Vec<String>,
    spans: Vec<Span>,
}

impl Timeline {
    /// An empty timeline.
    pub fn new() -> Self {
        Self::default()
    }

    /// The index of the track called `name`, added if new.
    pub fn track(&mut self, name: &str) -> usize {
        match self.tracks.iter().position(|t| t == name) {
            Some(i) => i,
            None => {
                self.tracks.push(name.to_string());
                self.tracks.len() - 1
            }
        }
    }

    /// Adds a span. A span on a track that does not exist, or with a negative or
    /// non-finite time, is dropped (a timeline is a picture, not a place for errors).
    pub fn push(&mut self, span: Span) {
        let ok = span.track < self.tracks.len()
            && span.start_us.is_finite()
            && span.dur_us.is_finite()
            && span.start_us >= 0.0
            && span.dur_us >= 0.0;
        if ok {
            self.spans.push(span);
        }
    }

    /// The timeline of a runtime's recorded spans ([`crate::Runtime::take_trace`]): one
    /// track per stream of the runtime, compute streams then copy streams as the runtime
    /// lists them (named `cuda:0 compute 1`, `cuda:0 copy`, `cpu stream 0`), each span
    /// named by its op with its outputs' shapes as detail. Times are shifted so that
    /// the first span starts at 0.
    pub fn from_trace(info: &crate::RuntimeInfo, spans: &[crate::TraceSpan]) -> Timeline {
        let mut t = Timeline::new();
        let mut track_of = std::collections::HashMap::new();
        let mut compute = std::collections::HashMap::<crate::Device, usize>::new();
        for s in &info.streams {
            let name = match (s.device, s.kind) {
                (crate::Device::Cpu(0), crate::StreamKind::Compute) => {
                    format!("cpu stream {}", s.id.index())
                }
                (d, crate::StreamKind::Comm) => format!("{d} comm"),
                (d @ crate::Device::Cpu(_), _) => format!("{d} stream {}", s.id.index()),
                (d, crate::StreamKind::Compute) => {
                    let n = compute.entry(d).or_insert(0);
                    *n += 1;
                    format!("{d} compute {}", *n - 1)
                }
                (d, crate::StreamKind::Copy) => format!("{d} copy"),
            };
            let name = if t.tracks.contains(&name) {
                format!("{name} ({})", s.id)
            } else {
                name
            };
            track_of.insert(s.id, t.track(&name));
        }
        let origin = spans
            .iter()
            .map(|s| s.start_us)
            .fold(f64::INFINITY, f64::min);
        for s in spans {
            if let Some(&track) = track_of.get(&s.stream) {
                t.push(Span {
                    track,
                    name: s.name.to_string(),
                    detail: s.detail.clone(),
                    start_us: s.start_us - origin,
                    dur_us: s.dur_us,
                });
            }
        }
        t
    }

    /// The spans that overlap `[from_us, to_us)`, on the same tracks, clipped to it and
    /// shifted so that `from_us` is 0 (a window of a long run, for a picture that stays
    /// readable).
    pub fn window(&self, from_us: f64, to_us: f64) -> Timeline {
        Timeline {
            tracks: self.tracks.clone(),
            spans: self
                .spans
                .iter()
                .filter(|s| s.start_us < to_us && s.start_us + s.dur_us > from_us)
                .map(|s| {
                    let start = s.start_us.max(from_us);
                    let end = (s.start_us + s.dur_us).min(to_us);
                    Span {
                        start_us: start - from_us,
                        dur_us: end - start,
                        ..s.clone()
                    }
                })
                .collect(),
        }
    }

    /// The start of the window of `len_us` within `[lo_us, hi_us]` where the tracks
    /// are busiest, among 200 evenly spaced candidates; `lo_us` when the range is
    /// shorter than the window. Busy is the track-time under spans of at most an eighth
    /// of the window: a longer span (a first call that loaded modules and chose library
    /// plans, say: its events enclose the host's work as well) is not the steady state
    /// the picture is for, so it neither counts nor keeps a window out (a first call of
    /// one pipeline often overlaps the others' steady steps).
    pub fn busiest_window(&self, len_us: f64, lo_us: f64, hi_us: f64) -> f64 {
        if hi_us - lo_us <= len_us || len_us <= 0.0 {
            return lo_us;
        }
        let n = 200;
        let step = (hi_us - lo_us - len_us) / f64::from(n);
        let short = len_us / 8.0;
        let score = |from: f64| {
            let to = from + len_us;
            self.spans
                .iter()
                .filter(|s| s.dur_us <= short)
                .map(|s| ((s.start_us + s.dur_us).min(to) - s.start_us.max(from)).max(0.0))
                .sum::<f64>()
        };
        let mut best = (lo_us, -1.0);
        for k in 0..=n {
            let from = lo_us + step * f64::from(k);
            let busy = score(from);
            if busy > best.1 {
                best = (from, busy);
            }
        }
        best.0
    }

    /// The end of the last span, in microseconds.
    pub fn end_us(&self) -> f64 {
        self.spans
            .iter()
            .map(|s| s.start_us + s.dur_us)
            .fold(0.0, f64::max)
    }

    /// The tracks, in order.
    pub fn tracks(&self) -> &[String] {
        &self.tracks
    }

    /// The spans, in the order pushed.
    pub fn spans(&self) -> &[Span] {
        &self.spans
    }

    /// How many tracks have a span running at `t_us`.
    pub fn busy_at(&self, t_us: f64) -> usize {
        let mut busy = vec![false; self.tracks.len()];
        for s in &self.spans {
            if s.start_us <= t_us && t_us < s.start_us + s.dur_us {
                busy[s.track] = true;
            }
        }
        busy.iter().filter(|b| **b).count()
    }

    /// The most tracks busy at one moment (checked at every span start).
    pub fn max_concurrency(&self) -> usize {
        self.spans
            .iter()
            .map(|s| self.busy_at(s.start_us))
            .max()
            .unwrap_or(0)
    }

    /// The Chrome trace event format (JSON object with `traceEvents`): one thread per
    /// track, named by a metadata event, and one complete (`"ph":"X"`) event per span.
    pub fn to_chrome_trace(&self) -> String {
        let mut out = String::from("{\"traceEvents\":[");
        let mut first = true;
        let mut sep = |out: &mut String| {
            if !first {
                out.push(',');
            }
            first = false;
        };
        for (i, name) in self.tracks.iter().enumerate() {
            sep(&mut out);
            let _ = write!(
                out,
                "{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":{i},\"args\":{{\"name\":{}}}}}",
                json_str(name)
            );
            sep(&mut out);
            let _ = write!(
                out,
                "{{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":1,\"tid\":{i},\"args\":{{\"sort_index\":{i}}}}}"
            );
        }
        for s in &self.spans {
            sep(&mut out);
            let _ = write!(
                out,
                "{{\"name\":{},\"ph\":\"X\",\"pid\":1,\"tid\":{},\"ts\":{:.3},\"dur\":{:.3},\"args\":{{\"detail\":{}}}}}",
                json_str(&s.name),
                s.track,
                s.start_us,
                s.dur_us,
                json_str(&s.detail)
            );
        }
        out.push_str("],\"displayTimeUnit\":\"ms\"}");
        out
    }

    /// An SVG picture `width` pixels wide: one row per track, one rectangle per span,
    /// coloured by op name, with a time axis in milliseconds.
    pub fn to_svg(&self, width: u32) -> String {
        let label_w = 170.0;
        let row_h = 22.0;
        let top = 24.0;
        let width = f64::from(width.max(label_w as u32 + 100));
        let plot_w = width - label_w - 10.0;
        let end = self
            .spans
            .iter()
            .map(|s| s.start_us + s.dur_us)
            .fold(0.0f64, f64::max)
            .max(1e-3);
        let height = top + row_h * self.tracks.len() as f64 + 30.0;
        let x = |t: f64| label_w + t / end * plot_w;
        let mut out = String::new();
        let _ = write!(
            out,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" \
             font-family=\"sans-serif\" font-size=\"11\">\
             <rect width=\"100%\" height=\"100%\" fill=\"white\"/>"
        );
        for (i, name) in self.tracks.iter().enumerate() {
            let y = top + row_h * i as f64;
            let _ = write!(
                out,
                "<rect x=\"{label_w}\" y=\"{y}\" width=\"{plot_w}\" height=\"{}\" fill=\"{}\"/>\
                 <text x=\"4\" y=\"{}\">{}</text>",
                row_h - 2.0,
                if i % 2 == 0 { "#f4f4f4" } else { "#ebebeb" },
                y + row_h * 0.65,
                xml_escape(name)
            );
        }
        for s in &self.spans {
            let y = top + row_h * s.track as f64 + 1.0;
            let w = (s.dur_us / end * plot_w).max(0.5);
            let _ = write!(
                out,
                "<rect x=\"{:.2}\" y=\"{y}\" width=\"{w:.2}\" height=\"{}\" fill=\"{}\">\
                 <title>{} {} ({:.1} µs)</title></rect>",
                x(s.start_us),
                row_h - 4.0,
                colour(&s.name),
                xml_escape(&s.name),
                xml_escape(&s.detail),
                s.dur_us
            );
        }
        let axis_y = top + row_h * self.tracks.len() as f64 + 14.0;
        for k in 0..=4 {
            let t = end * f64::from(k) / 4.0;
            let _ = write!(
                out,
                "<text x=\"{:.1}\" y=\"{axis_y}\" text-anchor=\"middle\">{:.2} ms</text>",
                x(t).min(width - 30.0),
                t / 1e3
            );
        }
        out.push_str("</svg>");
        out
    }
}

/// A stable colour per name (FNV-1a of the name onto a hue).
fn colour(name: &str) -> String {
    let mut h: u32 = 0x811c_9dc5;
    for b in name.bytes() {
        h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
    }
    format!("hsl({}, 60%, 55%)", h % 360)
}

fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Timeline {
        let mut t = Timeline::new();
        let a = t.track("stream 0");
        let b = t.track("stream \"1\"");
        assert_eq!(t.track("stream 0"), a);
        t.push(Span {
            track: a,
            name: "gemm".into(),
            detail: "[4, 4]".into(),
            start_us: 0.0,
            dur_us: 10.0,
        });
        t.push(Span {
            track: b,
            name: "relu<x>".into(),
            detail: "a\nb".into(),
            start_us: 5.0,
            dur_us: 10.0,
        });
        t.push(Span {
            track: a,
            name: "late".into(),
            detail: String::new(),
            start_us: 20.0,
            dur_us: 1.0,
        });
        t.push(Span {
            track: 7,
            name: "dropped".into(),
            detail: String::new(),
            start_us: 0.0,
            dur_us: 1.0,
        });
        t.push(Span {
            track: a,
            name: "nan".into(),
            detail: String::new(),
            start_us: f64::NAN,
            dur_us: 1.0,
        });
        t
    }

    #[test]
    fn a_window_clips_overlapping_spans_and_the_busiest_skips_long_ones() {
        let mut t = Timeline::new();
        let (a, b) = (t.track("a"), t.track("b"));
        let span = |track, start_us, dur_us| Span {
            track,
            name: "op".into(),
            detail: String::new(),
            start_us,
            dur_us,
        };
        // A long first call on `a` (0-500), then short ops on `a` from 500 on, densest
        // on both tracks at 700-800, where a long span on `c` (650-900: another
        // pipeline's first call) neither counts nor keeps that window out.
        let c = t.track("c");
        t.push(span(a, 0.0, 500.0));
        for k in 0..10 {
            t.push(span(a, 500.0 + 50.0 * f64::from(k), 10.0));
        }
        for k in 0..8 {
            let at = 700.0 + 12.0 * f64::from(k);
            t.push(span(a, at, 10.0));
            t.push(span(b, at, 10.0));
        }
        t.push(span(c, 650.0, 250.0));
        let w = t.window(450.0, 550.0);
        let got: Vec<(f64, f64)> = w.spans().iter().map(|s| (s.start_us, s.dur_us)).collect();
        assert_eq!(got, [(0.0, 50.0), (50.0, 10.0)], "clipped and shifted");
        let from = t.busiest_window(100.0, 0.0, 1000.0);
        assert!((690.0..=710.0).contains(&from), "{from}");
        assert_eq!(t.window(from, from + 100.0).max_concurrency(), 3);
        assert_eq!(t.busiest_window(2000.0, 0.0, 1000.0), 0.0, "range shorter");
    }

    #[test]
    fn spans_on_unknown_tracks_or_bad_times_are_dropped() {
        let t = sample();
        assert_eq!(t.spans().len(), 3);
        assert_eq!(t.tracks().len(), 2);
    }

    #[test]
    fn concurrency_counts_overlapping_tracks() {
        let t = sample();
        assert_eq!(t.busy_at(7.0), 2);
        assert_eq!(t.busy_at(12.0), 1);
        assert_eq!(t.busy_at(17.0), 0);
        assert_eq!(t.max_concurrency(), 2);
    }

    #[test]
    fn chrome_trace_names_every_track_and_escapes() {
        let json = sample().to_chrome_trace();
        assert!(json.starts_with("{\"traceEvents\":["));
        assert!(json.ends_with("}"));
        assert_eq!(json.matches("\"ph\":\"X\"").count(), 3);
        assert_eq!(json.matches("\"thread_name\"").count(), 2);
        assert!(json.contains(r#""name":"stream \"1\"""#));
        assert!(json.contains(r#""detail":"a\nb""#));
        // Balanced brackets and braces outside strings: a cheap structural check.
        let (mut depth, mut in_str, mut esc) = (0i32, false, false);
        for c in json.chars() {
            match (in_str, esc, c) {
                (true, true, _) => esc = false,
                (true, false, '\\') => esc = true,
                (true, false, '"') => in_str = false,
                (false, _, '"') => in_str = true,
                (false, _, '{' | '[') => depth += 1,
                (false, _, '}' | ']') => {
                    depth -= 1;
                    assert!(depth >= 0);
                }
                _ => {}
            }
        }
        assert_eq!(depth, 0);
        assert!(!in_str);
    }

    #[test]
    fn svg_has_a_row_per_track_and_a_rect_per_span() {
        let svg = sample().to_svg(900);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
        // background + 2 rows + 3 spans
        assert_eq!(svg.matches("<rect").count(), 6);
        assert!(svg.contains("relu&lt;x&gt;"));
        assert!(svg.contains("stream &quot;1&quot;"));
    }
}
