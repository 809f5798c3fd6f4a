//! Op-level cases on a single device: forward of one op, and the gradient of every float input for
//! the upstream gradient `grad_out` the inputs carry. Shapes are those of [`OpKind::inputs`].

use ndarray::{Array1, Axis};
use shardfuzz_kernels::{self as k, Prec};

use crate::case::{OpCase, OpKind};
use crate::inputs::Inputs;
use crate::model::Mat;
use crate::target::RunOutput;
use crate::tensor::Tensor;

const LN_EPS: f64 = 1e-5;

/// Shape of the op's output.
pub fn output_shape(op: &OpCase) -> Vec<usize> {
    let s: Vec<usize> = op.shape.iter().map(|&d| d as usize).collect();
    let dim = op.dim.unwrap_or(1) as usize;
    match op.kind {
        OpKind::Matmul | OpKind::Linear => vec![s[0], s[2]],
        OpKind::Sum | OpKind::Max => {
            if dim == 0 {
                vec![1, s[1]]
            } else {
                vec![s[0], 1]
            }
        }
        OpKind::Embedding => vec![s[0], s[2]],
        OpKind::CrossEntropy => vec![s[0], 1],
        OpKind::Reshape => op.new_shape.as_ref().map_or(s.clone(), |n| n.iter().map(|&d| d as usize).collect()),
        OpKind::Transpose => vec![s[1], s[0]],
        OpKind::Softmax | OpKind::Layernorm => s,
    }
}

fn input(inputs: &Inputs, name: &str) -> Result<Mat, String> {
    inputs.tensor(name).map(|t| t.to_mat()).ok_or_else(|| format!("input `{name}` missing"))
}

fn t(m: Mat) -> Tensor {
    Tensor::from_mat(m)
}

/// Reduction along `dim` of a matrix, keeping the dimension.
fn reduce(p: Prec, x: &Mat, dim: usize, max: bool) -> (Mat, Vec<usize>) {
    let xt = if dim == 0 { x.t().to_owned() } else { x.clone() };
    let acc = p.acc();
    let mut out = Mat::zeros((xt.nrows(), 1));
    let mut arg = vec![0; xt.nrows()];
    for (i, row) in xt.rows().into_iter().enumerate() {
        if max {
            let (j, v) = row.iter().enumerate().fold((0, f64::NEG_INFINITY), |b, (j, &v)| if v > b.1 { (j, v) } else { b });
            out[[i, 0]] = v;
            arg[i] = j;
        } else {
            out[[i, 0]] = p.r(row.iter().fold(0.0, |s, v| acc.round(s + v)));
        }
    }
    (if dim == 0 { out.t().to_owned() } else { out }, arg)
}

