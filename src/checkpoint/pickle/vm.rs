//! The opcode loop of the restricted unpickler: stack, marks, memo and their limits.

use std::collections::HashMap;
use std::rc::Rc;

use super::{
    Dict, Global, MAX_LINE, MAX_MEMO, MAX_STACK, PickleError, PickleErrorKind, Seq, Step, Value, bad, nested_depth,
    opcode_name, reduce, storage_ref,
};

pub(super) fn run(data: &[u8]) -> Result<Value, PickleError> {
    Vm {
        data,
        pos: 0,
        op_start: 0,
        stack: Vec::new(),
        marks: Vec::new(),
        memo: HashMap::new(),
        // Generous for real pickles (which copy nothing) yet linear in the input.
        copy_budget: 4096 + 4 * data.len(),
    }
    .run()
}

struct Vm<'a> {
    data: &'a [u8],
    pos: usize,
    op_start: usize,
    stack: Vec<Value>,
    marks: Vec<usize>,
    memo: HashMap<u32, Value>,
    /// Items copy-on-write may still copy (see the module docs).
    copy_budget: usize,
}

impl Vm<'_> {
    fn run(mut self) -> Result<Value, PickleError> {
        loop {
            self.op_start = self.pos;
            match self.step() {
                Ok(Some(v)) => return Ok(v),
                Ok(None) => {}
                Err(kind) => {
                    return Err(PickleError { offset: self.op_start, kind });
                }
            }
        }
    }

    fn take(&mut self, n: usize, what: &'static str) -> Step<&[u8]> {
        // `n` comes from the input: compare against what is left before touching memory.
        if n > self.data.len() - self.pos {
            return Err(PickleErrorKind::Truncated(what));
        }
        let s = &self.data[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn u8(&mut self, what: &'static str) -> Step<u8> {
        Ok(self.take(1, what)?[0])
    }

    fn u16(&mut self, what: &'static str) -> Step<u16> {
        let b = self.take(2, what)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&mut self, what: &'static str) -> Step<u32> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn line(&mut self, what: &'static str) -> Step<String> {
        let rest = &self.data[self.pos..];
        let window = &rest[..rest.len().min(MAX_LINE + 1)];
        let Some(n) = window.iter().position(|&b| b == b'\n') else {
            return if rest.len() > MAX_LINE {
                bad(format!("{what} longer than {MAX_LINE} bytes"))
            } else {
                Err(PickleErrorKind::Truncated(what))
            };
        };
        let s =
            std::str::from_utf8(&rest[..n]).map_err(|_| PickleErrorKind::Malformed(format!("{what} is not UTF-8")))?;
        let s = s.to_owned();
        self.pos += n + 1;
        Ok(s)
    }

    fn string(&mut self, len: usize) -> Step<Value> {
        let b = self.take(len, "string")?;
        let s = std::str::from_utf8(b).map_err(|_| PickleErrorKind::Malformed("string is not UTF-8".into()))?;
        Ok(Value::Str(Rc::from(s)))
    }

    fn push(&mut self, v: Value) -> Step<()> {
        if self.stack.len() + self.marks.len() >= MAX_STACK {
            return bad(format!("stack deeper than {MAX_STACK}"));
        }
        self.stack.push(v);
        Ok(())
    }

    fn floor(&self) -> usize {
        self.marks.last().copied().unwrap_or(0)
    }

    fn pop(&mut self) -> Step<Value> {
        if self.stack.len() <= self.floor() {
            return bad("stack underflow");
        }
        Ok(self.stack.pop().expect("checked above"))
    }

    fn top(&mut self) -> Step<&mut Value> {
        if self.stack.len() <= self.floor() {
            return bad("stack underflow");
        }
        Ok(self.stack.last_mut().expect("checked above"))
    }

    fn pop_mark(&mut self) -> Step<Vec<Value>> {
        let Some(m) = self.marks.pop() else {
            return bad("no MARK on the stack");
        };
        Ok(self.stack.split_off(m))
    }

    fn memo_put(&mut self, idx: u32) -> Step<()> {
        let v = self.top()?.clone();
        if self.memo.len() >= MAX_MEMO && !self.memo.contains_key(&idx) {
            return bad(format!("more than {MAX_MEMO} memo entries"));
        }
        self.memo.insert(idx, v);
        Ok(())
    }

    fn memo_get(&mut self, idx: u32) -> Step<()> {
        let Some(v) = self.memo.get(&idx).cloned() else {
            return bad(format!("memo entry {idx} is missing"));
        };
        self.push(v)
    }

    /// Charges a copy-on-write copy of `len` items if the container is shared.
    fn charge(&mut self, shared: bool, len: usize) -> Step<()> {
        if shared {
            if len > self.copy_budget {
                return bad("too many copies of shared containers");
            }
            self.copy_budget -= len;
        }
        Ok(())
    }

    /// APPEND(S) (`op` starts with `A`) onto the list, or SETITEM(S) onto the dict, on top of the stack.
    fn extend_top(&mut self, items: Vec<Value>, op: &str) -> Step<()> {
        let appending = op.starts_with('A');
        let (shared, len) = match self.top()? {
            Value::List(l) if appending => (Rc::strong_count(l) > 1, l.items.len()),
            Value::Dict(d) if !appending && items.len().is_multiple_of(2) => (Rc::strong_count(d) > 1, d.items.len()),
            Value::Dict(_) if !appending => return bad(format!("{op} with an odd number of items")),
            other => return bad(format!("{op} on a {}", other.type_name())),
        };
        self.charge(shared, len)?;
        let child = nested_depth(items.iter()).map_err(PickleErrorKind::Malformed)?;
        match self.top()? {
            Value::List(l) => {
                let l = Rc::make_mut(l);
                l.depth = l.depth.max(child);
                l.items.extend(items);
            }
            Value::Dict(d) => {
                let d = Rc::make_mut(d);
                d.depth = d.depth.max(child);
                let mut it = items.into_iter();
                while let (Some(k), Some(v)) = (it.next(), it.next()) {
                    d.items.push((k, v));
                }
            }
            _ => unreachable!("checked above"),
        }
        Ok(())
    }

    fn step(&mut self) -> Step<Option<Value>> {
        let op = self.u8("opcode")?;
        match op {
            0x80 => {
                let v = self.u8("protocol")?;
                if v > 5 {
                    return bad(format!("unsupported protocol {v}"));
                }
            }
            b'c' => {
                let module = self.line("GLOBAL module")?;
                let name = self.line("GLOBAL name")?;
                let Some(g) = Global::lookup(&module, &name) else {
                    return Err(PickleErrorKind::Global {
                        module: module.escape_debug().to_string(),
                        name: name.escape_debug().to_string(),
                    });
                };
                self.push(Value::Global(g))?;
            }
            b'q' => {
                let i = self.u8("BINPUT index")?;
                self.memo_put(i.into())?;
            }
            b'r' => {
                let i = self.u32("LONG_BINPUT index")?;
                self.memo_put(i)?;
            }
            b'h' => {
                let i = self.u8("BINGET index")?;
                self.memo_get(i.into())?;
            }
            b'j' => {
                let i = self.u32("LONG_BINGET index")?;
                self.memo_get(i)?;
            }
            b'(' => {
                if self.stack.len() + self.marks.len() >= MAX_STACK {
                    return bad(format!("stack deeper than {MAX_STACK}"));
                }
                self.marks.push(self.stack.len());
            }
            b')' => self.push(Value::tuple(Vec::new()).map_err(PickleErrorKind::Malformed)?)?,
            b't' => {
                let items = self.pop_mark()?;
                self.push(Value::tuple(items).map_err(PickleErrorKind::Malformed)?)?;
            }
            0x85..=0x87 => {
                let n = usize::from(op - 0x84);
                if self.stack.len() < self.floor() + n {
                    return bad("stack underflow");
                }
                let items = self.stack.split_off(self.stack.len() - n);
                self.push(Value::tuple(items).map_err(PickleErrorKind::Malformed)?)?;
            }
            b'R' => {
                let args = self.pop()?;
                let callable = self.pop()?;
                let v = reduce(callable, args)?;
                self.push(v)?;
            }
            b'X' => {
                let n = self.u32("BINUNICODE length")? as usize;
                let v = self.string(n)?;
                self.push(v)?;
            }
            0x8c => {
                let n = usize::from(self.u8("SHORT_BINUNICODE length")?);
                let v = self.string(n)?;
                self.push(v)?;
            }
            b'B' | b'C' => {
                let n = if op == b'B' {
                    self.u32("BINBYTES length")? as usize
                } else {
                    usize::from(self.u8("SHORT_BINBYTES length")?)
                };
                let b = self.take(n, "bytes")?;
                let v = Value::Bytes(Rc::from(b));
                self.push(v)?;
            }
            b'J' => {
                let b = self.take(4, "BININT")?;
                let v = i32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                self.push(Value::Int(v.into()))?;
            }
            b'K' => {
                let v = self.u8("BININT1")?;
                self.push(Value::Int(v.into()))?;
            }
            b'M' => {
                let v = self.u16("BININT2")?;
                self.push(Value::Int(v.into()))?;
            }
            0x8a => {
                let n = usize::from(self.u8("LONG1 length")?);
                let b = self.take(n, "LONG1")?;
                if n > 8 {
                    return bad(format!("LONG1 of {n} bytes does not fit in 64 bits"));
                }
                // Little-endian two's complement, sign-extended from the last byte.
                let fill = if b.last().is_some_and(|&x| x & 0x80 != 0) { 0xff } else { 0 };
                let mut buf = [fill; 8];
                buf[..n].copy_from_slice(b);
                self.push(Value::Int(i64::from_le_bytes(buf)))?;
            }
            b'G' => {
                let b = self.take(8, "BINFLOAT")?;
                let v = f64::from_be_bytes(b.try_into().expect("8 bytes"));
                self.push(Value::Float(v))?;
            }
            b'Q' => {
                let pid = self.pop()?;
                let s = storage_ref(&pid)?;
                self.push(Value::Storage(Rc::new(s)))?;
            }
            0x88 => self.push(Value::Bool(true))?,
            0x89 => self.push(Value::Bool(false))?,
            b'N' => self.push(Value::None)?,
            b'}' => self.push(Value::Dict(Rc::new(Dict { ordered: false, items: Vec::new(), depth: 1 })))?,
            b']' => self.push(Value::List(Rc::new(Seq { items: Vec::new(), depth: 1 })))?,
            b'a' => {
                let v = self.pop()?;
                self.extend_top(vec![v], "APPEND")?;
            }
            b'e' => {
                let items = self.pop_mark()?;
                self.extend_top(items, "APPENDS")?;
            }
            b's' => {
                let v = self.pop()?;
                let k = self.pop()?;
                self.extend_top(vec![k, v], "SETITEM")?;
            }
            b'u' => {
                let items = self.pop_mark()?;
                self.extend_top(items, "SETITEMS")?;
            }
            b'b' => {
                // state_dict()'s `_metadata` attribute: accepted on an OrderedDict and dropped.
                let _state = self.pop()?;
                match self.top()? {
                    Value::Dict(d) if d.ordered => {}
                    other => {
                        return bad(format!("BUILD on a {} (only an OrderedDict may be built)", other.type_name()));
                    }
                }
            }
            b'.' => return self.pop().map(Some),
            other => {
                return Err(PickleErrorKind::Opcode { byte: other, name: opcode_name(other) });
            }
        }
        Ok(None)
    }
}
