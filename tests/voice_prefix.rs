//! Kept voice prefixes (`engine::prefix`) on the CPU engine: a request that starts from a voice's
//! kept prompt state gives the bytes a full prefill gives, bit for bit, alone and in batches of
//! many streams in many voices; the cache keeps what its budget holds, least recently used out
//! first.

mod common;

#[path = "common/batch_driver.rs"]
mod batch_driver;

use batch_driver::{Planned, alone, batched, in_voice, voice};
use limelight::backend::cpu::Cpu;
use limelight::engine::generate::{Engine, GenerateOptions, PREFILL_CHUNK, ResidentModel};
use limelight::engine::prefix::{PrefixCache, SharedPrefix};
use limelight::model::load::Checkpoint;
use limelight::model::sampling::SamplingParams;
use limelight::request::prompt::Reference;

/// A request in `voice` (kept, as a stored voice's) saying `text`.
fn request(ckpt: &Checkpoint, text: &str, voice: &Reference, seed: u64, joins_at: usize) -> Planned {
    let opts = GenerateOptions { params: SamplingParams::default(), seed, max_frames: 8, stall: None };
    in_voice(ckpt, text, voice, opts, joins_at)
}

/// Three voices (one longer than a prefill chunk), two or three requests each, joining at
/// different turns: later requests of a voice join after its first has kept the prefix.
fn plan(ckpt: &Checkpoint) -> Vec<Planned> {
    let voices = [voice(ckpt, 1, 40), voice(ckpt, 2, PREFILL_CHUNK + 30), voice(ckpt, 3, 12)];
    vec![
        request(ckpt, "Good morning, everyone.", &voices[0], 3, 0),
        request(ckpt, "The long voice speaks first.", &voices[1], 5, 0),
        request(ckpt, "A short one.", &voices[2], 7, 1),
        request(ckpt, "Good evening, everyone, and welcome back.", &voices[0], 11, 4),
        request(ckpt, "The long voice again.", &voices[1], 13, 6),
        request(ckpt, "A short one.", &voices[2], 17, 6),
        request(ckpt, "Once more in the first voice.", &voices[0], 19, 7),
    ]
}

#[test]
fn kept_voice_prefixes_give_the_bytes_of_a_full_prefill_in_any_batch() {
    let dir = common::tiny_checkpoint();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let model = ResidentModel::load(&ckpt, &Cpu).unwrap();
    let plain = Engine::new(&Cpu, &ckpt, &model).unwrap();
    let cache = PrefixCache::new(&Cpu, 1 << 30);
    let mut cached = Engine::new(&Cpu, &ckpt, &model).unwrap();
    cached.set_prefix_cache(&cache);

    let plan = plan(&ckpt);
    assert!(plan[1].prefix.rows > PREFILL_CHUNK, "one voice's rows take more than one chunk");
    // Each request alone on an engine that keeps nothing: a full prefill every time.
    let want: Vec<_> = plan.iter().map(|r| alone(&plain, r)).collect();
    let (got, most) = batched(&cached, &plan);
    assert!(most.prefilled >= 2 && most.stepped >= 3, "streams must share calls ({most:?})");
    for (i, (want, got)) in want.iter().zip(&got).enumerate() {
        assert!(got.matches(want, None, 2048), "request {i}: {:?} vs a full prefill {:?}", got.finished, want.finished);
    }
    let stats = cache.stats();
    assert_eq!((stats.saved, stats.entries), (3, 3), "one prefix kept per voice: {stats:?}");
    assert_eq!((stats.misses, stats.hits), (3, 4), "the later requests of each voice started from it: {stats:?}");
    assert_eq!(stats.evicted, 0);

    // Alone, from the kept prefix: the stream starts past the voice's rows, and the bytes are the
    // same again.
    for (r, want) in plan.iter().zip(&want) {
        let stream = cached.prompt_stream(&r.rows, r.prefix, &r.opts).unwrap();
        assert_eq!(stream.restored_rows(), r.prefix.rows);
        assert_eq!(stream.prefilled_rows(), r.prefix.rows);
        assert!(alone(&cached, r).matches(want, None, 2048));
    }
}

