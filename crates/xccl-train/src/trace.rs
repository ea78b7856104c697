//! Spans of compute and communication on one rank ([`Trace`]), and the Chrome-trace /
//! Perfetto JSON of every rank's spans ([`chrome_json`]).
//!
//! Times are microseconds since the Unix epoch, taken from one monotonic clock per process
//! anchored to the wall clock once, so spans of ranks on one host line up.

use std::sync::OnceLock;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use xccl::{CollKind, DType, OpSpan, SpanOp};

/// What a span is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Computation (forward, backward, optimizer, evaluation).
    Compute,
    /// A communication operation running on a communicator's progress thread.
    Comm,
    /// Computation waiting for communication: exposed communication time.
    Wait,
}

impl Kind {
    /// Its name in traces.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Compute => "compute",
            Kind::Comm => "comm",
            Kind::Wait => "wait",
        }
    }

    fn parse(s: &str) -> Option<Kind> {
        [Kind::Compute, Kind::Comm, Kind::Wait].into_iter().find(|k| k.as_str() == s)
    }
}

/// One span of one track of a rank.
#[derive(Clone, Debug, PartialEq)]
pub struct Span {
    /// What ran, e.g. `fwd h01`, `all_reduce #12 (f32 x 4096, sum, ring)`.
    pub name: String,
    /// The track (a thread, or a communicator's progress thread), e.g. `compute`, `comm ddp`.
    pub track: String,
    /// What kind of span.
    pub kind: Kind,
    /// Start, µs since the Unix epoch.
    pub start_us: f64,
    /// Duration, µs.
    pub dur_us: f64,
    /// The communication operation, typed (communication spans; `None` for the others and
    /// for a communicator's own set-up).
    pub op: Option<SpanOp>,
}

/// `op` as JSON (the Chrome trace's `args`, the gathered spans): `{"coll", "dtype", "count"}`
/// or `{"send", "peer", "dtype", "count"}`; `null` for none.
fn op_json(op: &Option<SpanOp>) -> Value {
    match op {
        Some(SpanOp::Collective { kind, dtype, count }) => {
            json!({"coll": kind.name(), "dtype": dtype.name(), "count": count})
        }
        Some(SpanOp::Message { send, peer, dtype, count }) => {
            json!({"send": send, "peer": peer, "dtype": dtype.name(), "count": count})
        }
        Some(SpanOp::Setup) | None => Value::Null,
    }
}

/// The operation that `op_json` wrote (a span's `args`), if any.
pub fn op_from_json(v: &Value) -> Option<SpanOp> {
    let dtype = DType::ALL.into_iter().find(|d| Some(d.name()) == v["dtype"].as_str())?;
    let count = usize::try_from(v["count"].as_u64()?).ok()?;
    if let Some(name) = v["coll"].as_str() {
        let kind = CollKind::named(name)?;
        return Some(SpanOp::Collective { kind, dtype, count });
    }
    let peer = usize::try_from(v["peer"].as_u64()?).ok()?;
    Some(SpanOp::Message { send: v["send"].as_bool()?, peer, dtype, count })
}

fn origin() -> (Instant, f64) {
    static ORIGIN: OnceLock<(Instant, f64)> = OnceLock::new();
    *ORIGIN.get_or_init(|| {
        let wall = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64() * 1e6);
        (Instant::now(), wall)
    })
}

/// µs since the Unix epoch of `t`.
pub fn unix_us(t: Instant) -> f64 {
    let (o, wall) = origin();
    match t.checked_duration_since(o) {
        Some(d) => wall + d.as_secs_f64() * 1e6,
        None => wall - o.duration_since(t).as_secs_f64() * 1e6,
    }
}

/// The spans recorded on one track (one thread) of a rank; recording can be off.
#[derive(Debug)]
pub struct Trace {
    track: String,
    on: bool,
    spans: Vec<Span>,
}

impl Trace {
    /// A trace of `track`, recording if `on`.
    pub fn new(track: impl Into<String>, on: bool) -> Trace {
        origin();
        Trace { track: track.into(), on, spans: Vec::new() }
    }

    /// Runs `f` as a compute span named `name()` (only called when recording).
    pub fn span<R>(&mut self, name: impl FnOnce() -> String, f: impl FnOnce() -> R) -> R {
        if !self.on {
            return f();
        }
        let t0 = Instant::now();
        let r = f();
        self.record(Kind::Compute, name(), t0, Instant::now());
        r
    }

    /// Records a span of this track from `start` to `end`.
    pub fn record(&mut self, kind: Kind, name: String, start: Instant, end: Instant) {
        if self.on {
            let start_us = unix_us(start);
            let dur_us = (unix_us(end) - start_us).max(0.0);
            self.spans.push(Span { name, track: self.track.clone(), kind, start_us, dur_us, op: None });
        }
    }

    /// Records a communicator's operations (from `take_timeline`) on track `track`.
    pub fn add_ops(&mut self, track: &str, ops: Vec<OpSpan>) {
        if !self.on {
            return;
        }
        for op in ops {
            let start_us = unix_us(op.started);
            let dur_us = (unix_us(op.finished) - start_us).max(0.0);
            self.spans.push(Span {
                name: op.name,
                track: track.to_string(),
                kind: Kind::Comm,
                start_us,
                dur_us,
                op: Some(op.op).filter(|o| *o != SpanOp::Setup),
            });
        }
    }

