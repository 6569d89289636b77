"""``fmt attention`` as one library call: the inputs (random, or Q, K, V from files), the
accuracy of standard and blockwise attention in a format (``accuracy``), the IO model
(``io_model``) and, on a CUDA GPU, torch's kernels timed (``timing``), gathered in one
frozen ``AttentionResult``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from fmtcli.attention.accuracy import (
    AccuracyRow,
    attention_accuracy,
    check_format,
    random_qkv,
    reference_attention,
)
from fmtcli.attention.budget import BASE_BYTES, BYTES, ELEMENT_BYTES, check_budget
from fmtcli.attention.io_model import IoModel, io_model
from fmtcli.attention.ranges import check_float32_range, check_scores
from fmtcli.attention.timing import TimingRow
from fmtcli.base.choices import Granularity
from fmtcli.base.errors import DataError, Param, UsageError, shown
from fmtcli.numerics.formats import FormatSpec

QKV_NAMES = ({"q", "query"}, {"k", "key"}, {"v", "value"})


@dataclass(frozen=True)
class AttentionSettings:
    """What was computed: the shape (``seq_k`` keys for ``seq`` queries), the format and
    its emulation (``scale_granularity``, ``hadamard``), the inputs (``inputs``: the files'
    tensor names, or empty for random ones drawn with ``seed`` and ``outliers``), and the
    GPU when torch's kernels were timed."""

    batch: int
    heads: int
    seq: int
    seq_k: int
    dim: int
    causal: bool
    format: str
    scale_granularity: str
    hadamard: bool
    outliers: float
    seed: int
    inputs: tuple[str, ...] = ()
    device: str = "cpu"
    gpu: str | None = None

    def to_dict(self) -> dict:
        return {"batch": self.batch, "heads": self.heads, "seq": self.seq,
                "seq_k": self.seq_k, "dim": self.dim, "causal": self.causal,
                "format": self.format, "scale_granularity": self.scale_granularity,
                "hadamard": self.hadamard, "outliers": self.outliers, "seed": self.seed,
                "inputs": list(self.inputs), "device": self.device, "gpu": self.gpu}


@dataclass(frozen=True)
class AttentionResult:
    """``fmt attention``'s result.  JSON: ``settings``, ``accuracy`` (one object per method:
    ``method``, ``format``, ``rmse``, ``max_abs_error``, ``max_rel_error``; absent with the IO
    model alone), ``io`` (``IoModel.to_dict``), ``timing`` (one object per SDPA backend, only
    when measured)."""

    settings: AttentionSettings
    io: IoModel
    accuracy: tuple[AccuracyRow, ...] = ()
    timing: tuple[TimingRow, ...] | None = None
    io_only: bool = field(default=False)

    def to_dict(self) -> dict:
        out: dict = {"settings": self.settings.to_dict()}
        if not self.io_only:
            out["accuracy"] = [row.to_dict() for row in self.accuracy]
        out["io"] = self.io.to_dict()
        if self.timing is not None:
            out["timing"] = [row.to_dict() for row in self.timing]
        return out


def as_4d(x: np.ndarray, name: str) -> np.ndarray:
    """A tensor of shape (seq, dim), (heads, seq, dim) or (batch, heads, seq, dim) as 4-D."""
    if x.ndim < 2 or x.ndim > 4:
        raise DataError(f"{name} has shape {'x'.join(map(str, x.shape)) or 'scalar'}: "
                        "attention takes (seq, dim), (heads, seq, dim) or "
                        "(batch, heads, seq, dim)")
    return x.reshape((1,) * (4 - x.ndim) + x.shape)


def load_qkv(paths: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[str, ...]]:
    """Q, K, V as float64 (batch, heads, seq, dim) arrays from three files (in that order) or
    one file of three tensors (named q/k/v or query/key/value, else in the file's order);
    their names.  K and V must have the same shape, Q the same batch, heads and dim."""
    from fmtcli.inputs.pick import pick

    sources = pick(paths, purpose="to attend over", taker="fmt attention", count=3,
                   roles=QKV_NAMES, how=" tensors Q, K, V: three files, or one file holding "
                   "three, or named q, k, v (query, key, value)")
    elements = sum(s.size for s in sources)
    if BASE_BYTES + elements * ELEMENT_BYTES > BYTES:  # before reading them as float64
        raise UsageError(f"Q, K, V hold {elements:,} elements: the CPU emulation would hold "
                         f"about {(BASE_BYTES + elements * ELEMENT_BYTES) / 2**30:.1f} GiB "
                         f"for them alone, more than its limit of {BYTES / 2**30:.0f} GiB")
    arrays = []
    for label, source in zip("QKV", sources):
        x = np.asarray(source.array(), dtype=np.float64)
        if not np.all(np.isfinite(x)):
            raise DataError(f"{label} ({shown(source.name)}) holds NaN or inf")
        arrays.append(as_4d(x, f"{label} ({shown(source.name)})"))
    q, k, v = arrays
    if k.shape != v.shape:
        raise DataError(f"K and V differ in shape ({'x'.join(map(str, k.shape))} vs "
                        f"{'x'.join(map(str, v.shape))})")
    if q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise DataError(f"Q ({'x'.join(map(str, q.shape))}) and K "
                        f"({'x'.join(map(str, k.shape))}) differ in batch, heads or dim")
    return q, k, v, tuple(s.name for s in sources)


