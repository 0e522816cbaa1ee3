//! Named voices (`/v1/audio/voices`): a voice is a reference's codes and transcript, kept under
//! `--voices-dir` as one JSON file each (`<name>.voice.json`), plus the uploaded audio when asked.
//!
//! Writes are atomic: the file is written under a temporary name, flushed to disk, renamed over
//! its final name, and the directory is flushed, so a kill or a crash mid-write leaves either the
//! old state or the new one, never a torn file (leftover temporary files are removed at open).
//! A file that does not parse or does not hold a whole voice is refused at open, by name, and the
//! other voices load. Without a directory, voices live in memory only.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use serde::{Deserialize, Serialize};

/// File name suffix of a stored voice.
const SUFFIX: &str = ".voice.json";
/// Suffix of the stored audio next to it (the upload's bytes, as sent).
const AUDIO_SUFFIX: &str = ".voice.audio";
/// Prefix of files being written.
const TEMP_PREFIX: &str = ".tmp-";
/// The format tag of a voice file.
const FORMAT: &str = "limelight-voice-v1";
/// Longest voice name.
pub const MAX_NAME_CHARS: usize = 64;
/// Names a stored voice may not take: the default voice, and OpenAI's built-in names (they keep
/// meaning the default voice unless an operator aliases them, `--voice-alias`).
pub const RESERVED_NAMES: &[&str] = &[
    "default", "alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage", "shimmer", "verse", "marin",
    "cedar",
];

/// A stored voice.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Voice {
    pub name: String,
    /// Seconds since the Unix epoch.
    pub created_at: u64,
    /// The uploader's consent statement (OpenAI's custom-voice upload asks for one).
    pub consent: String,
    /// The uploaded file's size in bytes and media type.
    pub file_size: usize,
    pub mime_type: String,
    /// The reference's transcript.
    pub ref_text: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speaker_description: Option<String>,
    /// Codes per frame (the semantic code, then the residual ones).
    pub codebooks: usize,
    /// Row-major `[frames, codebooks]`.
    pub codes: Vec<u32>,
    /// Seconds of reference audio the codes were encoded from.
    pub audio_seconds: f64,
    /// Whether the uploaded audio is stored beside the voice.
    #[serde(default)]
    pub audio_stored: bool,
}

impl Voice {
    pub fn frames(&self) -> usize {
        self.codes.len() / self.codebooks.max(1)
    }
}

/// The on-disk form: the voice plus its format tag.
#[derive(Serialize, Deserialize)]
struct VoiceFile {
    format: String,
    #[serde(flatten)]
    voice: Voice,
}

/// What a store holds at most.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreLimits {
    pub max_voices: usize,
}

impl Default for StoreLimits {
    fn default() -> Self {
        StoreLimits { max_voices: 1000 }
    }
}

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("invalid voice name: {0}")]
    Name(String),
    #[error("a voice named `{0}` already exists")]
    Exists(String),
    #[error("no voice named `{0}`")]
    NotFound(String),
    #[error("the server already holds {max} voices")]
    Full { max: usize },
    #[error("voice file {path}: {message}")]
    File { path: PathBuf, message: String },
    #[error("voices directory {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}

/// A voice file refused at open.
#[derive(Debug)]
pub struct Refused {
    pub path: PathBuf,
    pub reason: String,
}

/// The named voices, shared by every request.
pub struct VoiceStore {
    dir: Option<PathBuf>,
    limits: StoreLimits,
    voices: RwLock<BTreeMap<String, Arc<Voice>>>,
}

/// Checks a voice name: 1–64 characters of letters, digits, `-`, `_` and `.`, not starting with
/// `.` (no paths, no hidden files, no control characters), and not a reserved name.
pub fn validate_name(name: &str) -> Result<(), StoreError> {
    let bad = |why: &str| {
        Err(StoreError::Name(format!("`{}`: {why}", name.chars().take(MAX_NAME_CHARS).collect::<String>())))
    };
    if name.is_empty() || name.chars().count() > MAX_NAME_CHARS {
        return bad(&format!("a name has 1 to {MAX_NAME_CHARS} characters"));
    }
    if !name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')) || name.starts_with('.') {
        return bad("use letters, digits, `-`, `_` and `.` (not first)");
    }
    if RESERVED_NAMES.iter().any(|r| r.eq_ignore_ascii_case(name)) {
        return bad("the name is reserved for the default voice and OpenAI's built-in names");
    }
    Ok(())
}

