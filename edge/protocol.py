"""The client's side of the protocol (docs/protocol.md) as a state machine with no I/O.

Sans-I/O, as h11: ``ClientSession`` builds the messages to send (Open, Draft, Close, a
GenerateRequest) and takes the messages received (Opened, Verdict, GenerateResponse tokens),
and says what they mean; it never touches a socket, a clock, a model or a policy. The driver
(``edgespec.edge.driver``) moves the messages and decides what to draft; a port of the client
to another language reimplements this file and that loop.

What it tracks:

- *committed*: the prompt and every token a verdict (or a Generate message) committed; the
  generation's output is ``committed[len(prompt):]``;
- *round numbers*: the next round of seeded draws (``round_no``): a verified round, or one
  cloud-only token; a fresh block carries it, a block sent ahead the one after the block before;
- *in flight*: the blocks sent on this stream whose verdicts have not come back, in send order;
  a block is *stale* once an assumption it rests on failed (a block before it was not accepted
  whole with the bonus token it assumed): its verdict will say ``discarded`` and is skipped;
- *resume*: every Open (the first, a reopen after a broken stream or a drain, a switch back
  from cloud-only) carries every committed token, the remaining budget and the next round, so
  the output equals an uninterrupted run.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import Enum
from typing import Sequence

import grpc

from edgespec.edge.errors import status_error
from edgespec.edge.params import GenerationParams, Mode
from edgespec.edge.sampling import SparseDist
from edgespec.edge.wire import CLOSE_REQUEST, draft_request, finish_name, generate_request, open_request
from edgespec.v1 import speculative_pb2 as pb


@dataclass
class Block:
    """One drafted block on its way to the verifier."""

    round_no: int
    tokens: list[int]  # the drafts d1..dk (a tree: the chain first, then runner-up leaves)
    q: list[SparseDist] | None  # exact mode: the distribution each draft was sampled from
    assumed: int | None = None  # sent ahead: the bonus token the block before it must emit
    draft_ms: float = 0.0
    prefilled: bool = False  # its drafting also fed the context (not a per-token drafting time)
    parents: list[int] | None = None  # a tree: each token's parent index, -1 = the pending token
    sent_at: float = 0.0
    stale: bool = False  # an assumption it rests on failed: its verdict will be "discarded"

    @property
    def ahead(self) -> bool:
        return self.assumed is not None

    @property
    def chain_length(self) -> int:
        """The drafts of the block's main chain (a tree's leaves come after it)."""
        if self.parents is None:
            return len(self.tokens)
        return next((i for i, parent in enumerate(self.parents) if parent != i - 1), len(self.parents))


class Kind(str, Enum):
    COMMITTED = "committed"  # the verdict committed tokens
    STALE = "stale"  # the verdict of a block this device had already dropped ("discarded")
    DISCARDED = "discarded"  # the verifier discarded a block this device still counted on


@dataclass
class Outcome:
    """What one verdict meant. After a commit the draft's context must hold ``committed[:keep]``
    (when ``holds``, it already holds everything the next block in flight assumed)."""

    kind: Kind
    block: Block
    tokens: list[int] = field(default_factory=list)  # committed by this verdict
    accepted: int = 0  # the verdict's n: drafts accepted
    keep: int = 0  # committed tokens the draft's context keeps (its chain's accepted part)
    holds: bool = False  # the next block in flight assumed exactly this verdict: it stays valid
    dropped: int = 0  # blocks this verdict made stale (a discarded one counts itself)
    finished: bool = False
    draining: bool = False  # committed; the replica ends the stream next: reopen elsewhere
    verdict: pb.Verdict | None = None


class ClientSession:
    """One generation's protocol state, across every stream it takes (Session and Generate)."""

    def __init__(self, prompt_ids: Sequence[int], params: GenerationParams, fingerprint: str,
                 stop_token_ids: Sequence[int], *, max_context: int, max_k: int):
        self.params, self.fingerprint = params, fingerprint
        self.stop_token_ids = list(stop_token_ids)
        self.prompt_len = len(prompt_ids)
        self.committed = list(prompt_ids)
        self.round_no = 0
        self.finish_reason = ""
        self.max_context, self.max_k = max_context, max_k
        self.inflight: deque[Block] = deque()

    @property
    def generated(self) -> list[int]:
        return self.committed[self.prompt_len:]

    @property
    def remaining(self) -> int:
        return self.params.max_new_tokens - (len(self.committed) - self.prompt_len)

    @property
    def draft_room(self) -> int:
        """Drafts a fresh block may hold: a round commits up to k + 1 tokens the draft must still see."""
        return self.max_context - len(self.committed) - 1

    @property
    def valid_inflight(self) -> list[Block]:
        return [block for block in self.inflight if not block.stale]

    # ---- messages out ----------------------------------------------------------------------

    def open(self) -> pb.SessionRequest:
        """The Open of a new Session stream: every committed token, the budget left, the next round."""
        self.inflight.clear()  # a new stream: nothing of an old one is in flight
        return open_request(self.committed, self.params.sampling, self.params.resolved_mode, self.fingerprint,
                            max_new_tokens=self.remaining, stop_token_ids=self.stop_token_ids, first_round=self.round_no)

    def generate(self) -> pb.GenerateRequest:
        """A cloud-only Generate call continuing from every committed token."""
        self.inflight.clear()
        return generate_request(self.committed, self.params.sampling, self.fingerprint,
                                max_new_tokens=self.remaining, stop_token_ids=self.stop_token_ids, first_round=self.round_no)

    def fresh_limit(self) -> int:
        """The most drafts a fresh block (round ``round_no``) may hold; 0: no room to draft."""
        if self.draft_room < 1:
            return 0
        return min(self.max_k, self.draft_room, max(1, self.remaining - 1))

    def ahead_limit(self) -> int:
        """The most drafts a block sent ahead of the last valid one may hold; 0: none may go."""
        valid = self.valid_inflight
        if not valid or valid[-1].parents is not None:
            return 0  # (nothing goes ahead of a tree: which of its paths holds is unknown)
        pending = sum(len(b.tokens) + 1 for b in valid)
        room = self.max_context - (len(self.committed) + pending) - 1
        budget = self.remaining - pending
        if room < 1 or budget < 2:
            return 0
        return min(self.max_k, room, budget - 1)

    def next_ahead_round(self) -> int:
        return self.valid_inflight[-1].round_no + 1

    def draft(self, block: Block) -> pb.SessionRequest:
        """The Draft for ``block``; from here on it is in flight."""
        q = block.q if self.params.mode is Mode.EXACT else None
        self.inflight.append(block)
        return draft_request(block.round_no, block.tokens, q, assumed_token=block.assumed, parents=block.parents)

    def close(self) -> pb.SessionRequest:
        return CLOSE_REQUEST

    # ---- messages in -----------------------------------------------------------------------

    def opened(self, message: pb.Opened) -> None:
        self.max_context = min(self.max_context, message.max_context or self.max_context)

    def verdict(self, message: pb.Verdict) -> Outcome:
        """Applies the verdict of the oldest block in flight."""
        if not self.inflight:
            raise status_error(grpc.StatusCode.INTERNAL, f"verdict for round {message.round} with no block in flight")
        block = self.inflight.popleft()
        if message.round != block.round_no:
            raise status_error(grpc.StatusCode.INTERNAL, f"verdict for round {message.round}, expected {block.round_no}")
        if block.stale:
            if not message.discarded:  # the verifier committed what this device dropped
                raise status_error(grpc.StatusCode.INTERNAL, f"round {block.round_no} was verified, not discarded")
            return Outcome(Kind.STALE, block)
        if message.discarded:  # the verifier saw otherwise: resynchronise on what is committed
            return Outcome(Kind.DISCARDED, block, keep=len(self.committed), dropped=1 + self.drop_inflight())
        return self._commit(block, message)

    def _commit(self, block: Block, message: pb.Verdict) -> Outcome:
        n, token = message.accepted, message.next_token
        path = list(message.accepted_path) if block.parents is not None else list(range(n))
        if any(not 0 <= i < len(block.tokens) for i in path):
            raise status_error(grpc.StatusCode.INTERNAL, f"round {block.round_no} accepted drafts {path} of {len(block.tokens)}")
        new_tokens = [block.tokens[i] for i in path] + [token]
        chain = sum(1 for i in path if i < block.chain_length)  # drafts the draft's context holds
        keep = len(self.committed) + chain
        self.committed.extend(new_tokens)
        self.round_no = block.round_no + 1
        if message.finished:
            self.finish_reason = finish_name(message.finish_reason)
        head = self.inflight[0] if self.inflight else None
        holds = (n == block.chain_length and head is not None and not head.stale and head.assumed == token
                 and not message.finished)
        dropped = 0 if holds else self.drop_inflight()
        return Outcome(Kind.COMMITTED, block, new_tokens, n, keep, holds, dropped,
                       message.finished, message.draining and not message.finished, message)

    def drop_inflight(self) -> int:
        """Marks every block in flight stale; returns how many were not already."""
        fresh = [block for block in self.inflight if not block.stale]
        for block in fresh:
            block.stale = True
        return len(fresh)

    def tokens(self, token_ids: Sequence[int], finish: str) -> None:
        """Commits the tokens of a Generate message (one round of draws each)."""
        self.committed.extend(token_ids)
        self.round_no += len(token_ids)
        if finish:
            self.finish_reason = finish
