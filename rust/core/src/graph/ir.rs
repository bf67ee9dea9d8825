//! The IR's data types: values, ports, nodes and functions (see the module doc of `graph` for
//! their semantics). Plain data with structural equality; building and checking live elsewhere.

use crate::dtype::{DType, Elements};
use crate::error::{Error, ErrorKind, Result};
pub use crate::location::Location;
use crate::ops::Op;
use crate::shape::{TensorType, DYN};
use crate::tensor::Tensor;

pub use super::constructs::{Call, Case, If, NodeRule, ParseNode, StackOp, VariableOp, While};
use super::parse_attrs::AttrReader;

/// Index of a node in its function's `nodes`.
pub type NodeId = usize;

/// The static type of a value flowing along an edge.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ValueType {
    /// A tensor.
    Tensor(TensorType),
    /// A handle to a variable holding a tensor of this type (reads and writes are nodes).
    Resource(TensorType),
    /// A stack of tensors of this type, threaded as a value (loop-gradient intermediates).
    Stack(TensorType),
}

impl ValueType {
    pub fn tensor(dtype: DType, shape: &[usize]) -> Self {
        ValueType::Tensor(TensorType::new(dtype, shape))
    }

    /// The tensor type carried (a variable's value type, a stack's element type).
    pub fn inner(&self) -> &TensorType {
        match self {
            ValueType::Tensor(t) | ValueType::Resource(t) | ValueType::Stack(t) => t,
        }
    }

    /// The tensor type if this is a tensor.
    pub fn as_tensor(&self) -> Option<&TensorType> {
        match self {
            ValueType::Tensor(t) => Some(t),
            ValueType::Resource(_) | ValueType::Stack(_) => None,
        }
    }

    /// Same kind and dtype, same rank, and each dimension equal or unknown (`DYN`) on a side:
    /// the relation every edge of a verified graph satisfies.
    pub fn compatible(&self, other: &ValueType) -> bool {
        let same_kind = matches!(
            (self, other),
            (ValueType::Tensor(_), ValueType::Tensor(_))
                | (ValueType::Resource(_), ValueType::Resource(_))
                | (ValueType::Stack(_), ValueType::Stack(_))
        );
        same_kind && tensor_types_compatible(self.inner(), other.inner())
    }
}

/// Tensor types that may describe the same value (see `ValueType::compatible`).
pub fn tensor_types_compatible(a: &TensorType, b: &TensorType) -> bool {
    a.dtype == b.dtype
        && a.shape.len() == b.shape.len()
        && a.shape
            .iter()
            .zip(&b.shape)
            .all(|(&x, &y)| x == y || x == DYN || y == DYN)
}

/// Output `output` of node `node`: the source of an edge.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Port {
    pub node: NodeId,
    pub output: usize,
}

impl Port {
    pub fn new(node: NodeId, output: usize) -> Self {
        Port { node, output }
    }
}

/// A constant tensor. Equality is structural (dtype, shape, elements; floats bitwise with all
/// NaNs equal), not the tensor identity the tape uses.
#[derive(Clone, Debug)]
pub struct Constant(pub Tensor);

impl PartialEq for Constant {
    fn eq(&self, other: &Self) -> bool {
        fn floats<T: Copy>(a: &[T], b: &[T], bits: impl Fn(T) -> (bool, u64)) -> bool {
            a.len() == b.len()
                && a.iter().zip(b).all(|(&x, &y)| {
                    let ((nx, bx), (ny, by)) = (bits(x), bits(y));
                    (nx && ny) || bx == by
                })
        }
        let (a, b) = (&self.0, &other.0);
        a.ty() == b.ty()
            && match (a.elements(), b.elements()) {
                (Elements::F32(x), Elements::F32(y)) => {
                    floats(x, y, |v| (v.is_nan(), u64::from(v.to_bits())))
                }
                (Elements::F64(x), Elements::F64(y)) => floats(x, y, |v| (v.is_nan(), v.to_bits())),
                (x, y) => x == y,
            }
    }
}

