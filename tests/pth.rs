//! `torch.save` archives: a real-PyTorch fixture, writer round trips (ours and torch.load), and
//! hostile archives that must be refused with the offender named and nothing executed.

use std::path::{Path, PathBuf};
use std::process::Command;

use limelight::checkpoint::Dtype;
use limelight::checkpoint::pickle::unpickle;
use limelight::checkpoint::pth::PthArchive;
use limelight::synth::pth_writer::zip_writer::ZipWriter;
use limelight::synth::pth_writer::{PthTensorOut, write_state_dict, write_state_dict_with_id};
use proptest::prelude::*;
use serde_json::Value as Json;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/torch_save").join(name)
}

/// Python with torch: `LIMELIGHT_TORCH_PYTHON`, else `python3`; `None` (and a visible line) if absent.
fn torch_python() -> Option<String> {
    let py = std::env::var("LIMELIGHT_TORCH_PYTHON").unwrap_or_else(|_| "python3".into());
    let ok = Command::new(&py).args(["-c", "import torch"]).output().is_ok_and(|o| o.status.success());
    if !ok {
        println!("skipped: torch not installed (set LIMELIGHT_TORCH_PYTHON to a python with torch)");
    }
    ok.then_some(py)
}

/// Every record of a zip archive, in order.
fn records(path: &Path) -> Vec<(String, Vec<u8>)> {
    let mut zip = zip::ZipArchive::new(std::fs::File::open(path).unwrap()).unwrap();
    (0..zip.len())
        .map(|i| {
            let mut f = zip.by_index(i).unwrap();
            let mut data = Vec::new();
            std::io::Read::read_to_end(&mut f, &mut data).unwrap();
            (f.name().unwrap().into_owned(), data)
        })
        .collect()
}

fn write_zip(path: &Path, records: &[(String, Vec<u8>)]) {
    let mut zip = ZipWriter::new(std::fs::File::create(path).unwrap());
    for (name, data) in records {
        zip.add(name, data).unwrap();
    }
    zip.finish().unwrap();
}

fn tensor(name: &str, dtype: Dtype, shape: &[usize], f: impl Fn(usize) -> f64) -> PthTensorOut {
    let n: usize = shape.iter().product();
    let data = (0..n)
        .flat_map(|j| {
            let v = f(j);
            match dtype {
                Dtype::F32 => (v as f32).to_le_bytes().to_vec(),
                Dtype::F16 => half::f16::from_f64(v).to_le_bytes().to_vec(),
                Dtype::BF16 => half::bf16::from_f64(v).to_le_bytes().to_vec(),
                Dtype::F64 => v.to_le_bytes().to_vec(),
                Dtype::Bool => vec![u8::from(v > 0.0)],
                Dtype::U8 | Dtype::I8 => vec![v as i64 as u8],
                Dtype::I16 => (v as i16).to_le_bytes().to_vec(),
                Dtype::I32 => (v as i32).to_le_bytes().to_vec(),
                Dtype::I64 => (v as i64).to_le_bytes().to_vec(),
                Dtype::F8E4M3 | Dtype::F8E5M2 => unreachable!(),
            }
        })
        .collect();
    PthTensorOut { name: name.into(), dtype, shape: shape.to_vec(), data }
}

/// The tensors of `plain.pth`, exactly as `make_torch_save_fixture.py` builds them.
fn plain_tensors() -> Vec<PthTensorOut> {
    let dtypes = [Dtype::F32, Dtype::F16, Dtype::BF16, Dtype::Bool];
    let shapes: [&[usize]; 6] = [&[2, 3], &[4], &[], &[1, 2, 1, 2], &[0, 3], &[3, 1]];
    (0..36)
        .map(|i| {
            let shape = if i == 6 { &[260][..] } else { shapes[i % 6] };
            tensor(&format!("layers.{i}.weight"), dtypes[i % 4], shape, |j| ((i * 7 + j * 3) % 17) as f64 * 0.25 - 2.0)
        })
        .collect()
}

