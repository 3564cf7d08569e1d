"""A chat target's own replies to instructions, with its top-K distribution at each reply token.

The draft of a chat model only ever guesses the target's replies, so that is the text it is
distilled on (``target_text.py`` does the same for a code-completion target, from windows of
a token file). Generating the replies is the expensive part, so it runs once, in resumable
chunks of ``batch`` instructions: ``out_dir/chunk-00000.npz`` ... each holding

    prompt_ids, prompt_offsets     the chat-templated prompts (uint32 ids, CSR offsets)
    reply_ids, reply_offsets       the target's greedy replies, the end-of-turn token included
    top_ids, top_logprobs          [reply tokens, K]: the target's K most likely tokens and
                                   their log-probabilities where it chose each reply token

so distillation needs no teacher forward at all. ``meta.json`` records the settings; a resumed
run refuses different ones, and skips every instruction whose id a chunk already holds
(``pending``), so a run stopped at any point redoes nothing. The target may run in bfloat16
here (``dtype``): the replies are training data, and the verifier, not this text, keeps the
output exact. It runs on a GPU when there is one (``device.py``). Prompts and end tokens come
from the target's chat format (``chat_format.py``).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence, cast

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging

from edgespec.cloud.training.chat_format import ChatFormat, chat_format
from edgespec.cloud.training.device import choose_device
from edgespec.cloud.training.loop import configure_threads

META = "meta.json"


@dataclass(frozen=True)
class RepliesConfig:
    target: Path
    out_dir: Path
    replies: int = 4096  # upper bound; ``minutes`` may end the run first
    minutes: float = 0.0  # wall-clock budget (0: none)
    max_new_tokens: int = 192
    max_prompt_tokens: int = 384
    batch: int = 96
    top_k: int = 32
    dtype: str = "bfloat16"
    threads: int = 1
    device: str = "auto"  # auto: the GPU if torch sees one
    chat_template: Path | None = None  # a Jinja file, for a target that ships no chat template

    def __post_init__(self) -> None:
        for name in ("target", "out_dir"):
            object.__setattr__(self, name, Path(getattr(self, name)))
        for name in ("replies", "max_new_tokens", "max_prompt_tokens", "batch", "top_k", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.minutes < 0:
            raise ValueError(f"minutes must be >= 0, got {self.minutes}")
        if self.dtype not in ("float32", "bfloat16"):
            raise ValueError(f"dtype must be float32 or bfloat16, got {self.dtype!r}")
        if not (self.target / "config.json").is_file():
            raise ValueError(f"target: {self.target} is not a Hugging Face model directory (no config.json)")

    def settings(self) -> dict:
        keep = ("max_new_tokens", "max_prompt_tokens", "batch", "top_k", "dtype")
        return {k: v for k, v in asdict(self).items() if k in keep} | {"target": str(self.target)}


def chat_ids(tokenizer, messages: str | list[dict]) -> list[int]:
    """The prompt of a user message (or a conversation) in the tokenizer's own chat template."""
    template = tokenizer.chat_template
    if not isinstance(template, str):
        raise ValueError("the tokenizer has no chat template")
    return ChatFormat(template, None, ()).ids(tokenizer, messages)


def chunks(out_dir: Path) -> list[Path]:
    return sorted(p for p in Path(out_dir).glob("chunk-*.npz") if not p.name.endswith(".tmp.npz"))  # not a half-written one


@torch.inference_mode()
def reply_batch(model, prompts: list[list[int]], *, max_new_tokens: int, stop: list[int], top_k: int, pad: int):
    """Greedy replies to ``prompts`` (left-padded into one batch); returns per prompt
    (reply ids, top ids [n, K], top log-probs [n, K])."""
    device = next(model.parameters()).device
    batch, longest = len(prompts), max(len(p) for p in prompts)
    input_ids = torch.full((batch, longest), pad, dtype=torch.long)
    mask = torch.zeros(batch, longest, dtype=torch.long)
    for b, prompt in enumerate(prompts):
        input_ids[b, longest - len(prompt) :] = torch.tensor(prompt)
        mask[b, longest - len(prompt) :] = 1
    input_ids, mask = input_ids.to(device), mask.to(device)
    positions = (mask.cumsum(-1) - 1).clamp_min(0)
    out = model(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1)
    cache = out.past_key_values
    stop_ids = torch.tensor(stop, device=device)
    done = torch.zeros(batch, dtype=torch.bool, device=device)
    tokens, tops, top_lps = [], [], []
    for _ in range(max_new_tokens):
        logprobs = torch.log_softmax(out.logits[:, -1].float(), dim=-1)
        values, indices = logprobs.topk(top_k, dim=-1)
        token = indices[:, 0].clone()  # greedy: the most likely token
        token[done] = pad
        tokens.append(token)
        tops.append(indices)
        top_lps.append(values)
        done |= torch.isin(token, stop_ids)
        if bool(done.all()):
            break
        mask = torch.cat([mask, torch.ones(batch, 1, dtype=torch.long, device=device)], dim=1)
        positions = positions[:, -1:] + 1
        out = model(input_ids=token[:, None], attention_mask=mask, position_ids=positions, cache=cache, use_cache=True)
        cache = out.past_key_values
    tokens_t, tops_t, lps_t = torch.stack(tokens, 1).cpu(), torch.stack(tops, 1).cpu(), torch.stack(top_lps, 1).cpu()
    results = []
    for b in range(batch):
        row = tokens_t[b].tolist()
        n = next((i + 1 for i, t in enumerate(row) if t in stop), len(row))
        results.append((row[:n], tops_t[b, :n].numpy(), lps_t[b, :n].numpy()))
    return results


