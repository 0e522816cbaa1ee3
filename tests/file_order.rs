//! The file-order weight upload (`model::file_order`, issue 16's fast restarts) on a host-memory
//! backend: every weight copied as stored lands byte for byte where it was reserved, in every
//! read mode, with pieces small enough that tensors straddle them; the small tensors are
//! converted as before; and a NaN or an infinity anywhere is refused with the same message as
//! the model-order load's.

mod common;

use std::ops::Range;
use std::path::Path;
use std::sync::Mutex;

use common::tiny_checkpoint;
use limelight::backend::cpu::{Cpu, Matrix};
use limelight::backend::{BackendTypes, FileOrderUpload};
use limelight::checkpoint::TensorView;
use limelight::checkpoint::sequential::{AlignedBuffer, DIRECT_ALIGN, ReadMode};
use limelight::model::file_order::FileOrderOptions;
use limelight::model::load::Checkpoint;
use limelight::model::weights::{Accept, TensorSpec};
use serde_json::Value;

/// A weight of the host backend: reserved (its bytes arrive by the copies) or converted now.
enum HostWeight {
    Reserved,
    Converted,
}

/// A backend whose "device" is one host byte arena.
struct HostArena {
    memory: Mutex<Vec<u8>>,
    /// Each reserved weight: where it is and the bytes its file holds.
    reserved: Mutex<Vec<(usize, Vec<u8>)>>,
    next: Mutex<usize>,
    copied: Mutex<usize>,
}

impl HostArena {
    fn new(bytes: usize) -> HostArena {
        // 0xAB everywhere: a byte no copy wrote shows up in the comparison.
        HostArena {
            memory: Mutex::new(vec![0xAB; bytes]),
            reserved: Mutex::new(Vec::new()),
            next: Mutex::new(0),
            copied: Mutex::new(0),
        }
    }
}

impl BackendTypes for HostArena {
    type Act = Matrix;
    type Weight = HostWeight;

    fn upload(&self, _spec: &TensorSpec, _view: TensorView<'_>) -> HostWeight {
        HostWeight::Converted
    }
    fn upload_f32(&self, _shape: &[usize], _data: Vec<f32>) -> HostWeight {
        HostWeight::Converted
    }
    fn to_host(&self, a: &Matrix) -> Matrix {
        Cpu.to_host(a)
    }
    fn act_rows(&self, a: &Matrix, start: usize, count: usize) -> Matrix {
        Cpu.act_rows(a, start, count)
    }
    fn stack_rows(&self, parts: &[Matrix]) -> Matrix {
        Cpu.stack_rows(parts)
    }
}

impl FileOrderUpload for HostArena {
    type Staging = AlignedBuffer;
    type Fence = ();

    fn reserve(&self, spec: &TensorSpec, view: TensorView<'_>) -> (HostWeight, Option<u64>) {
        match spec.accept {
            Accept::Bf16 | Accept::Fp8E4M3 => {
                let mut next = self.next.lock().unwrap();
                let at = *next;
                *next += view.bytes.len();
                assert!(*next <= self.memory.lock().unwrap().len(), "the test arena is too small");
                self.reserved.lock().unwrap().push((at, view.bytes.to_vec()));
                (HostWeight::Reserved, Some(at as u64))
            }
            _ => (HostWeight::Converted, None),
        }
    }

    fn staging(&self, count: usize, bytes: usize) -> Result<Vec<AlignedBuffer>, String> {
        Ok((0..count).map(|_| AlignedBuffer::new(bytes)).collect())
    }

    fn copy_staged(&self, staging: &AlignedBuffer, copies: &[(Range<usize>, u64)]) {
        let mut memory = self.memory.lock().unwrap();
        for (range, dst) in copies {
            let dst = *dst as usize;
            memory[dst..dst + range.len()].copy_from_slice(&staging.as_ref()[range.clone()]);
            *self.copied.lock().unwrap() += range.len();
        }
    }

    fn wait(&self, _fence: ()) {}
}

fn arena_for(ckpt: &Checkpoint) -> HostArena {
    HostArena::new(ckpt.shard_tensor_bytes() as usize)
}

