"""``fmt audit``'s checks of the whole input: ``model-bits`` and ``config-quantized``.

``model-bits`` (ModelOpt issue #868: an "NVFP4" export at 6.12 bits per parameter).  The
effective bits per parameter of a checkpoint are every stored bit over every parameter;
they are always reported.  They sit above the quantized tensors' nominal in a healthy
export too, because every recipe keeps embeddings, output heads, norms, biases and routers
in high precision (compressed-tensors' ``ignore: ["lm_head"]``, ModelOpt's
``exclude_modules``, DeepSeek-V3's bfloat16 gate): a Llama-3-8B NVFP4 export with its
embeddings and head in bfloat16 is about 6.0 bits/param.  What the check judges is the
*linear layers* left as plain data (``streaming.roles.is_linear_weight``: 2-D ``*weight``
tensors that are not embeddings, heads or routers) that the config does not name as left
out (``ignore`` / ``exclude_modules`` / ``modules_to_not_convert``: exact module names,
globs with ``*``, or compressed-tensors' ``re:`` patterns): above ``PLAIN_LINEAR_SHARE`` of
the linear parameters it warns.
"""

from __future__ import annotations

import fnmatch
import re

from fmtcli.audit.check import Check, Verdict
from fmtcli.audit.checks import _pct, config_names
from fmtcli.streaming.roles import is_linear_weight

#: The share of the linear layers' parameters left as unlisted plain data above which
#: ``model-bits`` warns (a healthy export leaves none; a recipe that skips a few layers on
#: purpose lists them in its config).
PLAIN_LINEAR_SHARE = 0.10
#: The config keys that list modules left in high precision.
IGNORE_KEYS = ("ignore", "exclude_modules", "modules_to_not_convert")


def ignored_modules(config: dict | None) -> list[str]:
    """The module names and patterns a ``quantization_config`` leaves unquantized."""
    if not isinstance(config, dict):
        return []
    found = []
    for key in IGNORE_KEYS:
        entries = config.get(key)
        if isinstance(entries, list):
            found += [e for e in entries if isinstance(e, str)]
    return found


def is_ignored(module: str, entries: list[str]) -> bool:
    """Whether ``module`` matches an entry: ``re:PATTERN`` (compressed-tensors, a full
    match of the pattern), a glob with ``*`` (ModelOpt), or the name itself or its last
    parts (``lm_head`` matches ``model.lm_head``)."""
    for entry in entries:
        if entry.startswith("re:"):
            try:
                if re.fullmatch(entry[3:], module) or re.fullmatch(entry[3:], module + ".weight"):
                    return True
            except re.error:
                continue
        elif "*" in entry or "?" in entry:
            if fnmatch.fnmatchcase(module, entry):
                return True
        elif module == entry or module.endswith("." + entry):
            return True
    return False


def model_checks(tensors, plain_sources, plain, config, nominal) -> list[Check]:
    """``config-quantized`` (the config names a scheme, no tensor holds a layout) and
    ``model-bits`` over the audited ``tensors`` (``TensorAudit``) and the ``plain_sources``
    (``TensorSource``; ``plain``: their ``PlainTensors`` summary)."""
    found = []
    names = config_names(config)
    if names and not tensors and plain.count:
        found.append(Check("config-quantized", Verdict.FAIL,
                           f"config.json names {', '.join(names)}, but no tensor holds a "
                           f"quantized layout (all {plain.count:,} read as plain data)",
                           {"config": names}))
    if tensors and nominal:
        found.append(_model_bits(tensors, plain_sources, plain, config, nominal))
    return found


def _model_bits(tensors, plain_sources, plain, config, nominal) -> Check:
    params = sum(t.params for t in tensors) + plain.params
    effective = (sum(t.stored_bits for t in tensors) + plain.stored_bits) / params
    entries = ignored_modules(config)
    linear = [s for s in plain_sources if s.key is not None
              and is_linear_weight(s.key, s.shape)]
    listed = [s for s in linear if is_ignored(s.key[: -len(".weight")]
                                              if s.key.endswith(".weight") else s.key,
                                              entries)]
    unlisted = [s for s in linear if s not in listed]
    linear_params = sum(t.params for t in tensors) + sum(s.size for s in linear)
    share = sum(s.size for s in unlisted) / linear_params if linear_params else 0.0
    figures = {"effective_bits": effective, "nominal_bits": nominal,
               "plain_share": plain.params / params, "plain_linear": len(unlisted),
               "plain_linear_share": share, "plain_linear_listed": len(listed)}
    head = f"{effective:.3f} bits/param over the model (nominal {nominal:.4g})"
    if share > PLAIN_LINEAR_SHARE:
        dtypes = sorted({s.dtype for s in unlisted})
        return Check("model-bits", Verdict.WARN,
                     f"{head}: {len(unlisted):,} linear weight"
                     f"{'s' if len(unlisted) != 1 else ''} ({_pct(share)} of the linear "
                     f"parameters) left plain ({', '.join(dtypes)}) and not in the config's "
                     f"ignore list, e.g. {unlisted[0].key}", figures)
    why = ("no plain tensor" if not plain.count else
           f"{_pct(plain.params / params)} of the parameters plain "
           f"({', '.join(plain.dtypes)})" + (
               f", {len(unlisted):,} of them linear weights ({_pct(share)} of the linear "
               "parameters)" if unlisted else ", none an unlisted linear layer")
           + (f"; {len(listed):,} linear weights the config leaves out" if listed else ""))
    return Check("model-bits", Verdict.OK, f"{head}; {why}", figures)
