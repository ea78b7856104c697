//! Joining a group through a store the program brings (PyTorch's store of a process group,
//! a C caller's callbacks): who may join, and where to listen.
//!
//! **Trust.** With `XCCL_SECRET` set, every rank proves that secret on every link, and a rank
//! with another secret is refused. Without it, rank 0 draws a random secret for the group and
//! puts it in the store beside the group's job id; the other ranks read it there. Joining
//! then needs the store: whoever can read the store (PyTorch's `TCPStore` has no
//! authentication) can join, exactly as whoever can reach it can already read and write every
//! rendezvous key of the job, so the store is the boundary of trust, as it is for Gloo. Each
//! group draws its own secret, so one group's links never admit a member of another.
//!
//! Rank 0 publishes which of the two modes it uses, so ranks that disagree (some with
//! `XCCL_SECRET`, some without) fail at once with an error that says so, rather than
//! waiting for a key nobody writes.

use std::net::{IpAddr, Ipv4Addr, ToSocketAddrs, UdpSocket};

use super::auth::Auth;
use super::keys::KeyValue;
use crate::error::{Error, Result};

/// The store key of the group's job id and mode (`<job> env` or `<job> drawn`).
const JOB: &str = "xccl/job";
/// The store key of the secret rank 0 drew (hex), in mode `drawn`.
const SECRET: &str = "xccl/secret";

/// `XCCL_SECRET` of this process, if set and not empty.
pub fn env_secret() -> Option<Vec<u8>> {
    std::env::var("XCCL_SECRET").ok().filter(|s| !s.is_empty()).map(String::into_bytes)
}

