"""`gpt`: a decoder-only transformer language model over bytes, in the style of nanoGPT's
`model.py` (pre-norm blocks, causal self-attention, GELU MLP, tied embeddings).

Byte-level (vocab 256), so it needs no tokenizer. The default (4 layers, 4 heads, 256 wide,
a context of 128) has 3.2M parameters. Its loss is summed over the target tokens and counts
them; a target of -1 is padding, neither predicted nor counted (a subclass whose windows are
padded sets `count_per_sample = None`).

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


class GPT(Recipe):
    """Options: n_layer, n_head, n_embd, context (tokens per window), dropout."""

    kind = "tokens"
    # AdamW as nanoGPT trains (its small character-level model: lr 1e-3); SGD with momentum
    # makes this model's loss spike (docs/measurements/recipes.md, "The default gpt ... comm").
    optimizer, lr, weight_decay = "adamw", 1e-3, 0.1

    def __init__(
        self,
        n_layer: int = 4,
        n_head: int = 4,
        n_embd: int = 256,
        context: int = 128,
        dropout: float = 0.0,
    ) -> None:
        self.n_layer, self.n_head, self.n_embd = int(n_layer), int(n_head), int(n_embd)
        self.context, self.dropout = int(context), float(dropout)
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
