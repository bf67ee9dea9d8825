//! Shape helpers of the `Emitter` shared by the ops' emission: explicit broadcasting (the op
//! table's shape rules broadcast implicitly, numpy style; StableHLO wants every operand at the
//! result's shape), reshapes, splats shaped like a value, and run-time shapes for dimensions
//! that are unknown (`DYN`) when the graph is traced.
//!
//! Static shapes use `broadcast_in_dim` / `reshape`. A `DYN` dimension takes its size at run
//! time from an operand that has it unknown too (`get_dimension_size`) and goes through
//! `dynamic_broadcast_in_dim`, which assumes such a dimension is not 1 at run time. Reshapes
//! to unknown shapes are `Compile` errors: IREE does not legalize `dynamic_reshape`.

use super::emitter::{Emitter, MlirValue, TypeText};
use crate::dtype::DType;
use crate::error::Result;
use crate::shape::{ShapeDisplay, TensorType, DYN};

impl Emitter {
    /// Every operand broadcast (numpy rules: trailing dimensions aligned) to `shape`, keeping
    /// its dtype. `DYN` dimensions of `shape` are read from the operands at run time.
    pub fn broadcast_operands(
        &mut self,
        operands: &[MlirValue],
        shape: &[usize],
    ) -> Result<Vec<MlirValue>> {
        operands
            .iter()
            .map(|x| self.broadcast_to(x, shape, operands))
            .collect()
    }

    /// `x` broadcast to `shape` (numpy rules); `DYN` dimensions of `shape` get their size at
    /// run time from the `sources` that have an unknown dimension there.
    pub fn broadcast_to(
        &mut self,
        x: &MlirValue,
        shape: &[usize],
        sources: &[MlirValue],
    ) -> Result<MlirValue> {
        if x.ty.shape.as_slice() == shape {
            return Ok(x.clone());
        }
        let (rank, own) = (shape.len(), x.ty.ndim());
        if own > rank {
            return Err(self.bug(format!(
                "cannot broadcast {} to rank {rank}",
                TypeText(&x.ty)
            )));
        }
        let dims: Vec<usize> = (rank - own..rank).collect();
        // Each unknown dimension: every source that has one there (trailing-aligned).
        let known: Vec<Vec<(MlirValue, usize)>> = (0..rank)
            .map(|d| {
                sources
                    .iter()
                    .filter(|s| s.ty.ndim() + d >= rank)
                    .map(|s| (s.clone(), s.ty.ndim() + d - rank))
                    .filter(|(s, i)| s.ty.shape[*i] == DYN)
                    .collect()
            })
            .collect();
        self.broadcast_in_dim(x, &dims, shape, &known)
    }

    /// `broadcast_in_dim`: dimension `i` of `x` becomes dimension `dims[i]` of the result of
    /// `shape`. An unknown (`DYN`) dimension `d` of `shape` has at run time the size of the
    /// first of `known[d]` (values and their dimension), via `dynamic_broadcast_in_dim`.
    pub fn broadcast_in_dim(
        &mut self,
        x: &MlirValue,
        dims: &[usize],
        shape: &[usize],
        known: &[Vec<(MlirValue, usize)>],
    ) -> Result<MlirValue> {
        let ty = TensorType::new(x.ty.dtype, shape);
        if !shape.contains(&DYN) {
            let body = format!(
                "stablehlo.broadcast_in_dim {x}, dims = {dims:?} : ({}) -> {}",
                TypeText(&x.ty),
                TypeText(&ty)
            );
            return Ok(self.op(&body, &ty));
        }
        let sizes = self.shape_tensor(shape, known)?;
        // IREE lowers dynamic_broadcast_in_dim only when it knows, per operand dimension,
        // whether it expands: a static 1 going to another size does; every other dimension,
        // unknown ones included, is taken not to (an unknown size that is 1 at run time does
        // not broadcast in compiled code).
        let (mut expanding, mut kept) = (Vec::new(), Vec::new());
        for (i, &d) in dims.iter().enumerate() {
            if x.ty.shape[i] == 1 && shape[d] != 1 {
                expanding.push(i);
            } else {
                kept.push(i);
            }
        }
        let body = format!(
            "stablehlo.dynamic_broadcast_in_dim {x}, {sizes}, dims = {dims:?} {{\
             known_expanding_dimensions = {}, known_nonexpanding_dimensions = {}}} : ({}, {}) -> {}",
            i64_array(&expanding),
            i64_array(&kept),
            TypeText(&x.ty),
            TypeText(&sizes.ty),
            TypeText(&ty)
        );
        Ok(self.op(&body, &ty))
    }

    /// A tensor shaped like `like` (at run time, when it has unknown dimensions), every element
    /// `value` in `like`'s dtype.
    pub fn splat_like(&mut self, like: &MlirValue, value: f64) -> Result<MlirValue> {
        if !like.ty.shape.contains(&DYN) {
            return self.splat(like.ty.dtype, &like.ty.shape, value);
        }
        let s = self.scalar(like.ty.dtype, value);
        self.broadcast_to(&s, &like.ty.shape, std::slice::from_ref(like))
    }