    /// Moves another track's spans into this one's list.
    pub fn absorb(&mut self, other: Trace) {
        self.spans.extend(other.spans);
    }

    /// The spans so far.
    pub fn spans(&self) -> &[Span] {
        &self.spans
    }

    /// Takes the spans out.
    pub fn take(&mut self) -> Vec<Span> {
        std::mem::take(&mut self.spans)
    }
}

/// Spans as compact JSON values (for gathering them to rank 0).
pub fn to_json(spans: &[Span]) -> Value {
    Value::Array(
        spans
            .iter()
            .map(|s| json!([s.name, s.track, s.kind.as_str(), s.start_us, s.dur_us, op_json(&s.op)]))
            .collect(),
    )
}

/// Spans back from [`to_json`]; malformed entries are skipped.
pub fn from_json(v: &Value) -> Vec<Span> {
    let Some(items) = v.as_array() else { return Vec::new() };
    items
        .iter()
        .filter_map(|s| {
            Some(Span {
                name: s.get(0)?.as_str()?.to_string(),
                track: s.get(1)?.as_str()?.to_string(),
                kind: Kind::parse(s.get(2)?.as_str()?)?,
                start_us: s.get(3)?.as_f64()?,
                dur_us: s.get(4)?.as_f64()?,
                op: s.get(5).and_then(op_from_json),
            })
        })
        .collect()
}

/// The Chrome trace (also read by Perfetto) of every rank's spans: one process per rank,
/// one thread per track, times relative to the earliest span.
pub fn chrome_json(ranks: &[Vec<Span>]) -> Value {
    let t0 = ranks.iter().flatten().map(|s| s.start_us).fold(f64::INFINITY, f64::min);
    let t0 = if t0.is_finite() { t0 } else { 0.0 };
    let mut events = Vec::new();
    for (rank, spans) in ranks.iter().enumerate() {
        events.push(
            json!({"name": "process_name", "ph": "M", "pid": rank, "args": {"name": format!("rank {rank}")}}),
        );
        events.push(
            json!({"name": "process_sort_index", "ph": "M", "pid": rank, "args": {"sort_index": rank}}),
        );
        let mut tracks: Vec<&str> = Vec::new();
        for s in spans {
            if !tracks.contains(&s.track.as_str()) {
                tracks.push(&s.track);
            }
        }
        for (tid, track) in tracks.iter().enumerate() {
            events.push(
                json!({"name": "thread_name", "ph": "M", "pid": rank, "tid": tid, "args": {"name": track}}),
            );
            events.push(json!({"name": "thread_sort_index", "ph": "M", "pid": rank, "tid": tid, "args": {"sort_index": tid}}));
        }
        for s in spans {
            let tid = tracks.iter().position(|t| *t == s.track).unwrap_or(0);
            events.push(json!({
                "name": s.name, "cat": s.kind.as_str(), "ph": "X", "pid": rank, "tid": tid,
                "ts": s.start_us - t0, "dur": s.dur_us, "args": op_json(&s.op),
            }));
        }
    }
    json!({"traceEvents": events, "displayTimeUnit": "ms"})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_round_trip_and_make_a_chrome_trace() {
        let mut t = Trace::new("compute", true);
        let x = t.span(|| "fwd embed".into(), || 41 + 1);
        assert_eq!(x, 42);
        let now = Instant::now();
        t.record(Kind::Wait, "wait".into(), now, now + std::time::Duration::from_millis(2));
        let all_reduce = SpanOp::Collective { kind: CollKind::AllReduce, dtype: DType::F32, count: 1024 };
        let recv = SpanOp::Message { send: false, peer: 3, dtype: DType::BF16, count: 7 };
        let op = |name: &str, op| OpSpan {
            name: name.into(),
            op,
            bytes: 0,
            issued: now,
            started: now,
            finished: now + std::time::Duration::from_millis(1),
        };
        t.add_ops("comm tp", vec![op("a", all_reduce), op("r", recv), op("split", SpanOp::Setup)]);
        let spans = t.take();
        assert_eq!(
            spans.iter().map(|s| s.op).collect::<Vec<_>>(),
            [None, None, Some(all_reduce), Some(recv), None]
        );
        let back = from_json(&to_json(&spans));
        assert_eq!(back, spans);
        let trace = chrome_json(&[back.clone(), back]);
        let events = trace["traceEvents"].as_array().unwrap();
        let x: Vec<_> = events.iter().filter(|e| e["ph"] == "X").collect();
        assert_eq!(x.len(), 10);
        assert!(x.iter().all(|e| e["ts"].as_f64().unwrap() >= 0.0));
        assert_eq!(
            op_from_json(&x[2]["args"]),
            Some(all_reduce),
            "the Chrome trace carries the typed operation"
        );
        assert_eq!(x[1]["cat"], "wait");
        assert!((x[1]["dur"].as_f64().unwrap() - 2000.0).abs() < 1.0);
        let mut off = Trace::new("compute", false);
        off.span(|| unreachable!(), || ());
        assert!(off.spans().is_empty());
    }
}
