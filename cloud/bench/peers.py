"""The in-process peers edgespec is measured against: transformers' own generation on the same pair.

On the same prompts, in this process, torch pinned to one thread, greedy:

- ``target_only``: ``model.generate`` with the target alone;
- ``prompt_lookup``: prompt-lookup decoding (``prompt_lookup_num_tokens``): candidates copied
  from the context where its last tokens occurred before, verified by the target;
- ``assisted``: assisted generation with the draft's own Hugging Face weights (torch, not ONNX).

No network, no serving stack: what a user gets by running transformers on one machine. Every
arm's output is checked against the target-only output (all are greedy and lossless).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

PROMPT_LOOKUP_TOKENS = 10  # transformers' documented default for prompt_lookup_num_tokens


@dataclass
class PeerArm:
    name: str
    ms_per_token: float
    tokens: int
    identical_to_target_only: int  # generations token-identical to target-only greedy


def measure_peers(target: Path, draft_hf: Path | None, prompts: list, max_new_tokens: int, progress=print) -> dict[str, PeerArm]:
    """``prompts``: texts, or token ids (a chat prompt already rendered with its template)."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from edgespec.edge.tokenizer import load_tokenizer

    hf_logging.disable_progress_bar()
    torch.set_num_threads(1)
    tokenizer = load_tokenizer(target)
    model = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32, local_files_only=True).eval()
    assistant = None
    if draft_hf is not None and (Path(draft_hf) / "config.json").is_file():
        assistant = AutoModelForCausalLM.from_pretrained(str(draft_hf), dtype=torch.float32, local_files_only=True).eval()
    arms = {"target_only": {}, "prompt_lookup": {"prompt_lookup_num_tokens": PROMPT_LOOKUP_TOKENS}}
    if assistant is not None:
        arms["assisted"] = {"assistant_model": assistant}
    totals = {name: [0.0, 0, 0] for name in arms}  # seconds, tokens, identical
    common = dict(max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0)
    for i, prompt in enumerate(prompts):
        ids = torch.tensor([tokenizer.encode(prompt).ids if isinstance(prompt, str) else list(prompt)])
        with torch.inference_mode():
            model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0)  # warm-up
            reference = None
            order = list(arms) if i % 2 == 0 else list(reversed(arms))  # alternate which goes first
            outputs = {}
            for name in order:
                started = time.perf_counter()
                out = model.generate(ids, **common, **arms[name])
                totals[name][0] += time.perf_counter() - started
                outputs[name] = out[0, ids.shape[1]:].tolist()
            reference = outputs["target_only"]
            for name in arms:
                totals[name][1] += len(outputs[name])
                totals[name][2] += outputs[name] == reference
        progress(f"  peers prompt {i + 1}/{len(prompts)}")
    return {
        name: PeerArm(name, 1000.0 * seconds / tokens if tokens else 0.0, tokens, identical)
        for name, (seconds, tokens, identical) in totals.items()
    }


def peers_dict(arms: dict[str, PeerArm]) -> dict:
    return {name: asdict(arm) for name, arm in arms.items()}
