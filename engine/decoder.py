"""Forward passes with a KV cache: the one thing the speculative loop needs from a model.

A `Decoder` turns `n` new tokens into `n` rows of logits and keeps their keys and
values, and can `crop` its cache back to a prefix after a rejected draft.

- `LlamaDecoder` is the fast path for Llama-architecture models (SmolLM2, Llama,
  Mistral without sliding window): fused QKV and gate/up projections, a KV cache
  pre-allocated once per request, torch's fused attention, no per-step Python
  objects. It reads its weights from the HF model (fused in place, not copied) and can
  run only the first `k` layers, which is what the early-exit drafter is. On a CPU
  whose torch build has oneDNN it multiplies by a copy of the linear weights packed
  once into oneDNN's layout (`cpu_prepack`; shared by every decoder over the model)
  and attends in float32 over a float32 cache (`_cache_attention`): a bf16 decode step of
  SmolLM2-135M went from 58 to 19.5 ms on one thread of the 2-core machine. In float32 a
  single row (a plain decode step) has its own step (`LlamaDecoder._step`): it multiplies by
  the weight stored input-major (`_Matrix`; faster than the packed kernel on an AVX2 CPU without
  native bf16) with the fewest kernels a layer, and can run through torch.compile as one graph
  (`EngineConfig.compile`); so can the several rows of one sequence after its prefix (a
  verification, `LlamaDecoder._rows`), on the packed weights: 1.16-1.27x the eager forward
  for 2-9 rows at 300 tokens of context (2 threads, A/B in one process), and a whole prompt
  (`LlamaDecoder._prompt`). Compiled in bf16 (weights packed) a single row has a step of its
  own too, its products by the engine's C++ kernel where the CPU has AVX512-BF16 (`engine.kernels`),
  else reductions that Inductor writes over the [out, in] weights (`_row_times`).
  Where torch's attention kernel runs bf16 on AMX tiles, a bf16 model's cache and attention stay bf16
  (`amx_attention`).
- `HFDecoder` runs any other causal LM through transformers with a `DynamicCache`.
"""

from __future__ import annotations

import copy
import functools
import itertools
import os
import sys
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from transformers import DynamicCache, PreTrainedModel

from specwatch.engine.kernels import (
    host_features,
    lane_attention_kernel,
    prefill_attention_kernel,
    row_times_kernel,
    rows_times_kernel,
)


class Decoder(Protocol):
    vocab_size: int

    def reset(self, max_len: int) -> None: ...
    def forward(self, tokens: torch.Tensor, keep: int = 0) -> torch.Tensor: ...
    def crop(self, length: int) -> None: ...
    @property
    def length(self) -> int: ...


def make_decoder(
    model: PreTrainedModel,
    num_layers: int | None = None,
    for_compile: bool = False,
    head_rows: torch.Tensor | None = None,
) -> Decoder:
    """The fast Llama path when the architecture allows it (`for_compile`, `head_rows`: see LlamaDecoder),
    else transformers' own forward."""
    if LlamaDecoder.supports(model):
        return LlamaDecoder(model, num_layers, for_compile, head_rows)
    if num_layers is not None:
        raise ValueError(f"early exit needs a Llama-architecture target, not {model.config.model_type!r}")
    if head_rows is not None:
        kind = model.config.model_type
        raise ValueError(f"a reduced draft vocabulary needs a Llama-architecture draft, not {kind!r}")
    return HFDecoder(model)


class _Layer:
    __slots__ = ("attn_norm", "wqkv", "bqkv", "wo", "mlp_norm", "w_gate_up", "w_down")

    def __init__(self, layer: torch.nn.Module, pack: bool, columns: bool) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        self.attn_norm = layer.input_layernorm.weight
        self.wqkv = _matrix([attn.q_proj, attn.k_proj, attn.v_proj], pack, columns)
        self.bqkv = _fuse([attn.q_proj, attn.k_proj, attn.v_proj], "bias") if attn.q_proj.bias is not None else None
        self.wo = _matrix([attn.o_proj], pack, columns)
        self.mlp_norm = layer.post_attention_layernorm.weight
        self.w_gate_up = _matrix([mlp.gate_proj, mlp.up_proj], pack, columns)
        self.w_down = _matrix([mlp.down_proj], pack, columns)


class _Matrix:
    """A linear layer's weight in the layouts its products run fastest in: `packed` (oneDNN's
    blocked layout, a second copy made once) for several rows, and, where `by_columns` is set,
    one row times the weight stored input-major ([in, out] contiguous: the HF module's weight
    becomes a transposed view of it, so no copy). On the 2-core AVX2 machine (fp32, one thread)
    a decode step went from 129 to 97 ms with that (`x @ W` streams the weight in the order
    it lies; oneDNN's packed kernel and F.linear were slower for a single row); for four and
    more rows the packed kernel was as fast or faster. `few_rows`: in bf16 on a CPU without AVX512-BF16,
    up to `FEW_ROWS` rows go through the engine's `rows_times` kernel (`few_rows_kernel`)."""

    __slots__ = ("weight", "packed", "by_columns", "few_rows")

    def __init__(
        self, weight: torch.Tensor, packed: torch.Tensor | None, by_columns: torch.Tensor | None, few_rows: bool
    ) -> None:
        self.weight, self.packed, self.by_columns, self.few_rows = weight, packed, by_columns, few_rows

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x @ weight.T (+ bias)."""
        if self.few_rows and x.numel() <= FEW_ROWS * x.shape[-1]:
            rows = torch.ops.specwatch_cpu.rows_times(x.reshape(-1, x.shape[-1]), self.weight)
            out = rows.view(*x.shape[:-1], rows.shape[-1])
        elif x.shape[-2] == 1 and self.by_columns is not None:
            out = torch.matmul(x, self.by_columns)
        elif self.packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, bias, "none", [], "")
        elif x.shape[-2] == 1 and x.device.type == "cpu":  # matrix-vector: 2x faster than GEMM in bf16 on CPU
            out = torch.mv(self.weight, x.reshape(-1)).view(1, 1, -1)
        else:
            return F.linear(x, self.weight, bias)
        return out if bias is None else out + bias


# first module of a fused group -> {"weight" | "bias" | "matrix": ...}; a second decoder reuses them
_FUSED: weakref.WeakKeyDictionary[torch.nn.Module, dict] = weakref.WeakKeyDictionary()


def _fuse(linears: list[torch.nn.Linear], attr: str, by_columns: bool = False) -> torch.Tensor:
    """Concatenate parameters into one tensor and make the modules views of it (no second copy).
    `by_columns`: the fused weight is stored input-major ([in, out] contiguous) and returned as
    its transposed view, so `.t()` of the result is the contiguous input-major matrix."""
    fused_of = _FUSED.setdefault(linears[0], {})
    if attr not in fused_of:
        parts = [getattr(linear, attr).detach() for linear in linears]
        fused = torch.cat(parts).t().contiguous().t() if by_columns else _cat(parts).contiguous()
        start = 0
        for linear in linears:
            rows = getattr(linear, attr).shape[0]
            getattr(linear, attr).data = fused[start : start + rows]
            start += rows
        fused_of[attr] = fused
    return fused_of[attr]


def _matrix(linears: list[torch.nn.Linear], pack: bool, by_columns: bool) -> _Matrix:
    """The modules' weights fused into one `_Matrix` (shared by every decoder over these modules)."""
    cached = _FUSED.setdefault(linears[0], {})
    if "matrix" not in cached:
        dense = _fuse(linears, "weight", by_columns)
        # oneDNN picks the blocked layout for the batch size it is told; one told 1 is 2x slower at 2-8 rows
        packed = torch.ops.mkldnn._reorder_linear_weight(dense.detach(), None if by_columns else 1) if pack else None
        few_rows = dense.device.type == "cpu" and dense.dtype == torch.bfloat16 and few_rows_kernel()
        cached["matrix"] = _Matrix(dense, packed, dense.t() if by_columns else None, few_rows)
    return cached["matrix"]


