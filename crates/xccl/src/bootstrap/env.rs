//! Reading a rank's place in the job from the environment, in the conventions of existing
//! launchers: torchrun, Slurm's `srun`, Open MPI's `mpirun`, and our own `xccl run`.

use std::time::Duration;

use super::auth::Auth;
use super::host;
use crate::config::Config;
use crate::error::{Error, Result};

/// Where and how the ranks of a job meet.
#[derive(Clone, Debug)]
pub struct Rendezvous {
    /// This rank.
    pub rank: usize,
    /// Number of ranks.
    pub size: usize,
    /// This rank's index among the ranks of its host.
    pub local_rank: usize,
    /// `host:port` of the key-value store.
    pub store: String,
    /// Whether rank 0 serves the store itself (no launcher does).
    pub serve_store: bool,
    /// The store speaks PyTorch's protocol (torchrun's agent store): the prefix of the
    /// job's keys in it. `None`: the store is ours.
    pub c10d_prefix: Option<String>,
    /// The job's id and secret.
    pub auth: Auth,
    /// How long to wait for the other ranks to appear.
    pub timeout: Duration,
    /// This rank's host key: ranks with equal keys share memory (and use it). From the
    /// machine and its `/dev/shm`, or `XCCL_HOST_KEY` (to make ranks of one machine look like
    /// several hosts).
    pub host: String,
    /// Which launcher's variables were found (`xccl`, `torchrun`, `slurm`, `mpirun`).
    pub launcher: &'static str,
}