/// A mixed state dict: every writable dtype, 0-dim, empty, > 65535-element, and > 1000 entries
/// (so the pickle needs a second SETITEMS batch and a lone SETITEM).
fn mixed_tensors() -> Vec<PthTensorOut> {
    let mut v = vec![
        tensor("enc.w", Dtype::F32, &[3, 5], |j| j as f64 * 0.37 - 2.0),
        tensor("enc.h", Dtype::F16, &[2, 2, 2], |j| j as f64 / 3.0),
        tensor("dec.b", Dtype::BF16, &[7], |j| 1e30 / (j as f64 + 1.0)),
        tensor("dec.mask", Dtype::Bool, &[2, 3], |j| (j % 2) as f64),
        tensor("f64", Dtype::F64, &[2], |j| j as f64 + 0.125),
        tensor("i64", Dtype::I64, &[2], |j| -(j as f64) - 5.0),
        tensor("i32", Dtype::I32, &[2], |j| j as f64 * 100000.0),
        tensor("i16", Dtype::I16, &[2], |j| -300.0 + j as f64),
        tensor("i8", Dtype::I8, &[2], |j| -3.0 + j as f64),
        tensor("u8.big", Dtype::U8, &[70_000], |j| (j % 251) as f64),
        tensor("scalar", Dtype::F32, &[], |_| 3.5),
        tensor("empty", Dtype::F16, &[0, 4], |_| 0.0),
    ];
    v.extend((0..1000).map(|i| tensor(&format!("many.{i}"), Dtype::F32, &[1], |_| i as f64)));
    v
}

/// Writes a sidecar in `small.json`'s schema for `check_torch_load.py`.
fn write_sidecar(path: &Path, tensors: &[PthTensorOut], archive: &PthArchive) {
    let rows: Vec<Json> = tensors
        .iter()
        .map(|t| {
            let bytes = archive.contiguous_bytes(archive.get(&t.name).unwrap());
            let values: Vec<f64> = match t.dtype {
                Dtype::F32 | Dtype::F16 | Dtype::BF16 => {
                    archive.to_f32_vec(&t.name).unwrap().into_iter().map(f64::from).collect()
                }
                Dtype::F64 => bytes.chunks(8).map(|c| f64::from_le_bytes(c.try_into().unwrap())).collect(),
                Dtype::Bool | Dtype::U8 => bytes.iter().map(|&b| f64::from(b)).collect(),
                Dtype::I8 => bytes.iter().map(|&b| f64::from(b as i8)).collect(),
                Dtype::I16 => bytes.chunks(2).map(|c| f64::from(i16::from_le_bytes([c[0], c[1]]))).collect(),
                Dtype::I32 => bytes.chunks(4).map(|c| f64::from(i32::from_le_bytes(c.try_into().unwrap()))).collect(),
                Dtype::I64 => bytes.chunks(8).map(|c| i64::from_le_bytes(c.try_into().unwrap()) as f64).collect(),
                _ => unreachable!(),
            };
            serde_json::json!({"name": t.name, "dtype": t.dtype.to_string(), "shape": t.shape, "values": values})
        })
        .collect();
    std::fs::write(path, serde_json::json!({ "tensors": rows }).to_string()).unwrap();
}

