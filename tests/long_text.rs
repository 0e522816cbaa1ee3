//! Long text as chunks of one request (issue 15) on the CPU engine, tiny checkpoint:
//! - the engine: a generation continued with each chunk's prompt gives, per chunk, the frames
//!   that prompt gives alone, and its audio is one decode of all the chunks' frames, bit for bit
//!   (the joins are the codec's own continuation: no reset, no gap, no cross-fade);
//! - the worker: a chunked job is one stream whose events are one continuous audio stream and
//!   one `Finished` covering every chunk's frames and prompt rows; the same seed gives the same
//!   bytes, with the codec on its own thread or inside the step; later chunks carry the first
//!   and the previous chunk as history;
//! - the prompts: a chunk's prompt with references and history turns is, row for row, what S2
//!   (mlx-audio 0.6.2 `Model.build_frames`) builds from the same inputs with the same tokenizer.

mod common;

use std::ops::ControlFlow;
use std::time::Duration;

use limelight::backend::cpu::Cpu;
use limelight::engine::generate::{Engine, FinishReason, GenerateOptions, PREFILL_CHUNK, ResidentModel, StallGuard};
use limelight::engine::prefix::SharedPrefix;
use limelight::model::frame::Rows;
use limelight::model::load::Checkpoint;
use limelight::model::sampling::SamplingParams;
use limelight::request::chunked::{ChunkText, ChunkVoices, ChunkedText, chunk_texts};
use limelight::request::split::SplitLimits;
use limelight::request::text::{CallerText, Field};
use limelight::scheduler::{
    BatchLimits, Job, JobEvent, MoreChunks, RATE_WINDOW, ReaderPolicy, Readiness, Scheduler, WorkerConfig, chunk_seed,
    cpu_loader,
};

/// Three sentences, each its own chunk at a 40-byte target.
const LONG: &str = "The first sentence is spoken here. A second one follows it now. And a third closes the text.";
const LIMITS: SplitLimits = SplitLimits { target_bytes: 40, first_target_bytes: 40, max_speakers: 3 };
const LIMIT: Duration = Duration::from_secs(120);

fn options(seed: u64, max_frames: usize) -> GenerateOptions {
    GenerateOptions { params: SamplingParams::default(), seed, max_frames, stall: None }
}

/// Greedy sampling (top-k 1): on the tiny checkpoint's random weights the first chunk's most
/// likely main token is never EOS, so it never stops on its own — a scripted runaway.
fn runaway(mut job: Job) -> Job {
    job.options.params = SamplingParams { top_k: Some(1), ..SamplingParams::default() };
    job
}

fn texts() -> Vec<ChunkText> {
    chunk_texts(&CallerText::check(LONG.to_owned(), Field::Input).unwrap(), LIMITS)
}

/// Runs `generation` to its end, appending its PCM to `pcm`; returns why it ended.
fn run_chunk(
    engine: &Engine<'_, Cpu>,
    generation: &mut limelight::engine::generate::Generation<'_, Cpu>,
    pcm: &mut Vec<f32>,
) -> FinishReason {
    while !engine.prefill_generation(generation, PREFILL_CHUNK).unwrap() {}
    loop {
        let stepped = engine.step(&mut [&mut *generation]).pop().unwrap().unwrap();
        pcm.extend(stepped.pcm);
        if let Some(reason) = stepped.finished {
            return reason;
        }
    }
}

