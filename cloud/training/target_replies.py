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
run refuses different ones. The target may run in bfloat16 here (``dtype``): the replies are
training data, and the verifier, not this text, keeps the output exact.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging

from edgespec.cloud.training.loop import configure_threads
from edgespec.edge.eos import eos_token_ids

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


def chat_ids(tokenizer, text: str) -> list[int]:
    encoded = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
    if isinstance(encoded, dict) or hasattr(encoded, "input_ids"):
        encoded = encoded["input_ids"]
    return list(encoded)


def chunks(out_dir: Path) -> list[Path]:
    return sorted(Path(out_dir).glob("chunk-*.npz"))


@torch.inference_mode()
def reply_batch(model, prompts: list[list[int]], *, max_new_tokens: int, stop: list[int], top_k: int, pad: int):
    """Greedy replies to ``prompts`` (left-padded into one batch); returns per prompt
    (reply ids, top ids [n, K], top log-probs [n, K])."""
    batch, longest = len(prompts), max(len(p) for p in prompts)
    input_ids = torch.full((batch, longest), pad, dtype=torch.long)
    mask = torch.zeros(batch, longest, dtype=torch.long)
    for b, prompt in enumerate(prompts):
        input_ids[b, longest - len(prompt) :] = torch.tensor(prompt)
        mask[b, longest - len(prompt) :] = 1
    positions = (mask.cumsum(-1) - 1).clamp_min(0)
    out = model(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1)
    cache = out.past_key_values
    stop_ids = torch.tensor(stop)
    done = torch.zeros(batch, dtype=torch.bool)
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
        mask = torch.cat([mask, torch.ones(batch, 1, dtype=torch.long)], dim=1)
        positions = positions[:, -1:] + 1
        out = model(input_ids=token[:, None], attention_mask=mask, position_ids=positions, cache=cache, use_cache=True)
        cache = out.past_key_values
    tokens_t, tops_t, lps_t = torch.stack(tokens, 1), torch.stack(tops, 1), torch.stack(top_lps, 1)
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


def generate_replies(config: RepliesConfig, instructions: list[tuple[str, str]], log=None) -> dict:
    """Replies to ``instructions`` ((id, text) pairs, in order), resuming where chunks end."""
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
    stop = eos_token_ids(config.target)
    pad = stop[0]
    model = AutoModelForCausalLM.from_pretrained(config.target, dtype=getattr(torch, config.dtype), local_files_only=True).eval()
    done_chunks = len(chunks(out_dir))
    start = done_chunks * config.batch
    wanted = min(config.replies, len(instructions))
    started, made_tokens = time.monotonic(), 0
    for index in range(done_chunks, (wanted + config.batch - 1) // config.batch):
        if config.minutes and time.monotonic() - started > config.minutes * 60:
            log(f"replies: time budget reached after chunk {index - 1}")
            break
        batch = instructions[index * config.batch : min((index + 1) * config.batch, wanted)]
        prompts = [chat_ids(tokenizer, text)[-config.max_prompt_tokens :] for _, text in batch]
        order = sorted(range(len(batch)), key=lambda i: len(prompts[i]))  # similar lengths pad less
        t0 = time.monotonic()
        results = reply_batch(model, [prompts[i] for i in order], max_new_tokens=config.max_new_tokens, stop=stop,
                              top_k=config.top_k, pad=pad)
        tokens = _save_chunk(out_dir / f"chunk-{index:05d}.npz", [batch[i][0] for i in order], [prompts[i] for i in order], results)
        made_tokens += tokens
        elapsed = time.monotonic() - t0
        log(f"replies: chunk {index} ({len(batch)} replies, {tokens} tokens) in {elapsed:.0f} s, {tokens / elapsed:.0f} tokens/s; "
            f"{(index + 1) * config.batch} of {wanted}")
    return {"chunks": len(chunks(out_dir)), "tokens_this_run": made_tokens, "started_at_reply": start}


def load_replies(out_dir: Path):
    """Yields (prompt ids, reply ids, top ids [n, K], top log-probs [n, K]) for every reply."""
    for path in chunks(out_dir):
        data = np.load(path)
        po, ro = data["prompt_offsets"], data["reply_offsets"]
        for i in range(len(po) - 1):
            yield (data["prompt_ids"][po[i] : po[i + 1]], data["reply_ids"][ro[i] : ro[i + 1]],
                   data["top_ids"][ro[i] : ro[i + 1]], data["top_logprobs"][ro[i] : ro[i + 1]])
