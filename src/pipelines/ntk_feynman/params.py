"""Typed parameters of `ntk_feynman`: node functions take `Params` as a type hint, Kedro validates it before
any node runs, and a bad value stops the command with one line naming the key."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, ValidationInfo, field_validator, model_validator

from pipelines.core.api import MethodParams, Strict, keys_of

# the theory variants: first-order recursions, the ablation without inter-layer terms, infinite width
THEORY_VARIANTS = ("recursion", "no_interlayer", "infinite_width")
ACTIVATION_KINDS = ("relu", "tanh", "gelu", "linear")
TENSORS = ("V", "A", "B", "D", "F")
DNTK_TENSORS = ("P", "Q")  # the dNTK-preactivation cross-correlations (dntk.py)
DDNTK_TENSORS = ("R", "S", "T", "U")  # the ddNTK means (ddntk.py)


class Activation(Strict):
    """σ and its criticality constants (PDLT conventions: Var b = c_b, Var W = c_w / n_prev)."""

    c_w: float = Field(gt=0, le=10)
    c_b: float = Field(ge=0, le=10)


class Data(Strict):
    n0: int = Field(ge=1, le=4096)  # input dimension
    sq_norm: float = Field(gt=0, le=100)  # ||x||^2 / n0 of the seeded input
    n_inputs: int = Field(default=1, ge=1, le=16)  # seeded inputs (each treated as its own single input)
    input_seed: int = Field(default=2026, ge=0)
    inputs_path: str | None = None  # full env: CSV of input vectors, columns x_0..x_{n0-1}
    # two-input extension: a second input at this cosine to the first (same norm) seen by the same nets;
    # with inputs_path, the file's first two rows form the pair. null: single inputs only
    pair_cosine: float | None = Field(default=0.5, ge=-0.99, le=0.99)


class Net(Strict):
    depth: int = Field(ge=2, le=32)  # L: number of layers (the last one's statistics are the headline)
    lambda_b: float = Field(ge=0, le=100)
    lambda_w: float = Field(ge=0, le=100)


class Quadrature(Strict):
    nodes_per_half: int = Field(ge=16, le=2000)  # Gauss-Legendre nodes on each half-line (split at z = 0)
    half_width_sd: float = Field(ge=6, le=40)  # integration range in standard deviations


class _Sampler(Strict):
    """What every Monte-Carlo block shares: strictly increasing widths in [2, MAX_WIDTH] (pairs i != k need
    n >= 2), one stream of nets per seed and width, kept in blocks (the batch means of the s.e.), drawn in
    chunks of chunk_elems // width^2 nets."""

    MAX_WIDTH: ClassVar[int] = 1024
    widths: list[int] = Field(min_length=2)
    nets_per_seed: list[int] = Field(min_length=2)  # per width: each seed is one stream of this many nets
    blocks_per_seed: int = Field(ge=2, le=1000)
    chunk_elems: int = Field(ge=10_000, le=1_000_000_000)

    @field_validator("widths")
    @classmethod
    def _widths(cls, v: list[int]) -> list[int]:
        if min(v) < 2 or max(v) > cls.MAX_WIDTH:
            raise ValueError(f"every width must lie in [2, {cls.MAX_WIDTH}] (pairs i != k need n >= 2)")
        if v != sorted(set(v)):
            raise ValueError(f"widths must be strictly increasing, got {v}")
        return v

    @model_validator(mode="after")
    def _streams(self):
        if len(self.nets_per_seed) != len(self.widths):
            raise ValueError(
                f"nets_per_seed: needs one entry per width ({len(self.widths)}), got {len(self.nets_per_seed)}"
            )
        if min(self.nets_per_seed) < self.blocks_per_seed:
            raise ValueError(f"nets_per_seed: every entry must be >= blocks_per_seed ({self.blocks_per_seed})")
        return self


