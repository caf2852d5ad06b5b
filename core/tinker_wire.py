"""The Tinker operations an engine host's clients (the Tinker API in server/tinker_api, a run's
engine backend) and the host (runners/engine_host/tinker_ops.py) exchange, one JSON line each,
wrapped in core.engine_wire's `TinkerCall` and `TinkerReply`.

Client to host: one request model per operation, a union discriminated on `op`. Host to
client: for each request, `Accepted` once it is checked and queued (the POST that sent it
waits for that), or `Refused` with an HTTP status; then, for an accepted one, `Done` with its
`Answer`: what the operation's `Op[...]` names, or `Failed` with Tinker's category. The SDK's
protobuf bodies travel as bytes (base64 in the line), decoded and encoded by the host alone:
the server never imports tinker.

Adding an operation is a request model here (its `Op[...]` naming its answer), a `case` in
the host's dispatch (`TinkerOps._queue`, runners/engine_host/tinker_ops.py) and a method in
the service that sends it (server/tinker_api/service.py).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Generic, Literal, TypeVar, cast

from pydantic import BaseModel, Field, TypeAdapter

from core.line import Line

# Answers ----------------------------------------------------------------------------------


class ModelReady(Line):
    """A training client exists (create_model, or a model loaded from a state checkpoint)."""

    kind: Literal["model_ready"] = "model_ready"
    base_model: str
    arch: str | None
    lora_rank: int | None
    tokenizer_id: str
    steps: int


class StateLoaded(Line):
    kind: Literal["state_loaded"] = "state_loaded"
    steps: int


class RolloutText(Line):
    """A sequence sampled or a datum trained, as its run's rollouts show it (decoded by the
    host, which has the tokenizer)."""

    prompt: str
    completion: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str | None = None
    logprob_mean: float | None = None
    advantage: float | None = None  # a datum's mean over the tokens it trained


class Trained(Line):
    """A forward_backward (or forward): the SDK's ForwardBackwardOutput protobuf, and what the
    session's step counts of it."""

    kind: Literal["trained"] = "trained"
    output: bytes
    tokens: int
    loss: float | None
    forward_only: bool
    records: list[RolloutText] = []  # its datums (forward_backward only)


class Stepped(Line):
    kind: Literal["stepped"] = "stepped"
    metrics: dict[str, float]


class Saved(Line):
    kind: Literal["saved"] = "saved"
    folder: str
    steps: int


class Joined(Line):
    """A model became a rank of its run's host group (its adapter now rank 0's)."""

    kind: Literal["joined"] = "joined"
    rank: int
    size: int


class LossReady(Line):
    kind: Literal["loss_ready"] = "loss_ready"


class SamplerReady(Line):
    """A sampler is open; `base_model` is what it samples on (a saved checkpoint names it)."""

    kind: Literal["sampler_ready"] = "sampler_ready"
    base_model: str = ""


class Sampled(Line):
    """A sample: the SDK's SampleResponse protobuf, and how many tokens it sampled."""

    kind: Literal["sampled"] = "sampled"
    output: bytes
    tokens: int
    records: list[RolloutText] = []


class HeldModel(Line):
    model: str
    size_bytes: int
    users: int


class Released(Line):
    """Models and samplers dropped; the base models the host still holds."""

    kind: Literal["released"] = "released"
    held: list[HeldModel]


class Cancelled(Line):
    """Samples of a cancel group told to stop at their next decode step."""

    kind: Literal["cancelled"] = "cancelled"
    samples: int


class Failed(Line):
    """The request failed: `user` for what its caller can fix, `server` for the rest;
    `failure`: the run failure's kind behind it, when it was one (core/failures.py: "model",
    "checkpoint", "disk_full"), so that a run records it as it would have in-process."""

    kind: Literal["failed"] = "failed"
    error: str
    category: Literal["user", "server"]
    failure: str | None = None