#[test]
fn chunks_continue_one_generation_and_join_as_one_decode() {
    let dir = common::tiny_checkpoint();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let model = ResidentModel::load(&ckpt, &Cpu).unwrap();
    let engine = Engine::new(&Cpu, &ckpt, &model).unwrap();
    let texts = texts();
    assert_eq!(texts.len(), 3, "{texts:?}");
    let (first, _, more) =
        ChunkedText::start(common::tiny_prompt_builder(), ChunkVoices::All(Vec::new()), false, texts.clone(), 7)
            .unwrap();
    let mut more = more.expect("three chunks");

    let opts = |chunk| options(chunk_seed(3, chunk), 7);
    let mut generation = engine.start(&first.rows, &opts(0)).unwrap();
    let (mut pcm, mut all_frames, mut prompts) = (Vec::new(), Rows::new(first.rows.codebooks()), vec![first.rows]);
    for chunk in 0.. {
        run_chunk(&engine, &mut generation, &mut pcm);
        let produced = generation.produced().clone();
        assert!(!produced.is_empty(), "chunk {chunk} produced frames");
        (0..produced.len()).for_each(|t| all_frames.push_row(produced.row(t)));
        // The chunk's frames are what its prompt gives alone: no state of an earlier chunk carries over.
        let alone = engine.generate_prompt(&prompts[chunk], SharedPrefix::NONE, &opts(chunk), &mut |_: &[f32]| {
            ControlFlow::Continue(())
        });
        assert_eq!(alone.unwrap().rows, produced, "chunk {chunk} alone");
        match more.next(&produced) {
            Some(next) => {
                let next = next.unwrap();
                engine.continue_prompt(&mut generation, &next.rows, next.prefix, &opts(chunk + 1)).unwrap();
                prompts.push(next.rows);
            }
            None => break,
        }
    }
    assert_eq!(prompts.len(), 3);
    // History: the second prompt carries the first chunk's frames, the third the first's and the second's.
    let audio_rows = |rows: &Rows| (0..rows.len()).filter(|&t| rows.row(t)[1..].iter().any(|&c| c != 0)).count();
    assert!(audio_rows(&prompts[1]) > 0 && audio_rows(&prompts[2]) > audio_rows(&prompts[1]));

    let codes: Vec<u32> = (0..all_frames.len()).flat_map(|t| all_frames.row(t)[1..].to_vec()).collect();
    let whole = model.codec.decode(&Cpu, &codes).unwrap();
    assert_eq!(pcm.len(), all_frames.len() * 2048);
    assert!(
        pcm.iter().map(|x| x.to_bits()).eq(whole.iter().map(|x| x.to_bits())),
        "the chunks' audio is one decode of all their frames"
    );
}

fn config(dir: std::path::PathBuf) -> WorkerConfig {
    WorkerConfig {
        model_dir: dir,
        max_queue: 8,
        default_max_frames: 2048,
        served_model_name: String::from("drama-3"),
        model_aliases: Vec::new(),
        reader: ReaderPolicy { stall_timeout: Duration::from_secs(30), min_read_rate: 0.5, rate_window: RATE_WINDOW },
    }
}

fn loader(dir: std::path::PathBuf, codec_thread: bool) -> limelight::scheduler::Loader {
    let limits =
        BatchLimits { max_batch: Some(2), prefill_chunk: PREFILL_CHUNK, voice_cache_bytes: 1 << 30, codec_thread };
    cpu_loader(dir, 2048, limits)
}

/// A chunked job of LONG with `seed`, `max_frames` frames a chunk at most (less where the
/// runaway guard's bound is lower).
fn chunked_job(seed: u64, max_frames: usize) -> Job {
    let (first, first_frames, more) =
        ChunkedText::start(common::tiny_prompt_builder(), ChunkVoices::All(Vec::new()), false, texts(), max_frames)
            .unwrap();
    Job {
        request_id: String::from("req-long"),
        rows: first.rows,
        prefix: SharedPrefix::NONE,
        options: options(seed, first_frames),
        span: tracing::Span::none(),
        more: more.map(|m| Box::new(m) as Box<dyn MoreChunks>),
    }
}

/// Every event of a job: (the events without audio, the PCM bits).
async fn events(scheduler: &Scheduler, job: Job) -> (Vec<JobEvent>, Vec<u32>) {
    let mut stream = scheduler.submit(job).unwrap();
    let (mut others, mut pcm) = (Vec::new(), Vec::new());
    while let Some(event) = stream.next().await {
        match event {
            JobEvent::Audio(chunk) => pcm.extend(chunk.iter().map(|x| x.to_bits())),
            other => others.push(other),
        }
    }
    (others, pcm)
}