impl VoiceStore {
    /// Voices in memory only (no `--voices-dir`).
    pub fn in_memory(limits: StoreLimits) -> VoiceStore {
        VoiceStore { dir: None, limits, voices: RwLock::new(BTreeMap::new()) }
    }

    /// Opens (creating it if needed) `dir` and loads its voices; returns the files it refused.
    pub fn open(dir: &Path, limits: StoreLimits) -> Result<(VoiceStore, Vec<Refused>), StoreError> {
        let io = |source| StoreError::Io { path: dir.to_path_buf(), source };
        fs::create_dir_all(dir).map_err(io)?;
        let mut voices = BTreeMap::new();
        let mut refused = Vec::new();
        for entry in fs::read_dir(dir).map_err(io)? {
            let path = entry.map_err(io)?.path();
            let Some(file) = path.file_name().and_then(|f| f.to_str()).map(str::to_owned) else { continue };
            if file.starts_with(TEMP_PREFIX) {
                // A write that never finished: its rename did not happen, so nothing refers to it.
                let _ = fs::remove_file(&path);
                continue;
            }
            let Some(stem) = file.strip_suffix(SUFFIX) else { continue };
            match read_voice(&path, stem) {
                Ok(voice) => {
                    voices.insert(voice.name.clone(), Arc::new(voice));
                }
                Err(reason) => refused.push(Refused { path, reason }),
            }
        }
        Ok((VoiceStore { dir: Some(dir.to_path_buf()), limits, voices: RwLock::new(voices) }, refused))
    }

    /// Where voices persist, if anywhere.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    pub fn get(&self, name: &str) -> Option<Arc<Voice>> {
        self.voices.read().expect("voice store lock").get(name).cloned()
    }

    /// Every voice, by name.
    pub fn list(&self) -> Vec<Arc<Voice>> {
        self.voices.read().expect("voice store lock").values().cloned().collect()
    }

    /// Adds a new voice (and its uploaded audio, when given), on disk first.
    pub fn insert(&self, voice: Voice, audio: Option<&[u8]>) -> Result<Arc<Voice>, StoreError> {
        validate_name(&voice.name)?;
        let mut voices = self.voices.write().expect("voice store lock");
        if voices.contains_key(&voice.name) {
            return Err(StoreError::Exists(voice.name));
        }
        if voices.len() >= self.limits.max_voices {
            return Err(StoreError::Full { max: self.limits.max_voices });
        }
        if let Some(dir) = &self.dir {
            if let Some(bytes) = audio {
                write_atomically(dir, &format!("{}{AUDIO_SUFFIX}", voice.name), bytes)?;
            }
            let file = VoiceFile { format: FORMAT.to_owned(), voice: voice.clone() };
            let json = serde_json::to_vec(&file).expect("a voice serialises");
            write_atomically(dir, &format!("{}{SUFFIX}", voice.name), &json)?;
        }
        let voice = Arc::new(voice);
        voices.insert(voice.name.clone(), voice.clone());
        Ok(voice)
    }

    /// Deletes a voice (its file and any stored audio).
    pub fn remove(&self, name: &str) -> Result<(), StoreError> {
        let mut voices = self.voices.write().expect("voice store lock");
        if !voices.contains_key(name) {
            return Err(StoreError::NotFound(name.chars().take(MAX_NAME_CHARS).collect()));
        }
        if let Some(dir) = &self.dir {
            let io = |source| StoreError::Io { path: dir.clone(), source };
            fs::remove_file(dir.join(format!("{name}{SUFFIX}"))).map_err(io)?;
            match fs::remove_file(dir.join(format!("{name}{AUDIO_SUFFIX}"))) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io(e)),
            }
            sync_dir(dir)?;
        }
        voices.remove(name);
        Ok(())
    }
}

fn read_voice(path: &Path, stem: &str) -> Result<Voice, String> {
    let bytes = fs::read(path).map_err(|e| e.to_string())?;
    let file: VoiceFile = serde_json::from_slice(&bytes).map_err(|e| format!("not a voice file: {e}"))?;
    if file.format != FORMAT {
        return Err(format!("format `{}`, expected `{FORMAT}`", file.format));
    }
    let v = file.voice;
    if v.name != stem {
        return Err(format!("holds the voice `{}`, not `{stem}`", v.name));
    }
    validate_name(&v.name).map_err(|e| e.to_string())?;
    if v.codebooks == 0 || v.codes.is_empty() || !v.codes.len().is_multiple_of(v.codebooks) {
        return Err(format!("{} codes are not whole frames of {} codebooks", v.codes.len(), v.codebooks));
    }
    Ok(v)
}

