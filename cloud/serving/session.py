"""A verification session's state machine and the validation of everything a client sends.

Transport-free: messages arrive here already decoded (see ``codec.py``) and every refusal
is a ``ServerError`` (``edgespec.edge.errors``) carrying the gRPC status code the server
answers with, and a message that says what to fix. Nothing in this file touches the model.

Bookkeeping: ``committed`` holds the prompt and every token emitted so far. The target's KV
cache covers ``committed[:-1]``; the last committed token is *pending*: it is fed to the
target together with the next block of drafts, since its logits are what judge the first draft.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import grpc

from edgespec.edge.errors import ServerError, status_error
from edgespec.edge.params import Finish, Mode, SamplingParams
from edgespec.edge.tokenizer import SCHEME, is_current_scheme

if TYPE_CHECKING:
    from edgespec.cloud.serving.auth import ApiKey


def invalid(message: str) -> ServerError:
    return status_error(grpc.StatusCode.INVALID_ARGUMENT, message)


def precondition(message: str) -> ServerError:
    return status_error(grpc.StatusCode.FAILED_PRECONDITION, message)


def out_of_range(message: str) -> ServerError:
    return status_error(grpc.StatusCode.OUT_OF_RANGE, message)


# A draft distribution whose mass is further than this from 1 is refused, not renormalised:
# it means the client sends something other than what it sampled from.
Q_MASS_TOLERANCE = 1e-3


@dataclass(frozen=True)
class Limits:
    """What the serving replica accepts; filled from the model and VerifierConfig."""

    vocab_size: int
    max_context: int
    max_k: int
    max_new_tokens: int
    default_max_new_tokens: int
    tokenizer_fingerprint: str
    max_tree_tokens: int = 0  # 0: chains only
    modes: frozenset[Mode] = frozenset(Mode)  # verification modes the backend serves
    backend: str = "transformers"  # named in refusals of a mode it does not serve


@dataclass(frozen=True)
class OpenRequest:
    prompt_ids: list[int]
    sampling: SamplingParams
    mode: Mode | None  # None: the client sent an unknown mode number
    mode_number: int
    tokenizer_fingerprint: str
    max_new_tokens: int
    stop_token_ids: list[int]
    first_round: int = 0


@dataclass(frozen=True)
class DraftBlock:
    """One validated round: k drafted tokens and, in exact mode, their q.

    q: per draft, the sparse distribution (token ids, probabilities) it was sampled from,
    renormalised to sum to exactly 1.
    """

    round_no: int
    tokens: list[int]
    q: list[tuple[list[int], list[float]]] | None = None
    ahead: bool = False  # sent ahead; verified because its assumption held
    parents: list[int] | None = None  # a tree (greedy only): each token's parent, -1 = the pending token


@dataclass(frozen=True)
class Verdict:
    round_no: int
    accepted: int
    next_token: int
    finish: Finish
    batch_size: int = 1
    verify_ms: float = 0.0
    discarded: bool = False  # a sent-ahead block whose assumption failed: nothing committed
    accepted_path: list[int] | None = None  # trees: the accepted tokens' indices in the Draft
    next_prob: float | None = None  # coupled rows: p(next_token) (``accept.Outcome.next_prob``)

    @property
    def emitted(self) -> int:
        return self.accepted + 1


@dataclass
class SessionState:
    spec: OpenRequest
    limits: Limits
    committed: list[int]
    max_new_tokens: int
    next_round: int
    stop_ids: frozenset[int] = field(default_factory=frozenset)
    generated: int = 0
    finish: Finish = Finish.NONE
    last_block: DraftBlock | None = None
    last_verdict: Verdict | None = None
    # The last verified round accepted every draft and emitted its bonus token: the condition
    # under which a block sent ahead of its verdict extends exactly what is committed.
    last_full: bool = False
    cache_key: int | None = None  # names the session's KV cache in the backend (open, extend, close)
    key: ApiKey | None = None  # the API key it was opened with, None without keys
    reserved_bytes: int = 0  # the KV cache admission reserved for it (0: not admitted)

    @property
    def mode(self) -> Mode:
        """The verification mode (``open_session`` refuses a request without a known one)."""
        if self.spec.mode is None:
            raise RuntimeError("a session is never opened without a known mode")
        return self.spec.mode

    @property
    def finished(self) -> bool:
        return self.finish is not Finish.NONE

    @property
    def pending(self) -> int:
        return self.committed[-1]

    @property
    def context_room(self) -> int:
        """Tokens that can still be emitted before the context is full."""
        return self.limits.max_context - len(self.committed)


def check_token_ids(ids: list[int], vocab_size: int, what: str) -> None:
    for i, tok in enumerate(ids):
        if not 0 <= tok < vocab_size:
            raise invalid(f"{what}[{i}] = {tok} is outside the vocabulary [0, {vocab_size})")


def open_session(req: OpenRequest, limits: Limits, *, generate: bool = False) -> SessionState:
    """Validates an Open (or a Generate request) and returns the new session's state."""
    if req.tokenizer_fingerprint and not is_current_scheme(req.tokenizer_fingerprint):
        raise precondition(
            f"tokenizer fingerprint {req.tokenizer_fingerprint!r} is of an older scheme; this server uses scheme "
            f"{SCHEME!r} ({limits.tokenizer_fingerprint!r}, docs/protocol.md 'Tokenizer fingerprint'): update the "
            "client, or recompute the fingerprint from the draft's tokenizer.json"
        )
    if req.tokenizer_fingerprint and req.tokenizer_fingerprint != limits.tokenizer_fingerprint:
        raise precondition(
            f"tokenizer mismatch: client fingerprint {req.tokenizer_fingerprint!r}, server "
            f"{limits.tokenizer_fingerprint!r}; draft and target must share one tokenizer"
        )
    if not generate and not req.tokenizer_fingerprint:
        raise invalid("tokenizer_fingerprint is required: send the draft tokenizer's fingerprint")
    if not generate:
        if req.mode is None:
            raise invalid(
                f"unknown verification mode {req.mode_number}; use VERIFY_MODE_GREEDY (1), "
                "VERIFY_MODE_EXACT (2), VERIFY_MODE_TOKEN (3) or VERIFY_MODE_COUPLED (4)"
            )
        if req.mode is not Mode.GREEDY and req.sampling.is_greedy:
            raise invalid(f"mode {req.mode.value} samples: set sampling.temperature > 0, or use greedy mode")
        if req.mode not in limits.modes:
            served = ", ".join(sorted(mode.value for mode in limits.modes))
            raise precondition(
                f"mode {req.mode.value} is not served by this verifier's {limits.backend} backend (it serves: {served}); "
                "use one of those (coupled mode samples losslessly with any draft), or a verifier on the transformers backend"
            )
    if not req.prompt_ids:
        raise invalid("prompt_ids is empty: send at least one token")
    check_token_ids(req.prompt_ids, limits.vocab_size, "prompt_ids")
    check_token_ids(req.stop_token_ids, limits.vocab_size, "stop_token_ids")
    if len(req.prompt_ids) >= limits.max_context:
        raise invalid(
            f"prompt of {len(req.prompt_ids)} tokens leaves no room in the max context of "
            f"{limits.max_context} tokens; shorten it to at most {limits.max_context - 1}"
        )
    if req.max_new_tokens < 0:
        raise invalid(f"max_new_tokens must be >= 0 (0 = server default), got {req.max_new_tokens}")
    if req.max_new_tokens > limits.max_new_tokens:
        raise out_of_range(f"max_new_tokens {req.max_new_tokens} exceeds this server's limit of {limits.max_new_tokens}")
    return SessionState(
        spec=req,
        limits=limits,
        committed=list(req.prompt_ids),
        max_new_tokens=req.max_new_tokens or limits.default_max_new_tokens,
        next_round=req.first_round,
        stop_ids=frozenset(req.stop_token_ids),
    )


