//! Opens a checkpoint directory in the published layout and refuses anything malformed before
//! the server starts: `config.json` rules, `tokenizer.json` special tokens, every shard tensor
//! against the name table, and `codec.pth`. Errors name the file and the tensor.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokenizers::Tokenizer;

use super::config::{ConfigError, Dims, ModelConfig};
use super::file_order::{self, FileOrderOptions, ReadStats, StreamError};
use super::weights::{
    CODEC_IGNORED_BUFFERS, CodecDims, CodecWeights, ModelWeights, TensorSource, TensorSpec, WeightError, codec_weights,
    in_model_namespace, model_weights,
};
use crate::backend::{BackendTypes, FileOrderUpload};
use crate::checkpoint::finite::first_non_finite;
use crate::checkpoint::pth::{PthArchive, PthError, PthTensor};
use crate::checkpoint::safetensors::{INDEX_FILE, SafetensorsError, ShardedCheckpoint};
use crate::checkpoint::tokenizer::{SpecialTokenIds, TokenizerError, TokenizerExpectations, load_tokenizer};
use crate::checkpoint::{Dtype, TensorView};

pub const CONFIG_FILE: &str = "config.json";
pub const TOKENIZER_FILE: &str = "tokenizer.json";
pub const CODEC_FILE: &str = "codec.pth";

