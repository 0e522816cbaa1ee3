//! Writes a small but real Qwen-style byte-level BPE `tokenizer.json` with the Fish special tokens, deterministically from a seed.
//!
//! The merges come in three phases: (0) every CJK character that occurs at least twice in the embedded
//! corpus becomes one token, because greedy BPE on a small corpus would spend its budget on English
//! pairs first while the real Qwen vocabulary has common hanzi as single tokens; (1) greedy
//! most-frequent-pair BPE over the corpus (seeded tie-breaks); (2) once the corpus is exhausted,
//! seeded synthetic merges (whole CJK characters, Latin word pieces) up to `n_merges`.

use std::collections::{BTreeMap, HashMap};

use serde_json::{Map, Value, json};
use tokenizers::normalizers::unicode::NFC;
use tokenizers::{Normalizer, OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer, PreTokenizerWrapper};

use crate::checkpoint::tokenizer::{SPEAKER_COUNT, STRUCTURAL_TOKENS, SpecialTokenIds, semantic_token, speaker_token};

/// The Qwen2/Qwen3 pre-tokenizer split. The look-ahead `(?!\S)` needs fancy-regex (or onig).
pub const QWEN_SPLIT_REGEX: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenizerSpec {
    /// BPE merges after the 256 byte tokens (tiny ~700; the real Qwen3.5 has ~250k).
    pub n_merges: usize,
    /// Semantic band size V (`audio_decoder_config.vocab_size`; 4096 for Drama 3).
    pub semantic_codes: usize,
    pub seed: u64,
}

/// A few paragraphs of English and Chinese, enough for ~950 learned merges; synthetic ones follow.
const CORPUS: &str = "\
The quick brown fox jumps over the lazy dog. She said, \"I'll be there at 7:30, don't wait for me.\" \
We've spoken to the speaker twice, and they're sure the voice sounds natural. \
Speech synthesis turns written text into sound. A good voice keeps the rhythm of the sentence, \
pauses at commas, and rises at the end of a question. Isn't that what we want? \
The model reads the text, then predicts the audio codes one frame at a time, and the codec turns \
the codes back into a waveform at forty-four thousand one hundred samples per second. \
Reference audio lets the listener hear the same speaker again: the transcript and the speech \
are placed in the prompt, and the model continues in that voice. [sighs] It's late; let's go home.
In 2024 the team trained on 10,000 hours of speech in 12 languages, including English, Chinese, \
Japanese and Korean. The server streams the result as it is generated, so the first sound \
arrives quickly, while the rest of the sentence is still being written.
Whispering, shouting, laughing and crying are all part of a performance. The actor's breath, \
the narrator's calm tone, the child's excited question: each of these should survive the trip \
through the tokenizer, the transformer and the vocoder without losing what makes it human.
今天天气很好，我们一起去公园散步吧。她说：“我会在七点半到，你不用等我。”\
语音合成是把文字变成声音的技术。一个好的声音要保持句子的节奏，在逗号处停顿，在问句的结尾上扬。\
模型先读文本，然后一帧一帧地预测音频编码，再由编解码器把编码变回波形。\
参考音频让听众再次听到同一个说话人的声音：文本和语音都放在提示里，模型用那个声音继续说下去。\
我们的服务器一边生成一边传输，所以第一个声音很快就到了，而句子的其余部分还在生成中。\
低语、喊叫、大笑和哭泣都是表演的一部分。演员的呼吸、旁白平静的语气、孩子兴奋的问题，\
这些都应该完整地经过分词器、变换器和声码器，而不失去让它像人的东西。\
我们今天说的话，明天还会有人听到。你好，世界！这是一个测试。我们的中文文本也需要好的分词。\n";

