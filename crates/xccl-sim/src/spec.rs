//! Topologies from their names on the command line: `NAME[:key=value,...]`, for example
//! `fat-tree:k=16,levels=3,over=2`, `torus:dims=16x16x16`, `dragonfly:a=8,p=4,h=4,routing=valiant`.
//!
//! Every shape takes `bw` (Gbit/s per link, default 100), `lat` (µs per link, default 0.5)
//! and, for dragonflies, `gbw` (Gbit/s of global links, default `bw`). `measured` is a star
//! whose links have the TCP constants of the cost model (`xccl tune fit`'s file).

use xccl::algo::tune::CostModel;

use crate::topology::Topology;

/// The topology `spec` names, with `hosts` hosts.
pub fn parse(spec: &str, hosts: usize, costs: &CostModel) -> Result<Topology, String> {
    let (name, rest) = spec.split_once(':').unwrap_or((spec, ""));
    let mut kv = std::collections::HashMap::new();
    for part in rest.split(',').filter(|p| !p.is_empty()) {
        let (k, v) = part.split_once('=').ok_or_else(|| format!("'{part}' in '{spec}' is not key=value"))?;
        kv.insert(k.trim(), v.trim());
    }
    let num = |k: &str, default: f64| -> Result<f64, String> {
        kv.get(k).map_or(Ok(default), |v| {
            v.parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && *x >= 0.0)
                .ok_or_else(|| format!("{k}={v}: not a number"))
        })
    };
    let int = |k: &str, default: usize| -> Result<usize, String> {
        kv.get(k)
            .map_or(Ok(default), |v| v.parse::<usize>().map_err(|_| format!("{k}={v}: not a whole number")))
    };
    let bw = num("bw", 100.0)? * 1e9 / 8.0;
    let lat = num("lat", 0.5)? * 1e-6;
    let gbw = num("gbw", bw * 8.0 / 1e9)? * 1e9 / 8.0;
    let valiant = match kv.get("routing").copied() {
        None | Some("minimal") => false,
        Some("valiant") => true,
        Some(r) => return Err(format!("routing={r}: minimal or valiant")),
    };
    if hosts == 0 {
        return Err("a topology needs at least one host".into());
    }
    let t = match name {
        "star" => Topology::star(hosts, bw, lat),
        "ring" => Topology::ring(hosts, bw, lat),
        "measured" => Topology::star(hosts, 1.0 / costs.tcp.beta, 0.0),
        "hypercube" => {
            if !hosts.is_power_of_two() {
                return Err(format!("a hypercube has a power of two of hosts, not {hosts}"));
            }
            Topology::hypercube(hosts.trailing_zeros(), bw, lat)
        }
        "torus" => {
            let dims: Vec<usize> = match kv.get("dims") {
                Some(d) => d
                    .split('x')
                    .map(|x| x.parse().map_err(|_| format!("dims={d}: like 8x8 or 4x4x4")))
                    .collect::<Result<_, _>>()?,
                None => square(hosts),
            };
            if dims.iter().product::<usize>() != hosts || !(2..=3).contains(&dims.len()) {
                return Err(format!("torus dims {dims:?} must be 2 or 3 numbers whose product is {hosts}"));
            }
            Topology::torus(&dims, bw, lat)
        }
        "fat-tree" => {
            let levels = int("levels", 3)? as u32;
            let k = match kv.get("k") {
                Some(_) => int("k", 0)?,
                // The smallest even k that holds the hosts.
                None => (2..)
                    .step_by(2)
                    .find(|&k| if levels == 2 { k * k / 2 } else { k * k * k / 4 } >= hosts)
                    .unwrap_or(2),
            };
            Topology::fat_tree(k, levels, num("over", 1.0)?.max(1.0), hosts, bw, lat)?
        }
        "dragonfly" => {
            let (a, p, h) = (int("a", 8)?, int("p", 4)?, int("h", 4)?);
            Topology::dragonfly(a, p, h, hosts, bw, gbw, lat, valiant)?
        }
        "dragonfly+" => {
            let (l, s, p, h) = (int("leaves", 8)?, int("spines", 8)?, int("p", 8)?, int("h", 4)?);
            Topology::dragonfly_plus(l, s, p, h, hosts, bw, gbw, lat, valiant)?
        }
        _ => {
            return Err(format!(
                "unknown topology '{name}': star, ring, torus, hypercube, fat-tree, dragonfly, dragonfly+, measured"
            ));
        }
    };
    Ok(t)
}

/// Two near-equal factors of `n`.
fn square(n: usize) -> Vec<usize> {
    let mut a = (n as f64).sqrt() as usize;
    while a > 1 && !n.is_multiple_of(a) {
        a -= 1;
    }
    vec![a.max(1), n / a.max(1)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_bad_ones_say_why() {
        let c = CostModel::default();
        assert_eq!(parse("torus", 64, &c).unwrap().name, "torus(8x8)");
        assert_eq!(parse("torus:dims=4x4x4", 64, &c).unwrap().name, "torus(4x4x4)");
        assert!(parse("fat-tree:levels=3", 4096, &c).unwrap().name.starts_with("fat-tree(k=26"));
        assert!(parse("dragonfly:a=8,p=4,h=4,routing=valiant", 1000, &c).unwrap().name.contains("valiant"));
        assert!(parse("hypercube", 12, &c).unwrap_err().contains("power of two"));
        assert!(parse("mesh", 4, &c).unwrap_err().contains("unknown topology"));
        assert!(parse("star:bw=fast", 4, &c).unwrap_err().contains("bw=fast"));
        let m = parse("measured", 4, &c).unwrap();
        assert!((m.links[0].bw - 1.0 / c.tcp.beta).abs() < 1.0);
    }
}
