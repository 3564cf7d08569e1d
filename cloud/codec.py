"""Converts wire messages (edgespec.v1) to the verifier's own types and back.

The only place in cloud/ that knows both the protobuf classes and the session types.
"""

from __future__ import annotations

from edgespec.cloud.sampling import Sampling
from edgespec.cloud.session import Finish, Mode, OpenRequest, Verdict, invalid
from edgespec.v1 import speculative_pb2 as pb

MODES = {
    pb.VERIFY_MODE_GREEDY: Mode.GREEDY,
    pb.VERIFY_MODE_EXACT: Mode.EXACT,
    pb.VERIFY_MODE_TOKEN: Mode.TOKEN,
}
MODE_NUMBERS = {mode: number for number, mode in MODES.items()}
FINISH_REASONS = {
    Finish.NONE: pb.FINISH_REASON_UNSPECIFIED,
    Finish.STOP_TOKEN: pb.FINISH_REASON_STOP_TOKEN,
    Finish.LENGTH: pb.FINISH_REASON_LENGTH,
    Finish.CONTEXT: pb.FINISH_REASON_CONTEXT,
}


def sampling_from_proto(msg: pb.SamplingParams) -> Sampling:
    try:
        return Sampling(
            temperature=float(msg.temperature),
            top_k=int(msg.top_k),
            top_p=float(msg.top_p) if msg.top_p > 0 else 1.0,
            seed=int(msg.seed),
        )
    except ValueError as exc:
        raise invalid(f"sampling: {exc}") from None


def open_from_proto(msg: pb.Open) -> OpenRequest:
    return OpenRequest(
        prompt_ids=list(msg.prompt_ids),
        sampling=sampling_from_proto(msg.sampling),
        mode=MODES.get(msg.mode),
        mode_number=int(msg.mode),
        tokenizer_fingerprint=msg.tokenizer_fingerprint,
        max_new_tokens=int(msg.max_new_tokens),
        stop_token_ids=list(msg.stop_token_ids),
        first_round=int(msg.first_round),
    )


def generate_from_proto(msg: pb.GenerateRequest) -> OpenRequest:
    """A Generate call is a session that never drafts: greedy, or sampling from p."""
    sampling = sampling_from_proto(msg.sampling)
    mode = Mode.GREEDY if sampling.is_greedy else Mode.TOKEN
    return OpenRequest(
        prompt_ids=list(msg.prompt_ids),
        sampling=sampling,
        mode=mode,
        mode_number=MODE_NUMBERS[mode],
        tokenizer_fingerprint=msg.tokenizer_fingerprint,
        max_new_tokens=int(msg.max_new_tokens),
        stop_token_ids=list(msg.stop_token_ids),
    )


def draft_q(msg: pb.Draft) -> list[tuple[list[int], list[float]]]:
    return [(list(dist.token_ids), list(dist.probs)) for dist in msg.q]


def verdict_to_proto(verdict: Verdict) -> pb.SessionResponse:
    return pb.SessionResponse(
        verdict=pb.Verdict(
            round=verdict.round_no,
            accepted=verdict.accepted,
            next_token=verdict.next_token,
            finished=verdict.finish is not Finish.NONE,
            finish_reason=FINISH_REASONS[verdict.finish],
            batch_size=verdict.batch_size,
            verify_ms=verdict.verify_ms,
        )
    )
