#!/usr/bin/env python3
"""Golden codec encodes (voice cloning, `codec.md` §5.3) from sglang-omni 0.1.9's own Fish
modded-DAC module, and golden resamples from torchaudio, the resampler sglang-omni's reference
encode hook (`FishReferenceEncodeHook.encode_reference_waveform`) calls.

The codec is built and loaded exactly as tools/reference/codec.py does (its helpers are imported
from there: same stubs, same strict `load_state_dict` of our tiny `codec.pth`). The encode is the
module's own `DAC.encode` (pad to whole 2048-sample frames, encoder, `quantizer.encode_codes`),
in float32 and in float64 (`model.double()`; RMSNorm and RoPE still round to f32 inside, as in the
decode fixture). Stage outputs come from forward hooks.

Near-ties: `VectorQuantize.decode_latents` is wrapped (same arithmetic, then the margin recorded)
to keep, for every frame and quantizer, the gap between the best and the second-best of the
reference's `-dist` in the float64 run. A code whose gap is within rounding may differ between
two correct implementations; the Rust test excuses only those, and counts them.

Writes `tests/fixtures/codec_encode/encode.safetensors`:
- `audio_pcm16` [N] int16 (the clip is `x / 32768`), 44.1 kHz mono, N not a multiple of 2048 (the
  padding is exercised); 6.5 s, so the encoder's transformer (window 512 rows of 512 samples)
  and `pre_module` (window 128 frames) both see more rows than their windows;
- `f64.codes`, `f32.codes` [10, T] int32; `f64.margin` [10, T] f32 (the gap above);
- `f64.encoder` [4T, latent], `f64.downsample` [T, latent], `f64.pre_module` [T, latent]
  (channels-last, stored rounded to f32); the float32 run's stages are only compared with these
  in versions.json;
- `resample.{rate}.in` [C, n] f32 and `resample.{rate}.out` [m] f32 for 16000 (mono), 24000
  (stereo) and 48000 (mono): the input, then `torchaudio.functional.resample(x.mean(0, keepdim=True),
  rate, 44100)` of its mono mixdown, as the hook computes it (float32).

Usage (from the repository root, after tools/reference/setup.sh):
    cargo build --bin limelight
    .cache/reference/venv/bin/python tools/reference/codec_encode.py \\
        --bin target/debug/limelight --out tests/fixtures/codec_encode
"""

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import codec as decode_fixture  # noqa: E402  (tools/reference/codec.py: stubs and module building)

SEED = decode_fixture.SEED
AUDIO_SEED = 20261204
SAMPLE_RATE = 44100
SECONDS = 6.5
RESAMPLE_RATES = {16000: 1, 24000: 2, 48000: 1}  # source rate -> channels


def test_signal(g, n, rate, channels):
    """Tones with a slow glide, an envelope and a little noise: speech-like energy, deterministic."""
    t = torch.arange(n, dtype=torch.float64) / rate
    out = []
    for c in range(channels):
        f0 = 140.0 + 35.0 * c
        tone = sum(
            (0.35 / k) * torch.sin(2 * math.pi * (f0 * k * t + 6.0 * k * torch.sin(2 * math.pi * 0.7 * t)))
            for k in range(1, 6)
        )
        envelope = 0.55 + 0.45 * torch.sin(2 * math.pi * 2.3 * t + c)
        noise = 0.03 * torch.randn(n, generator=g, dtype=torch.float64)
        out.append((tone * envelope + noise).clamp(-0.99, 0.99))
    return torch.stack(out).float()


def record_margins(vq_cls, margins):
    """Wraps `decode_latents`: the same computation, with the top-2 gap of `-dist` kept per row."""
    import torch.nn.functional as F
    from einops import rearrange

    def decode_latents(self, latents):
        encodings = rearrange(latents, "b d t -> (b t) d")
        codebook = self.codebook.weight
        encodings = F.normalize(encodings)
        codebook = F.normalize(codebook)
        dist = (
            encodings.pow(2).sum(1, keepdim=True)
            - 2 * encodings @ codebook.t()
            + codebook.pow(2).sum(1, keepdim=True).t()
        )
        top = (-dist).topk(2, dim=1).values
        margins.append((top[:, 0] - top[:, 1]).detach().clone())
        indices = rearrange((-dist).max(1)[1], "(b t) -> b t", b=latents.size(0))
        z_q = self.decode_code(indices)
        return z_q, indices

    original = vq_cls.decode_latents
    vq_cls.decode_latents = decode_latents
    return original