#[test]
fn torch_fixture_reads_exactly() {
    let sidecar: Json = serde_json::from_str(&std::fs::read_to_string(fixture("small.json")).unwrap()).unwrap();
    println!("fixture written by torch {}", sidecar["torch_version"]);
    let expected = sidecar["tensors"].as_array().unwrap();
    let archive = PthArchive::open(&fixture("small.pth")).unwrap();
    assert_eq!(archive.path(), fixture("small.pth"));
    let names: Vec<&str> = archive.tensors().map(|(n, _)| n).collect();
    let want: Vec<&str> = expected.iter().map(|e| e["name"].as_str().unwrap()).collect();
    assert_eq!(names, want, "file order");
    let usizes = |j: &Json| j.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect::<Vec<_>>();
    for e in expected {
        let name = e["name"].as_str().unwrap();
        let t = archive.get(name).unwrap();
        assert_eq!(t.dtype.to_string(), e["dtype"].as_str().unwrap(), "{name}");
        assert_eq!(t.shape, usizes(&e["shape"]), "{name}");
        assert_eq!(t.strides, usizes(&e["strides"]), "{name}");
        assert_eq!(t.storage_offset as u64, e["storage_offset"].as_u64().unwrap(), "{name}");
        assert_eq!((t.storage.len() / t.dtype.size()) as u64, e["storage_numel"].as_u64().unwrap(), "{name}");
        // Every value is an exact f32; serde_json's default float parsing can be 1 ulp off in f64,
        // which rounding to f32 removes, so the comparison is exact in f32.
        let want: Vec<f32> = e["values"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
        let got: Vec<f32> = if t.dtype == Dtype::Bool {
            archive.contiguous_bytes(t).iter().map(|&b| f32::from(b)).collect()
        } else {
            archive.to_f32_vec(name).unwrap()
        };
        assert_eq!(got, want, "{name}");
    }
    let view = archive.get("view.t").unwrap();
    assert!(!view.is_contiguous());
    assert!(matches!(archive.contiguous_bytes(view), std::borrow::Cow::Owned(_)));
    let (head, tail) = (archive.get("shared.head").unwrap(), archive.get("shared.tail").unwrap());
    assert_eq!((head.storage.clone(), tail.storage_offset), (tail.storage.clone(), 3));
    assert!(matches!(archive.contiguous_bytes(tail), std::borrow::Cow::Borrowed(_)));
    let e = archive.to_f32_vec("buf.mask").unwrap_err().to_string();
    assert!(e.contains("small.pth") && e.contains("buf.mask") && e.contains("BOOL"), "{e}");
    let e = archive.to_f32_vec("nope").unwrap_err().to_string();
    assert!(e.contains("small.pth") && e.contains("`nope`"), "{e}");
}

#[test]
fn writer_matches_torch_byte_for_byte() {
    let torch_bytes = std::fs::read(fixture("plain.pth")).unwrap();
    let id = records(&fixture("plain.pth")).into_iter().find(|(n, _)| n == "plain/.data/serialization_id").unwrap().1;
    let dir = tempfile::tempdir().unwrap();
    let ours = dir.path().join("plain.pth");
    write_state_dict_with_id(&ours, plain_tensors().into_iter(), std::str::from_utf8(&id).unwrap()).unwrap();
    let ours = std::fs::read(ours).unwrap();
    let first_diff = ours.iter().zip(&torch_bytes).position(|(a, b)| a != b);
    assert_eq!((first_diff, ours.len()), (None, torch_bytes.len()), "first differing byte, our length");
}

#[test]
fn writer_reader_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("round.trip.pth");
    write_state_dict(&path, mixed_tensors().into_iter()).unwrap();
    let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(leftovers, ["round.trip.pth"], "the spool file is removed");
    assert_eq!(records(&path)[0].0, "round.trip/data.pkl", "torch's folder: the name up to its last dot");
    let archive = PthArchive::open(&path).unwrap();
    let tensors = mixed_tensors();
    assert_eq!(archive.len(), tensors.len());
    for ((name, got), want) in archive.tensors().zip(&tensors) {
        assert_eq!((name, got.dtype, &got.shape), (want.name.as_str(), want.dtype, &want.shape));
        assert!(got.is_contiguous() && got.storage.start % 64 == 0, "{name}");
        assert_eq!(*archive.contiguous_bytes(got), want.data[..], "{name}");
    }
}

#[test]
fn writer_output_loads_in_torch() {
    let Some(py) = torch_python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mixed.pth");
    write_state_dict(&path, mixed_tensors().into_iter()).unwrap();
    write_sidecar(&dir.path().join("mixed.json"), &mixed_tensors(), &PthArchive::open(&path).unwrap());
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/fixtures/check_torch_load.py");
    let out = Command::new(py).arg(script).arg(dir.path()).output().unwrap();
    let log = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    assert!(log.contains(&format!("{} tensors match", mixed_tensors().len())), "{log}");
}

