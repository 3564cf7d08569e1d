"""The client's protocol core alone: no network, no model, no clock."""

from __future__ import annotations

import ast
import inspect

import pytest

from edgespec.edge import protocol
from edgespec.edge.errors import ServerError
from edgespec.edge.params import GenerationParams
from edgespec.edge.protocol import Block, ClientSession, Kind
from edgespec.v1 import speculative_pb2 as pb

PROMPT = [1, 2, 3]


def session(max_new_tokens: int = 10, max_context: int = 100, max_k: int = 4) -> ClientSession:
    params = GenerationParams(max_new_tokens=max_new_tokens)
    return ClientSession(PROMPT, params, "fp", [0], max_context=max_context, max_k=max_k)


def verdict(round_no: int, accepted: int, token: int, **fields) -> pb.Verdict:
    return pb.Verdict(round=round_no, accepted=accepted, next_token=token, **fields)


def test_open_carries_every_committed_token_the_budget_left_and_the_next_round():
    s = session()
    first = s.open().open
    assert (list(first.prompt_ids), first.max_new_tokens, first.first_round) == (PROMPT, 10, 0)
    s.draft(Block(0, [7, 8, 9], None))
    outcome = s.verdict(verdict(0, 2, 5))
    assert outcome.kind is Kind.COMMITTED and outcome.tokens == [7, 8, 5] and outcome.keep == len(PROMPT) + 2
    again = s.open().open  # a resume after a broken stream
    assert (list(again.prompt_ids), again.max_new_tokens, again.first_round) == (PROMPT + [7, 8, 5], 7, 1)
    assert not s.inflight and s.generated == [7, 8, 5]


def test_a_verdict_for_another_round_is_an_error():
    s = session()
    s.draft(Block(0, [7], None))
    with pytest.raises(ServerError, match="expected 0"):
        s.verdict(verdict(1, 0, 5))


def test_a_block_sent_ahead_holds_when_its_assumption_does():
    s = session()
    s.draft(Block(0, [7, 8], None))
    assert s.next_ahead_round() == 1
    s.draft(Block(1, [6, 4], None, assumed=9))
    outcome = s.verdict(verdict(0, 2, 9))  # all accepted, bonus 9: what the ahead block assumed
    assert outcome.holds and outcome.dropped == 0 and s.valid_inflight[0].round_no == 1
    outcome = s.verdict(verdict(1, 1, 3))
    assert outcome.kind is Kind.COMMITTED and outcome.block.ahead and s.generated == [7, 8, 9, 6, 3]
    assert s.round_no == 2


def test_a_failed_assumption_makes_the_blocks_in_flight_stale_and_their_verdicts_are_skipped():
    s = session(max_new_tokens=20)
    s.draft(Block(0, [7, 8], None))
    s.draft(Block(1, [6], None, assumed=9))
    s.draft(Block(2, [5], None, assumed=4))
    outcome = s.verdict(verdict(0, 1, 2))  # a rejection: nothing assumed holds
    assert not outcome.holds and outcome.dropped == 2 and not s.valid_inflight
    assert s.verdict(verdict(1, 0, 0, discarded=True)).kind is Kind.STALE
    with pytest.raises(ServerError, match="verified, not discarded"):
        s.verdict(verdict(2, 1, 3))  # the verifier committed what this device dropped
    assert s.generated == [7, 2] and s.round_no == 1  # the next fresh block is round 1 again


def test_a_discarded_block_the_device_counted_on_drops_everything_after_it():
    s = session()
    s.draft(Block(0, [7], None, assumed=1))
    s.draft(Block(1, [8], None, assumed=2))
    outcome = s.verdict(verdict(0, 0, 0, discarded=True))
    assert outcome.kind is Kind.DISCARDED and outcome.dropped == 2 and outcome.keep == len(PROMPT)
    assert s.generated == [] and s.round_no == 0


def test_the_budget_bounds_blocks_and_a_finished_verdict_ends_it():
    s = session(max_new_tokens=4)
    assert s.fresh_limit() == 3  # a round commits up to k + 1 tokens
    s.draft(Block(0, [7, 8], None))
    assert s.ahead_limit() == 0  # 3 tokens may come back; 1 left is no room for another round
    outcome = s.verdict(verdict(0, 2, 9))
    s.draft(Block(1, [1], None))
    outcome = s.verdict(verdict(1, 0, 4, finished=True, finish_reason=pb.FINISH_REASON_LENGTH))
    assert outcome.finished and s.finish_reason == "length" and s.remaining == 0


def test_the_context_limit_bounds_blocks():
    s = session(max_context=len(PROMPT) + 3)
    assert s.draft_room == 2 and s.fresh_limit() == 2
    s.opened(pb.Opened(max_context=len(PROMPT) + 1))
    assert s.fresh_limit() == 0


def test_a_tree_commits_its_accepted_path_and_keeps_only_the_chain_in_the_draft():
    s = session()
    block = Block(0, [7, 8, 9, 5], None, parents=[-1, 0, 1, 0])  # 5 is a sibling of 8
    assert block.chain_length == 3
    s.draft(block)
    outcome = s.verdict(verdict(0, 2, 6, accepted_path=[0, 3]))
    assert outcome.tokens == [7, 5, 6] and outcome.keep == len(PROMPT) + 1


def test_generate_messages_commit_one_round_per_token():
    s = session()
    request = s.generate()
    assert list(request.prompt_ids) == PROMPT and request.first_round == 0
    s.tokens([4, 5], "")
    s.tokens([6], "stop_token")
    assert s.generated == [4, 5, 6] and s.round_no == 3 and s.finish_reason == "stop_token"
    assert s.generate().first_round == 3


def test_the_core_does_no_io_and_stays_small():
    source = inspect.getsource(protocol)
    imported = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module)
    assert not imported & {"asyncio", "socket", "time", "threading", "grpc.aio", "concurrent.futures"}
    assert len(source.splitlines()) <= 250
