from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class VerifyMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    VERIFY_MODE_UNSPECIFIED: _ClassVar[VerifyMode]
    VERIFY_MODE_GREEDY: _ClassVar[VerifyMode]
    VERIFY_MODE_EXACT: _ClassVar[VerifyMode]
    VERIFY_MODE_TOKEN: _ClassVar[VerifyMode]
    VERIFY_MODE_COUPLED: _ClassVar[VerifyMode]

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_STOP_TOKEN: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_CONTEXT: _ClassVar[FinishReason]
VERIFY_MODE_UNSPECIFIED: VerifyMode
VERIFY_MODE_GREEDY: VerifyMode
VERIFY_MODE_EXACT: VerifyMode
VERIFY_MODE_TOKEN: VerifyMode
VERIFY_MODE_COUPLED: VerifyMode
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_STOP_TOKEN: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_CONTEXT: FinishReason

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_k", "top_p", "seed")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_k: int
    top_p: float
    seed: int
    def __init__(self, temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., seed: _Optional[int] = ...) -> None: ...

class SparseDistribution(_message.Message):
    __slots__ = ("token_ids", "probs")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    PROBS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    probs: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., probs: _Optional[_Iterable[float]] = ...) -> None: ...

class Open(_message.Message):
    __slots__ = ("prompt_ids", "sampling", "mode", "tokenizer_fingerprint", "max_new_tokens", "stop_token_ids", "first_round", "client_id")
    PROMPT_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FIRST_ROUND_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    prompt_ids: _containers.RepeatedScalarFieldContainer[int]
    sampling: SamplingParams
    mode: VerifyMode
    tokenizer_fingerprint: str
    max_new_tokens: int
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    first_round: int
    client_id: str
    def __init__(self, prompt_ids: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., mode: _Optional[_Union[VerifyMode, str]] = ..., tokenizer_fingerprint: _Optional[str] = ..., max_new_tokens: _Optional[int] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., first_round: _Optional[int] = ..., client_id: _Optional[str] = ...) -> None: ...

class Draft(_message.Message):
    __slots__ = ("round", "token_ids", "q", "ahead", "assumed_token", "parents")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    Q_FIELD_NUMBER: _ClassVar[int]
    AHEAD_FIELD_NUMBER: _ClassVar[int]
    ASSUMED_TOKEN_FIELD_NUMBER: _ClassVar[int]
    PARENTS_FIELD_NUMBER: _ClassVar[int]
    round: int
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    q: _containers.RepeatedCompositeFieldContainer[SparseDistribution]
    ahead: bool
    assumed_token: int
    parents: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, round: _Optional[int] = ..., token_ids: _Optional[_Iterable[int]] = ..., q: _Optional[_Iterable[_Union[SparseDistribution, _Mapping]]] = ..., ahead: _Optional[bool] = ..., assumed_token: _Optional[int] = ..., parents: _Optional[_Iterable[int]] = ...) -> None: ...

