//! A wire `SpeechRequest` → `ValidSpeech`, applying every rule of `api.md`'s field table; each
//! refusal names the field (the OpenAI error's `param`). Nothing downstream sees the wire type.

use std::collections::BTreeMap;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;

use super::normalize::normalize;
use super::text::{
    CallerText, Direction, Field, MAX_SPEAKER_ID, TextError, is_white_space, speaker_tag_at, validate_caller_text,
};
use crate::api::speech::{self as wire, InlineReference, SpeechRequest, StreamFormat, Voice};
use crate::audio::{self, ResponseFormat};
use crate::engine::generate::GenerateOptions;
use crate::model::sampling::{ParamsError, SamplingParams};
use crate::voice::store::validate_name;

/// OpenAI's built-in voice names: each means the model's default voice here, so apps written
/// for OpenAI work unchanged (`serving-anchors.md` §1.1).
pub const OPENAI_VOICES: [&str; 13] =
    ["alloy", "ash", "ballad", "coral", "echo", "fable", "onyx", "nova", "sage", "shimmer", "verse", "marin", "cedar"];

/// The server's side of validation: which model names it answers to and its limits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpeechPolicy {
    pub served_model: String,
    pub aliases: Vec<String>,
    /// Characters (Unicode scalar values) allowed in `input`, and in `instructions`.
    pub max_input_chars: usize,
    /// `max_frames` when the request gives none, and the most it may ask for.
    pub max_frames: usize,
}

/// A request every rule has accepted, in the terms the worker and the encoder use.
#[derive(Clone, Debug, PartialEq)]
pub struct ValidSpeech {
    /// The text to speak: `input`, led by `[instructions] ` when instructions were given.
    pub text: CallerText,
    /// Characters of `input` as sent (for the request log).
    pub input_chars: usize,
    pub voice: VoiceChoice,
    pub format: ResponseFormat,
    pub delivery: Delivery,
    /// Output sample rate of the encoded audio (the format's default unless `sample_rate` was
    /// given: 24 kHz for `pcm`, 48 kHz for `opus`, 44.1 kHz otherwise).
    pub sample_rate: u32,
    /// Time-stretch factor (1.0 = unchanged).
    pub speed: f32,
    pub options: GenerateOptions,
    /// Inline references (extension): each clip as sent (base64 or a `data:` URL) and its
    /// checked transcript; decoded and encoded by the HTTP layer.
    pub references: Vec<(String, String)>,
    /// Dialogue (extension `voices`): the voice of each listed speaker id. Empty: `voice`
    /// speaks the whole text, whatever its speaker tags.
    pub speaker_voices: BTreeMap<u32, VoiceChoice>,
}

/// Inline references a request may carry at most.
pub const MAX_INLINE_REFERENCES: usize = 4;

/// Which voice speaks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VoiceChoice {
    /// The model's own voice (`default`, or no `voice`).
    Default,
    /// One of OpenAI's built-in names (lower case): the default voice unless the operator maps
    /// it to a stored voice (`--voice-alias`).
    Builtin(String),
    /// A stored voice, by name (`/v1/audio/voices`); whether it exists is the store's to say.
    Named(String),
}

/// How the audio goes back to the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// Chunked bytes as they are produced; the finish reason as a trailer.
    Streamed,
    /// One body with Content-Length; the finish reason as a header.
    Whole,
    /// Server-sent events; the finish reason in the final event.
    Sse,
}

