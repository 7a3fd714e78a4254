"""Tiny sequence models shared by the methods that study them (pruning, sparse attention, KV eviction,
token merging, RL post-training): a tokenizer, a decoder-only transformer with RoPE and a KV cache, a
selective state-space (Mamba2-style) language model, and sampling / sequence log-likelihoods.

Small on purpose (a few hundred thousand parameters train in seconds on a CPU), exact on purpose: the
cached decode equals the full forward, the recurrent SSM step equals its scan. Methods subclass or wrap
these, never copy them."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "Tokenizer",
    "TinyConfig",
    "TinyTransformer",
    "KVCache",
    "SSMConfig",
    "SelectiveSSM",
    "SelectiveSSMLM",
    "ssd_chunked",
    "segsum",
    "Block",
    "rope",
    "generate",
    "sequence_logprobs",
]


# ------------------------------------------------------------------------------------------ tokenizer
class Tokenizer:
    """A fixed vocabulary of symbols (characters or whole words) plus special tokens.

    ``encode`` splits on characters (``level="char"``) or whitespace (``level="word"``); an unknown
    symbol raises a ValueError naming it (no silent ``<unk>``). ``decode(encode(x)) == x`` for any text
    made of known symbols (word level: single spaces)."""

    SPECIALS = ("<pad>", "<bos>", "<eos>")

    def __init__(self, symbols: Iterable[str], level: str = "char", extra_specials: Sequence[str] = ()):
        if level not in ("char", "word"):
            raise ValueError(f"tokenizer level must be 'char' or 'word', got {level!r}")
        self.level = level
        self.itos: list[str] = [*self.SPECIALS, *extra_specials]
        for s in symbols:
            if s not in self.itos:
                self.itos.append(s)
        self.stoi = {s: i for i, s in enumerate(self.itos)}
        self.pad_id, self.bos_id, self.eos_id = 0, 1, 2

    @classmethod
    def from_texts(cls, texts: Iterable[str], level: str = "char", **kw) -> Tokenizer:
        seen: dict[str, None] = {}
        for t in texts:
            for s in t if level == "char" else t.split():
                seen.setdefault(s)
        return cls(sorted(seen), level, **kw)

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, text: str, bos: bool = False, eos: bool = False) -> list[int]:
        pieces = text if self.level == "char" else text.split()
        try:
            ids = [self.stoi[s] for s in pieces]
        except KeyError as exc:
            raise ValueError(f"symbol {exc.args[0]!r} is not in the tokenizer's vocabulary") from None
        return [self.bos_id] * bos + ids + [self.eos_id] * eos

    def decode(self, ids: Iterable[int], skip_specials: bool = True) -> str:
        n_special = len(self.SPECIALS)
        out = [self.itos[int(i)] for i in ids if not (skip_specials and int(i) < n_special)]
        return ("" if self.level == "char" else " ").join(out)

    def batch(self, texts: Sequence[str], bos: bool = True, eos: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """Right-padded ids and a bool mask of real tokens."""
        seqs = [self.encode(t, bos, eos) for t in texts]
        n = max(map(len, seqs))
        ids = torch.full((len(seqs), n), self.pad_id, dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = torch.tensor(s)
        return ids, ids != self.pad_id


# ------------------------------------------------------------------------------------------ transformer
@dataclass
class TinyConfig:
    vocab_size: int
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 0  # 0 → 4 · d_model
    max_len: int = 256
    causal: bool = True  # False: bidirectional (e.g. a diffusion LM's denoiser)
    rope_base: float = 10000.0
    dropout: float = 0.0
    tie_embeddings: bool = True
    init_std: float = 0.02  # N(0, init_std²) for every linear and embedding weight (GPT-2's 0.02)


def rope(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotary position embedding of ``x`` [..., T, d] (d even) at integer ``positions`` [T]: pairs
    (x_2i, x_2i+1) rotated by angle pos · base^(-2i/d), so q·k depends on positions only through their
    difference."""
    d = x.shape[-1]
    inv = base ** (-torch.arange(0, d, 2, dtype=torch.float32, device=x.device) / d)
    ang = positions.to(torch.float32)[:, None] * inv[None, :]  # [T, d/2]
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return out.flatten(-2)


