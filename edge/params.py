"""The words device and verifier share: verification modes, finish reasons, sampling parameters.

Defined once here, in the lower layer: the cloud imports these types, never redefines them.
The wire numbers for each (``VerifyMode``, ``FinishReason`` in the proto) live in
``edgespec.edge.wire``, the one codec between these types and the contract.

Terms (Leviathan et al. 2023): p is the target distribution, q the draft distribution.

- *greedy*: accept while draft == argmax p; the output is token-identical to target greedy.
- *exact*: the device sends q; accept with min(1, p/q), recover from max(0, p - q).
- *token*: tokens only on the wire; q is taken as a point mass on the drafted token.
- *coupled*: tokens only on the wire; both sides draw position P with the same exponentials
  E_P(v) (keyed by seed and absolute position): the draft's token is argmax q/E_P, the verifier
  emits t_P = argmax p/E_P and accepts a draft iff it equals t_P. The output is a function of
  (seed, prompt, target) alone: the same for any k, send-ahead, path switches, and cloud-only.

No numpy, torch or gRPC here: plain validated dataclasses.
"""

from __future__ import annotations

import dataclasses
import math
import secrets
from dataclasses import dataclass
from enum import Enum
from typing import TypeGuard

# Temperatures outside this range are refused rather than served: below it the scaled logits
# overflow float32 (1e-40 made every p NaN); above it p is uniform in all but name.
MIN_TEMPERATURE = 1e-3
MAX_TEMPERATURE = 100.0
MAX_SEED = 2**64 - 1
OS_SEED_BITS = 63  # an unseeded sampled request draws its seed from the OS: fits a signed int64 too
MAX_SEND_AHEAD = 8  # blocks in flight at most
MAX_TREE_EXTRA = 16  # runner-up tokens per tree draft at most
# draft_temperature "auto": the draft samples q at this fraction of the target's temperature.
# A sharper q than p raised the acceptance sum min(p, q) on the demo pair (docs/sampling.md).
DRAFT_TEMPERATURE_RATIO = 0.8


class Mode(str, Enum):
    GREEDY = "greedy"
    EXACT = "exact"
    TOKEN = "token"
    COUPLED = "coupled"


class Finish(str, Enum):
    NONE = "none"  # not finished
    STOP_TOKEN = "stop_token"  # emitted one of the stop token ids (included in the output)
    LENGTH = "length"  # reached max_new_tokens
    CONTEXT = "context"  # reached the model's max context


MODES = tuple(mode.value for mode in Mode)


def _is_int(value) -> TypeGuard[int]:
    # bool is an int to Python, never a count or a seed to us; numpy integers have __index__.
    return not isinstance(value, bool) and hasattr(value, "__index__")


def parse_k(k: int | str) -> int | str:
    """Drafts per round as given (an integer, its digits, or "auto"): an int >= 1 or "auto"."""
    if isinstance(k, str) and k != "auto":
        if not k.isdigit():
            raise ValueError(f"k must be a positive integer or 'auto', got {k!r}")
        k = int(k)
    if k != "auto" and (not _is_int(k) or k < 1):
        raise ValueError(f"k must be a positive integer or 'auto', got {k!r}")
    return k


