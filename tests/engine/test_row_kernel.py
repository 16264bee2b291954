"""The engine's C++ row-times kernel (engine/row_times.cpp): one bf16 row times a bf16 [out, in] weight with
float32 sums, as torch computes it in float32 and rounds to bf16; clear errors on what it does not take."""

from __future__ import annotations

import pytest
import torch

from specwatch.engine.kernels import row_times_kernel, why_not
from tests.engine.conftest import on_one_and_two_threads

pytestmark = pytest.mark.skipif(not row_times_kernel(), reason=f"the row-times kernel is not in use: {why_not('row')}")


@pytest.mark.parametrize(
    ("out_features", "in_features"),
    [(1, 32), (3, 7), (4, 64), (37, 96), (960, 576), (577, 1536), (5, 1000)],
)
def test_row_times_is_the_float32_product_rounded_to_bf16(out_features, in_features):
    """Rows shorter than, a multiple of, and beyond a multiple of 32 columns (the vector path's tail) included."""
    generator = torch.Generator().manual_seed(out_features * 7919 + in_features)
    weight = torch.randn(out_features, in_features, generator=generator).bfloat16()
    x = torch.randn(1, in_features, generator=generator).bfloat16()
    got = torch.ops.specwatch_cpu.row_times(x, weight)
    exact = x.double() @ weight.double().t()
    assert got.dtype == torch.bfloat16 and got.shape == (1, out_features)
    # float32 sums in another order than torch's: within a few float32 ulps of the sum before bf16 rounding
    torch.testing.assert_close(got.double(), exact, rtol=8e-3, atol=1e-4 * in_features**0.5)
    assert (got == (x.float() @ weight.float().t()).bfloat16()).float().mean() > 0.95


def test_row_times_runs_on_several_threads_as_on_one():
    one, two = on_one_and_two_threads(torch.ops.specwatch_cpu.row_times, torch.randn(1, 576).bfloat16(),
                                      torch.randn(4099, 576).bfloat16())  # fmt: skip
    assert torch.equal(one, two)


@pytest.mark.parametrize(
    ("x", "weight", "message"),
    [
        (torch.ones(1, 8, dtype=torch.bfloat16), torch.ones(4, 8), "weight must be a contiguous bfloat16"),
        (torch.ones(1, 8), torch.ones(4, 8, dtype=torch.bfloat16), "x must be bfloat16"),
        (torch.ones(2, 8, dtype=torch.bfloat16), torch.ones(4, 8, dtype=torch.bfloat16), r"bfloat16 \[1, in\]"),
        (torch.ones(1, 9, dtype=torch.bfloat16), torch.ones(4, 8, dtype=torch.bfloat16), r"\[1, in\]"),
        (torch.ones(1, 4, dtype=torch.bfloat16), torch.ones(8, 4, dtype=torch.bfloat16).t(), "contiguous"),
    ],
)
def test_row_times_refuses_what_it_does_not_take(x, weight, message):
    with pytest.raises(RuntimeError, match=message):
        torch.ops.specwatch_cpu.row_times(x, weight)