    /// `x` with the same elements in the static `shape`. Reshapes to unknown sizes have no form
    /// here: IREE does not legalize `stablehlo.dynamic_reshape`.
    pub fn reshape(&mut self, x: &MlirValue, shape: &[usize]) -> Result<MlirValue> {
        let ty = TensorType::new(x.ty.dtype, shape);
        if x.ty == ty {
            return Ok(x.clone());
        }
        if shape.contains(&DYN) {
            return Err(self.unsupported(format!(
                "reshape to a shape with unknown dimensions {} has no StableHLO form in the \
                 MLIR emitter (the sizes are not known when compiling)",
                ShapeDisplay(shape)
            )));
        }
        let body = format!(
            "stablehlo.reshape {x} : ({}) -> {}",
            TypeText(&x.ty),
            TypeText(&ty)
        );
        Ok(self.op(&body, &ty))
    }

    /// A `tensor<rank x i32>` of `shape`: static dimensions as constants, each unknown one `d`
    /// the run-time size of the first of `known[d]`.
    fn shape_tensor(
        &mut self,
        shape: &[usize],
        known: &[Vec<(MlirValue, usize)>],
    ) -> Result<MlirValue> {
        let mut pieces = Vec::with_capacity(shape.len());
        for (d, &size) in shape.iter().enumerate() {
            if size != DYN {
                pieces.push(self.size_constant(size));
                continue;
            }
            match known.get(d).and_then(|k| k.first()) {
                Some((s, i)) => pieces.push(self.dim_size(s, *i)),
                None => {
                    return Err(self.unsupported(format!(
                        "dimension {d} of {} is unknown and no operand gives its size",
                        ShapeDisplay(shape)
                    )))
                }
            }
        }
        Ok(self.concat_sizes(&pieces))
    }

    /// Dimension `d` of `x` at run time, as a `tensor<1xi32>`.
    fn dim_size(&mut self, x: &MlirValue, d: usize) -> MlirValue {
        let scalar = TensorType::scalar(DType::I32);
        let body = format!(
            "stablehlo.get_dimension_size {x}, dim = {d} : ({}) -> {}",
            TypeText(&x.ty),
            TypeText(&scalar)
        );
        let n = self.op(&body, &scalar);
        let one = TensorType::new(DType::I32, &[1]);
        let body = format!(
            "stablehlo.reshape {n} : ({}) -> {}",
            TypeText(&scalar),
            TypeText(&one)
        );
        self.op(&body, &one)
    }

    fn size_constant(&mut self, n: usize) -> MlirValue {
        let one = TensorType::new(DType::I32, &[1]);
        self.op(
            &format!("stablehlo.constant dense<{n}> : {}", TypeText(&one)),
            &one,
        )
    }

    /// `tensor<1xi32>` pieces joined into one `tensor<n x i32>`.
    fn concat_sizes(&mut self, pieces: &[MlirValue]) -> MlirValue {
        if let [one] = pieces {
            return one.clone();
        }
        let ty = TensorType::new(DType::I32, &[pieces.len()]);
        let names: Vec<&str> = pieces.iter().map(|p| p.name.as_str()).collect();
        let types: Vec<String> = pieces.iter().map(|p| TypeText(&p.ty).to_string()).collect();
        let body = format!(
            "stablehlo.concatenate {}, dim = 0 : ({}) -> {}",
            names.join(", "),
            types.join(", "),
            TypeText(&ty)
        );
        self.op(&body, &ty)
    }

    /// `stablehlo.reduce` of `x` over `axes` with the binary op `combine` (e.g.
    /// `stablehlo.add`) starting from `init`; the result has the reduced shape (no kept axes).
    pub fn reduce(
        &mut self,
        x: &MlirValue,
        axes: &[usize],
        combine: &str,
        init: f64,
    ) -> Result<MlirValue> {
        let dtype = x.ty.dtype;
        let init = self.scalar(dtype, init);
        let shape: Vec<usize> = (0..x.ty.ndim())
            .filter(|d| !axes.contains(d))
            .map(|d| x.ty.shape[d])
            .collect();
        let ty = TensorType::new(dtype, &shape);
        let scalar = TensorType::scalar(dtype);
        let name = self.fresh();
        let axes: Vec<String> = axes.iter().map(usize::to_string).collect();
        self.line(&format!(
            "{name} = stablehlo.reduce({x} init: {init}) across dimensions = [{}] : ({}, {}) -> {}",
            axes.join(", "),
            TypeText(&x.ty),
            TypeText(&scalar),
            TypeText(&ty)
        ));
        let (a, b) = (self.fresh(), self.fresh());
        let st = TypeText(&scalar).to_string();
        self.line(&format!(" reducer({a}: {st}, {b}: {st}) {{"));
        self.indent();
        let lhs = MlirValue {
            name: a,
            ty: scalar.clone(),
        };
        let rhs = MlirValue {
            name: b,
            ty: scalar,
        };
        let r = self.elementwise(combine, &[&lhs, &rhs], &lhs.ty);
        self.line(&format!("stablehlo.return {r} : {st}"));
        self.dedent();
        let loc = self.loc();
        self.line(&format!("}} {loc}"));
        Ok(MlirValue { name, ty })
    }
}

/// `array<i64: 1, 2>` (or `array<i64>` when empty).
pub fn i64_array(v: &[usize]) -> String {
    let items: Vec<String> = v.iter().map(usize::to_string).collect();
    if items.is_empty() {
        "array<i64>".to_string()
    } else {
        format!("array<i64: {}>", items.join(", "))
    }
}
