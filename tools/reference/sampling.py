#!/usr/bin/env python3
"""Golden sampler decisions (model.md §8.1-8.3) for fixed logits and fixed Philox uniforms.

RESTATEMENT, written from sglang-omni 0.1.9 `sglang_omni/models/fishaudio_drama3/sampling.py`
(`sample_top_k_top_p`, `sample_semantic_with_ras`) and `sampling_selection.py` (`exponential_noise`). S1's PyTorch
path draws its Exp(1) noise from torch's global generator (`torch.empty_like(p).exponential_(1)`), which nothing else
can reproduce, so this file restates the two functions line by line in PyTorch with two changes, both taken from S1's
own Triton kernels:
  1. the noise of candidate i (its index in the logits row) is E_i = -ln(u_i), with u_i = ((bits >> 9) + 0.5) * 2^-23
     and bits = philox4x32_10(counter=[i, 0, stream, frame_lo], key=[seed_lo, seed_hi ^ frame_hi])[0]: S1's
     `exponential_noise(seed, step, row, stream, i)` with batch row 0 and step = frame (src/engine/rng.rs);
  2. equal scores rank the lower index first (a stable descending sort), as S1's kernel sort keys do; S1's PyTorch
     path uses an unstable sort.
Philox is re-implemented here in numpy from the Random123 definition (not shared with the Rust code) and checked
against Random123's published known-answer vectors before anything is written.

Each case is run twice: float32 exactly as S1 (softmax, cumsum and race in f32), and with f32 scores but float64
probabilities (what src/engine/sampling.rs does). The script refuses to write a golden unless both agree on every
pick, so no case sits within rounding of a top-p boundary or of a race tie.

Writes tests/fixtures/sampling/golden.json and versions.json.
Usage (after tools/reference/setup.sh; tools/reference/regenerate.sh runs every generator but not --check-s1-triton):
    .cache/reference/venv/bin/python tools/reference/sampling.py --out tests/fixtures/sampling

--check-s1-triton (needs a CUDA GPU with triton; S1 validated its kernels on sm_90 only) runs S1's REAL Triton
sampling kernels, unmodified from the wheel (`sampling_kernels.py` + `sampling_selection.py`, imported behind stub
parent packages), on every golden case, one request per launch (batch row 0) with `sampler.step` = frame and
`sampler.seed` = the case seed, and writes s1_triton_check.json (per case: frames whose pick equals the golden's).
How it was run on the H200 (the S1 files travel in an ignored folder):
  mkdir -p target/s1_sampling/sglang_omni/models/fishaudio_drama3
  cp .cache/reference/sglang/sglang_omni/models/fishaudio_drama3/sampling*.py target/s1_sampling/sglang_omni/models/fishaudio_drama3/
  device: python3 tools/reference/sampling.py --check-s1-triton --sglang-omni target/s1_sampling --out $OUT
  (carry target/s1_sampling), then copy $OUT/s1_triton_check.json to tests/fixtures/sampling/.
"""

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np
import torch

torch.set_num_threads(1)

# --- Philox4x32-10 (Salmon et al. 2011; Random123) ---------------------------------------------------------------
MASK = 0xFFFFFFFF
M0, M1, W0, W1 = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85
# Random123 tests/kat_vectors, philox4x32 10: counter, key -> output.
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((MASK,) * 4, (MASK,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


def philox(c0, c1, c2, c3, k0, k1):
    """Vectorised over numpy uint64 arrays holding 32-bit words."""
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint64) & MASK for c in (c0, c1, c2, c3))
    k0, k1 = np.uint64(k0), np.uint64(k1)
    for r in range(10):
        if r:
            k0, k1 = (k0 + np.uint64(W0)) & np.uint64(MASK), (k1 + np.uint64(W1)) & np.uint64(MASK)
        p0 = np.uint64(M0) * c0
        p1 = np.uint64(M1) * c2
        c0, c1, c2, c3 = (p1 >> np.uint64(32)) ^ c1 ^ k0, p1 & np.uint64(MASK), (p0 >> np.uint64(32)) ^ c3 ^ k1, \
            p0 & np.uint64(MASK)
    return c0, c1, c2, c3


def check_kat():
    for ctr, key, want in KAT:
        got = tuple(int(w) for w in philox(*ctr, *key))
        assert got == want, f"Philox KAT failed: {ctr} {key}: {got} != {want}"


def bits(seed, frame, stream, candidates):
    key0, key1 = seed & MASK, (seed >> 32) ^ (frame >> 32)
    n = np.asarray(candidates, dtype=np.uint64)
    return philox(n, np.zeros_like(n), np.full_like(n, stream), np.full_like(n, frame & MASK), key0, key1)[0]


