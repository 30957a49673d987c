"""What a run learns: classification or language modelling, the one place the two differ.

Chosen by the dataset module's declared `TASK` (compbench.data), never by its name. A task says
how the loss is taken, what evaluation sums and reports, what throughput counts (samples or
tokens), and which figures results.json's summary holds. The trainer loop calls it and nothing else
of this difference.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

Median = Callable[[str], "float | None"]


class Classification:
    """(x, label) samples: cross-entropy, top-1 accuracy and loss on the test set, samples/s."""

    name = "classification"
    throughput_tag = "train/throughput"
    units = "samples"

    def loss(self, output: Tensor, target: Tensor) -> Tensor:
        return F.cross_entropy(output, target)

    def count(self, target: Tensor) -> int:
        """Throughput units in a batch: samples."""
        return len(target)

    def eval_sums(self, model: nn.Module, loaders: list, device: torch.device) -> Tensor:
        """This rank's sums over the evaluation set on `device` (allreduced by the trainer): correct,
        samples, summed cross-entropy."""
        sums = torch.zeros(3, dtype=torch.float64, device=device)
        for x, y in loaders[0]:
            out = model(x)
            sums[0] += (out.argmax(1) == y).sum()
            sums[1] += len(y)
            sums[2] += F.cross_entropy(out, y, reduction="sum").double()
        return sums

    def metrics(self, total: Tensor) -> dict[str, float]:
        out = {"eval/acc1": float(100 * total[0] / total[1])}
        if len(total) > 2:  # with the summed loss
            out["eval/loss"] = float(total[2] / total[1])
        return out

    def describe(self, m: Mapping[str, float]) -> str:
        return f"eval/acc1 {m['eval/acc1']:.2f}%  eval/loss {m['eval/loss']:.4f}"

    def summary(self, final: Mapping[str, float], history: Mapping[str, list[float]],
                median: Median) -> dict[str, Any]:
        return {"final_acc1": final.get("eval/acc1", float("nan")),
                "best_acc1": max(history["eval/acc1"], default=float("nan")),
                "final_test_loss": final.get("eval/loss", float("nan")),
                "final_loss": _last(history, "train/loss"),
                "throughput": median("train/throughput")}

    def data_info(self, train_set: Any) -> dict[str, Any] | None:
        return None  # results.json unchanged for classification runs


class LanguageModel:
    """(x, y) token windows, y = x one token later: cross-entropy per token (nats), perplexity,
    tokens/s. A second evaluation set, where the dataset has one, is the out-of-domain text."""

    name = "language_model"
    throughput_tag = "train/tokens_per_s"
    units = "tokens"
    PREFIXES = ("eval/", "eval/ood_")

    def loss(self, output: Tensor, target: Tensor) -> Tensor:
        return F.cross_entropy(output.flatten(0, 1), target.flatten())

    def count(self, target: Tensor) -> int:
        """Throughput units in a batch: predicted tokens."""
        return target.numel()

    def eval_sums(self, model: nn.Module, loaders: list, device: torch.device) -> Tensor:
        """Summed token losses (nats) and token counts, per evaluation set, on this rank (on `device`)."""
        sums = torch.zeros(2 * len(loaders), dtype=torch.float64, device=device)
        for i, loader in enumerate(loaders):
            for x, y in loader:
                sums[2 * i] += F.cross_entropy(model(x).flatten(0, 1), y.flatten(), reduction="sum").double()
                sums[2 * i + 1] += y.numel()
        return sums

    def metrics(self, total: Tensor) -> dict[str, float]:
        out = {}
        for i, prefix in enumerate(self.PREFIXES[: len(total) // 2]):
            loss = float(total[2 * i] / total[2 * i + 1])
            out[f"{prefix}loss"], out[f"{prefix}ppl"] = loss, math.exp(loss)
        return out

    def describe(self, m: Mapping[str, float]) -> str:
        text = f"eval/loss {m['eval/loss']:.4f} nats/token (ppl {m['eval/ppl']:.2f})"
        if "eval/ood_loss" in m:
            text += f"  eval/ood_loss {m['eval/ood_loss']:.4f} (ppl {m['eval/ood_ppl']:.2f})"
        return text

    def summary(self, final: Mapping[str, float], history: Mapping[str, list[float]],
                median: Median) -> dict[str, Any]:
        nan = float("nan")
        return {"final_eval_loss": final.get("eval/loss", nan),
                "best_eval_loss": min(history["eval/loss"], default=nan),
                "final_ppl": final.get("eval/ppl", nan),
                "final_ood_loss": final.get("eval/ood_loss", nan),
                "final_ood_ppl": final.get("eval/ood_ppl", nan),
                "final_loss": _last(history, "train/loss"),
                "tokens_per_s": median("train/tokens_per_s")}

    def data_info(self, train_set: Any) -> dict[str, Any] | None:
        """Tokenizer, vocabulary size, split and token counts (compbench.data.shakespeare)."""
        return dict(train_set.info)


TASKS = {t.name: t for t in (Classification, LanguageModel)}


def _last(history: Mapping[str, list[float]], tag: str) -> float:
    return history[tag][-1] if history[tag] else float("nan")


def task_of(dataset_target: str) -> Classification | LanguageModel:
    """The task the dataset's module declares (its `TASK`)."""
    declared = importlib.import_module(dataset_target.rsplit(".", 1)[0]).TASK
    return TASKS[declared]()