@dataclass
class KVCache:
    """Per-layer keys and values [B, H, T, d_head] (after RoPE) and the absolute positions they hold.

    Eviction policies keep a subset with :meth:`keep`; ``positions`` keep the original indices, so RoPE
    stays right after eviction."""

    keys: list[torch.Tensor | None] = field(default_factory=list)
    values: list[torch.Tensor | None] = field(default_factory=list)
    positions: torch.Tensor | None = None  # [T] absolute positions of the cached entries
    next_position: int = 0  # where the next token goes

    def layer(self, i: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        while len(self.keys) <= i:
            self.keys.append(None)
            self.values.append(None)
        return self.keys[i], self.values[i]

    def __len__(self) -> int:
        return 0 if self.positions is None else int(self.positions.numel())

    def fork(self) -> KVCache:
        """An independent copy to decode from (e.g. denoise a block several times over a frozen prefix):
        appending to the fork leaves this cache as it is. Tensors are shared, never written in place."""
        return KVCache(list(self.keys), list(self.values), self.positions, self.next_position)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values) if t is not None)

    def keep(self, index: torch.Tensor) -> None:
        """Keep the cached entries at ``index`` (1-D, over the cached axis), in that order, in every layer."""
        self.keys = [k.index_select(2, index) if k is not None else None for k in self.keys]
        self.values = [v.index_select(2, index) if v is not None else None for v in self.values]
        self.positions = self.positions.index_select(0, index)


