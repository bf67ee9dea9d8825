//! The generic form of an MLIR module as data: operations (results, operands, properties,
//! attributes, regions, types, location), regions of blocks, and block arguments.
//!
//! ```text
//!   %1:2 = "stablehlo.while"(%a, %b) ({ ^bb0(%x: tensor<f32> loc(..), ..): ... }, { ... })
//!          {attr = ...} : (tensor<f32>, tensor<i64>) -> (tensor<f32>, tensor<i64>) loc("m.mlir":4:12)
//! ```
//!
//! The generic form is what `mlir-opt --mlir-print-op-generic --mlir-print-local-scope
//! --mlir-print-debuginfo` (or the Python bindings' `get_asm(print_generic_op_form=True,
//! use_local_scope=True, enable_debug_info=True)`) writes: every op has the same regular shape,
//! so one small parser reads any dialect. Aliases (`#loc3 = ...` lines) are skipped; a
//! location that refers to one is kept as written.

use std::fmt;

use super::attr::{parse_entries, Attribute};
use super::cursor::Cursor;
use super::types::{parse_function_type, parse_type, Type};
use crate::error::Result;

/// A use of a value: result `index` of the group `%name` (`%7#1`), or a block argument.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ValueRef {
    pub name: String,
    pub index: usize,
}

impl fmt::Display for ValueRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}#{}", self.name, self.index)
    }
}

/// Where an op is: the first `"file":line:col` of its `loc(...)`, or the location as written.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Loc {
    pub file_line_col: Option<(String, u32, u32)>,
    pub raw: String,
}

impl fmt::Display for Loc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.file_line_col {
            Some((file, line, col)) => write!(f, "{file}:{line}:{col}"),
            None if self.raw.is_empty() => f.write_str("an unknown location"),
            None => write!(f, "loc({})", self.raw),
        }
    }
}

impl Loc {
    /// Reads the body of `loc(...)`: the first string followed by `:line:col` is the place.
    fn from_body(raw: &str) -> Loc {
        let mut file_line_col = None;
        for (i, _) in raw.match_indices('"') {
            let mut c = Cursor::new(&raw[i..]);
            let place = (|| {
                let file = c.string().ok()?;
                c.eat(":").then_some(())?;
                let line = c.number().ok()?.parse().ok()?;
                c.eat(":").then_some(())?;
                let col = c.number().ok()?.parse().ok()?;
                Some((file, line, col))
            })();
            if place.is_some() {
                file_line_col = place;
                break;
            }
        }
        Loc {
            file_line_col,
            raw: raw.to_string(),
        }
    }
}

/// One operation in the generic form.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Operation {
    pub name: String,
    /// Result groups: `%7:2` is `("%7", 2)`.
    pub results: Vec<(String, usize)>,
    pub operands: Vec<ValueRef>,
    /// Properties (`<{...}>`) then discardable attributes (`{...}`).
    pub attributes: Vec<(String, Attribute)>,
    pub regions: Vec<Region>,
    pub operand_types: Vec<Type>,
    pub result_types: Vec<Type>,
    pub loc: Loc,
}

impl Operation {
    /// The attribute (or property) `name`.
    pub fn attr(&self, name: &str) -> Option<&Attribute> {
        self.attributes
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, a)| a)
    }

    /// The values this op defines, in order.
    pub fn result_refs(&self) -> Vec<ValueRef> {
        self.results
            .iter()
            .flat_map(|(name, n)| {
                (0..*n).map(|index| ValueRef {
                    name: name.clone(),
                    index,
                })
            })
            .collect()
    }
}

/// A region: its blocks (structured control flow has exactly one).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Region {
    pub blocks: Vec<Block>,
    /// Byte offset of the region's closing `}` in the text (0 for a region made up here).
    pub end: usize,
}

/// A block: its arguments (name, type) and its operations, the terminator last.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Block {
    pub args: Vec<(String, Type)>,
    pub ops: Vec<Operation>,
}

/// Parses a module in the generic form. Top-level ops other than one `builtin.module` are
/// wrapped in a module, as MLIR does for a file without one.
pub fn parse_generic(text: &str) -> Result<Operation> {
    let mut c = Cursor::new(text);
    let mut ops = Vec::new();
    while !c.at_end() {
        if c.at("#") || c.at("!") {
            // An alias definition `#loc3 = loc(...)`: locations keep their reference as text.
            c.balanced(&['\n'])?;
            continue;
        }
        ops.push(parse_op(&mut c)?);
    }
    if ops.len() == 1 && ops[0].name == "builtin.module" {
        return Ok(ops.remove(0));
    }
    Ok(Operation {
        name: "builtin.module".into(),
        regions: vec![Region {
            blocks: vec![Block {
                args: Vec::new(),
                ops,
            }],
            end: 0,
        }],
        ..Operation::default()
    })
}

/// `[results =] "name"(operands) [<{props}>] [(regions)] [{attrs}] : type [loc(..)]`.
fn parse_op(c: &mut Cursor<'_>) -> Result<Operation> {
    let mut op = Operation::default();
    if c.at("%") {
        loop {
            let name = c.sigil_name('%')?;
            let n = if c.eat(":") {
                c.number()?
                    .parse()
                    .map_err(|_| c.error("bad result count"))?
            } else {
                1
            };
            op.results.push((name, n));
            if !c.eat(",") {
                break;
            }
        }
        c.expect("=")?;
    }
    if !c.at("\"") {
        return Err(c.error("expected an operation in the generic form (`\"dialect.op\"(...)`)"));
    }
    op.name = c.string()?;
    c.expect("(")?;
    if !c.eat(")") {
        loop {
            op.operands.push(parse_value_ref(c)?);
            if c.eat(")") {
                break;
            }
            c.expect(",")?;
        }
    }
    if c.at("[") {
        return Err(c.error(format!(
            "{}: branches to other blocks (unstructured control flow) are not supported",
            op.name
        )));
    }
    if c.eat("<{") {
        op.attributes = parse_entries(c, Some('}'))?;
        c.expect(">")?;
    }
    if c.eat("(") {
        loop {
            op.regions.push(parse_region(c)?);
            if c.eat(")") {
                break;
            }
            c.expect(",")?;
        }
    }
    if c.eat("{") {
        op.attributes.extend(parse_entries(c, Some('}'))?);
    }
    c.expect(":")?;
    let (ins, outs) = parse_function_type(c)?;
    op.operand_types = ins;
    op.result_types = outs;
    op.loc = parse_loc(c)?;
    Ok(op)
}