class MonteCarlo(_Sampler):
    """Sampled nets for the kernel and NTK statistics (variants mc_<activation>)."""

    MAX_WIDTH: ClassVar[int] = 4096
    narrow_width: int = Field(ge=2)  # the error-ratio claim compares the widest width to this
    claim_widths: list[int] = Field(min_length=1)  # the "large" widths the agreement claims read
    slope_min_width: int = Field(ge=1)  # log-log fits use widths >= this

    @model_validator(mode="after")
    def _consistent(self):
        if self.narrow_width not in self.widths:
            raise ValueError(f"narrow_width: {self.narrow_width} not in widths {self.widths}")
        bad = [w for w in self.claim_widths if w not in self.widths]
        if bad:
            raise ValueError(f"claim_widths: {bad} not in widths {self.widths}")
        if sum(w >= self.slope_min_width for w in self.widths) < 2:
            raise ValueError(f"slope_min_width: fewer than 2 widths >= {self.slope_min_width}")
        return self


class DntkMonteCarlo(_Sampler):
    """Sampled nets for the dNTK statistics P, Q (variants mc_dntk_<activation>): autograd through the
    NTK recursion, O(n^3) per layer and net, so smaller widths than the kernel/NTK sampler."""

    probes: int = Field(default=1, ge=1, le=64)  # Rademacher probes per net for S2 = sum_ik dTh_iik z_k
    narrow_width: int = Field(ge=2)  # the error-ratio claim: widest width vs this one
    slope_min_width: int = Field(ge=1)  # log-log slope fits use widths >= this

    @model_validator(mode="after")
    def _consistent(self):
        if self.narrow_width not in self.widths:
            raise ValueError(f"narrow_width: {self.narrow_width} not in widths {self.widths}")
        if sum(w >= self.slope_min_width for w in self.widths) < 2:
            raise ValueError(f"slope_min_width: fewer than 2 widths >= {self.slope_min_width}")
        return self


class DdntkMonteCarlo(_Sampler):
    """Sampled nets for the ddNTK means R, S, T, U (variants mc_ddntk_<activation>): four double-backward
    Hessian forms per layer and net with Rademacher probes, every layer 2..depth."""

    MAX_WIDTH: ClassVar[int] = 512
    slope_min_width: int = Field(ge=1)  # log-log slope fits of the raw means use widths >= this

    @model_validator(mode="after")
    def _consistent(self):
        if sum(w >= self.slope_min_width for w in self.widths) < 2:
            raise ValueError(f"slope_min_width: fewer than 2 widths >= {self.slope_min_width}")
        return self


class Ntk2MonteCarlo(_Sampler):
    """Sampled nets for the two-input NTK tensors V, D, A, B, F with input indices (variants
    mc_ntk2_<activation>, ntk2.sample_two_input): the data.inputs pair through the same nets, every layer."""


class Dntk2MonteCarlo(_Sampler):
    """Sampled nets for the two-input dNTK statistics P, Q with input indices (variants mc_dntk2_<activation>,
    ntk2.sample_two_input_dntk): autograd through the NTK recursion of the data pair, every layer."""

    MAX_WIDTH: ClassVar[int] = 256


class Ddntk2MonteCarlo(_Sampler):
    """Sampled nets for the two-input ddNTK R, S, T, U with four input indices (variants mc_ddntk2_<activation>,
    ddntk2.sample_two_input_ddntk): 28 double-backward Hessian forms per layer and net for the data pair."""

    MAX_WIDTH: ClassVar[int] = 128


