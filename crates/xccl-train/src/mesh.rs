//! The device mesh: the world's ranks as a grid with one named axis per kind of
//! parallelism, and a communicator along each axis.
//!
//! Axes are listed outermost first; the last is innermost and varies fastest with the rank.
//! With `dp × tp` (tensor parallelism innermost) ranks `k·tp .. k·tp + tp − 1` form a
//! tensor-parallel group, so a group that talks in every layer stays inside a host when
//! hosts hold whole groups, and ranks `j, j + tp, j + 2·tp, …` form a data-parallel group.
//! The groups are made with [`Communicator::split`]. The full mesh of a training run is
//! `pp × dp × tp`: pipeline stages outermost, so that the neighbours of a pipeline, which
//! exchange only activations at stage boundaries, may sit on different hosts.
//!
//! Every communicator of a training run is made here: the axes' groups by [`Mesh::new`], and
//! groups of some of the ranks along one axis by [`Mesh::subgroup`] (a pipeline's pairs of
//! stages that share a parameter, a parameter server's push, pull and server groups).
//!
//! ```
//! use xccl::Communicator;
//! use xccl_train::mesh::{Axis, Mesh};
//!
//! # fn main() -> xccl_train::Result<()> {
//! let meshes = std::thread::scope(|s| {
//!     let ranks: Vec<_> = Communicator::local(4)?
//!         .into_iter()
//!         .map(|world| s.spawn(move || Mesh::new(&world, &[(Axis::Dp, 2), (Axis::Tp, 2)])))
//!         .collect();
//!     ranks.into_iter().map(|h| h.join().expect("rank panicked")).collect::<xccl_train::Result<Vec<_>>>()
//! })?;
//! // Rank 3 is at dp 1, tp 1: second in the tensor-parallel group {2, 3} and in the
//! // data-parallel group {1, 3}.
//! assert_eq!((meshes[3].coord(Axis::Dp), meshes[3].coord(Axis::Tp)), (1, 1));
//! assert_eq!(meshes[3].tp().size(), 2);
//! assert_eq!(meshes[3].dp().rank(), 1);
//! # Ok(())
//! # }
//! ```

use xccl::Communicator;

use crate::error::{Error, Result};

/// A kind of parallelism, one axis of the mesh.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Axis {
    /// Data parallelism: replicas of the model on different rows of the batch.
    Dp,
    /// Tensor parallelism: every layer divided over the group.
    Tp,
    /// Pipeline parallelism: consecutive blocks of the model on consecutive stages.
    Pp,
}

impl Axis {
    /// Every kind of axis.
    pub const ALL: [Axis; 3] = [Axis::Pp, Axis::Dp, Axis::Tp];

    /// The axis's command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Axis::Dp => "dp",
            Axis::Tp => "tp",
            Axis::Pp => "pp",
        }
    }
}

/// This rank's place in the mesh and the communicators along its axes.
#[derive(Clone, Debug)]
pub struct Mesh {
    world: Communicator,
    /// Axes, outermost first, with their sizes, this rank's coordinate and the group.
    axes: Vec<(Axis, usize, usize, Communicator)>,
}

impl Mesh {
    /// Arranges the ranks of `world` as a grid of `shape` (axes outermost first, each with
    /// its size; an axis left out has size 1). Checks, before any communication, that the
    /// sizes multiply to the world's size; then every rank splits the world once per axis
    /// (collective).
    pub fn new(world: &Communicator, shape: &[(Axis, usize)]) -> Result<Mesh> {
        let product: usize = shape.iter().map(|&(_, n)| n).product();
        let describe =
            || shape.iter().map(|(a, n)| format!("--{} {n}", a.name())).collect::<Vec<_>>().join(" × ");
        if shape.iter().any(|&(_, n)| n == 0) || product != world.size() {
            return Err(Error::config(format!(
                "the mesh {} has {product} ranks but the job has {}: the world size must be the \
                 product of the parallel sizes",
                describe(),
                world.size()
            )));
        }
        for (i, (a, _)) in shape.iter().enumerate() {
            if shape[..i].iter().any(|(b, _)| b == a) {
                return Err(Error::config(format!("the mesh names axis {} twice", a.name())));
            }
        }
        let mut shape = shape.to_vec();
        for axis in Axis::ALL {
            if !shape.iter().any(|&(a, _)| a == axis) {
                shape.push((axis, 1));
            }
        }
        let shape = &shape[..];
        // Coordinates: mixed radix, the last axis fastest.
        let mut coords = vec![0; shape.len()];
        let mut rest = world.rank();
        for (c, &(_, n)) in coords.iter_mut().zip(shape).rev() {
            *c = rest % n;
            rest /= n;
        }
        let mut axes = Vec::with_capacity(shape.len());
        for (i, &(axis, n)) in shape.iter().enumerate() {
            let group = world
                .split(Some(color_along(&coords, shape, i)?), key(coords[i])?)?
                .ok_or_else(|| Error::internal(format!("rank left out of its {} group", axis.name())))?;
            axes.push((axis, n, coords[i], group));
        }
        Ok(Mesh { world: world.clone(), axes })
    }

