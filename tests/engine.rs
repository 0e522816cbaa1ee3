//! The CPU engine end to end on the tiny checkpoint: determinism, finish reasons, cancellation,
//! streamed audio equal to a whole decode, the frame-source seam a device-side step plugs into,
//! and the `say` / `trace` commands.

mod common;

use std::ops::ControlFlow;
use std::process::Command;

use limelight::backend::cpu::Cpu;
use limelight::checkpoint::safetensors::SafetensorsFile;
use limelight::engine::generate::{Engine, FinishReason, GenerateOptions, ResidentModel};
use limelight::engine::prefix::SharedPrefix;
use limelight::model::load::Checkpoint;
use limelight::model::sampling::SamplingParams;
use limelight::request::prompt::PromptBuilder;

fn options(seed: u64, max_frames: usize) -> GenerateOptions {
    GenerateOptions { params: SamplingParams::default(), seed, max_frames, stall: None }
}

/// Runs one generation and returns (finish, pcm, chunk lengths).
fn run(
    engine: &Engine<'_, Cpu>,
    ckpt: &Checkpoint,
    opts: &GenerateOptions,
) -> (limelight::engine::generate::Finished, Vec<f32>, Vec<usize>) {
    let rows = PromptBuilder::for_checkpoint(ckpt).build("Hello there, how are you today?", &[]).unwrap();
    let (mut pcm, mut chunks) = (Vec::new(), Vec::new());
    let finished = engine
        .generate(&rows, opts, &mut |c: &[f32]| {
            pcm.extend_from_slice(c);
            chunks.push(c.len());
            ControlFlow::Continue(())
        })
        .unwrap();
    (finished, pcm, chunks)
}

#[test]
fn same_seed_same_audio_and_length_keeps_every_frame() {
    let dir = common::tiny_checkpoint();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let model = ResidentModel::load(&ckpt, &Cpu).unwrap();
    let engine = Engine::new(&Cpu, &ckpt, &model).unwrap();
    let (a, pcm_a, chunks) = run(&engine, &ckpt, &options(3, 12));
    let (b, pcm_b, _) = run(&engine, &ckpt, &options(3, 12));
    assert_eq!(a, b);
    assert!(pcm_a.iter().map(|x| x.to_bits()).eq(pcm_b.iter().map(|x| x.to_bits())), "same seed, different audio");
    assert_eq!(a.reason, FinishReason::Length, "seed 3 produces no EOS in 12 frames");
    assert_eq!(a.frames, 12);
    assert_eq!(pcm_a.len(), 12 * 2048);
    assert_eq!(chunks, vec![2048, 2 * 2048, 4 * 2048, 5 * 2048], "first frame alone, then growing groups");
    assert!(pcm_a.iter().all(|x| x.is_finite() && x.abs() < 1.0));
    let (_, pcm_c, _) = run(&engine, &ckpt, &options(4, 12));
    assert!(pcm_a != pcm_c, "different seeds must give different audio");

    // Streaming output equals one whole decode of the produced frames, bit for bit.
    let codes: Vec<u32> = (0..a.rows.len()).flat_map(|t| a.rows.row(t)[1..].to_vec()).collect();
    let whole = model.codec.decode(&Cpu, &codes).unwrap();
    assert!(whole.iter().map(|x| x.to_bits()).eq(pcm_a.iter().map(|x| x.to_bits())));
}

#[test]
fn cancelling_stops_between_frames() {
    let dir = common::tiny_checkpoint();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let model = ResidentModel::load(&ckpt, &Cpu).unwrap();
    let engine = Engine::new(&Cpu, &ckpt, &model).unwrap();
    let rows = PromptBuilder::for_checkpoint(&ckpt).build("Hello there, how are you today?", &[]).unwrap();
    let mut calls = 0;
    let finished = engine
        .generate(&rows, &options(3, 12), &mut |_: &[f32]| {
            calls += 1;
            if calls == 2 { ControlFlow::Break(()) } else { ControlFlow::Continue(()) }
        })
        .unwrap();
    assert_eq!(finished.reason, FinishReason::Cancelled);
    assert_eq!(calls, 2);
    assert_eq!(finished.frames, 3, "frames of the two delivered groups (1 + 2)");
}

