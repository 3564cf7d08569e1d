"""Converts wire messages (edgespec.v1) to the verifier's session types and back.

The enum numbers and field conventions come from ``edgespec.edge.wire``, the codec both sides
share; this module only adds the verifier's own types (``OpenRequest``, ``Verdict``).
"""

from __future__ import annotations

from edgespec.cloud.serving.session import OpenRequest, Verdict, invalid
from edgespec.edge.params import Finish, Mode
from edgespec.edge.wire import FINISH_TO_WIRE, MODE_FROM_WIRE, MODE_TO_WIRE, sampling_from_proto
from edgespec.v1 import speculative_pb2 as pb

SERVED_MODES = [MODE_TO_WIRE[mode] for mode in Mode]


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
