"""The sampler's own forward for Llama-shaped decoders (llama, qwen2, qwen3): the weights
packed so that a decode step is a few large operations per layer instead of transformers'
many small ones, with K LoRA adapters exact and unmerged beside one copy of the base.

Per layer, linear layers that read the same input are one product group (`packed_group.py`):
q, k and v stacked, and gate and up; o, down and the unembedding alone. Each group holds the
sampler's adapter slots beside its base weight, and each row of a step gets the update of its
own slot (-1: none, the base model alone), so rows of different adapters, and of the base
model, decode in one step. Rotary is one batched product per layer (each position's rotation
as a [head_dim, head_dim] matrix; three elementwise operations on the CPU), the KV write one
indexed copy each for keys and values into the slot cache, attention one SDPA call with the
query heads grouped under their key/value head.

Loading an adapter copies its A and B into a slot (no new tensors unless the slots must grow,
for a larger rank or a slot not yet allocated, which `layout` counts, so captured CUDA graphs
stay valid; slots are allocated as loads reach them, up to `slots`, and given back as the
adapter table closes them, `shrink`); nothing is
merged into the base weights, so updates smaller than a bf16 step of a weight still reach the
sampler. On a CPU with native bf16 products, the base products go through oneDNN on weights
packed once, and a decode step's threads follow `cpu_products.Threads`. Which route each
product takes is decided outside, by `product_routes.routes_for`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from runners.engine.host import AdapterWeights, ModelHost
from runners.engine.sample import lora_rows
from runners.engine.sample.cpu_products import Threads
from runners.engine.sample.packed_group import PackedGroup
from runners.engine.sample.product_routes import Routes, routes_for
from runners.engine.sample.row_adapters import RowAdapters, group_rows
from runners.engine.sample.slot_cache import AdapterIndex, SlotCache, supports

# A layer's attention: (layer, q, k, v) -> its output; and what keeps a layer's keys and values.
Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
Store = Callable[[int, torch.Tensor, torch.Tensor], None]
_ARCHITECTURES = ("llama", "qwen2", "qwen3")
_STATIC_ROPE = ("default", "linear", "llama3", "yarn")  # inverse frequencies fixed at load


def packable(host: ModelHost) -> str | None:
    """Why the host's model cannot be packed (None: it can)."""
    model = host.model.get_base_model() if host.is_lora else host.model
    config = model.config
    if getattr(config, "model_type", None) not in _ARCHITECTURES:
        return f"architecture {getattr(config, 'model_type', None)!r}"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"activation {config.hidden_act!r}"
    if getattr(config, "use_sliding_window", False):
        return "sliding-window attention"
    if not supports(model):
        return "not every layer is full attention with a plain unembedding"
    rope = (getattr(config, "rope_parameters", None) or {}).get("rope_type", "default")
    if rope not in _STATIC_ROPE:
        return f"rope type {rope!r}"
    if host.is_lora:
        from peft.tuners.lora import LoraLayer

        for module in host.model.modules():
            if isinstance(module, LoraLayer) and module.use_dora.get("default", False):
                return "DoRA adapters"
    return None


@dataclass
class _Layer:
    """One decoder layer; its two RMSNorms' weights are folded into qkv and gate_up."""

    qkv: PackedGroup
    q_norm: torch.Tensor | None  # per-head RMSNorm of queries and keys (qwen3)
    k_norm: torch.Tensor | None
    o: PackedGroup
    gate_up: PackedGroup
    down: PackedGroup


def _normalize(x: torch.Tensor, eps: float, eps_tensor: torch.Tensor) -> torch.Tensor:
    """RMSNorm without its weight, the mean square in float32 (as transformers computes it):
    one fused kernel on CUDA; on the CPU, where F.rms_norm is about ten operations (a float32
    copy of `x` among them), a norm, one tiny fused step and a product (`eps_tensor`: `eps`
    as a float32 scalar tensor, so that no Python number is wrapped per call)."""
    if x.is_cuda:
        return F.rms_norm(x, (x.shape[-1],), None, eps)
    norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True, dtype=torch.float32)
    scale = torch.addcmul(eps_tensor, norm, norm, value=1.0 / x.shape[-1]).rsqrt_()
    return (x * scale).to(x.dtype)


