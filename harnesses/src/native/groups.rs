//! The process groups of one rank (tp, dp, ep, edp, embedding, world) and their collectives, as
//! the model code sees them ([`GroupOps`]), in the case's reduce dtype.

use shardfuzz_kernels::DType;

use super::comm::{Comm, Group, ReduceOp};
use super::plan::Plan;
use crate::case::Axis;
use crate::model::{Bug, CResult, CommFailure, GroupOps};

pub struct GroupHandle<'a> {
    comm: &'a Comm,
    group: Group,
    index: usize,
    size: usize,
    dtype: DType,
    lose_remainder: bool,
}

fn fail(e: impl std::fmt::Display) -> CommFailure {
    CommFailure(e.to_string())
}

impl<'a> GroupHandle<'a> {
    fn new(comm: &'a Comm, name: &str, ranks: Vec<usize>, dtype: DType, lose_remainder: bool) -> Self {
        let index = ranks.iter().position(|&r| r == comm.rank()).expect("rank is in its own group");
        let size = ranks.len();
        GroupHandle { comm, group: comm.group(name, ranks), index, size, dtype, lose_remainder }
    }

    fn reduce(&self, buf: &mut [f64], op: ReduceOp) -> CResult<()> {
        self.reduce_in(buf, op, self.dtype)
    }

    fn reduce_in(&self, buf: &mut [f64], op: ReduceOp, dtype: DType) -> CResult<()> {
        if self.size == 1 {
            return Ok(());
        }
        let rem = buf.len() % self.size;
        let kept: Vec<f64> = if self.lose_remainder && rem != 0 && self.size >= 3 { buf[buf.len() - rem..].to_vec() } else { vec![] };
        self.comm.all_reduce(&self.group, buf, op, dtype).map_err(fail)?;
        if !kept.is_empty() {
            // The injected fault: the remainder chunk never went around the ring.
            let n = buf.len();
            buf[n - rem..].copy_from_slice(&kept);
        }
        Ok(())
    }
}

impl GroupOps for GroupHandle<'_> {
    fn size(&self) -> usize {
        self.size
    }
    fn index(&self) -> usize {
        self.index
    }
    fn all_reduce_sum(&self, buf: &mut [f64]) -> CResult<()> {
        self.reduce(buf, ReduceOp::Sum)
    }
    fn all_reduce_sum_in(&self, buf: &mut [f64], dtype: DType) -> CResult<()> {
        self.reduce_in(buf, ReduceOp::Sum, dtype)
    }
    fn all_reduce_max(&self, buf: &mut [f64]) -> CResult<()> {
        self.reduce(buf, ReduceOp::Max)
    }
    fn all_gather(&self, local: &[f64]) -> CResult<Vec<Vec<f64>>> {
        if self.size == 1 {
            return Ok(vec![local.to_vec()]);
        }
        self.comm.all_gather(&self.group, local).map_err(fail)
    }
    fn reduce_scatter(&self, input: &[f64], counts: &[usize]) -> CResult<Vec<f64>> {
        if self.size == 1 {
            return Ok(input.to_vec());
        }
        self.comm.reduce_scatter(&self.group, input, counts, ReduceOp::Sum, self.dtype).map_err(fail)
    }
    fn all_to_all(&self, send: Vec<Vec<f64>>) -> CResult<Vec<Vec<f64>>> {
        if self.size == 1 {
            return Ok(send);
        }
        self.comm.all_to_all(&self.group, send).map_err(fail)
    }
}

/// Every group a rank belongs to.
pub struct Groups<'a> {
    comm: &'a Comm,
    pub tp: GroupHandle<'a>,
    pub dp: GroupHandle<'a>,
    /// Expert-parallel: `ep` consecutive data-parallel positions.
    pub ep: GroupHandle<'a>,
    /// Expert-data-parallel: data-parallel positions holding the same experts.
    pub edp: GroupHandle<'a>,
    /// First and last pipeline stage (tied embeddings).
    pub embedding: Option<GroupHandle<'a>>,
    pub world: GroupHandle<'a>,
}

impl<'a> Groups<'a> {
    pub fn new(plan: &Plan, comm: &'a Comm) -> Groups<'a> {
        let rank = comm.rank();
        let mesh = &plan.mesh;
        let dt = plan.case.train.reduce_dtype();
        let lose = plan.bug(Bug::RingRemainderLost);
        let dp_ranks = mesh.group(rank, Axis::Dp);
        let d = mesh.coord(rank, Axis::Dp);
        let ep = plan.ep;
        let ep_ranks: Vec<usize> = dp_ranks[(d / ep) * ep..(d / ep + 1) * ep].to_vec();
        let edp_ranks: Vec<usize> = dp_ranks.iter().enumerate().filter(|(i, _)| i % ep == d % ep).map(|(_, &r)| r).collect();
        let last = plan.pp - 1;
        let mut emb = vec![mesh.with_coord(rank, Axis::Pp, 0), mesh.with_coord(rank, Axis::Pp, last)];
        emb.dedup();
        let embedding = emb.contains(&rank).then(|| GroupHandle::new(comm, "embedding", emb, dt, lose));
        Groups {
            comm,
            tp: GroupHandle::new(comm, "tp", mesh.group(rank, Axis::Tp), dt, lose),
            dp: GroupHandle::new(comm, "dp", dp_ranks, dt, lose),
            ep: GroupHandle::new(comm, "ep", ep_ranks, dt, lose),
            edp: GroupHandle::new(comm, "edp", edp_ranks, dt, lose),
            embedding,
            world: GroupHandle::new(comm, "world", (0..plan.world).collect(), plan.case.train.dtype.accum(), false),
        }
    }

    pub fn send(&self, dst: usize, tag: u64, data: Vec<f64>) -> CResult<()> {
        self.comm.send(dst, tag, data).map_err(fail)
    }

    pub fn recv(&self, src: usize, tag: u64) -> CResult<Vec<f64>> {
        self.comm.recv(src, tag).map_err(fail)
    }
}
