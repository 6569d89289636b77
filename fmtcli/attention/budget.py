"""How long ``fmt attention``'s CPU emulation takes and how much memory it holds, estimated
from the shape before any work, and the refusal of what would not finish.

The emulation (``accuracy``) runs three methods -- the float64 reference, standard attention
and the blockwise one -- over ``g = batch x heads`` pairs of ``N`` queries, ``N_k`` keys and
``d`` dims.  Its cost has four parts, each measured on the project's reference machine (two
shared x86-64 cores; numpy's elementwise work runs on one, OpenBLAS's products on both):

- every score of every method: exp, the casts to F, the softmax (``SCORE_SECONDS``: 90 ns a
  score where F is float16 or a format the fast nearest-even path rounds, 200 ns for
  bfloat16, float32 and FP8/6/4, whose casts take the general path);
- the products, ``6 g N N_k d`` multiply-adds (``MAC_SECONDS``, on both cores);
- the blockwise method's passes over the keys, ``T_c = ceil(N_k / B_c)``, each reading all
  of Q and reading and writing all of O: ``T_c g N d`` elements (``PASS_SECONDS``): with a
  large ``d``, Algorithm 1's ``B_c = ceil(M / 4d)`` is a few keys and this part rules;
- the inputs (random draws, casts, errors): ``ELEMENT_SECONDS`` a Q, K or V element.

Memory: the inputs and their copies (float64 as given, float32 as quantized, the float64
reference and two outputs, the errors' temporaries: ``ELEMENT_BYTES`` a Q, K or V element)
and one group of heads' scores (``_groups`` keeps it near 2**25 scores, or one head's
``N x N_k``; ``SCORE_BYTES`` a score: float64 for the reference, float32 and the casts'
temporaries for the methods; FP8/6/4 also quantize P in B_r x B_c tiles, the last one
zero-padded: ``TILE_BYTES`` a padded score).  The limits, ``SECONDS`` and ``BYTES``, keep
a run within about a minute on two cores and within a 4 GiB process.  The figures are
estimates (within a factor of about 1.5 of the measured ones, mostly above them); ``--io``
has no limit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fmtcli.attention.accuracy import CHUNK_ELEMENTS
from fmtcli.base.errors import UsageError
from fmtcli.numerics.formats import FormatSpec
from fmtcli.numerics.rounding import magic_rounding_applies
from fmtcli.numerics.tiles import is_narrow

#: The most a run may be estimated to take on two cores, and to hold.
SECONDS = 60.0
BYTES = 3 << 30
#: Costs on the reference machine (module docstring), seconds or bytes per unit.
SCORE_SECONDS = {"fast": 90e-9, "general": 200e-9}
MAC_SECONDS = 0.1e-9 / 2  # one core's float32/float64 rate, on two cores
PASS_SECONDS = 4.5e-9
ELEMENT_SECONDS = 90e-9
ELEMENT_BYTES = 24
SCORE_BYTES = {"fast": 16, "general": 24, "narrow": 16}
#: FP8/6/4: P quantized per B_r x B_c tile, zero-padded to whole tiles, bytes a padded score
TILE_BYTES = 12
BASE_BYTES = 40 << 20


@dataclass(frozen=True)
class Estimate:
    """Seconds on two cores and bytes held at the peak; ``parts`` names each part of the
    time with its seconds (largest first), for the message."""

    seconds: float
    bytes: int
    parts: tuple[tuple[str, float], ...]


def estimate(batch: int, heads: int, seq: int, seq_k: int, dim: int, spec: FormatSpec,
             block_k: int, tensor_scales: bool = False) -> Estimate:
    """The estimate of the module docstring for one shape, format and B_c."""
    g = batch * heads
    scores = g * seq * seq_k
    kind = "fast" if spec.bits > 8 and spec.mantissa_bits < 23 \
        and magic_rounding_applies(spec) else "general"
    per_score = SCORE_SECONDS[kind] * (1.4 if tensor_scales and is_narrow(spec) else 1.0)
    passes = math.ceil(seq_k / block_k)
    elements = g * dim * (seq + 2 * seq_k)
    parts = {
        f"{scores:,} scores": scores * per_score,
        f"{6 * scores * dim:,} multiply-adds": 6 * scores * dim * MAC_SECONDS,
        f"{passes:,} key blocks of {block_k:,}, each a pass over Q and O":
            passes * g * seq * dim * PASS_SECONDS,
        f"{elements:,} elements of Q, K, V": elements * ELEMENT_SECONDS,
    }
    group = max(seq * seq_k, min(scores, CHUNK_ELEMENTS))
    per_held = SCORE_BYTES["narrow" if is_narrow(spec) else kind]
    if is_narrow(spec) and not tensor_scales:
        per_held += TILE_BYTES * passes * block_k / seq_k  # the padding of the last tile
    held = BASE_BYTES + elements * ELEMENT_BYTES + int(group * per_held)
    ranked = tuple(sorted(parts.items(), key=lambda item: -item[1]))
    return Estimate(sum(parts.values()), held, ranked)


def check_budget(batch: int, heads: int, seq: int, seq_k: int, dim: int, spec: FormatSpec,
                 block_k: int, tensor_scales: bool = False) -> Estimate:
    """The estimate, or a UsageError where it passes ``SECONDS`` or ``BYTES``: the shape,
    the estimate, its largest part and the limit, in one line."""
    e = estimate(batch, heads, seq, seq_k, dim, spec, block_k, tensor_scales)
    shape = f"batch {batch} x heads {heads} x seq {seq}" + (
        f" ({seq_k} keys)" if seq_k != seq else "") + f" x dim {dim} in {spec.name}"
    tail = "; the IO model alone (--io) has no limit"
    if e.bytes > BYTES:
        raise UsageError(f"{shape} would hold about {e.bytes / 2**30:.1f} GiB in the CPU "
                         f"emulation (the inputs and one group of heads' scores), more than "
                         f"its limit of {BYTES / 2**30:.0f} GiB: give a smaller shape{tail}")
    if e.seconds > SECONDS:
        name, seconds = e.parts[0]
        hint = " or a larger --block-k (or --sram)" if "key blocks" in name else ""
        raise UsageError(f"{shape} would take about {e.seconds:,.0f} s of CPU emulation on "
                         f"two cores ({name}: {seconds:,.0f} s), more than its limit of "
                         f"{SECONDS:.0f} s: give a smaller shape{hint}{tail}")
    return e
