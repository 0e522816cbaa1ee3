//! A restricted pickle reader for `torch.save` state dicts: bytes in, plain data out, nothing executed.
//!
//! Only the opcodes PyTorch's protocol-2 pickler emits for a tensor state dict are understood, and only
//! an allow-list of globals can be named (`codec.md` §4.2). "Calling" an allow-listed global builds a
//! [`Value`] directly; no Python object is ever constructed. Every resource is bounded by the input
//! (lengths are checked against the remaining bytes before allocating) or by the `MAX_*` limits.
//!
//! Values have value semantics (immutable, `Rc`-shared, copy-on-write on mutation). Python shares
//! mutable objects instead; the difference only shows if a pickle mutates a container after memoising
//! it and then reads the memo back, which PyTorch never does. Copy-on-write copies are charged to a
//! budget so that hostile input cannot make them quadratic, and nesting is capped so that dropping a
//! value can never overflow the stack.

use std::fmt;
use std::rc::Rc;

use super::Dtype;

mod vm;

/// Maximum container nesting (PyTorch state dicts need 4: wrapper dict, state dict, args tuple, size tuple).
pub const MAX_DEPTH: usize = 32;
/// Maximum number of values plus marks on the VM stack.
pub const MAX_STACK: usize = 1 << 20;
/// Maximum number of memo entries.
pub const MAX_MEMO: usize = 1 << 20;
/// Maximum tensor rank accepted by `_rebuild_tensor_v2`.
pub const MAX_NDIM: usize = 64;
/// Maximum length of a `GLOBAL` module or name line.
const MAX_LINE: usize = 256;

/// A storage reference: the persistent id `('storage', torch.XStorage, key, location, numel)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StorageRef {
    pub dtype: Dtype,
    /// Record name under `<prefix>/data/`.
    pub key: String,
    /// Device the storage was saved from (`cpu`, `cuda:0`); informational only.
    pub location: String,
    /// Element count of the whole storage.
    pub numel: u64,
}

/// A tensor as described by `_rebuild_tensor_v2` (strided view into a storage, units of elements).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorRef {
    pub storage: Rc<StorageRef>,
    pub storage_offset: usize,
    pub shape: Vec<usize>,
    pub strides: Vec<usize>,
    pub requires_grad: bool,
}

/// The allow-listed globals.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Global {
    OrderedDict,
    RebuildTensorV2,
    RebuildParameter,
    /// `torch.<X>Storage` for the element type.
    Storage(Dtype),
}

impl Global {
    fn lookup(module: &str, name: &str) -> Option<Global> {
        Some(match (module, name) {
            ("collections", "OrderedDict") => Global::OrderedDict,
            ("torch._utils", "_rebuild_tensor_v2") => Global::RebuildTensorV2,
            ("torch._utils", "_rebuild_parameter") => Global::RebuildParameter,
            ("torch", storage) => Global::Storage(storage_dtype(storage)?),
            _ => return None,
        })
    }
}

impl fmt::Display for Global {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Global::OrderedDict => f.write_str("collections OrderedDict"),
            Global::RebuildTensorV2 => f.write_str("torch._utils _rebuild_tensor_v2"),
            Global::RebuildParameter => f.write_str("torch._utils _rebuild_parameter"),
            Global::Storage(d) => write!(f, "torch {}", storage_class_name(*d)),
        }
    }
}

/// `torch.<X>Storage` class name → element type (the legacy typed-storage names torch.save still writes).
pub fn storage_dtype(class: &str) -> Option<Dtype> {
    Some(match class {
        "FloatStorage" => Dtype::F32,
        "HalfStorage" => Dtype::F16,
        "BFloat16Storage" => Dtype::BF16,
        "DoubleStorage" => Dtype::F64,
        "LongStorage" => Dtype::I64,
        "IntStorage" => Dtype::I32,
        "ShortStorage" => Dtype::I16,
        "CharStorage" => Dtype::I8,
        "ByteStorage" => Dtype::U8,
        "BoolStorage" => Dtype::Bool,
        _ => return None,
    })
}

/// Element type → `torch.<X>Storage` class name; `None` for types without a legacy storage class.
pub fn storage_class_name(dtype: Dtype) -> &'static str {
    match dtype {
        Dtype::F32 => "FloatStorage",
        Dtype::F16 => "HalfStorage",
        Dtype::BF16 => "BFloat16Storage",
        Dtype::F64 => "DoubleStorage",
        Dtype::I64 => "LongStorage",
        Dtype::I32 => "IntStorage",
        Dtype::I16 => "ShortStorage",
        Dtype::I8 => "CharStorage",
        Dtype::U8 => "ByteStorage",
        Dtype::Bool => "BoolStorage",
        Dtype::F8E4M3 | Dtype::F8E5M2 => "<no storage class>",
    }
}

/// A sequence (tuple or list) with its cached nesting depth.
#[derive(Clone, Debug, PartialEq)]
pub struct Seq {
    pub items: Vec<Value>,
    depth: usize,
}

