//! A plain named tensor: shape plus row-major f64 data (values exactly representable in the case dtype).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: Vec<f64>,
}

impl Tensor {
    pub fn new(shape: Vec<usize>, data: Vec<f64>) -> Tensor {
        assert_eq!(shape.iter().product::<usize>(), data.len(), "tensor data does not match shape {shape:?}");
        Tensor { shape, data }
    }

    pub fn zeros(shape: Vec<usize>) -> Tensor {
        let n = shape.iter().product();
        Tensor { shape, data: vec![0.0; n] }
    }

    pub fn scalar(x: f64) -> Tensor {
        Tensor { shape: vec![], data: vec![x] }
    }

    pub fn numel(&self) -> usize {
        self.data.len()
    }

    /// The tensor as a matrix: 1-D tensors become one row, 3-D ones stack their leading dims.
    pub fn to_mat(&self) -> ndarray::Array2<f64> {
        let cols = *self.shape.last().unwrap_or(&1);
        let rows = if self.shape.len() <= 1 { 1 } else { self.shape[..self.shape.len() - 1].iter().product() };
        ndarray::Array2::from_shape_vec((rows, cols), self.data.clone()).expect("shape checked at construction")
    }

    pub fn from_mat(m: ndarray::Array2<f64>) -> Tensor {
        let shape = vec![m.nrows(), m.ncols()];
        Tensor::new(shape, into_vec(m))
    }

    pub fn to_vec1(&self) -> ndarray::Array1<f64> {
        ndarray::Array1::from_vec(self.data.clone())
    }

    pub fn max_abs(&self) -> f64 {
        self.data.iter().fold(0.0, |m, x| m.max(x.abs()))
    }

    pub fn all_finite(&self) -> bool {
        self.data.iter().all(|x| x.is_finite())
    }
}

/// The elements of a standard-layout array, without a copy when possible.
pub fn into_vec(m: ndarray::Array2<f64>) -> Vec<f64> {
    if m.is_standard_layout() {
        m.into_raw_vec_and_offset().0
    } else {
        m.iter().copied().collect()
    }
}