def uniforms(seed, frame, stream, n):
    """u_i for candidates 0..n-1, float32 (exact: 24 significant bits)."""
    b = bits(seed, frame, stream, np.arange(n))
    return torch.from_numpy(((b >> np.uint64(9)).astype(np.float32) + np.float32(0.5)) * np.float32(2.0 ** -23))


# --- the restatement of S1 sampling.py ------------------------------------------------------------------------
MINIMUM_TEMPERATURE = 1e-5
RAS_WINDOW_FRAMES, RAS_TEMPERATURE, RAS_TOP_K, RAS_TOP_P = 16, 1.0, 30, 0.95
CODEBOOK_TOP_K = 30
MAIN, RAS, FIRST_HEAD = 0, 1, 2


def sample_top_k_top_p(logits, temperature, top_k, top_p, noise_u, keep_crossing, dtype):
    """S1 `sample_top_k_top_p` (PyTorch path) for one row; noise_u[i] is candidate i's uniform."""
    scaled_logits = logits.float() / torch.tensor(temperature, dtype=torch.float32).clamp(min=MINIMUM_TEMPERATURE)
    scaled_logits = scaled_logits.to(dtype)
    sorted_logits, sorted_token_ids = torch.sort(scaled_logits, dim=-1, descending=True, stable=True)
    cumulative_probabilities = torch.cumsum(torch.softmax(sorted_logits, dim=-1), dim=-1)
    ranks = torch.arange(sorted_logits.shape[-1])
    is_dropped = cumulative_probabilities > torch.tensor(top_p, dtype=torch.float32).to(dtype)
    if keep_crossing:
        is_dropped[1:] = is_dropped[:-1].clone()
    is_dropped |= ranks >= top_k
    is_dropped[0] = False
    probabilities = torch.softmax(sorted_logits.masked_fill(is_dropped, float("-inf")), dim=-1)
    exponential_noise = -torch.log(noise_u.to(dtype))[sorted_token_ids]
    sorted_choice = torch.argmax(probabilities / exponential_noise)
    return int(sorted_token_ids[sorted_choice]), int((~is_dropped).sum())


def sample_semantic_with_ras(logits, candidate_ids, window, temperature, top_k, top_p, semantic_begin, codebook_size,
                             seed, frame, dtype):
    """S1 `sample_semantic_with_ras` for one row: both draws always run."""
    n = logits.shape[0]
    first_index, first_kept = sample_top_k_top_p(logits, temperature, top_k, top_p, uniforms(seed, frame, MAIN, n),
                                                 True, dtype)
    ras_index, ras_kept = sample_top_k_top_p(logits, RAS_TEMPERATURE, RAS_TOP_K, RAS_TOP_P,
                                             uniforms(seed, frame, RAS, n), True, dtype)
    first, ras = candidate_ids[first_index], candidate_ids[ras_index]
    is_repeat = first in window
    is_semantic = semantic_begin <= first < semantic_begin + codebook_size
    main = ras if (is_repeat and is_semantic) else first
    return {"first": first, "ras": ras, "token": main, "ras_used": bool(is_repeat and is_semantic),
            "first_in_window": is_repeat, "first_kept": first_kept, "ras_kept": ras_kept}


# --- cases ------------------------------------------------------------------------------------------------------
# Tiny-checkpoint ids (tests/fixtures/prompt): EOS 958 sorts before the band 984..1239, so restricted row 0 is EOS.
TINY = {"semantic_start": 984, "codes": 256, "eos": 958}
# A real-sized band (4096 codes) with EOS after it, to cover 4097 candidates and EOS as the last row.
WIDE = {"semantic_start": 2000, "codes": 4096, "eos": 7000}
SEED_A = 0x0123456789ABCDEF
SEED_B = 42


def grid(x):
    """Logits on a 1/64 grid: exact in f32 and short in JSON."""
    return (np.round(np.asarray(x, dtype=np.float64) * 64) / 64).astype(np.float32)


def candidate_ids(band):
    return sorted(set(range(band["semantic_start"], band["semantic_start"] + band["codes"])) | {band["eos"]})