/// Writes `bytes` to `dir/name` so that the file is either absent, as before, or whole.
fn write_atomically(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), StoreError> {
    let temp = dir.join(format!("{TEMP_PREFIX}{name}"));
    let io = |source| StoreError::Io { path: dir.to_path_buf(), source };
    let mut f = fs::File::create(&temp).map_err(io)?;
    f.write_all(bytes).map_err(io)?;
    f.sync_all().map_err(io)?;
    drop(f);
    fs::rename(&temp, dir.join(name)).map_err(io)?;
    sync_dir(dir)
}

/// Flushes the directory entry (the rename) to disk.
fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    let io = |source| StoreError::Io { path: dir.to_path_buf(), source };
    fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn voice(name: &str) -> Voice {
        Voice {
            name: name.into(),
            created_at: 1_700_000_000,
            consent: "yes".into(),
            file_size: 8,
            mime_type: "audio/wav".into(),
            ref_text: "Hello there.".into(),
            speaker_description: None,
            codebooks: 2,
            codes: vec![1, 2, 3, 4, 5, 6],
            audio_seconds: 0.3,
            audio_stored: false,
        }
    }

    #[test]
    fn names_are_checked() {
        for ok in ["narrator", "Bob-2", "a.b_c", "x"] {
            assert!(validate_name(ok).is_ok(), "{ok}");
        }
        let long = "a".repeat(MAX_NAME_CHARS + 1);
        for bad in ["", "../etc", "a/b", ".hidden", "tab\there", "é", "Alloy", "default", long.as_str()] {
            assert!(matches!(validate_name(bad), Err(StoreError::Name(_))), "{bad:?}");
        }
    }

    #[test]
    fn voices_persist_across_opens_and_deletes_stick() {
        let dir = tempfile::tempdir().unwrap();
        let (store, refused) = VoiceStore::open(dir.path(), StoreLimits::default()).unwrap();
        assert!(refused.is_empty());
        store.insert(voice("narrator"), Some(b"RIFF....")).unwrap();
        store.insert(voice("second"), None).unwrap();
        assert!(matches!(store.insert(voice("narrator"), None), Err(StoreError::Exists(_))));
        let (again, refused) = VoiceStore::open(dir.path(), StoreLimits::default()).unwrap();
        assert!(refused.is_empty());
        assert_eq!(*again.get("narrator").unwrap(), voice("narrator"));
        assert_eq!(again.list().len(), 2);
        assert_eq!(fs::read(dir.path().join("narrator.voice.audio")).unwrap(), b"RIFF....");
        again.remove("narrator").unwrap();
        assert!(matches!(again.remove("narrator"), Err(StoreError::NotFound(_))));
        let (third, _) = VoiceStore::open(dir.path(), StoreLimits::default()).unwrap();
        assert!(third.get("narrator").is_none() && third.get("second").is_some());
        assert!(!dir.path().join("narrator.voice.audio").exists());
    }

    #[test]
    fn bad_files_are_refused_by_name_and_torn_writes_vanish() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("broken.voice.json"), b"{not json").unwrap();
        fs::write(
            dir.path().join("other.voice.json"),
            serde_json::to_vec(&VoiceFile { format: FORMAT.into(), voice: voice("mismatch") }).unwrap(),
        )
        .unwrap();
        let mut odd = voice("odd");
        odd.codes.pop();
        fs::write(
            dir.path().join("odd.voice.json"),
            serde_json::to_vec(&VoiceFile { format: FORMAT.into(), voice: odd }).unwrap(),
        )
        .unwrap();
        fs::write(dir.path().join(".tmp-half.voice.json"), b"{\"format\":").unwrap();
        fs::write(
            dir.path().join("good.voice.json"),
            serde_json::to_vec(&VoiceFile { format: FORMAT.into(), voice: voice("good") }).unwrap(),
        )
        .unwrap();
        let (store, refused) = VoiceStore::open(dir.path(), StoreLimits::default()).unwrap();
        let mut names: Vec<String> =
            refused.iter().map(|r| r.path.file_name().unwrap().to_string_lossy().into_owned()).collect();
        names.sort();
        assert_eq!(names, ["broken.voice.json", "odd.voice.json", "other.voice.json"]);
        assert!(store.get("good").is_some());
        assert!(!dir.path().join(".tmp-half.voice.json").exists());
    }

    #[test]
    fn the_store_is_bounded() {
        let store = VoiceStore::in_memory(StoreLimits { max_voices: 1 });
        store.insert(voice("one"), None).unwrap();
        assert!(matches!(store.insert(voice("two"), None), Err(StoreError::Full { max: 1 })));
    }
}
