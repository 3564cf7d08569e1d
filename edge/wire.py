"""The one codec between the shared types (``edgespec.edge.params``) and the wire contract.

Both sides use it: the device to build its requests and read the verdicts, the verifier
(``edgespec.cloud.serving.codec``) to read the same messages back. Enum numbers, the meaning
of a zero field (top_p 0 = off) and the byte count of a message are written here only.
"""

from __future__ import annotations

from typing import Sequence

from edgespec.edge.params import Finish, Mode, SamplingParams
from edgespec.edge.types import ServerInfo
from edgespec.v1 import speculative_pb2 as pb

MODE_TO_WIRE = {
    Mode.GREEDY: pb.VERIFY_MODE_GREEDY,
    Mode.EXACT: pb.VERIFY_MODE_EXACT,
    Mode.TOKEN: pb.VERIFY_MODE_TOKEN,
    Mode.COUPLED: pb.VERIFY_MODE_COUPLED,
}
MODE_FROM_WIRE = {number: mode for mode, number in MODE_TO_WIRE.items()}
FINISH_TO_WIRE = {
    Finish.NONE: pb.FINISH_REASON_UNSPECIFIED,
    Finish.STOP_TOKEN: pb.FINISH_REASON_STOP_TOKEN,
    Finish.LENGTH: pb.FINISH_REASON_LENGTH,
    Finish.CONTEXT: pb.FINISH_REASON_CONTEXT,
}
FINISH_FROM_WIRE: dict[int, Finish] = {number: finish for finish, number in FINISH_TO_WIRE.items()}
GRPC_FRAME_HEADER = 5  # bytes before every gRPC message on the wire: flag + 4-byte length


def wire_bytes(message) -> int:
    """What a message costs on the wire: its protobuf payload plus the gRPC frame header."""
    return message.ByteSize() + GRPC_FRAME_HEADER


def sampling_to_proto(params: SamplingParams) -> pb.SamplingParams:
    return pb.SamplingParams(temperature=params.temperature, top_k=params.top_k, top_p=params.top_p, seed=params.seed)


def sampling_from_proto(message: pb.SamplingParams) -> SamplingParams:
    """Raises ValueError naming the field when the values are not valid sampling parameters."""
    # proto3 cannot tell an unset float from 0: top_p 0 means "off", like 1.
    top_p = float(message.top_p)
    return SamplingParams(
        temperature=float(message.temperature),
        top_k=int(message.top_k),
        top_p=1.0 if top_p == 0.0 else top_p,
        seed=int(message.seed),
    )


def finish_name(number: int) -> str:
    """A wire FinishReason as the SDK reports it ("stop_token", "length", "context")."""
    finish = FINISH_FROM_WIRE.get(number)
    return finish.value if finish is not None and finish is not Finish.NONE else "unknown"


def open_request(
    prompt_ids: Sequence[int],
    sampling: SamplingParams,
    mode: Mode,
    fingerprint: str,
    *,
    max_new_tokens: int,
    stop_token_ids: Sequence[int],
    first_round: int,
) -> pb.SessionRequest:
    return pb.SessionRequest(
        open=pb.Open(
            prompt_ids=list(prompt_ids),
            sampling=sampling_to_proto(sampling),
            mode=MODE_TO_WIRE[Mode(mode)],
            tokenizer_fingerprint=fingerprint,
            max_new_tokens=max_new_tokens,
            stop_token_ids=list(stop_token_ids),
            first_round=first_round,
        )
    )


def draft_request(
    round_no: int, tokens: Sequence[int], q=None, *, assumed_token: int | None = None, parents: Sequence[int] | None = None
) -> pb.SessionRequest:
    """A Draft; ``q`` (exact mode) is one SparseDist per drafted token; ``assumed_token``: a block
    sent ahead, valid if the previous round accepts all its drafts and emits that bonus token;
    ``parents``: a tree draft (each token's parent index, -1 = the pending token)."""
    message = pb.Draft(round=round_no, token_ids=list(tokens), parents=list(parents or []))
    if assumed_token is not None:
        message.ahead, message.assumed_token = True, assumed_token
    if q:
        message.q.extend(pb.SparseDistribution(token_ids=d.token_ids.tolist(), probs=d.probs.tolist()) for d in q)
    return pb.SessionRequest(draft=message)


CLOSE_REQUEST = pb.SessionRequest(close=pb.Close())


def generate_request(
    prompt_ids: Sequence[int],
    sampling: SamplingParams,
    fingerprint: str,
    *,
    max_new_tokens: int,
    stop_token_ids: Sequence[int],
    first_round: int = 0,
) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        prompt_ids=list(prompt_ids),
        sampling=sampling_to_proto(sampling),
        tokenizer_fingerprint=fingerprint,
        max_new_tokens=max_new_tokens,
        stop_token_ids=list(stop_token_ids),
        first_round=first_round,
    )


def server_info(reply: pb.InfoResponse) -> ServerInfo:
    return ServerInfo(
        model_id=reply.model_id,
        tokenizer_fingerprint=reply.tokenizer_fingerprint,
        vocab_size=reply.vocab_size,
        max_context=reply.max_context,
        max_k=reply.max_k,
        max_new_tokens=reply.max_new_tokens,
        modes=tuple(MODE_FROM_WIRE[m].value if m in MODE_FROM_WIRE else str(m) for m in reply.modes),
        version=reply.version,
        target_params=reply.target_params,
        kv_bytes_per_token=reply.kv_bytes_per_token,
        replica_rss_bytes=reply.replica_rss_bytes,
        active_sessions=reply.active_sessions,
        forward_ms=reply.forward_ms,
        decode_ms=reply.decode_ms,
        stream_ms=reply.stream_ms,
        max_sessions=reply.max_sessions,
        free_sessions=reply.free_sessions,
        session_idle_timeout_s=reply.session_idle_timeout_s,
        first_message_timeout_s=reply.first_message_timeout_s,
        default_max_new_tokens=reply.default_max_new_tokens,
        max_message_bytes=reply.max_message_bytes,
        max_q_entries=reply.max_q_entries,
        auth_required=reply.auth_required,
        send_ahead=reply.send_ahead,
        max_tree_tokens=reply.max_tree_tokens,
    )