def discarded(round_no: int) -> Verdict:
    """The answer to a sent-ahead block whose assumption did not hold."""
    return Verdict(round_no, 0, 0, Finish.NONE, batch_size=0, discarded=True)


def check_draft(
    state: SessionState,
    round_no: int,
    tokens: list[int],
    q: list[tuple[list[int], list[float]]],
    *,
    ahead: bool = False,
    assumed_token: int = 0,
    parents: list[int] | None = None,
) -> DraftBlock | None:
    """Validates one Draft message against the session; returns it as a DraftBlock.

    A sent-ahead block (``ahead``) is validated like any other, then verified only if the
    session is where the device assumed: its previous round, the last one verified, accepted
    every draft and emitted ``assumed_token``, and this is the next round. Otherwise the block
    is stale and None is returned (answer ``discarded``): never an error, since the device sent
    it before it could know.
    """
    if parents:
        return _checked_tree(state, round_no, tokens, parents, q, ahead)
    if ahead:
        check_token_ids(tokens, state.limits.vocab_size, "draft.token_ids")
        if not 1 <= len(tokens) <= state.limits.max_k:
            raise invalid(f"k = {len(tokens)} drafted tokens; send between 1 and max_k = {state.limits.max_k}")
        if state.finished or round_no != state.next_round or not state.last_full or state.pending != assumed_token:
            return None
    if state.finished:
        raise precondition(
            f"session already finished ({state.finish.value}) after {state.generated} tokens; "
            "send Close, or open a new session to continue"
        )
    if round_no != state.next_round:
        raise precondition(f"round {round_no} out of order: expected round {state.next_round}")
    k = len(tokens)
    if not 1 <= k <= state.limits.max_k:
        raise invalid(f"k = {k} drafted tokens; send between 1 and max_k = {state.limits.max_k}")
    check_token_ids(tokens, state.limits.vocab_size, "draft.token_ids")
    if len(state.committed) + k > state.limits.max_context:
        raise out_of_range(
            f"{k} drafts would pass the max context of {state.limits.max_context} tokens "
            f"({len(state.committed)} committed); draft at most {state.context_room}"
        )
    checked_q = None
    if state.mode is Mode.EXACT:
        checked_q = _checked_q(q, tokens, state.limits.vocab_size)
    elif q:
        raise invalid(f"draft.q is only sent in exact mode; this session is in {state.mode.value} mode")
    return DraftBlock(round_no=round_no, tokens=list(tokens), q=checked_q, ahead=ahead)