fn parse_value_ref(c: &mut Cursor<'_>) -> Result<ValueRef> {
    let name = c.sigil_name('%')?;
    let index = if c.eat("#") {
        c.number()?
            .parse()
            .map_err(|_| c.error("bad result index"))?
    } else {
        0
    };
    Ok(ValueRef { name, index })
}

/// An optional `loc(...)`.
fn parse_loc(c: &mut Cursor<'_>) -> Result<Loc> {
    if !c.eat("loc(") {
        return Ok(Loc::default());
    }
    let body = c.balanced(&[')'])?;
    c.expect(")")?;
    Ok(Loc::from_body(body))
}

/// `{ [^bb(args):] ops... [^bb..] }`.
fn parse_region(c: &mut Cursor<'_>) -> Result<Region> {
    c.expect("{")?;
    let mut region = Region::default();
    let mut block = Block::default();
    let mut started = false;
    loop {
        if c.eat("}") {
            region.end = c.pos() - 1;
            break;
        }
        if c.at("^") {
            if started {
                region.blocks.push(std::mem::take(&mut block));
            }
            c.sigil_name('^')?;
            if c.eat("(") && !c.eat(")") {
                loop {
                    let name = c.sigil_name('%')?;
                    c.expect(":")?;
                    let ty = parse_type(c)?;
                    parse_loc(c)?;
                    block.args.push((name, ty));
                    if c.eat(")") {
                        break;
                    }
                    c.expect(",")?;
                }
            }
            c.expect(":")?;
        } else {
            block.ops.push(parse_op(c)?);
        }
        started = true;
    }
    if started {
        region.blocks.push(block);
    }
    Ok(region)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_generic_form_parses_into_ops_regions_and_locations() {
        let text = r#"#loc3 = loc("m.py":1:1)
    "builtin.module"() <{sym_name = "jit_f"}> ({
      "func.func"() <{function_type = (tensor<f32>) -> tensor<f32>, sym_name = "main"}> ({
      ^bb0(%arg0: tensor<f32> loc("-":2:26)):
        %0:2 = "stablehlo.while"(%arg0, %arg0) ({
        ^bb0(%a: tensor<f32>, %b: tensor<f32>):
          %1 = "stablehlo.compare"(%a, %b) <{comparison_direction = #stablehlo<comparison_direction LT>}> : (tensor<f32>, tensor<f32>) -> tensor<i1> loc("f"("m.py":7:3))
          "stablehlo.return"(%1) : (tensor<i1>) -> () loc(#loc3)
        }, {
        ^bb0(%a: tensor<f32>, %b: tensor<f32>):
          "stablehlo.return"(%b, %a) : (tensor<f32>, tensor<f32>) -> ()
        }) : (tensor<f32>, tensor<f32>) -> (tensor<f32>, tensor<f32>) loc(callsite("g"("x.py":3:4) at "y.py":5:6))
        "func.return"(%0#1) : (tensor<f32>) -> () loc(unknown)
      }) {jax.uses_shape_polymorphism = false} : () -> ()
    }) {mhlo.num_partitions = 1 : i32} : () -> ()
    "#;
        let m = parse_generic(text).unwrap();
        assert_eq!(m.attr("sym_name"), Some(&Attribute::Str("jit_f".into())));
        assert_eq!(m.attr("mhlo.num_partitions"), Some(&Attribute::Int(1)));
        let f = &m.regions[0].blocks[0].ops[0];
        assert_eq!(
            f.attr("jax.uses_shape_polymorphism"),
            Some(&Attribute::Bool(false))
        );
        let body = &f.regions[0].blocks[0];
        assert_eq!(body.args[0].0, "%arg0");
        let w = &body.ops[0];
        assert_eq!(
            (w.name.as_str(), w.results.clone()),
            ("stablehlo.while", vec![("%0".to_string(), 2)])
        );
        assert_eq!(w.regions.len(), 2);
        assert_eq!(w.loc.to_string(), "x.py:3:4");
        let cmp = &w.regions[0].blocks[0].ops[0];
        assert_eq!(cmp.loc.to_string(), "m.py:7:3");
        assert_eq!(
            cmp.attr("comparison_direction")
                .and_then(Attribute::enum_value),
            Some("LT")
        );
        assert_eq!(w.regions[0].blocks[0].ops[1].loc.to_string(), "loc(#loc3)");
        let ret = &body.ops[1];
        assert_eq!(
            ret.operands[0],
            ValueRef {
                name: "%0".into(),
                index: 1
            }
        );
        assert_eq!(ret.loc.to_string(), "loc(unknown)");
        assert_eq!(&text[m.regions[0].end..m.regions[0].end + 2], "})");
        let err = parse_generic("%0 = stablehlo.add %a, %b : tensor<f32>").unwrap_err();
        assert!(err.message.contains("generic form"), "{err}");
    }
}