/// Builds the tokenizer JSON and reports the ids it assigned. Panics if `semantic_codes` is 0, or if
/// the synthetic phase runs out of new merges (far beyond any preset's `n_merges`).
pub fn build_tokenizer_json(spec: &TokenizerSpec) -> (String, SpecialTokenIds) {
    assert!(spec.semantic_codes > 0, "a semantic band needs at least one code");
    let mut bpe = Bpe::with_byte_alphabet();
    let words = corpus_words(&pre_tokenizer_json());
    let mut words: Vec<(Vec<u32>, u64)> =
        words.into_iter().map(|(w, c)| (w.chars().map(|ch| bpe.id[&ch.to_string()]).collect(), c)).collect();
    merge_frequent_cjk(&mut bpe, &mut words, spec.n_merges);
    learn_merges(&mut bpe, &mut words, spec.n_merges, spec.seed);
    synthesise_merges(&mut bpe, spec.n_merges, spec.seed);

    // Added tokens follow the BPE vocabulary with contiguous ids, like Qwen's <|endoftext|> at 151643.
    let base = bpe.tokens.len() as u32;
    let mut names: Vec<String> = STRUCTURAL_TOKENS.iter().map(|s| s.to_string()).collect();
    names.extend((0..SPEAKER_COUNT).map(speaker_token));
    names.extend((0..spec.semantic_codes).map(semantic_token));
    let added: Vec<Value> = names
        .iter()
        .enumerate()
        .map(|(i, s)| {
            json!({"id": base + i as u32, "content": s, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let at = |name: &str| base + names.iter().position(|n| n == name).expect("token was just added") as u32;
    let semantic_start = base + (STRUCTURAL_TOKENS.len() + SPEAKER_COUNT) as u32;
    let ids = SpecialTokenIds {
        vocab_len: base + names.len() as u32,
        im_start: at("<|im_start|>"),
        im_end: at("<|im_end|>"),
        voice: at("<|voice|>"),
        text: at("<|text|>"),
        interleave: at("<|interleave|>"),
        speakers: std::array::from_fn(|n| at(&speaker_token(n))),
        semantic_start,
        semantic_end: semantic_start + spec.semantic_codes as u32 - 1,
        endoftext: Some(at("<|endoftext|>")),
        pad: Some(at("<|pad|>")),
        audio_start: Some(at("<|audio_start|>")),
        audio_end: Some(at("<|audio_end|>")),
        audio_pad: Some(at("<|audio_pad|>")),
        phoneme_start: Some(at("<|phoneme_start|>")),
        phoneme_end: Some(at("<|phoneme_end|>")),
    };

    let vocab: Map<String, Value> = bpe.tokens.iter().enumerate().map(|(i, t)| (t.clone(), json!(i))).collect();
    let merges: Vec<Value> =
        bpe.merges.iter().map(|&(a, b)| json!([bpe.tokens[a as usize], bpe.tokens[b as usize]])).collect();
    let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false});
    let doc = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": pre_tokenizer_json(),
        // ByteLevel post-processing only fixes offsets; it adds no BOS/EOS, as the prompt builder requires.
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab, "merges": merges,
        },
    });
    (serde_json::to_string(&doc).expect("JSON values always serialise"), ids)
}

fn pre_tokenizer_json() -> Value {
    json!({"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": QWEN_SPLIT_REGEX}, "behavior": "Isolated", "invert": false},
        {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
    ]})
}

/// GPT-2's byte→char table, in GPT-2/Qwen id order: printable bytes map to themselves and come first,
/// the other 68 bytes map to U+0100.. so that every token is printable and JSON-safe.
fn byte_alphabet() -> Vec<(u8, char)> {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut out: Vec<(u8, char)> = (0..=255u8).filter(|&b| printable(b)).map(|b| (b, char::from(b))).collect();
    let rest = (0..=255u8).filter(|&b| !printable(b));
    out.extend(rest.enumerate().map(|(n, b)| (b, char::from_u32(256 + n as u32).expect("valid scalar"))));
    out
}

/// Splits the corpus exactly as the tokenizer will (same JSON pre-tokenizer), counting each word.
fn corpus_words(pre: &Value) -> BTreeMap<String, u64> {
    let pre: PreTokenizerWrapper = serde_json::from_value(pre.clone()).expect("pre-tokenizer JSON is valid");
    let mut pts = PreTokenizedString::from(CORPUS);
    pts.normalize(|n| NFC.normalize(n)).expect("NFC cannot fail");
    pre.pre_tokenize(&mut pts).expect("the Qwen regex compiles");
    let mut counts = BTreeMap::new();
    for (word, _, _) in pts.get_splits(OffsetReferential::Original, OffsetType::Byte) {
        *counts.entry(word.to_owned()).or_insert(0) += 1;
    }
    counts
}

/// The vocabulary being grown: ids are indices into `tokens`.
struct Bpe {
    tokens: Vec<String>,
    id: HashMap<String, u32>,
    merges: Vec<(u32, u32)>,
    byte_char: [char; 256],
}

impl Bpe {
    fn with_byte_alphabet() -> Self {
        let mut bpe = Bpe { tokens: Vec::new(), id: HashMap::new(), merges: Vec::new(), byte_char: ['\0'; 256] };
        for (b, ch) in byte_alphabet() {
            bpe.byte_char[b as usize] = ch;
            bpe.intern(ch.to_string());
        }
        bpe
    }

    fn intern(&mut self, token: String) -> u32 {
        if let Some(&id) = self.id.get(&token) {
            return id;
        }
        let id = self.tokens.len() as u32;
        self.id.insert(token.clone(), id);
        self.tokens.push(token);
        id
    }

    /// Records merge (a, b); a result already reachable another way keeps its id, as in real BPE files.
    fn merge(&mut self, a: u32, b: u32) -> u32 {
        self.merges.push((a, b));
        let joined = format!("{}{}", self.tokens[a as usize], self.tokens[b as usize]);
        self.intern(joined)
    }