#[tokio::test]
async fn a_chunked_job_is_one_stream_with_one_finish() {
    let dir = common::tiny_checkpoint();
    tokio::time::timeout(LIMIT, async {
        let mut runs = Vec::new();
        for codec_thread in [true, true, false] {
            let scheduler =
                Scheduler::start_with(config(dir.path().to_owned()), loader(dir.path().into(), codec_thread));
            scheduler.loaded().await.expect("loads");
            assert_eq!(scheduler.readiness(), Readiness::Ready);
            runs.push(events(&scheduler, chunked_job(3, 7)).await);
        }
        let (events, pcm) = &runs[0];
        let [JobEvent::Started { prompt_rows: first_rows }, JobEvent::Finished { reason, frames, prompt_rows }] =
            events[..]
        else {
            panic!("events {events:?}")
        };
        assert_eq!(pcm.len(), frames * 2048, "every chunk's frames are heard");
        assert!(frames > 7 && frames <= 21, "three chunks of at most 7 frames: {frames}");
        assert!(prompt_rows > 3 * first_rows, "usage counts every chunk's prompt, history included: {prompt_rows}");
        assert!(matches!(reason, FinishReason::Stop | FinishReason::Length));
        assert!(runs[1] == runs[0], "the same seed twice: the same events and bytes");
        assert!(runs[2] == runs[0], "the codec inside the step: the same events and bytes");
    })
    .await
    .expect("bounded");
}

/// Builds S2's (mlx-audio 0.6.2 `fish_drama3` `Model.build_frames`) prompt for the same
/// references, history and text with the checkpoint's own tokenizer: its rows and system rows.
const S2_BUILD_FRAMES: &str = r#"
import json, sys
from types import SimpleNamespace
import numpy as np
import mlx.core as mx
from tokenizers import Tokenizer
from mlx_audio.tts.models.fish_drama3.drama3 import Model

args = json.load(sys.stdin)
model = Model.__new__(Model)  # only the prompt builder: no weights
model.tokenizer = Tokenizer.from_file(args["tokenizer"])
model.num_codebooks = args["codebooks"]
model.semantic_begin = args["semantic_start"]
model.tower = SimpleNamespace(vocab_size=args["codebook_size"])
turns = lambda pairs: [(text, mx.array(np.array(codes, dtype=np.int32))) for text, codes in pairs]
frames, system_rows = Model.build_frames(model, turns(args["references"]), turns(args["history"]), args["target"])
print(json.dumps({"rows": np.array(frames).tolist(), "system_rows": system_rows}))
"#;

#[test]
fn chunk_prompts_with_history_are_s2s() {
    use limelight::model::vocabulary::Vocabulary;
    use limelight::request::prompt::{Reference, Turn};
    use std::io::Write;
    if !common::python_with(&["mlx_audio", "tokenizers"]) {
        return;
    }
    let dir = common::tiny_checkpoint();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let vocabulary = Vocabulary::of(&ckpt);
    let (books, size) = (vocabulary.codebooks, vocabulary.codebook_size as u32);
    // Codes `[codebook][frame]` from a fixed pattern, and the same as generated frames `[main, c0..]`.
    let codes = |frames: usize, salt: u32| -> Vec<Vec<u32>> {
        (0..books).map(|b| (0..frames).map(|t| (t as u32 * 7 + b as u32 * 13 + salt) % size).collect()).collect()
    };
    let as_frames = |codes: &[Vec<u32>]| {
        let mut rows = Rows::new(books);
        for t in 0..codes[0].len() {
            let frame: Vec<u32> = codes.iter().map(|c| c[t]).collect();
            rows.push_audio(vocabulary.semantic_start, &frame);
        }
        rows
    };
    let reference = Reference { transcript: String::from("A reference line."), codes: codes(5, 1) };
    let texts = texts();
    let (first, second) = (codes(4, 2), codes(3, 3));
    let (first_rows, second_rows) = (as_frames(&first), as_frames(&second));
    let history = [
        Turn { text: texts[0].text.as_str(), frames: &first_rows },
        Turn { text: texts[1].text.as_str(), frames: &second_rows },
    ];
    for (references, turns) in [(vec![], &history[..1]), (vec![reference.clone()], &history[..])] {
        let ours = common::tiny_prompt_builder().build_with_history(&texts[2].text, &references, turns).unwrap();
        let their_history = [(texts[0].text.as_str(), &first), (texts[1].text.as_str(), &second)];
        let args = serde_json::json!({
            "tokenizer": dir.path().join("tokenizer.json"),
            "codebooks": books,
            "semantic_start": vocabulary.semantic_start,
            "codebook_size": size,
            "references": references.iter().map(|r| (r.transcript.clone(), r.codes.clone())).collect::<Vec<_>>(),
            "history": their_history[..turns.len()],
            "target": texts[2].text.as_str(),
        });
        let mut python = std::process::Command::new("python3")
            .args(["-c", S2_BUILD_FRAMES])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        python.stdin.take().unwrap().write_all(args.to_string().as_bytes()).unwrap();
        let out = python.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let theirs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let their_rows: Vec<Vec<u32>> = serde_json::from_value(theirs["rows"].clone()).unwrap();
        let our_rows: Vec<Vec<u32>> = (0..ours.rows.len()).map(|t| ours.rows.row(t).to_vec()).collect();
        assert_eq!(our_rows, their_rows, "{} references, {} history turns", references.len(), turns.len());
        if !references.is_empty() {
            assert_eq!(ours.voice_rows as u64, theirs["system_rows"].as_u64().unwrap(), "the kept voice prefix");
        }
    }
}