#[test]
fn eos_stops_with_reason_stop() {
    let dir = common::tiny_checkpoint();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let mut model = ResidentModel::load(&ckpt, &Cpu).unwrap();
    let rows = PromptBuilder::for_checkpoint(&ckpt).build("Stop right away.", &[]).unwrap();
    // Point the EOS row of lm_head at the first frame's hidden state and silence every other
    // candidate, so EOS is the only likely main token.
    let h0 = {
        let engine = Engine::new(&Cpu, &ckpt, &model).unwrap();
        let mut state = engine.backbone.new_state();
        let hidden = engine.backbone.prefill(&mut state, &rows).unwrap();
        hidden.row(rows.len() - 1).to_vec()
    };
    let special = &ckpt.special_tokens;
    let lm_head = &mut model.weights.backbone.lm_head;
    let hidden_size = lm_head.shape[1];
    for id in special.semantic_start..=special.semantic_end {
        lm_head.data[id as usize * hidden_size..(id as usize + 1) * hidden_size].fill(0.0);
    }
    let eos = special.eos() as usize;
    lm_head.data[eos * hidden_size..(eos + 1) * hidden_size].copy_from_slice(&h0);
    let engine = Engine::new(&Cpu, &ckpt, &model).unwrap();
    let mut audio = 0;
    let finished = engine
        .generate(&rows, &options(0, 12), &mut |c: &[f32]| {
            audio += c.len();
            ControlFlow::Continue(())
        })
        .unwrap();
    assert_eq!(finished.reason, FinishReason::Stop);
    assert_eq!((finished.frames, audio), (0, 0));
}