class MultiMonteCarlo(_Sampler):
    """M >= 3 inputs seen by the same nets: the NTK tensors V, D, A, B, F with M input indices (variants
    mc_multi_<activation>, multi.sample_multi; the recursion multi.multi_input_ntk_tensors). The inputs: the
    first is data.inputs' first vector, the others are built from it with the given pairwise cosines and norm
    ratios (a seeded orthogonal complement, multi.inputs_with_cosines); with data.inputs_path, the file's first
    n_inputs rows."""

    MAX_WIDTH: ClassVar[int] = 256
    # defaults per n_inputs (the four-input set contains the three-input one: pairs 12, 13, 23 alike)
    DEFAULT_COSINES: ClassVar[dict[int, list[float]]] = {3: [0.5, 0.2, -0.3], 4: [0.5, 0.2, 0.1, -0.3, 0.4, 0.3]}
    DEFAULT_NORM_RATIOS: ClassVar[dict[int, list[float]]] = {3: [1.0, 1.3, 0.8], 4: [1.0, 1.3, 0.8, 1.1]}
    n_inputs: int = Field(default=3, ge=2, le=6)
    # cosines of the pairs (1,2), (1,3), ..., (2,3), ... (upper triangle, row by row): n(n-1)/2 entries;
    # null: DEFAULT_COSINES[n_inputs] (n_inputs 3 or 4)
    cosines: list[float] | None = None
    norm_ratios: list[float] | None = None  # |x_a| / |x_1|, the first is 1; null: DEFAULT_NORM_RATIOS[n_inputs]
    input_seed: int = Field(default=7, ge=0)

    @model_validator(mode="before")
    @classmethod
    def _defaults(cls, data):
        if not isinstance(data, dict):
            return data
        m = data.get("n_inputs", 3)
        out = dict(data)
        for key, table in (("cosines", cls.DEFAULT_COSINES), ("norm_ratios", cls.DEFAULT_NORM_RATIOS)):
            if out.get(key) is None and isinstance(m, int):
                if m not in table:
                    raise ValueError(
                        f"{key}: no default for n_inputs = {m} (defaults for {sorted(table)}): give the list"
                    )
                out[key] = list(table[m])
        return out

    @model_validator(mode="after")
    def _inputs(self):
        import numpy as np

        m = self.n_inputs
        if len(self.cosines) != m * (m - 1) // 2:
            raise ValueError(
                f"cosines: needs n_inputs (n_inputs - 1) / 2 = {m * (m - 1) // 2} entries (pairs 12, "
                f"13, ..., upper triangle), got {len(self.cosines)}"
            )
        if len(self.norm_ratios) != m or self.norm_ratios[0] != 1.0 or min(self.norm_ratios) <= 0:
            raise ValueError(
                f"norm_ratios: needs n_inputs = {m} positive entries, the first 1.0, got {self.norm_ratios}"
            )
        if max(abs(c) for c in self.cosines) >= 1:
            raise ValueError("cosines: every entry must lie in (-1, 1)")
        C = np.eye(m)
        C[np.triu_indices(m, 1)] = self.cosines
        C = C + np.triu(C, 1).T
        if np.linalg.eigvalsh(C).min() <= 1e-6:
            raise ValueError(f"cosines: {self.cosines} do not form a positive definite cosine matrix")
        return self

    def cosine_matrix(self):
        import numpy as np

        m = self.n_inputs
        C = np.eye(m)
        C[np.triu_indices(m, 1)] = self.cosines
        return C + np.triu(C, 1).T


class MultiDntkMonteCarlo(_Sampler):
    """Sampled nets for the dNTK P, Q of the ``multi`` block's M inputs (variants mc_multi_dntk_<activation>,
    multi.sample_multi_dntk): autograd through the M-input NTK recursion, 2 M^2 + M + M^3 first-order passes per
    layer and net (48 at M = 3, 100 at M = 4), every layer."""

    MAX_WIDTH: ClassVar[int] = 256


class MultiDdntkMonteCarlo(_Sampler):
    """Sampled nets for the ddNTK R, S, T, U of the ``multi`` block's M inputs (variants
    mc_multi_ddntk_<activation>, ddntk2.sample_ddntk_probes): double-backward Hessian forms per layer and net
    (90 passes at M = 3), every layer."""

    MAX_WIDTH: ClassVar[int] = 128


# variant prefixes with a params block of their own, longest first where one prefix starts another
# (mc_dntk2_ before mc_dntk_ is not needed, but mc_multi_ddntk_ / mc_multi_dntk_ before mc_multi_ is)
BLOCK_PREFIXES = (
    "mc_multi_ddntk_",
    "mc_multi_dntk_",
    "mc_multi_",
    "mc_ddntk2_",
    "mc_dntk2_",
    "mc_ntk2_",
    "mc_ddntk_",
    "mc_dntk_",
)


def variant_prefix(name: str) -> str | None:
    """The block prefix of a variant name (``mc_multi_dntk_relu`` -> ``mc_multi_dntk_``), None for the theory
    variants and ``mc_<activation>``."""
    return next((x for x in BLOCK_PREFIXES if name.startswith(x)), None)


