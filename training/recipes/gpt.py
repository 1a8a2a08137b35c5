"""`gpt`: a decoder-only transformer language model over bytes, in the style of nanoGPT's
`model.py` (pre-norm blocks, causal self-attention, GELU MLP, tied embeddings).

Byte-level (vocab 256), so it needs no tokenizer. The default (4 layers, 4 heads, 256 wide,
a context of 128) has 3.2M parameters; `size` names larger presets, up to 1.2B (`SIZES`). Its
loss is summed over the target tokens and counts them; a target of -1 is padding, neither
predicted nor counted (a subclass whose windows are padded sets `count_per_sample = None`).

    >>> import numpy as np
    >>> from hetflow.training.recipes import get_recipe
    >>> r = get_recipe("gpt", n_layer=1, n_embd=32, n_head=2, context=8)
    >>> model = r.build_model(DataInfo(kind="tokens", vocab=256))
    >>> windows = np.arange(18, dtype=np.int64).reshape(2, 9)
    >>> loss, count = r.loss(model, r.batch(windows, np.zeros(2, dtype=np.int64)))
    >>> count
    16
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from hetflow.training.recipes.base import DataInfo, Recipe

PAD = -1  # a target that is not predicted (windows shorter than the context, padded)


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, n_embd: int, n_head: int, dropout: float) -> None:
        super().__init__()
        self.n_head, self.dropout = n_head, dropout
        self.ln_1, self.ln_2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.proj = nn.Linear(n_embd, n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(n_embd, 4 * n_embd),
            nn.GELU(),
            nn.Linear(4 * n_embd, n_embd),
            nn.Dropout(dropout),
        )
        self.drop = nn.Dropout(dropout)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        return self.drop(self.proj(y.transpose(1, 2).contiguous().view(b, t, c)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPTModel(nn.Module):
    """Token and position embeddings, `n_layer` blocks, a final norm, the tied LM head."""

    def __init__(
        self, vocab: int, context: int, n_layer: int, n_head: int, n_embd: int, dropout: float
    ) -> None:
        super().__init__()
        self.context = context
        self.wte = nn.Embedding(vocab, n_embd)
        self.wpe = nn.Embedding(context, n_embd)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(n_embd, n_head, dropout) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, vocab, bias=False)
        self.head.weight = self.wte.weight  # weight tying, as GPT-2 and nanoGPT
        self.apply(self._init)
        for name, p in self.named_parameters():  # GPT-2's scaled init of the residual outputs
            if name.endswith(("proj.weight", "mlp.2.weight")):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Logits (B, T, vocab) of the next token at every position of `idx` (B, T)."""
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


@dataclass(frozen=True)
class Size:
    """A named shape of the model, and the lr and batch (in tokens) it was tuned at."""

    n_layer: int
    n_head: int
    n_embd: int
    context: int
    lr: float
    tuned_tokens: int


# nanoGPT's shakespeare_char (lr 1e-3 at 64 windows of 256 bytes) for the small default; GPT-3's
# Medium, Large and XL shapes and learning rates (Brown et al. 2020, table 2.1: 0.5M, 0.5M and
# 1M tokens a batch), at a context of 1024 bytes: GPT-3 trained them on BPE tokens at 2048, so
# they are a starting point on bytes, not tuned here. XL has 16 heads of 128 (the table's 24
# heads of 128 do not make its width of 2048). With vocab 256, parameters and the bytes of fp32
# weights, gradients and AdamW's two moments (16 per parameter) are:
#   small   3.2M     0.05 GB
#   medium  304M     4.9 GB   fits one 16 GB device with DDP: ~5 windows of 1024 a step
#   large   681M    10.9 GB   DDP on a 16 GB device: no room for 2 windows -> shard it
#   xl      1.21B   19.4 GB   the state alone is over 16 GB -> shard it (24 GB: ~1 window)
# Activations (Korthikanti et al. 2022: ~34 x context x width bytes per layer and window in
# 16 bits with a fused attention, ~twice that in fp32) add, a window of 1024 in fp32: medium
# 1.7 GB, large 2.6 GB, xl 3.4 GB (estimates). Measured on a CPU, one process training medium
# on a window of 1024 in fp32 peaked at 5.7 GB, at AdamW's step: its 4.9 GB of state and the
# runtime (benchmarks/gpt_memory.py, docs/measurements/recipes.md). The counts: the built
# model's, in tests/unit/config/test_lr_rule.py.
SIZES = {
    "small": Size(4, 4, 256, 128, 1e-3, 64 * 256),
    "medium": Size(24, 16, 1024, 1024, 3e-4, 2**19),
    "large": Size(24, 16, 1536, 1024, 2.5e-4, 2**19),
    "xl": Size(24, 16, 2048, 1024, 2e-4, 2**20),
}