/// `say --reference-audio` speaks in a reference clip's voice: deterministic, and not the
/// default voice's audio.
#[test]
fn say_speaks_in_a_reference_clips_voice() {
    let dir = common::tiny_checkpoint();
    let bin = env!("CARGO_BIN_EXE_limelight");
    let out = tempfile::tempdir().unwrap();
    let clip = out.path().join("ref.wav");
    let tone: Vec<f32> = (0..30_000).map(|i| 0.4 * (i as f32 * 0.031).sin()).collect();
    limelight::audio::wav::write_wav(&clip, &tone, 44_100).unwrap();
    let say = |name: &str, reference: bool| {
        let path = out.path().join(name);
        let mut cmd = Command::new(bin);
        cmd.args(["say", "--model"]).arg(dir.path()).args(["--text", "Hi there.", "--max-frames", "4", "--seed", "5"]);
        if reference {
            cmd.arg("--reference-audio").arg(&clip).args(["--reference-text", "A calm voice."]);
        }
        let o = cmd.arg("--out").arg(&path).output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        std::fs::read(path).unwrap()
    };
    let (a, b, plain) = (say("a.wav", true), say("b.wav", true), say("plain.wav", false));
    assert!(a == b, "same reference and seed, different bytes");
    assert!(a != plain, "the reference changed nothing");
    let o = Command::new(bin)
        .args(["say", "--model"])
        .arg(dir.path())
        .args(["--text", "Hi.", "--reference-text", "x", "--reference-audio"])
        .arg(out.path().join("missing.wav"))
        .arg("--out")
        .arg(out.path().join("x.wav"))
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("missing.wav"), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn say_writes_a_deterministic_wav_and_trace_dumps_every_stage() {
    let dir = common::tiny_checkpoint();
    let bin = env!("CARGO_BIN_EXE_limelight");
    let out = tempfile::tempdir().unwrap();
    let say = |seed: &str, name: &str| {
        let path = out.path().join(name);
        let o = Command::new(bin)
            .args(["say", "--model"])
            .arg(dir.path())
            .args(["--text", "[whispering] Hi <|speaker:1|> there.", "--max-frames", "6", "--seed", seed, "--out"])
            .arg(&path)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        std::fs::read(path).unwrap()
    };
    let (a, b, c) = (say("5", "a.wav"), say("5", "b.wav"), say("6", "c.wav"));
    assert!(a == b, "same seed, different bytes");
    assert!(a != c, "different seeds, same bytes");
    let reader = hound::WavReader::new(std::io::Cursor::new(&a)).unwrap();
    assert_eq!((reader.spec().sample_rate, reader.spec().channels, reader.spec().bits_per_sample), (44_100, 1, 16));
    assert!(reader.len() > 0 && reader.len() % 2048 == 0, "{} samples", reader.len());

    let rows = out.path().join("rows.json");
    std::fs::write(&rows, "[[10,0,0,0,0,0,0,0,0,0,0],[990,6,1,2,3,4,5,6,7,8,9],[1000,16,3,3,3,3,3,3,3,3,3]]").unwrap();
    let dump = out.path().join("trace.safetensors");
    let o = Command::new(bin)
        .args(["trace", "--model"])
        .arg(dir.path())
        .arg("--prompt-rows")
        .arg(&rows)
        .arg("--out")
        .arg(&dump)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let f = SafetensorsFile::open(&dump).unwrap();
    for name in
        ["backbone.embedding", "backbone.layer.7", "backbone.final_norm", "tower.layer.12", "tower.head.8", "rows"]
    {
        assert!(f.view(name).is_some(), "missing `{name}`");
    }
    assert_eq!(f.view("backbone.layer.0").unwrap().shape, &[3, 256]);
}

/// Stops through `keep_going` after `frames` frames, counting the audio it was given.
struct StopAfter {
    frames: usize,
    asked: usize,
    samples: usize,
}

impl limelight::engine::generate::AudioSink for StopAfter {
    fn audio(&mut self, pcm: &[f32]) -> ControlFlow<()> {
        self.samples += pcm.len();
        ControlFlow::Continue(())
    }

    fn keep_going(&mut self) -> ControlFlow<()> {
        self.asked += 1;
        if self.asked == self.frames { ControlFlow::Break(()) } else { ControlFlow::Continue(()) }
    }
}

#[test]
fn a_cancel_between_frames_stops_within_one_frame_and_keeps_its_audio() {
    let dir = common::tiny_checkpoint();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let model = ResidentModel::load(&ckpt, &Cpu).unwrap();
    let engine = Engine::new(&Cpu, &ckpt, &model).unwrap();
    let rows = PromptBuilder::for_checkpoint(&ckpt).build("Hello there, how are you today?", &[]).unwrap();
    let mut sink = StopAfter { frames: 5, asked: 0, samples: 0 };
    let finished = engine.generate(&rows, &options(3, 12), &mut sink).unwrap();
    assert_eq!(finished.reason, FinishReason::Cancelled);
    assert_eq!(finished.frames, 5, "stopped right after the frame it was asked about");
    assert_eq!(sink.samples, 5 * 2048, "the frames still in the codec group were flushed");
}

/// A fixed context (as the GPU engine has) ends generation with `length` where the prompt plus
/// frames fill it, and refuses a prompt that leaves no room, naming both numbers.
#[test]
fn a_fixed_context_caps_frames_and_refuses_a_prompt_that_fills_it() {
    use limelight::scheduler::{BatchOptions, EngineModel, MemoryUse, Synthesizer};
    let dir = common::tiny_checkpoint();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let model = ResidentModel::load(&ckpt, &Cpu).unwrap();
    let memory = || MemoryUse { in_use: 0, budget: 0, allocations_after_warm_up: 0 };
    let rows = PromptBuilder::for_checkpoint(&ckpt).build("Hello there, how are you today?", &[]).unwrap();
    let room = 5;
    let batch = |context| BatchOptions { max_batch: 2, prefill_chunk: 64, context: Some(context) };
    let capped = EngineModel::new(&Cpu, &ckpt, &model, batch(rows.len() + room), Box::new(memory)).unwrap();
    let id = capped.open(&rows, SharedPrefix::NONE, &options(3, 12)).unwrap().id;
    while !capped.prefill(&[id]).remove(0).unwrap().done {}
    let mut finished = None;
    while finished.is_none() {
        finished = capped.step(&[id]).pop().unwrap().unwrap().finished;
    }
    assert_eq!((finished, capped.close(id)), (Some(FinishReason::Length), room));

    let full = EngineModel::new(&Cpu, &ckpt, &model, batch(rows.len()), Box::new(memory)).unwrap();
    let refused = full.open(&rows, SharedPrefix::NONE, &options(3, 12)).unwrap_err().to_string();
    let expected = format!("the prompt has {} rows; the engine's context holds {}", rows.len(), rows.len());
    assert!(refused.contains(&expected), "{refused}");
}

/// The start-up warm-up fills every slot (one prompt of a whole prefill chunk), steps them until
/// each has decoded the codec's largest group, and frees every slot; a request after it gives the
/// bytes it gives on an engine that never warmed up.
#[test]
fn the_warm_up_steps_every_slot_and_leaves_nothing_behind() {
    use limelight::scheduler::{BatchOptions, EngineModel, MemoryUse, Synthesizer};
    let dir = common::tiny_checkpoint();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let model = ResidentModel::load(&ckpt, &Cpu).unwrap();
    let memory = || MemoryUse { in_use: 0, budget: 0, allocations_after_warm_up: 0 };
    let batch = BatchOptions { max_batch: 3, prefill_chunk: 24, context: Some(96) };
    let rows = PromptBuilder::for_checkpoint(&ckpt).build("Hello there, how are you today?", &[]).unwrap();
    let speak = |engine: &EngineModel<'_, Cpu>| {
        let id = engine.open(&rows, SharedPrefix::NONE, &options(5, 10)).unwrap().id;
        while !engine.prefill(&[id]).remove(0).unwrap().done {}
        let mut pcm = Vec::new();
        loop {
            let stepped = engine.step(&[id]).pop().unwrap().unwrap();
            pcm.extend(stepped.pcm.iter().map(|x| x.to_bits()));
            if stepped.finished.is_some() {
                engine.close(id);
                return pcm;
            }
        }
    };
    let fresh = EngineModel::new(&Cpu, &ckpt, &model, batch, Box::new(memory)).unwrap();
    let alone = speak(&fresh);

    let warmed = EngineModel::new(&Cpu, &ckpt, &model, batch, Box::new(memory)).unwrap();
    let warm = warmed.warm_up().unwrap();
    // Two rounds of every slot: all prefilled together, then one joining streams already stepping.
    assert_eq!(warm.streams, 6);
    let largest = limelight::engine::generate::frames_to_largest_group();
    assert_eq!(largest, 15, "groups of 1, 2, 4 and 8 frames");
    assert!(warm.frames > 0 && warm.frames <= 6 * largest, "{warm:?}");
    // Every slot is free again: a full batch opens.
    let ids: Vec<_> = (0..3).map(|_| warmed.open(&rows, SharedPrefix::NONE, &options(1, 2)).unwrap().id).collect();
    ids.into_iter().for_each(|id| assert_eq!(warmed.close(id), 0));
    assert_eq!(speak(&warmed), alone, "the warm-up changed a later request's bytes");
}

