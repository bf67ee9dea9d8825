//! Where the user wrote the code a value came from: the graph's nodes carry it, errors and MLIR
//! `loc`s show it. A leaf, so that the IR and the emitter both name it without naming each
//! other.

/// Where the user wrote the code a node came from (shown in errors and MLIR `loc`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Location {
    pub file: String,
    pub line: u32,
}

impl Location {
    pub fn new(file: impl Into<String>, line: u32) -> Self {
        Location {
            file: file.into(),
            line,
        }
    }
}