def analyse_attention(spec: FormatSpec, *, batch: int = 1, heads: int = 8, seq: int = 1024,
                      dim: int = 64, qkv: tuple | None = None, inputs: tuple[str, ...] = (),
                      causal: bool = False, block_q: int | None = None,
                      block_k: int | None = None,
                      granularity: Granularity = Granularity.BLOCK, hadamard: bool = False,
                      outliers: float = 0.0, seed: int = 0, sram_bytes: int | None = None,
                      io: bool = False, time: bool = False,
                      progress: Callable[[int, int], None] | None = None) -> AttentionResult:
    """Everything ``fmt attention`` reports.  Inputs: ``qkv`` (three float (batch, heads,
    seq, dim) arrays) or random ones of the given shape (``random_qkv``).  ``io``: the IO
    model alone, no tensors made.  ``time``: torch's SDPA backends timed on the CUDA GPU
    (``timing.time_sdpa``).  Blocks default to the IO model's B_r, B_c (Algorithm 1 of Dao
    et al. 2022 for ``sram_bytes`` and ``spec``'s element size)."""
    if qkv is not None:
        q, k, v = qkv
        batch, heads, seq, dim = q.shape
        seq_k = k.shape[2]
    else:
        seq_k = seq
    check_format(spec)
    if not 0.0 <= outliers <= 1.0:  # NaN too
        raise UsageError(Param("outliers", outliers, repr)
                         + " is a fraction of the entries: 0 <= p <= 1")
    if causal and seq_k != seq:
        raise UsageError(f"causal attention needs as many keys as queries ({seq_k} vs {seq})")
    model = io_model(batch, heads, seq, dim, spec.bits, sram_bytes, seq_k, block_q, block_k)
    block_q, block_k = model.block_q, model.block_k
    if hadamard and (dim & (dim - 1)):
        raise UsageError(Param("hadamard", True) + " needs a power-of-two dim, got "
                         + Param("dim", dim))
    settings = dict(batch=batch, heads=heads, seq=seq, seq_k=seq_k, dim=dim, causal=causal,
                    format=spec.name, scale_granularity=granularity.value, hadamard=hadamard,
                    outliers=outliers, seed=seed, inputs=tuple(inputs))
    if io:
        return AttentionResult(AttentionSettings(**settings), model, io_only=True)
    check_budget(batch, heads, seq, seq_k, dim, spec, block_k,
                 tensor_scales=granularity is Granularity.TENSOR)
    if time:  # fail before the CPU work when there is no GPU to time on
        from fmtcli.attention.timing import TORCH_DTYPES, cuda_torch

        if spec.name not in TORCH_DTYPES:
            raise UsageError(f"torch's scaled_dot_product_attention has no {spec.name} "
                             "kernels: timing takes format float16, bfloat16 or float32")
        cuda_torch()
    steps = 3 + time
    report = progress or (lambda done, total: None)
    report(0, steps)
    if qkv is None:
        q, k, v = random_qkv(batch, heads, seq, dim, seed, outliers)
    labels = tuple(f"{name} ({source})" for name, source in
                   zip("QKV", inputs if len(inputs) == 3 else ("random",) * 3))
    for x, label in zip((q, k, v), labels):  # before the reference: it must stay finite
        check_float32_range(x, label)
    ref, largest = reference_attention(q, k, v, causal, largest_score=True)
    check_scores(largest, spec, dim, labels)
    report(1, steps)
    rows = attention_accuracy(q, k, v, spec, granularity, block_q, block_k, causal, hadamard,
                              seed, reference=ref, labels=labels)
    report(3, steps)
    timing = None
    gpu = None
    if time:
        from fmtcli.attention.timing import device_name, time_sdpa

        timing = tuple(time_sdpa(q, k, v, spec, ref, causal))
        gpu = device_name()
        report(4, steps)
    return AttentionResult(AttentionSettings(**settings, device="cuda" if time else "cpu",
                                             gpu=gpu), model, tuple(rows), timing)