def _checked_tree(state: SessionState, round_no: int, tokens: list[int], parents: list[int], q, ahead: bool) -> DraftBlock:
    """A tree draft: greedy only, parents before children, distinct siblings, within the limits."""
    limits = state.limits
    if not limits.max_tree_tokens:
        raise invalid("this server verifies chains only: send draft.parents empty (see Info.max_tree_tokens)")
    if state.mode is not Mode.GREEDY:
        raise invalid(f"tree drafts are verified in greedy mode only; this session is in {state.mode.value} mode")
    if ahead:
        raise invalid("a block sent ahead (draft.ahead) must be a chain: send draft.parents empty")
    if q:
        raise invalid("draft.q is only sent in exact mode; tree drafts are greedy")
    if state.finished:
        raise precondition(f"session already finished ({state.finish.value}); send Close, or open a new session")
    if round_no != state.next_round:
        raise precondition(f"round {round_no} out of order: expected round {state.next_round}")
    n = len(tokens)
    if len(parents) != n:
        raise invalid(f"draft.parents has {len(parents)} entries for {n} tokens: send one parent index per token")
    if not 1 <= n <= limits.max_tree_tokens:
        raise invalid(f"a tree of {n} tokens; send between 1 and max_tree_tokens = {limits.max_tree_tokens}")
    check_token_ids(tokens, limits.vocab_size, "draft.token_ids")
    depth: list[int] = []
    siblings: set[tuple[int, int]] = set()
    for i, (parent, token) in enumerate(zip(parents, tokens)):
        if not -1 <= parent < i:
            raise invalid(f"draft.parents[{i}] = {parent}: a parent is -1 (the pending token) or an earlier token's index")
        if (parent, token) in siblings:
            raise invalid(f"draft.token_ids[{i}] = {token} repeats a sibling's token: siblings must differ")
        siblings.add((parent, token))
        depth.append(1 if parent < 0 else depth[parent] + 1)
    if max(depth) > limits.max_k:
        raise invalid(f"the tree is {max(depth)} tokens deep; at most max_k = {limits.max_k}")
    if len(state.committed) + max(depth) > limits.max_context:
        raise out_of_range(
            f"a path of {max(depth)} drafts would pass the max context of {limits.max_context} tokens "
            f"({len(state.committed)} committed); draft at most {state.context_room} deep"
        )
    return DraftBlock(round_no=round_no, tokens=list(tokens), parents=list(parents))


