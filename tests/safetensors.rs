//! The safetensors header parser: every dtype we read, and arbitrary bytes never panic.

use std::path::Path;

use limelight::checkpoint::Dtype;
use limelight::checkpoint::safetensors::parse_header;
use proptest::prelude::*;
use serde_json::json;

/// A file with `header` (JSON) followed by `data_len` zero bytes.
fn file(header: &serde_json::Value, data_len: usize) -> Vec<u8> {
    let text = header.to_string().into_bytes();
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&text);
    out.resize(out.len() + data_len, 0);
    out
}

#[test]
fn every_supported_dtype_parses_with_absolute_offsets() {
    let dtypes = ["BOOL", "U8", "I8", "I16", "I32", "I64", "F8_E4M3", "F8_E5M2", "F16", "BF16", "F32", "F64"];
    let mut header = serde_json::Map::new();
    let mut offset = 0;
    for name in dtypes {
        let d = Dtype::from_safetensors_name(name).unwrap();
        let bytes = 6 * d.size();
        header.insert(
            name.to_lowercase(),
            json!({"dtype": name, "shape": [2, 3], "data_offsets": [offset, offset + bytes]}),
        );
        offset += bytes;
    }
    header.insert("__metadata__".into(), json!({"format": "pt"}));
    let header = serde_json::Value::Object(header);
    let bytes = file(&header, offset);
    let tensors = parse_header(Path::new("x.safetensors"), &bytes).unwrap();
    assert_eq!(tensors.len(), dtypes.len());
    let start = bytes.len() - offset;
    assert_eq!(tensors["i64"].dtype, Dtype::I64);
    assert_eq!(tensors["bool"].bytes.start, start);
    assert_eq!(tensors["f64"].bytes.end, bytes.len());
}

#[test]
fn refusals_name_the_tensor() {
    let cases = [
        (json!({"w": {"dtype": "F4", "shape": [2], "data_offsets": [0, 1]}}), 1, "unsupported dtype F4"),
        (json!({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}), 8, "needs 12 bytes"),
        (json!({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}), 4, "outside the 4 data bytes"),
        (json!({"w": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}), 8, "`shape`"),
        (json!({"w": {"dtype": "F32", "shape": [2]}}), 8, "`data_offsets`"),
        (json!({"w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}}), 8, "outside"),
        (json!({"w": {"dtype": "U8", "shape": [usize::MAX, 4], "data_offsets": [0, 4]}}), 4, "overflows"),
    ];
    for (header, data_len, expected) in cases {
        let msg = parse_header(Path::new("s.safetensors"), &file(&header, data_len)).unwrap_err().to_string();
        assert!(msg.contains("s.safetensors") && msg.contains("`w`") && msg.contains(expected), "{msg}");
    }
    let meta = json!({"__metadata__": {"format": 3}});
    let msg = parse_header(Path::new("s.safetensors"), &file(&meta, 0)).unwrap_err().to_string();
    assert!(msg.contains("__metadata__"), "{msg}");
    let msg = parse_header(Path::new("s.safetensors"), b"\x05\0\0").unwrap_err().to_string();
    assert!(msg.contains("too short"), "{msg}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = parse_header(Path::new("fuzz.safetensors"), &bytes);
    }

    #[test]
    fn arbitrary_headers_never_panic(
        dtype in prop::sample::select(vec!["F32", "BF16", "F8_E4M3", "I64", "BOOL", "X"]),
        shape in proptest::collection::vec(0u64..u64::MAX, 0..4),
        begin in 0u64..u64::MAX,
        end in 0u64..u64::MAX,
        data_len in 0usize..64,
    ) {
        let header = json!({"t": {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}});
        let _ = parse_header(Path::new("fuzz.safetensors"), &file(&header, data_len));
    }

    #[test]
    fn valid_layouts_always_parse(sizes in proptest::collection::vec(0usize..40, 1..8)) {
        let mut header = serde_json::Map::new();
        let mut offset = 0;
        for (i, n) in sizes.iter().enumerate() {
            header.insert(format!("t{i}"), json!({"dtype": "BF16", "shape": [n], "data_offsets": [offset, offset + 2 * n]}));
            offset += 2 * n;
        }
        let tensors = parse_header(Path::new("ok.safetensors"), &file(&serde_json::Value::Object(header), offset)).unwrap();
        prop_assert_eq!(tensors.len(), sizes.len());
    }
}
