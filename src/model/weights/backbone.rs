//! Backbone tensor names (`model.md` §3.2): embedding, 40 hybrid layers (Gated DeltaNet or
//! gated attention, each followed by a block-FP8 MoE), final norm and `lm_head`.

use super::{Accept, Init, TensorSource, TensorSpec, WeightError};
use crate::checkpoint::Dtype;
use crate::model::config::Dims;

pub struct BackboneWeights<T> {
    /// `[vocab, hidden]`.
    pub embed_tokens: T,
    pub layers: Vec<BackboneLayer<T>>,
    /// Zero-centred final norm `[hidden]`.
    pub final_norm: T,
    /// `[vocab, hidden]`; only the semantic band and EOS rows are used.
    pub lm_head: T,
}

pub struct BackboneLayer<T> {
    pub input_norm: T,
    pub mixer: Mixer<T>,
    pub post_attention_norm: T,
    pub moe: MoeWeights<T>,
}

pub enum Mixer<T> {
    GatedDeltaNet(GdnWeights<T>),
    Attention(AttentionWeights<T>),
}

pub struct GdnWeights<T> {
    /// `[2·Hk·Dk + Hv·Dv, hidden]`, rows Q | K | V.
    pub in_proj_qkv: T,
    /// `[Hv·Dv, hidden]`.
    pub in_proj_z: T,
    /// `[Hv, hidden]` (β).
    pub in_proj_b: T,
    /// `[Hv, hidden]` (decay input).
    pub in_proj_a: T,
    /// Depthwise causal conv `[qkv_dim, 1, kernel]`.
    pub conv1d: T,
    pub dt_bias: T,
    pub a_log: T,
    /// Gated RMSNorm gain `[Dv]`; a plain gain, not `1 + w`.
    pub norm: T,
    /// `[hidden, Hv·Dv]`.
    pub out_proj: T,
}

pub struct AttentionWeights<T> {
    /// `[2·H·head_dim, hidden]`: per head a query block, then a gate block.
    pub q_proj: T,
    pub k_proj: T,
    pub v_proj: T,
    pub o_proj: T,
    pub q_norm: T,
    pub k_norm: T,
}

pub struct MoeWeights<T> {
    /// Router `[experts, hidden]`.
    pub router: T,
    pub experts: Vec<Fp8Expert<T>>,
    pub shared_expert: SwiGlu<T>,
    /// `[1, hidden]`: sigmoid gate of the shared expert.
    pub shared_expert_gate: T,
}

pub struct Fp8Expert<T> {
    pub gate_proj: Fp8Linear<T>,
    pub up_proj: Fp8Linear<T>,
    pub down_proj: Fp8Linear<T>,
}

/// A block-FP8 linear: `dense[r, c] = weight[r, c] × scale_inv[r / 128, c / 128]`.
pub struct Fp8Linear<T> {
    pub weight: T,
    pub scale_inv: T,
}

pub struct SwiGlu<T> {
    pub gate_proj: T,
    pub up_proj: T,
    pub down_proj: T,
}

/// Walks the backbone's tensors in checkpoint order.
pub fn backbone_weights<S: TensorSource>(d: &Dims, src: &mut S) -> Result<BackboneWeights<S::Tensor>, WeightError> {
    const P: &str = "model.language_model";
    let embed_tokens = src.tensor(TensorSpec::new(
        format!("{P}.embed_tokens.weight"),
        &[d.vocab, d.hidden],
        Accept::Bf16,
        Dtype::BF16,
        Init::Normalish { std: 0.5 },
    ))?;
    let layers = (0..d.layers).map(|l| backbone_layer(d, l, src)).collect::<Result<Vec<_>, _>>()?;
    let final_norm = src.tensor(TensorSpec::zero_centered_norm(format!("{P}.norm.weight"), d.hidden))?;
    let lm_head = src.tensor(TensorSpec::linear("lm_head.weight", d.vocab, d.hidden))?;
    Ok(BackboneWeights { embed_tokens, layers, final_norm, lm_head })
}

fn backbone_layer<S: TensorSource>(d: &Dims, l: usize, src: &mut S) -> Result<BackboneLayer<S::Tensor>, WeightError> {
    let p = format!("model.language_model.layers.{l}");
    let input_norm = src.tensor(TensorSpec::zero_centered_norm(format!("{p}.input_layernorm.weight"), d.hidden))?;
    let mixer = if d.is_full_attention(l) {
        Mixer::Attention(attention(d, &format!("{p}.self_attn"), src)?)
    } else {
        Mixer::GatedDeltaNet(gated_delta_net(d, &format!("{p}.linear_attn"), src)?)
    };
    let post_attention_norm =
        src.tensor(TensorSpec::zero_centered_norm(format!("{p}.post_attention_layernorm.weight"), d.hidden))?;
    let moe = moe(d, &format!("{p}.mlp"), src)?;
    Ok(BackboneLayer { input_norm, mixer, post_attention_norm, moe })
}

