"""The model ``fmt train`` trains: a small seeded decoder-only transformer over bytes.

Token and learned position embeddings, ``layers`` pre-LN blocks (causal self-attention
with one ``qkv`` and one ``out`` Linear; an MLP ``fc1`` -> GELU -> ``fc2``, 4x wide), a
final LayerNorm and a language-model head over the 256 byte values (GPT-2's shape, Radford
et al. 2019).  The layer keys are the modules' names: ``layers.0.attn.qkv``,
``layers.0.attn.out``, ``layers.3.mlp.fc1``, ``layers.3.mlp.fc2``.

What is quantized: every block Linear, through ``gemm.QuantLinearFunction`` (all three of
its GEMMs).  What stays in FP32, as Transformer Engine keeps it in higher precision: the
embeddings, the LayerNorms, the softmax and the attention's two batched products (Q K^T
and P V), GELU, the residual adds and the loss.  The LM head stays in FP32 too by default,
as DeepSeek-V3 keeps its embedding and output head in their original precision (DeepSeek-
AI 2024, §3.3.1); ``quantize_head`` puts it through the recipe's casts as well.

Initialisation (seeded; the same seed gives the same model on every device: it is made on
the CPU and moved): weights normal(0, 0.02), the residual projections (``out``, ``fc2``)
0.02 / sqrt(2 layers) as GPT-2 does, biases 0, LayerNorms 1 and 0.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from fmtcli.train.gemm import GemmContext, quantized_linear
from fmtcli.train.results import VOCAB, TrainSettings


class QuantLinear(nn.Module):
    """A Linear whose GEMMs go through the run's ``GemmContext`` (plain FP32 without one)."""

    def __init__(self, fan_in: int, fan_out: int, bias: bool = True) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(fan_out, fan_in))
        self.bias = nn.Parameter(torch.zeros(fan_out)) if bias else None
        self.key = ""
        self.context: GemmContext | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.context is None:
            return F.linear(x, self.weight, self.bias)
        return quantized_linear(x, self.weight, self.bias, self.context, self.key)


class Attention(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = QuantLinear(width, 3 * width)
        self.out = QuantLinear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, w = x.shape
        q, k, v = self.qkv(x).split(w, dim=-1)
        q, k, v = (a.view(b, t, self.heads, w // self.heads).transpose(1, 2) for a in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(w // self.heads)  # FP32
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        probs = scores.masked_fill(mask, float("-inf")).softmax(dim=-1)
        y = (probs @ v).transpose(1, 2).reshape(b, t, w)
        return self.out(y)


class MLP(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc1 = QuantLinear(width, 4 * width)
        self.fc2 = QuantLinear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = Attention(width, heads)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = MLP(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """The byte-level decoder: ``forward(tokens)``, (batch, seq) int64 -> (batch, seq, 256)."""

    def __init__(self, layers: int, width: int, heads: int, seq: int,
                 quantize_head: bool = False) -> None:
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, width)
        self.positions = nn.Embedding(seq, width)
        self.layers = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.head = QuantLinear(width, VOCAB, bias=False)
        self.quantize_head = quantize_head
        for name, module in self.named_modules():
            if isinstance(module, QuantLinear):
                module.key = name

    def quantized(self) -> list[QuantLinear]:
        """The Linears whose GEMMs the recipe casts, in model order."""
        return [m for m in self.modules() if isinstance(m, QuantLinear)
                and (m is not self.head or self.quantize_head)]

    def use(self, context: GemmContext | None) -> None:
        """Route the quantized Linears' GEMMs through ``context`` (None: plain FP32)."""
        for module in self.quantized():
            module.context = context

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        x = self.tokens(tokens) + self.positions(torch.arange(t, device=tokens.device))
        for block in self.layers:
            x = block(x)
        return self.head(self.ln_f(x))


def initialise(model: TinyGPT, layers: int) -> None:
    """GPT-2's initialisation (module docstring), from torch's global generator."""
    residual = 0.02 / math.sqrt(2 * layers)
    for name, module in model.named_modules():
        if isinstance(module, (QuantLinear, nn.Embedding)):
            std = residual if name.endswith((".out", ".fc2")) else 0.02
            nn.init.normal_(module.weight, 0.0, std)


def build_model(settings: TrainSettings, seed: int, device: str = "cpu") -> TinyGPT:
    """The model of ``settings``, initialised from ``seed`` alone (torch's global generator
    is left as it was), on ``device``."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = TinyGPT(settings.layers, settings.width, settings.heads, settings.seq,
                        settings.quantize_head)
        initialise(model, settings.layers)
    return model.to(device)
