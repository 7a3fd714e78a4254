"""SVGT's modules (paper §3): the independent Value Transformer and its discriminator (stages 1-2), the
Bridge generator that turns a value correction dz into K latent tokens spliced after block l of a frozen
backbone (stage 3), and the baselines' interventions (static soft prompt, CAA / ITI vectors, LoRA).

Sequences are laid out as [left-padded prompt (M) | right-padded response]; pads are masked as keys,
RoPE positions are relative, so a left pad changes nothing. A bridge of K vectors goes to M..M+K-1 in
the layer-l sequence and every response position shifts by K in the blocks above the splice."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from pipelines.core.api import TinyConfig, TinyTransformer, Tokenizer

SPECIALS = ("SYS", "USER", "BOT")


# ----------------------------------------------------------------------------------------- encoding
@dataclass
class Batch:
    ids: torch.Tensor  # [N, M + R]
    valid: torch.Tensor  # [N, M + R] bool, False on pads
    m: int  # prompt width (left-padded); the trigger is position m - 1
    resp: torch.Tensor  # [N, R] bool: response positions that are scored (tokens + <eos>)

    def __getitem__(self, idx) -> Batch:
        return Batch(self.ids[idx], self.valid[idx], self.m, self.resp[idx])

    def __len__(self) -> int:
        return self.ids.shape[0]


def make_tokenizer(vocab: list[str]) -> Tokenizer:
    return Tokenizer(vocab, level="word", extra_specials=SPECIALS)


def vocab_of(texts) -> list[str]:
    return sorted({w for t in texts for w in t.split()} - set(SPECIALS))


def prompt_tokens(tok: Tokenizer, prompt: str, sys: bool) -> list[int]:
    return (
        [tok.bos_id] + ([tok.stoi["SYS"]] if sys else []) + [tok.stoi["USER"]] + tok.encode(prompt) + [tok.stoi["BOT"]]
    )


def encode(tok: Tokenizer, prompts, responses, sys_flags, m: int, r: int) -> Batch:
    """Prompts left-padded to ``m``, responses (+ <eos>) right-padded to ``r``."""
    n = len(prompts)
    ids = torch.full((n, m + r), tok.pad_id, dtype=torch.long)
    for i, (pr, rs, sy) in enumerate(zip(prompts, responses, sys_flags)):
        pt = prompt_tokens(tok, pr, bool(sy))
        rt = tok.encode(rs) + [tok.eos_id] if rs is not None else []
        if len(pt) > m or len(rt) > r:
            raise ValueError(f"prompt/response longer than the layout ({len(pt)} > {m} or {len(rt)} > {r}): {pr!r}")
        ids[i, m - len(pt) : m] = torch.tensor(pt)
        if rt:
            ids[i, m : m + len(rt)] = torch.tensor(rt)
    valid = ids != tok.pad_id
    return Batch(ids, valid, m, valid[:, m:].clone())


def attn_mask(valid: torch.Tensor) -> torch.Tensor:
    """[B, 1, T, T] causal mask over real keys; every query may see itself (no all-masked rows)."""
    t = valid.shape[1]
    causal = torch.ones(t, t, dtype=torch.bool, device=valid.device).tril()
    eye = torch.eye(t, dtype=torch.bool, device=valid.device)
    return ((causal[None] & valid[:, None, :]) | eye[None])[:, None]


def make_backbone(vocab_size: int, b, max_len: int) -> TinyTransformer:
    return TinyTransformer(
        TinyConfig(vocab_size=vocab_size, d_model=b.d_model, n_layers=b.n_layers, n_heads=b.n_heads, max_len=max_len)
    )


def run_lower(bb: TinyTransformer, ids: torch.Tensor, valid: torch.Tensor, layer: int) -> torch.Tensor:
    """The residual stream after block ``layer`` ("hidden_states[layer + 1]")."""
    x = bb.embed(ids)
    pos = torch.arange(ids.shape[1], device=ids.device)
    mask = attn_mask(valid)
    for i, blk in enumerate(bb.blocks[: layer + 1]):
        x = blk(x, pos, i, None, mask)
    return x


def run_upper(bb: TinyTransformer, x: torch.Tensor, valid: torch.Tensor, layer: int):
    """Blocks above ``layer`` on a (possibly spliced) layer-l sequence → (logits, output of block l+1)."""
    pos = torch.arange(x.shape[1], device=x.device)
    mask = attn_mask(valid)
    tap = None
    for i in range(layer + 1, len(bb.blocks)):
        x = bb.blocks[i](x, pos, i, None, mask)
        if i == layer + 1:
            tap = x
    return bb.head(bb.norm(x)), tap


def splice(x: torch.Tensor, valid: torch.Tensor, m: int, bridge: torch.Tensor | None):
    """Insert ``bridge`` [B, K, d] at positions m..m+K-1 of the layer-l sequence."""
    if bridge is None:
        return x, valid
    k = bridge.shape[1]
    x = torch.cat([x[:, :m], bridge.to(x.dtype), x[:, m:]], 1)
    valid = torch.cat([valid[:, :m], valid.new_ones(valid.shape[0], k), valid[:, m:]], 1)
    return x, valid


# ------------------------------------------------------------------------------------- interventions
class Intervention(nn.Module):
    """What a variant does to the layer-l sequence: insert K vectors after the prompt and/or add a vector."""

    k: int = 0

    def bridge(self, h: torch.Tensor) -> torch.Tensor | None:  # h: [B, d] trigger (last prompt token)
        return None

    def shift(self) -> torch.Tensor | None:
        return None

    def apply(self, x: torch.Tensor, valid: torch.Tensor, m: int, bridge: torch.Tensor | None = None):
        v = self.shift()
        if v is not None:
            x = x + v
        if bridge is None:
            bridge = self.bridge(x[:, m - 1])
        return splice(x, valid, m, bridge)


class NoIntervention(Intervention):
    pass


class AddVector(Intervention):
    """CAA / ITI-lite: coef · v added to the residual stream after block l at every position."""

    def __init__(self, v: torch.Tensor, coef: float):
        super().__init__()
        self.register_buffer("v", v.detach().clone())
        self.coef = float(coef)

    def shift(self):
        return self.coef * self.v


class SoftPrompt(Intervention):
    """K static trainable vectors at the bridge's place (prompt tuning; the key ablation)."""

    def __init__(self, init: torch.Tensor):
        super().__init__()
        self.vectors = nn.Parameter(init.detach().clone())
        self.k = init.shape[0]

    def bridge(self, h):
        return self.vectors.expand(h.shape[0], -1, -1)