// ---- hostile input ----------------------------------------------------------------------------

/// Builds `dir/<stem>.pth` holding a custom pickle plus the given extra records.
fn hostile(dir: &Path, pickle: &[u8], extra: &[(&str, &[u8])]) -> PathBuf {
    let path = dir.join("evil.pth");
    let mut recs = vec![("evil/data.pkl".to_string(), pickle.to_vec())];
    recs.extend(extra.iter().map(|(n, d)| (format!("evil/{n}"), d.to_vec())));
    write_zip(&path, &recs);
    path
}

fn open_err(path: &Path) -> String {
    let e = PthArchive::open(path).expect_err("must be refused").to_string();
    assert!(e.starts_with(&path.display().to_string()), "error names the file: {e}");
    e
}

fn binunicode(s: &str) -> Vec<u8> {
    [&[b'X'][..], &(s.len() as u32).to_le_bytes(), s.as_bytes()].concat()
}

/// `{name: _rebuild_tensor_v2(('storage', FloatStorage, '0', 'cpu', numel), offset, (a, b), (sa, sb), …)}`.
fn one_tensor_pickle(name: &str, numel: u8, offset: u8, shape: [u8; 2], stride: [u8; 2]) -> Vec<u8> {
    let od: &[u8] = b"ccollections\nOrderedDict\n)R";
    [
        &[0x80, 2][..],
        od,
        &binunicode(name),
        b"ctorch._utils\n_rebuild_tensor_v2\n((",
        &binunicode("storage"),
        b"ctorch\nFloatStorage\n",
        &binunicode("0"),
        &binunicode("cpu"),
        &[
            b'K', numel, b't', b'Q', b'K', offset, b'K', shape[0], b'K', shape[1], 0x86, b'K', stride[0], b'K',
            stride[1], 0x86, 0x89,
        ],
        od,
        b"tRs.",
    ]
    .concat()
}

#[test]
fn os_system_payload_is_refused_and_not_run() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("pwned");
    let payload =
        [&b"\x80\x02cos\nsystem\n"[..], &binunicode(&format!("touch {}", marker.display())), b"\x85R."].concat();
    let e = open_err(&hostile(dir.path(), &payload, &[]));
    assert!(e.contains("`os system`") && e.contains("data.pkl"), "{e}");
    assert!(!marker.exists(), "the payload ran");
    // The payload is live: Python's own unpickler runs it (when python3 is around to show it).
    let live = dir.path().join("live");
    let live_payload =
        [&b"\x80\x02cos\nsystem\n"[..], &binunicode(&format!("touch {}", live.display())), b"\x85R."].concat();
    let hex: String = live_payload.iter().map(|b| format!("{b:02x}")).collect();
    let script = "import pickle,sys; pickle.loads(bytes.fromhex(sys.argv[1]))";
    if let Ok(out) = Command::new("python3").args(["-c", script, &hex]).output() {
        assert!(out.status.success() && live.exists(), "control: python's pickle should have run it");
    }
}

#[test]
fn reduce_of_unlisted_callables_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let eval = [&b"\x80\x02cbuiltins\neval\n"[..], &binunicode("1+1"), b"\x85R."].concat();
    let e = open_err(&hostile(dir.path(), &eval, &[]));
    assert!(e.contains("`builtins eval`"), "{e}");
    let storage_call = b"\x80\x02ctorch\nFloatStorage\n)R.";
    let e = open_err(&hostile(dir.path(), storage_call, &[]));
    assert!(e.contains("REDUCE of `torch FloatStorage` refused"), "{e}");
    let e = open_err(&hostile(dir.path(), b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n)R.", &[]));
    assert!(e.contains("_rebuild_tensor_v2") && e.contains("got 0"), "{e}");
}

