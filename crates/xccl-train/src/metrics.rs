//! What a run measured: per-step statistics of each rank ([`StepStat`]), each rank's
//! report gathered to rank 0 ([`RankReport`], [`gather_reports`]) and the run's
//! [`Summary`].

use serde_json::{Value, json};
use xccl::{CollKind, Communicator, SpanOp};

use crate::data::Evaluation;
use crate::error::{Error, Result};
use crate::trace::{self, Span};

/// One training step as one worker rank saw it.
#[derive(Clone, Debug, PartialEq)]
pub struct StepStat {
    /// The step (clock) index.
    pub step: u64,
    /// Wall time of the step on this rank, seconds.
    pub seconds: f64,
    /// Of which waiting for communication (exposed communication), seconds.
    pub wait: f64,
    /// Parameter server: the parameter version the step computed on.
    pub version: Option<u64>,
    /// Bytes this rank sent in the step through its tensor-parallel, data-parallel and
    /// pipeline communicators (see [`bus_bytes`]; recorded when tracing, else 0).
    pub sent: [u64; 3],
    /// Pipeline: seconds of forward and backward, and when this rank started the step's
    /// pipeline and ended its last backward (µs since the Unix epoch).
    pub pipe: Option<[f64; 3]>,
}

impl StepStat {
    /// Parameter server: how many updates behind the step's clock its parameters were.
    pub fn staleness(&self) -> Option<u64> {
        self.version.map(|v| self.step.saturating_sub(v))
    }
}

/// Everything one rank reports at the end of a run.
#[derive(Clone, Debug, PartialEq)]
pub struct RankReport {
    /// The rank.
    pub rank: usize,
    /// What it did: `worker`, `server`, `worker+server`.
    pub role: String,
    /// Its steps (workers only).
    pub steps: Vec<StepStat>,
    /// Its trace spans (empty when tracing is off).
    pub spans: Vec<Span>,
    /// Parameter elements it holds (its tensor-parallel pieces).
    pub params_held: usize,
    /// Peak resident memory of its process during its steps (before the final
    /// checkpoint), bytes; 0 where unknown.
    pub peak_rss_bytes: u64,
    /// Bytes it holds between steps for parameters, gradients and optimiser state (data
    /// parallelism and ZeRO count them; zero where not counted).
    pub held_bytes: [u64; 3],
    /// Pipeline: the forwards and backwards of its last step, `(name, start µs since the
    /// Unix epoch, duration µs)`.
    pub timeline: Lane,
}

/// Bytes a rank sends for operations `ops` of a communicator of `size` ranks, as a ring
/// algorithm would: nccl-tests' bus-bandwidth convention ([`xccl::CollKind::bus_factor`]) on
/// each collective's size (an all-gather's is its output, `size` times its input), each
/// message sent counted whole, messages received not at all (their sender counts them);
/// nothing on a group of one. An all-reduce of `n` bytes is `2(p−1)/p·n`, an all-gather of
/// `n` bytes each `(p−1)·n`, a reduce-scatter of `n` bytes `(p−1)/p·n`: by this measure
/// Megatron's all-reduce of a tensor and sequence parallelism's all-gather + reduce-scatter of
/// it are equal, as they are on the wire.
pub fn bus_bytes(size: usize, ops: &[xccl::OpSpan]) -> u64 {
    if size <= 1 {
        return 0;
    }
    let bus: f64 = ops
        .iter()
        .map(|o| {
            let n = o.bytes as f64;
            match o.op {
                SpanOp::Collective { kind, .. } => {
                    let whole = if kind == CollKind::AllGather { size as f64 * n } else { n };
                    kind.bus_factor(size) * whole
                }
                SpanOp::Message { send: true, .. } => n,
                SpanOp::Message { send: false, .. } | SpanOp::Setup => 0.0,
            }
        })
        .sum();
    bus.round() as u64
}

/// Starts measuring the peak resident memory afresh (the peak of what training holds, not
/// of building the model): resets the kernel's high-water mark (`/proc/self/clear_refs`).
/// Where that is not allowed the peak stays the process's.
pub fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// The peak resident memory of this process (`VmHWM`), bytes; 0 where it cannot be read.
pub fn peak_rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib * 1024)
        })
        .unwrap_or(0)
}

impl RankReport {
    fn to_json(&self) -> Value {
        let steps: Vec<Value> = self
            .steps
            .iter()
            .map(|s| json!([s.step, s.seconds, s.wait, s.version, s.sent, s.pipe]))
            .collect();
        json!({
            "rank": self.rank,
            "role": self.role,
            "steps": steps,
            "spans": trace::to_json(&self.spans),
            "params_held": self.params_held,
            "peak_rss_bytes": self.peak_rss_bytes,
            "held_bytes": self.held_bytes,
            "timeline": self.timeline,
        })
    }