FEW_ROWS = 8  # the most rows `rows_times` takes


@functools.cache
def few_rows_kernel() -> bool:
    """Whether bf16 products of up to `FEW_ROWS` rows go through the engine's `rows_times` kernel: only on a CPU
    without AVX512-BF16, where oneDNN widens bf16 to float32 too and its packed kernel takes about as long again
    for each further row, while the kernel reads each weight once for all the rows (docs/benchmarks.md has the
    figures). Where the CPU has the bf16 dot product, oneDNN's own bf16 kernels are kept."""
    return "avx512_bf16" not in host_features() and rows_times_kernel()


def _row_times(
    x: torch.Tensor, matrix: _Matrix, residual: torch.Tensor | None = None, kernel: bool = False
) -> torch.Tensor:
    """One row x [1, in] times `matrix` (+ residual), in the single-row step: float32 by the input-major
    weight (`by_columns`, the residual folded into addmm); else, under torch.compile only, over the
    [out, in] weight with float32 sums: in bf16 by the engine's C++ kernel where `kernel` (`engine.kernels`:
    the CPU's bf16 dot product, each weight row streamed in order), otherwise as a reduction that Inductor writes
    into the step's graph. On the 2-core Zen 4 EPYC (bf16, 2 threads) a token's 121 such products over
    269 MB of weights took 8.8-10.9 ms as the reduction against 14.3-17.5 ms for oneDNN's packed kernel,
    one call a product (microbench). On a 2-core AVX512-BF16 EPYC, 2 threads, 300 tokens of context, the
    whole compiled bf16 step: 8.2-10.2 ms with the kernel against 22.6-23.4 by the reduction (medians of
    30 steps, three runs each, separate processes, /tmp script); float32 keeps the reduction (14.0-17.3 ms
    against 17.1-17.4 with a float32 path of the kernel, since dropped)."""
    if matrix.by_columns is not None:
        return torch.mm(x, matrix.by_columns) if residual is None else torch.addmm(residual, x, matrix.by_columns)
    if kernel:
        out = torch.ops.specwatch_cpu.row_times(x, matrix.weight)
    else:
        out = (x.float().unsqueeze(-2) * matrix.weight.float()).sum(-1).to(x.dtype)
    return out if residual is None else residual + out


@functools.cache
def cpu_prepack(dtype: torch.dtype) -> bool:
    """Whether this torch build multiplies by pre-packed oneDNN weights on this CPU in `dtype`
    (and agrees with F.linear there). A decode step streams every weight once; oneDNN's packed
    kernels do it 2-3x faster than torch.mv/F.linear in bf16 (one thread, 49152x576 lm_head:
    2.5 against 9.5 and 5.1 ms; bench/vs_vllm.py shows the whole step)."""
    if dtype not in (torch.bfloat16, torch.float32) or not torch.backends.mkldnn.is_available():
        return False
    try:
        weight, x = torch.randn(48, 32).to(dtype), torch.randn(1, 3, 32).to(dtype)
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, 1)
        got = torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
        return torch.allclose(got.float(), F.linear(x, weight).float(), rtol=2e-2, atol=2e-2)
    except (RuntimeError, AttributeError, NotImplementedError):
        return False


# Several rows of one sequence through torch.compile (`LlamaDecoder._rows_layers`) multiply by the
# packed weights through this opaque op: Inductor's own lowering of mkldnn._linear_pointwise takes
# only weights frozen into the graph as constants, and MKL's sgemm (what it picks for float32 when
# they are) ran 9 rows 2.7x slower than oneDNN on the AVX2 EPYC. Inductor fuses what lies between.
_LIBRARY = torch.library.Library("specwatch", "DEF")
_LIBRARY.define("packed_linear(Tensor x, Tensor packed) -> Tensor")


def _packed_linear(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")


for _key in ("CPU", "MkldnnCPU"):  # x is dense, the packed weight an opaque oneDNN tensor
    _LIBRARY.impl("packed_linear", _packed_linear, _key)


@torch.library.register_fake("specwatch::packed_linear")
def _packed_linear_shape(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], packed.shape[0]))


# Several sequences' rows through one compiled graph (`LlamaDecoder._batch_layers`) attend through this
# op, so that how it attends can follow the lengths at hand (`_attention_plan`): lanes next to each other
# whose prefixes are alike attend in one call, padded to the group's most rows and longest prefix; a lane
# far longer or shorter than its neighbours gets a call of its own.
_LIBRARY.define("lane_attention(Tensor q, Tensor keys, Tensor values, Tensor bounds) -> Tensor")


@dataclass(frozen=True)
class _Group:
    """One attention call over lanes lo .. hi - 1: `width` query rows each, keys 0 .. `length` - 1.
    `block`: q's rows that the call takes as they lie (one lane, or one row in every lane), else `rows`
    (q's rows) go to `slots` (lane-major places in the call)."""

    lo: int
    hi: int
    width: int
    length: int
    mask: torch.Tensor | None
    causal: bool
    block: slice | None
    rows: torch.Tensor | None
    slots: torch.Tensor | None


# microseconds of one attention call, and per lane and key for one query row, and for w > 1 rows
# _KEY_US_ROWS + w * _KEY_US_ROW (torch's fused CPU kernel in bf16 on the AMX Xeon, 2 threads, Python
# included: one row is 2-3x cheaper a key than two to nine)
_CALL_US, _KEY_US, _KEY_US_ROWS, _KEY_US_ROW = 30.0, 0.05, 0.1, 0.006
_last_plan: tuple[tuple, list[_Group]] | None = None  # every layer of a forward attends with the same plan


def _lane_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bounds: torch.Tensor) -> torch.Tensor:
    """q [rows, heads, dim]; keys, values [lane, kv head, position, dim]; bounds: (lane, start, n) per
    sequence, its n rows next in q, at positions start.., each seeing keys 0 .. its own position. By the
    engine's C++ kernel over a float32 pool where it is built (8 slots of 150-1,250 tokens, one row each:
    100 against 353 us a layer on the 2-core AVX512-BF16 EPYC, 2 threads, warm cache), else by torch's."""
    if _by_lane_kernel(keys, int(bounds[:, 2].max())):
        return torch.ops.specwatch_cpu.lane_attention(q.contiguous(), keys, values, bounds)
    return _lane_attention_by_torch(q, keys, values, bounds)


KERNEL_ROWS = 16  # a sequence's rows up to which the lane kernel attends (it reads the prefix once a row)


def _by_lane_kernel(keys: torch.Tensor, most_rows: int) -> bool:
    """Whether the lane kernel attends over this cache: a float32 one in CPU memory with heads it takes,
    sequences of decode or verification rows (a prompt chunk of hundreds of rows goes to torch's flash kernel,
    which reads each block of keys once for a block of rows)."""
    return (
        _lane_kernel_takes(keys.device, keys.dtype, keys.shape[-1])
        and keys.is_contiguous()
        and most_rows <= KERNEL_ROWS
        and lane_attention_kernel()
    )