/// A dict (plain or `OrderedDict`) as insertion-ordered pairs; duplicate keys are kept, later wins is
/// left to the consumer (a state dict never has them, and a linear search per insert would be quadratic).
#[derive(Clone, Debug, PartialEq)]
pub struct Dict {
    pub ordered: bool,
    pub items: Vec<(Value, Value)>,
    depth: usize,
}

/// A value produced by the VM.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(Rc<str>),
    Bytes(Rc<[u8]>),
    Tuple(Rc<Seq>),
    List(Rc<Seq>),
    Dict(Rc<Dict>),
    Global(Global),
    Storage(Rc<StorageRef>),
    Tensor(Rc<TensorRef>),
}

impl Value {
    fn depth(&self) -> usize {
        match self {
            Value::Tuple(s) | Value::List(s) => s.depth,
            Value::Dict(d) => d.depth,
            Value::Tensor(_) => 1,
            _ => 0,
        }
    }

    /// A short type name for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::None => "None",
            Value::Bool(_) => "bool",
            Value::Int(_) => "int",
            Value::Float(_) => "float",
            Value::Str(_) => "str",
            Value::Bytes(_) => "bytes",
            Value::Tuple(_) => "tuple",
            Value::List(_) => "list",
            Value::Dict(d) if d.ordered => "OrderedDict",
            Value::Dict(_) => "dict",
            Value::Global(_) => "global",
            Value::Storage(_) => "storage",
            Value::Tensor(_) => "tensor",
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_dict(&self) -> Option<&Dict> {
        match self {
            Value::Dict(d) => Some(d),
            _ => None,
        }
    }

    fn tuple(items: Vec<Value>) -> Result<Value, String> {
        let depth = nested_depth(items.iter())?;
        Ok(Value::Tuple(Rc::new(Seq { items, depth })))
    }
}

fn nested_depth<'a>(children: impl Iterator<Item = &'a Value>) -> Result<usize, String> {
    let depth = 1 + children.map(Value::depth).max().unwrap_or(0);
    if depth > MAX_DEPTH {
        return Err(format!("values nested deeper than {MAX_DEPTH}"));
    }
    Ok(depth)
}

/// Why unpickling failed, with the byte offset of the offending opcode.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("pickle offset {offset}: {kind}")]
pub struct PickleError {
    pub offset: usize,
    pub kind: PickleErrorKind,
}