fn gated_delta_net<S: TensorSource>(d: &Dims, p: &str, src: &mut S) -> Result<GdnWeights<S::Tensor>, WeightError> {
    let (h, qkv, vt, hv) = (d.hidden, d.gdn_qkv_dim(), d.gdn_value_total(), d.gdn_value_heads);
    Ok(GdnWeights {
        in_proj_qkv: src.tensor(TensorSpec::linear(format!("{p}.in_proj_qkv.weight"), qkv, h))?,
        in_proj_z: src.tensor(TensorSpec::linear(format!("{p}.in_proj_z.weight"), vt, h))?,
        in_proj_b: src.tensor(TensorSpec::linear(format!("{p}.in_proj_b.weight"), hv, h))?,
        in_proj_a: src.tensor(TensorSpec::linear(format!("{p}.in_proj_a.weight"), hv, h))?,
        conv1d: src.tensor(TensorSpec::new(
            format!("{p}.conv1d.weight"),
            &[qkv, 1, d.gdn_conv_kernel],
            Accept::Bf16,
            Dtype::BF16,
            Init::Linear { fan_in: d.gdn_conv_kernel },
        ))?,
        dt_bias: src.tensor(TensorSpec::new(
            format!("{p}.dt_bias"),
            &[hv],
            Accept::SmallFloat,
            Dtype::BF16,
            Init::DtBias,
        ))?,
        a_log: src.tensor(TensorSpec::new(format!("{p}.A_log"), &[hv], Accept::SmallFloat, Dtype::F32, Init::ALog))?,
        norm: src.tensor(TensorSpec::new(
            format!("{p}.norm.weight"),
            &[d.gdn_value_dim],
            Accept::SmallFloat,
            Dtype::BF16,
            Init::Uniform { lo: 0.75, hi: 1.25 },
        ))?,
        out_proj: src.tensor(TensorSpec::linear(format!("{p}.out_proj.weight"), h, vt).residual_branch())?,
    })
}

fn attention<S: TensorSource>(d: &Dims, p: &str, src: &mut S) -> Result<AttentionWeights<S::Tensor>, WeightError> {
    let h = d.hidden;
    Ok(AttentionWeights {
        q_proj: src.tensor(TensorSpec::linear(format!("{p}.q_proj.weight"), d.attn_q_proj_rows(), h))?,
        k_proj: src.tensor(TensorSpec::linear(format!("{p}.k_proj.weight"), d.attn_kv_dim(), h))?,
        v_proj: src.tensor(TensorSpec::linear(format!("{p}.v_proj.weight"), d.attn_kv_dim(), h))?,
        o_proj: src.tensor(TensorSpec::linear(format!("{p}.o_proj.weight"), h, d.attn_out_dim()).residual_branch())?,
        q_norm: src.tensor(TensorSpec::zero_centered_norm(format!("{p}.q_norm.weight"), d.head_dim))?,
        k_norm: src.tensor(TensorSpec::zero_centered_norm(format!("{p}.k_norm.weight"), d.head_dim))?,
    })
}

fn moe<S: TensorSource>(d: &Dims, p: &str, src: &mut S) -> Result<MoeWeights<S::Tensor>, WeightError> {
    let (h, i, si) = (d.hidden, d.expert_intermediate, d.shared_expert_intermediate);
    let router = src.tensor(TensorSpec::linear(format!("{p}.gate.weight"), d.experts, h))?;
    let experts = (0..d.experts)
        .map(|e| {
            let q = format!("{p}.experts.{e}");
            Ok(Fp8Expert {
                gate_proj: fp8_linear(d, &format!("{q}.gate_proj"), i, h, false, src)?,
                up_proj: fp8_linear(d, &format!("{q}.up_proj"), i, h, false, src)?,
                down_proj: fp8_linear(d, &format!("{q}.down_proj"), h, i, true, src)?,
            })
        })
        .collect::<Result<Vec<_>, WeightError>>()?;
    let shared_expert = SwiGlu {
        gate_proj: src.tensor(TensorSpec::linear(format!("{p}.shared_expert.gate_proj.weight"), si, h))?,
        up_proj: src.tensor(TensorSpec::linear(format!("{p}.shared_expert.up_proj.weight"), si, h))?,
        down_proj: src
            .tensor(TensorSpec::linear(format!("{p}.shared_expert.down_proj.weight"), h, si).residual_branch())?,
    };
    let shared_expert_gate = src.tensor(TensorSpec::linear(format!("{p}.shared_expert_gate.weight"), 1, h))?;
    Ok(MoeWeights { router, experts, shared_expert, shared_expert_gate })
}

fn fp8_linear<S: TensorSource>(
    d: &Dims,
    p: &str,
    out: usize,
    inp: usize,
    residual_branch: bool,
    src: &mut S,
) -> Result<Fp8Linear<S::Tensor>, WeightError> {
    let [bo, bi] = d.fp8_block;
    let scale_inv = TensorSpec::new(
        format!("{p}.weight_scale_inv"),
        &[out.div_ceil(bo), inp.div_ceil(bi)],
        Accept::Scale,
        Dtype::F32,
        Init::Fp8Scale { fan_in: inp },
    );
    Ok(Fp8Linear {
        weight: src.tensor(TensorSpec::new(
            format!("{p}.weight"),
            &[out, inp],
            Accept::Fp8E4M3,
            Dtype::F8E4M3,
            Init::Fp8Codes,
        ))?,
        // The scales carry the magnitude (the codes span the e4m3 range whatever it is).
        scale_inv: src.tensor(if residual_branch { scale_inv.residual_branch() } else { scale_inv })?,
    })
}
