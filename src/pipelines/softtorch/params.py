"""Typed parameters of `softtorch`: node functions take `Params` as a type hint, Kedro validates it before
any node runs, and a bad value stops the command with one line naming the key."""

from typing import ClassVar, Literal

from pydantic import Field, PositiveFloat, PositiveInt, field_validator, model_validator

from pipelines.core.api import MethodParams, Strict, keys_of, names_of

# neuralsort is Grover et al.'s published operator; neuralsort_smoothabs (opt-in, not in the default list)
# is the SoftTorch library's variant with a soft |·| in A_s
VARIANTS = ("hard", "neuralsort", "softsort", "ot", "fast_soft_sort", "sorting_network", "neuralsort_smoothabs")
Mode = Literal["hard", "smooth", "c0", "c1", "c2"]


class Accuracy(Strict):
    n: int = Field(ge=2, le=4096)  # input length of the approx_err table
    softness: list[float] = Field(min_length=2)  # decreasing list of softness values
    n_inputs: PositiveInt  # seeded standard-normal rows per softness

    @field_validator("softness")
    @classmethod
    def _positive(cls, v: list[float]) -> list[float]:
        if min(v) <= 0:
            raise ValueError("every softness must be > 0")
        return v


class Toys(Strict):
    softness: PositiveFloat  # softness of the elementwise toys (threshold, rule; raw scale)
    sort_softness: PositiveFloat  # softness of the axiswise toys (median, top-k; squashed scale)
    steps: PositiveInt
    lr: PositiveFloat


class Digits(Strict):
    enabled: bool = True
    seq_len: int = Field(ge=2, le=20)
    n_train: int = Field(ge=10)
    n_test: int = Field(ge=10)
    epochs: PositiveInt
    batch_size: PositiveInt
    lr: PositiveFloat
    softness: PositiveFloat  # on raw scores (no standardisation)
    ot_iters: PositiveInt
    n_seeds: PositiveInt  # the sorter trains on the first n_seeds of `seeds` (sweep-friendly)
    user_csv: str | None = None  # full env: single-digit images, columns label, p0..p{h·w−1} (README)
    image_shape: list[int] = Field(default_factory=lambda: [8, 8], min_length=2, max_length=2)

    @field_validator("image_shape")
    @classmethod
    def _shape(cls, v: list[int]) -> list[int]:
        if min(v) < 4:
            raise ValueError("image height and width must be >= 4 (two 2x2 poolings)")
        return v


class Speed(Strict):
    ns: list[int] = Field(min_length=1)  # the runtime-vs-n curve
    max_n_ot: int = Field(ge=2)  # OT (Sinkhorn) is timed up to this n
    max_n_network: int = Field(ge=2)  # the permutation-tracking bitonic network up to this n
    rounds: PositiveInt
    ot_iters: PositiveInt
    softness: PositiveFloat
    ratio_n_ot: int = Field(ge=2)  # n of the fast_soft_sort vs OT ratio
    ratio_n_quadratic: int = Field(ge=2)  # n of the fast_soft_sort vs neuralsort/softsort ratios


class Params(MethodParams):
    USER_FILES: ClassVar[dict[str, str]] = {"digits.user_csv": "csv"}
    variants: names_of(VARIANTS)  # one train.<variant> node each
    modes: keys_of(VARIANTS, Mode)  # the soft mode each variant runs in
    ot_iters: PositiveInt
    accuracy: Accuracy
    toys: Toys
    digits: Digits
    speed: Speed

    @model_validator(mode="after")
    def _claims_need_digits(self):
        """A claim on the digit study needs it enabled (checked before any node runs); a run without it
        declares its own claims in an env."""
        for c in [*self.gates, *self.claims]:
            if c.metric.split(".")[0] == "sort" and not self.digits.enabled:
                raise ValueError(f"claim '{c.id}': metric '{c.metric}' needs digits.enabled: true")
        return self

    def digit_seeds(self) -> list[int]:
        return list(self.seeds[: self.digits.n_seeds]) if self.digits.enabled else []

    def mode(self, variant: str) -> str:
        return "hard" if variant == "hard" else self.modes.get(variant, "smooth")

    def method(self, variant: str) -> str:
        return "neuralsort" if variant == "hard" else variant
