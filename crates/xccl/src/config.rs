//! Settings of a communicator, from `XCCL_*` environment variables.

use std::time::Duration;

use crate::algo::AlgoOverrides;
use crate::algo::tune::CostModel;
use crate::byte_count::parse_bytes;
use crate::error::{Error, Result};
use crate::flight::FlightConfig;
use crate::protocol::ProtocolPolicy;

/// How a communicator behaves. [`Config::from_env`] reads:
///
/// | variable | meaning | default |
/// |---|---|---|
/// | `XCCL_TIMEOUT` | seconds an operation may wait without progress | 300 |
/// | `XCCL_ALGO` | algorithm overrides, e.g. `allreduce:reduce_broadcast` | none (the tuner picks) |
/// | `XCCL_PROTO` | the protocols allowed (see [`protocol`](crate::protocol)), e.g. `stream` or `allreduce:ll,broadcast:pull` | all |
/// | `XCCL_TUNE_LOCAL`, `XCCL_TUNE_SHM`, `XCCL_TUNE_TCP` | the tuner's constants per link class: `alpha_us,beta_gbps,gamma_gbps,delta_gbps` | measured on the reference machine |
/// | `XCCL_LINK_TIMEOUT` | seconds after which a peer whose host stopped answering (host down, link cut) is reported lost | 3 |
/// | `XCCL_LINK_PROBE` | `1` to measure the links between hosts when the job starts, `0` never (see [`Communicator::connect`](crate::Communicator::connect)) | measure when hosts meet over a network and `XCCL_TUNE_TCP` is unset |
/// | `XCCL_FLIGHT_RECORDS` | operations each communicator's flight recorder keeps, written as JSON when it fails (`0`: off; see [`flight`](crate::flight)) | 64 |
/// | `XCCL_FLIGHT_DIR` | where the flight records go | `$TMPDIR/xccl-flight` |
/// | `XCCL_SEGMENT_BYTES` | largest frame payload on socket links | 1 MiB |
/// | `XCCL_MAX_UNEXPECTED_BYTES` | most bytes of not-yet-received messages kept | 256 MiB |
/// | `XCCL_PULL_BYTES` | messages at least this long are copied by the receiver straight from the sender's memory where it combines them (`off`: never) | `XCCL_TUNE_FILE`'s `pull` line (`xccl tune pull` measures it), else 64 KiB |
/// | `XCCL_PULL_PLAIN_BYTES` | the same for messages the receiver only places (all-gather, broadcast, all-to-all; `off`: never) | `XCCL_TUNE_FILE`'s `pull` line, else half `XCCL_PULL_BYTES` |
/// | `XCCL_SHM` | `0` to use TCP between processes of one host instead of shared memory | `1` |
/// | `XCCL_BACKEND` | `mpi`: [`Communicator::from_env`](crate::Communicator::from_env) makes an MPI communicator (feature `mpi`) | `native` |
/// | `XCCL_SHM_RING_BYTES` | bytes per shared-memory ring | by ranks per host: 4 MiB up to 4, 1 MiB up to 16, 256 KiB beyond |
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Longest wait without progress before an operation fails.
    pub timeout: Duration,
    /// Algorithm overrides per collective.
    pub algos: AlgoOverrides,
    /// The protocols each collective may use (every rank must allow the same).
    pub protocols: ProtocolPolicy,
    /// The tuner's cost constants (they must be the same on every rank).
    pub costs: CostModel,
    /// Largest frame payload on socket links, in bytes.
    pub tcp_segment: usize,
    /// Most bytes of point-to-point messages kept before a matching receive is posted.
    pub max_unexpected: usize,
    /// Whether processes of one host talk through shared memory.
    pub shm: bool,
    /// Bytes per shared-memory ring; `None` sizes rings by the number of ranks per host.
    pub shm_ring: Option<usize>,
    /// From which length messages go by pull (the receiver copies from the sender's memory
    /// where it can; `usize::MAX` never), as `XCCL_PULL_BYTES` and `XCCL_PULL_PLAIN_BYTES`
    /// set it. What they leave, [`Config::pull_min`] takes from the tuning file's `pull`
    /// lines, then from the built-in thresholds.
    pub pull: crate::protocol::PullSetting,
    /// Whether a job spanning hosts measures the links between them when it starts
    /// (`XCCL_LINK_PROBE`); `None` decides: it measures over a network (not loopback) when
    /// the TCP constants are the built-in ones.
    pub link_probe: Option<bool>,
    /// The flight recorder's settings.
    pub flight: FlightConfig,
    /// How long a socket link's peer may leave it unanswered before it is reported lost
    /// (`XCCL_LINK_TIMEOUT`).
    pub link_timeout: Duration,
}