def head_cases(rng):
    v = 256
    tied = np.full(v, -1000.0)
    tied[[5, 2, 7, 1]] = 3.0  # four equal maxima, p = 1/4 each (exact): ties rank by index 1, 2, 5, 7
    eighths = np.full(v, -1000.0)
    eighths[10:18] = 0.5  # eight equal maxima, p = 1/8 each: top_p 0.375 is exactly their 3rd cumulative sum
    two_max = grid(rng.normal(0, 1, v))
    two_max[[40, 9]] = 9.0
    return [
        # name, logits, temperature, top_k, top_p, seed, frames
        ("head_default", grid(rng.normal(0, 2, v)), 1.0, CODEBOOK_TOP_K, 0.9, SEED_A, range(0, 48)),
        ("head_hot_wide", grid(rng.normal(0, 1, v)), 1.3, CODEBOOK_TOP_K, 1.0, SEED_B, range(100, 148)),
        ("head_top_k_1", grid(rng.normal(0, 2, v)), 1.0, 1, 0.9, SEED_A, range(0, 16)),
        ("head_top_k_5_top_p_1", grid(rng.normal(0, 0.5, v)), 0.8, 5, 1.0, SEED_B, range(0, 32)),
        ("head_temperature_0", grid(rng.normal(0, 2, v)), 0.0, CODEBOOK_TOP_K, 0.9, SEED_A, range(0, 16)),
        ("head_temperature_0_tie_keeps_lower_index", two_max, 0.0, CODEBOOK_TOP_K, 0.9, SEED_A, range(0, 16)),
        ("head_ties_top_p_exact_half", grid(tied), 1.0, CODEBOOK_TOP_K, 0.5, SEED_B, range(0, 32)),
        ("head_top_p_exact_crossing", grid(eighths), 1.0, CODEBOOK_TOP_K, 0.375, SEED_A, range(0, 32)),
        ("head_frames_past_2_32", grid(rng.normal(0, 2, v)), 1.0, CODEBOOK_TOP_K, 0.9, SEED_A,
         range((1 << 32) - 4, (1 << 32) + 12)),
    ]


def main_cases(rng):
    def peaked(band, hot, eos_logit):
        ids = candidate_ids(band)
        x = rng.normal(-2, 1.5, len(ids))
        for token, value in hot.items():
            x[ids.index(token)] = value
        x[ids.index(band["eos"])] = eos_logit
        return grid(x)

    s = TINY["semantic_start"]
    hot = {s + 3: 4.0, s + 17: 3.75, s + 100: 3.5, s + 200: 3.0, s + 255: 2.5}
    tied = np.full(len(candidate_ids(TINY)), -1000.0)
    tied_tokens = [s + 9, s + 4, s + 30, s + 2]
    for t in tied_tokens:
        tied[candidate_ids(TINY).index(t)] = 1.0
    prompt_tail = [198, 957, 77, 198]  # text tokens: never semantic, so they never trigger RAS
    return [
        # name, band, logits, temperature, top_k, top_p, seed, first frame, frames, initial window
        ("main_default_ras_chain", TINY, peaked(TINY, hot, -1.0), 1.0, None, 0.9, SEED_A, 0, 40, prompt_tail),
        ("main_window_from_reference_rows", TINY, peaked(TINY, hot, -1.0), 1.0, None, 0.9, SEED_B, 0, 24,
         prompt_tail + [s + 3, s + 17, s + 100]),
        ("main_eos_in_window_is_not_ras", TINY, peaked(TINY, hot, 4.5), 1.0, None, 0.9, SEED_B, 7, 16,
         [TINY["eos"]] * 16),
        ("main_cold_first_draw", TINY, peaked(TINY, hot, 0.0), 0.3, None, 0.9, SEED_A, 1000, 32, prompt_tail),
        ("main_greedy_first_draw", TINY, peaked(TINY, hot, 0.0), 0.0, None, 0.9, SEED_A, 0, 24, prompt_tail),
        ("main_top_k_3", TINY, peaked(TINY, hot, 1.0), 1.0, 3, 0.9, SEED_B, 0, 32, prompt_tail),
        ("main_ties_crossing_kept", TINY, grid(tied), 1.0, None, 0.5, SEED_A, 0, 32, prompt_tail),
        ("main_flat_top_p_1", TINY, grid(rng.normal(0, 0.5, len(candidate_ids(TINY)))), 1.0, None, 1.0, SEED_B, 0,
         32, prompt_tail),
        ("main_wide_4097", WIDE, grid(rng.normal(0, 2, len(candidate_ids(WIDE)))), 1.0, None, 0.9, SEED_A, 5, 24,
         prompt_tail),
    ]