/// The runaway guard on a scripted runaway ([`runaway`]: the first chunk does not stop on its
/// own, as it shows alone by running to 300 frames): with `max_frames` far above the guard's
/// bounds, it is cut at its bound (`frame_bound` of its text) and the later chunks stay within
/// theirs; the request ends `length`, and its audio holds every frame.
#[tokio::test]
async fn the_runaway_guard_cuts_a_chunk_at_its_bound() {
    use limelight::request::chunked::frame_bound;
    let dir = common::tiny_checkpoint();
    tokio::time::timeout(LIMIT, async {
        let scheduler = Scheduler::start_with(config(dir.path().to_owned()), loader(dir.path().into(), true));
        scheduler.loaded().await.expect("loads");
        let bounds: Vec<usize> = texts().iter().map(|t| frame_bound(t.text.as_str())).collect();
        // The first chunk alone does not stop before 300 frames, past its bound.
        let alone = runaway(Job { more: None, options: options(3, 300), ..chunked_job(3, 2048) });
        let (events_alone, _) = events(&scheduler, alone).await;
        assert!(
            matches!(events_alone[..], [_, JobEvent::Finished { reason: FinishReason::Length, frames: 300, .. }]),
            "{events_alone:?}"
        );
        assert!(bounds[0] < 300, "{bounds:?}");

        let (events, pcm) = events(&scheduler, runaway(chunked_job(3, 2048))).await;
        let [JobEvent::Started { .. }, JobEvent::Finished { reason, frames, .. }] = events[..] else {
            panic!("events {events:?}")
        };
        // Without the guard the first chunk alone would give 2048 frames (it stops only at
        // `max_frames`); with it the whole request stays within the chunks' bounds.
        assert!(
            frames >= bounds[0] + 2 && frames <= bounds.iter().sum::<usize>(),
            "the first chunk cut at {}, the others within theirs {bounds:?}: {frames} frames",
            bounds[0]
        );
        assert_eq!(reason, FinishReason::Length);
        assert_eq!(pcm.len(), frames * 2048);
    })
    .await
    .expect("bounded");
}

