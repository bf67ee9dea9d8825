//! Lane views, the values `vmap` gives the function it maps (`crate::batch` applies ops over
//! them): one lane's type, every lane's value.

use std::sync::Arc;

use super::Val;
use crate::error::{Error, Result};
use crate::shape::{TensorType, DYN};
use crate::tensor::{next_id, TensorId};
use crate::value::Value;

/// The lanes of one level that values are computed over now: all of them (a level's root), or
/// a narrowing of its parent's (a branch taken by some lanes, a loop's live lanes). A value
/// computed over a parent set is narrowed likewise when a child uses it (`batch::over`).
#[derive(Debug)]
pub struct LaneSet {
    pub level: u64,
    /// How many lanes (`DYN` when known only at run time).
    pub count: usize,
    parent: Option<(Arc<LaneSet>, Narrowing)>,
    /// These lanes as rows of an ancestor past a chain of `Rows` narrowings (int64 indices into
    /// its lanes): a value of that ancestor is gathered once, not once per narrowing between
    /// (a loop in buckets narrows three times, and its body gathers what it closes over every
    /// trip).
    shortcut: Option<(Arc<LaneSet>, Val)>,
}

/// How a child set's lanes come from its parent's.
#[derive(Debug)]
pub enum Narrowing {
    /// The parent's lanes at `rows` (int64 indices into them): fewer lanes, gathered.
    Rows(Val),
    /// Every lane of the parent, those outside `mask` (bool over them) standing in for lane
    /// `first` (int64, shape `[1]`): a traced branch or trip runs on all lanes at static shapes,
    /// the lanes that do not take it computing on a copy of one that does.
    StandIns { mask: Val, first: Val },
}

impl LaneSet {
    /// Every lane of `level` (`count` of them).
    pub fn root(level: u64, count: usize) -> Arc<LaneSet> {
        Arc::new(LaneSet {
            level,
            count,
            parent: None,
            shortcut: None,
        })
    }

    /// The lanes of `parent` that `narrowing` gives.
    pub fn child(parent: &Arc<LaneSet>, narrowing: Narrowing) -> Arc<LaneSet> {
        Self::child_via(parent, narrowing, None)
    }

    /// `child`, whose lanes are also `shortcut`'s ancestor's lanes at its rows.
    pub fn child_via(
        parent: &Arc<LaneSet>,
        narrowing: Narrowing,
        shortcut: Option<(Arc<LaneSet>, Val)>,
    ) -> Arc<LaneSet> {
        let count = match &narrowing {
            Narrowing::Rows(rows) => rows.ty().shape.first().copied().unwrap_or(DYN),
            Narrowing::StandIns { .. } => parent.count,
        };
        Arc::new(LaneSet {
            level: parent.level,
            count,
            parent: Some((parent.clone(), narrowing)),
            shortcut,
        })
    }

    /// The ancestor these lanes are rows of, and those rows (`child_via`).
    pub fn shortcut(&self) -> Option<(&Arc<LaneSet>, &Val)> {
        self.shortcut.as_ref().map(|(a, r)| (a, r))
    }

    /// Whether `set` is this set or one of its ancestors.
    pub fn descends_from(self: &Arc<Self>, set: &Arc<LaneSet>) -> bool {
        let mut at = Some(self);
        while let Some(s) = at {
            if Arc::ptr_eq(s, set) {
                return true;
            }
            at = s.parent();
        }
        false
    }

    pub fn parent(&self) -> Option<&Arc<LaneSet>> {
        self.parent.as_ref().map(|(p, _)| p)
    }

    /// The parent set and how these lanes come from its.
    pub fn narrowing(&self) -> Option<(&Arc<LaneSet>, &Narrowing)> {
        self.parent.as_ref().map(|(p, n)| (p, n))
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
