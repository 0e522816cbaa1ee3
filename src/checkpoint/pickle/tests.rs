//! Unit tests for the restricted unpickler, on hand-assembled opcode streams.

use super::*;

/// Tiny assembler for test pickles.
#[derive(Default)]
struct P(Vec<u8>);

impl P {
    fn op(mut self, b: &[u8]) -> Self {
        self.0.extend_from_slice(b);
        self
    }
    fn global(self, module: &str, name: &str) -> Self {
        self.op(format!("c{module}\n{name}\n").as_bytes())
    }
    fn str(mut self, s: &str) -> Self {
        self.0.push(b'X');
        self.0.extend_from_slice(&(s.len() as u32).to_le_bytes());
        self.0.extend_from_slice(s.as_bytes());
        self
    }
    fn int(self, v: u8) -> Self {
        self.op(&[b'K', v])
    }
    fn ordered_dict(self) -> Self {
        self.global("collections", "OrderedDict").op(b")R")
    }
    /// `_rebuild_tensor_v2(storage(key, numel), offset, (d0, d1), (s0, s1), False, OrderedDict())`.
    fn tensor(self, class: &str, key: &str, numel: u8, shape: [u8; 2], stride: [u8; 2]) -> Self {
        self.global("torch._utils", "_rebuild_tensor_v2")
            .op(b"((")
            .str("storage")
            .global("torch", class)
            .str(key)
            .str("cpu")
            .int(numel)
            .op(b"tQ")
            .int(0)
            .int(shape[0])
            .int(shape[1])
            .op(&[0x86])
            .int(stride[0])
            .int(stride[1])
            .op(&[0x86, 0x89])
            .ordered_dict()
            .op(b"tR")
    }
}

fn state_dict() -> Vec<u8> {
    P::default()
        .op(&[0x80, 2])
        .ordered_dict()
        .op(b"q\x01(")
        .str("w")
        .tensor("FloatStorage", "0", 6, [2, 3], [3, 1])
        .str("m")
        .tensor("BoolStorage", "1", 4, [2, 2], [1, 2])
        .op(b"u}b.")
        .0
}

fn err(data: &[u8]) -> PickleError {
    unpickle(data).expect_err("must be refused")
}

#[test]
fn reads_a_torch_style_state_dict() {
    let v = unpickle(&state_dict()).unwrap();
    let d = v.as_dict().unwrap();
    assert!(d.ordered);
    assert_eq!(d.items.len(), 2);
    assert_eq!(d.items[0].0.as_str(), Some("w"));
    let Value::Tensor(t) = &d.items[1].1 else { panic!("not a tensor") };
    assert_eq!(t.storage.dtype, Dtype::Bool);
    assert_eq!(t.storage.key, "1");
    assert_eq!(t.storage.location, "cpu");
    assert_eq!(t.storage.numel, 4);
    assert_eq!((t.shape.as_slice(), t.strides.as_slice()), (&[2, 2][..], &[1, 2][..]));
    assert!(!t.requires_grad);
}

#[test]
fn every_truncation_is_an_error() {
    let full = state_dict();
    for n in 0..full.len() {
        let e = err(&full[..n]);
        assert!(matches!(e.kind, PickleErrorKind::Truncated(_) | PickleErrorKind::Malformed(_)), "{n}: {e}");
    }
}

#[test]
fn forbidden_global_is_named() {
    let e = err(&P::default().op(&[0x80, 2]).global("os", "system").str("touch x").op(b"\x85R.").0);
    assert_eq!(e.kind, PickleErrorKind::Global { module: "os".into(), name: "system".into() });
    assert_eq!(e.offset, 2);
    assert!(e.to_string().contains("`os system`"), "{e}");
    // Near misses of allow-listed names are still refused.
    assert!(matches!(err(&P::default().global("torch", "Storage").0).kind, PickleErrorKind::Global { .. }));
    assert!(matches!(
        err(&P::default().global("torch._utils", "_rebuild_qtensor").0).kind,
        PickleErrorKind::Global { .. }
    ));
}

#[test]
fn reduce_only_on_allow_listed_callables() {
    let e = err(&P::default().global("torch", "FloatStorage").op(b")R.").0);
    assert!(e.to_string().contains("REDUCE of `torch FloatStorage` refused"), "{e}");
    let e = err(&P::default().str("eval").op(b")R.").0);
    assert!(e.to_string().contains("REDUCE of `a str` refused"), "{e}");
    let e = err(&P::default().global("collections", "OrderedDict").op(b"]\x85R.").0);
    assert!(e.to_string().contains("collections OrderedDict"), "{e}");
    let e = err(&P::default().global("torch._utils", "_rebuild_tensor_v2").op(b")R.").0);
    assert!(e.to_string().contains("expects 6 or 7 arguments, got 0"), "{e}");
}