/// A device-side frame source stand-in: replays scripted frames.
struct Scripted {
    frames: Vec<Vec<u32>>,
}

struct ScriptedSource<'a> {
    frames: &'a [Vec<u32>],
    next: usize,
}

impl limelight::engine::generate::FrameSource for ScriptedSource<'_> {
    fn next_frame(&mut self, _last: bool) -> Result<Vec<u32>, limelight::engine::generate::GenerateError> {
        self.next += 1;
        Ok(self.frames[self.next - 1].clone())
    }
}

impl limelight::engine::generate::DeviceFrames for Scripted {
    fn start<'a>(
        &'a self,
        _rows: &limelight::model::frame::Rows,
        _prefix: limelight::engine::prefix::SharedPrefix,
        _opts: &GenerateOptions,
    ) -> Result<Box<dyn limelight::engine::generate::FrameSource + 'a>, limelight::engine::generate::GenerateError>
    {
        Ok(Box::new(ScriptedSource { frames: &self.frames, next: 0 }))
    }
}

/// The generation loop is the same for the host loop and a device-side source (the CUDA graph):
/// fed the host loop's own frames, an engine with a device source produces the same rows, finish
/// reason and PCM bit for bit; an EOS frame from it stops with `stop` and keeps the frames before.
#[test]
fn a_device_frame_source_drives_the_same_loop() {
    let dir = common::tiny_checkpoint();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let model = ResidentModel::load(&ckpt, &Cpu).unwrap();
    let host = Engine::new(&Cpu, &ckpt, &model).unwrap();
    assert!(!host.has_device_frames());
    let (want, want_pcm, want_chunks) = run(&host, &ckpt, &options(3, 12));
    let frames: Vec<Vec<u32>> = (0..want.rows.len()).map(|t| want.rows.row(t).to_vec()).collect();

    let scripted = Scripted { frames: frames.clone() };
    let device = Engine::new(&Cpu, &ckpt, &model).unwrap().with_device_frames(&scripted);
    assert!(device.has_device_frames());
    let (got, got_pcm, got_chunks) = run(&device, &ckpt, &options(3, 12));
    assert_eq!(got, want);
    assert_eq!(got_chunks, want_chunks);
    assert!(got_pcm.iter().map(|x| x.to_bits()).eq(want_pcm.iter().map(|x| x.to_bits())));

    // EOS as the fifth frame: four frames of audio, reason `stop`.
    let mut with_eos = frames[..4].to_vec();
    let mut eos_row = frames[4].clone();
    eos_row[0] = ckpt.special_tokens.eos();
    with_eos.push(eos_row);
    let scripted = Scripted { frames: with_eos };
    let device = Engine::new(&Cpu, &ckpt, &model).unwrap().with_device_frames(&scripted);
    let (stopped, pcm, _) = run(&device, &ckpt, &options(3, 12));
    assert_eq!(stopped.reason, FinishReason::Stop);
    assert_eq!(stopped.frames, 4);
    assert_eq!(stopped.rows.as_flat(), &want.rows.as_flat()[..4 * want.rows.width()]);
    assert_eq!(pcm.len(), 4 * 2048);
}

