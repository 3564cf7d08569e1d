"""Converts wire messages (edgespec.v1) to the verifier's session types and back: every message
the verifier reads is parsed here and every message it sends is built here.

The enum numbers and field conventions come from ``edgespec.edge.wire``, the codec both sides
share; this module only adds the verifier's own types (``OpenRequest``, ``DraftMessage``,
``Verdict``, ``ReplicaDiagnostics``).
"""

from __future__ import annotations

from dataclasses import dataclass

from edgespec.cloud.serving.session import OpenRequest, Verdict, invalid
from edgespec.edge.params import Finish, Mode
from edgespec.edge.wire import FINISH_TO_WIRE, MODE_FROM_WIRE, MODE_TO_WIRE, sampling_from_proto
from edgespec.v1 import speculative_pb2 as pb

def _sampling(message: pb.SamplingParams):
    try:
        return sampling_from_proto(message)
    except ValueError as exc:
        raise invalid(f"sampling: {exc}") from None


def open_from_proto(msg: pb.Open) -> OpenRequest:
    return OpenRequest(
        prompt_ids=list(msg.prompt_ids),
        sampling=_sampling(msg.sampling),
        mode=MODE_FROM_WIRE.get(msg.mode),
        mode_number=int(msg.mode),
        tokenizer_fingerprint=msg.tokenizer_fingerprint,
        max_new_tokens=int(msg.max_new_tokens),
        stop_token_ids=list(msg.stop_token_ids),
        first_round=int(msg.first_round),
    )


def generate_from_proto(msg: pb.GenerateRequest) -> OpenRequest:
    """A Generate call is a session that never drafts: greedy, or sampling from p."""
    sampling = _sampling(msg.sampling)
    # Cloud-only sampling is the coupled rule with no drafts: t_P = argmax p / E_P at every
    # position, so a seed gives the same text here as through speculation in coupled mode.
    mode = Mode.GREEDY if sampling.is_greedy else Mode.COUPLED
    return OpenRequest(
        prompt_ids=list(msg.prompt_ids),
        sampling=sampling,
        mode=mode,
        mode_number=MODE_TO_WIRE[mode],
        tokenizer_fingerprint=msg.tokenizer_fingerprint,
        max_new_tokens=int(msg.max_new_tokens),
        stop_token_ids=list(msg.stop_token_ids),
        first_round=int(msg.first_round),
    )


@dataclass(frozen=True)
class DraftMessage:
    """A Draft as the verifier reads it."""

    round_no: int
    tokens: list[int]
    q: list[tuple[list[int], list[float]]]  # exact mode: (ids, probs) per draft
    ahead: bool
    assumed_token: int
    parents: list[int]


def draft_from_proto(msg: pb.Draft, max_q_entries: int | None = None) -> DraftMessage:
    return DraftMessage(int(msg.round), list(msg.token_ids), draft_q(msg, max_q_entries), bool(msg.ahead),
                        int(msg.assumed_token), list(msg.parents))


def draft_q(msg: pb.Draft, max_entries: int | None = None) -> list[tuple[list[int], list[float]]]:
    """The draft distributions as lists; each may hold at most ``max_entries`` tokens (checked
    before anything is converted)."""
    if max_entries is not None:
        for i, dist in enumerate(msg.q):
            if max(len(dist.token_ids), len(dist.probs)) > max_entries:
                raise invalid(f"draft.q[{i}] lists {max(len(dist.token_ids), len(dist.probs))} tokens; at most "
                              f"{max_entries} per draft (truncate q to its top tokens and renormalise: top_n)")
    return [(list(dist.token_ids), list(dist.probs)) for dist in msg.q]


def verdict_to_proto(verdict: Verdict) -> pb.SessionResponse:
    return pb.SessionResponse(
        verdict=pb.Verdict(
            round=verdict.round_no,
            accepted=verdict.accepted,
            next_token=verdict.next_token,
            finished=verdict.finish is not Finish.NONE,
            finish_reason=FINISH_TO_WIRE[verdict.finish],
            batch_size=verdict.batch_size,
            verify_ms=verdict.verify_ms,
            discarded=verdict.discarded,
            accepted_path=verdict.accepted_path or [],
        )
    )


def generate_reply_to_proto(verdict: Verdict, *, draining: bool) -> pb.GenerateResponse:
    """One decoding step of a Generate stream: its token, and whether the stream ends or moves."""
    return pb.GenerateResponse(
        token_ids=[verdict.next_token],
        finished=verdict.finish is not Finish.NONE,
        finish_reason=FINISH_TO_WIRE[verdict.finish],
        draining=draining,
        batch_size=verdict.batch_size,
        step_ms=verdict.verify_ms,
        token_probs=[] if verdict.next_prob is None else [verdict.next_prob],
    )


def opened_to_proto(session_id: str, *, max_k: int, max_context: int, max_new_tokens: int, model_id: str,
                    replica_id: str) -> pb.SessionResponse:
    return pb.SessionResponse(opened=pb.Opened(session_id=session_id, max_k=max_k, max_context=max_context,
                                               max_new_tokens=max_new_tokens, model_id=model_id, replica_id=replica_id))


def closed_to_proto(rounds: int, generated_tokens: int) -> pb.SessionResponse:
    return pb.SessionResponse(closed=pb.Closed(rounds=rounds, generated_tokens=generated_tokens))


@dataclass(frozen=True)
class ReplicaDiagnostics:
    """What Info tells only a caller with a key (or any caller of a keyless loopback verifier)."""

    target_params: int
    kv_bytes_per_token: int
    replica_rss_bytes: int
    active_sessions: int
    free_sessions: int
    replica_id: str


def info_to_proto(limits, config, *, version: str, forward_ms: float, decode_ms: float, stream_ms: float, max_message_bytes: int,
                  auth_required: bool, diagnostics: ReplicaDiagnostics | None = None) -> pb.InfoResponse:
    """``limits``: the verifier's ``Limits``; ``config``: its ``VerifierConfig``."""
    reply = pb.InfoResponse(
        model_id=config.model_id,
        tokenizer_fingerprint=limits.tokenizer_fingerprint,
        vocab_size=limits.vocab_size,
        max_context=limits.max_context,
        max_k=limits.max_k,
        modes=[MODE_TO_WIRE[mode] for mode in Mode if mode in limits.modes],
        max_new_tokens=limits.max_new_tokens,
        version=version,
        forward_ms=forward_ms,
        decode_ms=decode_ms,
        stream_ms=stream_ms,
        max_sessions=config.max_sessions,
        session_idle_timeout_s=config.session_idle_timeout_s,
        first_message_timeout_s=config.first_message_timeout_s,
        default_max_new_tokens=config.default_max_new_tokens,
        max_message_bytes=max_message_bytes,
        max_q_entries=config.max_q_entries,
        auth_required=auth_required,
        send_ahead=True,
        max_tree_tokens=limits.max_tree_tokens,
    )
    if diagnostics is not None:
        reply.target_params, reply.kv_bytes_per_token = diagnostics.target_params, diagnostics.kv_bytes_per_token
        reply.replica_rss_bytes, reply.active_sessions = diagnostics.replica_rss_bytes, diagnostics.active_sessions
        reply.free_sessions, reply.replica_id = diagnostics.free_sessions, diagnostics.replica_id
    return reply
