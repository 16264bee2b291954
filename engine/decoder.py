"""Forward passes with a KV cache: the one thing the speculative loop needs from a model.

A `Decoder` turns `n` new tokens into `n` rows of logits and keeps their keys and
values, and can `crop` its cache back to a prefix after a rejected draft.

- `LlamaDecoder` is the fast path for Llama-architecture models (SmolLM2, Llama,
  Mistral without sliding window): fused QKV and gate/up projections, a KV cache
  pre-allocated once per request, torch's fused attention, no per-step Python
  objects. It reads its weights from the HF model (shared, not copied) and can run
  only the first `k` layers, which is what the early-exit drafter is.
- `HFDecoder` runs any other causal LM through transformers with a `DynamicCache`.
"""

from __future__ import annotations

import weakref
from typing import Protocol

import torch
import torch.nn.functional as F
from transformers import DynamicCache, PreTrainedModel


class Decoder(Protocol):
    vocab_size: int

    def reset(self, max_len: int) -> None: ...
    def forward(self, tokens: torch.Tensor, keep: int = 0) -> torch.Tensor: ...
    def crop(self, length: int) -> None: ...
    @property
    def length(self) -> int: ...


def make_decoder(model: PreTrainedModel, num_layers: int | None = None) -> Decoder:
    """The fast Llama path when the architecture allows it, else transformers' own forward."""
    if LlamaDecoder.supports(model):
        return LlamaDecoder(model, num_layers)
    if num_layers is not None:
        raise ValueError(f"early exit needs a Llama-architecture target, not {model.config.model_type!r}")
    return HFDecoder(model)


class _Layer:
    __slots__ = ("attn_norm", "wqkv", "bqkv", "wo", "mlp_norm", "w_gate_up", "w_down")

    def __init__(self, layer: torch.nn.Module) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        self.attn_norm = layer.input_layernorm.weight
        self.wqkv = _fuse([attn.q_proj, attn.k_proj, attn.v_proj], "weight")
        self.bqkv = _fuse([attn.q_proj, attn.k_proj, attn.v_proj], "bias") if attn.q_proj.bias is not None else None
        self.wo = attn.o_proj.weight
        self.mlp_norm = layer.post_attention_layernorm.weight
        self.w_gate_up = _fuse([mlp.gate_proj, mlp.up_proj], "weight")
        self.w_down = mlp.down_proj.weight


# first module of a fused group -> {"weight" | "bias": fused tensor}; a second decoder reuses it
_FUSED: weakref.WeakKeyDictionary[torch.nn.Module, dict[str, torch.Tensor]] = weakref.WeakKeyDictionary()