    fn from_json(v: &Value) -> Option<RankReport> {
        let steps = v["steps"]
            .as_array()?
            .iter()
            .map(|s| {
                Some(StepStat {
                    step: s.get(0)?.as_u64()?,
                    seconds: s.get(1)?.as_f64()?,
                    wait: s.get(2)?.as_f64()?,
                    version: s.get(3)?.as_u64(),
                    sent: serde_json::from_value(s.get(4)?.clone()).ok()?,
                    pipe: serde_json::from_value(s.get(5)?.clone()).ok()?,
                })
            })
            .collect::<Option<Vec<_>>>()?;
        Some(RankReport {
            rank: usize::try_from(v["rank"].as_u64()?).ok()?,
            role: v["role"].as_str()?.to_string(),
            steps,
            spans: trace::from_json(&v["spans"]),
            params_held: usize::try_from(v["params_held"].as_u64()?).ok()?,
            peak_rss_bytes: v["peak_rss_bytes"].as_u64()?,
            held_bytes: serde_json::from_value(v["held_bytes"].clone()).ok()?,
            timeline: serde_json::from_value(v["timeline"].clone()).ok()?,
        })
    }
}

/// Gathers every rank's report to rank 0 with the communicator's own collectives (an
/// all-gather of the sizes, then a gather of the padded JSON bytes). Rank 0 gets them in
/// rank order, the others `None`.
pub fn gather_reports(comm: &Communicator, mine: &RankReport) -> Result<Option<Vec<RankReport>>> {
    let Some(all) = crate::error::gather_json(comm, &mine.to_json())? else { return Ok(None) };
    let reports = all
        .into_iter()
        .enumerate()
        .map(|(r, v)| {
            v.ok()
                .and_then(|v| RankReport::from_json(&v))
                .ok_or_else(|| Error::internal(format!("rank {r} sent an unreadable report")))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Some(reports))
}

/// The run as rank 0 summarises it.
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    /// Ranks in the job.
    pub ranks: usize,
    /// The strategy, in words.
    pub strategy: String,
    /// Model parameters (elements).
    pub params: usize,
    /// Steps run by this invocation (after a resume, the ones after the checkpoint).
    pub steps_run: u64,
    /// `(step, global mean loss)` of every step, including those before a resume.
    pub losses: Vec<(u64, f64)>,
    /// Held-out evaluation of the final parameters.
    pub evaluation: Option<Evaluation>,
    /// Input tokens per global step.
    pub tokens_per_step: usize,
    /// Mean step time over workers and steps (the first step of each rank, which warms up
    /// allocations, left out when there are others), seconds.
    pub step_seconds: f64,
    /// Mean exposed communication per step (waits), seconds.
    pub exposed_seconds: f64,
    /// Wall time of the training loop on rank 0, seconds.
    pub wall_seconds: f64,
    /// Parameter server: `(staleness, worker steps)` over every worker step.
    pub staleness: Vec<(u64, usize)>,
    /// Per rank: parameters held, peak memory and communication volume.
    pub per_rank: Vec<RankFacts>,
    /// Useful FLOPs of one step ([`train_flops_per_step`](crate::model::flops::train_flops_per_step)).
    pub flops_per_step: f64,
    /// The f32 matrix-product rate of one rank on its threads, FLOP/s, if measured
    /// ([`matmul_rate`](crate::model::flops::matmul_rate)).
    pub matmul_rate: Option<f64>,
    /// Pipeline parallelism: the schedule and its measured bubble.
    pub pipeline: Option<PipelineFacts>,
}

/// One stage's forwards and backwards: `(name, start, duration)`.
pub type Lane = Vec<(String, f64, f64)>;

/// What a pipeline did, from every rank's report.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct PipelineFacts {
    /// The schedule's name.
    pub schedule: String,
    /// Pipeline stages.
    pub stages: usize,
    /// Micro-batches per step.
    pub micro_batches: usize,
    /// Chunks per stage.
    pub virtual_stages: usize,
    /// Whether forwards are recomputed in backward.
    pub recompute: bool,
    /// The schedule's bubble fraction in closed form.
    pub bubble_schedule: f64,
    /// The measured bubble fraction: `1 − busy / span` over the steps after the first
    /// (span: the step's pipeline, earliest start to latest end), averaged over the ranks.
    pub bubble_measured: f64,
    /// The last step of the first pipeline (data-parallel and tensor-parallel rank 0): for
    /// each stage, its forwards and backwards as `(name, start ms, duration ms)` from the
    /// earliest start.
    pub timeline: Vec<Lane>,
}