#[test]
fn every_weight_lands_as_stored_in_every_mode() {
    let dir = tiny_checkpoint();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    // Pieces of 64 KiB: many tensors straddle two or more of them.
    for (mode, readers) in [(ReadMode::Auto, 3), (ReadMode::Direct, 4), (ReadMode::Cached, 1)] {
        let arena = arena_for(&ckpt);
        let options = FileOrderOptions { mode, readers, piece_bytes: 16 * DIRECT_ALIGN };
        let mut reports = Vec::new();
        let (_weights, stats) = ckpt
            .upload_model_weights_in_file_order(&arena, options, 1 << 20, &mut |done, total| {
                reports.push((done, total))
            })
            .unwrap();
        let files: u64 = ckpt.shards.shard_paths().map(|p| std::fs::metadata(p).unwrap().len()).sum();
        assert_eq!(stats.bytes, files, "{mode:?}: every file read once, whole");
        assert_eq!(stats.cached + stats.direct + stats.buffered, stats.bytes);
        if mode == ReadMode::Cached {
            assert_eq!(stats.cached, stats.bytes);
        }
        assert!(reports.len() > 3 && reports.windows(2).all(|w| w[0].0 < w[1].0), "{mode:?}: progress rises");
        assert!(reports.iter().all(|&(done, total)| done <= total && total == files));

        let reserved = arena.reserved.lock().unwrap();
        assert!(reserved.len() > 20, "the tiny checkpoint has bf16 and FP8 weights");
        let memory = arena.memory.lock().unwrap();
        let wanted: usize = reserved.iter().map(|(_, want)| want.len()).sum();
        assert_eq!(*arena.copied.lock().unwrap(), wanted, "{mode:?}: each reserved byte copied once");
        for (at, want) in reserved.iter() {
            assert!(&memory[*at..at + want.len()] == want, "{mode:?}: a weight at {at} differs from its file bytes");
        }
    }
}

/// A shard's first tensor of `dtype` and its absolute byte offset.
fn first_tensor_of(shard: &Path, dtype: &str) -> Option<(String, usize)> {
    let bytes = std::fs::read(shard).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Map<String, Value> = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    header
        .iter()
        .filter(|(k, v)| *k != "__metadata__" && v["dtype"] == dtype)
        .map(|(k, v)| (k.clone(), 8 + n + v["data_offsets"][0].as_u64().unwrap() as usize))
        .min()
}

/// A NaN or an infinity in a weight copied as stored (bf16, FP8) or in a converted one (f32
/// scales) is refused naming the file, the tensor and the element: the message the model-order
/// load gives.
#[test]
fn a_non_finite_weight_is_refused_as_the_model_order_load_refuses_it() {
    for (dtype, element, bad) in
        [("BF16", 70_001usize, &[0x80u8, 0x7F][..]), ("F8_E4M3", 5, &[0xFF]), ("F32", 1, &[0, 0, 0xC0, 0x7F])]
    {
        let dir = tiny_checkpoint();
        let mut shards: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
            .collect();
        shards.sort();
        let (shard, at) = shards
            .iter()
            .find_map(|s| Some((s.clone(), first_tensor_of(s, dtype)?.1)))
            .unwrap_or_else(|| panic!("the tiny checkpoint has {dtype} tensors"));
        let mut bytes = std::fs::read(&shard).unwrap();
        let element = if at + (element + 1) * bad.len() < bytes.len() { element } else { 3 };
        bytes[at + element * bad.len()..at + (element + 1) * bad.len()].copy_from_slice(bad);
        std::fs::write(&shard, bytes).unwrap();

        let ckpt = Checkpoint::open(dir.path()).unwrap();
        let want = ckpt.check_finite().expect_err("the poked checkpoint is not finite").to_string();
        let arena = arena_for(&ckpt);
        let options = FileOrderOptions { mode: ReadMode::Auto, readers: 3, piece_bytes: 16 * DIRECT_ALIGN };
        let got = match ckpt.upload_model_weights_in_file_order(&arena, options, u64::MAX, &mut |_, _| {}) {
            Ok(_) => panic!("{dtype}: a NaN weight was accepted"),
            Err(e) => e.to_string(),
        };
        assert_eq!(got, want, "{dtype}");
        assert!(got.contains("NaN or infinite"), "{got}");
    }
}
