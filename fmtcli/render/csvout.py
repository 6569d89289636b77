"""``fmt quantize --csv``: one row per tensor and scheme, for spreadsheets and pandas.

The rows carry the same figures as the JSON document's ``tensors[i].schemes[j]`` (same key
names, so a script can switch between the two), flattened: the tensor's ``source``, ``key``,
``shape`` (``1000x64``) and ``dtype`` first, then the scheme, then its statistics.  Skipped
tensors (not floating point, empty) have no row: stderr names them.  Numbers are written as
Python writes them (every digit of a float64); NaN and infinities as ``nan``, ``inf`` and
``-inf``, which ``float()`` and pandas read back; an absent value (a block size under
per-tensor scaling) is an empty cell.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fmtcli.compare import CompareResult
    from fmtcli.engine.results import QuantizeResult, SchemeStats, TensorResult

TENSOR_FIELDS = ("tensor", "source", "key", "shape", "dtype")
SCHEME_FIELDS = ("scheme", "format", "granularity", "block", "axis", "tile", "scale_rule",
                 "margin", "scale_format", "rounding", "overflow", "product")
STAT_FIELDS = ("count", "nonzero", "zeros", "nonfinite_inputs", "flushed", "flushed_fraction",
               "saturated", "saturated_fraction", "overflowed", "overflowed_fraction",
               "nan_produced", "median_rel_error", "p99_rel_error", "max_abs_error", "rmse",
               "mse", "sqnr_db", "bias", "scale_min", "scale_max", "scales", "blocks",
               "flushing_blocks", "saturating_blocks", "above_max", "above_max_fraction",
               "median_rel_error_outside_amax_block")
FIELDS = TENSOR_FIELDS + SCHEME_FIELDS + STAT_FIELDS


def cell(value) -> str:
    """A value as a CSV cell: '' for None, nan/inf/-inf for non-finite floats, else str()."""
    if value is None:
        return ""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return str(value)


def _row(tensor: TensorResult, stats: SchemeStats) -> dict:
    info, scheme = tensor.tensor, stats.scheme.to_dict()
    blocks = stats.blocks
    row = {"tensor": info.key if info.key is not None else info.source, "source": info.source,
           "key": info.key, "shape": "x".join(map(str, info.shape)), "dtype": info.dtype,
           "scheme": scheme["label"],
           "tile": "x".join(map(str, scheme["tile"])) if scheme.get("tile") else None,
           "scale_min": stats.scales.min, "scale_max": stats.scales.max,
           "scales": stats.scales.count,
           "blocks": blocks.count if blocks else None,
           "flushing_blocks": blocks.flushing if blocks else None,
           "saturating_blocks": blocks.saturating if blocks else None}
    for name in SCHEME_FIELDS:
        row.setdefault(name, scheme.get(name))
    for name in STAT_FIELDS:
        row.setdefault(name, getattr(stats, name, None))
    return row


def rows(result: QuantizeResult) -> Iterator[dict]:
    """Every (tensor, scheme) of the result as a dict of ``FIELDS``, in checkpoint order."""
    for tensor in result.quantized:
        for stats in tensor.schemes:
            yield _row(tensor, stats)


def to_csv(result: QuantizeResult) -> str:
    """The CSV document: a header row of ``FIELDS``, then ``rows(result)`` (lines end in
    \\r\\n, as the csv module and RFC 4180 write them)."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(FIELDS)
    for row in rows(result):
        writer.writerow([cell(row[name]) for name in FIELDS])
    return out.getvalue()


# -- fmt compare --csv: one row per tensor pair ---------------------------------------------

CSV_FIELDS = ("name", "shape", "ref_dtype", "test_dtype", "count", "nonzero", "differ",
              "ref_nan", "ref_inf", "test_nan", "test_inf", "unbounded", "sqnr_db", "cosine",
              "calc_diff", "rel_frobenius", "max_abs_error", "max_rel_error",
              "median_rel_error", "p99_rel_error")
CSV_LOGIT_FIELDS = ("rows", "bad_rows", "kl_mean", "kl_median", "kl_p99", "kl_max",
                    "top1_agreement", "top5_overlap")
# where a side is a quantized layout (compare.verdict); the reasons are --json's
CSV_JUDGED_FIELDS = ("layout", "fmt_scheme", "fmt_sqnr_db", "verdict")


def compare_csv(result: CompareResult) -> str:
    """One row per tensor pair (REF's order), the JSON key names as the header; the logit
    figures too with ``--logits``.  nan/inf written so, as ``csvout`` writes them."""
    fields = CSV_FIELDS + (CSV_LOGIT_FIELDS if result.logits else ()) + (
        CSV_JUDGED_FIELDS if result.judged else ())
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(fields)
    for t in result.tensors:
        row = t.to_dict()
        row["shape"] = "x".join(map(str, t.ref.shape))
        row.update(row.pop("logits", None) or {})
        writer.writerow([cell(row[name]) for name in fields])
    return out.getvalue()