impl PipelineFacts {
    /// The measured bubble from `reports`, and the timeline of the ranks `lanes` (world
    /// ranks of stage 0, 1, … of one pipeline). The schedule's facts are left for the caller.
    /// A step's pipeline runs from the earliest start to the latest end of any rank (all
    /// pipelines of a step run together); a rank's bubble is `1 − busy / that`, summed over
    /// the steps after the first, and the result is the mean over ranks.
    pub fn measure(reports: &[RankReport], lanes: &[usize]) -> (f64, Vec<Lane>) {
        let mut window: std::collections::BTreeMap<u64, (f64, f64)> = std::collections::BTreeMap::new();
        for r in reports {
            for s in &r.steps {
                if let Some([_, start, end]) = s.pipe {
                    let w = window.entry(s.step).or_insert((start, end));
                    *w = (w.0.min(start), w.1.max(end));
                }
            }
        }
        let mut bubbles = Vec::new();
        for r in reports {
            let measured = if r.steps.len() > 1 { &r.steps[1..] } else { &r.steps[..] };
            let (mut busy, mut span) = (0.0, 0.0);
            for s in measured {
                if let (Some(p), Some((start, end))) = (s.pipe, window.get(&s.step)) {
                    busy += p[0];
                    span += (end - start) / 1e6;
                }
            }
            if span > 0.0 {
                bubbles.push(1.0 - busy / span);
            }
        }
        let bubble = bubbles.iter().sum::<f64>() / bubbles.len().max(1) as f64;
        let chosen: Vec<&RankReport> =
            lanes.iter().filter_map(|&l| reports.iter().find(|r| r.rank == l)).collect();
        let t0 = chosen.iter().flat_map(|r| r.timeline.iter().map(|t| t.1)).fold(f64::INFINITY, f64::min);
        let timeline = chosen
            .iter()
            .map(|r| {
                r.timeline.iter().map(|(n, start, dur)| (n.clone(), (start - t0) / 1e3, dur / 1e3)).collect()
            })
            .collect();
        (bubble, timeline)
    }
}

/// What one rank held and moved.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct RankFacts {
    /// The rank.
    pub rank: usize,
    /// Parameter elements it holds.
    pub params_held: usize,
    /// Peak resident memory of its process, bytes.
    pub peak_rss_bytes: u64,
    /// Bytes held between steps for parameters, gradients and optimiser state.
    pub held_bytes: [u64; 3],
    /// Mean bytes sent per step through the tensor-parallel, data-parallel and pipeline
    /// groups.
    pub sent_per_step: [f64; 3],
}

impl Summary {
    /// Builds the summary from every rank's report.
    pub fn new(
        ranks: usize,
        strategy: String,
        params: usize,
        losses: Vec<(u64, f64)>,
        tokens_per_step: usize,
        wall_seconds: f64,
        reports: &[RankReport],
    ) -> Summary {
        let mut steps_run = 0;
        let (mut time, mut wait, mut n) = (0.0, 0.0, 0usize);
        let mut staleness: Vec<(u64, usize)> = Vec::new();
        for r in reports {
            steps_run = steps_run.max(r.steps.len() as u64);
            let measured = if r.steps.len() > 1 { &r.steps[1..] } else { &r.steps[..] };
            for s in measured {
                time += s.seconds;
                wait += s.wait;
                n += 1;
            }
            for s in &r.steps {
                if let Some(st) = s.staleness() {
                    match staleness.iter_mut().find(|(k, _)| *k == st) {
                        Some((_, c)) => *c += 1,
                        None => staleness.push((st, 1)),
                    }
                }
            }
        }
        staleness.sort_unstable();
        let per_rank = reports
            .iter()
            .map(|r| {
                let steps = r.steps.len().max(1) as f64;
                let mean = |i: usize| r.steps.iter().map(|s| s.sent[i] as f64).sum::<f64>() / steps;
                RankFacts {
                    rank: r.rank,
                    params_held: r.params_held,
                    peak_rss_bytes: r.peak_rss_bytes,
                    held_bytes: r.held_bytes,
                    sent_per_step: [mean(0), mean(1), mean(2)],
                }
            })
            .collect();
        let per = |x: f64| if n > 0 { x / n as f64 } else { 0.0 };
        Summary {
            ranks,
            strategy,
            params,
            steps_run,
            losses,
            evaluation: None,
            tokens_per_step,
            step_seconds: per(time),
            exposed_seconds: per(wait),
            wall_seconds,
            staleness,
            per_rank,
            flops_per_step: 0.0,
            matmul_rate: None,
            pipeline: None,
        }
    }

