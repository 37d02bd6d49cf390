//! The timeline recorder end to end on the CPU backend: a run of training pipelines on
//! two streams, recorded, gives a Chrome trace that is valid JSON with one track per
//! stream, spans on both streams, and an SVG; a runtime that does not record keeps
//! nothing.

use rtx::timeline::Timeline;
use rtx::train::pipeline::run_concurrently;
use rtx::train::pipeline::sweep::SweepConfig;
use rtx::{Backend, Runtime};

/// A strict JSON validator (RFC 8259 grammar, no extensions): `Ok` with the position
/// after the value.
fn value(b: &[u8], mut i: usize) -> Result<usize, String> {
    i = ws(b, i);
    match b.get(i) {
        Some(b'{') => {
            i = ws(b, i + 1);
            if b.get(i) == Some(&b'}') {
                return Ok(i + 1);
            }
            loop {
                i = string(b, ws(b, i))?;
                i = ws(b, i);
                if b.get(i) != Some(&b':') {
                    return Err(format!("':' expected at {i}"));
                }
                i = ws(b, value(b, i + 1)?);
                match b.get(i) {
                    Some(b',') => i += 1,
                    Some(b'}') => return Ok(i + 1),
                    _ => return Err(format!("',' or '}}' expected at {i}")),
                }
            }
        }
        Some(b'[') => {
            i = ws(b, i + 1);
            if b.get(i) == Some(&b']') {
                return Ok(i + 1);
            }
            loop {
                i = ws(b, value(b, i)?);
                match b.get(i) {
                    Some(b',') => i += 1,
                    Some(b']') => return Ok(i + 1),
                    _ => return Err(format!("',' or ']' expected at {i}")),
                }
            }
        }
        Some(b'"') => string(b, i),
        Some(b't') if b[i..].starts_with(b"true") => Ok(i + 4),
        Some(b'f') if b[i..].starts_with(b"false") => Ok(i + 5),
        Some(b'n') if b[i..].starts_with(b"null") => Ok(i + 4),
        Some(c) if *c == b'-' || c.is_ascii_digit() => {
            let start = i;
            i += 1;
            while i < b.len() && matches!(b[i], b'0'..=b'9' | b'.' | b'e' | b'E' | b'+' | b'-') {
                i += 1;
            }
            let s = std::str::from_utf8(&b[start..i]).map_err(|e| e.to_string())?;
            s.parse::<f64>()
                .map(|_| i)
                .map_err(|_| format!("bad number {s} at {start}"))
        }
        _ => Err(format!("value expected at {i}")),
    }
}

fn string(b: &[u8], mut i: usize) -> Result<usize, String> {
    if b.get(i) != Some(&b'"') {
        return Err(format!("string expected at {i}"));
    }
    i += 1;
    while let Some(&c) = b.get(i) {
        match c {
            b'"' => return Ok(i + 1),
            b'\\' => match b.get(i + 1) {
                Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => i += 2,
                Some(b'u')
                    if b.len() >= i + 6 && b[i + 2..i + 6].iter().all(u8::is_ascii_hexdigit) =>
                {
                    i += 6
                }
                _ => return Err(format!("bad escape at {i}")),
            },
            c if c < 0x20 => return Err(format!("control character in a string at {i}")),
            _ => i += 1,
        }
    }
    Err("unterminated string".into())
}

fn ws(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && matches!(b[i], b' ' | b'\n' | b'\r' | b'\t') {
        i += 1;
    }
    i
}

fn valid_json(s: &str) -> Result<(), String> {
    let end = ws(s.as_bytes(), value(s.as_bytes(), 0)?);
    if end == s.len() {
        Ok(())
    } else {
        Err(format!("trailing data at {end}"))
    }
}

#[test]
fn the_validator_rejects_broken_json() {
    assert!(valid_json(r#"{"a":[1,2.5e3,"x\n",true,null],"b":{}}"#).is_ok());
    for bad in [
        r#"{"a":1,}"#,
        r#"{"a" 1}"#,
        "[1 2]",
        r#""abc"#,
        "{} x",
        r#"{"a":01x}"#,
    ] {
        assert!(valid_json(bad).is_err(), "{bad} accepted");
    }
}

#[test]
fn a_recorded_run_gives_a_valid_trace_with_a_track_per_stream() {
    let rt = Runtime::builder()
        .backend(Backend::Cpu)
        .streams(2)
        .trace(true)
        .build()
        .expect("runtime");
    let cfg = SweepConfig {
        dim: 16,
        batch: 32,
        steps: 3,
        width_div: 16,
        loss_every: 3,
        ..SweepConfig::cpu()
    };
    let streams = rt.compute_streams(rt.device());
    let (_, mut ps) = cfg.build(&rt, &streams, 1, 4).expect("build");
    run_concurrently(&mut ps, &|_, _| {}).expect("run");
    drop(ps);
    rtx::block_on(rt.shutdown()).unwrap();
    let spans = rt.take_trace();
    assert!(!spans.is_empty());
    assert!(spans.iter().all(|s| s.dur_us >= 0.0 && s.start_us >= 0.0));
    assert!(
        spans
            .iter()
            .any(|s| s.name == "adamw" || s.name == "sgd" || s.name.contains("step")),
        "no optimizer step in {:?}",
        spans
            .iter()
            .map(|s| s.name)
            .collect::<std::collections::BTreeSet<_>>()
    );
    let t = Timeline::from_trace(&rt.info(), &spans);
    assert_eq!(t.tracks(), ["cpu stream 0", "cpu stream 1"]);
    assert_eq!(t.spans().len(), spans.len());
    for track in 0..2 {
        assert!(
            t.spans().iter().any(|s| s.track == track),
            "nothing on track {track}"
        );
    }
    assert!(
        t.spans().iter().any(|s| s.detail.contains("f32")),
        "no shapes in the spans"
    );
    let json = t.to_chrome_trace();
    valid_json(&json).unwrap_or_else(|e| panic!("invalid trace JSON: {e}"));
    assert_eq!(json.matches("\"thread_name\"").count(), 2);
    assert_eq!(json.matches("\"ph\":\"X\"").count(), spans.len());
    let svg = t.to_svg(800);
    assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
    assert!(rt.take_trace().is_empty(), "take_trace drains");
}

#[test]
fn a_runtime_that_does_not_record_keeps_no_spans() {
    if std::env::var("RTX_TRACE").is_ok() {
        return; // the environment overrides the builder
    }
    let rt = Runtime::cpu(1);
    let a = rt.upload(&[1.0f32, -2.0], [2]).expect("upload");
    let r = rt
        .submit(rtx::ops::relu(&a))
        .expect("submit")
        .wait()
        .expect("relu");
    assert_eq!(
        rt.to_vec::<f32>(&r)
            .expect("download")
            .wait()
            .expect("wait"),
        [1.0, 0.0]
    );
    assert!(rt.take_trace().is_empty());
}
