"""Metrics, plots and the report of `rankcal`."""
import pandas as pd

from pipelines.core.plots import bar_plot
from pipelines.core.report import build_report, relative_gain


def evaluate(preds: pd.DataFrame, raw: dict) -> tuple[dict, dict]:
    rows = []
    for (variant, seed), d in preds.groupby(["variant", "seed"]):
        err = d["pred"] - d["y"]
        rows.append({"variant": variant, "seed": int(seed), "test_mse": float((err**2).mean()),
                     "test_mae": float(err.abs().mean())})
    means = pd.DataFrame(rows).groupby("variant")["test_mse"].mean()
    metrics = {"relative_gain.test_mse.ridge_vs_mean_baseline":
               relative_gain(means["mean_baseline"], means["ridge"])}
    figures = {"test_mse": bar_plot(list(means.index), list(means.values), ylabel="test MSE")}
    return build_report("rankcal", raw, rows, metrics, artifacts=figures), figures
