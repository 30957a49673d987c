"""`dataset=text`: language modelling on a folder of your own text files (`dataset.root=DIR`), with
the windows, tokens and evaluation of `dataset=shakespeare` (compbench.data.shakespeare).

Decisions:
- The files: every `*.txt` under `root` (subfolders included), in the order of their relative paths.
  Empty files are left out; none left, or a folder that is missing, not a folder or not readable,
  is one `error:` line naming `dataset.root`.
- Split by file, so no text is on both sides: of the files in that order, every `holdout_every`-th
  (positions 0, k, 2k, ...) is validation, so there is at least one validation file, and at least one
  training file (two files at least).
- Tokens: `byte` (default): the UTF-8 bytes, 256 ids: any file, any language, `vocab_size` 256.
  `char`: id 0 is `<unk>`, then the distinct characters of the training files in code-point order;
  a validation character no training file has becomes `<unk>` and still counts in the loss (its
  number is in results.json). Every file must then be UTF-8 (a file that is not is named). The
  declared `dataset.vocab_size` (what the model's embedding reads) is checked against the folder
  and the error names the right value.
- Samples: non-overlapping windows of `block_size` tokens over the training files concatenated;
  evaluation: `eval_windows` windows evenly spaced over the validation files (null: all).
"""

from __future__ import annotations

import fnmatch
import functools
import os
from pathlib import Path

import numpy as np
import torch

from compbench.base.values import show
from compbench.data import KeyRange
from compbench.data.shakespeare import TOKENIZERS, TokenWindows, encode, vocabulary, windows

TASK = "language_model"
KEY_RANGES = {"holdout_every": KeyRange(2, what="every k-th file is validation"),
              "block_size": KeyRange(1, what="tokens per window"),
              "vocab_size": KeyRange(1),
              "eval_windows": KeyRange(1, null="all")}
FIX = "pass dataset.root=DIR, a folder of .txt files"


Files = tuple[tuple[str, ...], tuple[str, ...], tuple[int, ...]]  # (relative paths, texts, token counts)


@functools.lru_cache(maxsize=4)
def _scan(folder: str, tokenizer: str, stamp: tuple) -> Files:
    """(relative paths, their texts, their token counts) of the non-empty .txt files; the texts
    decoded for char tokens (latin-1 for byte: one character per byte, encoded back where used).
    Cached on the files' sizes and times, so the parent's checks read the folder once."""
    root = Path(folder)
    names, texts, counts = [], [], []
    for rel, size, _ in stamp:
        if size == 0:
            continue
        path = root / rel
        try:
            data = path.read_bytes()
        except OSError as e:
            raise ValueError(f"dataset.root={folder}: {rel} cannot be read ({e.strerror or e}); fix its "
                             "permissions or remove it") from None
        if tokenizer == "char":
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(f"dataset.root={folder}: {rel} is not UTF-8 text (byte {e.start}); "
                                 "convert it or use dataset.tokenizer=byte") from None
        else:
            text = data.decode("latin-1")
        names.append(rel)
        texts.append(text)
        counts.append(len(text))
    return tuple(names), tuple(texts), tuple(counts)


def _text_files(folder: Path, root: str, glob: str = "*.txt") -> list[Path]:
    """Every file under `folder` whose name matches `glob` (fnmatch: `*.txt`, `*.md`), sorted,
    symlinked folders followed (a user's corpus is often links to where the texts live). Each real
    folder is read once: one reached again (a link back up, a loop; or a second link to it) is
    refused, its files would count twice."""
    seen: dict[str, str] = {}
    found = []
    for here, _, files in os.walk(folder, followlinks=True, onerror=_raise):
        real = os.path.realpath(here)
        rel = os.path.relpath(here, folder)
        if real in seen:
            raise ValueError(f"dataset.root={root}: {rel} is {seen[real]} again (through a symlink), so its "
                             "files would count twice; remove the link")
        seen[real] = rel
        found += [Path(here, name) for name in files
                  if fnmatch.fnmatch(name, glob) and Path(here, name).is_file()]
    return sorted(found)


def _raise(e: OSError) -> None:
    raise e