/// Why a checkpoint directory was refused.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Shards(#[from] SafetensorsError),
    #[error(transparent)]
    Weights(#[from] WeightError),
    #[error(transparent)]
    Codec(#[from] PthError),
    #[error("{path}: {message}")]
    Missing { path: String, message: String },
}

/// A validated checkpoint: every file opened and every tensor checked against the table.
pub struct Checkpoint {
    pub dir: PathBuf,
    pub config: ModelConfig,
    pub dims: Dims,
    /// Shared with the prompt builders (the request layer's and the engine's).
    pub tokenizer: Arc<Tokenizer>,
    pub special_tokens: SpecialTokenIds,
    pub shards: ShardedCheckpoint,
    pub codec: PthArchive,
    pub codec_dims: CodecDims,
}

impl Checkpoint {
    pub fn open(dir: &Path) -> Result<Checkpoint, LoadError> {
        for file in [CONFIG_FILE, TOKENIZER_FILE, CODEC_FILE] {
            if !dir.join(file).is_file() {
                return Err(LoadError::Missing {
                    path: dir.join(file).display().to_string(),
                    message: "not found (a drama-3 checkpoint directory holds config.json, tokenizer.json, model.safetensors.index.json with its shards, and codec.pth)".into(),
                });
            }
        }
        let config = ModelConfig::from_file(&dir.join(CONFIG_FILE))?;
        let dims = config.dims();
        let expect = TokenizerExpectations {
            semantic_start: config.semantic_start_token_id,
            semantic_end: config.semantic_end_token_id,
            semantic_codes: config.audio_decoder_config.vocab_size,
            eos: config.eos_token_id,
        };
        let (tokenizer, special_tokens) = load_tokenizer(&dir.join(TOKENIZER_FILE), &expect)?;
        let shards = ShardedCheckpoint::open(dir)?;
        let codec = PthArchive::open(&dir.join(CODEC_FILE))?;
        let codec_file = codec.path().display().to_string();
        let codec_dims = CodecDims::infer(&codec_file, |name| codec.get(name).map(|t| t.shape.clone()))?;
        check_codec_matches_config(&codec_file, &codec_dims, &dims)?;
        let ckpt = Checkpoint {
            dir: dir.to_owned(),
            config,
            dims,
            tokenizer: Arc::new(tokenizer),
            special_tokens,
            shards,
            codec,
            codec_dims,
        };
        ckpt.model_weights()?;
        ckpt.codec_weights()?;
        Ok(ckpt)
    }

    /// Views of every backbone and tower tensor; refuses missing, mis-shaped, mis-typed or
    /// unexpected tensors.
    pub fn model_weights(&self) -> Result<ModelWeights<TensorView<'_>>, WeightError> {
        let mut src = ShardSource { shards: &self.shards, used: BTreeSet::new() };
        let weights = model_weights(&self.dims, &mut src)?;
        for name in self.shards.names() {
            if !src.used.contains(name) {
                let file = self.shards.get(name).map(|(p, _)| p.display().to_string()).unwrap_or_default();
                let tensor = name.to_owned();
                return Err(if in_model_namespace(name) {
                    WeightError::Unexpected { file, tensor }
                } else {
                    WeightError::UnknownNamespace { file, tensor }
                });
            }
        }
        Ok(weights)
    }

    /// Every backbone and tower tensor made resident on `backend`, once every value is known to
    /// be finite ([`Checkpoint::check_finite`]).
    pub fn upload_model_weights<B: BackendTypes>(&self, backend: &B) -> Result<ModelWeights<B::Weight>, WeightError> {
        self.upload_model_weights_reporting(backend, u64::MAX, &mut |_, _| {})
    }

    /// [`Checkpoint::upload_model_weights`], calling `report(bytes uploaded, bytes in all)` each
    /// time another `every` bytes are up (the server uses [`UPLOAD_REPORT_BYTES`]: the load's
    /// progress in the log and systemd's `STATUS=`).
    pub fn upload_model_weights_reporting<B: BackendTypes>(
        &self,
        backend: &B,
        every: u64,
        report: &mut dyn FnMut(u64, u64),
    ) -> Result<ModelWeights<B::Weight>, WeightError> {
        self.check_finite()?;
        let total = self.shard_tensor_bytes();
        let inner = ShardSource { shards: &self.shards, used: BTreeSet::new() };
        let mut src = UploadSource { inner, backend, done: 0, total, every, next_report: every, report };
        model_weights(&self.dims, &mut src)
    }

    /// [`Checkpoint::upload_model_weights_reporting`] for a backend that takes weights in file
    /// order (`model::file_order`): each weight is allocated as the builders ask for it, then the
    /// shard files are read once, front to back, checked finite piece by piece, and copied into
    /// place. `report` counts file bytes read.
    pub fn upload_model_weights_in_file_order<B: FileOrderUpload>(
        &self,
        backend: &B,
        options: FileOrderOptions,
        every: u64,
        report: &mut dyn FnMut(u64, u64),
    ) -> Result<(ModelWeights<B::Weight>, ReadStats), WeightError> {
        let inner = ShardSource { shards: &self.shards, used: BTreeSet::new() };
        let mut src = ReserveSource { inner, backend, reserved: BTreeMap::new() };
        let weights = model_weights(&self.dims, &mut src)?;
        let plans = file_order::plan(self.shards.files(), &src.reserved);
        match file_order::stream(backend, &plans, options, every, report) {
            Ok(stats) => Ok((weights, stats)),
            // The first bad tensor in name order, with its element, whatever piece found one.
            Err(StreamError::NonFinite { file, tensor }) => {
                Err(self.check_finite().err().unwrap_or(WeightError::Read {
                    file,
                    message: format!("tensor `{tensor}` read as NaN or infinite, but not again"),
                }))
            }
            Err(StreamError::Read { file, message }) => Err(WeightError::Read { file, message }),
            Err(StreamError::Staging(message)) => Err(WeightError::Read {
                file: self.dir.display().to_string(),
                message: format!("no staging memory for the upload: {message}"),
            }),
        }
    }

    /// Bytes of every shard tensor (what the upload moves).
    pub fn shard_tensor_bytes(&self) -> u64 {
        self.shards.names().filter_map(|n| self.shards.get(n)).map(|(_, v)| v.bytes.len() as u64).sum()
    }

    /// Refuses a shard tensor holding a NaN or an infinity (issue 16, finding 8): such a
    /// checkpoint would load, report ready and fail every request. One parallel pass over every
    /// tensor (at full size, 40 GB at the host's memory bandwidth, spread over its cores); it
    /// also brings the files into the page cache for the upload that follows. The tensor
    /// reported is the first in name order, whatever the threads do.
    pub fn check_finite(&self) -> Result<(), WeightError> {
        use rayon::prelude::*;
        let names: Vec<&str> = self.shards.names().collect();
        let bad = names.par_iter().find_map_first(|&name| {
            let (path, view) = self.shards.get(name)?;
            let index = first_non_finite(view.dtype, view.bytes)?;
            Some(WeightError::NonFinite { file: path.display().to_string(), tensor: name.to_owned(), index })
        });
        bad.map_or(Ok(()), Err)
    }

    /// Every codec parameter; the six known buffers are ignored, anything else unknown is refused.
    pub fn codec_weights(&self) -> Result<CodecWeights<CodecTensor<'_>>, WeightError> {
        let file = self.codec.path().display().to_string();
        let mut src = CodecSource { archive: &self.codec, file: file.clone(), used: BTreeSet::new() };
        let weights = codec_weights(&self.codec_dims, &mut src)?;
        for (name, _) in self.codec.tensors() {
            if !src.used.contains(name) && !CODEC_IGNORED_BUFFERS.contains(&name) {
                return Err(WeightError::Unexpected { file, tensor: name.to_owned() });
            }
        }
        Ok(weights)
    }
}

/// The codec's semantic codebook must cover the tower's code space (`model.md` §2.3).
fn check_codec_matches_config(file: &str, c: &CodecDims, d: &Dims) -> Result<(), WeightError> {
    let invalid =
        |tensor: &str, message: String| WeightError::Invalid { file: file.into(), tensor: tensor.into(), message };
    if c.semantic_codebook_size != d.codebook_vocab {
        return Err(invalid(
            "quantizer.semantic_quantizer.quantizers.0.codebook.weight",
            format!(
                "has {} entries but config.json `audio_decoder_config.vocab_size` is {}",
                c.semantic_codebook_size, d.codebook_vocab
            ),
        ));
    }
    if c.residual_codebooks + 1 != d.codebooks {
        return Err(invalid(
            "quantizer.quantizer.quantizers",
            format!(
                "has {} residual codebooks but config.json `audio_decoder_config.num_codebooks` is {}",
                c.residual_codebooks, d.codebooks
            ),
        ));
    }
    Ok(())
}

