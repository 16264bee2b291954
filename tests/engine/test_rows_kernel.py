"""The engine's C++ rows-times kernel (engine/rows_times.cpp): up to 8 bf16 rows times a bf16 [out, in] weight with
float32 sums, as torch computes it in float32 and rounds to bf16; each row's result the same whatever rows come
with it (a verification scores a token as the plain step does); clear errors on what it does not take."""

from __future__ import annotations

import pytest
import torch

from specwatch.engine.kernels import rows_times_kernel, why_not
from tests.engine.conftest import on_one_and_two_threads

pytestmark = pytest.mark.skipif(
    not rows_times_kernel(), reason=f"the rows-times kernel is not in use: {why_not('rows')}"
)


@pytest.mark.parametrize("rows", range(1, 9))
@pytest.mark.parametrize(("out_features", "in_features"), [(1, 32), (3, 7), (37, 96), (960, 576), (5, 1000)])
def test_rows_times_is_the_float32_product_rounded_to_bf16(rows, out_features, in_features):
    """Rows shorter than, a multiple of, and beyond a multiple of 32 columns (the vector path's tail) included."""
    generator = torch.Generator().manual_seed(rows * 104729 + out_features * 7919 + in_features)
    weight = torch.randn(out_features, in_features, generator=generator).bfloat16()
    x = torch.randn(rows, in_features, generator=generator).bfloat16()
    got = torch.ops.specwatch_cpu.rows_times(x, weight)
    exact = x.double() @ weight.double().t()
    assert got.dtype == torch.bfloat16 and got.shape == (rows, out_features)
    torch.testing.assert_close(got.double(), exact, rtol=8e-3, atol=1e-4 * in_features**0.5)
    assert (got == (x.float() @ weight.float().t()).bfloat16()).float().mean() > 0.95


def test_a_row_scores_the_same_alone_and_among_others():
    weight = torch.randn(1000, 576).bfloat16()
    x = torch.randn(8, 576).bfloat16()
    together = torch.ops.specwatch_cpu.rows_times(x, weight)
    for row in range(8):
        assert torch.equal(torch.ops.specwatch_cpu.rows_times(x[row : row + 1], weight)[0], together[row])
        assert torch.equal(torch.ops.specwatch_cpu.rows_times(x[: row + 1], weight), together[: row + 1])


def test_rows_times_runs_on_several_threads_as_on_one():
    one, two = on_one_and_two_threads(torch.ops.specwatch_cpu.rows_times, torch.randn(4, 576).bfloat16(),
                                      torch.randn(4099, 576).bfloat16())  # fmt: skip
    assert torch.equal(one, two)


@pytest.mark.parametrize(
    ("x", "weight", "message"),
    [
        (torch.ones(1, 8, dtype=torch.bfloat16), torch.ones(4, 8), "weight must be a contiguous bfloat16"),
        (torch.ones(1, 8), torch.ones(4, 8, dtype=torch.bfloat16), "x must be bfloat16"),
        (torch.ones(9, 8, dtype=torch.bfloat16), torch.ones(4, 8, dtype=torch.bfloat16), r"1 <= n <= 8"),
        (torch.ones(0, 8, dtype=torch.bfloat16), torch.ones(4, 8, dtype=torch.bfloat16), r"1 <= n <= 8"),
        (torch.ones(1, 9, dtype=torch.bfloat16), torch.ones(4, 8, dtype=torch.bfloat16), r"\[n, in\]"),
        (torch.ones(1, 1, 8, dtype=torch.bfloat16), torch.ones(4, 8, dtype=torch.bfloat16), r"\[n, in\]"),
        (torch.ones(1, 4, dtype=torch.bfloat16), torch.ones(8, 4, dtype=torch.bfloat16).t(), "contiguous"),
    ],
)
def test_rows_times_refuses_what_it_does_not_take(x, weight, message):
    with pytest.raises(RuntimeError, match=message):
        torch.ops.specwatch_cpu.rows_times(x, weight)
