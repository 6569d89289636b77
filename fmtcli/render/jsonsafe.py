"""Turn result dictionaries into strictly valid JSON values.

JSON has no inf or NaN; fmtcli writes them as the strings "inf", "-inf" and "nan" so that
every ``--json`` document parses with any JSON reader.  numpy scalars become Python ones.
"""

from __future__ import annotations

import json
import math
from enum import Enum
from typing import Any

import numpy as np


def json_safe(obj: Any) -> Any:
    """Recursively convert ``obj`` into plain JSON types, inf/NaN as strings."""
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, Enum):
        return obj.value
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        value = float(obj)
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return value
    if isinstance(obj, np.ndarray):
        return json_safe(obj.tolist())
    return obj


def dumps(obj: Any) -> str:
    """One JSON document, indented, with no NaN/Infinity literals (allow_nan=False)."""
    return json.dumps(json_safe(obj), indent=2, allow_nan=False)
