//! Every stage's tensors for one prompt, for comparison with references and between backends
//! (`limelight trace`): backbone embedding, per-layer residual stream, final norm and restricted
//! logits; the tower teacher-forced over the prompt (every layer, every head); and the codec's
//! stages for the prompt's audio rows, if it has any.

use super::generate::{Engine, GenerateError};
use crate::backend::Backend;
use crate::model::backbone::Stage;
use crate::model::codec::StreamingDecoder;
use crate::model::frame::Rows;

/// One dumped tensor: name, shape, f32 values.
pub struct TracedTensor {
    pub name: String,
    pub shape: Vec<usize>,
    pub values: Vec<f32>,
}

fn tensor(name: impl Into<String>, shape: &[usize], values: Vec<f32>) -> TracedTensor {
    TracedTensor { name: name.into(), shape: shape.to_vec(), values }
}

/// Runs `rows` through every part of `engine`, recording each stage.
pub fn trace<B: Backend>(engine: &Engine<'_, B>, rows: &Rows) -> Result<Vec<TracedTensor>, GenerateError> {
    if rows.is_empty() {
        return Err(GenerateError::EmptyPrompt);
    }
    let b = engine.backend;
    let mut out = Vec::new();
    let mut state = engine.backbone.new_state();
    let mut observe = |stage: Stage, act: &B::Act| {
        let m = b.to_host(act);
        let name = match stage {
            Stage::Embedding => "backbone.embedding".to_owned(),
            Stage::Layer(l) => format!("backbone.layer.{l}"),
            Stage::FinalNorm => "backbone.final_norm".to_owned(),
        };
        out.push(tensor(name, &[m.rows, m.cols], m.data));
    };
    let hidden = engine.backbone.prefill_observed(&mut state, rows, &mut observe)?;
    let logits = engine.backbone.restricted_logits(&hidden, rows.len() - 1);
    out.push(tensor("backbone.restricted_logits_last_row", &[logits.len()], logits));
    let ids: Vec<f32> = engine.backbone.restricted_token_ids().iter().map(|&i| i as f32).collect();
    out.push(tensor("backbone.restricted_token_ids", &[ids.len()], ids));

    let mut tower_state = engine.tower.new_state();
    let t = engine.tower.prefill_traced(&mut tower_state, &hidden, rows)?;
    for (l, layer) in t.layers.into_iter().enumerate() {
        let dim = layer.len() / t.rows.max(1);
        out.push(tensor(format!("tower.layer.{l}"), &[t.rows, dim], layer));
    }
    for (r, head) in t.heads.into_iter().enumerate() {
        let v = head.len() / t.rows.max(1);
        out.push(tensor(format!("tower.head.{r}"), &[t.rows, v], head));
    }

    let audio_codes: Vec<u32> = (0..rows.len())
        .filter(|&t| engine.candidates.is_semantic(rows.token(t)))
        .flat_map(|t| rows.row(t)[1..].to_vec())
        .collect();
    if !audio_codes.is_empty() {
        let mut decoder = StreamingDecoder::new(engine.codec, b);
        let (pcm, stages) = decoder.push_traced(&audio_codes)?;
        for (name, act) in [
            ("codec.rvq", &stages.rvq),
            ("codec.post_module", &stages.post_module),
            ("codec.upsample", &stages.upsample),
        ] {
            let m = b.to_host(act);
            out.push(tensor(name, &[m.rows, m.cols], m.data));
        }
        out.push(tensor("codec.pcm", &[pcm.len()], pcm));
    }
    let flat: Vec<f32> = rows.as_flat().iter().map(|&v| v as f32).collect();
    out.push(tensor("rows", &[rows.len(), rows.width()], flat));
    Ok(out)
}