impl Config {
    /// From which lengths a rank pulls on a host of `ranks_on_host` ranks: the settings, then
    /// the tuning file's `pull` line for that count or for any (`costs`), then `built_in`
    /// ([`PullMin::built_in`](crate::protocol::PullMin::built_in) for processes).
    pub fn pull_min(
        &self,
        ranks_on_host: usize,
        built_in: crate::protocol::PullMin,
    ) -> crate::protocol::PullMin {
        self.pull.over(self.costs.pull_for(ranks_on_host).unwrap_or(built_in))
    }

    /// Bytes per shared-memory ring for `m` ranks on a host.
    pub fn shm_ring_for(&self, m: usize) -> usize {
        self.shm_ring.unwrap_or(match m {
            0..=4 => 4 << 20,
            5..=16 => 1 << 20,
            _ => 256 << 10,
        })
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            timeout: Duration::from_secs(300),
            algos: AlgoOverrides::default(),
            protocols: ProtocolPolicy::default(),
            costs: CostModel::default(),
            tcp_segment: 1 << 20,
            max_unexpected: 256 << 20,
            shm: true,
            shm_ring: None,
            pull: crate::protocol::PullSetting::default(),
            link_probe: None,
            flight: FlightConfig::default(),
            link_timeout: Duration::from_secs(3),
        }
    }
}

impl Config {
    /// Defaults overridden by the `XCCL_*` variables of this process.
    pub fn from_env() -> Result<Config> {
        Config::from_lookup(|k| std::env::var(k).ok())
    }