def run(dtype):
    rng = np.random.default_rng(20240607)
    heads, mains = [], []
    for name, logits, t, k, p, seed, frames in head_cases(rng):
        x = torch.from_numpy(logits)
        picks, kept = [], []
        for f in frames:
            r = f % 9  # cycle through the nine heads' streams
            code, n = sample_top_k_top_p(x, t, k, p, uniforms(seed, f, FIRST_HEAD + r, len(logits)), False, dtype)
            picks.append({"frame": f, "head": r, "code": code, "kept": n})
        heads.append({"name": name, "temperature": t, "top_k": k, "top_p": p, "seed": seed,
                      "logits": [float(v) for v in logits], "picks": picks})
    for name, band, logits, t, k, p, seed, first_frame, frames, window in main_cases(rng):
        ids = candidate_ids(band)
        x = torch.from_numpy(logits)
        window = ([-1] * RAS_WINDOW_FRAMES + list(window))[-RAS_WINDOW_FRAMES:]
        initial = list(window)
        picks = []
        for f in range(first_frame, first_frame + frames):
            pick = sample_semantic_with_ras(x, ids, window, t, k if k is not None else 2**31 - 1, p,
                                            band["semantic_start"], band["codes"], seed, f, dtype)
            pick["frame"] = f
            picks.append(pick)
            window = window[1:] + [pick["token"]]
        mains.append({"name": name, **band, "temperature": t, "top_k": k, "top_p": p, "seed": seed,
                      "initial_window": [w for w in initial if w >= 0], "logits": [float(v) for v in logits],
                      "picks": picks})
    return heads, mains


def key_samples():
    """Philox bits and uniforms under the draw-key layout, for the Rust DrawKey to match."""
    out = []
    for seed, frame, stream, candidate in [(0, 0, 0, 0), (SEED_A, 0, 0, 0), (SEED_A, 1, 1, 4096), (SEED_A, 7, 10, 255),
                                           (SEED_B, (1 << 32) + 3, 2, 17), ((1 << 64) - 1, (1 << 64) - 1, 5, MASK)]:
        b = int(bits(seed, frame, stream, [candidate])[0])
        u = float(uniforms(seed, frame, stream, candidate + 1)[candidate]) if candidate < 5000 else \
            float((np.float32(b >> 9) + np.float32(0.5)) * np.float32(2.0 ** -23))
        out.append({"seed": seed, "frame": frame, "stream": stream, "candidate": candidate, "bits": b, "uniform": u})
    return out