/// What a node does. `If`/`Case`/`While`/`Call` name functions of the graph's library.
#[derive(Clone, Debug, PartialEq)]
pub enum NodeKind {
    /// Parameter `index` of the function (the first nodes of every function, in order).
    Arg(usize),
    /// A constant tensor.
    Const(Constant),
    /// A primitive op of the op table.
    Op(Op),
    /// `(pred, operands...)`: a two-way branch (`control::if_else`).
    If(If),
    /// `(index, operands...)`: an n-way branch (`control::case`).
    Case(Case),
    /// `(vars...) -> vars`: a loop (`control::while_loop`).
    While(While),
    /// `(operands...) -> results`: a function call (`control::call`).
    Call(Call),
    /// Reads and writes of a variable (`control::variables`).
    Variable(VariableOp),
    /// Stacks threaded as values, the loop gradients' residuals (`control::stacks`).
    Stack(StackOp),
}

/// The construct behind a node kind as `&dyn $layer_trait` (`None` for `Arg`, `Const`, `Op`):
/// the one match through which every layer reaches its construct trait, so a new construct is
/// added here once and the compiler asks each layer for its trait.
macro_rules! construct_as {
    ($kind:expr, $layer_trait:path) => {
        match $kind {
            $crate::graph::NodeKind::Arg(_)
            | $crate::graph::NodeKind::Const(_)
            | $crate::graph::NodeKind::Op(_) => None,
            $crate::graph::NodeKind::If(c) => Some(c as &dyn $layer_trait),
            $crate::graph::NodeKind::Case(c) => Some(c as &dyn $layer_trait),
            $crate::graph::NodeKind::While(c) => Some(c as &dyn $layer_trait),
            $crate::graph::NodeKind::Call(c) => Some(c as &dyn $layer_trait),
            $crate::graph::NodeKind::Variable(c) => Some(c as &dyn $layer_trait),
            $crate::graph::NodeKind::Stack(c) => Some(c as &dyn $layer_trait),
        }
    };
}
pub(crate) use construct_as;

impl NodeKind {
    /// The construct behind a control-flow or stateful node; `None` for `Arg`, `Const`, `Op`.
    pub fn construct(&self) -> Option<&dyn NodeRule> {
        construct_as!(self, NodeRule)
    }

    /// The construct written `keyword(...) {attrs}` in graph text, if one answers to it.
    pub(crate) fn parse_construct(
        keyword: &str,
        attrs: &mut AttrReader<'_, '_>,
    ) -> Option<Result<NodeKind>> {
        fn parse<C: ParseNode>(
            keyword: &str,
            attrs: &mut AttrReader<'_, '_>,
            wrap: fn(C) -> NodeKind,
        ) -> Option<Result<NodeKind>> {
            C::KEYWORDS
                .contains(&keyword)
                .then(|| C::parse(keyword, attrs).map(wrap))
        }
        parse(keyword, attrs, NodeKind::If)
            .or_else(|| parse(keyword, attrs, NodeKind::Case))
            .or_else(|| parse(keyword, attrs, NodeKind::While))
            .or_else(|| parse(keyword, attrs, NodeKind::Call))
            .or_else(|| parse(keyword, attrs, NodeKind::Variable))
            .or_else(|| parse(keyword, attrs, NodeKind::Stack))
    }