def _rotate_half_matrix(dim: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """P with x @ P = rotate_half(x) = cat(-x[dim/2:], x[:dim/2])."""
    half = dim // 2
    p = torch.zeros(dim, dim, dtype=dtype, device=device)
    index = torch.arange(half, device=device)
    p[index + half, index] = -1
    p[index, index + half] = 1
    return p


class PackedModel:
    """A host's base model packed for sampling, with `slots` adapter slots (`load(slot, adapter)`);
    a slot model (`slot_cache.SlotModel`) that may attend to fewer columns than its cache. Any
    host on the same base builds the same model: only the base layers are read."""

    trims = True

    def __init__(
        self,
        host: ModelHost,
        dtype: torch.dtype,
        routes: Routes | None = None,
        *,
        slots: int | None = None,
        masked: bool | None = None,
        onednn: bool | None = None,
        kernel: bool | None = None,
    ) -> None:
        """`routes`: the products' routes (product_routes.py); None: `routes_for` the host's
        device with `masked`, `onednn` and `kernel` (None: the host's `cpu_adapter_kernel`) as
        its choices, which only it takes. `slots`: adapters held at once (None: the host's
        `adapter_slots`)."""
        reason = packable(host)
        if reason is not None:
            raise ValueError(f"this model cannot be packed: {reason}")
        routes = _chosen_routes(host, dtype, routes, masked=masked, onednn=onednn, kernel=kernel)
        model = host.model.get_base_model() if host.is_lora else host.model
        self.config = model.config
        self.dtype = dtype
        self.device = host.device
        self.slots = max(1, host.adapter_slots if slots is None else slots)  # the most at once
        self.max_rank = host.max_lora_rank
        self.masked = routes.masked
        self.onednn = routes.onednn
        self.slot_ranks = [0] * self.slots  # the rank loaded in each slot (0: none)
        self.layout = 0  # counts reallocations of the slots' tensors (captured graphs go)
        decoder = model.get_decoder()
        prefix = _module_name(model, decoder)
        with torch.no_grad():
            self.layers = [
                self._pack_layer(model, f"{prefix}layers.{i}", layer)
                for i, layer in enumerate(decoder.layers)
            ]
            self._pack_head(host, model, decoder)
        self._layer_names = {name for g in self._groups() for name in g.names}
        self._read_geometry(decoder)
        self._route_products(routes)

    def _group(
        self, model: nn.Module, *members: str, columns: torch.Tensor | None = None
    ) -> PackedGroup:
        """One product group of `model`'s base linear layers `members` (`columns`: a norm's
        weight folded into its input columns)."""
        layers = [_base_linear(model, name) for name in members]
        return PackedGroup(
            layers, list(members), self.dtype, 0, masked=self.masked, columns=columns
        )

    def _pack_layer(self, model: Any, at: str, layer: Any) -> _Layer:
        """Decoder layer `at` of `model` as its four product groups and its q/k norms."""
        attn = layer.self_attn
        return _Layer(
            qkv=self._group(
                model,
                *(f"{at}.self_attn.{p}_proj" for p in "qkv"),
                columns=layer.input_layernorm.weight,
            ),
            q_norm=_norm_weight(getattr(attn, "q_norm", None), self.dtype),
            k_norm=_norm_weight(getattr(attn, "k_norm", None), self.dtype),
            o=self._group(model, f"{at}.self_attn.o_proj"),
            gate_up=self._group(
                model,
                f"{at}.mlp.gate_proj",
                f"{at}.mlp.up_proj",
                columns=layer.post_attention_layernorm.weight,
            ),
            down=self._group(model, f"{at}.mlp.down_proj"),
        )

    def _pack_head(self, host: ModelHost, model: Any, decoder: Any) -> None:
        """The unembedding's group, the embedding (unless tied to it) and the final norm."""
        head_name = _module_name(model, model.get_output_embeddings()).rstrip(".")
        head_dtype = _head_dtype(host, self.dtype)
        head = _base_linear(model, head_name)
        self.head = PackedGroup([head], [head_name], head_dtype, 0, masked=self.masked)
        embedding = model.get_input_embeddings().weight
        # Tied: the unembedding's base rows are the embedding (one copy of the table, where
        # both keep the sampler's dtype).
        self.tied = embedding.data_ptr() == head.weight.data_ptr() and head_dtype == self.dtype
        self._embedding = None if self.tied else embedding.detach().to(self.dtype)
        self.norm_out = decoder.norm.weight.detach().to(self.dtype)

    def _read_geometry(self, decoder: Any) -> None:
        """Heads, widths, the norms' epsilon and the rotary module, from the first layer."""
        config, first = self.config, decoder.layers[0].self_attn
        self.eps = float(decoder.norm.variance_epsilon)
        self._eps = torch.tensor(self.eps, dtype=torch.float32, device=self.device)
        self.scaling = float(first.scaling)
        self.head_dim = int(first.head_dim)
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(getattr(config, "num_key_value_heads", None) or self.heads)
        self.hidden = int(config.hidden_size)
        self._rotary = decoder.rotary_emb
        self._rotate_half = _rotate_half_matrix(self.head_dim, self.dtype, self.device)
        self._cos = self._sin = torch.zeros(0, self.head_dim, dtype=self.dtype, device=self.device)
        # Rotary as one batched product per layer on CUDA (one kernel); on the CPU as three
        # elementwise operations, which are as quick and, small, never wait on a second
        # thread (a matrix product does, for milliseconds, on a loaded CPU).
        self.matrix_rotary = self.device.type == "cuda"

    def _route_products(self, routes: Routes) -> None:
        """The groups in the sampler's dtype (a float32 head apart) onto oneDNN and the fused
        kernel as `routes` say; a decode step's threads follow oneDNN's."""
        self._threads = Threads(torch.get_num_threads() if self.onednn else 1)
        same_dtype = [g for g in self._groups() if g.dtype == self.dtype]
        if self.onednn:
            for g in same_dtype:
                g.use_onednn(self._threads, keep_plain=g is self.head and self.tied)
        self.kernel = lora_rows.kernel() if routes.kernel else None
        if self.kernel is not None:
            for g in same_dtype:
                g.use_kernel(self.kernel, self._threads)

    def _groups(self) -> list[PackedGroup]:
        groups = [g for x in self.layers for g in (x.qkv, x.o, x.gate_up, x.down)]
        return [*groups, self.head]

    @property
    def allocated(self) -> int:
        """Slots the product groups hold now (grown as loads reach them, up to `slots`)."""
        return self.head.slots

    @property
    def embedding(self) -> torch.Tensor:
        if self._embedding is not None:
            return self._embedding
        assert self.head.base is not None, "a tied unembedding keeps its plain rows"
        return self.head.base

    # ----- the adapter slots --------------------------------------------------------------

    def check(self, adapter: AdapterWeights) -> None:
        """Raise ValueError, naming what does not fit, if `adapter` cannot load here."""
        if adapter.rank > self.max_rank:
            raise ValueError(
                f"lora_rank {adapter.rank} is above the sampler's largest, {self.max_rank} "
                "(RLCS_MAX_LORA_RANK): train with a lower rank or raise the setting"
            )
        unknown = sorted(set(adapter.layers()) - self._layer_names)
        if unknown:
            raise ValueError(
                f"the adapter has layers this model lacks ({', '.join(unknown[:3])}): it was "
                "trained on another base model"
            )

    def load(self, slot: int, adapter: AdapterWeights | None) -> None:
        """Copy `adapter`'s A and B (B scaled) into slot `slot`; None: the slot emptied."""
        if not 0 <= slot < self.slots:
            raise ValueError(f"slot {slot} is not one of this model's {self.slots}")
        layers: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        scale = 0.0
        if adapter is not None:
            self.check(adapter)
            layers, scale = adapter.layers(), adapter.scale
        with torch.no_grad():
            rank = adapter.rank if adapter is not None else 0
            allocated = self.allocated
            if slot >= allocated:  # doubling: few reallocations (each recaptures graphs)
                allocated = min(self.slots, max(slot + 1, 2 * allocated))
            grown = [g.reserve(allocated, rank) for g in self._groups()]
            if any(grown):
                self.layout += 1  # new tensors: graphs captured on the old ones must go
            for g in self._groups():
                g.load(slot, layers, scale)
        self.slot_ranks[slot] = adapter.rank if adapter is not None and layers else 0

    def shrink(self, slots: int) -> None:
        """Keep the first `slots` slots allocated (the adapter table closed the others)."""
        with torch.no_grad():
            shrunk = [g.shrink(slots) for g in self._groups()]
        if any(shrunk):
            self.layout += 1  # new tensors: graphs captured on the old ones must go
        for slot in range(slots, self.slots):
            self.slot_ranks[slot] = 0

    def rows(self, adapters: AdapterIndex) -> RowAdapters:
        """A pass's rows and their slots, as the product groups read them."""
        adapted = adapters.adapted and any(self.slot_ranks)
        groups = None
        if adapted and not self.masked:
            assert adapters.values is not None, "the CPU route groups rows in an eager step"
            groups = group_rows(adapters.values, self.slot_ranks, self.device)
        return RowAdapters(adapters.tensor, adapted, groups, self.allocated)

    def nbytes(self, adapted: bool = True) -> int:
        """Bytes of the weights one decode step reads (base, and the slots' adapters)."""
        groups = sum(g.nbytes(adapted) for g in self._groups())
        return self.norm_out.nbytes + groups

    # ----- the slot cache -----------------------------------------------------------------

    def allocate(self, cache: SlotCache, rows: int) -> None:
        """Keys and values for `rows` slots of `cache`, and rotations up to its length."""
        cache.allocate_for(
            len(self.layers), self.kv_heads, self.head_dim, self.dtype, self.device, rows
        )
        self._rotary_table(cache.length)

    def _rotary_table(self, length: int) -> None:
        """cos and sin of every position below `length` (graphs captured on a shorter table
        keep it: the positions they read are the same)."""
        if self._cos.shape[0] < length:
            positions = torch.arange(length, device=self.device)[None]
            probe = torch.zeros(1, dtype=self.dtype, device=self.device)
            cos, sin = self._rotary(probe, positions)
            self._cos, self._sin = cos[0].contiguous(), sin[0].contiguous()

    def _rotations(self, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Rotary at `positions` (cos and sin of HF's rotary module, in the sampling dtype):
        each position's rotation as a [head_dim, head_dim] matrix R (x @ R), or its cos and
        its sin signed for `roll` ([tokens, 1, head_dim] each)."""
        cos, sin = self._cos[positions], self._sin[positions]
        if self.matrix_rotary:
            return (torch.diag_embed(cos).addcmul_(self._rotate_half[None], sin[:, None, :]),)
        half = self.head_dim // 2
        signed = torch.cat([-sin[:, :half], sin[:, half:]], dim=-1)
        return cos[:, None, :], signed[:, None, :]

    def _rotate(self, qk: torch.Tensor, rotations: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """Queries and keys [tokens, heads, head_dim] rotated: rotate_half(x) * sin is
        roll(x, head_dim / 2) times the sin signed (-sin on the first half)."""
        if len(rotations) == 1:
            return torch.bmm(qk, rotations[0])
        cos, signed = rotations
        return torch.addcmul(qk * cos, qk.roll(self.head_dim // 2, dims=-1), signed)

    # ----- the forward passes -----------------------------------------------------------

    def prefill(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        last: torch.Tensor,
        cache: SlotCache,
        slots: torch.Tensor,
        adapters: AdapterIndex,
    ) -> torch.Tensor:
        """Right-padded prompts [rows, width] (row r on adapter slot `adapters[r]`): their keys
        and values into `slots` (columns 0..width-1), and the logits [rows, vocab] at each
        row's `last` position. Causal attention keeps the padding (after each prompt) out of
        every real position, so `mask` is not needed; the padding's cache columns are written
        over before they are read."""
        rows, width = ids.shape
        positions = torch.arange(width, device=ids.device).repeat(rows)

        def store(index: int, k: torch.Tensor, v: torch.Tensor) -> None:
            cache.keys[index][:, :, :width].index_copy_(0, slots, k)
            cache.values[index][:, :, :width].index_copy_(0, slots, v)

        tokens = self.rows(adapters.repeated(width))
        hidden = self._layers(
            F.embedding(ids.reshape(-1), self.embedding),
            self._rotations(positions),
            self._causal(rows, width, store),
            tokens,
        )
        picked = hidden.view(rows, width, -1)[torch.arange(rows, device=ids.device), last]
        return self._logits(picked, self.rows(adapters))

    def score(self, ids: list[int], slot: int) -> torch.Tensor:
        """The logits [len(ids), vocab] at every position of one sequence on adapter slot
        `slot` (-1: the base model): what a request asks of its prompt (prompt logprobs,
        top-k, targets) from the sampler's own weights, no cache written."""
        width = len(ids)
        self._rotary_table(width)
        rows = self.rows(AdapterIndex.of([slot] * width, self.device))
        hidden = self._layers(
            F.embedding(torch.tensor(ids, device=self.device), self.embedding),
            self._rotations(torch.arange(width, device=self.device)),
            self._causal(1, width, None),
            rows,
        )
        return self._logits(hidden, rows)

    def _causal(self, rows: int, width: int, store: Store | None) -> Attend:
        """Attention over whole sequences ([rows, width] tokens, causal), handing each layer's
        keys and values [rows, kv heads, width, head_dim] to `store(layer, k, v)` first."""

        def attend(index: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            q = q.view(rows, width, self.heads, self.head_dim).transpose(1, 2)
            k = k.reshape(rows, width, self.kv_heads, self.head_dim).transpose(1, 2)
            v = v.reshape(rows, width, self.kv_heads, self.head_dim).transpose(1, 2)
            if store is not None:
                store(index, k, v)
            out = F.scaled_dot_product_attention(
                q, k, v, is_causal=True, scale=self.scaling, enable_gqa=self.heads != self.kv_heads
            )
            return out.transpose(1, 2).reshape(rows * width, self.heads * self.head_dim)

        return attend

    def decode(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
        cache: SlotCache,
        adapters: AdapterIndex,
    ) -> torch.Tensor:
        """One token per row (`tokens`, `positions`: [rows, 1]; rows = cache.rows; row r on
        adapter slot `adapters[r]`) attending to the columns `mask` [rows, columns] allows;
        logits [rows, vocab]."""
        column = positions[:, 0].clamp(max=cache.length - 1)
        threads = self._threads
        attend = self._cached(cache, mask, column, threads)
        rotations = self._rotations(column)
        threads.narrow(len(mask))
        try:
            adapted = self.rows(adapters)
            hidden = self._layers(
                F.embedding(tokens[:, 0], self.embedding), rotations, attend, adapted
            )
            return self._logits(hidden, adapted)
        finally:
            threads.end()

    def _cached(
        self, cache: SlotCache, mask: torch.Tensor, column: torch.Tensor, threads: Threads
    ) -> Attend:
        """Attention of one token per row, written at its `column` of the cache, over the
        columns `mask` [rows, columns] allows (the products widened to `threads`)."""
        rows, columns = mask.shape
        row = torch.arange(rows, device=mask.device)
        bias = torch.zeros(mask.shape, dtype=self.dtype, device=mask.device)
        bias = bias.masked_fill_(~mask, -torch.inf).view(rows, 1, 1, columns)
        groups = self.heads // self.kv_heads

        def attend(index: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            keys, values = cache.keys[index], cache.values[index]
            # Each row's key and value at its own column (an index_put: a scatter is 5-20x
            # slower on the CPU in bf16).
            keys[row, :, column] = k
            values[row, :, column] = v.view(rows, self.kv_heads, self.head_dim)
            threads.widen()
            out = F.scaled_dot_product_attention(
                q.view(rows, self.kv_heads, groups, self.head_dim),
                keys[:rows, :, :columns],
                values[:rows, :, :columns],
                attn_mask=bias,
                scale=self.scaling,
            )
            threads.narrow_again()
            return out.reshape(rows, self.heads * self.head_dim)

        return attend

    def _layers(
        self,
        h: torch.Tensor,
        rotations: tuple[torch.Tensor, ...],
        attend: Attend,
        rows: RowAdapters,
    ) -> torch.Tensor:
        """The decoder layers on hidden states [tokens, hidden]; `attend(layer, q, k, v)`
        stores keys and values and returns the attention output [tokens, heads * head_dim]."""
        eps, eps_tensor, dim = self.eps, self._eps, self.head_dim
        q_width = self.heads * dim
        kv_width = self.kv_heads * dim
        for index, layer in enumerate(self.layers):
            qkv = layer.qkv(_normalize(h, eps, eps_tensor), rows)
            qk = qkv[:, : q_width + kv_width].view(len(h), -1, dim)
            if layer.q_norm is not None and layer.k_norm is not None:
                q = F.rms_norm(qk[:, : self.heads], (dim,), layer.q_norm, eps)
                k = F.rms_norm(qk[:, self.heads :], (dim,), layer.k_norm, eps)
                qk = torch.cat([q, k], dim=1)
            qk = self._rotate(qk, rotations)
            out = attend(
                index,
                qk[:, : self.heads],
                qk[:, self.heads :],
                qkv[:, q_width + kv_width :],
            )
            h = layer.o.add_to(h, out, rows)
            gate_up = layer.gate_up(_normalize(h, eps, eps_tensor), rows)
            half = gate_up.shape[1] // 2
            h = layer.down.add_to(h, F.silu(gate_up[:, :half]) * gate_up[:, half:], rows)
        return h

    def _logits(self, hidden: torch.Tensor, rows: RowAdapters) -> torch.Tensor:
        # The final norm's weight stays a multiply: a tied unembedding is also the embedding.
        normed = _normalize(hidden, self.eps, self._eps)
        return self.head((normed * self.norm_out).to(self.head.dtype), rows)


def _chosen_routes(
    host: ModelHost,
    dtype: torch.dtype,
    routes: Routes | None,
    *,
    masked: bool | None,
    onednn: bool | None,
    kernel: bool | None,
) -> Routes:
    """`routes` as given, or made from the choices a caller may name instead (`kernel` None:
    the host's `cpu_adapter_kernel`)."""
    if routes is None:
        wanted = host.cpu_adapter_kernel if kernel is None else kernel
        return routes_for(host.device, dtype, kernel=wanted, masked=masked, onednn=onednn)
    if (masked, onednn, kernel) != (None, None, None):
        raise ValueError("give the routes or the choices that make them, not both")
    return routes


def _head_dtype(host: ModelHost, dtype: torch.dtype) -> torch.dtype:
    """The unembedding's dtype (its base and its adapter): with `cast_lm_head_to_fp32`, float32
    where the trainer computes its logits in float32 (a float32 model: a bf16 sampler's logits
    rounded to 8 bits are most of the gap between them); a bf16 trainer under CUDA autocast
    computes them in bf16, as the sampler does."""
    trained = host.model.get_output_embeddings().weight.dtype
    return torch.float32 if host.cast_lm_head_to_fp32 and trained == torch.float32 else dtype


def _base_linear(model: nn.Module, name: str) -> nn.Linear:
    """The base layer of `model`'s linear layer `name` (under its LoRA wrapper, if any)."""
    module: Any = model.get_submodule(name)
    layer = module.get_base_layer() if hasattr(module, "get_base_layer") else module
    assert isinstance(layer, nn.Linear)
    return layer


def _norm_weight(norm: nn.Module | None, dtype: torch.dtype) -> torch.Tensor | None:
    if norm is None:
        return None
    weight = norm.weight
    assert isinstance(weight, torch.Tensor)
    return weight.detach().to(dtype)


def _module_name(model: nn.Module, module: nn.Module) -> str:
    """`module`'s name in `model` with a trailing dot ("" for the model itself)."""
    for name, candidate in model.named_modules():
        if candidate is module:
            return f"{name}." if name else ""
    raise ValueError("module not found in its model")
