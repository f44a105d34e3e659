"""The decoders of the disaggregated example, behind one small interface:

    first, kv = model.prefill(token_ids, on_layer)   # on_layer(i, k, v) after layer i
    state = model.start(kv)                          # kv: [(k, v)] per layer
    token = model.step(state, token)                 # one greedy decode step

k and v are (tokens, num_kv_heads, head_dim). HFLlama is transformers' LlamaForCausalLM
built from a LlamaConfig with seeded random weights (no weights are downloaded);
TinyLlama is the same architecture written here (RMSNorm, GQA attention with RoPE, SwiGLU
MLP) for machines without transformers. Both run the reference (one process) and the
disaggregated path through the same calls, so equal cache bytes give equal tokens."""
from __future__ import annotations

import dataclasses
import importlib.util
import math
from typing import Callable, List, Optional

import torch
from torch import nn

OnLayer = Optional[Callable[[int, torch.Tensor, torch.Tensor], None]]


@dataclasses.dataclass
class Shape:
    vocab: int = 256
    hidden: int = 64
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 128
    rope_theta: float = 10000.0

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


# The CI size (a few ms per prompt on a CPU) and the GPU size (16 layers,
# hidden 2048, GQA 16:4, head_dim 128).
SHAPES = {"ci": Shape(), "gpu": Shape(vocab=32000, hidden=2048, layers=16, heads=16,
                                      kv_heads=4, intermediate=5632)}


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding of x (T, H, D) at positions pos (T,), the rotate-half form."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    ang = pos.to(torch.float32)[:, None] * inv[None, :]
    cos = torch.cat([ang.cos(), ang.cos()], -1)[:, None, :].to(x.dtype)
    sin = torch.cat([ang.sin(), ang.sin()], -1)[:, None, :].to(x.dtype)
    x1, x2 = x[..., :d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def attention(q, k, v, pos):
    """Causal GQA attention: q (Tq, H, D) at positions pos, k and v (Tk, Hkv, D) from 0."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(q.shape[-1])
    keys = torch.arange(k.shape[0], device=q.device)
    scores = scores.masked_fill(keys[None, None, :] > pos[None, :, None], float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


class Block(nn.Module):
    def __init__(self, s: Shape):
        super().__init__()
        d = s.head_dim
        self.ln1 = nn.Parameter(torch.ones(s.hidden))
        self.ln2 = nn.Parameter(torch.ones(s.hidden))
        self.q = nn.Linear(s.hidden, s.heads * d, bias=False)
        self.k = nn.Linear(s.hidden, s.kv_heads * d, bias=False)
        self.v = nn.Linear(s.hidden, s.kv_heads * d, bias=False)
        self.o = nn.Linear(s.heads * d, s.hidden, bias=False)
        self.gate = nn.Linear(s.hidden, s.intermediate, bias=False)
        self.up = nn.Linear(s.hidden, s.intermediate, bias=False)
        self.down = nn.Linear(s.intermediate, s.hidden, bias=False)
        self.s = s

    def forward(self, x, pos, past=None):
        s, t = self.s, x.shape[0]
        h = rms_norm(x, self.ln1)
        q = rope(self.q(h).view(t, s.heads, s.head_dim), pos, s.rope_theta)
        k = rope(self.k(h).view(t, s.kv_heads, s.head_dim), pos, s.rope_theta)
        v = self.v(h).view(t, s.kv_heads, s.head_dim)
        if past is not None:
            k, v = torch.cat([past[0], k]), torch.cat([past[1], v])
        x = x + self.o(attention(q, k, v, pos).reshape(t, -1))
        h = rms_norm(x, self.ln2)
        return x + self.down(nn.functional.silu(self.gate(h)) * self.up(h)), k, v


class TinyLlama(nn.Module):
    def __init__(self, s: Shape):
        super().__init__()
        self.shape = s
        self.embed = nn.Embedding(s.vocab, s.hidden)
        self.blocks = nn.ModuleList([Block(s) for _ in range(s.layers)])
        self.norm = nn.Parameter(torch.ones(s.hidden))
        self.head = nn.Linear(s.hidden, s.vocab, bias=False)

    def _logits(self, x):
        return self.head(rms_norm(x[-1:], self.norm))[0]

    @torch.no_grad()
    def prefill(self, ids: List[int], on_layer: OnLayer = None):
        dev = self.embed.weight.device
        x = self.embed(torch.tensor(ids, device=dev))
        pos = torch.arange(len(ids), device=dev)
        kv = []
        for i, blk in enumerate(self.blocks):
            x, k, v = blk(x, pos)
            kv.append((k, v))
            if on_layer is not None:
                on_layer(i, k, v)
        return int(self._logits(x).argmax()), kv

    def start(self, kv):
        return {"kv": [(k, v) for k, v in kv], "length": kv[0][0].shape[0]}

    @torch.no_grad()
    def step(self, state, token: int) -> int:
        dev = self.embed.weight.device
        x = self.embed(torch.tensor([token], device=dev))
        pos = torch.tensor([state["length"]], device=dev)
        for i, blk in enumerate(self.blocks):
            x, k, v = blk(x, pos, state["kv"][i])
            state["kv"][i] = (k, v)
        state["length"] += 1
        return int(self._logits(x).argmax())


class HFLlama:
    """transformers' LlamaForCausalLM (seeded random weights). Layers are seen through
    forward hooks on the decoder layers, the cache through DynamicCache (its per-layer
    keys/values: `.layers[i]` in transformers 5, `.key_cache[i]` in 4)."""

    def __init__(self, s: Shape, device, dtype):
        from transformers import LlamaConfig, LlamaForCausalLM
        config = LlamaConfig(vocab_size=s.vocab, hidden_size=s.hidden,
                             intermediate_size=s.intermediate, num_hidden_layers=s.layers,
                             num_attention_heads=s.heads, num_key_value_heads=s.kv_heads,
                             max_position_embeddings=8192)
        self.shape = s
        # Built on the CPU in float32 (the same weights wherever it runs), then moved.
        self.model = LlamaForCausalLM(config).to(device=device, dtype=dtype).eval()
        self.device = torch.device(device)

    @staticmethod
    def _layer_kv(cache, i):
        if hasattr(cache, "layers"):
            k, v = cache.layers[i].keys, cache.layers[i].values
        elif hasattr(cache, "key_cache"):
            k, v = cache.key_cache[i], cache.value_cache[i]
        else:
            k, v = cache[i]
        return k[0].transpose(0, 1), v[0].transpose(0, 1)  # (1, H, T, D) -> (T, H, D)

    @torch.no_grad()
    def prefill(self, ids: List[int], on_layer: OnLayer = None):
        from transformers import DynamicCache
        cache = DynamicCache()
        hooks = []
        if on_layer is not None:
            for i, layer in enumerate(self.model.model.layers):
                hooks.append(layer.register_forward_hook(
                    lambda _m, _a, _o, i=i: on_layer(i, *self._layer_kv(cache, i))))
        try:
            out = self.model(input_ids=torch.tensor([ids], device=self.device),
                             past_key_values=cache, use_cache=True)
        finally:
            for h in hooks:
                h.remove()
        kv = [self._layer_kv(cache, i) for i in range(self.shape.layers)]
        return int(out.logits[0, -1].argmax()), kv

    def start(self, kv):
        from transformers import DynamicCache
        cache = DynamicCache()
        for i, (k, v) in enumerate(kv):
            cache.update(k.transpose(0, 1)[None], v.transpose(0, 1)[None], i)
        return cache

    @torch.no_grad()
    def step(self, state, token: int) -> int:
        out = self.model(input_ids=torch.tensor([[token]], device=self.device),
                         past_key_values=state, use_cache=True)
        return int(out.logits[0, -1].argmax())


def have_transformers() -> bool:
    return importlib.util.find_spec("transformers") is not None


def build(kind: str, shape: Shape, device: str, dtype, seed: int):
    """The model of `kind` ("hf", "tiny", "auto": hf where transformers is installed),
    its weights drawn from `seed` on the CPU (the same in every process), then moved."""
    if kind == "auto":
        kind = "hf" if have_transformers() else "tiny"
    torch.manual_seed(seed)
    if kind == "hf":
        return HFLlama(shape, device, dtype)
    model = TinyLlama(shape)
    for p in model.parameters():  # Wider than nn's defaults: clearer argmax margins.
        if p.dim() == 2:
            nn.init.normal_(p, std=0.5 / math.sqrt(p.shape[1]))
    return model.to(device=device, dtype=dtype).eval()


def generate(model, ids: List[int], steps: int) -> List[int]:
    """The reference: prefill and `steps` greedy steps in this process, through the same
    calls the disaggregated path makes."""
    first, kv = model.prefill(ids)
    state, tokens = model.start(kv), [first]
    for _ in range(steps):
        tokens.append(model.step(state, tokens[-1]))
    return tokens