class Close(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SessionRequest(_message.Message):
    __slots__ = ("open", "draft", "close")
    OPEN_FIELD_NUMBER: _ClassVar[int]
    DRAFT_FIELD_NUMBER: _ClassVar[int]
    CLOSE_FIELD_NUMBER: _ClassVar[int]
    open: Open
    draft: Draft
    close: Close
    def __init__(self, open: _Optional[_Union[Open, _Mapping]] = ..., draft: _Optional[_Union[Draft, _Mapping]] = ..., close: _Optional[_Union[Close, _Mapping]] = ...) -> None: ...

class Opened(_message.Message):
    __slots__ = ("session_id", "max_k", "max_context", "max_new_tokens", "model_id", "replica_id")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_K_FIELD_NUMBER: _ClassVar[int]
    MAX_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    max_k: int
    max_context: int
    max_new_tokens: int
    model_id: str
    replica_id: str
    def __init__(self, session_id: _Optional[str] = ..., max_k: _Optional[int] = ..., max_context: _Optional[int] = ..., max_new_tokens: _Optional[int] = ..., model_id: _Optional[str] = ..., replica_id: _Optional[str] = ...) -> None: ...

class Verdict(_message.Message):
    __slots__ = ("round", "accepted", "next_token", "finished", "finish_reason", "batch_size", "verify_ms", "discarded", "accepted_path", "draining")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    NEXT_TOKEN_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    VERIFY_MS_FIELD_NUMBER: _ClassVar[int]
    DISCARDED_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_PATH_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    round: int
    accepted: int
    next_token: int
    finished: bool
    finish_reason: FinishReason
    batch_size: int
    verify_ms: float
    discarded: bool
    accepted_path: _containers.RepeatedScalarFieldContainer[int]
    draining: bool
    def __init__(self, round: _Optional[int] = ..., accepted: _Optional[int] = ..., next_token: _Optional[int] = ..., finished: _Optional[bool] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., batch_size: _Optional[int] = ..., verify_ms: _Optional[float] = ..., discarded: _Optional[bool] = ..., accepted_path: _Optional[_Iterable[int]] = ..., draining: _Optional[bool] = ...) -> None: ...

class Closed(_message.Message):
    __slots__ = ("rounds", "generated_tokens")
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    GENERATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    rounds: int
    generated_tokens: int
    def __init__(self, rounds: _Optional[int] = ..., generated_tokens: _Optional[int] = ...) -> None: ...

class SessionResponse(_message.Message):
    __slots__ = ("opened", "verdict", "closed")
    OPENED_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    CLOSED_FIELD_NUMBER: _ClassVar[int]
    opened: Opened
    verdict: Verdict
    closed: Closed
    def __init__(self, opened: _Optional[_Union[Opened, _Mapping]] = ..., verdict: _Optional[_Union[Verdict, _Mapping]] = ..., closed: _Optional[_Union[Closed, _Mapping]] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("prompt_ids", "sampling", "tokenizer_fingerprint", "max_new_tokens", "stop_token_ids", "first_round")
    PROMPT_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FIRST_ROUND_FIELD_NUMBER: _ClassVar[int]
    prompt_ids: _containers.RepeatedScalarFieldContainer[int]
    sampling: SamplingParams
    tokenizer_fingerprint: str
    max_new_tokens: int
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    first_round: int
    def __init__(self, prompt_ids: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., tokenizer_fingerprint: _Optional[str] = ..., max_new_tokens: _Optional[int] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., first_round: _Optional[int] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("token_ids", "finished", "finish_reason", "draining", "batch_size", "step_ms", "token_probs")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    STEP_MS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_PROBS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    finished: bool
    finish_reason: FinishReason
    draining: bool
    batch_size: int
    step_ms: float
    token_probs: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., finished: _Optional[bool] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., draining: _Optional[bool] = ..., batch_size: _Optional[int] = ..., step_ms: _Optional[float] = ..., token_probs: _Optional[_Iterable[float]] = ...) -> None: ...

class InfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class InfoResponse(_message.Message):
    __slots__ = ("model_id", "tokenizer_fingerprint", "vocab_size", "max_context", "max_k", "modes", "max_new_tokens", "version", "target_params", "kv_bytes_per_token", "replica_rss_bytes", "active_sessions", "forward_ms", "send_ahead", "max_tree_tokens", "decode_ms", "max_sessions", "free_sessions", "session_idle_timeout_s", "first_message_timeout_s", "default_max_new_tokens", "max_message_bytes", "max_q_entries", "auth_required", "replica_id", "stream_ms")
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    MAX_K_FIELD_NUMBER: _ClassVar[int]
    MODES_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TARGET_PARAMS_FIELD_NUMBER: _ClassVar[int]
    KV_BYTES_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    REPLICA_RSS_BYTES_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    FORWARD_MS_FIELD_NUMBER: _ClassVar[int]
    SEND_AHEAD_FIELD_NUMBER: _ClassVar[int]
    MAX_TREE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DECODE_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    FREE_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    SESSION_IDLE_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    FIRST_MESSAGE_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_Q_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    AUTH_REQUIRED_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    STREAM_MS_FIELD_NUMBER: _ClassVar[int]
    model_id: str
    tokenizer_fingerprint: str
    vocab_size: int
    max_context: int
    max_k: int
    modes: _containers.RepeatedScalarFieldContainer[VerifyMode]
    max_new_tokens: int
    version: str
    target_params: int
    kv_bytes_per_token: int
    replica_rss_bytes: int
    active_sessions: int
    forward_ms: float
    send_ahead: bool
    max_tree_tokens: int
    decode_ms: float
    max_sessions: int
    free_sessions: int
    session_idle_timeout_s: float
    first_message_timeout_s: float
    default_max_new_tokens: int
    max_message_bytes: int
    max_q_entries: int
    auth_required: bool
    replica_id: str
    stream_ms: float
    def __init__(self, model_id: _Optional[str] = ..., tokenizer_fingerprint: _Optional[str] = ..., vocab_size: _Optional[int] = ..., max_context: _Optional[int] = ..., max_k: _Optional[int] = ..., modes: _Optional[_Iterable[_Union[VerifyMode, str]]] = ..., max_new_tokens: _Optional[int] = ..., version: _Optional[str] = ..., target_params: _Optional[int] = ..., kv_bytes_per_token: _Optional[int] = ..., replica_rss_bytes: _Optional[int] = ..., active_sessions: _Optional[int] = ..., forward_ms: _Optional[float] = ..., send_ahead: _Optional[bool] = ..., max_tree_tokens: _Optional[int] = ..., decode_ms: _Optional[float] = ..., max_sessions: _Optional[int] = ..., free_sessions: _Optional[int] = ..., session_idle_timeout_s: _Optional[float] = ..., first_message_timeout_s: _Optional[float] = ..., default_max_new_tokens: _Optional[int] = ..., max_message_bytes: _Optional[int] = ..., max_q_entries: _Optional[int] = ..., auth_required: _Optional[bool] = ..., replica_id: _Optional[str] = ..., stream_ms: _Optional[float] = ...) -> None: ...
