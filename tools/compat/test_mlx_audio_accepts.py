"""mlx-audio 0.6.2 (an independent Drama 3 implementation) accepts and runs our checkpoint.

For vq_backbone_codebooks 1 (backbone_partial) and 0 (mtp_shared_pre), proves that: its fish_drama3
converter converts the checkpoint (every expert complete, FP8 decodes, every name known); its own
strict loader builds the model (no missing, unexpected or mis-shaped weight) and its tokenizer/config
agreement check passes; its dequantized experts equal our FP8 * block scale computed in numpy; and on
CPU in float32 a prefill over a prompt with reference codes plus 3 decode steps give finite logits
and hidden states and well-formed [main, c0..c(n-1)] frames.
Negative control: a checkpoint missing one expert scale is rejected by mlx-audio (and by our inspect).
"""

import json
import subprocess
from pathlib import Path
from unittest.mock import patch

import mlx.core as mx
import ml_dtypes
import numpy as np
import pytest
from conftest import INDEX, copy_checkpoint, drop_tensor
from mlx_audio.tts.models.fish_drama3.convert import convert
from mlx_audio.tts.models.fish_drama3.drama3 import RAS_WINDOW
from mlx_audio.tts.utils import load_model
from safetensors import safe_open

if not hasattr(np, "float8_e4m3fn"):
    np.float8_e4m3fn = ml_dtypes.float8_e4m3fn

# The codec is not converted (codec=False); the loader would otherwise read codec.safetensors.
NO_CODEC = patch("mlx_audio.codec.models.fish_s1_dac.DAC.from_pretrained", return_value=None)


def convert_and_load(src: Path, dst: Path):
    convert(src, dst, codec=False)
    with NO_CODEC:
        return load_model(dst)  # strict=True, then post_load_hook's tokenizer checks


@pytest.fixture(scope="module", params=[1, 0], ids=["backbone_partial_k1", "mtp_shared_pre_k0"])
def converted(request, synth, tmp_path_factory):
    src = synth(request.param)
    dst = tmp_path_factory.mktemp("mlx") / "model"
    model = convert_and_load(src, dst)
    model.set_dtype(mx.float32)  # MLX's CPU GatherMM (the MoE matmul) only supports float32
    return src, dst, model


def test_config_and_tokenizer_agree(converted):
    src, _, model = converted
    config = json.loads((src / "config.json").read_text())
    assert model.tower.backbone_codebooks == config["audio_decoder_config"]["vq_backbone_codebooks"]
    tok = model.tokenizer  # set by post_load_hook only after its three id checks passed
    assert tok.token_to_id("<|semantic:0|>") == config["semantic_start_token_id"]
    last = f"<|semantic:{model.tower.vocab_size - 1}|>"
    assert tok.token_to_id(last) == config["semantic_end_token_id"]
    assert tok.token_to_id("<|im_end|>") == config["eos_token_id"]
    # Prompts are encoded segment by segment: structural strings must be single added tokens,
    # with nothing (BOS/EOS) added around them.
    ids = tok.encode("<|im_start|>assistant\n<|voice|>").ids
    assert ids[0] == tok.token_to_id("<|im_start|>") and ids[-1] == tok.token_to_id("<|voice|>")
    assert tok.encode("<|im_end|>\n").ids[0] == config["eos_token_id"]


def test_experts_dequantize_like_numpy(converted):
    src, dst, _ = converted
    name = "model.language_model.layers.0.mlp.experts.{}.gate_proj.{}"
    weight_map = json.loads((src / INDEX).read_text())["weight_map"]
    theirs = {}
    for shard in sorted(dst.glob("model-*.safetensors")):
        theirs.update(mx.load(str(shard)))
    stacked = theirs["backbone.model.layers.0.mlp.switch_mlp.gate_proj.weight"]
    for expert in range(stacked.shape[0]):
        with safe_open(src / weight_map[name.format(expert, "weight")], "numpy") as f:
            fp8 = f.get_tensor(name.format(expert, "weight")).astype(np.float32)
        with safe_open(src / weight_map[name.format(expert, "weight_scale_inv")], "numpy") as f:
            scale = f.get_tensor(name.format(expert, "weight_scale_inv"))
        ours = fp8 * np.kron(scale, np.ones((128, 128), np.float32))
        got = np.array(stacked[expert].astype(mx.float32))
        np.testing.assert_allclose(got, ours, rtol=2**-8, atol=0)  # theirs is rounded to bf16


def test_prefill_and_decode_steps(converted):
    _, _, model = converted
    n, vocab = model.num_codebooks, model.tower.vocab_size
    band = model.semantic_end - model.semantic_begin + 1
    mx.random.seed(0)
    codes = mx.array(np.random.default_rng(0).integers(0, vocab, (n, 6)), dtype=mx.int32)
    frames, _ = model.build_frames([("Hello there.", codes)], [], "How are you today?")
    assert frames.shape[1] == n + 1

    caches = (model.backbone.make_cache(), model.tower.make_cache())
    hidden = model._prefill(frames, caches, 0, frames.shape[0])
    frame, history = frames[None, -1:], frames[-RAS_WINDOW:, 0]
    candidates = set(range(model.semantic_begin, model.semantic_end + 1)) | {model.eos_id}
    for _ in range(3):
        logits = np.array(model.semantic_head(hidden[:, 0]))
        assert logits.shape == (1, band + 1) and np.isfinite(logits).all()
        frame, hidden, history, main = model._step(hidden, frame, history, caches, 1.0, None, 0.9)
        mx.eval(frame, hidden, history)
        row = np.array(frame)[0, 0]
        assert row.shape == (n + 1,)
        assert int(row[0]) in candidates
        if int(row[0]) != model.eos_id:
            assert row[1] == row[0] - model.semantic_begin
        assert ((row[1:] >= 0) & (row[1:] < vocab)).all()
        assert np.isfinite(np.array(hidden)).all()


def test_missing_expert_scale_is_rejected(synth, limelight_bin, tmp_path):
    ckpt = copy_checkpoint(synth(1), tmp_path / "src")
    name = "model.language_model.layers.0.mlp.experts.1.down_proj.weight_scale_inv"
    drop_tensor(ckpt, name)
    with pytest.raises(ValueError, match="incomplete experts"):
        convert_and_load(ckpt, tmp_path / "dst")
    inspect = subprocess.run(
        [limelight_bin, "inspect", "--model", ckpt], capture_output=True, text=True
    )
    assert inspect.returncode != 0 and name in inspect.stderr, inspect.stderr