/// Why a request was refused. `param()` names the field; the HTTP layer picks the status.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ValidateError {
    #[error("`{field}` is required")]
    Missing { field: &'static str },
    #[error("The model `{model}` does not exist; this server serves `{served}`")]
    ModelNotFound { model: String, served: String },
    #[error("`{field}` is {found} characters long; the limit is {limit}")]
    TooLong { field: &'static str, found: usize, limit: usize },
    #[error("{0}")]
    Text(TextError),
    #[error("`instructions` {reason}")]
    Instructions { reason: &'static str },
    #[error(
        "Unknown voice `{voice}`: use `default`, one of OpenAI's built-in voice names, or a voice uploaded to /v1/audio/voices"
    )]
    UnknownVoice { voice: String },
    #[error("`voices.{speaker}`: unknown voice `{voice}`: name a voice uploaded to /v1/audio/voices")]
    UnknownSpeakerVoice { speaker: String, voice: String },
    #[error("`voices`: {message}")]
    SpeakerVoices { message: String },
    #[error("`{field}` must be in [{min}, {max}]; got {found}")]
    OutOfRange { field: &'static str, min: f64, max: f64, found: f64 },
    /// The format cannot be served as asked (not built in, or a rate it cannot carry).
    #[error("{message}")]
    Format { field: &'static str, message: String },
    #[error("{0}")]
    Params(ParamsError),
    #[error("`stream: false` cannot be combined with `stream_format: \"sse\"`, which always streams")]
    SseNotStreamed,
}

impl ValidateError {
    /// The request field at fault.
    pub fn param(&self) -> &str {
        match self {
            ValidateError::Missing { field } | ValidateError::TooLong { field, .. } => field,
            ValidateError::OutOfRange { field, .. } | ValidateError::Format { field, .. } => field,
            ValidateError::ModelNotFound { .. } => "model",
            ValidateError::Text(e) if e.field() != Field::Input => "references",
            ValidateError::Text(_) => "input",
            ValidateError::Instructions { .. } => "instructions",
            ValidateError::UnknownVoice { .. } => "voice",
            ValidateError::UnknownSpeakerVoice { .. } | ValidateError::SpeakerVoices { .. } => "voices",
            ValidateError::Params(e) => e.field(),
            ValidateError::SseNotStreamed => "stream",
        }
    }

    /// A stable code for clients, in OpenAI's style.
    pub fn code(&self) -> &'static str {
        match self {
            ValidateError::Missing { .. } => "missing_required_parameter",
            ValidateError::ModelNotFound { .. } => "model_not_found",
            ValidateError::TooLong { .. } => "string_above_max_length",
            ValidateError::UnknownVoice { .. } | ValidateError::UnknownSpeakerVoice { .. } => "voice_not_found",
            _ => "invalid_value",
        }
    }
}

/// Characters of a caller's name (`model`) that an error message or a log line repeats.
pub const QUOTED_NAME_CHARS: usize = 64;

/// `name` as messages and logs repeat it: its first [`QUOTED_NAME_CHARS`] characters, then `…`
/// when cut (a 60 kB `model` made a 60 kB error body and log line; issue 16, finding 7).
pub fn quoted_name(name: &str) -> String {
    match name.char_indices().nth(QUOTED_NAME_CHARS) {
        Some((at, _)) => format!("{}…", &name[..at]),
        None => name.to_owned(),
    }
}

/// Applies every rule of the field table. A request without `seed` gets a fresh random one.
pub fn validate(req: SpeechRequest, policy: &SpeechPolicy) -> Result<ValidSpeech, ValidateError> {
    let model = req.model.ok_or(ValidateError::Missing { field: "model" })?;
    if model != policy.served_model && !policy.aliases.contains(&model) {
        return Err(ValidateError::ModelNotFound { model: quoted_name(&model), served: policy.served_model.clone() });
    }
    let input = req.input.ok_or(ValidateError::Missing { field: "input" })?;
    let input_chars = check_length("input", &input, policy.max_input_chars)?;
    let input = CallerText::check(input, Field::Input).map_err(ValidateError::Text)?;
    // Normalising only adds words around the tags it leaves alone, so the text stays valid.
    let input = if req.normalize.unwrap_or(true) {
        CallerText::check(normalize(input.as_str()), Field::Input).map_err(ValidateError::Text)?
    } else {
        input
    };
    let voice = voice_choice(req.voice.as_ref())?;
    let references = inline_references(req.references.unwrap_or_default(), &voice)?;
    let speaker_voices = speaker_voices(req.voices.unwrap_or_default(), !references.is_empty())?;
    let direction = match req.instructions.as_deref() {
        Some(instructions) => {
            check_length("instructions", instructions.trim_matches(is_white_space), policy.max_input_chars)?;
            Direction::check(instructions).map_err(|reason| ValidateError::Instructions { reason })?
        }
        None => None,
    };
    let text = match &direction {
        Some(direction) => input.with_direction(direction),
        None => input,
    };

    let format = response_format(req.response_format.unwrap_or_default());
    let delivery = match (req.stream_format.unwrap_or_default(), req.stream.unwrap_or(true)) {
        (StreamFormat::Sse, false) => return Err(ValidateError::SseNotStreamed),
        (StreamFormat::Sse, true) => Delivery::Sse,
        (StreamFormat::Audio, true) => Delivery::Streamed,
        (StreamFormat::Audio, false) => Delivery::Whole,
    };
    if !format.is_available() {
        let message = audio::AudioError::FormatUnavailable(format).to_string();
        return Err(ValidateError::Format { field: "response_format", message });
    }
    let (slow, fast) = (f64::from(*audio::SPEED_RANGE.start()), f64::from(*audio::SPEED_RANGE.end()));
    let speed = in_range("speed", req.speed.unwrap_or(1.0), slow, fast)?;
    let sample_rate = format.sample_rate(req.sample_rate).map_err(|e| match e {
        audio::AudioError::SampleRateOutOfRange { rate } => ValidateError::OutOfRange {
            field: "sample_rate",
            min: f64::from(*audio::SAMPLE_RATE_RANGE.start()),
            max: f64::from(*audio::SAMPLE_RATE_RANGE.end()),
            found: f64::from(rate),
        },
        other => ValidateError::Format { field: other.param().unwrap_or("sample_rate"), message: other.to_string() },
    })?;
    let max_frames = match req.max_frames {
        None => policy.max_frames,
        Some(n) => in_range("max_frames", n as f64, 1.0, policy.max_frames as f64)? as usize,
    };

    let defaults = SamplingParams::default();
    let params = SamplingParams {
        temperature: req.temperature.map_or(defaults.temperature, |t| t as f32),
        top_p: req.top_p.map_or(defaults.top_p, |p| p as f32),
        top_k: req.top_k.or(defaults.top_k),
    };
    params.validate().map_err(ValidateError::Params)?;
    let seed = req.seed.unwrap_or_else(|| RandomState::new().hash_one(input_chars));

    Ok(ValidSpeech {
        text,
        input_chars,
        voice,
        format,
        delivery,
        sample_rate,
        speed: speed as f32,
        options: GenerateOptions { params, seed, max_frames, stall: None },
        references,
        speaker_voices,
    })
}

/// `voices`: speaker ids spelled as the tags spell them (`"0"`..`"15"`), each a stored voice
/// (a built-in name means what it means in `voice`). Not beside inline `references`. An entry
/// for speaker 0 takes its place over `voice` (which the OpenAI SDKs always send).
fn speaker_voices(voices: BTreeMap<String, Voice>, inline: bool) -> Result<BTreeMap<u32, VoiceChoice>, ValidateError> {
    let bad = |message: String| ValidateError::SpeakerVoices { message };
    if voices.is_empty() {
        return Ok(BTreeMap::new());
    }
    if inline {
        return Err(bad(String::from("cannot be combined with inline `references`")));
    }
    let mut out = BTreeMap::new();
    for (key, v) in voices {
        let speaker: String = key.chars().take(16).collect();
        let tag = format!("<|speaker:{key}|>");
        let id = speaker_tag_at(&tag).filter(|(len, _)| *len == tag.len()).map(|(_, id)| id).ok_or_else(|| {
            bad(format!("`{speaker}` is not a speaker id: use \"0\" to \"{MAX_SPEAKER_ID}\", as the tags spell them"))
        })?;
        let choice = voice_choice(Some(&v)).map_err(|_| ValidateError::UnknownSpeakerVoice {
            speaker: speaker.clone(),
            voice: v.as_str().chars().take(64).collect(),
        })?;
        out.insert(id, choice);
    }
    Ok(out)
}

/// Inline references: at most [`MAX_INLINE_REFERENCES`], each with audio and a transcript the
/// prompt can carry, and not beside a stored voice (one voice per request).
fn inline_references(refs: Vec<InlineReference>, voice: &VoiceChoice) -> Result<Vec<(String, String)>, ValidateError> {
    if refs.is_empty() {
        return Ok(Vec::new());
    }
    let bad = |message: String| ValidateError::Format { field: "references", message };
    if refs.len() > MAX_INLINE_REFERENCES {
        return Err(bad(format!("`references` holds {} clips; at most {MAX_INLINE_REFERENCES}", refs.len())));
    }
    if matches!(voice, VoiceChoice::Named(_)) {
        return Err(bad(String::from("give a stored `voice` or `references`, not both")));
    }
    refs.into_iter()
        .enumerate()
        .map(|(i, r)| {
            let audio = r
                .audio
                .filter(|a| !a.trim().is_empty())
                .ok_or_else(|| bad(format!("`references.{i}.audio` is required")))?;
            let text = r.text.ok_or_else(|| bad(format!("`references.{i}.text` is required")))?;
            validate_caller_text(&text, Field::Reference(i)).map_err(ValidateError::Text)?;
            Ok((audio, text))
        })
        .collect()
}

/// `default` or omitted → the default voice; an OpenAI built-in name (either form, any case) →
/// [`VoiceChoice::Builtin`]; a name a stored voice could have → [`VoiceChoice::Named`].
fn voice_choice(voice: Option<&Voice>) -> Result<VoiceChoice, ValidateError> {
    let Some(voice) = voice else { return Ok(VoiceChoice::Default) };
    let name = voice.as_str();
    if name.eq_ignore_ascii_case("default") {
        Ok(VoiceChoice::Default)
    } else if let Some(builtin) = OPENAI_VOICES.iter().find(|v| name.eq_ignore_ascii_case(v)) {
        Ok(VoiceChoice::Builtin((*builtin).to_owned()))
    } else if validate_name(name).is_ok() {
        Ok(VoiceChoice::Named(name.to_owned()))
    } else {
        // Echo at most 64 characters of what was sent: a voice name is short, an abuse is not.
        Err(ValidateError::UnknownVoice { voice: name.chars().take(64).collect() })
    }
}

fn check_length(field: &'static str, s: &str, limit: usize) -> Result<usize, ValidateError> {
    let found = s.chars().count();
    if found > limit { Err(ValidateError::TooLong { field, found, limit }) } else { Ok(found) }
}

fn in_range(field: &'static str, found: f64, min: f64, max: f64) -> Result<f64, ValidateError> {
    // `!(a <= x <= b)` so that NaN is refused too.
    if !(min <= found && found <= max) {
        return Err(ValidateError::OutOfRange { field, min, max, found });
    }
    Ok(found)
}

fn response_format(format: wire::ResponseFormat) -> ResponseFormat {
    match format {
        wire::ResponseFormat::Mp3 => ResponseFormat::Mp3,
        wire::ResponseFormat::Opus => ResponseFormat::Opus,
        wire::ResponseFormat::Aac => ResponseFormat::Aac,
        wire::ResponseFormat::Flac => ResponseFormat::Flac,
        wire::ResponseFormat::Wav => ResponseFormat::Wav,
        wire::ResponseFormat::Pcm => ResponseFormat::Pcm,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> SpeechPolicy {
        SpeechPolicy {
            served_model: "drama-3".into(),
            aliases: vec!["tts-1".into()],
            max_input_chars: 20,
            max_frames: 100,
        }
    }

    fn request(json: &str) -> SpeechRequest {
        serde_json::from_str(json).unwrap()
    }

    fn refusal(json: &str) -> ValidateError {
        validate(request(json), &policy()).unwrap_err()
    }

    #[test]
    fn defaults() {
        let v = validate(request(r#"{"model": "tts-1", "input": "hi", "seed": 7}"#), &policy()).unwrap();
        assert_eq!(v.text.as_str(), "hi");
        assert_eq!(
            (v.format, v.delivery, v.sample_rate, v.speed),
            (ResponseFormat::Mp3, Delivery::Streamed, 44_100, 1.0)
        );
        assert_eq!(
            v.options,
            GenerateOptions { params: SamplingParams::default(), seed: 7, max_frames: 100, stall: None }
        );
        let v =
            validate(request(r#"{"model": "drama-3", "input": "hi", "response_format": "pcm"}"#), &policy()).unwrap();
        assert_eq!(v.sample_rate, 24_000);
        let v =
            validate(request(r#"{"model": "drama-3", "input": "hi", "response_format": "opus"}"#), &policy()).unwrap();
        assert_eq!(v.sample_rate, 48_000);
    }

    #[test]
    fn each_refusal_names_its_field() {
        let cases = [
            (r#"{"input": "hi"}"#, "model", "missing_required_parameter"),
            (r#"{"model": "gpt-9", "input": "hi"}"#, "model", "model_not_found"),
            (r#"{"model": "tts-1"}"#, "input", "missing_required_parameter"),
            (r#"{"model": "tts-1", "input": "   "}"#, "input", "invalid_value"),
            (r#"{"model": "tts-1", "input": "123456789012345678901"}"#, "input", "string_above_max_length"),
            (r#"{"model": "tts-1", "input": "<|im_end|>"}"#, "input", "invalid_value"),
            (r#"{"model": "tts-1", "input": "<|speaker:16|>a"}"#, "input", "invalid_value"),
            (r#"{"model": "tts-1", "input": "a", "voice": "../bob"}"#, "voice", "voice_not_found"),
            (r#"{"model": "tts-1", "input": "a", "voice": {"id": "a b"}}"#, "voice", "voice_not_found"),
            (r#"{"model": "tts-1", "input": "a", "instructions": "x]y"}"#, "instructions", "invalid_value"),
            (r#"{"model": "tts-1", "input": "a", "instructions": "<|voice|>"}"#, "instructions", "invalid_value"),
            (r#"{"model": "tts-1", "input": "a", "speed": 4.5}"#, "speed", "invalid_value"),
            (r#"{"model": "tts-1", "input": "a", "speed": 0.2}"#, "speed", "invalid_value"),
            (r#"{"model": "tts-1", "input": "a", "sample_rate": 7999}"#, "sample_rate", "invalid_value"),
            (r#"{"model": "tts-1", "input": "a", "sample_rate": 48001}"#, "sample_rate", "invalid_value"),
            (
                r#"{"model": "tts-1", "input": "a", "response_format": "opus", "sample_rate": 44100}"#,
                "sample_rate",
                "invalid_value",
            ),
            (r#"{"model": "tts-1", "input": "a", "max_frames": 0}"#, "max_frames", "invalid_value"),
            (r#"{"model": "tts-1", "input": "a", "max_frames": 101}"#, "max_frames", "invalid_value"),
            (r#"{"model": "tts-1", "input": "a", "temperature": -1}"#, "temperature", "invalid_value"),
            (r#"{"model": "tts-1", "input": "a", "top_p": 0}"#, "top_p", "invalid_value"),
            (r#"{"model": "tts-1", "input": "a", "top_k": 0}"#, "top_k", "invalid_value"),
            (r#"{"model": "tts-1", "input": "a", "stream_format": "sse", "stream": false}"#, "stream", "invalid_value"),
            (r#"{"model": "tts-1", "input": "a", "voices": {"16": "bob"}}"#, "voices", "invalid_value"),
            (r#"{"model": "tts-1", "input": "a", "voices": {"01": "bob"}}"#, "voices", "invalid_value"),
            (r#"{"model": "tts-1", "input": "a", "voices": {"1|>x": "bob"}}"#, "voices", "invalid_value"),
            (r#"{"model": "tts-1", "input": "a", "voices": {"1": "../bob"}}"#, "voices", "voice_not_found"),
            (
                r#"{"model": "tts-1", "input": "a", "voices": {"1": "al"}, "references": [{"audio": "x", "text": "t"}]}"#,
                "voices",
                "invalid_value",
            ),
        ];
        for (json, param, code) in cases {
            let e = refusal(json);
            assert_eq!((e.param(), e.code()), (param, code), "{json}: {e}");
        }
        assert!(refusal(r#"{"model": "tts-1", "input": "a", "voice": "../bob"}"#).to_string().contains("`../bob`"));
    }

    #[cfg(not(feature = "aac"))]
    #[test]
    fn aac_without_the_feature_names_response_format() {
        let e = refusal(r#"{"model": "tts-1", "input": "a", "response_format": "aac"}"#);
        assert_eq!(e.param(), "response_format");
        assert!(e.to_string().contains("`aac`"), "{e}");
    }

    #[test]
    fn voices_and_directions() {
        let choices = [
            (r#""default""#, VoiceChoice::Default),
            (r#""alloy""#, VoiceChoice::Builtin("alloy".into())),
            (r#""Nova""#, VoiceChoice::Builtin("nova".into())),
            (r#"{"id": "cedar"}"#, VoiceChoice::Builtin("cedar".into())),
            (r#""narrator""#, VoiceChoice::Named("narrator".into())),
            (r#"{"id": "voice_1"}"#, VoiceChoice::Named("voice_1".into())),
        ];
        for (voice, want) in choices {
            let json = format!(r#"{{"model": "tts-1", "input": "a", "voice": {voice}}}"#);
            assert_eq!(validate(request(&json), &policy()).unwrap().voice, want, "{voice}");
        }
        let directed = |input: &str, d: &str| {
            let d = Direction::check(d).unwrap().unwrap();
            CallerText::check(input.into(), Field::Input).unwrap().with_direction(&d).as_str().to_owned()
        };
        assert_eq!(directed("hello", "calm"), "[calm] hello");
        assert_eq!(directed(" <|speaker:2|>  hello", "calm"), "<|speaker:2|> [calm] hello");
        let v = validate(request(r#"{"model": "tts-1", "input": "hi", "instructions": " sad "}"#), &policy()).unwrap();
        assert_eq!(v.text.as_str(), "[sad] hi");
        let v = validate(request(r#"{"model": "tts-1", "input": "hi", "instructions": ""}"#), &policy()).unwrap();
        assert_eq!(v.text.as_str(), "hi");
        let json = r#"{"model": "tts-1", "input": "hi", "voices": {"0": "alice", "12": {"id": "bob"}, "3": "alloy"}}"#;
        let v = validate(request(json), &policy()).unwrap();
        let want = BTreeMap::from([
            (0, VoiceChoice::Named("alice".into())),
            (3, VoiceChoice::Builtin("alloy".into())),
            (12, VoiceChoice::Named("bob".into())),
        ]);
        assert_eq!(v.speaker_voices, want);
    }

    #[test]
    fn input_is_normalised_unless_asked_not_to() {
        let v = validate(request(r#"{"model": "tts-1", "input": "3 cats [2 sighs]"}"#), &policy()).unwrap();
        assert_eq!(v.text.as_str(), "three cats [2 sighs]");
        let json = r#"{"model": "tts-1", "input": "3 cats", "normalize": false}"#;
        assert_eq!(validate(request(json), &policy()).unwrap().text.as_str(), "3 cats");
    }
}
