//! `Library` (the functions of a graph, by name, in insertion order) and `Graph` (a library and
//! its entry function).

use std::collections::BTreeMap;

use super::ir::Function;
use crate::error::{Error, ErrorKind, Result};

/// Functions by name. Iteration follows insertion order, so printing is deterministic and text
/// reads top-down (the entry first, then the functions it calls).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Library {
    functions: Vec<Function>,
    index: BTreeMap<String, usize>,
}

impl Library {
    pub fn new() -> Self {
        Library::default()
    }

    /// Adds `function`; a name already present is an error (names are how nodes call them).
    pub fn add(&mut self, function: Function) -> Result<()> {
        if self.index.contains_key(&function.name) {
            return Err(Error::new(
                ErrorKind::Graph,
                "library",
                format!("function @{} is already defined", function.name),
            ));
        }
        self.index
            .insert(function.name.clone(), self.functions.len());
        self.functions.push(function);
        Ok(())
    }

    /// Replaces the function of the same name (passes rewrite functions this way).
    pub fn replace(&mut self, function: Function) -> Result<()> {
        let i = self.position(&function.name)?;
        self.functions[i] = function;
        Ok(())
    }

    /// The function called `name`, or a `Graph` error naming it and what is defined.
    pub fn get(&self, name: &str) -> Result<&Function> {
        Ok(&self.functions[self.position(name)?])
    }

    pub fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    pub fn len(&self) -> usize {
        self.functions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.functions.is_empty()
    }

    /// Functions in insertion order.
    pub fn iter(&self) -> impl Iterator<Item = &Function> {
        self.functions.iter()
    }

    fn position(&self, name: &str) -> Result<usize> {
        self.index.get(name).copied().ok_or_else(|| {
            let known: Vec<String> = self
                .functions
                .iter()
                .map(|f| format!("@{}", f.name))
                .collect();
            Error::new(
                ErrorKind::Graph,
                "library",
                format!(
                    "no function @{name} in the library (defined: {})",
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    }
                ),
            )
        })
    }
}

/// A program: a library and the name of the function that runs first.
#[derive(Clone, Debug, PartialEq)]
pub struct Graph {
    pub library: Library,
    pub entry: String,
}

impl Graph {
    /// A graph of `library` entered at `entry` (checked to exist).
    pub fn new(library: Library, entry: impl Into<String>) -> Result<Self> {
        let entry = entry.into();
        library.get(&entry)?;
        Ok(Graph { library, entry })
    }

    /// The entry function.
    pub fn entry_function(&self) -> Result<&Function> {
        self.library.get(&self.entry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn empty(name: &str) -> Function {
        Function {
            name: name.to_string(),
            params: vec![],
            nodes: vec![],
            results: vec![],
            control_outputs: vec![],
        }
    }

    #[test]
    fn library_keeps_insertion_order_and_refuses_duplicates() {
        let mut lib = Library::new();
        for name in ["main", "body", "cond"] {
            lib.add(empty(name)).unwrap();
        }
        let names: Vec<&str> = lib.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["main", "body", "cond"]);
        let err = lib.add(empty("body")).unwrap_err();
        assert_eq!(err.kind, ErrorKind::Graph);
        assert!(err.message.contains("@body is already defined"), "{err}");
        let err = lib.get("nope").unwrap_err();
        assert!(
            err.message.contains("@nope") && err.message.contains("@cond"),
            "{err}"
        );
        assert!(Graph::new(lib.clone(), "missing").is_err());
        assert_eq!(
            Graph::new(lib, "main")
                .unwrap()
                .entry_function()
                .unwrap()
                .name,
            "main"
        );
    }
}