def _fuse(linears: list[torch.nn.Linear], attr: str) -> torch.Tensor:
    """Concatenate parameters into one tensor and make the modules views of it (no second copy)."""
    fused_of = _FUSED.setdefault(linears[0], {})
    if attr not in fused_of:
        fused = torch.cat([getattr(linear, attr).detach() for linear in linears]).contiguous()
        start = 0
        for linear in linears:
            rows = getattr(linear, attr).shape[0]
            getattr(linear, attr).data = fused[start : start + rows]
            start += rows
        fused_of[attr] = fused
    return fused_of[attr]


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

    def __init__(self, model: PreTrainedModel, num_layers: int | None = None) -> None:
        cfg = model.config
        total = cfg.num_hidden_layers
        if num_layers is not None and not 1 <= num_layers <= total:
            raise ValueError(f"early exit after {num_layers} layers: the model has {total}")
        inner = model.model
        self.layers = [_Layer(layer) for layer in inner.layers[: num_layers or total]]
        self.embed = inner.embed_tokens.weight
        self.final_norm = inner.norm.weight
        self.lm_head = model.lm_head.weight
        self.eps = cfg.rms_norm_eps
        self.n_heads = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads
        self.vocab_size = self.lm_head.shape[0]
        self.dtype = self.embed.dtype
        self.device = self.embed.device
        self.rope_theta = (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta", getattr(cfg, "rope_theta", 10000.0))
        self._len = 0
        self.k_cache: list[torch.Tensor] = []
        self.v_cache: list[torch.Tensor] = []

    def reset(self, max_len: int) -> None:
        """Allocate the KV cache and rotary tables for a request of up to `max_len` tokens."""
        shape = (1, self.n_kv, max_len, self.head_dim)
        if not self.k_cache or self.k_cache[0].shape[2] < max_len:
            self.k_cache = [torch.empty(shape, dtype=self.dtype, device=self.device) for _ in self.layers]
            self.v_cache = [torch.empty(shape, dtype=self.dtype, device=self.device) for _ in self.layers]
            self.cos, self.sin = self._rope_tables(max_len)
        self._len = 0

    def _rope_tables(self, max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        # Same arithmetic as transformers' default rotary embedding, so fp32 logits match it.
        inv_freq = 1.0 / (self.rope_theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.int64).float() / self.head_dim))
        freqs = torch.outer(torch.arange(max_len, dtype=torch.float32), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1).to(self.device)
        return emb.cos().to(self.dtype), emb.sin().to(self.dtype)

    @property
    def length(self) -> int:
        return self._len

    def crop(self, length: int) -> None:
        self._len = min(self._len, length)  # entries past `length` are overwritten later

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, keep: int = 0) -> torch.Tensor:
        """Logits [n, vocab] for `tokens` [n] placed after the cached prefix (the last `keep` rows if keep > 0)."""
        start, n = self._len, tokens.shape[0]
        end = start + n
        if end > self.k_cache[0].shape[2]:
            raise RuntimeError(f"KV cache holds {self.k_cache[0].shape[2]} tokens, asked for {end}")
        x = F.embedding(tokens, self.embed).unsqueeze(0)  # [1, n, hidden]
        cos, sin = self.cos[start:end], self.sin[start:end]
        mask = None if n == 1 else self._causal_mask(start, n)
        for i, layer in enumerate(self.layers):
            x = x + self._attention(layer, self._rms_norm(x, layer.attn_norm), i, start, end, cos, sin, mask)
            x = x + self._mlp(layer, self._rms_norm(x, layer.mlp_norm))
        self._len = end
        if keep:
            x = x[:, -keep:]
        return _linear(self._rms_norm(x, self.final_norm), self.lm_head)[0]

    def _causal_mask(self, start: int, n: int) -> torch.Tensor:
        # query i sits at position start + i and sees keys 0 .. start + i
        keys = torch.arange(start + n, device=self.device)
        queries = torch.arange(start, start + n, device=self.device).unsqueeze(1)
        return keys <= queries

    def _rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        # normalise in float32, scale in the model dtype: transformers' LlamaRMSNorm order
        return weight * F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype)

    def _attention(self, layer: _Layer, x, i, start, end, cos, sin, mask) -> torch.Tensor:
        n = x.shape[1]
        qkv = _linear(x, layer.wqkv, layer.bqkv)
        q_size, kv_size = self.n_heads * self.head_dim, self.n_kv * self.head_dim
        qk, v = qkv.split([q_size + kv_size, kv_size], dim=-1)
        # queries and keys are rotated together: one set of rotary ops per layer
        qk = _rotate(qk.view(1, n, self.n_heads + self.n_kv, self.head_dim).transpose(1, 2), cos, sin)
        q, k = qk.split([self.n_heads, self.n_kv], dim=1)
        self.k_cache[i][:, :, start:end] = k
        self.v_cache[i][:, :, start:end] = v.view(1, n, self.n_kv, self.head_dim).transpose(1, 2)
        keys, values = self.k_cache[i][:, :, :end], self.v_cache[i][:, :, :end]
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=self.n_kv != self.n_heads)
        return _linear(out.transpose(1, 2).reshape(1, n, q_size), layer.wo)

    def _mlp(self, layer: _Layer, x: torch.Tensor) -> torch.Tensor:
        gate, up = _linear(x, layer.w_gate_up).chunk(2, dim=-1)
        return _linear(F.silu(gate) * up, layer.w_down)


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight.T; one row goes through matrix-vector (2x faster than GEMM in bf16 on CPU)."""
    if x.shape[-2] != 1 or x.device.type != "cpu":
        return F.linear(x, weight, bias)
    out = torch.mv(weight, x.reshape(-1))
    return (out if bias is None else out + bias).view(1, 1, -1)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


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
        out = self.model(input_ids=tokens.unsqueeze(0), position_ids=positions, cache=self.cache, use_cache=True, logits_to_keep=keep)
        self._len += n
        return out.logits[0]