#[test]
fn broken_archives_are_refused_with_the_culprit_named() {
    let dir = tempfile::tempdir().unwrap();
    let good = one_tensor_pickle("w", 6, 0, [2, 3], [3, 1]);
    let data = [0u8; 24];
    assert!(PthArchive::open(&hostile(dir.path(), &good, &[("data/0", &data)])).is_ok(), "control");

    let e = open_err(&hostile(dir.path(), &good[..good.len() - 9], &[("data/0", &data)]));
    assert!(e.contains("truncated"), "{e}");
    let e = open_err(&hostile(dir.path(), &good, &[("data/1", &data)]));
    assert!(
        e.contains("tensor `w`") && e.contains("storage `0`") && e.contains("evil/data/0") && e.contains("missing"),
        "{e}"
    );
    let e = open_err(&hostile(dir.path(), &good, &[("data/0", &data[..23])]));
    assert!(e.contains("tensor `w`") && e.contains("24 bytes") && e.contains("23 bytes"), "{e}");
    let past = one_tensor_pickle("v", 6, 1, [2, 3], [3, 1]); // offset 1: last element is index 6
    let e = open_err(&hostile(dir.path(), &past, &[("data/0", &data)]));
    assert!(e.contains("tensor `v`") && e.contains("reaches past its storage"), "{e}");
    let strided = one_tensor_pickle("s", 6, 0, [2, 3], [3, 2]);
    let e = open_err(&hostile(dir.path(), &strided, &[("data/0", &data)]));
    assert!(e.contains("tensor `s`") && e.contains("strides [3, 2]"), "{e}");
    let bad_pid = b"\x80\x02(X\x03\x00\x00\x00fooK\x01tQ.";
    let e = open_err(&hostile(dir.path(), bad_pid, &[]));
    assert!(e.contains("persistent id is not a ('storage'"), "{e}");
    let e = open_err(&hostile(dir.path(), &good, &[("byteorder", b"big"), ("data/0", &data)]));
    assert!(e.contains("byteorder") && e.contains("big"), "{e}");
    let not_tensor = [&b"\x80\x02}"[..], &binunicode("epoch"), b"K\x03s."].concat();
    let e = open_err(&hostile(dir.path(), &not_tensor, &[]));
    assert!(e.contains("`epoch` is a int"), "{e}");
    let e = open_err(&hostile(dir.path(), b"\x80\x02]", &[]));
    assert!(e.contains("truncated"), "{e}");
}

#[test]
fn compressed_entries_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("deflated.pth");
    write_state_dict(&path, mixed_tensors().into_iter().take(2)).unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    // Mark `deflated/data/1` as deflate (method 8) in its local and central headers.
    let name = b"deflated/data/1";
    let hits: Vec<usize> = (0..bytes.len() - name.len()).filter(|&i| &bytes[i..i + name.len()] == name).collect();
    assert_eq!(hits.len(), 2);
    bytes[hits[0] - 30 + 8] = 8;
    bytes[hits[1] - 46 + 10] = 8;
    std::fs::write(&path, bytes).unwrap();
    let e = open_err(&path);
    assert!(e.contains("`deflated/data/1` is compressed"), "{e}");
}

#[test]
fn wrapped_and_prefixed_state_dicts_are_normalised() {
    let dir = tempfile::tempdir().unwrap();
    let inner = one_tensor_pickle("generator.w", 6, 0, [2, 3], [3, 1]);
    // {'state_dict': <inner dict>, 'epoch': 3}: splice the inner pickle's body into a wrapper dict.
    let body = &inner[2..inner.len() - 1]; // strip PROTO and STOP; leaves the dict on the stack
    let wrapped = [&b"\x80\x02}("[..], &binunicode("state_dict"), body, &binunicode("step"), b"K\x03u."].concat();
    let archive = PthArchive::open(&hostile(dir.path(), &wrapped, &[("data/0", &[0u8; 24])])).unwrap();
    assert_eq!(archive.tensors().map(|(n, _)| n).collect::<Vec<_>>(), ["w"]);
}