def _lane_kernel_takes(device: torch.device, cache_dtype: torch.dtype, head_dim: int) -> bool:
    """Caches the lane kernel attends over: float32, in CPU memory, heads of 64 or 128."""
    return device.type == "cpu" and cache_dtype == torch.float32 and head_dim in (64, 128)


def _cache_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int) -> torch.Tensor:
    """q [n, heads, dim]: one sequence's rows at positions start.., its cache keys, values [1, kv head, position,
    dim] written through start + n; each row over keys 0 .. its own position (`_lane_attention` for one lane).
    In the cache's dtype: float32 on CPU whatever the model's (torch's CPU kernel is several times slower in bf16
    than in float32, conversions included: 275 against 39 us for one query over 200 keys on an AVX2 CPU; and
    float32 is the more exact of the two), but where `amx_attention` holds. Decode and verification rows by the
    lane kernel where it runs (one row over 300 keys 8 against 28 us, 9 rows over 1,000 keys 155 against 242 us,
    2-core AVX512-BF16 EPYC; each row alike however many come along), else and for prompts by torch's."""
    n = q.shape[0]
    if _by_lane_kernel(keys, n):
        return torch.ops.specwatch_cpu.lane_attention(q.contiguous(), keys, values, torch.tensor([[0, start, n]]))
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0),
        keys[:, :, : start + n],
        values[:, :, : start + n],
        attn_mask=_causal_mask(start, n, q.device),
        is_causal=start == 0 and n > 1,
        enable_gqa=q.shape[1] != keys.shape[1],
    )
    return out[0].transpose(0, 1)


def _lane_attention_by_torch(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bounds: torch.Tensor
) -> torch.Tensor:
    """`_lane_attention` in as few calls of torch's fused kernel as `_attention_plan` finds."""
    groups = _attention_plan(tuple(map(tuple, bounds.tolist())), q.device)
    if len(groups) == 1 and groups[0].block == slice(0, q.shape[0]):
        return _attend_group(q, keys, values, groups[0])
    out = torch.empty_like(q)
    for group in groups:
        if group.block is not None:
            out[group.block] = _attend_group(q[group.block], keys, values, group)
        else:
            queries = q.new_zeros((group.hi - group.lo) * group.width, *q.shape[1:])
            queries[group.slots] = q[group.rows]
            out[group.rows] = _attend_group(queries, keys, values, group)[group.slots]
    return out


def _attend_group(queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, group: _Group) -> torch.Tensor:
    """Attention of `queries` [lanes * width, heads, dim] (lane-major) over the group's lanes and keys."""
    lanes = group.hi - group.lo
    out = F.scaled_dot_product_attention(
        queries.view(lanes, group.width, *queries.shape[1:]).transpose(1, 2),
        keys[group.lo : group.hi, :, : group.length],
        values[group.lo : group.hi, :, : group.length],
        attn_mask=group.mask,
        is_causal=group.causal,
        enable_gqa=queries.shape[1] != keys.shape[1],
    )
    return out.transpose(1, 2).reshape(queries.shape)


def _attention_plan(seqs: tuple[tuple[int, int, int], ...], device: torch.device) -> list[_Group]:
    """The calls `_lane_attention` makes for `seqs` (lane, start, n): lanes split into runs of
    neighbouring lanes, the split that costs least by `_CALL_US` and `_KEY_US` (a run pads its lanes to
    its most rows and longest prefix; a lane in the run that attends nothing this time costs its padding)."""
    global _last_plan
    plan = _last_plan
    if plan is not None and plan[0] == (seqs, device):
        return plan[1]
    by_lane = {lane: (start, n) for lane, start, n in seqs}
    order = sorted(by_lane)

    def cost(i: int, j: int) -> float:  # one call over lanes order[i] .. order[j - 1]
        width, length = _extent(order[i:j], by_lane)
        per_key = _KEY_US if width == 1 else _KEY_US_ROWS + width * _KEY_US_ROW
        return _CALL_US + (order[j - 1] - order[i] + 1) * length * per_key

    best, cut = [0.0] + [float("inf")] * len(order), [0] * (len(order) + 1)
    for j in range(1, len(order) + 1):
        for i in range(j):
            if best[i] + cost(i, j) < best[j]:
                best[j], cut[j] = best[i] + cost(i, j), i
    runs, j = [], len(order)
    while j:
        runs.append(order[cut[j] : j])
        j = cut[j]
    offsets = dict(zip([lane for lane, _, _ in seqs], itertools.accumulate([n for *_, n in seqs], initial=0)))
    groups = [_group(run, by_lane, offsets, device) for run in reversed(runs)]
    _last_plan = ((seqs, device), groups)
    return groups


def _extent(run: list[int], by_lane: dict) -> tuple[int, int]:
    """A call's query rows a lane and keys: the run's most rows and longest prefix (by_lane: lane -> (start, n))."""
    return max(by_lane[lane][1] for lane in run), max(sum(by_lane[lane]) for lane in run)


def _group(run: list[int], by_lane: dict, offsets: dict, device: torch.device) -> _Group:
    """The call over lanes run[0] .. run[-1] (see `_Group`)."""
    lo, hi = run[0], run[-1] + 1
    width, length = _extent(run, by_lane)
    if len(run) == 1:  # one sequence: its own causal mask, or the kernel's causal flag from position 0
        start, n = by_lane[lo]
        rows = slice(offsets[lo], offsets[lo] + n)
        return _Group(lo, hi, n, length, _causal_mask(start, n, device), start == 0 and n > 1, rows, None, None)
    starts = torch.zeros(hi - lo, dtype=torch.long)  # a lane not in the run sees key 0 on (computed, dropped)
    starts[[lane - lo for lane in run]] = torch.tensor([by_lane[lane][0] for lane in run])
    reach = starts[:, None] + torch.arange(width)  # [lane, row]: its last visible key
    mask = (torch.arange(length) <= reach[..., None]).unsqueeze(1).to(device)
    if width == 1 and bool((reach == length - 1).all()):
        mask = None  # every row sees every key: one row a lane, all as long
    rows = [offsets[lane] + r for lane in run for r in range(by_lane[lane][1])]
    slots = [(lane - lo) * width + r for lane in run for r in range(by_lane[lane][1])]
    if rows == list(range(rows[0], rows[0] + len(rows))) and slots == list(range((hi - lo) * width)):
        return _Group(lo, hi, width, length, mask, False, slice(rows[0], rows[-1] + 1), None, None)
    index = functools.partial(torch.tensor, dtype=torch.long, device=device)
    return _Group(lo, hi, width, length, mask, False, None, index(rows), index(slots))


_LIBRARY.impl("lane_attention", _lane_attention, "CPU")
_LIBRARY.define("cache_attention(Tensor q, Tensor keys, Tensor values, SymInt start) -> Tensor")
_LIBRARY.impl("cache_attention", _cache_attention, "CPU")


# a head -> {its rows: a head of those rows}; every decoder (slot) over the same draft shares one
_REDUCED: weakref.WeakKeyDictionary[torch.nn.Module, dict[tuple[int, ...], torch.nn.Linear]] = (
    weakref.WeakKeyDictionary()
)