/// Checks one spec against what a file holds.
fn check_spec(file: &str, spec: &TensorSpec, name: &str, dtype: Dtype, shape: &[usize]) -> Result<(), WeightError> {
    if !spec.accept.allows(dtype) {
        return Err(WeightError::Dtype {
            file: file.into(),
            tensor: name.into(),
            expected: spec.accept.describe(),
            found: dtype,
        });
    }
    if shape != spec.shape.as_slice() {
        return Err(WeightError::Shape {
            file: file.into(),
            tensor: name.into(),
            expected: spec.shape.clone(),
            found: shape.to_vec(),
        });
    }
    Ok(())
}

struct ShardSource<'a> {
    shards: &'a ShardedCheckpoint,
    used: BTreeSet<String>,
}

impl<'a> ShardSource<'a> {
    /// The tensor `spec` asks for, checked, under the name the file gives it (the spec's, or
    /// the alias it was found under).
    fn find(&mut self, spec: &TensorSpec) -> Result<(String, TensorView<'a>), WeightError> {
        let shards = self.shards;
        let found = std::iter::once(&spec.name).chain(&spec.alias).find_map(|n| Some((n, shards.get(n)?)));
        let Some((name, (path, view))) = found else {
            return Err(WeightError::Missing { file: INDEX_FILE.into(), tensor: spec.name.clone() });
        };
        check_spec(&path.display().to_string(), spec, name, view.dtype, view.shape)?;
        self.used.insert(name.clone());
        Ok((name.clone(), view))
    }
}

impl<'a> TensorSource for ShardSource<'a> {
    type Tensor = TensorView<'a>;

    fn tensor(&mut self, spec: TensorSpec) -> Result<TensorView<'a>, WeightError> {
        Ok(self.find(&spec)?.1)
    }
}

/// Bytes uploaded between two progress reports (about 20 at full size).
pub const UPLOAD_REPORT_BYTES: u64 = 2 << 30;

/// Uploads each checked shard tensor to a backend as the builders ask for it.
struct UploadSource<'a, 'b, B> {
    inner: ShardSource<'a>,
    backend: &'b B,
    /// Bytes uploaded so far, of `total`; the next report is due at `next_report`.
    done: u64,
    total: u64,
    every: u64,
    next_report: u64,
    report: &'b mut dyn FnMut(u64, u64),
}

impl<B: BackendTypes> TensorSource for UploadSource<'_, '_, B> {
    type Tensor = B::Weight;

    fn tensor(&mut self, spec: TensorSpec) -> Result<B::Weight, WeightError> {
        let view = self.inner.tensor(spec.clone())?;
        let weight = self.backend.upload(&spec, view);
        self.done += view.bytes.len() as u64;
        if self.done >= self.next_report {
            (self.report)(self.done, self.total);
            self.next_report = self.done.saturating_add(self.every);
        }
        Ok(weight)
    }
}

/// Allocates each checked shard tensor on a [`FileOrderUpload`] backend as the builders ask for
/// it, noting where the ones copied as stored go.
struct ReserveSource<'a, 'b, B> {
    inner: ShardSource<'a>,
    backend: &'b B,
    /// Tensor name (as in the file) → destination address.
    reserved: BTreeMap<String, u64>,
}

impl<B: FileOrderUpload> TensorSource for ReserveSource<'_, '_, B> {
    type Tensor = B::Weight;

    fn tensor(&mut self, spec: TensorSpec) -> Result<B::Weight, WeightError> {
        let (name, view) = self.inner.find(&spec)?;
        let (weight, dst) = self.backend.reserve(&spec, view);
        if let Some(dst) = dst {
            self.reserved.insert(name, dst);
        }
        Ok(weight)
    }
}

/// A codec parameter: its name and where it lies in `codec.pth`.
#[derive(Clone)]
pub struct CodecTensor<'a> {
    pub name: String,
    pub tensor: &'a PthTensor,
}

struct CodecSource<'a> {
    archive: &'a PthArchive,
    file: String,
    used: BTreeSet<String>,
}

impl<'a> TensorSource for CodecSource<'a> {
    type Tensor = CodecTensor<'a>;

    fn tensor(&mut self, spec: TensorSpec) -> Result<CodecTensor<'a>, WeightError> {
        let archive = self.archive;
        let found = std::iter::once(&spec.name).chain(&spec.alias).find_map(|n| Some((n, archive.get(n)?)));
        let Some((name, tensor)) = found else {
            return Err(WeightError::Missing { file: self.file.clone(), tensor: spec.name });
        };
        check_spec(&self.file, &spec, name, tensor.dtype, &tensor.shape)?;
        self.used.insert(name.clone());
        Ok(CodecTensor { name: name.clone(), tensor })
    }
}
