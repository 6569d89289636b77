"""``--seed`` and the streams of stochastic rounding (issue 9, items 3 and 11): a seed is an
integer in [0, 2**64); each seed's stream is independent of its neighbours' (not a shift of
them), its bits look uniform, and the rounding does not depend on the chunks or the workers.
"""

from __future__ import annotations

import numpy as np
import pytest
from cli_helpers import assert_usage_error, invoke, strict_loads
from engine_helpers import source

from fmtcli.numerics.schemes import build_scheme
from fmtcli.quantize import quantize

BIG = "9" * 5000


# -- the option -------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("command", [["underflow", "0.3", "-r", "stochastic"],
                                     ["quantize", "-r", "stochastic"],
                                     ["check-backends", "e2m1"]])
@pytest.mark.parametrize("seed", ["18446744073709551616", "-1", BIG, "1.5", "nan", ""])
def test_seeds_outside_0_to_2_64_are_usage_errors(command, seed):
    assert "--seed" in assert_usage_error(invoke(*command, "--seed", seed))


@pytest.mark.parametrize("command", [["underflow", "0.3", "-r", "stochastic"],
                                     ["quantize", "-r", "stochastic", "--compare", "none"]])
def test_the_largest_seed_works(command):
    result = invoke(*command, "--seed", str(2**64 - 1), "--json")
    assert result.exit_code == 0, result.stderr
    strict_loads(result.stdout)


# -- the streams ------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", [0, 1, 7, 2**32, 2**63, 2**64 - 2])
def test_seed_streams_are_not_shifts_of_each_other(seed):
    import warnings

    from fmtcli.numerics.rounding import PositionalUniform

    n, reach = 4096, 1024
    index = np.arange(n + 2 * reach, dtype=np.uint64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no uint64 overflow warning for any seed
        a = PositionalUniform(seed, index).random(index.size)
        b = PositionalUniform(seed + 1, index[reach:reach + n]).random(n)
    # b equal to a shifted by any offset in -reach..reach: not one value in common
    windows = np.lib.stride_tricks.sliding_window_view(a, n)
    assert not np.any(windows == b[None, :])


def test_seed_stream_bits_look_uniform():
    from fmtcli.numerics.rounding import PositionalUniform

    n = 1 << 16
    for seed in (0, 1, 12345, 2**64 - 1):
        u = PositionalUniform(seed, np.arange(n, dtype=np.uint64)).random(n)
        assert 0 <= u.min() and u.max() < 1
        assert abs(u.mean() - 0.5) < 5 * (1 / 12 / n) ** 0.5
        counts = np.bincount((u * 16).astype(np.int64), minlength=16)
        chi2 = float(((counts - n / 16) ** 2 / (n / 16)).sum())
        assert chi2 < 45, (seed, chi2)  # 15 degrees of freedom: p ~ 1e-4
        # the low bits too (the top 53 bits make u: its 16th..20th bits)
        low = (u * 2**20).astype(np.int64) & 15
        chi2 = float(((np.bincount(low, minlength=16) - n / 16) ** 2 / (n / 16)).sum())
        assert chi2 < 45, (seed, chi2)


def stochastic_run(x, seed, tmp_path, **kwargs) -> np.ndarray:
    scheme = build_scheme(block=32, rounding="stochastic")
    out = str(tmp_path / f"s{seed}.npy")
    quantize([source(x)], [scheme], seed=seed, out=out, **kwargs)
    return np.load(out)


def test_neighbouring_seeds_round_independently(tmp_path):
    """Seed 1's rounding of element i was seed 0's of element i + 1."""
    x = np.full(4096, 1.0 + 2.0 ** -4, np.float32)  # halfway between 1 and 1.125 in E4M3
    x[::32] = 1.75  # each block's amax: scale 256, the ties stay ties
    up0 = stochastic_run(x, 0, tmp_path, workers=1) > 1.07
    up1 = stochastic_run(x, 1, tmp_path, workers=1) > 1.07
    pairs = (x[:-1] != 1.75) & (x[1:] != 1.75)  # element i and i + 1 both ties
    agree = np.mean(up1[:-1][pairs] == up0[1:][pairs])
    assert 0.4 < agree < 0.6  # independent: half agree (a shift would agree everywhere)
    assert 0.4 < up0[x != 1.75].mean() < 0.6


def test_stochastic_rounding_independent_of_chunks_and_workers(tmp_path):
    from cli_helpers import parallel_kwargs

    x = np.random.default_rng(3).standard_normal((64, 96)).astype(np.float32)
    runs = [stochastic_run(x, 2**64 - 1, tmp_path, chunk_elements=c, **parallel_kwargs(w))
            for c, w in ((1 << 18, 1), (96 * 4, 1), (96 * 3, 2))]
    for other in runs[1:]:
        np.testing.assert_array_equal(runs[0], other)