/// Runs the op on one device at precision `p`.
pub fn reference(op: &OpCase, inputs: &Inputs, p: Prec) -> Result<RunOutput, String> {
    let dtype = p.dtype;
    let r = |m: Mat| m.mapv(|x| dtype.round(x));
    let gout = r(input(inputs, "grad_out")?);
    let dim = op.dim.unwrap_or(1) as usize;
    let mut tensors: Vec<(String, Tensor)> = vec![];
    match op.kind {
        OpKind::Matmul => {
            let (a, b) = (r(input(inputs, "a")?), r(input(inputs, "b")?));
            tensors.push(("out".into(), t(k::matmul(p, &a, &b))));
            tensors.push(("grad/a".into(), t(k::matmul_nt(p, &gout, &b))));
            tensors.push(("grad/b".into(), t(k::matmul_tn(p, &a, &gout))));
        }
        OpKind::Linear => {
            let (x, w) = (r(input(inputs, "x")?), r(input(inputs, "w")?));
            let bias: Array1<f64> = r(input(inputs, "bias")?).row(0).to_owned();
            tensors.push(("out".into(), t(k::linear_fwd(p, &x, &w, Some(&bias)))));
            let g = k::linear_bwd(p, &x, &w, &gout);
            tensors.push(("grad/x".into(), t(g.dx)));
            tensors.push(("grad/w".into(), t(g.dw)));
            tensors.push(("grad/bias".into(), Tensor::new(vec![g.db.len()], g.db.to_vec())));
        }
        OpKind::Sum | OpKind::Max => tensors.extend(reduce_reference(p, &r(input(inputs, "x")?), &gout, dim, op.kind == OpKind::Max)),
        OpKind::Softmax => tensors.extend(softmax_reference(p, &r(input(inputs, "x")?), &gout, dim)),
        OpKind::Layernorm => {
            let x = r(input(inputs, "x")?);
            let w = r(input(inputs, "w")?).row(0).to_owned();
            let b = r(input(inputs, "bias")?).row(0).to_owned();
            tensors.extend(layernorm_reference(p, &x, &w, &b, &gout));
        }
        OpKind::Embedding => {
            let table = r(input(inputs, "table")?);
            tensors.push(("out".into(), t(k::embedding_fwd(p, &inputs.tokens, &table, 0))));
            tensors.push(("grad/table".into(), t(k::embedding_bwd(p, &inputs.tokens, &gout, table.nrows(), 0))));
        }
        OpKind::CrossEntropy => {
            let logits = r(input(inputs, "logits")?);
            let ce = k::cross_entropy_fwd_bwd(p, &logits, &inputs.targets, 1.0, k::LabelSmoothing::none());
            let out = ce.losses.clone().insert_axis(Axis(1));
            let dl = Mat::from_shape_fn(ce.dlogits.raw_dim(), |(i, j)| p.r(ce.dlogits[[i, j]] * gout[[i, 0]]));
            tensors.push(("out".into(), t(out)));
            tensors.push(("grad/logits".into(), t(dl)));
        }
        OpKind::Reshape => {
            let x = r(input(inputs, "x")?);
            let shape = output_shape(op);
            tensors.push(("out".into(), Tensor::new(shape, x.iter().copied().collect())));
            tensors.push(("grad/x".into(), Tensor::new(vec![x.nrows(), x.ncols()], gout.iter().copied().collect())));
        }
        OpKind::Transpose => {
            let x = r(input(inputs, "x")?);
            tensors.push(("out".into(), t(x.t().to_owned())));
            tensors.push(("grad/x".into(), t(gout.t().to_owned())));
        }
    }
    Ok(RunOutput { tensors, ..RunOutput::default() })
}

/// Sum or max over `dim` and its gradient (a max's goes to the first largest element).
fn reduce_reference(p: Prec, x: &Mat, gout: &Mat, dim: usize, max: bool) -> [(String, Tensor); 2] {
    let (out, arg) = reduce(p, x, dim, max);
    let mut dx = Mat::zeros(x.raw_dim());
    for i in 0..x.nrows() {
        for j in 0..x.ncols() {
            let (o, pos) = if dim == 0 { (j, i) } else { (i, j) };
            let g = if dim == 0 { gout[[0, j]] } else { gout[[i, 0]] };
            if !max || arg[o] == pos {
                dx[[i, j]] = g;
            }
        }
    }
    [("out".into(), t(out)), ("grad/x".into(), t(dx))]
}

/// Softmax over `dim` and its gradient.
fn softmax_reference(p: Prec, x: &Mat, gout: &Mat, dim: usize) -> [(String, Tensor); 2] {
    let tr = |m: &Mat| if dim == 0 { m.t().to_owned() } else { m.clone() };
    let y = k::softmax_rows(p, &tr(x));
    let dx = k::softmax_rows_bwd(p, &y, &tr(gout));
    [("out".into(), t(tr(&y))), ("grad/x".into(), t(tr(&dx)))]
}

/// LayerNorm over rows and the gradients of its input, weight and bias.
fn layernorm_reference(p: Prec, x: &Mat, w: &Array1<f64>, b: &Array1<f64>, gout: &Mat) -> [(String, Tensor); 4] {
    let (y, cache) = k::layernorm_fwd(p, x, w, Some(b), LN_EPS);
    let g = k::layernorm_bwd(p, x, w, &cache, gout);
    let db = g.db.unwrap_or_else(|| Array1::zeros(w.len()));
    [
        ("out".into(), t(y)),
        ("grad/x".into(), t(g.dx)),
        ("grad/w".into(), Tensor::new(vec![g.dw.len()], g.dw.to_vec())),
        ("grad/bias".into(), Tensor::new(vec![db.len()], db.to_vec())),
    ]
}