    /// Model FLOP utilisation: the step's useful FLOPs per second against what every rank's
    /// matrix product could do in that time (`None` until the rate is measured).
    pub fn mfu(&self) -> Option<f64> {
        let rate = self.matmul_rate?;
        (self.step_seconds > 0.0 && rate > 0.0)
            .then(|| self.flops_per_step / self.step_seconds / (rate * self.ranks as f64))
    }

    /// The last step's loss.
    pub fn final_loss(&self) -> Option<f64> {
        self.losses.last().map(|&(_, l)| l)
    }

    /// Exposed communication as a share of step time.
    pub fn exposed_share(&self) -> f64 {
        if self.step_seconds > 0.0 { self.exposed_seconds / self.step_seconds } else { 0.0 }
    }

    /// Input tokens per second of the whole job.
    pub fn tokens_per_second(&self) -> f64 {
        if self.step_seconds > 0.0 { self.tokens_per_step as f64 / self.step_seconds } else { 0.0 }
    }

    /// The summary as JSON (what `xccl train` prints and plots from).
    pub fn to_json(&self) -> Value {
        json!({
            "ranks": self.ranks,
            "strategy": self.strategy,
            "params": self.params,
            "steps_run": self.steps_run,
            "losses": self.losses,
            "final_loss": self.final_loss(),
            "accuracy": self.evaluation.as_ref().map(|e| e.accuracy),
            "tokens_per_step": self.tokens_per_step,
            "tokens_per_second": self.tokens_per_second(),
            "step_seconds": self.step_seconds,
            "exposed_seconds": self.exposed_seconds,
            "exposed_share": self.exposed_share(),
            "wall_seconds": self.wall_seconds,
            "staleness": self.staleness,
            "flops_per_step": self.flops_per_step,
            "matmul_flops_per_rank": self.matmul_rate,
            "mfu": self.mfu(),
            "per_rank": self.per_rank.iter().map(|r| json!({
                "rank": r.rank,
                "params_held": r.params_held,
                "peak_rss_bytes": r.peak_rss_bytes,
                "held_bytes": {"params": r.held_bytes[0], "grads": r.held_bytes[1], "optimizer": r.held_bytes[2]},
                "comm_bytes": {"tp": r.sent_per_step[0], "dp": r.sent_per_step[1], "pp": r.sent_per_step[2]},
            })).collect::<Vec<_>>(),
            "pipeline": self.pipeline,
            "text": self.render(),
        })
    }