class Block(nn.Module):
    """One pre-norm block. Subclass it to change attention (override ``attend``; ``self.layer_idx`` says
    which layer it is) and pass the subclass as ``TinyTransformer(config, block_cls=...)``."""

    def __init__(self, c: TinyConfig, layer_idx: int = 0):
        super().__init__()
        self.layer_idx = layer_idx
        if c.d_model % c.n_heads or (c.d_model // c.n_heads) % 2:
            raise ValueError(f"d_model ({c.d_model}) must split into n_heads ({c.n_heads}) heads of even size")
        self.c, self.h, self.dh = c, c.n_heads, c.d_model // c.n_heads
        self.norm1, self.norm2 = nn.RMSNorm(c.d_model), nn.RMSNorm(c.d_model)
        self.qkv = nn.Linear(c.d_model, 3 * c.d_model, bias=False)
        self.out = nn.Linear(c.d_model, c.d_model, bias=False)
        d_ff = c.d_ff or 4 * c.d_model
        self.ff = nn.Sequential(nn.Linear(c.d_model, d_ff), nn.GELU(), nn.Linear(d_ff, c.d_model))
        self.drop = nn.Dropout(c.dropout)

    def attend(self, q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    def forward(self, x, pos, layer_idx: int, cache: KVCache | None, mask):
        B, T, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(B, T, 3, self.h, self.dh).permute(2, 0, 3, 1, 4)
        q, k = rope(q, pos, self.c.rope_base), rope(k, pos, self.c.rope_base)
        if cache is not None:
            k0, v0 = cache.layer(layer_idx)
            if k0 is not None:
                k, v = torch.cat([k0, k], 2), torch.cat([v0, v], 2)
            cache.keys[layer_idx], cache.values[layer_idx] = k, v
        a = self.attend(q, k, v, mask).transpose(1, 2).reshape(B, T, -1)
        x = x + self.drop(self.out(a))
        return x + self.drop(self.ff(self.norm2(x)))


class TinyTransformer(nn.Module):
    """Decoder-only (or bidirectional) transformer LM: pre-norm blocks, RoPE, SDPA attention, optional KV cache.

    ``forward(ids)`` → logits [B, T, V]. With ``cache`` the new tokens attend to the cached ones (decode);
    ``attn_mask`` (bool [T_q, T_k] or [B, 1, T_q, T_k], True = may attend) replaces the default mask.
    ``return_hidden=True`` also returns the final hidden states [B, T, d]."""

    def __init__(self, c: TinyConfig, block_cls: type[nn.Module] | None = None):
        super().__init__()
        self.config = c
        self.embed = nn.Embedding(c.vocab_size, c.d_model)
        block_cls = block_cls or Block
        self.blocks = nn.ModuleList(block_cls(c, i) for i in range(c.n_layers))
        self.norm = nn.RMSNorm(c.d_model)
        self.head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        if c.tie_embeddings:
            self.head.weight = self.embed.weight
        self.apply(self._init)

    def _init(self, m):
        if isinstance(m, nn.Linear | nn.Embedding):
            nn.init.normal_(m.weight, std=self.config.init_std)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)

    def default_mask(self, t_q: int, positions_q: torch.Tensor, positions_k: torch.Tensor) -> torch.Tensor | None:
        if not self.config.causal:
            return None
        return positions_k[None, :] <= positions_q[:, None]  # [T_q, T_k]

    def forward(
        self,
        ids: torch.Tensor,
        cache: KVCache | None = None,
        attn_mask: torch.Tensor | None = None,
        return_hidden: bool = False,
    ):
        B, T = ids.shape
        start = cache.next_position if cache is not None else 0
        if start + T > self.config.max_len:
            raise ValueError(f"sequence of {start + T} tokens exceeds max_len={self.config.max_len}")
        pos = torch.arange(start, start + T, device=ids.device)
        if cache is not None:
            pos_k = pos if cache.positions is None else torch.cat([cache.positions.to(ids.device), pos])
        else:
            pos_k = pos
        mask = attn_mask if attn_mask is not None else self.default_mask(T, pos, pos_k)
        x = self.embed(ids)
        for i, blk in enumerate(self.blocks):
            x = blk(x, pos, i, cache, mask)
        if cache is not None:
            cache.positions, cache.next_position = pos_k, start + T
        h = self.norm(x)
        logits = self.head(h)
        return (logits, h) if return_hidden else logits


# ------------------------------------------------------------------------------------------ selective SSM
@dataclass
class SSMConfig:
    vocab_size: int
    d_model: int = 64
    n_layers: int = 2
    d_state: int = 16  # N: the state size per head (what structured state pruning removes)
    n_heads: int = 4  # each head has its own scalar decay A
    expand: int = 2  # inner width = expand · d_model
    max_len: int = 1024
    n_groups: int = 0  # heads share B, C within a group (Mamba2); 0 → one group per head
    d_conv: int = 0  # > 0: causal depthwise conv1d + SiLU over x, B, C (Mamba2); 0 → none
    scan: str = "sequential"  # default forward: "sequential" (the reference scan) or "chunked" (SSD)
    chunk_size: int = 64  # chunk length of the chunked (SSD) forward


def segsum(a: torch.Tensor) -> torch.Tensor:
    """[..., L] → [..., L, L]: out[i, j] = Σ_{k=j+1..i} a_k for i ≥ j, −inf above the diagonal.

    Sums are taken over a masked copy (not as differences of one long cumsum), so exp(out) is the exact
    product of decays between positions j and i without cancellation."""
    L = a.shape[-1]
    x = a[..., None].expand(*a.shape, L)  # x[..., i, j] = a_i
    strict = torch.ones(L, L, dtype=torch.bool, device=a.device).tril(-1)  # i > j
    x = x.masked_fill(~strict, 0.0).cumsum(-2)  # Σ_{j<k≤i} a_k
    return x.masked_fill(~torch.ones(L, L, dtype=torch.bool, device=a.device).tril(), -math.inf)


def ssd_chunked(
    x: torch.Tensor,
    log_decay: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    chunk: int,
    state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The SSD (state-space dual) form of h_t = exp(l_t) h_{t−1} + x_t ⊗ B_t, y_t = h_t C_t: quadratic
    (masked attention-like) inside chunks of ``chunk`` steps, the recurrence only across chunk boundaries.

    x [B, T, H, P] (already scaled by Δ), log_decay [B, T, H], b, c [B, T, H, N], state [B, H, P, N] or
    None → (y [B, T, H, P], final state [B, H, P, N]). Equal to the sequential scan up to rounding."""
    Bsz, T, H, P = x.shape
    N = b.shape[-1]
    pad = (-T) % chunk
    if pad:  # zero input and zero log-decay (decay 1): padded steps change neither y nor the state
        x, b, c = (F.pad(t, (0, 0, 0, 0, 0, pad)) for t in (x, b, c))
        log_decay = F.pad(log_decay, (0, 0, 0, pad))
    nc = (T + pad) // chunk
    X = x.reshape(Bsz, nc, chunk, H, P)
    Bc = b.reshape(Bsz, nc, chunk, H, N)
    Cc = c.reshape(Bsz, nc, chunk, H, N)
    A = log_decay.reshape(Bsz, nc, chunk, H).permute(0, 3, 1, 2)  # [B, H, c, L]
    A_cum = A.cumsum(-1)
    # 1. within chunks: y_t = Σ_{s≤t in chunk} exp(Σ_{s<k≤t} l_k) (C_t·B_s) x_s
    Lmat = torch.exp(segsum(A))  # [B, H, c, L, L]
    scores = torch.einsum("bclhn,bcshn->bhcls", Cc, Bc) * Lmat
    y = torch.einsum("bhcls,bcshp->bclhp", scores, X)
    # 2. the state each chunk leaves behind (from its own inputs)
    decay_to_end = torch.exp(A_cum[..., -1:] - A_cum)  # [B, H, c, L]
    states = torch.einsum("bclhn,bhcl,bclhp->bchpn", Bc, decay_to_end, X)
    # 3. pass states across chunk boundaries
    init = state[:, None] if state is not None else torch.zeros_like(states[:, :1])
    states = torch.cat([init, states], 1)  # [B, c+1, H, P, N]
    chunk_decay = torch.exp(segsum(F.pad(A_cum[..., -1], (1, 0))))  # [B, H, c+1, c+1]
    states = torch.einsum("bhzc,bchpn->bzhpn", chunk_decay, states)
    prev, final = states[:, :-1], states[:, -1]
    # 4. the incoming state's contribution inside each chunk
    y = y + torch.einsum("bclhn,bchpn,bhcl->bclhp", Cc, prev, torch.exp(A_cum))
    y = y.reshape(Bsz, nc * chunk, H, P)[:, :T]
    return y, final


class SelectiveSSM(nn.Module):
    """A Mamba2-style selective SSM layer (scalar-decay heads, input-dependent Δ, B, C):

        h_t = exp(Δ_t · A) · h_{t-1} + Δ_t · B_t ⊗ x_t,      y_t = C_t · h_t + D ⊙ x_t,

    per head, with h ∈ R^{d_head × N}, then a SiLU gate and an output projection. in_proj's outputs are
    [x, z, B (groups · N), C (groups · N), Δ (heads)]; heads share B and C within a group; with
    ``d_conv > 0`` a causal depthwise conv1d + SiLU runs over [x, B, C] first (Mamba2). ``state_mask`` (a
    buffer of ones, [n_heads, N]) zeroes pruned state channels in B and C, so a pruned model is the same
    module with some channels off. ``forward`` scans the sequence (``scan="sequential"``, the reference)
    or runs the chunked SSD form (``scan="chunked"``); ``step`` advances one token from a state
    (decode): the SSM state [B, H, d_head, N], or with a conv the pair (SSM state, last d_conv − 1 conv
    inputs [B, d_conv − 1, channels])."""

    def __init__(self, c: SSMConfig):
        super().__init__()
        d_in = c.expand * c.d_model
        if d_in % c.n_heads:
            raise ValueError(f"expand·d_model ({d_in}) must split into n_heads ({c.n_heads})")
        self.g = c.n_groups or c.n_heads
        if c.n_heads % self.g:
            raise ValueError(f"n_heads ({c.n_heads}) must split into n_groups ({self.g})")
        if c.scan not in ("sequential", "chunked"):
            raise ValueError(f"scan must be 'sequential' or 'chunked', got {c.scan!r}")
        self.c, self.d_in, self.h, self.dh, self.n = c, d_in, c.n_heads, d_in // c.n_heads, c.d_state
        self.in_proj = nn.Linear(c.d_model, 2 * d_in + 2 * self.g * c.d_state + c.n_heads)
        self.conv_dim = d_in + 2 * self.g * c.d_state
        self.conv1d = (
            nn.Conv1d(self.conv_dim, self.conv_dim, c.d_conv, groups=self.conv_dim, padding=c.d_conv - 1)
            if c.d_conv > 0
            else None
        )
        self.log_neg_a = nn.Parameter(torch.log(torch.linspace(1.0, 16.0, c.n_heads)))  # A = −exp(·) < 0
        self.dt_bias = nn.Parameter(torch.full((c.n_heads,), math.log(math.expm1(0.05))))
        self.d_skip = nn.Parameter(torch.ones(c.n_heads))
        self.out_proj = nn.Linear(d_in, c.d_model)
        self.register_buffer("state_mask", torch.ones(c.n_heads, c.d_state))

    def _split(self, u, conv_state=None):
        Bsz, T, _ = u.shape
        x, z, b, cc, dt = self.in_proj(u).split(
            [self.d_in, self.d_in, self.g * self.n, self.g * self.n, self.h], dim=-1
        )
        new_conv = None
        if self.conv1d is not None:
            xbc = torch.cat([x, b, cc], -1)  # [B, T, conv_dim]
            k = self.c.d_conv
            prev = conv_state if conv_state is not None else xbc.new_zeros(Bsz, k - 1, self.conv_dim)
            full = torch.cat([prev, xbc], 1)  # [B, k−1+T, conv_dim]
            new_conv = full[:, -(k - 1) :] if k > 1 else full[:, :0]
            xbc = F.silu(
                F.conv1d(full.transpose(1, 2), self.conv1d.weight, self.conv1d.bias, groups=self.conv_dim).transpose(
                    1, 2
                )
            )  # causal: T outputs
            x, b, cc = xbc.split([self.d_in, self.g * self.n, self.g * self.n], dim=-1)
        x = x.reshape(Bsz, T, self.h, self.dh)
        rep = self.h // self.g
        b = b.reshape(Bsz, T, self.g, self.n).repeat_interleave(rep, 2) * self.state_mask
        cc = cc.reshape(Bsz, T, self.g, self.n).repeat_interleave(rep, 2) * self.state_mask
        dt = F.softplus(dt + self.dt_bias)  # [B, T, H] > 0
        decay = torch.exp(dt * -torch.exp(self.log_neg_a))  # in (0, 1)
        self._conv_out = new_conv
        return x, z, b, cc, dt, decay

    def _finish(self, y, x, z):
        y = y + self.d_skip[:, None] * x
        return self.out_proj(y.flatten(-2) * F.silu(z))

    def forward(self, u: torch.Tensor, state=None, return_state: bool = False, scan: str | None = None):
        ssm_state, conv_state = state if isinstance(state, tuple) else (state, None)
        x, z, b, cc, dt, decay = self._split(u, conv_state)
        Bsz, T = u.shape[:2]
        scan = scan or self.c.scan
        if scan == "chunked":
            log_decay = dt * -torch.exp(self.log_neg_a)
            y, h = ssd_chunked(x * dt[..., None], log_decay, b, cc, self.c.chunk_size, ssm_state)
        elif scan == "sequential":
            h = ssm_state if ssm_state is not None else u.new_zeros(Bsz, self.h, self.dh, self.n)
            ys = []
            for t in range(T):
                h = decay[:, t, :, None, None] * h + (dt[:, t, :, None] * x[:, t])[..., None] * b[:, t, :, None, :]
                ys.append(torch.einsum("bhdn,bhn->bhd", h, cc[:, t]))
            y = torch.stack(ys, 1)
        else:
            raise ValueError(f"scan must be 'sequential' or 'chunked', got {scan!r}")
        y = self._finish(y, x, z)
        if not return_state:
            return y
        return y, ((h, self._conv_out) if self.conv1d is not None else h)

    def step(self, u_t: torch.Tensor, state=None):
        """One token u_t [B, d_model] → (y_t [B, d_model], new state)."""
        y, h = self.forward(u_t[:, None], state, return_state=True, scan="sequential")
        return y[:, 0], h


class SelectiveSSMLM(nn.Module):
    """Embedding → residual [RMSNorm → SelectiveSSM] blocks → RMSNorm → tied head; ``step`` decodes one
    token with per-layer states. ``forward(ids, scan=...)`` overrides the config's scan."""

    def __init__(self, c: SSMConfig):
        super().__init__()
        self.config = c
        self.embed = nn.Embedding(c.vocab_size, c.d_model)
        self.norms = nn.ModuleList(nn.RMSNorm(c.d_model) for _ in range(c.n_layers))
        self.layers = nn.ModuleList(SelectiveSSM(c) for _ in range(c.n_layers))
        self.norm = nn.RMSNorm(c.d_model)
        self.head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.head.weight = self.embed.weight
        nn.init.normal_(self.embed.weight, std=0.02)

    def forward(self, ids: torch.Tensor, return_hidden: bool = False, scan: str | None = None):
        x = self.embed(ids)
        for norm, layer in zip(self.norms, self.layers):
            x = x + layer(norm(x), scan=scan)
        h = self.norm(x)
        logits = self.head(h)
        return (logits, h) if return_hidden else logits

    def step(self, ids_t: torch.Tensor, states: list | None = None):
        """ids_t [B] → (logits [B, V], states)."""
        states = list(states) if states is not None else [None] * len(self.layers)
        x = self.embed(ids_t)
        for i, (norm, layer) in enumerate(zip(self.norms, self.layers)):
            y, states[i] = layer.step(norm(x), states[i])
            x = x + y
        return self.head(self.norm(x)), states


# ------------------------------------------------------------------------------------------ sampling
@torch.no_grad()
def generate(
    model: nn.Module,
    prompt: torch.Tensor,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    eos_id: int | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Sample continuations of ``prompt`` [B, T0] → [B, T0 + n] (n ≤ max_new_tokens; stops early when every
    row has emitted ``eos_id``; rows that finished are padded with ``eos_id``). ``temperature == 0`` is
    greedy. A TinyTransformer decodes with its KV cache, a SelectiveSSMLM with its recurrent state,
    anything else by re-running the whole prefix."""
    if temperature < 0:
        raise ValueError(f"temperature must be ≥ 0, got {temperature}")
    out, done = prompt, torch.zeros(prompt.shape[0], dtype=torch.bool, device=prompt.device)
    if isinstance(model, TinyTransformer):
        cache = KVCache()
        logits = model(prompt, cache=cache)[:, -1]
    elif isinstance(model, SelectiveSSMLM):
        states = None
        for t in range(prompt.shape[1]):
            logits, states = model.step(prompt[:, t], states)
    else:
        logits = model(prompt)[:, -1]
    for _ in range(max_new_tokens):
        if temperature == 0:
            nxt = logits.argmax(-1)
        else:
            scaled = logits / temperature
            if top_k is not None:
                kth = scaled.topk(min(top_k, scaled.shape[-1]), -1).values[:, -1:]
                scaled = scaled.masked_fill(scaled < kth, float("-inf"))
            nxt = torch.multinomial(scaled.softmax(-1), 1, generator=generator)[:, 0]
        if eos_id is not None:
            nxt = torch.where(done, torch.full_like(nxt, eos_id), nxt)
            done |= nxt == eos_id
        out = torch.cat([out, nxt[:, None]], 1)
        if eos_id is not None and bool(done.all()):
            break
        if isinstance(model, TinyTransformer):
            logits = model(nxt[:, None], cache=cache)[:, -1]
        elif isinstance(model, SelectiveSSMLM):
            logits, states = model.step(nxt, states)
        else:
            logits = model(out)[:, -1]
    return out


def sequence_logprobs(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Per-token log p(ids[:, t] | ids[:, :t]) [B, T-1] under a causal LM (differentiable; GRPO / PPO
    ratios, likelihood tracking). ``mask`` [B, T] zeroes the positions that are not scored (prompt, pad)."""
    logits = model(ids[:, :-1])
    lp = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, 1:, None])[..., 0]
    return lp if mask is None else lp * mask[:, 1:].to(lp.dtype)