    fn byte_ids(&self, s: &str) -> Vec<u32> {
        s.bytes().map(|b| self.id[&self.byte_char[b as usize].to_string()]).collect()
    }

    /// Merges the bytes of `ch` left to right into one token, stopping at the merge budget.
    fn merge_char(&mut self, ch: char, budget: usize) -> Option<u32> {
        let mut buf = [0u8; 4];
        let bytes = self.byte_ids(ch.encode_utf8(&mut buf));
        let mut acc = bytes[0];
        for &b in &bytes[1..] {
            let joined = format!("{}{}", self.tokens[acc as usize], self.tokens[b as usize]);
            acc = match self.id.get(&joined) {
                Some(&id) => id,
                None if self.merges.len() < budget => self.merge(acc, b),
                None => return None,
            };
        }
        Some(acc)
    }
}

fn is_cjk(ch: char) -> bool {
    matches!(ch, '\u{3000}'..='\u{303F}' | '\u{4E00}'..='\u{9FFF}' | '\u{FF00}'..='\u{FFEF}')
}

/// Phase 0: CJK characters seen at least twice become single tokens, most frequent first.
fn merge_frequent_cjk(bpe: &mut Bpe, words: &mut [(Vec<u32>, u64)], budget: usize) {
    let mut freq: BTreeMap<char, u64> = BTreeMap::new();
    for ch in CORPUS.chars().filter(|&c| is_cjk(c)) {
        *freq.entry(ch).or_insert(0) += 1;
    }
    let mut chars: Vec<(char, u64)> = freq.into_iter().filter(|&(_, n)| n >= 2).collect();
    chars.sort_by_key(|&(ch, n)| (std::cmp::Reverse(n), ch));
    let first_new = bpe.merges.len();
    for (ch, _) in chars {
        if bpe.merge_char(ch, budget).is_none() {
            break;
        }
    }
    for &(a, b) in &bpe.merges[first_new..] {
        let joined = bpe.id[&format!("{}{}", bpe.tokens[a as usize], bpe.tokens[b as usize])];
        words.iter_mut().for_each(|(w, _)| _ = merge_word(w, a, b, joined));
    }
}

/// Replaces each adjacent (a, b) in `w` by `joined`, left to right; returns whether anything changed.
fn merge_word(w: &mut Vec<u32>, a: u32, b: u32, joined: u32) -> bool {
    if !w.windows(2).any(|p| p[0] == a && p[1] == b) {
        return false;
    }
    let mut out = Vec::with_capacity(w.len());
    let mut i = 0;
    while i < w.len() {
        if i + 1 < w.len() && w[i] == a && w[i + 1] == b {
            out.push(joined);
            i += 2;
        } else {
            out.push(w[i]);
            i += 1;
        }
    }
    *w = out;
    true
}

/// splitmix64: a tiny, fixed, portable mixer (std's hashers may change between Rust releases).
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Phase 1: greedy most-frequent-pair merges until the corpus words are single tokens. Ties go to a
/// seed-dependent hash of the pair, so different seeds give different (equally valid) vocabularies.
fn learn_merges(bpe: &mut Bpe, words: &mut [(Vec<u32>, u64)], budget: usize, seed: u64) {
    let mut pairs = PairCounts { seed, counts: HashMap::new(), holders: HashMap::new() };
    for (wi, (w, c)) in words.iter().enumerate() {
        pairs.add(w, *c as i64, wi);
    }
    while bpe.merges.len() < budget {
        let best = pairs.counts.iter().filter(|e| e.1.0 > 0).max_by_key(|&(&(a, b), &(c, t))| (c, t, a, b));
        let Some((&(a, b), _)) = best else { break };
        let joined = bpe.merge(a, b);
        let mut affected = pairs.holders.remove(&(a, b)).unwrap_or_default();
        affected.sort_unstable();
        affected.dedup();
        for wi in affected {
            let (w, c) = &mut words[wi];
            let old = w.clone();
            if merge_word(w, a, b, joined) {
                pairs.add(&old, -(*c as i64), wi);
                pairs.add(w, *c as i64, wi);
            }
        }
        pairs.counts.retain(|_, e| e.0 > 0);
    }
}

/// Pair counts kept incrementally (only words holding the merged pair are recounted), each with its
/// tie-break hash computed once, so that learning stays a few milliseconds rather than tens.
struct PairCounts {
    seed: u64,
    /// pair → (count, tie-break hash)
    counts: HashMap<(u32, u32), (i64, u64)>,
    /// pair → indices of words that held it when counted (may be stale or repeated).
    holders: HashMap<(u32, u32), Vec<usize>>,
}

