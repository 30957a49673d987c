"""dataset=text: a folder of the user's .txt files, split by file, char or byte tokens; one line for
a folder that is missing, empty or unreadable, or a file that is not UTF-8 in char mode. And the
larger GPT presets (model=gpt_10m, gpt2_small) at their references' sizes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from compbench.data import text as text_module
from compbench.data.shakespeare import UNK
from compbench.data.text import check_root, text, train_size_of
from tests.helpers import compbench, results, train

FIX = "pass dataset.root=DIR, a folder of .txt files"


def _folder(tmp_path: Path) -> Path:
    root = tmp_path / "texts"
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_text("zzz " * 40)  # position 0: validation; 'z' is in no training file
    (root / "b.txt").write_text("abab cdcd " * 30)
    (root / "sub" / "c.txt").write_text("dcba " * 30)
    (root / "empty.txt").write_text("")  # left out
    (root / "notes.md").write_text("not read")
    return root


def test_char_tokens_split_by_file_with_unknown_validation_characters(tmp_path):
    root = _folder(tmp_path)
    vocab = len([UNK, *sorted(set("abcd "))])
    tr, va = text(str(root), tokenizer="char", holdout_every=3, vocab_size=vocab, block_size=8)
    info = tr.info
    assert info["train_files"] == ["b.txt", "sub/c.txt"] and info["val_files"] == ["a.txt"]
    assert info["vocab_size"] == 6 and info["train_tokens"] == 300 + 150 and info["val_tokens"] == 160
    assert info["val_unknown"] == 120  # every 'z' is <unk> (id 0) and still counts in the loss
    assert len(tr) == (450 - 1) // 8 == train_size_of(str(root), "char", 3, vocab, 8)
    x, y = tr[0]
    assert torch.equal(x[1:], y[:-1])


def test_byte_tokens_are_the_files_bytes(tmp_path):
    root = tmp_path / "t"
    root.mkdir()
    (root / "0.txt").write_bytes("é\xff".encode("latin-1") * 20)  # no UTF-8 needed for bytes
    (root / "1.txt").write_bytes("ünïcode ".encode() * 10)
    tr, va = text(str(root), holdout_every=2, block_size=4, eval_windows=None)
    assert tr.info["vocab_size"] == 256
    seen = bytes(torch.cat([tr[i][0] for i in range(len(tr))]).tolist())
    assert seen == ("ünïcode ".encode() * 10)[:len(tr) * 4]
    assert bytes(va[0][0].tolist()) == b"\xe9\xff\xe9\xff"


@pytest.mark.parametrize("setup, root, message", [
    (None, None, f"dataset.root=null: dataset=text reads your own text files; {FIX}"),
    (None, "missing", f"dataset.root={{root}} does not exist; {FIX}"),
    (lambda d: d.write_text("x"), "file", f"dataset.root={{root}} is not a folder; {FIX}"),
    (lambda d: (d.mkdir(), (d / "a.md").write_text("x")), "md",
     f"dataset.root={{root}} holds no *.txt files (dataset.glob); {FIX}"),
    (lambda d: (d.mkdir(), (d / "a.txt").write_text(""), (d / "b.txt").write_text("")), "empty",
     f"dataset.root={{root}}: every *.txt file is empty; {FIX}"),
    (lambda d: (d.mkdir(), (d / "a.txt").write_text("hello")), "one",
     "dataset.root={root} holds 1 non-empty *.txt file(s); the split by file needs two at least (one for "
     "validation); add a file"),
    (lambda d: (d.mkdir(), (d / "a.txt").write_text("hello"), (d / "b.txt").write_bytes(b"ok\xff")), "latin",
     "dataset.root={root}: b.txt is not UTF-8 text (byte 2); convert it or use dataset.tokenizer=byte"),
])
def test_a_bad_folder_is_one_line_naming_the_root(tmp_path, setup, root, message):
    path = None if root is None else tmp_path / root
    if setup:
        setup(path)
    with pytest.raises(ValueError) as e:
        check_root(None if path is None else str(path), tokenizer="char", holdout_every=2, vocab_size=6,
                   block_size=2)
    assert str(e.value) == message.format(root=path)


def test_an_unreadable_folder_or_file_is_one_line(tmp_path, monkeypatch):
    root = _folder(tmp_path)

    def denied(*_, **__):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "read_bytes", denied)
    with pytest.raises(ValueError, match=r"^dataset.root=.*: a.txt cannot be read \(Permission denied\); "
                       r"fix its permissions or remove it$"):
        check_root(str(root), vocab_size=256)
    monkeypatch.setattr(text_module.os, "walk", denied)  # the folder itself
    with pytest.raises(ValueError, match=rf"^dataset.root={root} cannot be read \(Permission denied\); "
                       rf"fix its permissions or {FIX}$"):
        check_root(str(root))


def test_the_declared_vocabulary_is_checked_against_the_folder(tmp_path):
    with pytest.raises(ValueError, match=r"^dataset.vocab_size=256 but the char tokens of the training files "
                       r"number 6; pass dataset.vocab_size=6$"):
        check_root(str(_folder(tmp_path)), tokenizer="char", holdout_every=3, vocab_size=256, block_size=8)


def test_a_bad_folder_stops_the_cli_with_nothing_written(tmp_path):
    out = tmp_path / "run"
    proc = compbench("train", "model=gpt", "dataset=text", f"dataset.root={tmp_path / 'none'}",
                     f"output_dir={out}")
    assert proc.returncode == 2
    (line,) = [x for x in proc.stderr.splitlines() if x.strip()]
    assert line == f"error: dataset.root={tmp_path / 'none'} does not exist; {FIX}"
    assert not out.exists()


@pytest.mark.dist
def test_gpt_trains_on_a_folder_on_two_ranks(tmp_path):
    root = _folder(tmp_path)
    for i in range(4):
        (root / f"more{i}.txt").write_text("abcd dcba " * 200)
    out, _ = train(tmp_path, "model=gpt", "model.n_layer=1", "model.n_embd=32", "dataset=text",
                   f"dataset.root={root}", "dataset.tokenizer=char", "dataset.vocab_size=6",
                   "dataset.holdout_every=3", "dataset.block_size=16", "batch_size=8", "max_steps=6",
                   "engine.np=2", "optim=adamw", "progress=false")
    r = results(out)
    assert r["summary"]["steps"] == 6 and r["summary"]["final_eval_loss"] > 0
    assert r["data"]["val_files"] == ["a.txt", "more1.txt", "sub/c.txt"]


@pytest.mark.parametrize("preset, tokens, positions, count", [
    ("gpt2_small", 50257, 1024, 124_439_808),  # GPT-2 small's 124M (tied embeddings)
    ("gpt2_small", 256, 1024, 86_039_040),  # with dataset=text's bytes
    ("gpt_10m", 65, 256, 10_770_816),  # nanoGPT's shakespeare-char model
])
def test_gpt_presets_have_their_references_sizes(preset, tokens, positions, count):
    from compbench.compose import config
    from compbench.seam.build import build_model

    cfg = config.compose([f"model={preset}", "dataset=text", f"dataset.vocab_size={tokens}",
                          f"dataset.block_size={positions}"])
    with torch.device("meta"):
        model = build_model(cfg)
    assert sum(p.numel() for p in model.parameters()) == count


def test_the_glob_picks_which_files_are_text(tmp_path):
    root = tmp_path / "notes"
    root.mkdir()
    for name, body in (("a.md", "alpha beta gamma. " * 10), ("b.md", "delta epsilon. " * 10),
                       ("c.txt", "ignored"), ("d.md.bak", "ignored")):
        (root / name).write_text(body)
    train, val = text(str(root), holdout_every=2, block_size=8, glob="*.md")
    assert train.info["train_files"] == ["b.md"] and train.info["val_files"] == ["a.md"]
    with pytest.raises(ValueError, match=r"^dataset.root=.* holds no \*.rst files \(dataset.glob\); "):
        check_root(str(root), glob="*.rst")
    with pytest.raises(ValueError, match=r"^dataset.glob='' must be a file-name pattern"):
        check_root(str(root), glob="")