/// With `LIMELIGHT_TORCH_BIG_PTH` naming the file this Python wrote, the bytes are compared too:
/// `torch.save(OrderedDict([("small", torch.ones(4)), ("big", torch.zeros(2**32 + 64, dtype=torch.uint8)),
/// ("after", torch.full((3,), 2.0))]), "big.pth")`.
#[test]
#[ignore = "writes two 4 GiB files; run with --ignored to check the zip64 path end to end"]
fn zip64_archive_over_4gib_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.pth");
    let n = (1 << 32) + 64;
    let big = PthTensorOut { name: "big".into(), dtype: Dtype::U8, shape: vec![n], data: vec![0; n] };
    let tensors = vec![tensor("small", Dtype::F32, &[4], |_| 1.0), big, tensor("after", Dtype::F32, &[3], |_| 2.0)];
    let reference = std::env::var_os("LIMELIGHT_TORCH_BIG_PTH").map(PathBuf::from);
    let id = match &reference {
        Some(r) => {
            let mut zip = zip::ZipArchive::new(std::fs::File::open(r).unwrap()).unwrap();
            let mut id = String::new();
            std::io::Read::read_to_string(&mut zip.by_name("big/.data/serialization_id").unwrap(), &mut id).unwrap();
            id
        }
        None => "0".repeat(40),
    };
    write_state_dict_with_id(&path, tensors.into_iter(), &id).unwrap();
    let archive = PthArchive::open(&path).unwrap();
    assert_eq!(archive.to_f32_vec("after").unwrap(), [2.0; 3]);
    assert!(archive.get("after").unwrap().storage.start > 1 << 32);
    assert_eq!(archive.get("big").unwrap().storage.len(), n);
    if let Some(r) = reference {
        let (mut ours, mut theirs) = (std::fs::File::open(&path).unwrap(), std::fs::File::open(r).unwrap());
        let (mut a, mut b) = (vec![0u8; 1 << 24], vec![0u8; 1 << 24]);
        let mut at = 0usize;
        loop {
            let k = std::io::Read::read(&mut ours, &mut a).unwrap();
            std::io::Read::read_exact(&mut theirs, &mut b[..k]).unwrap();
            assert!(a[..k] == b[..k], "bytes differ from torch's within [{at}, {})", at + k);
            at += k;
            if k == 0 {
                assert_eq!(std::io::Read::read(&mut theirs, &mut b).unwrap(), 0, "torch's file is longer");
                break;
            }
        }
    }
    if let Some(py) = torch_python() {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/fixtures/check_torch_load.py");
        let out = Command::new(py).arg(script).arg(&path).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
}

// ---- robustness -------------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_pickles_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = unpickle(&bytes);
        let _ = unpickle(&[&[0x80, 2][..], &bytes].concat());
    }

    #[test]
    fn mutated_pickles_never_panic(edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6), cut in any::<usize>()) {
        let mut p = one_tensor_pickle("w", 6, 0, [2, 3], [3, 1]);
        for (i, b) in edits {
            let n = p.len();
            p[i % n] = b;
        }
        let cut = cut % (p.len() + 1);
        let _ = unpickle(&p[..cut]);
    }

    #[test]
    fn arbitrary_files_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048), edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..8)) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.pth");
        std::fs::write(&path, &bytes).unwrap();
        let _ = PthArchive::open(&path);
        // Mutations of a valid archive get much further into the reader than random bytes.
        let mut valid = std::fs::read(fixture("small.pth")).unwrap();
        for (i, b) in edits {
            let n = valid.len();
            valid[i % n] = b;
        }
        std::fs::write(&path, &valid).unwrap();
        if let Ok(a) = PthArchive::open(&path) {
            for (name, t) in a.tensors() {
                let _ = a.contiguous_bytes(t);
                let _ = a.to_f32_vec(name);
            }
        }
    }
}