#[test]
fn unlisted_opcodes_are_named() {
    for (bytes, name) in [(&b"\x93"[..], "STACK_GLOBAL"), (b"i", "INST"), (b"\x81", "NEWOBJ"), (b"\xff", "unknown")] {
        let e = err(bytes);
        assert!(e.to_string().contains(name), "{e}");
        assert!(e.to_string().contains(&format!("{:#04x}", bytes[0])), "{e}");
    }
}

#[test]
fn parameter_and_scalars() {
    let p = P::default()
        .global("torch._utils", "_rebuild_parameter")
        .tensor("HalfStorage", "k", 9, [3, 3], [3, 1])
        .op(&[0x88])
        .ordered_dict()
        .op(&[0x87, b'R', b'.'])
        .0;
    let Value::Tensor(t) = unpickle(&p).unwrap() else { panic!() };
    assert!(t.requires_grad);
    assert_eq!(t.storage.dtype, Dtype::F16);
    let v = unpickle(
        &P::default()
            .op(b"(\x8a\x02\xff\x7f\x8a\x01\xff\x8a\x00J\xfe\xff\xff\xffM\x01\x02NG?\xf0\x00\x00\x00\x00\x00\x00t.")
            .0,
    );
    let Value::Tuple(t) = v.unwrap() else { panic!() };
    let want = [
        Value::Int(0x7fff),
        Value::Int(-1),
        Value::Int(0),
        Value::Int(-2),
        Value::Int(0x201),
        Value::None,
        Value::Float(1.0),
    ];
    assert_eq!(t.items, want);
}

#[test]
fn bad_persistent_ids_and_builds() {
    let e = err(&P::default().str("storage").op(b"\x85Q.").0);
    assert!(e.to_string().contains("persistent id is not a ('storage'"), "{e}");
    let e = err(&P::default().op(b"}}b.").0);
    assert!(e.to_string().contains("BUILD on a dict"), "{e}");
    assert!(err(b"}(K\x01K\x02e.").to_string().contains("APPENDS on a dict"));
    assert!(err(b"]K\x01K\x02s.").to_string().contains("SETITEM on a list"));
    let e = err(b"t.");
    assert!(e.to_string().contains("no MARK"), "{e}");
    let e = err(b"K\x01(.");
    assert!(e.to_string().contains("underflow"), "{e}");
    let e = err(b"h\x05.");
    assert!(e.to_string().contains("memo entry 5"), "{e}");
}

#[test]
fn nesting_is_capped() {
    let mut p = vec![b')'];
    p.extend(std::iter::repeat_n(0x85, MAX_DEPTH + 5));
    p.push(b'.');
    assert!(err(&p).to_string().contains("nested deeper"));
    // Growing depth by appending into a list is capped too.
    let mut p = vec![b']'];
    for _ in 0..MAX_DEPTH + 5 {
        p.extend_from_slice(b"q\x00]h\x00a");
    }
    assert!(err(&p).to_string().contains("nested deeper"));
}

#[test]
fn copy_on_write_is_budgeted() {
    // A growing list memoised after every append would copy quadratically without the budget.
    let mut p = vec![b']'];
    for i in 0..20_000u32 {
        p.push(b'r');
        p.extend_from_slice(&i.to_le_bytes());
        p.extend_from_slice(b"Na");
    }
    assert!(err(&p).to_string().contains("too many copies"));
}

#[test]
fn huge_length_fields_do_not_allocate() {
    assert!(matches!(err(b"X\xff\xff\xff\xff").kind, PickleErrorKind::Truncated(_)));
    assert!(matches!(err(b"B\xff\xff\xff\xffab").kind, PickleErrorKind::Truncated(_)));
    let long_line = [b"c".as_slice(), &[b'a'; 1000]].concat();
    assert!(err(&long_line).to_string().contains("longer than"));
}

#[test]
fn long_memo_indices() {
    let v = unpickle(b"K\x07r\x00\x01\x00\x00j\x00\x01\x00\x00\x86.").unwrap();
    assert_eq!(v, Value::tuple(vec![Value::Int(7), Value::Int(7)]).unwrap());
}