def _rows_of(head: torch.nn.Linear, rows: torch.Tensor) -> torch.nn.Linear:
    """A head of its own holding `rows` of `head`'s weight (a copy: the model's head stays whole)."""
    of_head = _REDUCED.setdefault(head, {})
    key = tuple(rows.tolist())
    if key not in of_head:
        weight = head.weight.detach()[rows.to(head.weight.device)].clone()
        reduced = torch.nn.Linear(weight.shape[1], len(key), bias=False, device=weight.device, dtype=weight.dtype)
        reduced.weight = torch.nn.Parameter(weight, requires_grad=False)
        of_head[key] = reduced
    return of_head[key]


@torch.library.register_fake("specwatch::lane_attention")
@torch.library.register_fake("specwatch::cache_attention")
def _lane_attention_shape(q: torch.Tensor, *_) -> torch.Tensor:
    return q.new_empty(q.shape)


class LlamaDecoder:
    """gpt-fast style decoder over a transformers Llama model's weights."""

    @staticmethod
    def supports(model: PreTrainedModel) -> bool:
        cfg = model.config
        rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
        return (
            cfg.model_type in ("llama", "mistral")
            and getattr(cfg, "sliding_window", None) is None
            and rope.get("rope_type", "default") == "default"
            and cfg.hidden_act == "silu"
            and not getattr(cfg, "mlp_bias", False)
        )

    def __init__(
        self,
        model: PreTrainedModel,
        num_layers: int | None = None,
        for_compile: bool = False,
        head_rows: torch.Tensor | None = None,
    ) -> None:
        """`head_rows`: only these rows of the head are scored (a reduced draft vocabulary, EAGLE-3's:
        logits [n, len(head_rows)], row i for token head_rows[i]).
        `for_compile`: its forwards will run through torch.compile (EngineConfig.compile), so that in
        float32 too the single-row step multiplies as in bf16, by reductions Inductor writes over the
        [out, in] weights (2-core Zen 4 EPYC, 2 threads, 300 tokens of context: 15.5-20 ms a step
        against 35-44 ms by the input-major weights). The layout is chosen by the first decoder built
        over a model's layers (every later one shares its weights)."""
        cfg = model.config
        total = cfg.num_hidden_layers
        if num_layers is not None and not 1 <= num_layers <= total:
            raise ValueError(f"early exit after {num_layers} layers: the model has {total}")
        inner = model.model
        self.embed = inner.embed_tokens.weight
        on_cpu = self.embed.device.type == "cpu"
        self.packed = on_cpu and cpu_prepack(self.embed.dtype)
        # one row times an input-major weight, where no compiled step multiplies by the packed ones' [out, in] twin
        by_columns = on_cpu and self.embed.dtype == torch.float32 and not (for_compile and self.packed)
        self.layers = [_Layer(layer, self.packed, by_columns) for layer in inner.layers[: num_layers or total]]
        self.final_norm = inner.norm.weight
        # the reduced head's module is kept: `_matrix`'s cache is keyed weakly by it
        self.head = model.lm_head if head_rows is None else _rows_of(model.lm_head, head_rows)
        self.lm_head = _matrix([self.head], self.packed, by_columns)
        self.eps = cfg.rms_norm_eps
        self.n_heads = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads
        self.vocab_size = self.head.weight.shape[0]
        self.dtype = self.embed.dtype
        self.device = self.embed.device
        # attention runs in float32 on CPU (`_cache_attention`), so the cache is kept there in float32: no
        # per-step conversion of the whole cache (3 ms a step at 1k tokens), for 2x its bf16 size;
        # except where torch's kernel runs bf16 on AMX tiles (`amx_attention`): there it stays bf16
        amx_bf16 = self.dtype == torch.bfloat16 and amx_attention()
        self.cache_dtype = torch.float32 if on_cpu and not amx_bf16 else self.dtype
        self.rope_theta = (getattr(cfg, "rope_parameters", None) or {}).get(
            "rope_theta", getattr(cfg, "rope_theta", 10000.0)
        )
        self._len = 0
        self.compiled = False  # ...run through torch.compile (set by the engine: EngineConfig.compile)
        # the compiled step multiplies by the engine's C++ kernel (`_row_times`), built now if need be
        self.row_kernel = for_compile and self.packed and self.embed.dtype == torch.bfloat16 and row_times_kernel()
        # a whole prompt attends by the engine's C++ kernel (`_prompt_attention`) where it is built, but where
        # torch's own kernel runs bf16 on AMX tiles (measured there at 3.2 ms a layer, about the same)
        self.prefill_kernel = (
            on_cpu and not amx_bf16 and self.dtype == torch.bfloat16 and self.head_dim in (64, 128)
        ) and prefill_attention_kernel()
        if _lane_kernel_takes(self.device, self.cache_dtype, self.head_dim):
            lane_attention_kernel()  # built or loaded now, not inside the first request's timed forward
        self.k_cache: list[torch.Tensor] = []
        self.v_cache: list[torch.Tensor] = []
        self.pool: CachePool | None = None  # where its cache is a lane of a pool shared with other slots
        self.lane = 0
        # the final-norm hidden states [rows, hidden] of the rows its last forward scored (a feature head's input)
        self.features: torch.Tensor | None = None
        self.features_from = 0  # the cache position of features' first row

    def reset(self, max_len: int) -> None:
        """Allocate the KV cache and rotary tables for a request of up to `max_len` tokens."""
        shape = (1, self.n_kv, max_len, self.head_dim)
        if self.pool is not None:
            self.pool.reserve(max_len)
        elif not self.k_cache or self.k_cache[0].shape[2] < max_len:

            def empty() -> torch.Tensor:
                return _fixed_heads(torch.empty(shape, dtype=self.cache_dtype, device=self.device))

            self.k_cache = [empty() for _ in self.layers]
            self.v_cache = [empty() for _ in self.layers]
            self.cos, self.sin = self._rope_tables(max_len)
        self._len = 0

    def _rope_tables(self, max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        # Same arithmetic as transformers' default rotary embedding, so fp32 logits match it.
        inv_freq = 1.0 / (
            self.rope_theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.int64).float() / self.head_dim)
        )
        freqs = torch.outer(torch.arange(max_len, dtype=torch.float32), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1).to(self.device)
        half = self.head_dim // 2
        signed_sin = torch.cat((-emb[:, :half].sin(), emb[:, half:].sin()), dim=-1)  # see `_rotate`
        cos, signed_sin = emb.cos().to(self.dtype), signed_sin.to(self.dtype)
        torch._dynamo.mark_static(cos, 1)
        torch._dynamo.mark_static(signed_sin, 1)
        return cos, signed_sin

    @property
    def length(self) -> int:
        return self._len

    @property
    def steps_alone(self) -> bool:
        """Whether a single row has its own step (`_step`): float32 on a CPU (input-major weights), or
        compiled where the weights are packed (products as reductions Inductor writes, see `_row_times`)."""
        return self.lm_head.by_columns is not None or (self.compiled and self.packed)

    @property
    def compilable(self) -> bool:
        """Whether torch.compile can take its forwards (EngineConfig.compile): float32 on a CPU (the
        single-row step) or wherever the weights are packed for oneDNN (the several-row and prompt graphs)."""
        return self.steps_alone or self.packed

    def crop(self, length: int) -> None:
        self._len = min(self._len, length)  # entries past `length` are overwritten later

    def forward(self, tokens: torch.Tensor, keep: int = 0) -> torch.Tensor:
        """Logits [n, vocab] for `tokens` [n] placed after the cached prefix (the last `keep` rows if keep > 0)."""
        return forward_batch([self], [tokens], [keep])[0]

    def shares_weights(self, other: object) -> bool:
        """Whether `other` runs the same layers and scores the same head rows (so their forwards can share
        one pass over the weights: the first decoder's head scores every row)."""
        return (
            isinstance(other, LlamaDecoder)
            and other.layers[0].wqkv is self.layers[0].wqkv
            and len(other.layers) == len(self.layers)
            and other.head is self.head
        )

    def _rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:  # one call instead of two (41 against 60 us a call here, 61 calls a step)
            return F.rms_norm(x, (x.shape[-1],), weight, eps=self.eps)
        # normalise in float32, scale in the model dtype: transformers' LlamaRMSNorm order
        return weight * F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype)

    def _attention(self, layer: _Layer, x: torch.Tensor, i: int, batch: _Batch) -> torch.Tensor:
        """Projections for all rows at once; attention per sequence, each against its own cache."""
        rows = x.shape[1]
        qkv = layer.wqkv(x, layer.bqkv)
        q_size, kv_size = self.n_heads * self.head_dim, self.n_kv * self.head_dim
        qk, v = qkv.split([q_size + kv_size, kv_size], dim=-1)
        # queries and keys are rotated together: one set of rotary ops per layer
        qk = _rotate(qk.view(1, rows, self.n_heads + self.n_kv, self.head_dim).transpose(1, 2), batch.cos, batch.sin)
        q, k = qk.split([self.n_heads, self.n_kv], dim=1)
        v = v.view(1, rows, self.n_kv, self.head_dim).transpose(1, 2)
        outs = []
        for seq in batch.seqs:
            k_cache, v_cache = seq.decoder.k_cache[i], seq.decoder.v_cache[i]
            k_cache[:, :, seq.start : seq.end] = k[:, :, seq.rows]
            v_cache[:, :, seq.start : seq.end] = v[:, :, seq.rows]
            if seq.causal and self.prefill_kernel:
                outs.append(self._prompt_attention(q[0, :, seq.rows], k[0, :, seq.rows], v[0, :, seq.rows])[None])
                continue
            out = _cache_attention(q[0, :, seq.rows].transpose(0, 1).to(k_cache.dtype), k_cache, v_cache, seq.start)
            outs.append(out.to(q.dtype).transpose(0, 1).unsqueeze(0))
        out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)
        return layer.wo(out.transpose(1, 2).reshape(1, rows, q_size))

    def _mlp(self, layer: _Layer, x: torch.Tensor) -> torch.Tensor:
        gate, up = layer.w_gate_up(x).chunk(2, dim=-1)
        return layer.w_down(F.silu(gate).mul_(up))

    def _step(self, token: torch.Tensor) -> torch.Tensor:
        """Logits [1, vocab] for one token after the cached prefix (`steps_alone`): the plain decode
        step with the fewest kernels a layer (`_step_layers`, products by `_row_times`), through
        torch.compile as one graph where `compiled` is set (EngineConfig.compile, `warm_up`)."""
        return self._advance(_compiled_step() if self.compiled else LlamaDecoder._step_layers, token)

    def _rows(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits [n, vocab] for n > 1 tokens after a cached prefix (a verification), through the
        compiled `_rows_layers`."""
        return self._advance(_compiled_rows(), tokens)

    def _prompt(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits [1, vocab] of a prompt's last token, the prompt fed from position 0, through the
        compiled `_prompt_layers`."""
        return self._advance(_compiled_prompt(), tokens)

    def _advance(self, layers, tokens: torch.Tensor) -> torch.Tensor:
        """`layers(self, tokens, position)`'s logits; its states kept (`features`), the cache advanced."""
        pos, n = self._len, tokens.shape[0]
        if pos + n > self.k_cache[0].shape[2]:
            raise RuntimeError(f"KV cache holds {self.k_cache[0].shape[2]} tokens, asked for {pos + n}")
        logits, self.features = layers(self, tokens, pos)
        self._len = pos + n
        self.features_from = self._len - self.features.shape[0]
        return logits

    def _step_layers(self, token: torch.Tensor, pos: int) -> torch.Tensor:
        """The weights are streamed as in `forward_batch`; what goes is per-kernel overhead (a
        third of a 60 ms step on the 2-core AVX2 machine): residual adds folded into the products,
        no layout changes between them, one roll for the rotary embedding."""
        heads, kv, dim = self.n_heads, self.n_kv, self.head_dim
        cos, signed_sin = self.cos[pos : pos + 1], self.sin[pos : pos + 1]  # slices: `pos` stays symbolic
        times = functools.partial(_row_times, kernel=self.row_kernel)
        x = self.embed[token]  # [1, hidden]
        for i, layer in enumerate(self.layers):
            qkv = times(self._rms_norm(x, layer.attn_norm), layer.wqkv)[0]
            if layer.bqkv is not None:
                qkv = qkv + layer.bqkv
            qk = _rotate(qkv[: (heads + kv) * dim].view(heads + kv, dim), cos, signed_sin)
            keys, values = self.k_cache[i], self.v_cache[i]  # [1, kv, max_len, dim], the cache's dtype
            keys[0, :, pos : pos + 1] = qk[heads:].unsqueeze(1).to(keys.dtype)
            values[0, :, pos : pos + 1] = qkv[(heads + kv) * dim :].view(kv, 1, dim).to(keys.dtype)
            out = torch.ops.specwatch.cache_attention(qk[:heads].view(1, heads, dim).to(keys.dtype), keys, values, pos)
            x = times(out.to(x.dtype).view(1, heads * dim), layer.wo, x)
            gate, up = times(self._rms_norm(x, layer.mlp_norm), layer.w_gate_up).chunk(2, dim=-1)
            x = times(F.silu(gate).mul_(up), layer.w_down, x)
        states = self._rms_norm(x, self.final_norm)
        return times(states, self.lm_head), states

    def _rows_layers(self, tokens: torch.Tensor, pos: int) -> torch.Tensor:
        """`forward_batch` for one sequence's rows at cache positions pos.., written for torch.compile:
        the products on the packed weights (`packed_linear`), everything between them fused by
        Inductor (eager, the norms, rotary, residual and mask kernels cost a third of a 9-row forward
        on the 2-core AVX2 machine); attention by `specwatch::cache_attention`."""
        states = self._rms_norm(self._cached_rows(tokens, pos, prompt=False), self.final_norm)
        return torch.ops.specwatch.packed_linear(states, self.lm_head.packed), states

    def _prompt_layers(self, tokens: torch.Tensor, pos: int) -> torch.Tensor:
        """`_rows_layers` for a prompt (pos 0), keeping only its last row's logits: attention by the engine's
        prompt kernel where it runs (`_prompt_attention`), one row through the head instead of all."""
        states = self._rms_norm(self._cached_rows(tokens, pos, prompt=True)[-1:], self.final_norm)
        return torch.ops.specwatch.packed_linear(states, self.lm_head.packed), states

    def _cached_rows(self, tokens: torch.Tensor, pos: int, prompt: bool) -> torch.Tensor:
        """Hidden states of `tokens` at cache positions pos.. after every layer, their keys and values
        cached; `prompt`: a whole prompt from position 0."""
        heads, kv, dim, n = self.n_heads, self.n_kv, self.head_dim, tokens.shape[0]
        linear = torch.ops.specwatch.packed_linear
        cos, signed_sin = self.cos[pos : pos + n], self.sin[pos : pos + n]
        x = self.embed[tokens]  # [n, hidden]
        for i, layer in enumerate(self.layers):
            qkv = self._packed_qkv(layer, x)
            qk = _rotate(qkv[:, : (heads + kv) * dim].view(n, heads + kv, dim).transpose(0, 1), cos, signed_sin)
            new_values = qkv[:, (heads + kv) * dim :].view(n, kv, dim).transpose(0, 1)
            keys, values = self.k_cache[i], self.v_cache[i]  # [1, kv, max_len, dim], the cache's dtype
            keys[0, :, pos : pos + n] = qk[heads:].to(keys.dtype)
            values[0, :, pos : pos + n] = new_values.to(keys.dtype)
            if prompt and self.prefill_kernel:
                out = self._prompt_attention(qk[:heads], qk[heads:], new_values).transpose(0, 1)
            else:
                out = torch.ops.specwatch.cache_attention(qk[:heads].transpose(0, 1).to(keys.dtype), keys, values, pos)
            x = self._packed_mlp(layer, x + linear(out.to(x.dtype).reshape(n, heads * dim), layer.wo.packed))
        return x

    def _prompt_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal attention [heads, n, dim] of a prompt's queries [heads, n, dim] over its own keys and values
        [kv heads, n, dim], from position 0, in bf16 by the engine's C++ kernel (`prefill_kernel`). On the 2-core
        AVX512-BF16 EPYC, 2 threads, 9 heads over 3: 1,207 tokens 2.96 against 13.1 ms a layer for torch's
        float32 kernel (torch's bf16 one, without AMX, is no faster), 300 tokens 0.26 against 1.59 ms."""
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        return torch.ops.specwatch_cpu.prefill_attention(q, k, v, self.head_dim**-0.5)

    def _packed_qkv(self, layer: _Layer, x: torch.Tensor) -> torch.Tensor:
        qkv = torch.ops.specwatch.packed_linear(self._rms_norm(x, layer.attn_norm), layer.wqkv.packed)
        return qkv if layer.bqkv is None else qkv + layer.bqkv

    def _packed_mlp(self, layer: _Layer, x: torch.Tensor) -> torch.Tensor:
        """x plus the MLP of x, on the packed weights (the compiled several-row forwards)."""
        linear = torch.ops.specwatch.packed_linear
        gate, up = linear(self._rms_norm(x, layer.mlp_norm), layer.w_gate_up.packed).chunk(2, dim=-1)
        return x + linear(F.silu(gate) * up, layer.w_down.packed)

    def _batch_layers(
        self,
        tokens: torch.Tensor,
        lanes: torch.Tensor,
        positions: torch.Tensor,
        bounds: torch.Tensor,
        kept: torch.Tensor,
    ) -> torch.Tensor:
        """`_rows_layers` for the rows of several sequences, each in its own lane of `self.pool`:
        row r goes to lane lanes[r] at cache position positions[r]; `bounds` holds each sequence's
        (lane, first position, rows), its rows consecutive in that order. The products take every
        row at once; attention runs per sequence on its own prefix (`specwatch::lane_attention`).
        Logits of the rows `kept` only (a prompt needs its last row's: the head of all 300 rows of a
        prompt would cost as much as their layers)."""
        heads, kv, dim, n = self.n_heads, self.n_kv, self.head_dim, tokens.shape[0]
        linear, attention, pool = torch.ops.specwatch.packed_linear, torch.ops.specwatch.lane_attention, self.pool
        cos, signed_sin = pool.cos[positions].unsqueeze(1), pool.sin[positions].unsqueeze(1)
        x = self.embed[tokens]  # [n, hidden]
        for i, layer in enumerate(self.layers):
            qkv = self._packed_qkv(layer, x)
            qk = _rotate(qkv[:, : (heads + kv) * dim].view(n, heads + kv, dim), cos, signed_sin)
            pool.k[i][lanes, :, positions] = qk[:, heads:].to(pool.k[i].dtype)
            pool.v[i][lanes, :, positions] = qkv[:, (heads + kv) * dim :].view(n, kv, dim).to(pool.v[i].dtype)
            out = attention(qk[:, :heads].to(pool.k[i].dtype), pool.k[i], pool.v[i], bounds).to(x.dtype)
            x = self._packed_mlp(layer, x + linear(out.reshape(n, heads * dim), layer.wo.packed))
        states = self._rms_norm(x[kept], self.final_norm)
        return linear(states, self.lm_head.packed), states


class CachePool:
    """The KV caches of a server's slots as one tensor per layer [lane, kv head, position, head dim],
    so that one compiled forward (`LlamaDecoder._batch_layers`) verifies every slot's rows together,
    its attention included. Each slot's decoder keeps its lane as tensors over the pool's storage
    (not views: torch.compile rebuilds a view input from its base on every call). Lanes grow
    together, to the longest request any of them has held."""

    def __init__(self, decoders: Sequence[LlamaDecoder]) -> None:
        if len({id(d) for d in decoders}) != len(decoders) or not all(decoders[0].shares_weights(d) for d in decoders):
            raise ValueError("a cache pool's decoders are distinct and share one model's weights")
        self.decoders = list(decoders)
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        self.max_len = 0
        for lane, decoder in enumerate(self.decoders):
            decoder.pool, decoder.lane = self, lane

    def reserve(self, max_len: int) -> None:
        """Room for `max_len` positions in every lane: a longer pool, what the lanes hold copied over."""
        if max_len <= self.max_len:
            return
        lead, held = self.decoders[0], self.max_len
        shape = (len(self.decoders), lead.n_kv, max_len, lead.head_dim)

        def grown(old: torch.Tensor | None) -> torch.Tensor:
            # zeros, not empty: a lane's padding rows read keys past its prefix (masked, but NaN * 0 is NaN)
            new = _fixed_heads(torch.zeros(shape, dtype=lead.cache_dtype, device=lead.device))
            if old is not None:
                new[:, :, :held] = old
            return new

        self.k = [grown(old) for old in self.k or [None] * len(lead.layers)]
        self.v = [grown(old) for old in self.v or [None] * len(lead.layers)]
        self.cos, self.sin = lead._rope_tables(max_len)
        self.max_len = max_len
        for decoder in self.decoders:
            decoder.k_cache = [_lane(t, decoder.lane) for t in self.k]
            decoder.v_cache = [_lane(t, decoder.lane) for t in self.v]
            decoder.cos, decoder.sin = self.cos, self.sin

    def holds(self, decoders: Sequence[LlamaDecoder]) -> bool:
        """Whether `decoders` are distinct lanes of this pool."""
        return all(d.pool is self for d in decoders) and len({d.lane for d in decoders}) == len(decoders)

    def forward(
        self, decoders: Sequence[LlamaDecoder], tokens: Sequence[torch.Tensor], keep: Sequence[int]
    ) -> list[torch.Tensor]:
        """`forward_batch` in one compiled graph; only the rows whose logits are kept go through the head."""
        lanes, positions, bounds, kept = [], [], [], []
        for decoder, ids, keep_n in zip(decoders, tokens, keep):
            start, n = decoder._len, ids.shape[0]
            if start + n > self.max_len:
                raise RuntimeError(f"KV cache holds {self.max_len} tokens, asked for {start + n}")
            kept += range(len(lanes) + n - (keep_n or n), len(lanes) + n)
            lanes += [decoder.lane] * n
            positions += range(start, start + n)
            bounds.append((decoder.lane, start, n))
        index = functools.partial(torch.tensor, dtype=torch.long, device=decoders[0].device)
        with torch.inference_mode():
            logits, states = _compiled_batch()(
                decoders[0], torch.cat(list(tokens)), index(lanes), index(positions), torch.tensor(bounds), index(kept)
            )
        sizes = [keep_n or ids.shape[0] for ids, keep_n in zip(tokens, keep)]
        for decoder, ids, rows in zip(decoders, tokens, states.split(sizes)):
            decoder._len += ids.shape[0]
            decoder.features, decoder.features_from = rows, decoder._len - rows.shape[0]
        return list(logits.split(sizes))


def _lane(pool: torch.Tensor, lane: int) -> torch.Tensor:
    """pool[lane : lane + 1] as a tensor of its own over the same storage."""
    offset = pool.storage_offset() + lane * pool.stride(0)
    return _fixed_heads(pool.new_empty(0).set_(pool.untyped_storage(), offset, (1, *pool.shape[1:]), pool.stride()))


def _fixed_heads(cache: torch.Tensor) -> torch.Tensor:
    """A KV cache [lane, kv head, position, head dim] whose head count and size Dynamo takes as
    constants (see `_mark_static`); its lanes and positions stay symbolic."""
    torch._dynamo.mark_static(cache, [1, 3])
    return cache


def _compiled(layers, **options) -> object:
    """`layers` through torch.compile (Inductor): one graph for the whole forward, its position,
    row count and cache size symbolic, so that it is compiled once and serves every request.
    Inductor keeps what it compiled on disk (TORCHINDUCTOR_CACHE_DIR, default: the engine's cache
    directory), so only the first start on a machine pays the compile."""
    from torch._inductor.runtime import cache_dir_utils

    from specwatch.engine.loading import default_cache_dir

    # imports may already have set torch's default (/tmp/torchinductor_$USER, gone after a reboot)
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR") in (None, cache_dir_utils.default_cache_dir()):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(default_cache_dir() / "inductor")
    return torch.compile(layers, dynamic=True, options=options or None)


@functools.cache
def _compiled_step():
    # Inductor stores an intermediate that reads more than one buffer (realize_acc_reads_threshold=1), so a
    # norm's output lands in memory before the products read it: by default it inlined the norm into each
    # product's loop, recomputed for every output row.
    # 2-core Zen 4 EPYC, bf16, 2 threads, 300 tokens of context, A/B in separate processes: 15.7 -> 11.9 and
    # 17.9 -> 14.4 ms a step (float32 within noise, 19.5 -> 21.1 and 18.0 -> 15.4).
    # cpp_wrapper: the graph's kernels are called from C++, not from Inductor's Python wrapper (1.6 ms a step of
    # Python in the profile); 2-core AMX Xeon, 2 threads, both variants alternating request by request in one
    # process: bf16 18.4-19.2 -> 15.7-18.6 ms a step, float32 25.3-26.9 -> 24.6-26.2
    return _compiled(LlamaDecoder._step_layers, realize_acc_reads_threshold=1, cpp_wrapper=True)


@functools.cache
def _compiled_rows():
    return _compiled(LlamaDecoder._rows_layers)


@functools.cache
def _compiled_prompt():
    return _compiled(LlamaDecoder._prompt_layers)


@functools.cache
def _compiled_batch():
    return _compiled(LlamaDecoder._batch_layers)


def warm_up(decoder: LlamaDecoder) -> float:
    """Compile `decoder`'s decode step and, where it multiplies by packed weights, its several-row
    verification and its prompt now, on a scratch request (its cache is reset): seconds taken. On the 2-core AVX2
    machine 308 s the first time, 78 s once Inductor's disk cache holds the kernels
    (Dynamo still traces both graphs on every start)."""
    _compiled_step()  # sets the cache directory
    what = "decode step, prompt and verification" if decoder.packed else "decode step"
    print(
        f"compiling the {what} (torch.compile: ~5 min on the first start on a 2-core machine, "
        f"~80 s on later ones; cache {os.environ['TORCHINDUCTOR_CACHE_DIR']}) ...",
        file=sys.stderr,
        flush=True,
    )
    started = time.monotonic()
    _mark_static(decoder)
    zeros = functools.partial(torch.zeros, dtype=torch.long, device=decoder.device)
    # sizes unlike the model's: Dynamo gives equal sizes one symbol, so 3 rows beside 3 KV heads
    # would make a graph for 3 rows only, and the first other count would compile it again mid-request
    decoder.reset(24)
    decoder.forward(zeros(3))  # positions 0-2 (0 and 1 specialise)
    decoder.forward(zeros(1))  # the compiled step, at position 3
    decoder.forward(zeros(11))  # the compiled rows, at 4-14
    if decoder.packed:
        decoder.reset(24)
        decoder.forward(zeros(13), keep=1)  # the compiled prompt
    decoder.reset(24)
    seconds = time.monotonic() - started
    print(f"{what} compiled in {seconds:.1f} s", file=sys.stderr, flush=True)
    return seconds


def _mark_static(decoder: LlamaDecoder) -> None:
    """Give Dynamo the weights' sizes as constants (as the caches' head sizes and the rotary tables'
    width): the graphs are compiled with every size symbolic, and with the hidden sizes symbolic
    Inductor wrote the single-row step's products and rotary as scalar loops."""
    matrices = [m for layer in decoder.layers for m in (layer.wqkv, layer.wo, layer.w_gate_up, layer.w_down)]
    vectors = [t for layer in decoder.layers for t in (layer.attn_norm, layer.mlp_norm, layer.bqkv) if t is not None]
    for tensor in [decoder.embed, decoder.final_norm, *vectors, *[m.weight for m in [*matrices, decoder.lm_head]]]:
        torch._dynamo.mark_static(tensor)


def pool_caches(decoders: Sequence[LlamaDecoder]) -> float:
    """Put the caches of compiled decoders (a server's slots) in one `CachePool` and compile its
    batched forward now, on scratch lanes: seconds taken (0 where there is nothing to batch)."""
    if len(decoders) < 2 or not all(d.compiled and d.packed for d in decoders):
        return 0.0
    CachePool(decoders)
    print(
        f"compiling the batched verification for {len(decoders)} slots (torch.compile: ~1.5 min on the first "
        "start on a 2-core machine, ~15 s on later ones) ...",
        file=sys.stderr,
        flush=True,
    )
    started = time.monotonic()
    # scratch lanes and sizes unlike each other and any model's head counts, so that no size is
    # specialised (see `warm_up`): 7 sequences in lanes up to 10 of 13, 29 rows of which 16 go through
    # the head, then one row each (the same graph: equal sizes still fit one compiled for unequal ones)
    scratch = [copy.copy(decoders[0]) for _ in range(13)]
    CachePool(scratch)
    zeros = functools.partial(torch.zeros, dtype=torch.long, device=decoders[0].device)
    lanes = [scratch[i] for i in (0, 2, 3, 5, 7, 8, 10)]
    for lane in lanes:
        lane.reset(53)
        lane.forward(zeros(20 + lane.lane), keep=1)
    forward_batch(lanes, [zeros(n) for n in (1, 2, 3, 1, 2, 17, 3)], [0, 0, 0, 0, 0, 4, 0])
    forward_batch(lanes, [zeros(1)] * len(lanes), [0] * len(lanes))
    seconds = time.monotonic() - started
    print(f"batched verification compiled in {seconds:.1f} s", file=sys.stderr, flush=True)
    return seconds


@dataclass(frozen=True)
class _Seq:
    decoder: LlamaDecoder
    start: int  # cache positions this pass writes: start .. end
    end: int
    offset: int  # its first row in the batch

    @property
    def causal(self) -> bool:
        """Several queries from position 0: a whole prompt (`LlamaDecoder._prompt_attention` where it runs)."""
        return self.start == 0 and self.end > 1

    @property
    def rows(self) -> slice:
        """Its rows in the batch."""
        return slice(self.offset, self.offset + self.end - self.start)


@dataclass(frozen=True)
class _Batch:
    seqs: list[_Seq]
    cos: torch.Tensor  # rotary tables, one row per batch row
    sin: torch.Tensor


def forward_many(
    decoders: Sequence[Decoder], tokens: Sequence[torch.Tensor], keep: Sequence[int] | None = None
) -> list[torch.Tensor]:
    """Logits for several sequences (each one's last keep_i rows where keep_i > 0, else all), in one
    pass over the weights when they share them (Llama fast path), else one forward each."""
    lead, keep = decoders[0], keep or [0] * len(decoders)
    if isinstance(lead, LlamaDecoder) and all(lead.shares_weights(d) for d in decoders[1:]):
        return forward_batch(decoders, tokens, keep)
    return [decoder.forward(t, k) for decoder, t, k in zip(decoders, tokens, keep)]


@torch.inference_mode()
def forward_batch(
    decoders: Sequence[LlamaDecoder], tokens: Sequence[torch.Tensor], keep: Sequence[int]
) -> list[torch.Tensor]:
    """Ragged batching: the rows of all sequences go through each weight matrix together
    (on a memory-bound decode step that costs about as much as one sequence's rows), while
    attention runs per sequence against its own KV cache. Logits [n_i, vocab] per sequence
    (its last keep_i rows if keep_i > 0). A cache is only advanced once the whole pass succeeded."""
    lead, seqs, offset = decoders[0], [], 0
    if len(decoders) == 1 and tokens[0].shape[0] == 1 and lead.steps_alone:
        return [lead._step(tokens[0])]
    if lead.compiled and lead.packed:
        alone = len(decoders) == 1
        if alone and lead._len == 0 and keep[0] == 1 and tokens[0].shape[0] > 1:
            return [lead._prompt(tokens[0])]  # a whole prompt, alone (at admission)
        if alone and lead._len > 0 and not keep[0]:
            return [lead._rows(tokens[0])]  # a verification: several rows after a prefix
        if not alone and lead.pool is not None and lead.pool.holds(decoders):
            return lead.pool.forward(decoders, tokens, keep)  # verifications, a prompt (chunk) riding along
    for decoder, ids in zip(decoders, tokens):
        start, n = decoder._len, ids.shape[0]
        if start + n > decoder.k_cache[0].shape[2]:
            raise RuntimeError(f"KV cache holds {decoder.k_cache[0].shape[2]} tokens, asked for {start + n}")
        seqs.append(_Seq(decoder, start, start + n, offset))
        offset += n
    batch = _Batch(
        seqs, _cat([s.decoder.cos[s.start : s.end] for s in seqs]), _cat([s.decoder.sin[s.start : s.end] for s in seqs])
    )
    x = F.embedding(_cat(list(tokens)), lead.embed).unsqueeze(0)  # [1, rows, hidden]
    for i, layer in enumerate(lead.layers):
        x = x + lead._attention(layer, lead._rms_norm(x, layer.attn_norm), i, batch)
        x = x + lead._mlp(layer, lead._rms_norm(x, layer.mlp_norm))
    if any(keep):  # only the last keep_i rows of each sequence go through the head
        x = _cat([x[:, s.rows.stop - k if k else s.rows.start : s.rows.stop] for s, k in zip(seqs, keep)], dim=1)
        sizes = [k or s.end - s.start for s, k in zip(seqs, keep)]
    else:
        sizes = [s.end - s.start for s in seqs]
    states = lead._rms_norm(x, lead.final_norm)  # [1, rows, hidden]
    logits, states = lead.lm_head(states)[0], states[0]
    for seq, rows in zip(seqs, states.split(sizes)):
        seq.decoder._len = seq.end
        seq.decoder.features, seq.decoder.features_from = rows, seq.end - rows.shape[0]
    return list(logits.split(sizes))


def _causal_mask(start: int, n: int, device: torch.device) -> torch.Tensor | None:
    """Query i sits at position start + i and sees keys 0 .. start + i. None where no mask is
    needed: one query sees every key, and from position 0 the kernel's own causal flag is
    exact (and skips the masked half of the work)."""
    if n == 1 or start == 0:
        return None
    keys = torch.arange(start + n, device=device)
    queries = torch.arange(start, start + n, device=device).unsqueeze(1)
    return keys <= queries


def _cat(tensors: list[torch.Tensor], dim: int = 0) -> torch.Tensor:
    return tensors[0] if len(tensors) == 1 else torch.cat(tensors, dim=dim)


@functools.cache
def amx_attention() -> bool:
    """Whether torch's CPU attention kernel multiplies bf16 on AMX tiles here (its flash kernel packs
    bf16 for oneDNN's brgemm where the CPU has AMX). There a bf16 model attends in bf16 over a bf16
    cache (2-core Xeon with AMX, 2 threads, against float32: a prompt of 1,237 tokens 3.2 against
    8.4 ms a layer; one query over a cold cache of 400 tokens 32 against 50 us, of 1,300 tokens 101
    against 185; 9 queries 86 against 115 and 278 against 368; 2 queries slower, 75 against 55 us at
    400); without AMX bf16 was no faster (Zen 4) or several times slower (AVX2)."""
    supported = getattr(torch.cpu, "_is_amx_tile_supported", None)
    return bool(supported and supported())


def _rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding: transformers' x * cos + rotate_half(x) * sin, where rotate_half(x) =
    (-x2, x1) = roll(x) * (-1, 1); the sign lives in the table (signed_sin = (-sin1, sin2)), so
    one roll instead of a negation and a concatenation, and the same products, rounded alike."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin


class HFDecoder:
    """Any transformers causal LM, through its own forward and a DynamicCache."""

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.device = model.device
        self.cache = DynamicCache(config=model.config)
        self._len = 0

    def reset(self, max_len: int) -> None:
        self.cache = DynamicCache(config=self.model.config)
        self._len = 0

    @property
    def length(self) -> int:
        return self._len

    def crop(self, length: int) -> None:
        if length < self._len:
            self.cache.crop(length - self._len)  # transformers 5: a negative count drops tokens
            self._len = length

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, keep: int = 0) -> torch.Tensor:
        n = tokens.shape[0]
        positions = torch.arange(self._len, self._len + n, device=self.device).unsqueeze(0)
        out = self.model(
            input_ids=tokens.unsqueeze(0), position_ids=positions, cache=self.cache, use_cache=True, logits_to_keep=keep
        )
        self._len += n
        return out.logits[0]