def _checked_q(q: list[tuple[list[int], list[float]]], tokens: list[int], vocab: int) -> list[tuple[list[int], list[float]]]:
    if len(q) != len(tokens):
        raise invalid(f"exact mode needs one draft distribution per drafted token: got {len(q)} for {len(tokens)} tokens")
    out = []
    for i, ((ids, probs), token) in enumerate(zip(q, tokens)):
        if len(ids) != len(probs) or not ids:
            raise invalid(f"draft.q[{i}]: token_ids ({len(ids)}) and probs ({len(probs)}) must be non-empty and of equal length")
        check_token_ids(ids, vocab, f"draft.q[{i}].token_ids")
        if len(set(ids)) != len(ids):
            raise invalid(f"draft.q[{i}].token_ids has duplicates")
        if not all(math.isfinite(p) and p >= 0.0 for p in probs):
            raise invalid(f"draft.q[{i}].probs must be finite and >= 0 (got NaN, inf or a negative value)")
        mass = math.fsum(probs)
        if abs(mass - 1.0) > Q_MASS_TOLERANCE:
            raise invalid(f"draft.q[{i}].probs sums to {mass:.6f}, not 1: send the distribution the token was sampled from")
        by_id = dict(zip(ids, probs))
        if by_id.get(token, 0.0) <= 0.0:
            raise invalid(f"draft.q[{i}] gives the drafted token {token} probability 0: it cannot have been sampled from it")
        out.append((list(ids), [p / mass for p in probs]))
    return out


def commit_round(state: SessionState, block_tokens: list[int], accepted: int, next_token: int) -> tuple[int, int, Finish]:
    """Applies stop tokens, max_new_tokens and the context limit to a raw verdict.

    The round emits drafts[:accepted] + [next_token]; that sequence is cut after the first
    stop token and at the remaining budget, and the last kept token becomes the verdict's
    next token (a kept draft equals what the target would have emitted there). Updates the
    session and returns (accepted, next_token, finish) as sent to the client.
    """
    emitted = list(block_tokens[:accepted]) + [next_token]
    budget = min(state.max_new_tokens - state.generated, state.context_room)
    finish = Finish.NONE
    for i, tok in enumerate(emitted):
        if tok in state.stop_ids:
            emitted, finish = emitted[: i + 1], Finish.STOP_TOKEN
            break
    if len(emitted) > budget:
        emitted, finish = emitted[:budget], Finish.NONE  # a stop token past the budget is cut off
    if finish is Finish.NONE and len(emitted) == budget:
        finish = Finish.LENGTH if state.max_new_tokens - state.generated <= state.context_room else Finish.CONTEXT
    state.committed.extend(emitted)
    state.generated += len(emitted)
    state.finish = finish
    state.next_round += 1
    return len(emitted) - 1, emitted[-1], finish