/// A prefix is the voice's rows and the row after them: another voice, or the same codes under
/// another transcript, is another prefix; a request that does not ask to keep its prefix (inline
/// references) neither uses nor fills the cache, and gives the same bytes.
#[test]
fn a_prefix_is_only_reused_for_the_very_same_rows() {
    let dir = common::tiny_checkpoint();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let model = ResidentModel::load(&ckpt, &Cpu).unwrap();
    let cache = PrefixCache::new(&Cpu, 1 << 30);
    let mut engine = Engine::new(&Cpu, &ckpt, &model).unwrap();
    engine.set_prefix_cache(&cache);
    let first = voice(&ckpt, 1, 20);
    let retold = Reference { transcript: String::from("Another transcript."), ..first.clone() };
    let a = request(&ckpt, "Hello.", &first, 3, 0);
    let b = request(&ckpt, "Hello.", &retold, 3, 0);
    let inline = Planned { prefix: SharedPrefix { keep: false, ..a.prefix }, ..a.clone() };
    let from_inline = alone(&engine, &inline);
    assert_eq!(cache.stats().saved, 0, "a prefix not asked to be kept is not kept");
    let kept = alone(&engine, &a);
    assert!(kept.matches(&from_inline, None, 2048), "kept or not, the chunks and the bytes are the same");
    assert!(alone(&engine, &a).matches(&kept, None, 2048));
    alone(&engine, &b);
    let stats = cache.stats();
    assert_eq!((stats.saved, stats.hits, stats.misses), (2, 1, 2), "{stats:?}");
}

/// The budget bounds what is kept: the least recently used prefix leaves first; a prefix larger
/// than the whole budget is not kept.
#[test]
fn the_least_recently_used_prefix_makes_room() {
    let dir = common::tiny_checkpoint();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let model = ResidentModel::load(&ckpt, &Cpu).unwrap();
    let requests: Vec<Planned> = (1..=3).map(|v| request(&ckpt, "Hello.", &voice(&ckpt, v, 16), v, 0)).collect();
    // One prefix's size, measured on a roomy cache.
    let roomy = PrefixCache::new(&Cpu, 1 << 30);
    let mut engine = Engine::new(&Cpu, &ckpt, &model).unwrap();
    engine.set_prefix_cache(&roomy);
    alone(&engine, &requests[0]);
    let one = roomy.stats().bytes;
    assert!(one > 0);

    // Room for two: the third voice pushes out the least recently used.
    let cache = PrefixCache::new(&Cpu, 2 * one + one / 2);
    let mut engine = Engine::new(&Cpu, &ckpt, &model).unwrap();
    engine.set_prefix_cache(&cache);
    alone(&engine, &requests[0]);
    alone(&engine, &requests[1]);
    alone(&engine, &requests[0]); // voice 1 used again: voice 2 is now the oldest
    alone(&engine, &requests[2]);
    let stats = cache.stats();
    assert_eq!((stats.entries, stats.evicted, stats.hits), (2, 1, 1), "{stats:?}");
    assert!(stats.bytes <= stats.budget);
    alone(&engine, &requests[0]);
    assert_eq!(cache.stats().hits, 2, "voice 1 stayed");
    alone(&engine, &requests[1]);
    assert_eq!(cache.stats().hits, 2, "voice 2 was evicted");

    let tiny = PrefixCache::new(&Cpu, one / 2);
    let mut engine = Engine::new(&Cpu, &ckpt, &model).unwrap();
    engine.set_prefix_cache(&tiny);
    alone(&engine, &requests[0]);
    assert_eq!((tiny.stats().entries, tiny.stats().too_large), (0, 1));
}
