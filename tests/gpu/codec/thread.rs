//! The codec on its own thread and stream (`scheduler::codec::CodecThread` on a
//! `Cuda::fork_stream` handle), as `serve` runs it beside the decode step: streams' frame groups
//! sent in the engine's grouping (1, 2, 4, then 8 frames), interleaved, more streams than one
//! round takes, must come back as each stream's whole decode on the main stream, bit for bit.
//! The fork's pool is NaN-poisoned, warmed up, then sealed: serving's rounds make no driver
//! allocation.

use std::sync::mpsc;

use limelight::backend::cuda::Cuda;
use limelight::engine::generate::codec_group;
use limelight::model::codec::CodecModel;
use limelight::scheduler::{AudioCodec, CodecCommand, CodecLink, CodecThread, Decoded};

use super::decode::random_codes;
use super::differing;
use crate::harness::Ctx;

/// Streams one round decodes at most (fewer than the streams sent, so rounds are capped).
const ROUND_STREAMS: usize = 4;

pub fn run(ctx: &mut Ctx, model: &CodecModel<Cuda>) {
    let cuda: &Cuda = ctx.cuda;
    let width = model.codes_per_frame();
    let lens = [20usize, 33, 7, 48, 130, 9];
    let all: Vec<Vec<u32>> = lens.iter().map(|&f| random_codes(ctx, &model.dims, f)).collect();
    let wholes: Vec<Vec<f32>> = all.iter().map(|c| model.decode(cuda, c).expect("GPU whole decode")).collect();
    cuda.synchronize();

    let fork = cuda.fork_stream().expect("a second stream");
    fork.pool().set_poison(true);
    let codec = CodecThread::new(model, &fork, ROUND_STREAMS)
        .with_thread_setup(Box::new(|| fork.bind_to_thread().map_err(|e| e.to_string())));
    codec.warm_up().expect("codec warm-up on the forked stream");
    fork.synchronize();
    fork.pool().seal();

    // Each stream's groups in the engine's grouping, sent round robin (a stream's groups in order).
    let groups: Vec<Vec<Vec<u32>>> = (all.iter().zip(&lens))
        .map(|(codes, &frames)| {
            let (mut out, mut at) = (Vec::new(), 0);
            while at < frames {
                let n = codec_group(out.len()).min(frames - at);
                out.push(codes[at * width..(at + n) * width].to_vec());
                at += n;
            }
            out
        })
        .collect();
    let sent: usize = groups.iter().map(Vec::len).sum();
    let mut pcm: Vec<Vec<f32>> = vec![Vec::new(); lens.len()];
    let mut failures = Vec::new();
    std::thread::scope(|scope| {
        let (commands, commands_rx) = mpsc::channel();
        let (decoded_tx, decoded) = mpsc::channel();
        let codec = &codec;
        scope.spawn(move || codec.run(CodecLink { commands: commands_rx, decoded: decoded_tx }));
        let most = groups.iter().map(Vec::len).max().unwrap_or(0);
        for g in 0..most {
            for (s, stream) in groups.iter().enumerate() {
                if let Some(codes) = stream.get(g) {
                    commands.send(CodecCommand::Decode { key: s as u64, codes: codes.clone() }).expect("send");
                    if g + 1 == stream.len() {
                        commands.send(CodecCommand::End { key: s as u64 }).expect("send");
                    }
                }
            }
        }
        for _ in 0..sent {
            let Decoded { key, pcm: result } = decoded.recv().expect("the codec thread answers every group");
            match result {
                Ok(samples) => pcm[key as usize].extend(samples),
                Err(e) => failures.push(e),
            }
        }
        drop(commands); // the codec thread ends
    });
    let differ: usize = pcm.iter().zip(&wholes).map(|(got, whole)| differing(got, whole)).sum();
    let samples: usize = wholes.iter().map(Vec::len).sum();
    ctx.check(
        format!(
            "codec thread on its own stream == each whole decode on the main stream [{} streams, {sent} groups, \
             {ROUND_STREAMS} per round]",
            lens.len()
        ),
        "differing samples",
        "0, no group failing".into(),
        format!("{differ} of {samples}; {} failed {:?}", failures.len(), failures.first()),
        differ == 0 && failures.is_empty(),
    );
    let after = fork.pool().stats().after_seal;
    ctx.check(
        "codec thread: driver allocations after its warm-up",
        "allocations",
        "0".into(),
        after.to_string(),
        after == 0,
    );
}
