"""Typed parameters of `tess` (validated before any node runs; unknown keys are rejected)."""

from typing import Any, ClassVar, Literal

from pydantic import Field, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt, model_validator

from pipelines.core.api import Fraction, MethodParams, Probability, Strict


class Data(Strict):
    n_windows: int = Field(ge=30)
    split: list[float] = Field(min_length=3, max_length=3)  # train / val / test fractions
    history: int = Field(ge=32)  # L
    horizon: int = Field(ge=6)  # H
    period: int = Field(ge=2)
    ar_phi: float = Field(ge=0, lt=1)
    ar_sigma: PositiveFloat
    p_event: Probability
    reliability: Probability  # rho: share of texts rendered from the true primitives
    lexicon_overlap: float = Field(gt=0, le=1)  # share of generator synonyms the extractor lexicon knows
    distractor_rate: NonNegativeFloat  # Poisson mean of distractor sentences at level A
    hedge_rate: Probability
    # share of the TEST windows' cue phrases drawn from paraphrases that never occur in training
    # (0: every test phrase is one the train split also uses, i.e. the closed-vocabulary benchmark)
    unseen_paraphrase_share: Probability = 0.5
    data_seed: int = 0
    source: Literal["synthetic", "files"] = "synthetic"
    windows_path: str | None = None  # --env=full: user data (see README)
    texts_path: str | None = None

    @model_validator(mode="after")
    def _check(self):
        if abs(sum(self.split) - 1) > 1e-6:
            raise ValueError("split fractions must sum to 1")
        if self.source == "files" and not (self.windows_path and self.texts_path):
            raise ValueError("source 'files' needs windows_path and texts_path")
        return self


class Labeller(Strict):
    shift_quantiles: list[float] = Field(min_length=2, max_length=2)  # |s| cut points -> STABLE/MILD/STRONG
    vol_quantiles: list[float] = Field(min_length=2, max_length=2)
    osc_sign_changes: PositiveInt
    osc_rel_step: Fraction
    trend_share: Fraction
    diffuse_quantile: float = Field(ge=0, lt=1)
    min_label_share: float = Field(ge=0, lt=0.5)


class LLM(Strict):
    base_url: str | None = None
    model: str = "qwen3-8b"
    api_key_env: str = "OPENAI_API_KEY"
    timeout_s: PositiveFloat = 60
    samples: PositiveInt = 4
    temperature: NonNegativeFloat = 0.7
    cache_dir: str = "data/03_primary/tess/llm_cache"


class Head(Strict):
    """The `minilm_head` extractor: per-primitive multinomial logistic regression on frozen MiniLM sentence
    embeddings, fitted on the train windows' primitive labels (L-BFGS, early stopping on val loss)."""

    l2: NonNegativeFloat = 1e-2  # penalty on the weights, added to the mean cross-entropy
    steps: PositiveInt = 15  # L-BFGS steps (20 iterations each)
    patience: PositiveInt = 2
    folds: int = Field(default=5, ge=2)  # cross-fitting: train-window extractions are out-of-fold


class Extractor(Strict):
    backend: Literal["minilm_head", "lexicon", "prototype", "llm"] = "minilm_head"
    temperature: PositiveFloat = 1.0
    prototype_temperature: PositiveFloat = 0.05
    head: Head = Head()
    llm: LLM = LLM()


class Model(Strict):
    d_model: int = Field(ge=8)
    n_heads: PositiveInt
    n_layers: PositiveInt
    d_ff: int = Field(ge=8)
    patch_len: int = Field(ge=2)
    stride: PositiveInt
    dropout: float = Field(ge=0, lt=1)
    gate_hidden: int = Field(ge=4)
    text_tokens: int = Field(ge=8)  # MiniLM tokens kept per text (cross-attention baseline)
    token_dim: int = Field(ge=4)  # PCA size of MiniLM token embeddings

    @model_validator(mode="after")
    def _heads(self):
        if self.d_model % self.n_heads:
            raise ValueError("d_model must be divisible by n_heads")
        return self


class Train(Strict):
    epochs: PositiveInt
    batch_size: PositiveInt
    lr: PositiveFloat
    weight_decay: NonNegativeFloat
    patience: PositiveInt
    lambda_gate: NonNegativeFloat


class Eval(Strict):
    sweeps: bool = False
    single_seed_variants: bool = True  # ablations / level-D runs on the first seed only (budget)
    forecast_plots: NonNegativeInt = 4


class Params(MethodParams):
    USER_FILES: ClassVar[dict[str, str]] = {"data.windows_path": "parquet", "data.texts_path": "parquet"}
    USER_FILE_SETTINGS: ClassVar[dict[str, Any]] = {"data.source": "files"}
    THREADS_SCALE = True  # models large enough that a second intra-op thread pays (docs/threads.md)
    data: Data
    labeller: Labeller
    extractor: Extractor = Extractor()
    model: Model
    train: Train
    eval: Eval = Eval()
