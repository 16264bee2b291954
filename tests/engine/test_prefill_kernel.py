"""The engine's C++ prompt attention (engine/prefill_attention.cpp): causal attention of a whole bf16 prompt,
as close to the exact result as torch's own bf16 attention, whatever the heads, length and thread count;
the decoder's prompt forward through it, eager and compiled, as through torch's kernel; clear errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.decoder import LlamaDecoder, warm_up
from engine.kernels import prefill_attention_kernel
from tests.engine.conftest import tiny_llama

pytestmark = pytest.mark.skipif(
    not prefill_attention_kernel(), reason="the prefill-attention kernel could not be built here (no AVX512-BF16, compiler or ninja)"
)


def qkv(heads: int, kv_heads: int, n: int, dim: int, seed: int, spread: float = 1.0):
    generator = torch.Generator().manual_seed(seed)
    return [(torch.randn(h, n, dim, generator=generator) * spread).bfloat16() for h in (heads, kv_heads, kv_heads)]


def exact(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True, enable_gqa=True)


@pytest.mark.parametrize(
    ("heads", "kv_heads", "n", "dim", "spread"),
    [
        (9, 3, 1, 64, 1.0),  # one token
        (9, 3, 63, 64, 1.0),  # a block's edge: 63, 64, 65 keys
        (9, 3, 64, 64, 1.0),
        (9, 3, 65, 64, 1.0),
        (4, 4, 301, 64, 2.0),  # no grouping; a short last tile
        (6, 1, 130, 128, 1.0),  # the other head size
        (8, 2, 97, 128, 4.0),  # sharp softmax: the running maximum rescales often
        (9, 3, 700, 64, 1.0),
    ],
)
def test_prefill_attention_is_as_close_to_exact_as_torchs_bf16_attention(heads, kv_heads, n, dim, spread):
    q, k, v = qkv(heads, kv_heads, n, dim, seed=n * 31 + dim, spread=spread)
    got = torch.ops.specwatch_cpu.prefill_attention(q, k, v, dim**-0.5)
    torch_bf16 = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    want = exact(q, k, v)
    assert got.dtype == torch.bfloat16 and got.shape == q.shape and torch.isfinite(got).all()
    assert (got.double() - want).abs().max() <= 2 * (torch_bf16.double() - want).abs().max() + 2e-3


def test_prefill_attention_takes_its_scale():
    q, k, v = qkv(6, 2, 50, 64, seed=1)
    got = torch.ops.specwatch_cpu.prefill_attention(q, k, v, 0.3)
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True, enable_gqa=True, scale=0.3)
    torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=2e-2)


def test_a_position_sees_no_later_key():
    """Changing the last key and value changes the last position's output only."""
    q, k, v = qkv(9, 3, 130, 64, seed=2)
    before = torch.ops.specwatch_cpu.prefill_attention(q, k, v, 0.125)
    k[:, -1], v[:, -1] = 30.0, -30.0
    after = torch.ops.specwatch_cpu.prefill_attention(q, k, v, 0.125)
    assert torch.equal(before[:, :-1], after[:, :-1]) and not torch.equal(before[:, -1], after[:, -1])


def test_prefill_attention_runs_on_several_threads_as_on_one():
    q, k, v = qkv(9, 3, 517, 64, seed=3)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = torch.ops.specwatch_cpu.prefill_attention(q, k, v, 0.125)
        torch.set_num_threads(2)
        two = torch.ops.specwatch_cpu.prefill_attention(q, k, v, 0.125)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)


bf16 = torch.ones((2, 5, 64), dtype=torch.bfloat16)


@pytest.mark.parametrize(
    ("q", "k", "v", "message"),
    [
        (bf16.float(), bf16, bf16, "contiguous bfloat16"),
        (bf16, bf16.transpose(0, 1).contiguous().transpose(0, 1), bf16, "contiguous bfloat16"),
        (bf16, bf16[:, :4].contiguous(), bf16[:, :4].contiguous(), "as many keys as queries"),
        (torch.ones((3, 5, 64), dtype=torch.bfloat16), bf16, bf16, "multiple of key heads"),
        (bf16[..., :32].contiguous(), bf16[..., :32].contiguous(), bf16[..., :32].contiguous(), "head dim 64 or 128"),
        (bf16, bf16, bf16[:1].contiguous(), r"q \[heads, n, dim\]"),
        (bf16[:, :0], bf16[:, :0], bf16[:, :0], "as many keys as queries"),
    ],
)
def test_prefill_attention_refuses_what_it_does_not_take(q, k, v, message):
    with pytest.raises(RuntimeError, match=message):
        torch.ops.specwatch_cpu.prefill_attention(q, k, v, 0.125)


@pytest.fixture(scope="module")
def model():
    """bf16 Llama with heads of 64 (the kernel's size): 4 query heads over 2 key heads."""
    return tiny_llama(seed=21, layers=2, hidden=256).to(torch.bfloat16)


def prompt_and_greedy(decoder: LlamaDecoder, prompt: torch.Tensor, steps: int) -> tuple[torch.Tensor, list[int]]:
    decoder.reset(prompt.shape[0] + steps + 1)
    first = logits = decoder.forward(prompt, keep=1)
    tokens = []
    for _ in range(steps):
        tokens.append(int(logits[-1].argmax()))
        logits = decoder.forward(torch.tensor([tokens[-1]]))
    return first, tokens


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_the_decoders_prompt_attends_by_the_kernel_as_by_torchs(model, compiled):
    kernel, reference = LlamaDecoder(model, for_compile=compiled), LlamaDecoder(model)
    assert kernel.prefill_kernel
    reference.prefill_kernel = False
    if compiled:
        kernel.compiled = True
        warm_up(kernel)
    prompt = torch.randint(0, 256, (150,), generator=torch.Generator().manual_seed(8))
    with torch.profiler.profile() as profile:
        got, got_tokens = prompt_and_greedy(kernel, prompt, 20)
    want, want_tokens = prompt_and_greedy(reference, prompt, 20)
    calls = {event.key: event.count for event in profile.key_averages()}
    assert calls.get("specwatch_cpu::prefill_attention") == 2  # once a layer, the prompt only
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
    assert got_tokens == want_tokens