fn random_hex(bytes: usize) -> Result<String> {
    let mut b = vec![0u8; bytes];
    getrandom::fill(&mut b)
        .map_err(|e| Error::Config(format!("no randomness for the group's credentials: {e}")))?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// The credentials of rank `rank` of a group meeting in `store`: a job id that rank 0 draws
/// (so groups sharing a store never mix) and `secret` (this rank's `XCCL_SECRET`, from
/// [`env_secret`]) or, without one, a secret rank 0 draws and shares through the store.
pub fn store_auth(store: &mut dyn KeyValue, rank: usize, secret: Option<Vec<u8>>) -> Result<Auth> {
    if rank == 0 {
        let job = format!("grp-{}", random_hex(12)?);
        let secret = match secret {
            Some(s) => {
                store.set(JOB, format!("{job} env").as_bytes())?;
                s
            }
            None => {
                let drawn = random_hex(32)?;
                // The secret first: a rank that reads the job then finds it.
                store.set(SECRET, drawn.as_bytes())?;
                store.set(JOB, format!("{job} drawn").as_bytes())?;
                drawn.into_bytes()
            }
        };
        return Auth::new(job, secret);
    }
    let record = String::from_utf8_lossy(&store.get(JOB)?).into_owned();
    let (job, mode) = record
        .split_once(' ')
        .ok_or_else(|| Error::Bootstrap(format!("bad group record '{record}' in the store (key {JOB})")))?;
    match (mode, secret) {
        ("env", Some(s)) => Auth::new(job, s),
        ("drawn", None) => {
            let drawn = store.get(SECRET)?;
            Auth::new(job, drawn)
        }
        ("env", None) => Err(Error::Config(format!(
            "rank 0 of this group has XCCL_SECRET set and rank {rank} does not: set the same XCCL_SECRET on \
             every rank, or on none (the group then draws its own secret and shares it through its store)"
        ))),
        ("drawn", Some(_)) => Err(Error::Config(format!(
            "rank {rank} has XCCL_SECRET set and rank 0 of this group does not: set the same XCCL_SECRET on \
             every rank, or on none (the group then draws its own secret and shares it through its store)"
        ))),
        _ => Err(Error::Bootstrap(format!("bad group record '{record}' in the store (key {JOB})"))),
    }
}

/// The address this rank listens on for its peers: the one this host uses on the way to
/// `toward` (the store's host, which every rank reaches) when given; else the address of the
/// first network interface that is up and not loopback (NCCL's default), or of the first
/// whose name starts with `XCCL_SOCKET_IFNAME`; loopback if there is none. No packet is sent.
pub fn listen_ip(toward: Option<&str>) -> Result<IpAddr> {
    if let Some(host) = toward.filter(|h| !h.is_empty()) {
        let target = (host, 1)
            .to_socket_addrs()
            .map_err(|e| Error::Bootstrap(format!("cannot resolve the store's host '{host}': {e}")))?
            .next()
            .ok_or_else(|| Error::Bootstrap(format!("the store's host '{host}' resolves to no address")))?;
        if target.ip().is_loopback() {
            return Ok(target.ip());
        }
        let any: IpAddr = if target.is_ipv4() {
            Ipv4Addr::UNSPECIFIED.into()
        } else {
            std::net::Ipv6Addr::UNSPECIFIED.into()
        };
        // Connecting a UDP socket only picks the route and the source address.
        let probe =
            UdpSocket::bind((any, 0)).map_err(|e| Error::io("choosing the address to listen on", e))?;
        probe.connect(target).map_err(|e| Error::io(format!("finding the route to '{host}'"), e))?;
        return probe
            .local_addr()
            .map(|a| a.ip())
            .map_err(|e| Error::io("choosing the address to listen on", e));
    }
    let wanted = std::env::var("XCCL_SOCKET_IFNAME").ok().filter(|n| !n.is_empty());
    let found = interfaces()?;
    let pick = found.iter().find(|(name, ip)| match &wanted {
        Some(prefix) => name.starts_with(prefix.as_str()),
        None => !ip.is_loopback() && !name.starts_with("docker"),
    });
    match (pick, &wanted) {
        (Some((_, ip)), _) => Ok(*ip),
        (None, Some(prefix)) => Err(Error::Config(format!(
            "XCCL_SOCKET_IFNAME={prefix}: no interface that is up has a name starting so (interfaces: {})",
            found.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>().join(", ")
        ))),
        (None, None) => Ok(IpAddr::V4(Ipv4Addr::LOCALHOST)),
    }
}

/// The IPv4 addresses of this host's interfaces that are up, with the interfaces' names.
fn interfaces() -> Result<Vec<(String, IpAddr)>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list it allocated, freed below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(Error::io("listing network interfaces", std::io::Error::last_os_error()));
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, not yet freed.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        let up = ifa.ifa_flags & libc::IFF_UP as libc::c_uint != 0;
        if !up || ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: a non-NULL ifa_addr points to a sockaddr whose family says its type.
        if i32::from(unsafe { (*ifa.ifa_addr).sa_family }) != libc::AF_INET {
            continue;
        }
        // SAFETY: an AF_INET address is a sockaddr_in.
        let sin = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in>() };
        let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }.to_string_lossy().into_owned();
        out.push((name, IpAddr::V4(ip)));
    }
    // SAFETY: `head` came from getifaddrs and is freed once; no reference into it remains.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[derive(Default)]
    struct Map(HashMap<String, Vec<u8>>);

    impl KeyValue for Map {
        fn set(&mut self, key: &str, value: &[u8]) -> Result<()> {
            self.0.insert(key.to_string(), value.to_vec());
            Ok(())
        }
        fn get(&mut self, key: &str) -> Result<Vec<u8>> {
            self.0.get(key).cloned().ok_or_else(|| Error::Bootstrap(format!("{key} not set")))
        }
        fn add(&mut self, _key: &str, _delta: i64) -> Result<i64> {
            Err(Error::Internal("not used".into()))
        }
    }

    #[test]
    fn a_drawn_secret_is_shared_through_the_store_and_differs_per_group() {
        let mut store = Map::default();
        let zero = store_auth(&mut store, 0, None).unwrap();
        let one = store_auth(&mut store, 1, None).unwrap();
        assert!(zero.has_secret());
        assert_eq!(zero, one);
        let mut other = Map::default();
        let again = store_auth(&mut other, 0, None).unwrap();
        assert_ne!(zero, again, "two groups drew the same credentials");
    }

    #[test]
    fn the_environment_secret_is_used_and_never_stored() {
        let mut store = Map::default();
        let zero = store_auth(&mut store, 0, Some(b"s3cret".to_vec())).unwrap();
        let one = store_auth(&mut store, 1, Some(b"s3cret".to_vec())).unwrap();
        assert_eq!(zero, one);
        assert!(store.0.values().all(|v| !String::from_utf8_lossy(v).contains("s3cret")));
        // A rank with another secret gets other credentials (its links are then refused).
        let wrong = store_auth(&mut store, 1, Some(b"guess".to_vec())).unwrap();
        assert_ne!(zero, wrong);
    }

    #[test]
    fn ranks_that_disagree_on_having_a_secret_are_told() {
        let mut store = Map::default();
        store_auth(&mut store, 0, Some(b"s".to_vec())).unwrap();
        let e = store_auth(&mut store, 1, None).unwrap_err().to_string();
        assert!(e.contains("rank 0 of this group has XCCL_SECRET set and rank 1 does not"), "{e}");
        let mut store = Map::default();
        store_auth(&mut store, 0, None).unwrap();
        let e = store_auth(&mut store, 2, Some(b"s".to_vec())).unwrap_err().to_string();
        assert!(e.contains("rank 2 has XCCL_SECRET set and rank 0 of this group does not"), "{e}");
    }

    #[test]
    fn the_address_toward_loopback_is_loopback() {
        assert!(listen_ip(Some("127.0.0.1")).unwrap().is_loopback());
        listen_ip(None).unwrap();
    }
}