def encode_with_stages(model, audio):
    seen = {}
    q = model.quantizer
    hooks = [
        model.encoder.register_forward_hook(lambda m, inp, out: seen.update(encoder=out.detach().clone())),
        q.downsample.register_forward_hook(lambda m, inp, out: seen.update(downsample=out.detach().clone())),
        q.pre_module.register_forward_hook(lambda m, inp, out: seen.update(pre_module=out.detach().clone())),
    ]
    with torch.no_grad():
        codes, _ = model.encode(audio[None].to(next(model.parameters()).dtype))
    for h in hooks:
        h.remove()
    out = {k: v[0].transpose(0, 1).contiguous() for k, v in seen.items()}  # [1, C, T] -> [T, C]
    out["codes"] = codes[0].to(torch.int32).contiguous()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/debug/limelight")
    ap.add_argument("--out", default="tests/fixtures/codec_encode")
    ap.add_argument("--sglang-dac", default=decode_fixture.SGLANG_DAC)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    decode_fixture.install_stubs(args.sglang_dac)
    import torchaudio
    from dac.nn.quantize import VectorQuantize
    from safetensors.torch import save_file

    with tempfile.TemporaryDirectory() as tmp:
        ck = os.path.join(tmp, "tiny")
        subprocess.run(
            [args.bin, "checkpoint", "synth", "--preset", "tiny", "--seed", str(SEED), "--out", ck],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        sd = torch.load(os.path.join(ck, "codec.pth"), weights_only=True)
    d = decode_fixture.infer_dims(sd)

    g = torch.Generator().manual_seed(AUDIO_SEED)
    n = int(SECONDS * SAMPLE_RATE)
    assert n % 2048 != 0
    # 16-bit samples, as a clip file holds them: half the bytes of f32 in the fixture.
    pcm16 = (test_signal(g, n, SAMPLE_RATE, 1)[0] * 32768.0).round().clamp(-32768, 32767).to(torch.int16)
    audio = pcm16.float() / 32768.0
    tensors = {"audio_pcm16": pcm16.contiguous()}

    f32 = encode_with_stages(decode_fixture.load_codec(d, sd), audio)
    margins = []
    original = record_margins(VectorQuantize, margins)
    f64 = encode_with_stages(decode_fixture.load_codec(d, sd).double(), audio.double())
    VectorQuantize.decode_latents = original
    assert len(margins) == 1 + d["residual_books"], len(margins)

    report = {}
    for name in ["encoder", "downsample", "pre_module"]:
        tensors[f"f64.{name}"] = f64[name].float()
        report[name] = float((f32[name].double() - f64[name]).norm() / f64[name].norm())
    for run, out in [("f32", f32), ("f64", f64)]:
        tensors[f"{run}.codes"] = out["codes"]
    tensors["f64.margin"] = torch.stack(margins).float().contiguous()
    frames = f64["codes"].shape[1]
    assert frames == math.ceil(n / 2048), frames
    report["codes_f32_vs_f64_differ"] = int((f32["codes"] != f64["codes"]).sum())
    report["frames"] = frames
    report["smallest_margin"] = float(tensors["f64.margin"].min())

    for rate, channels in RESAMPLE_RATES.items():
        clip = test_signal(g, int(0.37 * rate) + 11, rate, channels)
        mono = clip.mean(0, keepdim=True)
        tensors[f"resample.{rate}.in"] = clip.contiguous()
        tensors[f"resample.{rate}.out"] = torchaudio.functional.resample(mono, rate, SAMPLE_RATE)[0].contiguous()

    os.makedirs(args.out, exist_ok=True)
    save_file(tensors, os.path.join(args.out, "encode.safetensors"))
    versions = {
        "encode.safetensors": {
            "command": "cargo build --bin limelight && .cache/reference/venv/bin/python tools/reference/codec_encode.py "
            "--bin target/debug/limelight --out tests/fixtures/codec_encode",
            "reference": "sglang-omni 0.1.9 fish_speech/models/dac/{modded_dac,rvq}.py (wheel), DAC.encode, stage "
            "outputs by forward hooks; torchaudio.functional.resample (sinc_interp_hann, width 6, rolloff 0.99)",
            "checkpoint": f"limelight checkpoint synth --preset tiny --seed {SEED}",
            "audio_seed": AUDIO_SEED,
            "torch": torch.__version__,
            "torchaudio": torchaudio.__version__,
            "descript-audio-codec": "1.0.0",
            "python": sys.version.split()[0],
            "threads": 1,
            "f32_vs_f64": report,
        }
    }
    with open(os.path.join(args.out, "versions.json"), "w") as f:
        json.dump(versions, f, indent=2, sort_keys=True)
        f.write("\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