    /// Defaults overridden by the variables `lookup` finds.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Config> {
        let mut c = Config::default();
        if let Some(v) = lookup("XCCL_TIMEOUT") {
            let secs: f64 =
                v.trim().parse().ok().filter(|s: &f64| s.is_finite() && *s > 0.0).ok_or_else(|| {
                    Error::Config(format!("XCCL_TIMEOUT='{v}' is not a positive number of seconds"))
                })?;
            c.timeout = Duration::from_secs_f64(secs);
        }
        if let Some(v) = lookup("XCCL_LINK_TIMEOUT") {
            let secs: f64 =
                v.trim().parse().ok().filter(|s: &f64| s.is_finite() && *s >= 1.0).ok_or_else(|| {
                    Error::Config(format!("XCCL_LINK_TIMEOUT='{v}' is not a number of seconds, at least 1"))
                })?;
            c.link_timeout = Duration::from_secs_f64(secs);
        }
        if let Some(v) = lookup("XCCL_ALGO") {
            c.algos = AlgoOverrides::parse(&v)?;
        }
        if let Some(v) = lookup("XCCL_PROTO") {
            c.protocols = ProtocolPolicy::parse(&v)?;
        }
        c.costs = CostModel::from_lookup(&lookup)?;
        if let Some(v) = lookup("XCCL_SEGMENT_BYTES") {
            c.tcp_segment = parse_bytes("XCCL_SEGMENT_BYTES", &v, 4 << 10, crate::frame::MAX_PAYLOAD)?;
        }
        if let Some(v) = lookup("XCCL_SHM") {
            c.shm = match v.trim() {
                "0" | "false" | "off" | "no" => false,
                "1" | "true" | "on" | "yes" => true,
                _ => return Err(Error::Config(format!("XCCL_SHM='{v}' is not 0 or 1"))),
            };
        }
        if let Some(v) = lookup("XCCL_SHM_RING_BYTES") {
            let b = parse_bytes("XCCL_SHM_RING_BYTES", &v, 64 << 10, 1 << 30)?;
            if !b.is_power_of_two() {
                return Err(Error::Config(format!("XCCL_SHM_RING_BYTES='{v}' must be a power of two")));
            }
            c.shm_ring = Some(b);
        }
        let pull_bytes =
            |name: &str| lookup(name).map(|v| crate::byte_count::parse_threshold(name, &v)).transpose();
        // Over this machine's thresholds as `xccl tune pull` measured them (`XCCL_TUNE_FILE`,
        // in `costs`; see `pull_min`).
        if let Some(b) = pull_bytes("XCCL_PULL_BYTES")? {
            c.pull = crate::protocol::PullSetting { combining: Some(b), plain: None };
        }
        if let Some(b) = pull_bytes("XCCL_PULL_PLAIN_BYTES")? {
            c.pull.plain = Some(b);
        }
        if let Some(v) = lookup("XCCL_LINK_PROBE") {
            c.link_probe = match v.trim() {
                "0" | "false" | "off" | "no" => Some(false),
                "1" | "true" | "on" | "yes" => Some(true),
                "auto" => None,
                _ => return Err(Error::Config(format!("XCCL_LINK_PROBE='{v}' is not 0, 1 or auto"))),
            };
        }
        if let Some(v) = lookup("XCCL_FLIGHT_RECORDS") {
            c.flight.records = v.trim().parse().map_err(|_| {
                Error::Config(format!(
                    "XCCL_FLIGHT_RECORDS='{v}' is not a number of operations (0 turns it off)"
                ))
            })?;
        }
        if let Some(v) = lookup("XCCL_FLIGHT_DIR") {
            c.flight.dir = v.into();
        }
        if let Some(v) = lookup("XCCL_MAX_UNEXPECTED_BYTES") {
            c.max_unexpected = parse_bytes("XCCL_MAX_UNEXPECTED_BYTES", &v, 0, usize::MAX)?;
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(pairs: &[(&str, &str)]) -> Result<Config> {
        let pairs: Vec<(String, String)> =
            pairs.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
        Config::from_lookup(|k| pairs.iter().find(|(a, _)| a == k).map(|(_, b)| b.clone()))
    }

    #[test]
    fn reads_and_validates_variables() {
        let c = with(&[("XCCL_TIMEOUT", "2.5"), ("XCCL_SEGMENT_BYTES", "64K")]).unwrap();
        assert_eq!(c.timeout, Duration::from_millis(2500));
        assert_eq!(c.tcp_segment, 64 << 10);
        assert!(with(&[("XCCL_TIMEOUT", "soon")]).unwrap_err().to_string().contains("XCCL_TIMEOUT"));
        assert!(with(&[("XCCL_TIMEOUT", "-1")]).is_err());
        assert!(with(&[("XCCL_SEGMENT_BYTES", "1")]).is_err());
        assert!(with(&[("XCCL_ALGO", "allreduce:nope")]).is_err());
        assert_eq!(with(&[]).unwrap(), Config::default());
    }

    #[test]
    fn pull_thresholds_are_set_together_or_apart() {
        use crate::protocol::{CpuVendor, PullMin};
        // As a rank of two on an Intel host, and one of four on an AMD host, resolves them.
        let intel =
            |pairs: &[(&str, &str)]| with(pairs).unwrap().pull_min(2, PullMin::built_in(CpuVendor::Other, 2));
        let amd =
            |pairs: &[(&str, &str)]| with(pairs).unwrap().pull_min(4, PullMin::built_in(CpuVendor::Amd, 4));
        assert_eq!(intel(&[]), PullMin { combining: 64 << 10, plain: 32 << 10 });
        assert_eq!(amd(&[]), PullMin { combining: 1 << 20, plain: 128 << 10 });
        assert_eq!(PullMin::built_in(CpuVendor::Amd, 2), PullMin { combining: 512 << 10, plain: 512 << 10 });
        assert_eq!(PullMin::built_in(CpuVendor::Other, 8), intel(&[]));
        // Set alone, the combining threshold also sets the placed one (half of it) ...
        for resolve in [intel, amd] {
            assert_eq!(
                resolve(&[("XCCL_PULL_BYTES", "96K")]),
                PullMin { combining: 96 << 10, plain: 48 << 10 }
            );
        }
        // ... and the placed one alone leaves the built-in combining one.
        assert_eq!(
            intel(&[("XCCL_PULL_PLAIN_BYTES", "2M")]),
            PullMin { combining: 64 << 10, plain: 2 << 20 }
        );
        assert_eq!(amd(&[("XCCL_PULL_PLAIN_BYTES", "2M")]), PullMin { combining: 1 << 20, plain: 2 << 20 });
        let pull = intel;
        assert_eq!(
            pull(&[("XCCL_PULL_BYTES", "off"), ("XCCL_PULL_PLAIN_BYTES", "8K")]),
            PullMin { combining: usize::MAX, plain: 8 << 10 }
        );
        assert_eq!(pull(&[("XCCL_PULL_PLAIN_BYTES", "off")]).plain, usize::MAX);
        let e = with(&[("XCCL_PULL_PLAIN_BYTES", "lots")]).unwrap_err().to_string();
        assert!(e.contains("XCCL_PULL_PLAIN_BYTES"), "{e}");
        // A tuning file's measured thresholds, which the settings override.
        let file = std::env::temp_dir().join(format!("xccl-pull-{}.tune", std::process::id()));
        std::fs::write(&file, "pull 4M off\n").unwrap();
        let path = file.to_string_lossy().into_owned();
        for resolve in [intel, amd] {
            assert_eq!(
                resolve(&[("XCCL_TUNE_FILE", &path)]),
                PullMin { combining: 4 << 20, plain: usize::MAX }
            );
        }
        // A line measured for hosts of 4 ranks holds there only.
        std::fs::write(&file, "pull 2M 256K ranks=4\n").unwrap();
        assert_eq!(amd(&[("XCCL_TUNE_FILE", &path)]), PullMin { combining: 2 << 20, plain: 256 << 10 });
        assert_eq!(intel(&[("XCCL_TUNE_FILE", &path)]), intel(&[]));
        std::fs::write(&file, "pull 4M off\n").unwrap();
        assert_eq!(
            pull(&[("XCCL_TUNE_FILE", &path), ("XCCL_PULL_PLAIN_BYTES", "1M")]),
            PullMin { combining: 4 << 20, plain: 1 << 20 }
        );
        std::fs::remove_file(&file).unwrap();
    }
}