    /// The group of the ranks that differ from this one only along `axis` and whose
    /// coordinate on it is a `member`: led by the rank at coordinate `lead` (rank 0 in the
    /// group), then ordered by coordinate. `None` on a rank that is not a member. Collective
    /// over the world: every rank calls it, with the same arguments, in the same order.
    pub fn subgroup(
        &self,
        axis: Axis,
        member: &dyn Fn(usize) -> bool,
        lead: Option<usize>,
    ) -> Result<Option<Communicator>> {
        let coords: Vec<usize> = self.axes.iter().map(|a| a.2).collect();
        let shape: Vec<(Axis, usize)> = self.axes.iter().map(|a| (a.0, a.1)).collect();
        let i = self.axes.iter().position(|(a, ..)| *a == axis).unwrap_or_default();
        let c = coords[i];
        let color = member(c).then(|| color_along(&coords, &shape, i)).transpose()?;
        let key = if lead == Some(c) { -1 } else { key(c)? };
        Ok(self.world.split(color, key)?)
    }

    fn axis(&self, axis: Axis) -> &(Axis, usize, usize, Communicator) {
        // Mesh::new gives every axis a place (size 1 when not asked for).
        let i = self.axes.iter().position(|(a, ..)| *a == axis).unwrap_or_default();
        &self.axes[i]
    }

    /// The whole job.
    pub fn world(&self) -> &Communicator {
        &self.world
    }

    /// A new duplicate of the whole job's communicator, for work on a thread of its own
    /// (checkpoints written in the background), whose operations then never queue behind
    /// the training's or deadlock with them. Collective over the world.
    pub fn world_for_background(&self) -> Result<Communicator> {
        Ok(self.world.dup_with(self.world.config().clone())?)
    }

    /// The size of `axis`.
    pub fn size(&self, axis: Axis) -> usize {
        self.axis(axis).1
    }

    /// This rank's coordinate along `axis`.
    pub fn coord(&self, axis: Axis) -> usize {
        self.axis(axis).2
    }

    /// The communicator of the ranks that differ from this one only along `axis`, ordered by
    /// their coordinate on it.
    pub fn group(&self, axis: Axis) -> &Communicator {
        &self.axis(axis).3
    }

    /// The data-parallel group.
    pub fn dp(&self) -> &Communicator {
        self.group(Axis::Dp)
    }

    /// The tensor-parallel group.
    pub fn tp(&self) -> &Communicator {
        self.group(Axis::Tp)
    }

    /// The pipeline group: the stages of this rank's pipeline, in order.
    pub fn pp(&self) -> &Communicator {
        self.group(Axis::Pp)
    }
}

/// The color of the group along axis `i` of `shape` of the rank at `coords`: ranks that
/// agree on every other coordinate share it.
fn color_along(coords: &[usize], shape: &[(Axis, usize)], i: usize) -> Result<u32> {
    let color = coords
        .iter()
        .zip(shape)
        .enumerate()
        .filter(|&(j, _)| j != i)
        .fold(0usize, |acc, (_, (&c, &(_, m)))| acc * m + c);
    u32::try_from(color).map_err(|_| Error::config("the mesh is too large"))
}

/// A coordinate as a split key (the order within a group).
fn key(coord: usize) -> Result<i32> {
    i32::try_from(coord).map_err(|_| Error::config("the mesh is too large"))
}

impl std::fmt::Display for Mesh {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = self.axes.iter().map(|(a, n, ..)| format!("{} {n}", a.name())).collect();
        write!(f, "{}", parts.join(" × "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On `pp 2 × dp 2`, rank `r` at pp `r / 2`, dp `r % 2`: the members, order and lead of
    /// subgroups along each axis.
    #[test]
    fn subgroups_keep_the_other_coordinates_and_put_the_lead_first() {
        let groups = std::thread::scope(|s| {
            let ranks: Vec<_> = Communicator::local(4)
                .unwrap()
                .into_iter()
                .map(|world| {
                    s.spawn(move || -> Result<_> {
                        let mesh = Mesh::new(&world, &[(Axis::Pp, 2), (Axis::Dp, 2)])?;
                        let pair = mesh.subgroup(Axis::Pp, &|_| true, None)?;
                        let second = mesh.subgroup(Axis::Dp, &|c| c == 1, None)?;
                        let led = mesh.subgroup(Axis::Dp, &|_| true, Some(1))?;
                        let shape = |c: Option<Communicator>| c.map(|c| (c.rank(), c.size()));
                        Ok((shape(pair), shape(second), shape(led)))
                    })
                })
                .collect();
            ranks.into_iter().map(|h| h.join().unwrap().unwrap()).collect::<Vec<_>>()
        });
        for (r, (pair, second, led)) in groups.into_iter().enumerate() {
            let (pp, dp) = (r / 2, r % 2);
            assert_eq!(pair, Some((pp, 2)), "rank {r}: the stages of its pipeline");
            assert_eq!(second, (dp == 1).then_some((0, 1)), "rank {r}: only dp 1 is a member");
            assert_eq!(led, Some((1 - dp, 2)), "rank {r}: dp 1 leads");
        }
    }
}
