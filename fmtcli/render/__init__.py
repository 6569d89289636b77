"""Rich tables for results: ``render(result)`` draws any command's result, by its type.

One module per command draws its tables (``range``, ``underflow``, ``quantize`` with
``quantize_summary`` and ``quantize_cells``, ``scale_search``, ``loss_scale``,
``check_backends``, ``softmax``, ``attention``, ``arithmetic`` for calc and sum, ``dot``,
``compare``, ``kv``, ``audit``); they share ``fit`` (the width rules: a table fits the console or
changes shape), ``numbers`` (how values are written), ``widgets`` (names, fates, shapes,
sparklines) and ``plaintable`` (thousands of rows drawn line by line, as rich draws them).
Renderers format and lay out; they compute nothing new.  ``jsonsafe`` and ``csvout`` are
the other two views of a result (``--json``, ``--csv``).

This module is only the registry: it imports none of its renderers until a result is drawn,
so that drawing one command's table loads neither the other commands' renderers nor their
engines, and no renderer module imports this one but ``fit`` (for ``PLAIN_ROWS``).
"""

from __future__ import annotations

from importlib import import_module

#: Above this many rows a table of one-line cells is laid out by ``plaintable``, not by
#: rich: rich takes ~0.1 ms a row (100,000 values of ``fmt underflow`` in six formats:
#: minutes), plaintable ~2 us, to the same bytes.  Read by ``fit`` when a table is drawn.
PLAIN_ROWS = 2000

#: Each result type, by the module and name that define it, and its renderer: a module of
#: ``fmtcli.render`` and a function in it.  Keyed by name rather than by the class object so
#: that drawing one command's table never imports the other commands' engines (the result's
#: own module is loaded already: it made the result).
RENDERERS = {
    ("fmtcli.numerics.formats", "FormatTable"): ("range", "render_range"),
    ("fmtcli.underflow", "UnderflowResult"): ("underflow", "render_underflow"),
    ("fmtcli.engine.results", "QuantizeResult"): ("quantize", "render_quantize"),
    ("fmtcli.scale_search", "ScaleSearchResult"): ("scale_search", "render_scale_search"),
    ("fmtcli.loss_scale", "LossScaleResult"): ("loss_scale", "render_loss_scale"),
    ("fmtcli.check_backends", "ConformanceResult"): ("check_backends", "render_conformance"),
    ("fmtcli.attention.report", "AttentionResult"): ("attention", "render_attention"),
    ("fmtcli.attention.softmax", "SoftmaxTrace"): ("softmax", "render_softmax"),
    ("fmtcli.arithmetic.calc", "CalcResult"): ("arithmetic", "render_calc"),
    ("fmtcli.arithmetic.summation", "SumResult"): ("arithmetic", "render_sum"),
    ("fmtcli.arithmetic.dot", "DotResult"): ("dot", "render_dot"),
    ("fmtcli.compare", "CompareResult"): ("compare", "render_compare"),
    ("fmtcli.kv", "KvResult"): ("kv", "render_kv"),
    ("fmtcli.audit", "AuditResult"): ("audit", "render_audit"),
    ("fmtcli.train.results", "TrainResult"): ("train", "render_train"),
}


def renderer_of(result_type: type):
    """The function that draws a result of ``result_type`` (its module loaded on first
    use); TypeError where no renderer is registered (a bug, not a user's mistake)."""
    entry = RENDERERS.get((result_type.__module__, result_type.__qualname__))
    if entry is None:
        raise TypeError(f"no renderer for {result_type.__module__}.{result_type.__qualname__}")
    module, name = entry
    return getattr(import_module(f"{__name__}.{module}"), name)


def render(result, **view):
    """The rich renderable of a command's result (``view``: display options that change no
    number, such as the loss-scale histogram)."""
    return renderer_of(type(result))(result, **view)
