"""The largest sizes ``fmt softmax`` and ``fmt attention`` take: numbers only (no numpy), so
the command line reads them when it builds its options and ``--help`` shows them.

Each limit is checked twice: by the option (typer's ``min``/``max``: exit 2 at parse time)
and by the library function that takes the size (a ``UsageError`` naming it), so a notebook
gets the same answer as the command line.
"""

from __future__ import annotations

# -- fmt softmax: one trace within seconds, its JSON within memory -----------------------
#: keys of one query
SOFTMAX_MAX_KEYS = 1 << 20
#: keys x components of the values
SOFTMAX_MAX_ELEMENTS = 1 << 24
#: keys summed one after another in a block
SOFTMAX_MAX_BLOCK = 1 << 16
#: blocks of one trace (the recurrence across blocks is sequential)
SOFTMAX_MAX_BLOCKS = 1 << 16
#: blocks x components recorded in the trace
SOFTMAX_MAX_TRACE = 1 << 20

# -- fmt attention's IO model: far beyond any model's shapes (a 16M-token context, a million
# sequences, 65,536 heads of 65,536 dims, 1 TiB of SRAM), so every count stays an exact
# integer whose figures print
IO_LIMITS = {"batch": 1 << 20, "heads": 1 << 16, "seq": 1 << 24, "dim": 1 << 16,
             "block_q": 1 << 24, "block_k": 1 << 24, "sram_bytes": 1 << 40,
             "element_bits": 64}