def _files(root: str | None, tokenizer: str, glob: str) -> Files:
    if not root:
        raise ValueError(f"dataset.root=null: dataset=text reads your own text files; {FIX}")
    folder = Path(root).expanduser()
    if not folder.exists():
        raise ValueError(f"dataset.root={root} does not exist; {FIX}")
    if not folder.is_dir():
        raise ValueError(f"dataset.root={root} is not a folder; {FIX}")
    try:
        paths = _text_files(folder, root, glob)
        stamp = tuple((str(p.relative_to(folder)), st.st_size, st.st_mtime_ns)
                      for p in paths for st in (p.stat(),))
    except OSError as e:
        raise ValueError(f"dataset.root={root} cannot be read ({e.strerror or e}); fix its permissions "
                         f"or {FIX}") from None
    if not paths:
        raise ValueError(f"dataset.root={root} holds no {glob} files (dataset.glob); {FIX}")
    names, texts, counts = _scan(str(folder), tokenizer, stamp)
    if not names:
        raise ValueError(f"dataset.root={root}: every {glob} file is empty; {FIX}")
    return names, texts, counts


def _plan(root: str | None, tokenizer: str, holdout_every: int, vocab_size: int, block_size: int, glob: str
          ) -> tuple[list[int], list[int], list[str], tuple[str, ...], tuple[str, ...], tuple[int, ...]]:
    if not isinstance(glob, str) or not glob:
        raise ValueError(f"dataset.glob={show(glob)} must be a file-name pattern, e.g. "
                         "dataset.glob='*.txt' or '*.md'")
    if tokenizer not in TOKENIZERS:
        raise ValueError(f"dataset.tokenizer={show(tokenizer)} is unknown; use {' or '.join(TOKENIZERS)}")
    names, texts, counts = _files(root, tokenizer, glob)
    val = list(range(0, len(names), holdout_every))
    train = [i for i in range(len(names)) if i not in val]
    if not train:
        raise ValueError(f"dataset.root={root} holds {len(names)} non-empty {glob} file(s); the split by "
                         f"file needs two at least (one for validation); add a file")
    vocab = vocabulary("".join(texts[i] for i in train) if tokenizer == "char" else "", tokenizer)
    if vocab_size != len(vocab):
        raise ValueError(f"dataset.vocab_size={vocab_size} but the {tokenizer} tokens of the training files "
                         f"number {len(vocab)}; pass dataset.vocab_size={len(vocab)}")
    for side, picked in (("training", train), ("validation", val)):
        tokens = sum(counts[i] for i in picked)
        if tokens - 1 < block_size:
            raise ValueError(f"dataset.block_size={block_size} is longer than the {tokens} tokens of the "
                             f"{side} files; lower it or add text")
    return train, val, vocab, names, texts, counts


def check_root(root: str | None, tokenizer: str = "byte", holdout_every: int = 10, vocab_size: int = 256,
               block_size: int = 64, glob: str = "*.txt") -> None:
    """The parent's check: the folder, its files, the split, the declared vocabulary size."""
    _plan(root, tokenizer, holdout_every, vocab_size, block_size, glob)


def train_size_of(root: str | None = None, tokenizer: str = "byte", holdout_every: int = 10,
                  vocab_size: int = 256, block_size: int = 64, glob: str = "*.txt", **_: object) -> int:
    """Training windows (the parent's batch-size check)."""
    plan = _plan(root, tokenizer, holdout_every, vocab_size, block_size, glob)
    train, counts = plan[0], plan[5]
    return (sum(counts[i] for i in train) - 1) // block_size


def text(root: str | None = None, tokenizer: str = "byte", holdout_every: int = 10, vocab_size: int = 256,
         block_size: int = 64, eval_windows: int | None = 512, glob: str = "*.txt"):
    """(train, validation) TokenWindows."""
    train, val, vocab, names, texts, _ = _plan(root, tokenizer, holdout_every, vocab_size, block_size, glob)
    info = {"tokenizer": tokenizer, "vocab_size": len(vocab), "block_size": block_size,
            "split": f"by file: every {holdout_every}th of the sorted {glob} files is validation",
            "train_files": [names[i] for i in train], "val_files": [names[i] for i in val],
            "eval_windows": eval_windows}
    sets = []
    for name, picked in (("train", train), ("val", val)):
        joined = "".join(texts[i] for i in picked)
        if tokenizer == "byte":  # read as latin-1 (one character per byte): the files' bytes back
            raw = np.frombuffer(joined.encode("latin-1"), dtype=np.uint8)
            tokens = torch.from_numpy(raw.astype(np.int64))
        else:
            tokens = encode(joined, vocab, tokenizer)
        info[f"{name}_tokens"] = len(tokens)
        info[f"{name}_unknown"] = int((tokens == 0).sum()) if tokenizer == "char" else 0
        count = None if name == "train" else eval_windows
        sets.append(TokenWindows(*windows(tokens, block_size, count), info))
    return tuple(sets)