impl PairCounts {
    fn add(&mut self, w: &[u32], c: i64, wi: usize) {
        for p in w.windows(2) {
            let pair = (p[0], p[1]);
            let tie = mix(self.seed ^ mix((u64::from(pair.0) << 32) | u64::from(pair.1)));
            self.counts.entry(pair).or_insert((0, tie)).0 += c;
            if c > 0 {
                self.holders.entry(pair).or_default().push(wi);
            }
        }
    }
}

/// Phase 2: seeded merges that make whole CJK characters or longer Latin word pieces; both are the kind
/// of token a large real vocabulary has, and every one encodes and decodes like any other merge.
fn synthesise_merges(bpe: &mut Bpe, budget: usize, seed: u64) {
    let is_latin_left = |t: &str| {
        let body = t.strip_prefix('Ġ').unwrap_or(t);
        body.chars().all(|c| c.is_ascii_alphabetic()) && !t.is_empty()
    };
    let is_latin_right = |t: &str| !t.is_empty() && t.chars().all(|c| c.is_ascii_lowercase());
    let mut left: Vec<u32> = (0..bpe.tokens.len() as u32).filter(|&i| is_latin_left(&bpe.tokens[i as usize])).collect();
    let mut right: Vec<u32> =
        (0..bpe.tokens.len() as u32).filter(|&i| is_latin_right(&bpe.tokens[i as usize])).collect();
    let mut state = mix(seed ^ 0x7E57);
    let mut next = move || {
        state = mix(state);
        state
    };
    let mut misses = 0u32;
    while bpe.merges.len() < budget {
        assert!(misses < 100_000, "n_merges = {budget} is more than the synthetic phase can produce");
        let before = bpe.tokens.len();
        if next() % 10 < 4 {
            let ch = char::from_u32(0x4E00 + (next() % (0x9FA5 - 0x4E00 + 1)) as u32).expect("CJK block");
            bpe.merge_char(ch, budget);
        } else {
            let a = left[(next() % left.len() as u64) as usize];
            let b = right[(next() % right.len() as u64) as usize];
            let (ta, tb) = (&bpe.tokens[a as usize], &bpe.tokens[b as usize]);
            if ta.chars().count() + tb.chars().count() <= 12 && !bpe.id.contains_key(&format!("{ta}{tb}")) {
                let id = bpe.merge(a, b);
                left.push(id);
                if is_latin_right(&bpe.tokens[id as usize]) {
                    right.push(id);
                }
            }
        }
        misses = if bpe.tokens.len() == before { misses + 1 } else { 0 };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenizers::Tokenizer;

    const TINY: TokenizerSpec = TokenizerSpec { n_merges: 700, semantic_codes: 256, seed: 7 };

    #[test]
    fn layout_counts_and_ids() {
        let (json, ids) = build_tokenizer_json(&TINY);
        let v: Value = serde_json::from_str(&json).unwrap();
        let model_vocab = v["model"]["vocab"].as_object().unwrap().len() as u32;
        assert_eq!(v["model"]["merges"].as_array().unwrap().len(), TINY.n_merges);
        assert_eq!(model_vocab, 256 + TINY.n_merges as u32, "every tiny merge yields a new token");
        assert_eq!(ids.endoftext, Some(model_vocab));
        assert_eq!(ids.im_start, model_vocab + 1);
        assert_eq!(ids.im_end, model_vocab + 2);
        assert_eq!(ids.speakers[0], model_vocab + 12);
        assert_eq!(ids.speakers[15], model_vocab + 27);
        assert_eq!(ids.semantic_start, model_vocab + 28);
        assert_eq!(ids.semantic_codes(), 256);
        assert_eq!(ids.vocab_len, ids.semantic_end + 1);
        assert_eq!(v["model"]["vocab"]["!"], 0, "GPT-2/Qwen byte order");
        assert_eq!(v["model"]["vocab"]["Ā"], 188);
    }

    #[test]
    fn deterministic_and_seed_sensitive() {
        let a = build_tokenizer_json(&TINY).0;
        assert_eq!(a, build_tokenizer_json(&TINY).0);
        assert_ne!(a, build_tokenizer_json(&TokenizerSpec { seed: 8, ..TINY }).0);
    }

    #[test]
    fn common_cjk_and_words_are_single_tokens() {
        let tok = Tokenizer::from_bytes(build_tokenizer_json(&TINY).0.as_bytes()).unwrap();
        for s in ["的", "声音", "，", " the", "speech"] {
            let n = tok.encode(s, false).unwrap().get_ids().len();
            assert!(n <= s.chars().count().max(1), "{s:?} took {n} tokens");
        }
        assert_eq!(tok.encode("的", false).unwrap().get_ids().len(), 1);
        assert_eq!(tok.encode(" the", false).unwrap().get_ids().len(), 1);
    }
}