def check_s1_triton(sglang_root, golden_path, out_dir):
    """S1's own Triton kernels on the golden's cases; returns per-case agreement counts."""
    import importlib
    import types

    import triton

    for name, path in (("sglang_omni", "sglang_omni"), ("sglang_omni.models", "sglang_omni/models"),
                       ("sglang_omni.models.fishaudio_drama3", "sglang_omni/models/fishaudio_drama3")):
        package = types.ModuleType(name)
        package.__path__ = [os.path.join(sglang_root, path)]  # the real files, without the packages' __init__
        sys.modules[name] = package

    class Cuda:
        def is_cuda(self):
            return True

    sys.modules["sglang_omni.platforms"] = types.SimpleNamespace(current_platform=Cuda())
    kernels = importlib.import_module("sglang_omni.models.fishaudio_drama3.sampling_kernels")
    assert kernels.HAS_TRITON, "S1's kernels did not load their Triton path"
    dev = "cuda"
    g = json.load(open(golden_path))

    def sampler(seed, frame):
        return kernels.CodebookSampler(step=torch.tensor(frame, dtype=torch.int64, device=dev), seed=seed)

    def scalar(v, dtype):
        return torch.tensor([v], dtype=dtype, device=dev)

    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "heads": {}, "mains": {}}
    for case in g["heads"]:
        x = torch.tensor(case["logits"], dtype=torch.float32, device=dev)[None]
        same = 0
        for p in case["picks"]:
            code = kernels.sample_codebook_head(
                x, scalar(case["temperature"], torch.float32), scalar(case["top_k"], torch.int64),
                scalar(case["top_p"], torch.float32), sampler(case["seed"], p["frame"]),
                kernels.FIRST_CODEBOOK_HEAD_STREAM + p["head"], MINIMUM_TEMPERATURE)
            same += int(code[0]) == p["code"]
        result["heads"][case["name"]] = {"frames": len(case["picks"]), "same_code": same}
    for case in g["mains"]:
        ids = torch.tensor(candidate_ids(case), dtype=torch.int64, device=dev)
        x = torch.tensor(case["logits"], dtype=torch.float32, device=dev)[None]
        top_k = case["top_k"] if case["top_k"] is not None else 2**31 - 1
        window = ([-1] * RAS_WINDOW_FRAMES + case["initial_window"])[-RAS_WINDOW_FRAMES:]
        same = {"frames": len(case["picks"]), "same_token": 0, "same_first": 0, "same_ras": 0, "ras_checkable": 0}

        def draw(win, frame):
            main, _ = kernels.sample_semantic_candidates(
                x, ids, torch.tensor([win], dtype=torch.int64, device=dev), scalar(case["temperature"], torch.float32),
                scalar(top_k, torch.int64), scalar(case["top_p"], torch.float32), case["semantic_start"],
                case["codes"], sampler(case["seed"], frame), minimum_temperature=MINIMUM_TEMPERATURE,
                ras_temperature=RAS_TEMPERATURE, ras_top_k=RAS_TOP_K, ras_top_p=RAS_TOP_P)
            return int(main[0])

        for p in case["picks"]:
            f = p["frame"]
            same["same_token"] += draw(window, f) == p["token"]
            # The kernel returns only the chosen token: an empty window exposes the first draw, and a window full
            # of a semantic first draw exposes the RAS draw.
            first = draw([-1] * RAS_WINDOW_FRAMES, f)
            same["same_first"] += first == p["first"]
            if case["semantic_start"] <= first < case["semantic_start"] + case["codes"]:
                same["ras_checkable"] += 1
                same["same_ras"] += draw([first] * RAS_WINDOW_FRAMES, f) == p["ras"]
            window = window[1:] + [p["token"]]
        result["mains"][case["name"]] = same
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "s1_triton_check.json"), "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    print(json.dumps(result, indent=1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="tests/fixtures/sampling", help="fixture directory")
    ap.add_argument("--check-s1-triton", action="store_true", help="run S1's Triton kernels on the golden (GPU)")
    ap.add_argument("--sglang-omni", default=str(Path(__file__).resolve().parents[2] / ".cache/reference/sglang"),
                    help="root holding sglang_omni/models/... (default: from tools/reference/setup.sh)")
    ap.add_argument("--golden", default="tests/fixtures/sampling/golden.json", help="golden to check (GPU mode)")
    args = ap.parse_args()
    check_kat()
    if args.check_s1_triton:
        return check_s1_triton(args.sglang_omni, args.golden, args.out)
    heads32, mains32 = run(torch.float32)
    heads64, mains64 = run(torch.float64)
    for a, b in zip(heads32 + mains32, heads64 + mains64):
        assert a == b, f"case {a['name']}: float32 and float64 picks differ; move it off the rounding edge"
    ras_fired = sum(p["ras_used"] for m in mains32 for p in m["picks"])
    ras_declined = sum(p["first_in_window"] and not p["ras_used"] for m in mains32 for p in m["picks"])
    assert ras_fired > 0, "no case fires RAS"
    golden = {"philox_kat": [{"counter": list(c), "key": list(k), "out": list(o)} for c, k, o in KAT],
              "draw_keys": key_samples(), "heads": heads32, "mains": mains32}
    os.makedirs(args.out, exist_ok=True)
    lines = ["{"]
    items = list(golden.items())
    for i, (k, v) in enumerate(items):
        lines.append(f' "{k}": [')
        lines.append(",\n".join("  " + json.dumps(case) for case in v))
        lines.append(" ]" + ("," if i + 1 < len(items) else ""))
    lines.append("}")
    Path(args.out, "golden.json").write_text("\n".join(lines) + "\n")
    versions = {
        "generator": "tools/reference/sampling.py (a PyTorch RESTATEMENT of sglang-omni 0.1.9 sampling.py)",
        "command": ".cache/reference/venv/bin/python tools/reference/sampling.py --out tests/fixtures/sampling",
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "numpy": np.__version__,
        "threads": 1,
        "head_cases": len(heads32),
        "main_cases": len(mains32),
        "main_frames_where_ras_replaced_the_first_draw": ras_fired,
        "main_frames_where_a_non_semantic_repeat_kept_the_first_draw": ras_declined,
        "float32_vs_float64_picks": "identical",
        "s1_triton_check": "s1_triton_check.json: S1's own Triton kernels on an H200 (--check-s1-triton); "
                           "rerun it whenever the cases change",
    }
    with open(os.path.join(args.out, "versions.json"), "w") as f:
        json.dump(versions, f, indent=2)
        f.write("\n")
    print(f"wrote {args.out}: {len(heads32)} head cases, {len(mains32)} main cases, RAS fired {ras_fired} times")


if __name__ == "__main__":
    main()