Answer = Annotated[
    ModelReady
    | StateLoaded
    | Trained
    | Stepped
    | Saved
    | SamplerReady
    | LossReady
    | Joined
    | Sampled
    | Released
    | Cancelled
    | Failed,
    Field(discriminator="kind"),
]
A = TypeVar("A", bound=BaseModel)


# Requests ---------------------------------------------------------------------------------


class Op(Line, Generic[A]):
    """A request whose answer (when it does not fail) is an A. `id` is the client's;
    `op`, each request's literal, discriminates Request."""

    id: int = 0
    op: str
    _answer: ClassVar[type[BaseModel]]

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        for base in cls.__mro__:
            generic = getattr(base, "__pydantic_generic_metadata__", None)
            if generic and generic["origin"] is Op and generic["args"]:
                cls._answer = generic["args"][0]
                return

    def answered_by(self, answer: BaseModel) -> A | None:
        """The answer as this request's kind of answer; None for any other kind."""
        return cast(A, answer) if isinstance(answer, self._answer) else None


class LoraSpec(Line):
    rank: int
    seed: int | None = None
    train_unembed: bool = True
    train_mlp: bool = True
    train_attn: bool = True


class CreateModel(Op[ModelReady]):
    op: Literal["create_model"] = "create_model"
    model_id: str
    base_model: str
    lora: LoraSpec
    checkpoint_dir: str  # where its checkpoints go


class LoadModel(Op[ModelReady]):
    """A new model whose first request loads a state checkpoint (with its optimizer state or
    not): create_training_client_from_state[_with_optimizer]."""

    op: Literal["load_model"] = "load_model"
    model_id: str
    folder: str
    optimizer: bool
    base_model: str | None
    checkpoint_dir: str


class LoadState(Op[StateLoaded]):
    """A state checkpoint into an existing model (the SDK's deprecated load_state)."""

    op: Literal["load_state"] = "load_state"
    model_id: str
    folder: str
    optimizer: bool


class ForwardBackward(Op[Trained]):
    op: Literal["forward_backward"] = "forward_backward"
    model_id: str
    body: bytes  # the SDK's ForwardBackwardRequest protobuf, as it came


class OptimStep(Op[Stepped]):
    op: Literal["optim_step"] = "optim_step"
    model_id: str
    params: dict[str, Any]  # the SDK's optimizer params, with their `type`


class SaveState(Op[Saved]):
    op: Literal["save_state"] = "save_state"
    model_id: str
    name: str
    overwrite: bool = False
    user_metadata: dict[str, str] | None = None


class SaveSampler(Op[Saved]):
    op: Literal["save_sampler"] = "save_sampler"
    model_id: str
    name: str
    user_metadata: dict[str, str] | None = None


class SaveExternal(Op[Saved]):
    """The adapter as a peft folder for download (save_weights_external): `<name>/external`
    in the model's checkpoint folder, replacing one of that name."""

    op: Literal["save_external"] = "save_external"
    model_id: str
    name: str


class Snapshot(Op[SamplerReady]):
    """A sampler over a model's weights as they are now (save_weights_and_get_sampling_client)."""

    op: Literal["snapshot"] = "snapshot"
    model_id: str
    sampler_id: str


class OpenSampler(Op[SamplerReady]):
    """A sampler over saved sampler weights (`folder`) or a bare base model."""

    op: Literal["open_sampler"] = "open_sampler"
    sampler_id: str
    folder: str | None = None
    base_model: str | None = None