    /// The summary in words, one fact per line.
    pub fn render(&self) -> String {
        let mut s = format!(
            "{} on {} ranks, {} parameters, {} steps in {:.1} s\n",
            self.strategy, self.ranks, self.params, self.steps_run, self.wall_seconds
        );
        if let Some(l) = self.final_loss() {
            s += &format!("final loss          {l:.4}\n");
        }
        if let Some(e) = &self.evaluation {
            s += &format!("accuracy            {:.1}% {}\n", 100.0 * e.accuracy, e.measure);
            for x in &e.examples {
                s += &format!("                    {x}\n");
            }
        }
        s += &format!(
            "throughput          {:.0} tokens/s ({} tokens per step)\n",
            self.tokens_per_second(),
            self.tokens_per_step
        );
        s += &format!("step time           {:.2} ms\n", 1e3 * self.step_seconds);
        if let (Some(mfu), Some(rate)) = (self.mfu(), self.matmul_rate) {
            s += &format!(
                "model FLOPs         {:.2} GFLOP per step, {:.1} GFLOP/s: {:.1}% of {} rank(s) x {:.1} GFLOP/s (f32 matrix product)\n",
                self.flops_per_step / 1e9,
                self.flops_per_step / self.step_seconds / 1e9,
                100.0 * mfu,
                self.ranks,
                rate / 1e9
            );
        }
        s += &format!(
            "exposed comm.       {:.3} ms per step, {:.1}% of step time\n",
            1e3 * self.exposed_seconds,
            100.0 * self.exposed_share()
        );
        if let Some(p) = &self.pipeline {
            s += &format!(
                "pipeline            {} stages x {} micro-batches, {}{}{}: bubble {:.1}% measured, {:.1}% by the schedule\n",
                p.stages,
                p.micro_batches,
                p.schedule,
                if p.virtual_stages > 1 {
                    format!(" ({} chunks per stage)", p.virtual_stages)
                } else {
                    String::new()
                },
                if p.recompute { ", recomputing forwards" } else { "" },
                100.0 * p.bubble_measured,
                100.0 * p.bubble_schedule
            );
        }
        if !self.staleness.is_empty() {
            let total: usize = self.staleness.iter().map(|&(_, c)| c).sum();
            let hist: Vec<String> = self
                .staleness
                .iter()
                .map(|&(k, c)| format!("{k}: {:.0}%", 100.0 * c as f64 / total as f64))
                .collect();
            s += &format!("staleness           {} (of {total} worker steps)\n", hist.join(", "));
        }
        for r in &self.per_rank {
            // What each group sent per step (ring-equivalent bytes; none on a group of one).
            let comm: Vec<String> = ["tp", "dp", "pp"]
                .iter()
                .zip(r.sent_per_step)
                .filter(|(_, b)| *b > 0.0)
                .map(|(l, b)| format!("{l} {:.1} KiB", b / 1024.0))
                .collect();
            let mib = |b: u64| b as f64 / f64::from(1u32 << 20);
            let [p, g, o] = r.held_bytes;
            let held = if p + g + o > 0 {
                format!(
                    " (holds {:.1} MiB parameters, {:.1} MiB gradients, {:.1} MiB optimizer state)",
                    mib(p),
                    mib(g),
                    mib(o)
                )
            } else {
                String::new()
            };
            s += &format!(
                "rank {:<3}            {} parameters ({:.1}% of the model), peak memory {:.1} MiB{held}{}{}\n",
                r.rank,
                r.params_held,
                100.0 * r.params_held as f64 / self.params.max(1) as f64,
                mib(r.peak_rss_bytes),
                if comm.is_empty() { "" } else { ", sends per step " },
                comm.join(", ")
            );
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_averages_after_the_first_step_and_counts_staleness() {
        let stat = |step, seconds, wait, version| StepStat {
            step,
            seconds,
            wait,
            version,
            sent: [0, 3, 1],
            pipe: Some([1.0, 1e6 * step as f64, 1e6 * step as f64 + 2e6]),
        };
        let reports = vec![
            RankReport {
                rank: 0,
                role: "worker".into(),
                steps: vec![
                    stat(0, 9.0, 9.0, Some(0)),
                    stat(1, 1.0, 0.1, Some(0)),
                    stat(2, 1.0, 0.1, Some(2)),
                ],
                spans: Vec::new(),
                params_held: 10,
                peak_rss_bytes: 1 << 20,
                held_bytes: [0; 3],
                timeline: vec![("F(0,0)".into(), 1000.0, 500.0)],
            },
            RankReport {
                rank: 1,
                role: "worker".into(),
                steps: vec![
                    stat(0, 9.0, 9.0, Some(0)),
                    StepStat {
                        // Starts its step-1 pipeline 0.5 s later and ends 1 s later than rank 0.
                        pipe: Some([1.0, 1.5e6, 4e6]),
                        ..stat(1, 3.0, 0.3, Some(1))
                    },
                ],
                spans: Vec::new(),
                params_held: 10,
                peak_rss_bytes: 0,
                held_bytes: [0; 3],
                timeline: vec![("B(0,0)".into(), 3000.0, 1000.0)],
            },
        ];
        let s = Summary::new(2, "ps".into(), 10, vec![(0, 2.0), (1, 1.5)], 100, 5.0, &reports);
        assert!((s.step_seconds - 5.0 / 3.0).abs() < 1e-12);
        assert!((s.exposed_share() - 0.1).abs() < 1e-12);
        assert_eq!(s.staleness, vec![(0, 4), (1, 1)]);
        assert_eq!(s.final_loss(), Some(1.5));
        assert!(s.render().contains("staleness"));
        let back = RankReport::from_json(&reports[0].to_json()).unwrap();
        assert_eq!(back, reports[0]);
        // Step 1's pipeline runs from rank 0's start (1 s) to rank 1's end (4 s): 3 s, of
        // which each rank is busy 1 s; step 2 only rank 0 ran: busy 1 s of 2 s.
        let (bubble, timeline) = PipelineFacts::measure(&reports, &[1, 0]);
        let expect = ((1.0 - 2.0 / 5.0) + (1.0 - 1.0 / 3.0)) / 2.0;
        assert!((bubble - expect).abs() < 1e-12, "{bubble}");
        assert_eq!(timeline, vec![vec![("B(0,0)".into(), 2.0, 1.0)], vec![("F(0,0)".into(), 0.0, 0.5)]]);
    }
}
