"""Pick the tensors a command takes from its FILEs: one way, and one set of messages, for
``fmt dot`` (A and B), ``fmt attention`` (Q, K, V), ``fmt sum`` and ``fmt softmax``'s
``--scores``/``--values`` (one tensor each).

``load_inputs`` reads the paths and refuses them when nothing is usable, in the calling
command's words (``purpose``: "nothing to multiply", "nothing to sum"); then the usable
tensors are counted.  From one file holding more than the command takes, tensors named for
their role (the last dotted part of the key: ``a``/``b``, ``q``/``key``...) are taken when
each role names exactly one tensor.  ``--key`` selection is ``tensors.select_keys``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from fmtcli.base.errors import DataError, shown
from fmtcli.inputs.tensors import TensorSource, load_inputs

WORDS = {1: "one", 2: "two", 3: "three"}


def where(path: str) -> str:
    """A path as messages show it: quoted, ``<stdin>`` for ``-``."""
    return "<stdin>" if path == "-" else shown(path)


def role_name(source: TensorSource) -> str:
    """The name that gives a tensor its role: the last dotted part of its key, lowercased
    (``attn.q`` -> ``q``; '' for a tensor without a key)."""
    return (source.key or "").lower().rsplit(".", 1)[-1]


def _by_role(sources: list[TensorSource], roles: Sequence[set[str]]
             ) -> list[TensorSource] | None:
    """One tensor per role (a set of accepted ``role_name``s) where each role names exactly
    one, all different; else None."""
    named = [[s for s in sources if role_name(s) in role] for role in roles]
    if all(len(hits) == 1 for hits in named) and len({id(h[0]) for h in named}) == len(roles):
        return [hits[0] for hits in named]
    return None


def pick(paths: list[str], *, purpose: str, taker: str, count: int = 1,
         roles: Sequence[set[str]] = (), how: str = "") -> list[TensorSource]:
    """The ``count`` usable tensors of ``paths`` that ``taker`` (the command or option, as
    messages name it: ``fmt dot``, ``--scores``) takes, in order.  From one path, with
    ``roles`` (one set of accepted names per tensor), the tensors named for them where each
    is found once, whatever else the file holds.  Errors (DataError, one line): nothing
    ``purpose`` (no tensors, none usable); the count held against the count taken
    (``taker takes {count}{how}``), with the reasons tensors were skipped."""
    sources = load_inputs(paths, purpose=purpose)
    usable = [s for s in sources if s.skipped is None]
    if len(paths) == 1 and roles:
        usable = _by_role(usable, roles) or usable
    if len(usable) != count:
        holders = ", ".join(where(p) for p in paths[:5])
        why = "; ".join(f"{shown(s.name)}: {s.skipped}" for s in sources[:3] if s.skipped)
        raise DataError(f"{holders} {'holds' if len(paths) == 1 else 'hold'} {len(usable)} "
                        f"usable tensor{'' if len(usable) == 1 else 's'} ({taker} takes "
                        f"{WORDS.get(count, count)}{how})" + (f" ({why})" if why else ""))
    return usable


def pick_file(path: str, *, purpose: str, taker: str) -> TensorSource:
    """The one usable tensor of one FILE (not a directory) that ``taker`` takes: ``pick``'s
    errors, and a directory refused."""
    if path != "-" and os.path.isdir(path):
        raise DataError(f"{shown(path)} is a directory ({taker} takes one file)")
    return pick([path], purpose=purpose, taker=taker)[0]