/// One chunked request of LONG driven through the engine by hand under the stated retry policy
/// (with `retry`; without it, every take is kept): a later chunk a guard cut (its frame bound
/// when that is the guard's, or the job's stall guard) is run again from the same prompt with
/// `retry_seed`, its first take dropped before the decoder. Returns what it heard and counted
/// ([`HandRun`]).
fn by_hand(engine: &Engine<'_, Cpu>, job: &Job, seed: u64, retry: bool) -> HandRun {
    use limelight::scheduler::{retries_chunk, retry_seed};
    let (first, first_frames, more) =
        ChunkedText::start(common::tiny_prompt_builder(), ChunkVoices::All(Vec::new()), false, texts(), 2048).unwrap();
    let mut more = more.expect("three chunks");
    let stall = job.options.stall;
    let opts = |seed, max_frames| GenerateOptions { params: job.options.params, seed, max_frames, stall };
    let mut generation = engine.start(&first.rows, &opts(seed, first_frames)).unwrap();
    let mut run = HandRun { prompt_rows: first.rows.len(), ..HandRun::default() };
    let mut pcm = Vec::new();
    let reason = run_chunk(engine, &mut generation, &mut pcm);
    run.stalled += stalled_where_it_should(stall, reason, generation.produced());
    for chunk in 1.. {
        run.frames += generation.produced().len();
        let Some(next) = more.next(&generation.produced().clone()) else { break };
        let next = next.unwrap();
        assert!(next.guarded, "max_frames 2048 is above every chunk's guard bound");
        engine
            .continue_prompt(&mut generation, &next.rows, next.prefix, &opts(chunk_seed(seed, chunk), next.max_frames))
            .unwrap();
        run.prompt_rows += next.rows.len();
        if !retry {
            let reason = run_chunk(engine, &mut generation, &mut pcm);
            run.stalled += stalled_where_it_should(stall, reason, generation.produced());
            continue;
        }
        generation.hold_audio();
        let mut held = Vec::new();
        let reason = run_chunk(engine, &mut generation, &mut held);
        run.stalled += stalled_where_it_should(stall, reason, generation.produced());
        assert!(held.is_empty(), "a held chunk decodes nothing");
        if retries_chunk(reason, chunk, next.guarded, false) {
            assert!(generation.settle_audio(false).unwrap().pcm.is_empty(), "a dropped take is not heard");
            run.dropped += 1;
            let options = opts(retry_seed(seed, chunk), next.max_frames);
            engine.continue_prompt(&mut generation, &next.rows, next.prefix, &options).unwrap();
            run.prompt_rows += next.rows.len();
            let reason = run_chunk(engine, &mut generation, &mut pcm);
            run.stalled += stalled_where_it_should(stall, reason, generation.produced());
        } else {
            run.kept += 1;
            pcm.extend(generation.settle_audio(true).unwrap().pcm);
        }
    }
    run.pcm = pcm.iter().map(|x| x.to_bits()).collect();
    run
}

/// Checks a chunk's end against the stall rule worked out here: it ended `Stalled` exactly when
/// its last `window` frames are the first window of `produced` to hold at most `max_codes`
/// distinct semantic codes. Returns 1 for a stall.
fn stalled_where_it_should(stall: Option<StallGuard>, reason: FinishReason, produced: &Rows) -> usize {
    let still = |end: usize| {
        stall.is_some_and(|g| {
            end >= g.window
                && (end - g.window..end).map(|t| produced.code(t, 0)).collect::<std::collections::HashSet<_>>().len()
                    <= g.max_codes
        })
    };
    let first_still = (1..=produced.len()).find(|&end| still(end));
    if reason == FinishReason::Stalled {
        assert_eq!(first_still, Some(produced.len()), "a stall ends the chunk at its first still window");
        1
    } else {
        assert_eq!(first_still, None, "a chunk with a still window ended {reason:?} instead");
        0
    }
}

/// What [`by_hand`] heard and counted.
#[derive(Default, PartialEq)]
struct HandRun {
    pcm: Vec<u32>,
    frames: usize,
    prompt_rows: usize,
    dropped: usize,
    kept: usize,
    stalled: usize,
}

impl std::fmt::Debug for HandRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let HandRun { pcm, frames, prompt_rows, dropped, kept, stalled } = self;
        write!(f, "{frames} frames ({} samples), {prompt_rows} prompt rows, ", pcm.len())?;
        write!(f, "{dropped} takes dropped, {kept} held takes kept, {stalled} stalls")
    }
}