    /// The node's name in graph text: the op name, or the built-in keyword.
    pub fn name(&self) -> &'static str {
        match self {
            NodeKind::Arg(_) => "arg",
            NodeKind::Const(_) => "const",
            NodeKind::Op(op) => op.name(),
            NodeKind::If(c) => c.keyword(),
            NodeKind::Case(c) => c.keyword(),
            NodeKind::While(c) => c.keyword(),
            NodeKind::Call(c) => c.keyword(),
            NodeKind::Variable(c) => c.keyword(),
            NodeKind::Stack(c) => c.keyword(),
        }
    }

    /// Writes a variable: it must stay ordered and reachable from the control outputs.
    pub fn has_side_effect(&self) -> bool {
        self.construct().is_some_and(|c| c.has_side_effect())
    }

    /// Functions this node calls, in attribute order.
    pub fn callees(&self) -> Vec<&str> {
        self.construct().map_or_else(Vec::new, |c| c.callees())
    }

    /// Functions this node names: its callees, then a custom gradient function.
    pub fn referenced(&self) -> Vec<&str> {
        self.construct().map_or_else(Vec::new, |c| c.referenced())
    }
}

impl crate::value::NodeName for NodeKind {
    fn name(&self) -> &'static str {
        NodeKind::name(self)
    }
}

/// Keywords of the built-in node kinds; no op of the table may use one as its name.
pub fn builtin_names() -> Vec<&'static str> {
    let mut names = vec!["arg", "const"];
    for keywords in [
        If::KEYWORDS,
        Case::KEYWORDS,
        While::KEYWORDS,
        Call::KEYWORDS,
        VariableOp::KEYWORDS,
        StackOp::KEYWORDS,
    ] {
        names.extend_from_slice(keywords);
    }
    names
}

/// One node: its kind, data inputs, nodes it must run after, and output types.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub kind: NodeKind,
    pub inputs: Vec<Port>,
    /// Nodes that must run before this one although no data flows (stateful ordering).
    pub control_inputs: Vec<NodeId>,
    pub outputs: Vec<ValueType>,
    pub location: Option<Location>,
}

impl Node {
    pub fn new(kind: NodeKind, inputs: Vec<Port>, outputs: Vec<ValueType>) -> Self {
        Node {
            kind,
            inputs,
            control_inputs: Vec::new(),
            outputs,
            location: None,
        }
    }
}

/// A function: parameters, nodes in topological order (the first `params.len()` are its
/// `Arg`s), results, and control outputs (side effects that must run when it is called).
#[derive(Clone, Debug, PartialEq)]
pub struct Function {
    pub name: String,
    pub params: Vec<ValueType>,
    pub nodes: Vec<Node>,
    pub results: Vec<Port>,
    pub control_outputs: Vec<NodeId>,
}

impl Function {
    /// The work of an op node of this function (`OpDef::work` on its static shapes); `None`
    /// for other nodes and where a shape is not known when tracing (`shape::DYN`).
    pub fn op_work(&self, node: &Node) -> Option<usize> {
        let NodeKind::Op(op) = &node.kind else {
            return None;
        };
        let known = |t: &ValueType| {
            let shape = &t.inner().shape;
            (!shape.contains(&crate::shape::DYN)).then(|| shape.to_vec())
        };
        let inputs: Vec<Vec<usize>> = (node.inputs.iter())
            .map(|p| self.port_type(*p).ok().and_then(known))
            .collect::<Option<_>>()?;
        let outputs: Vec<Vec<usize>> = node.outputs.iter().map(known).collect::<Option<_>>()?;
        let inputs: Vec<&[usize]> = inputs.iter().map(|s| &s[..]).collect();
        let outputs: Vec<&[usize]> = outputs.iter().map(|s| &s[..]).collect();
        Some(op.work(&inputs, &outputs))
    }

    /// The type of `port`, or a `Graph` error when it names no output.
    pub fn port_type(&self, port: Port) -> Result<&ValueType> {
        self.nodes
            .get(port.node)
            .and_then(|n| n.outputs.get(port.output))
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::Graph,
                    "graph",
                    format!("@{}: no value %{}#{}", self.name, port.node, port.output),
                )
            })
    }

    /// Types of the results (errors as `port_type`).
    pub fn result_types(&self) -> Result<Vec<ValueType>> {
        self.results
            .iter()
            .map(|&p| self.port_type(p).cloned())
            .collect()
    }
}