def _save_chunk(path: Path, ids: list[str], prompts: list[list[int]], results) -> int:
    def csr(rows):
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        offsets[1:] = np.cumsum([len(r) for r in rows])
        flat = np.concatenate([np.asarray(r, dtype=np.uint32) for r in rows]) if rows else np.zeros(0, np.uint32)
        return flat, offsets

    prompt_ids, prompt_offsets = csr(prompts)
    reply_ids, reply_offsets = csr([r for r, _, _ in results])
    tmp = path.with_suffix(".tmp.npz")
    np.savez(
        tmp,
        instruction_ids=np.asarray(ids),
        prompt_ids=prompt_ids,
        prompt_offsets=prompt_offsets,
        reply_ids=reply_ids,
        reply_offsets=reply_offsets,
        top_ids=np.concatenate([t for _, t, _ in results]).astype(np.uint32),
        top_logprobs=np.concatenate([lp for _, _, lp in results]).astype(np.float16),
    )
    tmp.rename(path)
    return int(reply_offsets[-1])


def done_ids(out_dir: Path) -> set[str]:
    """The ids of the instructions the chunks in ``out_dir`` already reply to."""
    return {str(i) for path in chunks(out_dir) for i in np.load(path)["instruction_ids"].tolist()}


def run_in_chunks(items: Sequence[tuple[str, Any]], out_dir: Path, batch: int, make_chunk: Callable[[list, Path], int],
                  *, minutes: float = 0.0, log: Callable[[str], None] = print) -> dict:
    """Calls ``make_chunk(items, path)`` on consecutive batches of the items (``(id, ...)``
    pairs) that no chunk holds yet, each writing ``path`` (``chunk-NNNNN.npz``, ending with the
    rename that makes it count) and returning the tokens it made; stops after ``minutes``."""
    done = done_ids(out_dir)
    todo = [item for item in items if item[0] not in done]
    next_index = len(chunks(out_dir))
    started, made = time.monotonic(), 0
    for start in range(0, len(todo), batch):
        if minutes and time.monotonic() - started > minutes * 60:
            log(f"replies: time budget reached; {len(todo) - start} of {len(items)} left for the next run")
            break
        t0 = time.monotonic()
        tokens = make_chunk(todo[start : start + batch], out_dir / f"chunk-{next_index:05d}.npz")
        next_index, made = next_index + 1, made + tokens
        elapsed = max(time.monotonic() - t0, 1e-9)
        log(f"replies: {len(done) + start + len(todo[start : start + batch])} of {len(items)} "
            f"({tokens} tokens in {elapsed:.0f} s, {tokens / elapsed:.0f} tokens/s)")
    return {"chunks": len(chunks(out_dir)), "tokens_this_run": made, "started_at_reply": len(done & {i for i, _ in items})}


def generate_replies(config: RepliesConfig, instructions: Sequence[tuple[str, str | list[dict]]], log=None) -> dict:
    """Replies to the first ``config.replies`` of ``instructions`` ((id, user message or
    conversation) pairs), skipping those the chunks already hold."""
    log = log or (lambda message: print(message, file=sys.stderr, flush=True))
    configure_threads(config.threads)
    hf_logging.set_verbosity_error()
    out_dir = config.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    meta_path = out_dir / META
    if meta_path.exists():
        previous = json.loads(meta_path.read_text())["settings"]
        if previous != config.settings():
            raise ValueError(f"{out_dir} holds replies made with other settings: {previous}; use another out_dir")
    meta_path.write_text(json.dumps({"settings": config.settings()}, indent=2))
    tokenizer = AutoTokenizer.from_pretrained(config.target, local_files_only=True)
    form = chat_format(config.target, tokenizer, config.chat_template)
    device = choose_device(config.device)
    model = cast(Any, AutoModelForCausalLM.from_pretrained(config.target, dtype=getattr(torch, config.dtype), local_files_only=True))
    model = model.to(device.device).eval()
    log(f"replies: the target in {config.dtype} on {device.name} ({device.type}); a reply ends at any of {list(form.stop_ids)}")

    def make_chunk(batch: list, path: Path) -> int:
        prompts = [form.ids(tokenizer, messages)[-config.max_prompt_tokens :] for _, messages in batch]
        order = sorted(range(len(batch)), key=lambda i: len(prompts[i]))  # similar lengths pad less
        results = reply_batch(model, [prompts[i] for i in order], max_new_tokens=config.max_new_tokens,
                              stop=list(form.stop_ids), top_k=config.top_k, pad=form.stop_ids[0])
        return _save_chunk(path, [batch[i][0] for i in order], [prompts[i] for i in order], results)

    return run_in_chunks(list(instructions[: config.replies]), out_dir, config.batch, make_chunk, minutes=config.minutes, log=log)


def load_replies(out_dir: Path):
    """Yields (prompt ids, reply ids, top ids [n, K], top log-probs [n, K]) for every reply."""
    for path in chunks(out_dir):
        data = np.load(path)
        po, ro = data["prompt_offsets"], data["reply_offsets"]
        for i in range(len(po) - 1):
            yield (data["prompt_ids"][po[i] : po[i + 1]], data["reply_ids"][ro[i] : ro[i + 1]],
                   data["top_ids"][ro[i] : ro[i + 1]], data["top_logprobs"][ro[i] : ro[i + 1]])