/// The guard's retry (`scheduler::worker::chunks`): with top-k 2 sampling on the tiny checkpoint
/// a later chunk reaches its guard bound (a runaway), is dropped unheard and run again with its
/// retry seed, while the other stops on its own and its held audio is kept. The served request is, bit for bit, the same request
/// driven by hand under that policy (with the codec on its own thread and inside the step), and
/// differs from the request that kept every first take; usage counts the retried prompts.
#[tokio::test]
async fn a_cut_later_chunk_is_retried_unheard_with_its_retry_seed() {
    let dir = common::tiny_checkpoint();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let model = ResidentModel::load(&ckpt, &Cpu).unwrap();
    let engine = Engine::new(&Cpu, &ckpt, &model).unwrap();
    let job = || {
        let mut job = chunked_job(5, 2048);
        job.options.params = SamplingParams { top_k: Some(2), ..SamplingParams::default() };
        job
    };
    let want = by_hand(&engine, &job(), 5, true);
    let kept_all = by_hand(&engine, &job(), 5, false);
    // Seed 5 exercises both paths: one later chunk runs away and is retried, the other stops on
    // its own and its held audio is kept.
    assert_eq!((want.dropped, want.kept, want.stalled), (1, 1, 0), "one later chunk retried, one kept");
    assert_ne!(want.pcm, kept_all.pcm, "the retries' audio is not the first takes'");
    let (frames_want, rows_want) = (want.frames, want.prompt_rows);
    tokio::time::timeout(LIMIT, async {
        for codec_thread in [true, false] {
            let scheduler =
                Scheduler::start_with(config(dir.path().to_owned()), loader(dir.path().into(), codec_thread));
            scheduler.loaded().await.expect("loads");
            let (events, pcm) = events(&scheduler, job()).await;
            let [JobEvent::Started { .. }, JobEvent::Finished { reason, frames, prompt_rows }] = events[..] else {
                panic!("events {events:?}")
            };
            assert_eq!((frames, prompt_rows), (frames_want, rows_want), "codec thread {codec_thread}");
            assert_eq!(reason, FinishReason::Length);
            assert!(pcm == want.pcm, "codec thread {codec_thread}: the served bytes are the policy's");
        }
    })
    .await
    .expect("bounded");
}

/// The stall guard (`engine::stall`) in the worker. The tiny checkpoint's random weights never
/// fall still, so the job's guard is loosened until they do — any 24 frames holding a repeated
/// semantic code — which makes every chunk a scripted stall: the first chunk is cut where its
/// first still window ends and streams as it is made; a later chunk cut there is dropped
/// unheard and run again with its retry seed. The served request is, bit for bit, the same
/// request driven by hand under that policy (with the codec on its own thread and inside the
/// step), and its finish reason is `length`.
#[tokio::test]
async fn a_chunk_whose_audio_stands_still_is_cut_and_a_later_one_retried() {
    let dir = common::tiny_checkpoint();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let model = ResidentModel::load(&ckpt, &Cpu).unwrap();
    let engine = Engine::new(&Cpu, &ckpt, &model).unwrap();
    let loose = StallGuard { window: 24, max_codes: 23 };
    let job = |stall| {
        let mut job = chunked_job(3, 2048);
        job.options.stall = stall;
        job
    };
    // by_hand checks each stall against the rule worked out from the frames themselves. Seed 3:
    // the first chunk stalls (kept, it streamed), both later chunks stall and are retried, and
    // both retries stall again (kept cut).
    let want = by_hand(&engine, &job(Some(loose)), 3, true);
    assert_eq!((want.stalled, want.dropped, want.kept), (5, 2, 0), "{want:?}");
    tokio::time::timeout(LIMIT, async {
        for codec_thread in [true, false] {
            let scheduler =
                Scheduler::start_with(config(dir.path().to_owned()), loader(dir.path().into(), codec_thread));
            scheduler.loaded().await.expect("loads");
            let (events, pcm) = events(&scheduler, job(Some(loose))).await;
            let [JobEvent::Started { .. }, JobEvent::Finished { reason, frames, prompt_rows }] = events[..] else {
                panic!("events {events:?}")
            };
            assert_eq!((frames, prompt_rows), (want.frames, want.prompt_rows), "codec thread {codec_thread}");
            assert_eq!(reason, FinishReason::Length, "a cut chunk makes the request `length`");
            assert!(pcm == want.pcm, "codec thread {codec_thread}: the served bytes are the policy's");
        }
    })
    .await
    .expect("bounded");
}
