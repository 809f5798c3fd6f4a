//! Collectives built from point-to-point messages: ring all-reduce (reduce-scatter then
//! all-gather), ring reduce-scatter with uneven counts, ring all-gather of uneven pieces, direct
//! all-to-all and broadcast. Chunks of an all-reduce are a balanced split: sizes differ by at most one.

use std::ops::Range;

use shardfuzz_kernels::DType;

use super::world::{Comm, CommError, Group, Key, ReduceOp};

fn balanced(n: usize, parts: usize, i: usize) -> Range<usize> {
    let (q, r) = (n / parts, n % parts);
    let start = i * q + i.min(r);
    start..start + q + usize::from(i < r)
}

fn combine(op: ReduceOp, dtype: DType, acc: &mut [f64], x: &[f64]) {
    match op {
        ReduceOp::Sum => acc.iter_mut().zip(x).for_each(|(a, b)| *a = dtype.round(*a + b)),
        ReduceOp::Max => acc.iter_mut().zip(x).for_each(|(a, b)| *a = a.max(*b)),
    }
}

struct Ring<'a> {
    comm: &'a Comm,
    g: &'a Group,
    pos: usize,
    n: usize,
    seq: u64,
    kind: &'static str,
    total: usize,
}

impl<'a> Ring<'a> {
    fn new(comm: &'a Comm, g: &'a Group, kind: &'static str, total: usize) -> Ring<'a> {
        let pos =
            g.ranks.iter().position(|&r| r == comm.rank).unwrap_or_else(|| panic!("rank {} is not in group {}", comm.rank, g.label()));
        let seq = comm.next_seq(g, kind);
        if g.size() > 1 && total % g.size() != 0 {
            // Chunks of unequal length go around the ring.
            comm.note_path(&format!("ring:{kind}:uneven"));
        }
        Ring { comm, g, pos, n: g.size(), seq, kind, total }
    }

    fn key(&self, step: u32) -> Key {
        Key::Coll { group: self.g.id, seq: self.seq, step }
    }

    fn next(&self) -> usize {
        self.g.ranks[(self.pos + 1) % self.n]
    }

    fn prev(&self) -> usize {
        self.g.ranks[(self.pos + self.n - 1) % self.n]
    }

    fn member(&self, i: usize) -> usize {
        self.g.ranks[i % self.n]
    }

    /// Send to the next member, receive from the previous one.
    fn shift(&self, step: u32, data: Vec<f64>) -> Result<Vec<f64>, CommError> {
        self.comm.post(self.next(), self.key(step), self.kind, self.total, data);
        self.comm.take(self.prev(), self.key(step), self.kind, Some(self.total), self.g)
    }

    /// Exchange with an arbitrary member (direct algorithms).
    fn exchange_with(&self, peer: usize, step: u32, data: Vec<f64>) {
        self.comm.post(self.member(peer), self.key(step), self.kind, self.total, data);
    }

    fn recv_from(&self, peer: usize, step: u32) -> Result<Vec<f64>, CommError> {
        self.comm.take(self.member(peer), self.key(step), self.kind, Some(self.total), self.g)
    }

    fn m(&self, i: isize) -> usize {
        i.rem_euclid(self.n as isize) as usize
    }
}

impl Comm {
    /// Ring all-reduce in place; every member ends with bitwise identical values.
    pub fn all_reduce(&self, g: &Group, buf: &mut [f64], op: ReduceOp, dtype: DType) -> Result<(), CommError> {
        let ring = Ring::new(self, g, "all_reduce", buf.len());
        let n = ring.n;
        if n == 1 {
            return Ok(());
        }
        let len = buf.len();
        let chunk = |c: usize| balanced(len, n, c);
        let p = ring.pos as isize;
        for s in 0..n - 1 {
            let send = chunk(ring.m(p - s as isize));
            let recv = chunk(ring.m(p - s as isize - 1));
            let got = ring.shift(s as u32, buf[send].to_vec())?;
            combine(op, dtype, &mut buf[recv], &got);
        }
        for s in 0..n - 1 {
            let send = chunk(ring.m(p + 1 - s as isize));
            let recv = chunk(ring.m(p - s as isize));
            let got = ring.shift((n + s) as u32, buf[send].to_vec())?;
            buf[recv].copy_from_slice(&got);
        }
        Ok(())
    }

    /// Ring reduce-scatter: member i receives the reduction of chunk i (`counts[i]` elements).
    pub fn reduce_scatter(&self, g: &Group, input: &[f64], counts: &[usize], op: ReduceOp, dtype: DType) -> Result<Vec<f64>, CommError> {
        assert_eq!(counts.len(), g.size(), "reduce_scatter: {} counts for group {}", counts.len(), g.label());
        assert_eq!(counts.iter().sum::<usize>(), input.len(), "reduce_scatter: counts do not sum to the input length");
        let ring = Ring::new(self, g, "reduce_scatter", input.len());
        let n = ring.n;
        let starts: Vec<usize> = counts
            .iter()
            .scan(0, |s, &c| {
                let v = *s;
                *s += c;
                Some(v)
            })
            .collect();
        let chunk = |c: usize| starts[c]..starts[c] + counts[c];
        let mut buf = input.to_vec();
        let p = ring.pos as isize;
        for s in 0..n.saturating_sub(1) {
            let send = chunk(ring.m(p - s as isize - 1));
            let recv = chunk(ring.m(p - s as isize - 2));
            let got = ring.shift(s as u32, buf[send].to_vec())?;
            combine(op, dtype, &mut buf[recv], &got);
        }
        Ok(buf[chunk(ring.pos)].to_vec())
    }