/// The first variable of `names` that is set, with its name.
fn first(lookup: &dyn Fn(&str) -> Option<String>, names: &[&'static str]) -> Option<(&'static str, String)> {
    names.iter().find_map(|n| lookup(n).map(|v| (*n, v.trim().to_string())))
}

fn number(lookup: &dyn Fn(&str) -> Option<String>, names: &[&'static str]) -> Result<Option<usize>> {
    match first(lookup, names) {
        None => Ok(None),
        Some((name, v)) => v
            .parse()
            .map(Some)
            .map_err(|_| Error::Config(format!("{name}='{v}' is not a non-negative integer"))),
    }
}

/// The first host of a Slurm host list such as `node[01-04,07],login2`.
pub fn first_slurm_host(list: &str) -> Option<String> {
    let first = list.split(',').next()?.trim();
    let Some((prefix, rest)) = first.split_once('[') else {
        return (!first.is_empty()).then(|| first.to_string());
    };
    let range = rest.split([',', ']']).next()?;
    let start = range.split('-').next()?;
    Some(format!("{prefix}{start}"))
}

/// A port derived from a job id, for launchers that set no port.
fn port_for(job: &str) -> u16 {
    let h =
        job.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    20000 + (h % 20000) as u16
}

impl Rendezvous {
    /// Rank `rank` of `size` in job `auth`, meeting through a store the program brings
    /// ([`Communicator::connect_with_store`](crate::Communicator::connect_with_store)):
    /// this machine's host key (or `XCCL_HOST_KEY`), `timeout` to find the others.
    pub fn for_store(rank: usize, size: usize, auth: Auth, timeout: Duration) -> Result<Rendezvous> {
        if size == 0 || rank >= size {
            return Err(Error::Config(format!("rank {rank} is outside a world of {size} ranks")));
        }
        let host = std::env::var("XCCL_HOST_KEY").map_or_else(|_| host::host_key(), |k| host::clean_key(&k));
        Ok(Rendezvous {
            rank,
            size,
            local_rank: 0,
            store: String::new(),
            serve_store: false,
            c10d_prefix: None,
            auth,
            timeout,
            host,
            launcher: "store",
        })
    }

    /// Reads this process's environment.
    pub fn from_env() -> Result<Rendezvous> {
        Rendezvous::from_lookup(&|k| std::env::var(k).ok())
    }

    /// Reads the variables that `lookup` finds (for tests and embedding).
    pub fn from_lookup(lookup: &dyn Fn(&str) -> Option<String>) -> Result<Rendezvous> {
        let launcher = if lookup("XCCL_STORE_ADDR").is_some() {
            "xccl"
        } else if lookup("RANK").is_some() {
            "torchrun"
        } else if lookup("SLURM_PROCID").is_some() {
            "slurm"
        } else if lookup("OMPI_COMM_WORLD_RANK").is_some() {
            "mpirun"
        } else {
            "none"
        };
        let rank = number(lookup, &["XCCL_RANK", "RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"])?
            .ok_or_else(|| {
                Error::Config(
                    "this process's rank is unknown: set RANK and WORLD_SIZE (torchrun), run under srun (SLURM_PROCID) \
                     or mpirun (OMPI_COMM_WORLD_RANK), or launch with `xccl run`"
                        .into(),
                )
            })?;
        let size = number(
            lookup,
            &["XCCL_WORLD_SIZE", "WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"],
        )?
        .ok_or_else(|| Error::Config("the number of ranks is unknown: set WORLD_SIZE".into()))?;
        if size == 0 || rank >= size {
            return Err(Error::Config(format!("rank {rank} is outside a world of {size} ranks")));
        }
        let local_rank = number(
            lookup,
            &[
                "XCCL_LOCAL_RANK",
                "LOCAL_RANK",
                "SLURM_LOCALID",
                "OMPI_COMM_WORLD_LOCAL_RANK",
                "MPI_LOCALRANKID",
            ],
        )?
        .unwrap_or(0);
        let mut job =
            first(lookup, &["XCCL_JOB_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "OMPI_MCA_ess_base_jobid"])
                .map(|(_, v)| v);
        // torchrun's agent serves a store of its own and keeps it across restarts: every
        // rank joins it, and an attempt's keys (and links) are its own.
        let agent_store = launcher == "torchrun"
            && lookup("TORCHELASTIC_USE_AGENT_STORE").is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
        let c10d_prefix = agent_store.then(|| {
            let run = lookup("TORCHELASTIC_RUN_ID").unwrap_or_else(|| "none".into());
            let attempt = lookup("TORCHELASTIC_RESTART_COUNT").unwrap_or_else(|| "0".into());
            job = Some(format!("{run}-attempt{attempt}"));
            format!("xccl/{run}/{attempt}/")
        });

        let all_local = number(lookup, &["OMPI_COMM_WORLD_LOCAL_SIZE"])?.is_some_and(|l| l == size);
        let (store, serve_store) = match lookup("XCCL_STORE_ADDR") {
            Some(a) => (a, false),
            None => {
                let host = match first(lookup, &["XCCL_MASTER_ADDR", "MASTER_ADDR"]) {
                    Some((_, h)) => h,
                    None => match first(lookup, &["SLURM_JOB_NODELIST", "SLURM_NODELIST"])
                        .and_then(|(_, l)| first_slurm_host(&l))
                    {
                        Some(h) => h,
                        None if all_local || size == 1 => "127.0.0.1".to_string(),
                        None => {
                            return Err(Error::Config(
                                "MASTER_ADDR is not set: set it (and MASTER_PORT) to the host of rank 0 on every rank"
                                    .into(),
                            ));
                        }
                    },
                };
                let port = match number(lookup, &["XCCL_MASTER_PORT", "MASTER_PORT"])? {
                    Some(p) => u16::try_from(p)
                        .map_err(|_| Error::Config(format!("MASTER_PORT={p} is not a port")))?,
                    None => job.as_deref().map_or(29500, port_for),
                };
                (format!("{host}:{port}"), c10d_prefix.is_none())
            }
        };
        let job = job.unwrap_or_else(|| format!("static-{store}"));
        let secret = lookup("XCCL_SECRET").unwrap_or_default();
        let timeout = Config::from_lookup(|k| lookup(k))?.timeout;
        let host = lookup("XCCL_HOST_KEY").map_or_else(host::host_key, |k| host::clean_key(&k));
        Ok(Rendezvous {
            rank,
            size,
            local_rank,
            store,
            serve_store,
            c10d_prefix,
            auth: Auth::new(job, secret.into_bytes())?,
            timeout,
            host,
            launcher,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Result<Rendezvous> {
        let pairs: Vec<(String, String)> =
            pairs.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
        Rendezvous::from_lookup(&move |k| pairs.iter().find(|(a, _)| a == k).map(|(_, b)| b.clone()))
    }

    #[test]
    fn torchrun_static_rendezvous() {
        let r = env(&[
            ("RANK", "3"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_RANK", "1"),
            ("MASTER_ADDR", "10.0.0.5"),
            ("MASTER_PORT", "29400"),
        ])
        .unwrap();
        assert_eq!((r.rank, r.size, r.local_rank), (3, 4, 1));
        assert_eq!(r.store, "10.0.0.5:29400");
        assert!(r.serve_store);
        assert_eq!(r.launcher, "torchrun");
    }

    #[test]
    fn torchrun_agent_store_is_joined_under_a_prefix_of_the_attempt() {
        let vars = |attempt: &'static str| {
            env(&[
                ("RANK", "1"),
                ("WORLD_SIZE", "3"),
                ("MASTER_ADDR", "127.0.0.1"),
                ("MASTER_PORT", "29400"),
                ("TORCHELASTIC_USE_AGENT_STORE", "True"),
                ("TORCHELASTIC_RUN_ID", "r7"),
                ("TORCHELASTIC_RESTART_COUNT", attempt),
            ])
            .unwrap()
        };
        let (a, b) = (vars("0"), vars("1"));
        assert!(!a.serve_store, "rank 0 must not serve: the agent does");
        assert_eq!(a.store, "127.0.0.1:29400");
        assert_eq!(a.c10d_prefix.as_deref(), Some("xccl/r7/0/"));
        assert_eq!(b.c10d_prefix.as_deref(), Some("xccl/r7/1/"));
        assert_ne!(a.auth.job(), b.auth.job(), "a restarted attempt never links with the previous one");
        let own =
            env(&[("RANK", "0"), ("WORLD_SIZE", "1"), ("TORCHELASTIC_USE_AGENT_STORE", "False")]).unwrap();
        assert!(own.serve_store && own.c10d_prefix.is_none());
    }

    #[test]
    fn slurm_and_mpirun_conventions() {
        let r = env(&[
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_JOB_ID", "4242"),
            ("SLURM_JOB_NODELIST", "gpu[07-09,12],login"),
        ])
        .unwrap();
        assert_eq!((r.rank, r.size, r.local_rank), (5, 8, 1));
        assert!(r.store.starts_with("gpu07:"));
        assert_eq!(r.auth.job(), "4242");
        let m = env(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
            ("MASTER_PORT", "3000"),
        ])
        .unwrap();
        assert_eq!(m.store, "127.0.0.1:3000");
        assert_eq!(m.launcher, "mpirun");
    }

    #[test]
    fn our_launcher_serves_the_store() {
        let r = env(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("XCCL_STORE_ADDR", "127.0.0.1:5555"),
            ("XCCL_SECRET", "s"),
            ("XCCL_JOB_ID", "j1"),
            ("XCCL_RANK", "1"),
        ])
        .unwrap();
        assert_eq!(r.rank, 1, "XCCL_* overrides the generic variables");
        assert!(!r.serve_store);
        assert_eq!(r.launcher, "xccl");
    }

    #[test]
    fn bad_or_missing_values_say_what_to_set() {
        assert!(env(&[]).unwrap_err().to_string().contains("RANK"));
        assert!(env(&[("RANK", "0")]).unwrap_err().to_string().contains("WORLD_SIZE"));
        assert!(env(&[("RANK", "4"), ("WORLD_SIZE", "4")]).unwrap_err().to_string().contains("outside"));
        assert!(env(&[("RANK", "x"), ("WORLD_SIZE", "4")]).unwrap_err().to_string().contains("RANK='x'"));
        assert!(env(&[("RANK", "0"), ("WORLD_SIZE", "2")]).unwrap_err().to_string().contains("MASTER_ADDR"));
        assert!(
            env(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h"), ("MASTER_PORT", "70000")])
                .is_err()
        );
    }

    #[test]
    fn slurm_host_lists() {
        assert_eq!(first_slurm_host("node[001-004]").as_deref(), Some("node001"));
        assert_eq!(first_slurm_host("a,b").as_deref(), Some("a"));
        assert_eq!(first_slurm_host("x[3,5-6]").as_deref(), Some("x3"));
        assert_eq!(first_slurm_host(""), None);
    }
}