@dataclass(frozen=True)
class SamplingParams:
    """How a token is chosen from logits; validated on construction (errors name the field).

    temperature: 0 means greedy (argmax); otherwise in [MIN_TEMPERATURE, MAX_TEMPERATURE].
    top_k: keep the top_k most likely tokens; 0 disables.
    top_p: keep the smallest set of most likely tokens whose mass reaches top_p; 1 disables.
    seed: keys every random draw (coupled mode: with the absolute position; exact and token
    modes: with the round number). None (the default) draws a fresh one from the OS when the
    parameters sample (``secrets.randbits(63)``), 0 when greedy (no draws); read it back from
    ``.seed`` (the SDK reports it in ``stats.seed``) to replay a run.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        t = self.temperature
        # NOTE: written as `not (...)` so NaN fails every comparison and is refused too.
        if not (isinstance(t, (int, float)) and (t == 0 or MIN_TEMPERATURE <= t <= MAX_TEMPERATURE)):
            raise ValueError(
                f"temperature must be 0 (greedy) or in [{MIN_TEMPERATURE:g}, {MAX_TEMPERATURE:g}], got {t!r}"
            )
        if not _is_int(self.top_k) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if not (isinstance(self.top_p, (int, float)) and math.isfinite(self.top_p) and 0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1] (1 = off), got {self.top_p!r}")
        if self.seed is None:
            object.__setattr__(self, "seed", 0 if self.is_greedy else secrets.randbits(OS_SEED_BITS))
        if not _is_int(self.seed) or not 0 <= self.seed <= MAX_SEED:
            raise ValueError(f"seed must be an integer in [0, 2^64), got {self.seed!r}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def resolved_seed(self) -> int:
        """``seed`` as construction resolved it (None became 0 when greedy, else the OS's draw)."""
        if self.seed is None:  # only where __post_init__ was bypassed
            raise ValueError("SamplingParams.seed was never resolved: construct SamplingParams normally")
        return self.seed


@dataclass(frozen=True)
class GenerationParams(SamplingParams):
    """What to generate and how: the sampling parameters plus the device's own choices.

    mode: greedy (token-identical to the target's greedy output), coupled (sampling with tokens
    only on the wire and position-keyed draws: a seed reproduces whatever k, send-ahead or the
    planner do), exact (speculative sampling with q on the wire, draws keyed by round) or token
    (tokens only, the point-mass rule). None picks greedy at temperature 0 and coupled otherwise.
    k: drafted tokens per round, a number or "auto" (adaptive from measured acceptance and cost).
    stop_token_ids: None means the draft's end-of-sequence ids (from its manifest).
    top_n: exact mode sends q truncated to its top_n tokens (0 = all tokens with q > 0);
    the device samples from exactly what it sends. Coupled mode draws from the same cut (it
    bounds the hashing per drafted token; nothing is sent).
    speculate: "auto" (the default) lets the device choose, with k "auto", between speculation
    and cloud-only streaming per request from measured figures, switching mid-generation when
    the other is clearly faster (``edgespec.edge.planner``); with a fixed k it speculates.
    True always speculates (k still adaptive when "auto"); False forces cloud-only generation
    (the Generate RPC).
    send_ahead: most blocks in flight at once, or "auto" (from the measured round trip and how
    often sent-ahead blocks hold). 1 waits for each verdict before sending the next block.
    tree: greedy only; up to this many runner-up tokens ride along with a fresh block, as
    siblings of the drafts the draft was least sure of (a tree draft, verified in one forward).
    0 sends chains. A block with a tree is never followed by blocks sent ahead.
    lookup: where the last few tokens occurred earlier in the context, draft the token that
    followed them there (code repeats itself; a one-layer draft cannot copy). Greedy: instead
    of the draft model's argmax. Exact: q = lookup_weight * (point mass on that token) +
    (1 - lookup_weight) * the model's q, sampled from and sent as is. Token: the proposal is
    drafted as is. Lossless in every mode. "only": no draft model at all, every draft comes
    from the context (a shorter suffix, then the last token, where nothing longer matches).
    lookup_weight: exact mode, the mixture weight of the lookup's point mass in q (1 = a point
    mass: the model is not run at that position; 0 = the model's q alone).
    draft_temperature: sampling modes, the temperature of the draft's own q (any q is lossless
    if it is what the draft sampled from); "auto" (default) is DRAFT_TEMPERATURE_RATIO times
    the target's temperature, the ratio measured for acceptance (docs/sampling.md).
    """

    max_new_tokens: int = 128
    mode: Mode | str | None = None
    k: int | str = "auto"
    stop_token_ids: tuple[int, ...] | None = None
    top_n: int = 64
    lookup: bool | str = True
    lookup_weight: float = 1.0
    draft_temperature: float | str = "auto"
    speculate: bool | str = "auto"
    send_ahead: int | str = "auto"
    tree: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not _is_int(self.max_new_tokens) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        if not _is_int(self.top_n) or self.top_n < 0:
            raise ValueError(f"top_n must be an integer >= 0 (0 = every token with q > 0), got {self.top_n!r}")
        mode = self.mode or (Mode.GREEDY if self.is_greedy else Mode.COUPLED)
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        mode = Mode(mode)
        if mode is not Mode.GREEDY and self.is_greedy:
            raise ValueError(f"mode {mode.value!r} samples: set temperature > 0, or use mode 'greedy'")
        object.__setattr__(self, "mode", mode)
        object.__setattr__(self, "k", parse_k(self.k))
        if self.stop_token_ids is not None:
            object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        if self.speculate not in (True, False, "auto"):
            raise ValueError(f"speculate must be True, False or 'auto', got {self.speculate!r}")
        if not _is_int(self.tree) or not 0 <= self.tree <= MAX_TREE_EXTRA:
            raise ValueError(f"tree must be an integer in [0, {MAX_TREE_EXTRA}] (extra tokens per block), got {self.tree!r}")
        if self.tree and mode is not Mode.GREEDY:
            raise ValueError("tree drafts are verified greedily: use mode 'greedy' (temperature 0), or tree=0")
        if self.lookup not in (True, False, "only"):
            raise ValueError(f"lookup must be True, False or 'only' (no draft model), got {self.lookup!r}")
        if self.tree and self.lookup == "only":
            raise ValueError("tree drafts take the draft model's runner-up tokens: lookup 'only' has none, use tree=0")
        if not (isinstance(self.lookup_weight, (int, float)) and 0.0 <= self.lookup_weight <= 1.0):
            raise ValueError(f"lookup_weight must be in [0, 1] (1 = a point mass on the lookup's token), got {self.lookup_weight!r}")
        t = self.draft_temperature
        if t != "auto" and not (isinstance(t, (int, float)) and not isinstance(t, bool) and MIN_TEMPERATURE <= t <= MAX_TEMPERATURE):
            raise ValueError(f"draft_temperature must be 'auto' or in [{MIN_TEMPERATURE:g}, {MAX_TEMPERATURE:g}], got {t!r}")
        if isinstance(self.send_ahead, str) and self.send_ahead.isdigit():
            object.__setattr__(self, "send_ahead", int(self.send_ahead))
        if self.send_ahead != "auto" and (not _is_int(self.send_ahead) or not 1 <= self.send_ahead <= MAX_SEND_AHEAD):
            raise ValueError(f"send_ahead must be 'auto' or an integer in [1, {MAX_SEND_AHEAD}], got {self.send_ahead!r}")

    @property
    def resolved_mode(self) -> Mode:
        """``mode`` as construction resolved it (None or a name became a ``Mode``)."""
        if not isinstance(self.mode, Mode):  # only where __post_init__ was bypassed
            raise ValueError(f"GenerationParams.mode {self.mode!r} was never resolved: construct GenerationParams normally")
        return self.mode

    @property
    def sampling(self) -> SamplingParams:
        """Just the sampling parameters (what defines p)."""
        return SamplingParams(self.temperature, self.top_k, self.top_p, self.seed)

    @property
    def draft_sampling(self) -> SamplingParams:
        """What the draft samples its q with: p's parameters at the draft's own temperature."""
        if self.is_greedy:
            return self.sampling
        t = self.draft_temperature
        if isinstance(t, str):  # "auto" (__post_init__ allows no other string)
            t = min(MAX_TEMPERATURE, max(MIN_TEMPERATURE, DRAFT_TEMPERATURE_RATIO * self.temperature))
        return SamplingParams(t, self.top_k, self.top_p, self.seed)


def served_mode(params: GenerationParams, modes: tuple[str, ...]) -> GenerationParams:
    """``params`` for a server that lists ``modes`` (``ServerInfo.modes``): coupled mode, new in
    issue 26, falls back to exact on an older server that serves exact (draws then keyed by round:
    the same distribution, but a seed reproduces only at a fixed k). Otherwise ``params``
    unchanged: a server that serves neither (the vLLM backend: greedy only) refuses the mode at
    Open, by name."""
    if params.mode is Mode.COUPLED and Mode.COUPLED.value not in modes and Mode.EXACT.value in modes:
        return dataclasses.replace(params, mode=Mode.EXACT)
    return params


def path_mode(params: GenerationParams) -> str:
    """The planner's mode for a request: auto only with adaptive k and ``speculate="auto"``."""
    if params.speculate is False:
        return "cloud_only"
    return "auto" if params.k == "auto" and params.speculate == "auto" else "speculative"