    /// Ring all-gather of pieces of any (possibly different) lengths, indexed by group position.
    pub fn all_gather(&self, g: &Group, local: &[f64]) -> Result<Vec<Vec<f64>>, CommError> {
        let ring = Ring::new(self, g, "all_gather", 0);
        let n = ring.n;
        let mut pieces: Vec<Vec<f64>> = vec![vec![]; n];
        pieces[ring.pos] = local.to_vec();
        let p = ring.pos as isize;
        for s in 0..n.saturating_sub(1) {
            let send = ring.m(p - s as isize);
            let recv = ring.m(p - s as isize - 1);
            pieces[recv] = ring.shift(s as u32, pieces[send].clone())?;
        }
        Ok(pieces)
    }

    /// Every member sends `send[j]` to member j; returns what each member sent here.
    pub fn all_to_all(&self, g: &Group, send: Vec<Vec<f64>>) -> Result<Vec<Vec<f64>>, CommError> {
        assert_eq!(send.len(), g.size(), "all_to_all: {} buffers for group {}", send.len(), g.label());
        let ring = Ring::new(self, g, "all_to_all", 0);
        let mut out: Vec<Vec<f64>> = vec![vec![]; ring.n];
        for (j, data) in send.into_iter().enumerate() {
            if j == ring.pos {
                out[j] = data;
            } else {
                ring.exchange_with(j, 0, data);
            }
        }
        for (j, slot) in out.iter_mut().enumerate() {
            if j != ring.pos {
                *slot = ring.recv_from(j, 0)?;
            }
        }
        Ok(out)
    }

    /// The root's buffer to every member.
    pub fn broadcast(&self, g: &Group, buf: &mut Vec<f64>, root_pos: usize) -> Result<(), CommError> {
        let ring = Ring::new(self, g, "broadcast", 0);
        if ring.pos == root_pos {
            for j in (0..ring.n).filter(|&j| j != root_pos) {
                ring.exchange_with(j, 0, buf.clone());
            }
        } else {
            *buf = ring.recv_from(root_pos, 0)?;
        }
        Ok(())
    }

