//! The file-order weight upload on the GPU (`model::file_order`, `backend::cuda::file_upload`):
//! the weights read front to back into pinned staging (by direct I/O, from the page cache, or by
//! ordinary reads; small pieces so tensors straddle them) make an engine whose requests give the
//! frames and PCM, bit for bit, of the engine over the same checkpoint uploaded in model order.

use limelight::checkpoint::sequential::ReadMode;
use limelight::engine::generate::{Engine, GenerateOptions, ResidentModel};
use limelight::model::file_order::FileOrderOptions;
use limelight::model::sampling::SamplingParams;

use crate::backbone;
use crate::batch_driver::{Outcome, Planned, alone, in_voice, voice};
use crate::harness::Ctx;

const TEXTS: [&str; 3] = ["Good morning, everyone.", "A second sentence, somewhat longer than the first.", "Short."];

pub fn run(ctx: &mut Ctx) {
    let (_dir, ckpt) = ctx.tiny_checkpoint_scaled(backbone::CONDITIONED);
    let cuda = ctx.cuda;
    let model_order = ResidentModel::load(&ckpt, cuda).expect("GPU upload in model order");
    let plain = Engine::new(cuda, &ckpt, &model_order).expect("GPU engine");
    let plan: Vec<Planned> = (0..TEXTS.len())
        .map(|i| {
            let opts = GenerateOptions {
                params: SamplingParams::default(),
                seed: ctx.rng.next_u64(),
                max_frames: 12,
                stall: None,
            };
            in_voice(&ckpt, TEXTS[i], &voice(&ckpt, ctx.rng.next_u64(), 8 + 5 * i), opts, 0)
        })
        .collect();
    let want: Vec<Outcome> = plan.iter().map(|r| alone(&plain, r)).collect();
    let spf = ckpt.codec_dims.samples_per_frame();

    let small = 64 << 10;
    for (label, options) in [
        (
            "direct I/O, 64 KiB pieces, 3 readers",
            FileOrderOptions { mode: ReadMode::Direct, readers: 3, piece_bytes: small },
        ),
        ("auto, 64 KiB pieces, 4 readers", FileOrderOptions { mode: ReadMode::Auto, readers: 4, piece_bytes: small }),
        (
            "page cache, default pieces, 1 reader",
            FileOrderOptions { mode: ReadMode::Cached, readers: 1, ..Default::default() },
        ),
    ] {
        let (model, read, encoder) = ResidentModel::load_in_file_order(&ckpt, cuda, options, u64::MAX, &mut |_, _| {})
            .expect("GPU upload in file order");
        encoder.expect("the encoder's host image, read beside the stream");
        cuda.synchronize();
        let engine = Engine::new(cuda, &ckpt, &model).expect("GPU engine");
        let differing = plan.iter().zip(&want).filter(|(r, w)| !alone(&engine, r).matches(w, None, spf)).count();
        let mib = |b: u64| b as f64 / f64::from(1u32 << 20);
        ctx.check(
            format!(
                "weights in file order ({label}; {:.1} MiB read: {:.1} direct, {:.1} from the page cache, {:.1} \
                 ordinary) vs model order: {} requests, frames and PCM bits",
                mib(read.bytes),
                mib(read.direct),
                mib(read.cached),
                mib(read.buffered),
                plan.len()
            ),
            "requests differing",
            "0".into(),
            format!("{differing} of {}", plan.len()),
            differing == 0,
        );
    }
}
