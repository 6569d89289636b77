"""fmt audit on healthy uniform-init weights (torch's nn.Linear default, a real user case)
against its broken twins: ``mx-scale-rule``'s pile-up figure, ``clipping``'s chance share
and ``kv-scales``' implied activation amax (docs/audit_layout_checks.md, docs/audit.md).

The MXFP4 files follow compressed-tensors 0.20.1's ``generate_mx_scales`` (``lf.ct_mx_bytes``:
``floor(log2 amax) - 2``, +1 where amax's significand >= 1.75); half-size scales store the
E8M0 byte one lower and quantize with it (the codes clipped at 6).
"""

from __future__ import annotations

import layout_fixtures as lf
import numpy as np
import pytest
from cli_helpers import invoke, strict_loads

from fmtcli.audit.checks import chance_share

STEM = "model.layers.0.self_attn.q_proj"


def weights(kind: str, seed: int, shape) -> np.ndarray:
    rng = np.random.default_rng(seed)
    scale = 1 / np.sqrt(shape[-1])
    if kind == "uniform":
        return lf.linear_init(seed, shape)
    if kind == "gaussian":
        return (rng.standard_normal(shape) * scale).astype(np.float32)
    return (rng.standard_t(3, shape) * scale).astype(np.float32)


def verdicts(folder, name: str) -> set[str]:
    done = invoke("audit", folder, "--json")
    assert done.exception is None or isinstance(done.exception, SystemExit), done.exception
    doc = strict_loads(done.stdout)
    return {c["verdict"] for t in doc["tensors"] for c in t["checks"] if c["name"] == name}


def mxfp4_folder(folder, w: np.ndarray, shift: int = 0):
    blocks = w.reshape(w.shape[0], -1, 32).astype(np.float64)
    scale = (lf.ct_mx_bytes(blocks, 2).astype(np.int32) + shift).astype(np.uint8)
    scaled = blocks / np.ldexp(1.0, scale.astype(np.int32) - 127)[..., None]
    tensors = {STEM + ".weight_packed": lf.pack(lf.fp4_codes(scaled.reshape(w.shape))),
               STEM + ".weight_scale": scale}
    return lf.write_layout(folder, tensors, lf.ct_config("mxfp4"))


@pytest.mark.parametrize("kind", ["uniform", "gaussian", "t3"])
@pytest.mark.parametrize("columns", [64, 384, 768, 4096])
def test_mx_scale_rule_passes_healthy_and_fails_half_size(tmp_path, kind, columns):
    w = weights(kind, columns, (128, columns))
    assert verdicts(mxfp4_folder(tmp_path / "ok", w), "mx-scale-rule") == {"ok"}
    assert verdicts(mxfp4_folder(tmp_path / "half", w, -1), "mx-scale-rule") == {"fail"}


def test_chance_share_matches_int8_rows_of_uniform_values():
    # compressed-tensors' INT8 per channel: scale amax / 127.5, 512 values a row
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (20000, 512))
    codes = np.clip(np.round(x / (np.abs(x).max(1, keepdims=True) / 127.5)), -128, 127)
    top, below = (np.abs(codes) == 127).sum(1), (np.abs(codes) == 126).sum(1)
    measured = np.mean((top >= 5) & (top > 2 * below))
    assert measured <= chance_share("int8", 512) <= measured + 0.05  # the worst case
    assert chance_share("float8_e4m3fn", 512) < 1e-4  # a pile-up there is never chance


def int8_channel_folder(folder, w: np.ndarray, factor: float = 1.0):
    scale = np.abs(w).max(1, keepdims=True) / 127.5 * factor
    codes = np.clip(np.round(w / scale), -128, 127).astype(np.int8)
    tensors = {STEM + ".weight": codes, STEM + ".weight_scale": scale.astype(np.float32)}
    return lf.write_layout(folder, tensors, lf.ct_config("int8-naive"))


@pytest.mark.parametrize("columns", [256, 512, 1024])
def test_clipping_passes_uniform_int8_rows_and_fails_half_size(tmp_path, columns):
    w = lf.linear_init(columns, (256, columns))
    assert verdicts(int8_channel_folder(tmp_path / "ok", w), "clipping") == {"ok"}
    assert verdicts(int8_channel_folder(tmp_path / "half", w, 0.5), "clipping") == {"fail"}


def test_kv_scales_inverted_with_plausible_magnitudes_warn(tmp_path):
    path = tmp_path / "kv.safetensors"
    assert invoke("kv", "--granularity", "tensor,head", "--out", path).exit_code == 0
    assert verdicts(path, "kv-scales") == {"ok"}
    from oracle import read_safetensors, write_safetensors

    tensors, metadata = read_safetensors(path)
    inverted = {k: (448.0 / (v.astype(np.float64) * 448.0) if k.endswith("_scale") else v)
                for k, v in tensors.items()}  # fmt's direction: 448 / amax
    inverted = {k: np.asarray(v, tensors[k].dtype) for k, v in inverted.items()}
    write_safetensors(tmp_path / "inv.safetensors", inverted, metadata or None)
    assert "warn" in verdicts(tmp_path / "inv.safetensors", "kv-scales")