class ValueTransformer(nn.Module):
    """The independent value space: projectors → encoder → last-token pooling → aggregate (value_dim)."""

    def __init__(self, d_model: int, value_dim: int, n_layers: int, n_heads: int, scale_init: float = 3.0):
        super().__init__()
        self.resp_proj = nn.Sequential(nn.Linear(d_model, value_dim), nn.GELU())
        layer = nn.TransformerEncoderLayer(value_dim, n_heads, 2 * value_dim, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
        self.aggregate = nn.Sequential(nn.Linear(value_dim, value_dim), nn.GELU(), nn.LayerNorm(value_dim))
        # stage-2 parts
        self.prompt_proj = nn.Sequential(nn.Linear(d_model, value_dim), nn.GELU())
        self.cross = nn.MultiheadAttention(value_dim, n_heads, batch_first=True)
        self.norm_q, self.norm_kv = nn.LayerNorm(value_dim), nn.LayerNorm(value_dim)
        self.scale = nn.Parameter(torch.tensor(float(scale_init)))

    def stage2_parts(self) -> list[nn.Module]:
        return [self.prompt_proj, self.cross, self.norm_q, self.norm_kv]

    def _encode_pool(self, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        v = self.encoder(v, src_key_padding_mask=~mask)
        last = mask.long().cumsum(1).argmax(1)  # index of the last real token
        return self.aggregate(v[torch.arange(v.shape[0]), last])

    def forward_unconditional(self, hr: torch.Tensor, mr: torch.Tensor) -> torch.Tensor:
        return self._encode_pool(self.resp_proj(hr), mr)

    def forward_conditional(self, hp, mp, hr, mr) -> torch.Tensor:
        r, pv = self.resp_proj(hr), self.prompt_proj(hp)
        kv = self.norm_kv(pv)
        c, _ = self.cross(self.norm_q(r), kv, kv, key_padding_mask=~mp)
        return self._encode_pool(r + self.scale * c, mr)

    def forward_stage3(self, h: torch.Tensor) -> torch.Tensor:
        """The prompt value z of the trigger h [B, d] (prompt projector → encoder → aggregate)."""
        v = self.prompt_proj(h)[:, None]
        return self._encode_pool(v, torch.ones(v.shape[:2], dtype=torch.bool, device=v.device))


class Discriminator(nn.Module):
    """value → scalar s; s > 0 means unsafe."""

    def __init__(self, value_dim: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(value_dim, value_dim), nn.GELU(), nn.Linear(value_dim, 1))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.net(z).squeeze(-1)


class ValueModel(nn.Module):
    def __init__(self, d_model: int, v):
        super().__init__()
        self.value = ValueTransformer(d_model, v.value_dim, v.n_layers, v.n_heads, v.scale_init)
        self.disc = Discriminator(v.value_dim)


def value_correction(vm: ValueModel, h: torch.Tensor):
    """z = value(h), s = D(z), dz = −(relu(s)/‖g‖)·g/‖g‖ with g = ∂s/∂z: a first-order step to s = 0,
    computed detached with everything frozen, so dz = 0 whenever s(z) ≤ 0."""
    with torch.enable_grad():
        z = vm.value.forward_stage3(h.detach()).detach().requires_grad_(True)
        s = vm.disc(z)
        (g,) = torch.autograd.grad(s.sum(), z)
    gn = g.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    dz = -(F.relu(s.detach())[:, None] / gn) * g / gn
    return z.detach(), s.detach(), dz.detach()


class BridgeGenerator(nn.Module):
    """K learnable query seeds cross-attend to [h, value_proj(dz)]; bridge = LN(h + softplus(g)·attn)."""

    def __init__(self, d_model: int, value_dim: int, k: int, n_heads: int, gate_init: float = -2.0):
        super().__init__()
        self.seeds = nn.Parameter(torch.randn(k, d_model) * 0.02)
        self.value_proj = nn.Sequential(nn.Linear(value_dim, d_model), nn.GELU(), nn.Linear(d_model, d_model))
        self.attn = nn.MultiheadAttention(d_model, n_heads, batch_first=True)
        self.gate = nn.Parameter(torch.tensor(float(gate_init)))
        self.norm = nn.LayerNorm(d_model)

    def forward(self, h: torch.Tensor, dz: torch.Tensor) -> torch.Tensor:
        kv = torch.stack([h, self.value_proj(dz)], 1)  # [B, 2, d]
        q = self.seeds[None].expand(h.shape[0], -1, -1)
        a, _ = self.attn(q, kv, kv)
        return self.norm(h[:, None] + F.softplus(self.gate) * a)


class SVGTSteer(Intervention):
    """The method: the frozen value model scores the trigger, its correction dz (0 in the `svgt_dz0`
    ablation) feeds the bridge generator, whose K tokens the frozen backbone attends to."""

    def __init__(self, vm: ValueModel, gen: BridgeGenerator, use_dz: bool = True):
        super().__init__()
        self.vm, self.gen, self.use_dz = vm, gen, use_dz
        self.k = gen.seeds.shape[0]
        for q in self.vm.parameters():
            q.requires_grad_(False)
        self.last: dict[str, torch.Tensor] = {}

    def bridge(self, h):
        z, s, dz = value_correction(self.vm, h)
        if not self.use_dz:
            dz = torch.zeros_like(dz)
        self.last = {"z": z, "s": s, "dz_norm": dz.norm(dim=-1)}
        return self.gen(h, dz)


class LoRALinear(nn.Module):
    """y = W x + (α/r)·B A x with W frozen, B = 0 at init (the fine-tuning baseline's adapters)."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float):
        super().__init__()
        self.base = base
        for q in base.parameters():
            q.requires_grad_(False)
        self.a = nn.Parameter(torch.randn(rank, base.in_features) / base.in_features**0.5)
        self.b = nn.Parameter(torch.zeros(base.out_features, rank))
        self.scale = alpha / rank

    def forward(self, x):
        return self.base(x) + (x @ self.a.t() @ self.b.t()) * self.scale


def add_lora(bb: TinyTransformer, rank: int, alpha: float) -> TinyTransformer:
    for q in bb.parameters():
        q.requires_grad_(False)
    for blk in bb.blocks:
        blk.qkv = LoRALinear(blk.qkv, rank, alpha)
        blk.out = LoRALinear(blk.out, rank, alpha)
        blk.ff[0] = LoRALinear(blk.ff[0], rank, alpha)
        blk.ff[2] = LoRALinear(blk.ff[2], rank, alpha)
    return bb


# ------------------------------------------------------------------------------------- forward passes
def steered_logits(bb: TinyTransformer, batch: Batch, layer: int, iv: Intervention, lower_grad: bool = False):
    """Teacher-forced pass with the intervention → (response logits [B, R, V], output of block l+1,
    the spliced valid mask, the bridge). Response logits start at index M+K−1."""
    with torch.set_grad_enabled(lower_grad and torch.is_grad_enabled()):
        x = run_lower(bb, batch.ids, batch.valid, layer)
    b = iv.bridge(x[:, batch.m - 1])
    x2, v2 = iv.apply(x, batch.valid, batch.m, bridge=b)
    logits, tap = run_upper(bb, x2, v2, layer)
    k = 0 if b is None else b.shape[1]
    r = batch.ids.shape[1] - batch.m
    start = batch.m + k - 1
    return logits[:, start : start + r], tap, v2, b, k


def response_nll(logits: torch.Tensor, batch: Batch) -> torch.Tensor:
    """Per-row mean NLL (nats/token) of the response tokens (+ <eos>)."""
    tgt = batch.ids[:, batch.m :]
    lp = torch.log_softmax(logits if logits.dtype == torch.float64 else logits.float(), -1)
    lp = lp.gather(-1, tgt[..., None])[..., 0]
    w = batch.resp.to(lp.dtype)
    return -(lp * w).sum(1) / w.sum(1).clamp_min(1)


@torch.no_grad()
def greedy(bb: TinyTransformer, prompts: Batch, layer: int, iv: Intervention, n_new: int, eos_id: int):
    """Greedy decoding with the intervention, recomputing the whole sequence each step (no KV cache, as the
    paper's generator): blocks ≤ l on the real tokens, the splice, blocks > l. The trigger is the last
    prompt token, which causal attention never changes, so the bridge is computed once."""
    ids, valid = prompts.ids[:, : prompts.m], prompts.valid[:, : prompts.m]
    done = torch.zeros(ids.shape[0], dtype=torch.bool)
    bridge = None
    out = []
    for step in range(n_new):
        x = run_lower(bb, ids, valid, layer)
        if step == 0:
            bridge = iv.bridge(x[:, prompts.m - 1])
        x2, v2 = iv.apply(x, valid, prompts.m, bridge=bridge)
        logits, _ = run_upper(bb, x2, v2, layer)
        nxt = logits[:, -1].argmax(-1)
        nxt = torch.where(done, torch.full_like(nxt, eos_id), nxt)
        done |= nxt == eos_id
        out.append(nxt)
        ids = torch.cat([ids, nxt[:, None]], 1)
        valid = torch.cat([valid, torch.ones_like(valid[:, :1])], 1)
        if bool(done.all()):
            break
    return torch.stack(out, 1)