class Sample(Op[Sampled]):
    """The SDK's sample request (its JSON body, less what names the sampler), and the ids the
    server gave its samples (`record_stability_info`: recorded under them for
    stable_reinforce)."""

    op: Literal["sample"] = "sample"
    sampler_id: str
    sequence_ids: list[str]
    record_stability_info: bool = False
    num_samples: int
    prompt: dict[str, Any]
    sampling_params: dict[str, Any]
    prompt_logprobs: bool | None = None
    topk_prompt_logprobs: int = 0
    topk_sample_logprobs: int = 0
    target_prompt_logprobs: dict[str, Any] | None = None
    prompt_alt_tokens_k: int = 0
    prompt_logprobs_last_n: int | None = None
    # A client of ours (the inference client) may bound it: sampling stops `deadline_s` after
    # the host takes it, or once its `cancel_group` is cancelled (CancelSamples), as if it ran
    # out of tokens.
    deadline_s: float | None = None
    cancel_group: str | None = None


class CancelSamples(Op[Cancelled]):
    """Stop this client's samples of a cancel group at their next decode step (its job's
    caller went away); they answer with what they sampled so far."""

    op: Literal["cancel_samples"] = "cancel_samples"
    group: str


class CreateLoss(Op[LossReady]):
    """A server-side custom loss (create_custom_loss): the SDK's traced graph, rebuilt by the
    host from its allowed operations; forward_backward(..., "custom", {"loss_id"}) runs it."""

    op: Literal["create_loss"] = "create_loss"
    loss_id: str
    name: str
    inputs: list[dict[str, Any]]
    graph: dict[str, Any]


class JoinGroup(Op[Joined]):
    """A model becomes rank `rank` of a host group of `size` (one run's models on as many
    hosts, meeting in the file `store`): its gradients are summed over the ranks before each
    optim_step. A run's engine backend sends it (runners/backends/group_training.py); the
    Tinker API has no such operation."""

    op: Literal["join_group"] = "join_group"
    model_id: str
    store: str
    rank: int
    size: int
    backend: Literal["gloo", "nccl"]
    timeout_s: float


class Release(Op[Released]):
    """A session ended: its models and samplers go, requests still queued on them never run,
    and the sequences it recorded (their ids start with `session_id`)."""

    op: Literal["release"] = "release"
    models: list[str]
    samplers: list[str]
    session_id: str = ""


Request = Annotated[
    CreateModel
    | LoadModel
    | LoadState
    | ForwardBackward
    | OptimStep
    | SaveState
    | SaveSampler
    | SaveExternal
    | Snapshot
    | OpenSampler
    | Sample
    | CancelSamples
    | CreateLoss
    | JoinGroup
    | Release,
    Field(discriminator="op"),
]


def model_of(request: Op[Any]) -> str | None:
    """The training model a request works on (a Snapshot: the one it snapshots), whose requests
    the host runs one after another; None for a request on a sampler or on neither."""
    match request:
        case (
            CreateModel()
            | LoadModel()
            | LoadState()
            | ForwardBackward()
            | OptimStep()
            | SaveState()
            | SaveSampler()
            | SaveExternal()
            | Snapshot()
            | JoinGroup()
        ):
            return request.model_id
        case _:
            return None


def sampler_of(request: Op[Any]) -> str | None:
    """The sampler a request makes (Snapshot, OpenSampler) or samples from; None for others."""
    match request:
        case Snapshot() | OpenSampler() | Sample():
            return request.sampler_id
        case _:
            return None


# The host's lines -------------------------------------------------------------------------


class Accepted(Line):
    kind: Literal["accepted"] = "accepted"
    id: int


class Refused(Line):
    """A request that could not even be queued, and the HTTP status its POST answers."""

    kind: Literal["refused"] = "refused"
    id: int | None  # None: the line was not a request at all
    status: int
    detail: str


class Done(Line):
    """A request's answer, and how long it ran: from when the host could start it (it was
    taken, and its model's earlier requests were done) to its answer, in seconds."""

    kind: Literal["done"] = "done"
    id: int
    answer: Answer
    run_s: float = 0.0


Reply = Annotated[Accepted | Refused | Done, Field(discriminator="kind")]
REQUEST: TypeAdapter[Request] = TypeAdapter(Request)
REPLY: TypeAdapter[Reply] = TypeAdapter(Reply)
