"""The Python `safetensors` package (numpy, no torch) reads our checkpoint exactly as we describe it.

Proves that: every shard named by model.safetensors.index.json opens, and no other shard exists;
the tensor names, dtypes and shapes safetensors reports equal both the index and the raw header we
wrote; metadata.total_size is the sum of the tensor bytes; every BF16/F32 tensor loads and is finite;
every FP8 expert weight reads as float8_e4m3fn (the same bytes as the raw file), has a
[rows/128, cols/128] scale grid, and dequantizes (value * block scale) to finite, non-trivial weights.
"""

import json

import ml_dtypes
import numpy as np
import pytest
from conftest import INDEX, read_header
from safetensors import safe_open

# safetensors resolves "bfloat16" through np.dtype (registered by ml_dtypes) but F8_E4M3 through
# getattr(numpy, "float8_e4m3fn"), which numpy itself lacks.
if not hasattr(np, "float8_e4m3fn"):
    np.float8_e4m3fn = ml_dtypes.float8_e4m3fn

ITEMSIZE = {"F8_E4M3": 1, "BF16": 2, "F16": 2, "F32": 4}
BLOCK = 128


@pytest.fixture(scope="module")
def ckpt(synth):
    return synth(1)


@pytest.fixture(scope="module")
def shards(ckpt):
    """{shard file: (raw header without __metadata__, data start)} for every indexed shard."""
    weight_map = json.loads((ckpt / INDEX).read_text())["weight_map"]
    out = {}
    for name in sorted(set(weight_map.values())):
        header, start = read_header(ckpt / name)
        header.pop("__metadata__", None)
        out[name] = (header, start)
    return out


def test_index_header_and_reader_agree(ckpt, shards):
    index = json.loads((ckpt / INDEX).read_text())
    assert sorted(p.name for p in ckpt.glob("*.safetensors")) == sorted(shards)
    seen, total = {}, 0
    for shard, (header, _) in shards.items():
        with safe_open(ckpt / shard, framework="numpy") as f:
            assert f.metadata() == {"format": "pt"}
            assert set(f.keys()) == set(header)
            for name in f.keys():
                entry, view = header[name], f.get_slice(name)
                assert (view.get_dtype(), view.get_shape()) == (entry["dtype"], entry["shape"]), name
                begin, end = entry["data_offsets"]
                assert end - begin == ITEMSIZE[entry["dtype"]] * int(np.prod(entry["shape"])), name
                assert name not in seen, f"{name} in two shards"
                seen[name] = shard
                total += end - begin
    assert seen == index["weight_map"]
    assert index["metadata"]["total_size"] == total


def test_dense_tensors_load_and_are_finite(ckpt, shards):
    for shard, (header, _) in shards.items():
        with safe_open(ckpt / shard, framework="numpy") as f:
            for name, entry in header.items():
                if entry["dtype"] == "F8_E4M3":
                    continue
                value = f.get_tensor(name)
                assert list(value.shape) == entry["shape"], name
                assert np.isfinite(value.astype(np.float32)).all(), name


def test_fp8_experts_dequantize_to_sane_weights(ckpt, shards):
    checked = 0
    for shard, (header, start) in shards.items():
        raw = (ckpt / shard).read_bytes()
        with safe_open(ckpt / shard, framework="numpy") as f:
            for name, entry in header.items():
                if entry["dtype"] != "F8_E4M3":
                    continue
                assert ".mlp.experts." in name and name.endswith("_proj.weight"), name
                fp8 = f.get_tensor(name)
                begin, end = entry["data_offsets"]
                direct = np.frombuffer(raw[start + begin : start + end], ml_dtypes.float8_e4m3fn)
                assert fp8.dtype == ml_dtypes.float8_e4m3fn
                assert np.array_equal(fp8.view(np.uint8).ravel(), direct.view(np.uint8)), name

                rows, cols = fp8.shape
                assert rows % BLOCK == 0 and cols % BLOCK == 0, f"{name}: {fp8.shape}"
                scale = f.get_tensor(name + "_scale_inv").astype(np.float32)
                assert scale.shape == (rows // BLOCK, cols // BLOCK), name
                assert np.isfinite(scale).all() and (scale > 0).all(), name

                values = fp8.astype(np.float32)
                assert np.isfinite(values).all(), f"{name}: NaN bytes (0x7f/0xff)"
                blocks = np.abs(values).reshape(rows // BLOCK, BLOCK, cols // BLOCK, BLOCK)
                # Block scales follow amax/448: each block should use most of the e4m3 range.
                assert (blocks.max(axis=(1, 3)) >= 224).all(), name
                dense = values * np.kron(scale, np.ones((BLOCK, BLOCK), np.float32))
                assert np.isfinite(dense).all(), name
                assert 1e-3 < dense.std() < 1.0, f"{name}: std {dense.std()}"
                assert np.count_nonzero(dense) > 0.5 * dense.size, name
                checked += 1
    assert checked > 0
