"""Plot helpers returning matplotlib Figures (saved by ``FiguresDataset`` and logged to MLflow)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def reliability_bins(confidence: np.ndarray, correct: np.ndarray, n_bins: int = 10):
    """Equal-width bins on [0, 1]: (bin centres, mean confidence, accuracy, counts) and the ECE."""
    confidence, correct = np.asarray(confidence, float), np.asarray(correct, float)
    edges = np.linspace(0, 1, n_bins + 1)
    idx = np.clip(np.digitize(confidence, edges[1:-1]), 0, n_bins - 1)
    counts = np.bincount(idx, minlength=n_bins)
    conf = np.bincount(idx, confidence, n_bins) / np.maximum(counts, 1)
    acc = np.bincount(idx, correct, n_bins) / np.maximum(counts, 1)
    ece = float(np.sum(counts / max(len(confidence), 1) * np.abs(acc - conf)))
    return (edges[:-1] + edges[1:]) / 2, conf, acc, counts, ece


def reliability_diagram(confidence, correct, n_bins: int = 10, title: str = "Reliability diagram"):
    centres, conf, acc, counts, ece = reliability_bins(confidence, correct, n_bins)
    fig, ax = plt.subplots(figsize=(4.5, 4.5))
    width = 1.0 / n_bins
    mask = counts > 0
    ax.bar(centres[mask], acc[mask], width=width * 0.9, edgecolor="k", alpha=0.7, label="accuracy")
    ax.plot([0, 1], [0, 1], "k--", lw=1, label="perfect calibration")
    ax.plot(conf[mask], acc[mask], "o", color="C3", ms=4, label="mean confidence")
    ax.set(
        xlim=(0, 1),
        ylim=(0, 1),
        xlabel="predicted probability",
        ylabel="observed frequency",
        title=f"{title}\nECE = {ece:.3f}",
    )
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    return fig


def confusion_matrix(cm: np.ndarray, labels: Sequence[str], title: str = "Confusion matrix"):
    cm = np.asarray(cm, float)
    norm = cm / np.maximum(cm.sum(1, keepdims=True), 1)
    fig, ax = plt.subplots(figsize=(1 + 0.6 * len(labels), 1 + 0.6 * len(labels)))
    ax.imshow(norm, cmap="Blues", vmin=0, vmax=1)
    ax.set_xticks(range(len(labels)), labels, rotation=45, ha="right", fontsize=7)
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
    for i in range(len(labels)):
        for j in range(len(labels)):
            ax.text(
                j,
                i,
                int(cm[i, j]),
                ha="center",
                va="center",
                fontsize=6,
                color="white" if norm[i, j] > 0.5 else "black",
            )
    ax.set(xlabel="predicted", ylabel="true", title=title)
    fig.tight_layout()
    return fig


def line_plot(
    x,
    series: Mapping[str, Sequence[float]],
    xlabel: str,
    ylabel: str,
    title: str = "",
    errors: Mapping[str, Sequence[float]] | None = None,
    logy: bool = False,
):
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, ys in series.items():
        err = (errors or {}).get(name)
        if err is not None:
            ax.errorbar(x, ys, yerr=err, marker="o", capsize=3, label=name)
        else:
            ax.plot(x, ys, marker="o", label=name)
    return finish(fig, ax, xlabel=xlabel, ylabel=ylabel, title=title, **({"yscale": "log"} if logy else {}))


def finish(fig, ax, legend: float | None = 8, **labels):
    """The usual close of a one-axes figure: ``ax.set(**labels)`` (labels, title, scales), a light grid, the
    legend in ``legend`` pt (none when None) and a tight layout. Returns the figure."""
    ax.set(**labels)
    ax.grid(alpha=0.3)
    if legend is not None:
        ax.legend(fontsize=legend)
    fig.tight_layout()
    return fig


def bar_plot(
    names: Sequence[str],
    values: Sequence[float],
    errors: Sequence[float] | None = None,
    ylabel: str = "",
    title: str = "",
):
    fig, ax = plt.subplots(figsize=(max(5, 0.6 * len(names)), 4))
    ax.bar(range(len(names)), values, yerr=errors, capsize=3, color="C0", edgecolor="k")
    ax.set_xticks(range(len(names)), names, rotation=45, ha="right", fontsize=8)
    ax.set(ylabel=ylabel, title=title)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def heatmap(
    values: np.ndarray,
    xlabels: Sequence,
    ylabels: Sequence,
    title: str = "",
    fmt: str = "{:.2f}",
    xlabel: str = "",
    ylabel: str = "",
    cmap: str = "viridis",
):
    values = np.asarray(values, float)
    fig, ax = plt.subplots(figsize=(1.5 + 0.7 * len(xlabels), 1.2 + 0.5 * len(ylabels)))
    im = ax.imshow(values, cmap=cmap, aspect="auto")
    ax.set_xticks(range(len(xlabels)), [str(x) for x in xlabels])
    ax.set_yticks(range(len(ylabels)), [str(y) for y in ylabels])
    for i in range(values.shape[0]):
        for j in range(values.shape[1]):
            ax.text(j, i, fmt.format(values[i, j]), ha="center", va="center", fontsize=7, color="w")
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    return fig


def close_all(figures: Mapping[str, object]) -> None:
    for f in figures.values():
        plt.close(f)
