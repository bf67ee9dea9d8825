//! Lane views, the values `vmap` gives the function it maps (`crate::batch` applies ops over
//! them): one lane's type, every lane's value.

use std::sync::Arc;

use super::Val;
use crate::error::{Error, Result};
use crate::shape::{TensorType, DYN};
use crate::tensor::{next_id, TensorId};
use crate::value::Value;

/// The lanes of one level that values are computed over now: all of them (a level's root), or
/// those of its parent that `rows` picks (a branch taken by some lanes, a loop's live lanes).
/// A value computed over a parent set is gathered to the rows of a child set when a child uses
/// it.
#[derive(Debug)]
pub struct LaneSet {
    pub level: u64,
    /// How many lanes (`DYN` when known only at run time).
    pub count: usize,
    parent: Option<(Arc<LaneSet>, Val)>,
}

impl LaneSet {
    /// Every lane of `level` (`count` of them).
    pub fn root(level: u64, count: usize) -> Arc<LaneSet> {
        Arc::new(LaneSet {
            level,
            count,
            parent: None,
        })
    }

    /// The lanes of `parent` at `rows` (int64 indices into its lanes).
    pub fn child(parent: &Arc<LaneSet>, rows: Val) -> Arc<LaneSet> {
        Arc::new(LaneSet {
            level: parent.level,
            count: rows.ty().shape.first().copied().unwrap_or(DYN),
            parent: Some((parent.clone(), rows)),
        })
    }

    pub fn parent(&self) -> Option<&Arc<LaneSet>> {
        self.parent.as_ref().map(|(p, _)| p)
    }

    /// The parent set and which of its lanes these are.
    pub fn parent_rows(&self) -> Option<(&Arc<LaneSet>, &Val)> {
        self.parent.as_ref().map(|(p, rows)| (p, rows))
    }
}

/// One lane's view of a batched value.
#[derive(Debug)]
pub struct Lanes {
    id: TensorId,
    /// Every lane's value, lanes along axis 0.
    pub physical: Val,
    /// The lanes `physical` holds.
    pub set: Arc<LaneSet>,
    /// One lane's type: `physical`'s without axis 0.
    ty: TensorType,
}

impl Lanes {
    /// The lane view of `physical`, whose axis 0 holds the lanes of `set`.
    pub fn wrap(physical: Val, set: &Arc<LaneSet>) -> Result<Val> {
        let whole = physical.ty();
        if whole.shape.is_empty() {
            return Err(Error::internal(
                "vmap",
                format!("a batched value needs a lanes axis, got {whole}"),
            ));
        }
        let ty = TensorType::new(whole.dtype, &whole.shape[1..]);
        Ok(Val::Batched(Arc::new(Lanes {
            id: next_id(),
            physical,
            set: set.clone(),
            ty,
        })))
    }

    pub fn id(&self) -> TensorId {
        self.id
    }

    pub fn level(&self) -> u64 {
        self.set.level
    }

    pub fn ty(&self) -> &TensorType {
        &self.ty
    }
}

/// The lanes of `v` at `level`, if `v` belongs to it.
pub fn lanes_at(v: &Val, level: u64) -> Option<&Lanes> {
    match v {
        Val::Batched(lanes) if lanes.level() == level => Some(lanes),
        _ => None,
    }
}