#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum PickleErrorKind {
    #[error("opcode {byte:#04x} ({name}) is not allowed")]
    Opcode { byte: u8, name: &'static str },
    #[error("global `{module} {name}` is not allowed")]
    Global { module: String, name: String },
    #[error("REDUCE of `{callable}` refused: {why}")]
    Call { callable: String, why: String },
    #[error("truncated input while reading {0}")]
    Truncated(&'static str),
    #[error("{0}")]
    Malformed(String),
}

/// Runs the VM over a whole pickle and returns the object `STOP` pops.
pub fn unpickle(data: &[u8]) -> Result<Value, PickleError> {
    vm::run(data)
}

type Step<T> = Result<T, PickleErrorKind>;

fn bad<T>(msg: impl Into<String>) -> Step<T> {
    Err(PickleErrorKind::Malformed(msg.into()))
}

/// Applies an allow-listed callable to its argument tuple.
fn reduce(callable: Value, args: Value) -> Step<Value> {
    let Value::Global(g) = callable else {
        return Err(PickleErrorKind::Call {
            callable: format!("a {}", callable.type_name()),
            why: "only allow-listed globals can be called".into(),
        });
    };
    let refuse = |why: String| PickleErrorKind::Call { callable: g.to_string(), why };
    let Value::Tuple(args) = args else {
        return Err(refuse(format!("arguments are a {}, not a tuple", args.type_name())));
    };
    let a = &args.items;
    match g {
        Global::OrderedDict if a.is_empty() => {
            Ok(Value::Dict(Rc::new(Dict { ordered: true, items: Vec::new(), depth: 1 })))
        }
        Global::OrderedDict => Err(refuse(format!("expects no arguments, got {}", a.len()))),
        Global::RebuildTensorV2 => {
            if a.len() != 6 && a.len() != 7 {
                return Err(refuse(format!("expects 6 or 7 arguments, got {}", a.len())));
            }
            rebuild_tensor(a).map_err(refuse).map(|t| Value::Tensor(Rc::new(t)))
        }
        Global::RebuildParameter => {
            if a.len() != 3 {
                return Err(refuse(format!("expects 3 arguments, got {}", a.len())));
            }
            let (Value::Tensor(t), Value::Bool(rg)) = (&a[0], &a[1]) else {
                return Err(refuse("expects (tensor, bool, OrderedDict)".into()));
            };
            empty_hooks(&a[2]).map_err(refuse)?;
            Ok(Value::Tensor(Rc::new(TensorRef { requires_grad: *rg, ..(**t).clone() })))
        }
        Global::Storage(_) => Err(refuse("storage classes are only valid inside a persistent id".into())),
    }
}

fn rebuild_tensor(a: &[Value]) -> Result<TensorRef, String> {
    let Value::Storage(storage) = &a[0] else {
        return Err(format!("argument 0 is a {}, not a storage", a[0].type_name()));
    };
    let storage_offset = non_negative(&a[1], "storage_offset")?;
    let shape = int_tuple(&a[2], "size")?;
    let strides = int_tuple(&a[3], "stride")?;
    if shape.len() != strides.len() {
        return Err(format!("size has {} dims but stride has {}", shape.len(), strides.len()));
    }
    let Value::Bool(requires_grad) = a[4] else {
        return Err("requires_grad is not a bool".into());
    };
    empty_hooks(&a[5])?;
    // a[6], when present, is tensor metadata (Python attributes); it carries no layout information.
    Ok(TensorRef { storage: storage.clone(), storage_offset, shape, strides, requires_grad })
}

fn empty_hooks(v: &Value) -> Result<(), String> {
    match v {
        Value::Dict(d) if d.items.is_empty() => Ok(()),
        Value::Dict(_) => Err("backward hooks are not empty".into()),
        other => Err(format!("backward_hooks is a {}, not an OrderedDict", other.type_name())),
    }
}

fn non_negative(v: &Value, what: &str) -> Result<usize, String> {
    match v {
        Value::Int(i) => usize::try_from(*i).map_err(|_| format!("{what} {i} is negative or too large")),
        other => Err(format!("{what} is a {}, not an int", other.type_name())),
    }
}

fn int_tuple(v: &Value, what: &str) -> Result<Vec<usize>, String> {
    let Value::Tuple(t) = v else {
        return Err(format!("{what} is a {}, not a tuple", v.type_name()));
    };
    if t.items.len() > MAX_NDIM {
        return Err(format!("{what} has {} dims (limit {MAX_NDIM})", t.items.len()));
    }
    t.items.iter().map(|x| non_negative(x, what)).collect()
}

/// Interprets a persistent id; only PyTorch's storage tuple is accepted.
fn storage_ref(pid: &Value) -> Step<StorageRef> {
    let expected = "persistent id is not a ('storage', torch.XStorage, key, location, numel) tuple";
    let Value::Tuple(t) = pid else {
        return bad(format!("{expected}: got a {}", pid.type_name()));
    };
    match t.items.as_slice() {
        [
            Value::Str(tag),
            Value::Global(Global::Storage(dtype)),
            Value::Str(key),
            Value::Str(location),
            Value::Int(numel),
        ] if &**tag == "storage" => {
            let numel = u64::try_from(*numel)
                .map_err(|_| PickleErrorKind::Malformed(format!("storage numel {numel} is negative")))?;
            Ok(StorageRef { dtype: *dtype, key: key.to_string(), location: location.to_string(), numel })
        }
        _ => bad(expected),
    }
}

/// The name of every pickle opcode (protocols 0–5), for error messages.
#[rustfmt::skip]
pub fn opcode_name(op: u8) -> &'static str {
    match op {
        b'(' => "MARK", b'.' => "STOP", b'0' => "POP", b'1' => "POP_MARK", b'2' => "DUP",
        b'F' => "FLOAT", b'I' => "INT", b'J' => "BININT", b'K' => "BININT1", b'L' => "LONG",
        b'M' => "BININT2", b'N' => "NONE", b'P' => "PERSID", b'Q' => "BINPERSID", b'R' => "REDUCE",
        b'S' => "STRING", b'T' => "BINSTRING", b'U' => "SHORT_BINSTRING", b'V' => "UNICODE",
        b'X' => "BINUNICODE", b'a' => "APPEND", b'b' => "BUILD", b'c' => "GLOBAL", b'd' => "DICT",
        b'}' => "EMPTY_DICT", b'e' => "APPENDS", b'g' => "GET", b'h' => "BINGET", b'i' => "INST",
        b'j' => "LONG_BINGET", b'l' => "LIST", b']' => "EMPTY_LIST", b'o' => "OBJ", b'p' => "PUT",
        b'q' => "BINPUT", b'r' => "LONG_BINPUT", b's' => "SETITEM", b't' => "TUPLE",
        b')' => "EMPTY_TUPLE", b'u' => "SETITEMS", b'G' => "BINFLOAT", b'B' => "BINBYTES",
        b'C' => "SHORT_BINBYTES", 0x80 => "PROTO", 0x81 => "NEWOBJ", 0x82 => "EXT1", 0x83 => "EXT2",
        0x84 => "EXT4", 0x85 => "TUPLE1", 0x86 => "TUPLE2", 0x87 => "TUPLE3", 0x88 => "NEWTRUE",
        0x89 => "NEWFALSE", 0x8a => "LONG1", 0x8b => "LONG4", 0x8c => "SHORT_BINUNICODE",
        0x8d => "BINUNICODE8", 0x8e => "BINBYTES8", 0x8f => "EMPTY_SET", 0x90 => "ADDITEMS",
        0x91 => "FROZENSET", 0x92 => "NEWOBJ_EX", 0x93 => "STACK_GLOBAL", 0x94 => "MEMOIZE",
        0x95 => "FRAME", 0x96 => "BYTEARRAY8", 0x97 => "NEXT_BUFFER", 0x98 => "READONLY_BUFFER",
        _ => "unknown opcode",
    }
}

#[cfg(test)]
mod tests;