    pub fn barrier(&self, g: &Group) -> Result<(), CommError> {
        self.all_gather(g, &[]).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::super::world::{World, WorldOptions};
    use super::*;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    fn run_ranks<T: Send>(world: &Arc<World>, f: impl Fn(&Comm) -> T + Sync) -> Vec<T> {
        std::thread::scope(|s| {
            let hs: Vec<_> = (0..world.size())
                .map(|r| {
                    let f = &f;
                    s.spawn(move || {
                        let c = world.comm(r);
                        let out = f(&c);
                        c.finish();
                        out
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    fn value(rank: usize, i: usize) -> f64 {
        ((rank * 31 + i * 7) % 13) as f64 - 6.0 + rank as f64 * 0.25
    }

    #[test]
    fn all_reduce_is_exact_and_identical_for_every_world_size_and_length() {
        for n in 1..=8usize {
            for len in [0, 1, n.saturating_sub(1), n, n + 1, 37] {
                let w = World::new(n, WorldOptions::default());
                let out = run_ranks(&w, |c| {
                    let g = c.group("world", (0..n).collect());
                    let mut s: Vec<f64> = (0..len).map(|i| value(c.rank(), i)).collect();
                    let mut m = s.clone();
                    c.all_reduce(&g, &mut s, ReduceOp::Sum, DType::F64).unwrap();
                    c.all_reduce(&g, &mut m, ReduceOp::Max, DType::F64).unwrap();
                    (s, m)
                });
                for i in 0..len {
                    let sum: f64 = (0..n).map(|r| value(r, i)).sum();
                    let max = (0..n).map(|r| value(r, i)).fold(f64::NEG_INFINITY, f64::max);
                    assert_eq!(out[0].0[i], sum, "n={n} len={len}");
                    assert_eq!(out[0].1[i], max);
                }
                assert!(out.iter().all(|o| o == &out[0]), "ranks differ n={n} len={len}");
            }
        }
    }

    #[test]
    fn uneven_all_gather_reduce_scatter_and_all_to_all() {
        for n in 1..=8 {
            let w = World::new(n, WorldOptions::default());
            let out = run_ranks(&w, |c| {
                let g = c.group("world", (0..n).collect());
                let me = c.rank();
                let gathered = c.all_gather(&g, &vec![me as f64; me % 3]).unwrap();
                let counts: Vec<usize> = (0..n).map(|i| (i * 2 + 1) % 4).collect();
                let total: usize = counts.iter().sum();
                let input: Vec<f64> = (0..total).map(|i| value(me, i)).collect();
                let rs = c.reduce_scatter(&g, &input, &counts, ReduceOp::Sum, DType::F64).unwrap();
                let send: Vec<Vec<f64>> = (0..n).map(|j| vec![(me * 10 + j) as f64; (me + j) % 3]).collect();
                let a2a = c.all_to_all(&g, send).unwrap();
                let mut b = if me == n - 1 { vec![1.5, 2.5] } else { vec![] };
                c.broadcast(&g, &mut b, n - 1).unwrap();
                (gathered, rs, a2a, b, counts)
            });
            for (me, (gathered, rs, a2a, b, counts)) in out.iter().enumerate() {
                for (j, piece) in gathered.iter().enumerate() {
                    assert_eq!(piece, &vec![j as f64; j % 3]);
                }
                let start: usize = counts[..me].iter().sum();
                let expect: Vec<f64> = (start..start + counts[me]).map(|i| (0..n).map(|r| value(r, i)).sum()).collect();
                assert_eq!(rs, &expect, "n={n} member {me}");
                for (j, got) in a2a.iter().enumerate() {
                    assert_eq!(got, &vec![(j * 10 + me) as f64; (j + me) % 3]);
                }
                assert_eq!(b, &vec![1.5, 2.5]);
            }
        }
    }

    #[test]
    fn subgroups_of_a_mesh_interleave() {
        let w = World::new(4, WorldOptions::default());
        let out = run_ranks(&w, |c| {
            let me = c.rank();
            let row = c.group("row", vec![me / 2 * 2, me / 2 * 2 + 1]);
            let col = c.group("col", vec![me % 2, me % 2 + 2]);
            let mut a = vec![me as f64];
            let mut b = vec![me as f64];
            c.all_reduce(&row, &mut a, ReduceOp::Sum, DType::F64).unwrap();
            c.all_reduce(&col, &mut b, ReduceOp::Sum, DType::F64).unwrap();
            c.send((me + 1) % 4, 9, vec![me as f64]).unwrap();
            let r = c.recv((me + 3) % 4, 9).unwrap();
            (a[0], b[0], r[0])
        });
        assert_eq!(out, vec![(1.0, 2.0, 3.0), (1.0, 4.0, 0.0), (5.0, 2.0, 1.0), (5.0, 4.0, 2.0)]);
    }

    #[test]
    fn bf16_reduction_rounds_after_each_addition() {
        let w = World::new(3, WorldOptions::default());
        let out = run_ranks(&w, |c| {
            let g = c.group("world", vec![0, 1, 2]);
            let mut v = vec![if c.rank() == 0 { 256.0 } else { 1.0 }];
            c.all_reduce(&g, &mut v, ReduceOp::Sum, DType::BF16).unwrap();
            v[0]
        });
        assert!(out.iter().all(|&x| DType::BF16.round(x) == x && (x - 258.0).abs() <= 2.0));
    }

    #[test]
    fn a_rank_skipping_a_collective_is_a_deadlock_found_at_once() {
        let w = World::new(4, WorldOptions { timeout: Duration::from_secs(10) });
        let t = Instant::now();
        let out = run_ranks(&w, |c| {
            let g = c.group("tp", vec![0, 1, 2, 3]);
            let mut v = vec![1.0; 5];
            if c.rank() == 3 {
                return Ok(());
            }
            c.all_reduce(&g, &mut v, ReduceOp::Sum, DType::F32)
        });
        assert!(t.elapsed() < Duration::from_secs(1));
        assert!(out[3].is_ok());
        for (r, res) in out.iter().enumerate().take(3) {
            match res {
                Err(CommError::Deadlock { collective, group, .. }) => {
                    assert_eq!(collective, "all_reduce");
                    assert_eq!(group, "tp[0, 1, 2, 3]");
                }
                other => panic!("rank {r}: {other:?}"),
            }
        }
        assert_eq!(w.stuck().len(), 3);
    }

    #[test]
    fn mismatched_collectives_are_reported_not_hung() {
        let w = World::new(2, WorldOptions::default());
        let out = run_ranks(&w, |c| {
            let g = c.group("dp", vec![0, 1]);
            let mut v = vec![1.0; 3 + c.rank()];
            c.all_reduce(&g, &mut v, ReduceOp::Sum, DType::F64)
        });
        assert!(out.iter().any(|r| matches!(r, Err(CommError::Mismatch { .. }))), "{out:?}");
    }

    #[test]
    fn a_crashed_peer_is_reported_promptly() {
        let w = World::new(2, WorldOptions::default());
        let t = Instant::now();
        let out = run_ranks(&w, |c| {
            if c.rank() == 1 {
                w.mark_crashed(1, "boom");
                return Ok(vec![]);
            }
            c.recv(1, 5)
        });
        assert!(matches!(out[0], Err(CommError::PeerCrashed { peer: 1, .. })));
        assert!(t.elapsed() < Duration::from_secs(1));
    }
}
