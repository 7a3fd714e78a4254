"""Typed parameters of `tess` (validated before any node runs; unknown keys are rejected)."""
from typing import Literal

from pydantic import Field, model_validator

from pipelines.core.params import MethodParams, Strict


class Data(Strict):
    n_windows: int = Field(ge=30)
    split: list[float] = Field(min_length=3, max_length=3)  # train / val / test fractions
    history: int = Field(ge=32)          # L
    horizon: int = Field(ge=6)           # H
    period: int = Field(ge=2)
    ar_phi: float = Field(ge=0, lt=1)
    ar_sigma: float = Field(gt=0)
    p_event: float = Field(ge=0, le=1)
    reliability: float = Field(ge=0, le=1)        # rho: share of texts rendered from the true primitives
    lexicon_overlap: float = Field(gt=0, le=1)    # share of generator synonyms the extractor lexicon knows
    distractor_rate: float = Field(ge=0)          # Poisson mean of distractor sentences at level A
    hedge_rate: float = Field(ge=0, le=1)
    # share of the TEST windows' cue phrases drawn from paraphrases that never occur in training
    # (0: every test phrase is one the train split also uses, i.e. the closed-vocabulary benchmark)
    unseen_paraphrase_share: float = Field(default=0.5, ge=0, le=1)
    data_seed: int = 0
    source: Literal["synthetic", "files"] = "synthetic"
    windows_path: str | None = None               # --env=full: user data (see README)
    texts_path: str | None = None

    @model_validator(mode="after")
    def _check(self):
        if abs(sum(self.split) - 1) > 1e-6:
            raise ValueError("split fractions must sum to 1")
        if self.source == "files" and not (self.windows_path and self.texts_path):
            raise ValueError("source 'files' needs windows_path and texts_path")
        return self


class Labeller(Strict):
    shift_quantiles: list[float] = Field(min_length=2, max_length=2)   # |s| cut points -> STABLE/MILD/STRONG
    vol_quantiles: list[float] = Field(min_length=2, max_length=2)
    osc_sign_changes: int = Field(ge=1)
    osc_rel_step: float = Field(gt=0, lt=1)
    trend_share: float = Field(gt=0, lt=1)
    diffuse_quantile: float = Field(ge=0, lt=1)
    min_label_share: float = Field(ge=0, lt=0.5)


class LLM(Strict):
    base_url: str | None = None
    model: str = "qwen3-8b"
    api_key_env: str = "OPENAI_API_KEY"
    timeout_s: float = Field(default=60, gt=0)
    samples: int = Field(default=4, ge=1)
    temperature: float = Field(default=0.7, ge=0)
    cache_dir: str = "data/03_primary/tess/llm_cache"


class Head(Strict):
    """The `minilm_head` extractor: per-primitive multinomial logistic regression on frozen MiniLM sentence
    embeddings, fitted on the train windows' primitive labels (L-BFGS, early stopping on val loss)."""
    l2: float = Field(default=1e-2, ge=0)          # penalty on the weights, added to the mean cross-entropy
    steps: int = Field(default=15, ge=1)           # L-BFGS steps (20 iterations each)
    patience: int = Field(default=2, ge=1)
    folds: int = Field(default=5, ge=2)            # cross-fitting: train-window extractions are out-of-fold


class Extractor(Strict):
    backend: Literal["minilm_head", "lexicon", "prototype", "llm"] = "minilm_head"
    temperature: float = Field(default=1.0, gt=0)
    prototype_temperature: float = Field(default=0.05, gt=0)
    head: Head = Head()
    llm: LLM = LLM()


class Model(Strict):
    d_model: int = Field(ge=8)
    n_heads: int = Field(ge=1)
    n_layers: int = Field(ge=1)
    d_ff: int = Field(ge=8)
    patch_len: int = Field(ge=2)
    stride: int = Field(ge=1)
    dropout: float = Field(ge=0, lt=1)
    gate_hidden: int = Field(ge=4)
    text_tokens: int = Field(ge=8)       # MiniLM tokens kept per text (cross-attention baseline)
    token_dim: int = Field(ge=4)         # PCA size of MiniLM token embeddings

    @model_validator(mode="after")
    def _heads(self):
        if self.d_model % self.n_heads:
            raise ValueError("d_model must be divisible by n_heads")
        return self


class Train(Strict):
    epochs: int = Field(ge=1)
    batch_size: int = Field(ge=1)
    lr: float = Field(gt=0)
    weight_decay: float = Field(ge=0)
    patience: int = Field(ge=1)
    lambda_gate: float = Field(ge=0)


class Eval(Strict):
    sweeps: bool = False
    single_seed_variants: bool = True   # ablations / level-D runs on the first seed only (budget)
    forecast_plots: int = Field(default=4, ge=0)


class Params(MethodParams):
    data: Data
    labeller: Labeller
    extractor: Extractor = Extractor()
    model: Model
    train: Train
    eval: Eval = Eval()
