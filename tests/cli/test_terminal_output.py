"""What a terminal shows, with stderr on a pseudo-terminal (python's ``pty``), stdout a pipe.

The progress bar of ``fmt quantize`` on a ~200 MB .npy: there from the first report (the
work is known to be long by its size), on stderr only, its bytes never go back, its total
is the file's data, and its time left is a steady figure, not 2 s then 7 s.  Notes: wrapped
at word boundaries to the terminal's width."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time

import numpy as np
import pytest

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs a pty")

ROWS, COLS = 12_500, 4_000  # 50M float32 values: 200 MB of data
FRAME = re.compile(r"quantizing\s+\S*\s+(?P<done>[\d.]+)/(?P<total>[\d.]+) MB\s+"
                   r"(?P<left>-:--:--|\d+:\d\d:\d\d)")


@pytest.fixture(scope="module")
def big_npy(tmp_path_factory):
    path = tmp_path_factory.mktemp("progress") / "x200.npy"
    x = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(ROWS, COLS))
    tile = np.random.default_rng(0).standard_normal((500, COLS), dtype=np.float32)
    for start in range(0, ROWS, 500):
        x[start:start + 500] = tile
    x.flush()
    del x
    return path


def run_on_a_terminal(*args, columns: int = 100, extra_env: dict | None = None
                      ) -> tuple[str, list[tuple[float, str]], float]:
    """``python -m fmtcli ARGS`` with stderr on a pty of ``columns`` columns (and
    ``extra_env``): its stdout, what the terminal showed (time, each line or frame without
    escape codes) and the wall time."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "FMT_TRACEBACK")}
    env.update(extra_env or {})
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "fmtcli", *map(str, args)],
                            stdout=subprocess.PIPE, stderr=slave, env=env)
    os.close(slave)
    shown: list[tuple[float, str]] = []
    out = b""
    streams = [master, proc.stdout.fileno()]
    while streams:
        ready, _, _ = select.select(streams, [], [], 120)
        assert ready, "fmt did not finish in 120 s"
        for fd in ready:
            try:
                data = os.read(fd, 1 << 16)
            except OSError:  # the pty's other end closed
                data = b""
            if not data:
                streams.remove(fd)
            elif fd == master:
                text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", data.decode("utf-8", "replace"))
                shown += [(time.monotonic() - start, f) for f in re.split(r"[\r\n]+", text)
                          if f.strip()]
            else:
                out += data
    assert proc.wait(timeout=60) == 0, shown[-3:]
    os.close(master)
    return out.decode(), shown, time.monotonic() - start


def seconds(left: str) -> int | None:
    if left == "-:--:--":
        return None
    h, m, s = map(int, left.split(":"))
    return 3600 * h + 60 * m + s


@pytest.mark.slow
def test_a_long_run_shows_a_sane_bar_from_the_start_on_stderr(big_npy):
    # the numpy path (no compiled kernel): a run of a few seconds on any machine, long
    # enough for the bar's rate to be judged (the kernel does 200 MB in ~0.1 s when idle)
    out, shown, wall = run_on_a_terminal("quantize", big_npy, "--per", "tensor", "--compare",
                                         "none", "--json", extra_env={"FMTCLI_KERNEL": "numpy"})
    assert json.loads(out)["tensors"][0]["shape"] == [ROWS, COLS]  # stdout: the results only
    frames = [(t, FRAME.search(text)) for t, text in shown if FRAME.search(text)]
    assert len(frames) >= 2, shown
    done = [float(m["done"]) for _, m in frames]
    assert {m["total"] for _, m in frames} == {"200.0"}
    assert done == sorted(done), done  # never goes back
    assert done[0] <= 0.2 * 200, done  # there from the start, not at 0.8 of the input
    lefts = [seconds(m["left"]) for _, m in frames if seconds(m["left"]) is not None]
    assert lefts, shown
    assert max(lefts) <= 3 * wall + 2, (lefts, wall)  # a figure of this run's length
    # steady: past the first estimate, one never jumps above the last by more than 2 s
    assert all(b <= a + 2 for a, b in zip(lefts[1:], lefts[2:])), lefts
    # and so is the rate: no stretch of the bar (the first pass) races ahead of the rest
    # (each frame against the first one at least 0.1 s after it: frames come in bursts)
    points = [(t, float(m["done"])) for t, m in frames]
    rates = []
    for i, (t, a) in enumerate(points):
        later = next(((u, b) for u, b in points[i + 1:] if u - t >= 0.1), None)
        if later is not None and later[1] > a:
            rates.append((later[1] - a) / (later[0] - t))
    assert rates and max(rates) <= 4 * sorted(rates)[len(rates) // 2], (rates, points)


def test_a_large_input_shows_the_bar_at_its_first_report(monkeypatch):
    from fmtcli.cli import output

    monkeypatch.setattr(output.sys.stderr, "isatty", lambda: True, raising=False)
    progress = output.StderrProgress("quantizing")
    try:
        progress(0, 64 << 20)  # a large input: at once, not after a second
        assert progress.bar is not None
    finally:
        progress.close()
    small = output.StderrProgress("quantizing")
    small(0, 1 << 20)  # a small one may be over before a bar could help
    assert small.bar is None


@pytest.mark.slow
def test_the_bar_fits_the_terminal(big_npy):
    _, shown, _ = run_on_a_terminal("quantize", big_npy, "--per", "tensor", "--compare",
                                    "none", "--json", columns=60)
    assert any("quantizing" in text for _, text in shown), shown
    assert all(len(text) <= 60 for _, text in shown), [t for _, t in shown if len(t) > 60]


@pytest.mark.slow
def test_no_bar_when_stderr_is_not_a_terminal(big_npy):
    proc = subprocess.run([sys.executable, "-m", "fmtcli", "quantize", str(big_npy), "--per",
                           "tensor", "--compare", "none", "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr[:300]


# -- notes -------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_note_is_wrapped_at_words_to_the_terminal_s_width():
    _, shown, _ = run_on_a_terminal("range", "e4m3", "--json", columns=40)
    lines = [text for _, text in shown]
    assert len(lines) >= 3 and lines[0].startswith("Note: 'e4m3' is ambiguous"), lines
    assert all(len(line) <= 40 for line in lines), lines
    whole = subprocess.run([sys.executable, "-m", "fmtcli", "range", "e4m3", "--json"],
                           capture_output=True, text=True, timeout=60).stderr
    assert whole.count("\n") == 1  # not a terminal: one line, as it was
    assert " ".join(line.strip() for line in lines) == whole.strip()  # broken at spaces only
    assert all(line.startswith("      ") for line in lines[1:])  # under the text