class Params(MethodParams):
    USER_FILES: ClassVar[dict[str, str]] = {"data.inputs_path": "csv"}
    data: Data
    net: Net
    activations: keys_of(ACTIVATION_KINDS, Activation) = Field(min_length=1)
    quadrature: Quadrature
    mc: MonteCarlo
    dntk: DntkMonteCarlo | None = None  # needed by mc_dntk_<activation> variants
    ddntk: DdntkMonteCarlo | None = None  # needed by mc_ddntk_<activation> variants
    ntk2: Ntk2MonteCarlo | None = None  # needed by mc_ntk2_<activation> variants (and a data pair)
    dntk2: Dntk2MonteCarlo | None = None  # needed by mc_dntk2_<activation> variants (and a data pair)
    ddntk2: Ddntk2MonteCarlo | None = None  # needed by mc_ddntk2_<activation> variants (and a data pair)
    multi: MultiMonteCarlo | None = None  # needed by mc_multi_<activation> variants (M inputs, multi.py)
    # needed by mc_multi_dntk_<activation> / mc_multi_ddntk_<activation> (with the multi block's inputs)
    multi_dntk: MultiDntkMonteCarlo | None = None
    multi_ddntk: MultiDdntkMonteCarlo | None = None
    variants: list[str] = Field(min_length=1)  # one train.<variant> node each

    @field_validator("variants")
    @classmethod
    def _variants(cls, v: list[str], info: ValidationInfo) -> list[str]:
        acts = info.data.get("activations") or {}
        for name in v:
            # longest prefix first: mc_multi_dntk_ before mc_multi_
            prefix = variant_prefix(name)
            if prefix is not None:
                block = prefix[3:-1]
                # the M-input dNTK / ddNTK samplers see the multi block's inputs: they need that block too
                blocks = [block, "multi"] if block.startswith("multi_") else [block]
                if name[len(prefix) :] in acts and all(info.data.get(b) is not None for b in blocks):
                    continue
                article = "an" if block == "ntk2" else "a"
                need = " and ".join(f"'{b}'" for b in blocks)
                raise ValueError(
                    f"variant {name!r} needs an activation of {sorted(acts)} after '{prefix}' "
                    f"and {article} {need} block{'s' if len(blocks) > 1 else ''}"
                )
            if name in THEORY_VARIANTS or (name.startswith("mc_") and name[3:] in acts):
                continue
            raise ValueError(
                f"unknown variant {name!r}: use {THEORY_VARIANTS}, mc_<activation>, "
                "mc_dntk_<activation>, mc_ddntk_<activation>, mc_ntk2_<activation>, "
                "mc_dntk2_<activation>, mc_ddntk2_<activation>, mc_multi_<activation>, "
                "mc_multi_dntk_<activation> or mc_multi_ddntk_<activation> "
                "with an "
                f"activation of {sorted(acts)}"
            )
        if "recursion" not in v:
            raise ValueError("'recursion' (the method) must be listed")
        return v

    @model_validator(mode="after")
    def _multi_fits_n0(self):
        if self.multi is not None and not self.data.inputs_path and self.multi.n_inputs > self.data.n0:
            raise ValueError(
                f"multi.n_inputs: {self.multi.n_inputs} inputs at prescribed cosines need "
                f"data.n0 >= {self.multi.n_inputs}, got {self.data.n0}"
            )
        return self

    def mc_activations(self) -> list[str]:
        return [v[3:] for v in self.variants if v.startswith("mc_") and variant_prefix(v) is None]

    def block_activations(self, block: str) -> list[str]:
        """The activations of the planned ``mc_<block>_<activation>`` variants of the Monte-Carlo block ``block``
        ("dntk", "multi_dntk", ...; prefixes told apart by :func:`variant_prefix`)."""
        prefix = f"mc_{block}_"
        return [v[len(prefix) :] for v in self.variants if variant_prefix(v) == prefix]

    def block_nets(self, block: str, width: int) -> int:
        """Nets per seed at ``width`` of the Monte-Carlo params block ``block`` ("mc", "dntk", "multi", ...)."""
        b = getattr(self, block)
        return b.nets_per_seed[b.widths.index(width)]

    def nets(self, width: int) -> int:
        return self.block_nets("mc", width)
