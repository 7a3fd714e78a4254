"""The public API of core: all a method imports (``from pipelines.core.api import …``).

An import-linter contract (pyproject.toml, run by ``.ci/run``) keeps it so: methods import this
module, never another core module, and never each other; core never imports a method. The names
load lazily (PEP 562), so importing a method's parameters does not import torch or matplotlib;
type checkers see the real imports.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: public name → (core module, name there)
_EXPORTS: dict[str, tuple[str, str]] = {
    # the contract a method declares (core builds the pipeline, report and runs from it)
    "Data": ("spec", "Data"),
    "Diff": ("spec", "Diff"),
    "Fn": ("spec", "Fn"),
    "Gain": ("spec", "Gain"),
    "Method": ("spec", "Method"),
    "Ratio": ("spec", "Ratio"),
    "Results": ("spec", "Results"),
    "SeedValues": ("spec", "SeedValues"),
    "Train": ("spec", "Train"),
    "json_records": ("spec", "json_records"),
    "paired": ("spec", "paired"),
    # parameters: the base class, shared blocks and types, validation
    "Fraction": ("params", "Fraction"),
    "MethodParams": ("params", "MethodParams"),
    "Probability": ("params", "Probability"),
    "Strict": ("params", "Strict"),
    "TinyTransformerParams": ("params", "TinyTransformerParams"),
    "VariantName": ("params", "VariantName"),
    "VariantSeeds": ("params", "VariantSeeds"),
    "keys_of": ("params", "keys_of"),
    "names_of": ("params", "names_of"),
    "validate": ("params", "validate"),
    # a node's preamble: seed, threads, device
    "node_setup": ("runtime", "node_setup"),
    "seed_everything": ("runtime", "seed_everything"),
    "to_cpu": ("runtime", "to_cpu"),
    # user files: schemas and the one-line input error
    "InputDataError": ("schemas", "InputDataError"),
    "TableSchema": ("schemas", "TableSchema"),
    "read_feature_csv": ("schemas", "read_feature_csv"),
    "read_user_file": ("schemas", "read_user_file"),
    # the training loop
    "StepInfo": ("training", "StepInfo"),
    "fit": ("training", "fit"),
    # metrics, their intervals, interleaved timing
    "argmax_ties": ("metrics", "argmax_ties"),
    "binned_ece": ("metrics", "binned_ece"),
    "equal_mass_bins": ("metrics", "equal_mass_bins"),
    "interleaved_timing": ("metrics", "interleaved_timing"),
    "median_ci": ("metrics", "median_ci"),
    "ratio_ci": ("metrics", "ratio_ci"),
    "relative_gain": ("metrics", "relative_gain"),
    # seed intervals
    "Estimate": ("stats", "Estimate"),
    "t_interval": ("stats", "t_interval"),
    # named random streams
    "np_rng": ("streams", "np_rng"),
    "stream_seed": ("streams", "stream_seed"),
    # evolving quantities for the report's histories
    "history_series": ("report", "history_series"),
    # what the running node is
    "current_node": ("runctx", "current_node"),
    # errors a node raises
    "NonFiniteLossError": ("errors", "NonFiniteLossError"),
    # figures (saved by the plots dataset)
    "bar_plot": ("plots", "bar_plot"),
    "confusion_matrix": ("plots", "confusion_matrix"),
    "finish": ("plots", "finish"),
    "heatmap": ("plots", "heatmap"),
    "line_plot": ("plots", "line_plot"),
    "reliability_diagram": ("plots", "reliability_diagram"),
    # shared model code: tiny transformers, SSMs, tokenizer, KV cache
    "Block": ("seqmodels", "Block"),
    "KVCache": ("seqmodels", "KVCache"),
    "SSMConfig": ("seqmodels", "SSMConfig"),
    "SelectiveSSM": ("seqmodels", "SelectiveSSM"),
    "SelectiveSSMLM": ("seqmodels", "SelectiveSSMLM"),
    "TinyConfig": ("seqmodels", "TinyConfig"),
    "TinyTransformer": ("seqmodels", "TinyTransformer"),
    "Tokenizer": ("seqmodels", "Tokenizer"),
    "generate": ("seqmodels", "generate"),
    "sequence_logprobs": ("seqmodels", "sequence_logprobs"),
    # shared RL code: GRPO, PPO-clip, KL estimators
    "GRPOBatch": ("rl", "GRPOBatch"),
    "Rollouts": ("rl", "Rollouts"),
    "group_advantages": ("rl", "group_advantages"),
    "grpo_train": ("rl", "grpo_train"),
    "k3_kl": ("rl", "k3_kl"),
    "masked_mean": ("rl", "masked_mean"),
    "ppo_clip_loss": ("rl", "ppo_clip_loss"),
    "token_entropy": ("rl", "token_entropy"),
    # the OpenAI-compatible chat client
    "ChatClient": ("llm", "ChatClient"),
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # the real imports, for type checkers and IDEs ("x as x": an explicit re-export)
    from pipelines.core.errors import (
        NonFiniteLossError as NonFiniteLossError,
    )
    from pipelines.core.llm import (
        ChatClient as ChatClient,
    )
    from pipelines.core.metrics import (
        argmax_ties as argmax_ties,
    )
    from pipelines.core.metrics import (
        binned_ece as binned_ece,
    )
    from pipelines.core.metrics import (
        equal_mass_bins as equal_mass_bins,
    )
    from pipelines.core.metrics import (
        interleaved_timing as interleaved_timing,
    )
    from pipelines.core.metrics import (
        median_ci as median_ci,
    )
    from pipelines.core.metrics import (
        ratio_ci as ratio_ci,
    )
    from pipelines.core.metrics import (
        relative_gain as relative_gain,
    )
    from pipelines.core.params import (
        Fraction as Fraction,
    )
    from pipelines.core.params import (
        MethodParams as MethodParams,
    )
    from pipelines.core.params import (
        Probability as Probability,
    )
    from pipelines.core.params import (
        Strict as Strict,
    )
    from pipelines.core.params import (
        TinyTransformerParams as TinyTransformerParams,
    )
    from pipelines.core.params import (
        VariantName as VariantName,
    )
    from pipelines.core.params import (
        VariantSeeds as VariantSeeds,
    )
    from pipelines.core.params import (
        keys_of as keys_of,
    )
    from pipelines.core.params import (
        names_of as names_of,
    )
    from pipelines.core.params import (
        validate as validate,
    )
    from pipelines.core.plots import (
        bar_plot as bar_plot,
    )
    from pipelines.core.plots import (
        confusion_matrix as confusion_matrix,
    )
    from pipelines.core.plots import (
        finish as finish,
    )
    from pipelines.core.plots import (
        heatmap as heatmap,
    )
    from pipelines.core.plots import (
        line_plot as line_plot,
    )
    from pipelines.core.plots import (
        reliability_diagram as reliability_diagram,
    )
    from pipelines.core.report import (
        history_series as history_series,
    )
    from pipelines.core.rl import (
        GRPOBatch as GRPOBatch,
    )
    from pipelines.core.rl import (
        Rollouts as Rollouts,
    )
    from pipelines.core.rl import (
        group_advantages as group_advantages,
    )
    from pipelines.core.rl import (
        grpo_train as grpo_train,
    )
    from pipelines.core.rl import (
        k3_kl as k3_kl,
    )
    from pipelines.core.rl import (
        masked_mean as masked_mean,
    )
    from pipelines.core.rl import (
        ppo_clip_loss as ppo_clip_loss,
    )
    from pipelines.core.rl import (
        token_entropy as token_entropy,
    )
    from pipelines.core.runctx import (
        current_node as current_node,
    )
    from pipelines.core.runtime import (
        node_setup as node_setup,
    )
    from pipelines.core.runtime import (
        seed_everything as seed_everything,
    )
    from pipelines.core.runtime import (
        to_cpu as to_cpu,
    )
    from pipelines.core.schemas import (
        InputDataError as InputDataError,
    )
    from pipelines.core.schemas import (
        TableSchema as TableSchema,
    )
    from pipelines.core.schemas import (
        read_feature_csv as read_feature_csv,
    )
    from pipelines.core.schemas import (
        read_user_file as read_user_file,
    )
    from pipelines.core.seqmodels import (
        Block as Block,
    )
    from pipelines.core.seqmodels import (
        KVCache as KVCache,
    )
    from pipelines.core.seqmodels import (
        SelectiveSSM as SelectiveSSM,
    )
    from pipelines.core.seqmodels import (
        SelectiveSSMLM as SelectiveSSMLM,
    )
    from pipelines.core.seqmodels import (
        SSMConfig as SSMConfig,
    )
    from pipelines.core.seqmodels import (
        TinyConfig as TinyConfig,
    )
    from pipelines.core.seqmodels import (
        TinyTransformer as TinyTransformer,
    )
    from pipelines.core.seqmodels import (
        Tokenizer as Tokenizer,
    )
    from pipelines.core.seqmodels import (
        generate as generate,
    )
    from pipelines.core.seqmodels import (
        sequence_logprobs as sequence_logprobs,
    )
    from pipelines.core.spec import (
        Data as Data,
    )
    from pipelines.core.spec import (
        Diff as Diff,
    )
    from pipelines.core.spec import (
        Fn as Fn,
    )
    from pipelines.core.spec import (
        Gain as Gain,
    )
    from pipelines.core.spec import (
        Method as Method,
    )
    from pipelines.core.spec import (
        Ratio as Ratio,
    )
    from pipelines.core.spec import (
        Results as Results,
    )
    from pipelines.core.spec import (
        SeedValues as SeedValues,
    )
    from pipelines.core.spec import (
        Train as Train,
    )
    from pipelines.core.spec import (
        json_records as json_records,
    )
    from pipelines.core.spec import (
        paired as paired,
    )
    from pipelines.core.stats import (
        Estimate as Estimate,
    )
    from pipelines.core.stats import (
        t_interval as t_interval,
    )
    from pipelines.core.streams import (
        np_rng as np_rng,
    )
    from pipelines.core.streams import (
        stream_seed as stream_seed,
    )
    from pipelines.core.training import (
        StepInfo as StepInfo,
    )
    from pipelines.core.training import (
        fit as fit,
    )


def __getattr__(name: str) -> Any:
    try:
        module, attr = _EXPORTS[name]
    except KeyError:
        raise AttributeError(
            f"module 'pipelines.core.api' has no attribute {name!r} (the public API: {', '.join(__all__)})"
        ) from None
    value = getattr(importlib.import_module(f"pipelines.core.{module}"), attr)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return __all__