def _int(value: int | None, default: int) -> int:
    return int(default if value is None else value)


class GPT(Recipe):
    """Options: size (a preset of `SIZES`: 'small', the default, 'medium', 'large', 'xl'),
    and n_layer, n_head, n_embd, context (tokens per window), dropout, each overriding the
    size's.

    AdamW as nanoGPT trains; SGD with momentum makes this model's loss spike
    (docs/measurements/recipes.md, "The default gpt ... comm"). The size's lr is tuned for a
    batch of `Size.tuned_tokens` tokens, `tuned_batch` = that / context windows (at least 1),
    and follows the global batch by its square root: the rule for adaptive optimizers
    (Malladi et al. 2022, "On the SDEs and Scaling Rules for Adaptive Gradient Algorithms";
    Hoffer et al. 2017), with nanoGPT's 100 warm-up steps where it rises.
    """

    kind = "tokens"
    optimizer, weight_decay = "adamw", 0.1
    lr_scaling, lr_warmup_steps = "sqrt", 100

    def __init__(
        self,
        size: str = "small",
        n_layer: int | None = None,
        n_head: int | None = None,
        n_embd: int | None = None,
        context: int | None = None,
        dropout: float = 0.0,
    ) -> None:
        if size not in SIZES:
            raise TypeError(f"size must be one of {', '.join(SIZES)} (got {size!r})")
        shape = SIZES[size]
        self.size, self.n_layer = size, _int(n_layer, shape.n_layer)
        self.n_head, self.n_embd = _int(n_head, shape.n_head), _int(n_embd, shape.n_embd)
        self.context, self.dropout = _int(context, shape.context), float(dropout)
        self.lr = shape.lr
        self.tuned_batch = max(1, shape.tuned_tokens // max(self.context, 1))
        self.count_per_sample = self.context  # full windows; a padded recipe sets None
        if min(self.n_layer, self.n_head, self.n_embd, self.context) < 1:
            raise TypeError("n_layer, n_head, n_embd and context must be >= 1")
        if self.n_embd % self.n_head:
            raise TypeError(f"n_embd ({self.n_embd}) must be a multiple of n_head ({self.n_head})")
        if not 0.0 <= self.dropout < 1.0:
            raise TypeError(f"dropout must be in [0, 1) (got {self.dropout})")

    def build_model(self, info: DataInfo) -> nn.Module:
        vocab = info.vocab or 256
        args = (self.n_layer, self.n_head, self.n_embd, self.dropout)
        return GPTModel(vocab, self.context, *args)

    def shard_units(self, model: nn.Module) -> list[nn.Module]:
        """The blocks; the embeddings and the head they tie to stay with the root."""
        return list(model.blocks)

    def batch(self, x: np.ndarray, y: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Windows (B, T+1) -> inputs x[:, :-1] (padding read as token 0), targets x[:, 1:]."""
        w = torch.from_numpy(np.asarray(x, dtype=np.int64))
        return w[:, :-1].clamp(min=0), w[:, 1:]

    def loss(self, model: nn.Module, batch: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, int]:
        idx, targets = batch
        logits = model(idx)
        loss = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]),
            targets.reshape(-1),
            ignore_index=PAD,
            reduction="sum",
        )
        return loss, int((targets != PAD).sum())

    def evaluate(self, model: nn.Module, batches) -> dict[str, float]:
        total, count = 0.0, 0
        for batch in batches:
            loss, n = self.loss(model, batch)
            total, count = total + float(loss), count + n
        val_loss = total / max(count, 1)
        return {"val_loss": val_loss, "perplexity": math.exp(min(val_loss, 50.0))}