/// `say` speaks long text as chunks of one generation (as `serve` does): with `--max-frames 3`
/// (per chunk) a three-chunk text gives more than three frames of audio, the same bytes twice;
/// numbers are read out as words unless `--no-normalize`.
#[test]
fn say_speaks_long_text_in_chunks_and_normalises() {
    let dir = common::tiny_checkpoint();
    let bin = env!("CARGO_BIN_EXE_limelight");
    let out = tempfile::tempdir().unwrap();
    let long = "The first sentence is spoken here, and it goes on for a while to fill its chunk well. \
                A second one follows it now, with its own clauses, its own pauses and its own length. \
                And a third closes the text, long enough again to need a chunk of its very own here. \
                A fourth, for good measure, ends it all with 3 cats.";
    let say = |name: &str, extra: &[&str]| {
        let path = out.path().join(name);
        let o = Command::new(bin)
            .args(["say", "--model"])
            .arg(dir.path())
            .args(["--text", long, "--max-frames", "3", "--seed", "5"])
            .args(extra)
            .arg("--out")
            .arg(&path)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        std::fs::read(path).unwrap()
    };
    let (a, b, raw) = (say("a.wav", &[]), say("b.wav", &[]), say("raw.wav", &["--no-normalize"]));
    assert!(a == b, "same text and seed, different bytes");
    let samples = hound::WavReader::new(std::io::Cursor::new(&a)).unwrap().len() as usize;
    assert!(long.len() > 300 && samples > 3 * 2048, "{samples} samples: one chunk only?");
    assert!(a != raw, "\"3\" and \"three\" make different prompts");
}
