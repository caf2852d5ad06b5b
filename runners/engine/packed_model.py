"""The sampler's own forward for Llama-shaped decoders (llama, qwen2, qwen3): the weights
packed so that a decode step is a few large operations per layer instead of transformers'
many small ones, with the LoRA adapter exact and unmerged.

Per layer, linear layers that read the same input are one weight: q, k and v stacked, and
gate and up; under each (and under o, down and the unembedding) sit the adapter's A rows, so
one product gives the base output and the adapter's `x A^T` together. The adapters' B
products of a group are one more product (a block-diagonal B, the LoRA scale folded in),
added to the base output in the same call (`addmm`). Rotary is one batched product per layer
(each position's rotation as a [head_dim, head_dim] matrix; three elementwise operations on
the CPU), the KV write one indexed copy each for keys and values into the slot cache,
attention one SDPA call with the query heads grouped under their key/value head. Without an
adapter the A and B parts are skipped.

Loading an adapter copies its A and B into those rows and blocks (no new tensors, so captured
CUDA graphs stay valid); nothing is merged into the base weights, so updates smaller than a
bf16 step of a weight still reach the sampler.

On a CPU with native bf16 products (the bf16 copy), every base product goes through oneDNN
with its weight packed once in oneDNN's own layout (`_OneDnn`: a plain weight is re-laid out
at each call), the residual added inside; the adapter stays apart, in float32 where its update
is small (two `mm`s a group at a decode step's few rows: a third of a tiny oneDNN call's time,
and exact) and in bf16 beyond `EXACT_ADAPTER_OUTPUTS` (prefills, wide batches, the
unembedding). Below `WIDE_ROWS` rows the whole decode step runs on one thread; from there its
many small operations stay on one and the base products and attention widen to all
(`_Threads`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from runners.engine.host import AdapterWeights, ModelHost
from runners.engine.slot_batch import SlotCache, supports

_PEFT_PREFIX = "base_model.model."
_ARCHITECTURES = ("llama", "qwen2", "qwen3")
_STATIC_ROPE = ("default", "linear", "llama3", "yarn")  # inverse frequencies fixed at load
# From this many rows a CPU decode step widens to every thread for its base products and
# attention; below it the whole step runs on one (measured on SmolLM2, 2 cores, median of 15
# to 30 interleaved rounds: at 3 rows 28.7 ms a step against 33.8 widened, at 8 rows 39.2
# against 46.6, at 16 rows 52.9 against 49.0: waking the second thread for each product costs
# more than it brings until the rows fill it).
WIDE_ROWS = 16
# Up to this many outputs (rows x a group's outputs) the adapter's products run in float32
# (exact; a third of a tiny bf16 product's time); beyond, in the sampling dtype, where a
# float32 update of every output costs more than it saves (SmolLM2 on one thread: gate/up's
# 3,072 outputs at 3 rows 35 us against 61, at 64 rows 298 against 90; the head's 49,152 at
# 3 rows 336 against 365, at 16 rows 5.4 ms against 0.4).
EXACT_ADAPTER_OUTPUTS = 32768


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
class _Spot:
    """Where one LoRA layer's A and B live in a packed group (views), and its scales."""

    a: torch.Tensor  # [rank, in] rows of the group's weight
    b_t: torch.Tensor  # [rank, out] block of the group's B^T
    a_name: str  # the trainer's parameter names, as AdapterWeights keys them
    b_name: str
    scale: float  # LoRA's alpha / rank, folded into B
    columns: torch.Tensor | None  # the RMSNorm weight before the layer, folded into A


class _Group:
    """Linear layers reading the same input, packed: their base rows, then their A rows."""

    def __init__(
        self,
        layers: list[nn.Linear],
        adapters: list[object | None],
        names: dict[int, str],
        dtype: torch.dtype,
        spots: list[_Spot],
        columns: torch.Tensor | None = None,
        adapter_apart: bool = False,
    ) -> None:
        """`columns`: the weight of the RMSNorm that feeds the group, folded into its input
        columns (W diag(w) x = W (w * x): the norm's multiply disappears from the step).
        `adapter_apart`: A and B in float32 beside the base weight, not stacked under it
        (oneDNN's route: a tiny product there costs three times a float32 `mm`)."""
        base = torch.cat([layer.weight.detach() for layer in layers]).float()
        if columns is not None:
            columns = columns.detach().float()
            base = base * columns
        base = base.to(dtype)
        self.out = base.shape[0]
        rank = max((int(a.r["default"]) for a in adapters if a is not None), default=0)  # type: ignore[attr-defined]
        self.rank = rank * len(layers) if rank else 0
        adapter_dtype = torch.float32 if adapter_apart else dtype
        if adapter_apart:
            self.weight = base
            self.a = base.new_zeros(self.rank, base.shape[1], dtype=adapter_dtype)
        else:
            self.weight = base.new_zeros(self.out + self.rank, base.shape[1])
            self.weight[: self.out] = base
            self.a = self.weight[self.out :]
        self.base = self.weight[: self.out]
        self.apart = adapter_apart
        biases = [layer.bias for layer in layers]
        self.bias: torch.Tensor | None = None
        self.base_bias: torch.Tensor | None = None
        if any(b is not None for b in biases):
            bias = base.new_zeros(len(self.weight))
            at = 0
            for layer in layers:
                if layer.bias is not None:
                    bias[at : at + layer.out_features] = layer.bias.detach().to(dtype)
                at += layer.out_features
            self.bias, self.base_bias = bias, bias[: self.out]
        # B^T of every adapter of the group, block-diagonal: [all A rows, all base outputs].
        self.b_t = base.new_zeros(self.rank, self.out, dtype=adapter_dtype) if self.rank else None
        at = 0
        for i, (layer, adapter) in enumerate(zip(layers, adapters, strict=True)):
            if adapter is not None and self.b_t is not None:
                spots.append(
                    _Spot(
                        a=self.a[i * rank : (i + 1) * rank],
                        b_t=self.b_t[i * rank : (i + 1) * rank, at : at + layer.out_features],
                        a_name=names[id(adapter.lora_A["default"].weight)],  # type: ignore[attr-defined]
                        b_name=names[id(adapter.lora_B["default"].weight)],  # type: ignore[attr-defined]
                        scale=float(adapter.scaling["default"]),  # type: ignore[attr-defined]
                        columns=columns,
                    )
                )
            at += layer.out_features

        self._onednn: _OneDnn | None = None

    def nbytes(self, adapted: bool) -> int:
        """Bytes a product of the group reads (its adapter's too when `adapted`)."""
        if not adapted or self.b_t is None:
            return self.base.nbytes
        if self.apart:
            return self.base.nbytes + self.a.nbytes + self.b_t.nbytes
        return self.weight.nbytes + self.b_t.nbytes

    def use_onednn(self, threads: _Threads) -> None:
        """Products through oneDNN with the base weight packed once in its own layout (the
        CPU): a plain weight is re-laid out on every call, which reads it three times."""
        assert self.apart, "oneDNN's route keeps the adapter apart"
        self._onednn = _OneDnn(self, threads)

    def loaded(self) -> None:
        """A load wrote the adapter's A and B (oneDNN's route copies them once more)."""
        if self._onednn is not None:
            self._onednn.loaded()

    def __call__(self, x: torch.Tensor, adapted: bool) -> torch.Tensor:
        """The group's outputs [tokens, out], the adapters' updates added when `adapted`."""
        adapted = adapted and self.b_t is not None
        if self._onednn is not None:
            return self._onednn(x, None, adapted)
        if not adapted or self.b_t is None:
            return F.linear(x, self.base, self.base_bias)
        y = F.linear(x, self.weight, self.bias)
        return torch.addmm(y[:, : self.out], y[:, self.out :], self.b_t)

    def add_to(self, residual: torch.Tensor, x: torch.Tensor, adapted: bool) -> torch.Tensor:
        """`residual` plus the group's outputs (o and down: the residual add in the product)."""
        adapted = adapted and self.b_t is not None
        if self._onednn is not None:
            return self._onednn(x, residual, adapted)
        if not adapted and self.base_bias is None:
            return torch.addmm(residual, x, self.base.t())
        if not adapted or self.b_t is None:
            return residual + F.linear(x, self.base, self.base_bias)
        y = F.linear(x, self.weight, self.bias)
        return (residual + y[:, : self.out]).addmm_(y[:, self.out :], self.b_t)


class _Threads:
    """A CPU decode step's intra-op threads: one for its many small operations (waking a
    second thread costs them more than it saves), all for the large products and attention
    from `WIDE_ROWS` rows (below, one for the whole step). torch's setting belongs to the
    calling thread (OpenMP's and MKL's), so the sampler's narrowing leaves the trainer's alone."""

    def __init__(self, wide: int) -> None:
        self.wide = wide
        self.narrowed = False
        self.products = 1  # threads for this step's products and attention (1: none widen)

    def narrow(self, rows: int) -> None:
        """The start of a decode step of `rows` rows."""
        if self.wide > 1:
            torch.set_num_threads(1)
            self.narrowed = True
            self.products = self.wide if rows >= WIDE_ROWS else 1

    def widen(self) -> None:
        if self.products > 1:
            torch.set_num_threads(self.products)

    def narrow_again(self) -> None:
        if self.products > 1:
            torch.set_num_threads(1)

    def end(self) -> None:
        """Back to all threads (the step is over, or failed)."""
        if self.narrowed:
            torch.set_num_threads(self.wide)
            self.narrowed, self.products = False, 1


def _onednn_pack(weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), None)


class _OneDnn:
    """A group's products through oneDNN's packed weight: the base packed once, a residual
    added inside its product. The adapter (the scale folded into B) runs apart: in float32
    on the group's own A and B up to `EXACT_ADAPTER_OUTPUTS` outputs, beyond in the sampling
    dtype on copies made at each load, its update added to the output in one rounding."""

    def __init__(self, group: _Group, threads: _Threads) -> None:
        self.threads = threads
        self.bias = group.base_bias
        self.base = _onednn_pack(group.base)
        self.dtype = group.base.dtype
        self.a_t = group.a.t()  # views: a load's copies into A and B are seen here
        self.b_t = group.b_t
        self.loaded()

    def loaded(self) -> None:
        """The sampling-dtype copies of A and B, after a load wrote the float32 ones (copies
        in a float32 copy of the model too: one route in every dtype)."""
        if self.b_t is not None:
            self.low_a_t = self.a_t.to(self.dtype, copy=True)
            self.low_b_t = self.b_t.to(self.dtype, copy=True)

    def __call__(
        self, x: torch.Tensor, residual: torch.Tensor | None, adapted: bool
    ) -> torch.Tensor:
        linear = torch.ops.mkldnn._linear_pointwise
        self.threads.widen()
        if residual is None:
            y = linear(x, self.base, self.bias, "none", [], "")
        else:
            y = linear.binary(x, residual, self.base, self.bias, "add")
        self.threads.narrow_again()
        if adapted and self.b_t is not None:
            if y.numel() <= EXACT_ADAPTER_OUTPUTS:
                y.add_(torch.mm(torch.mm(x.float(), self.a_t), self.b_t))
            else:
                y.addmm_(torch.mm(x, self.low_a_t), self.low_b_t)
        return y


@dataclass
class _Layer:
    """One decoder layer; its two RMSNorms' weights are folded into qkv and gate_up."""

    qkv: _Group
    q_norm: torch.Tensor | None  # per-head RMSNorm of queries and keys (qwen3)
    k_norm: torch.Tensor | None
    o: _Group
    gate_up: _Group
    down: _Group


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


def uses_onednn(device: torch.device, dtype: torch.dtype) -> bool:
    """oneDNN's packed products on a CPU that multiplies bf16 natively, for a bf16 copy."""
    if device.type != "cpu" or dtype != torch.bfloat16 or not torch.backends.mkldnn.is_available():
        return False
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def _rotate_half_matrix(dim: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """P with x @ P = rotate_half(x) = cat(-x[dim/2:], x[:dim/2])."""
    half = dim // 2
    p = torch.zeros(dim, dim, dtype=dtype, device=device)
    index = torch.arange(half, device=device)
    p[index + half, index] = -1
    p[index, index + half] = 1
    return p


class PackedModel:
    """A host's model packed for sampling; `load(adapter)` puts an adapter (or none) in place.
    A slot model (`slot_batch.SlotModel`) that may attend to fewer columns than its cache."""

    trims = True

    def __init__(self, host: ModelHost, dtype: torch.dtype, onednn: bool | None = None) -> None:
        """`onednn`: products through oneDNN's packed weights (None: where `uses_onednn`)."""
        reason = packable(host)
        if reason is not None:
            raise ValueError(f"this model cannot be packed: {reason}")
        model = host.model.get_base_model() if host.is_lora else host.model
        config = model.config
        self.config = config
        self.dtype = dtype
        self.device = host.device
        self.spots: list[_Spot] = []
        self.onednn = uses_onednn(self.device, dtype) if onednn is None else onednn
        lora = _lora_layers(host)
        names = {id(p): n for n, p in host.params.items()}

        def base(name: str) -> nn.Linear:
            module = model.get_submodule(name)
            layer = module.get_base_layer() if hasattr(module, "get_base_layer") else module
            assert isinstance(layer, nn.Linear)
            return layer

        def group(*members: str, columns: torch.Tensor | None = None) -> _Group:
            layers = [base(n) for n in members]
            adapters = [lora.get(n) for n in members]
            return _Group(layers, adapters, names, dtype, self.spots, columns, self.onednn)

        decoder = model.get_decoder()
        prefix = _module_name(model, decoder)
        self.layers: list[_Layer] = []
        with torch.no_grad():
            for i, layer in enumerate(decoder.layers):
                at = f"{prefix}layers.{i}"
                attn = layer.self_attn
                self.layers.append(
                    _Layer(
                        qkv=group(
                            *(f"{at}.self_attn.{p}_proj" for p in "qkv"),
                            columns=layer.input_layernorm.weight,
                        ),
                        q_norm=_norm_weight(getattr(attn, "q_norm", None), dtype),
                        k_norm=_norm_weight(getattr(attn, "k_norm", None), dtype),
                        o=group(f"{at}.self_attn.o_proj"),
                        gate_up=group(
                            f"{at}.mlp.gate_proj",
                            f"{at}.mlp.up_proj",
                            columns=layer.post_attention_layernorm.weight,
                        ),
                        down=group(f"{at}.mlp.down_proj"),
                    )
                )
            head_name = _module_name(model, model.get_output_embeddings()).rstrip(".")
            self.head = group(head_name)
            embedding = model.get_input_embeddings().weight
            tied = embedding.data_ptr() == base(head_name).weight.data_ptr()
            # Tied: the unembedding's base rows are the embedding (one copy of the table).
            self.embedding = self.head.base if tied else embedding.detach().to(dtype)
            self.norm_out = decoder.norm.weight.detach().to(dtype)
        first = decoder.layers[0].self_attn
        self.eps = float(decoder.norm.variance_epsilon)
        self._eps = torch.tensor(self.eps, dtype=torch.float32, device=self.device)
        self.scaling = float(first.scaling)
        self.head_dim = int(first.head_dim)
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(getattr(config, "num_key_value_heads", None) or self.heads)
        self.hidden = int(config.hidden_size)
        self._rotary = decoder.rotary_emb
        self._rotate_half = _rotate_half_matrix(self.head_dim, dtype, self.device)
        self._cos = self._sin = torch.zeros(0, self.head_dim, dtype=dtype, device=self.device)
        # Rotary as one batched product per layer on CUDA (one kernel); on the CPU as three
        # elementwise operations, which are as quick and, small, never wait on a second
        # thread (a matrix product does, for milliseconds, on a loaded CPU).
        self.matrix_rotary = self.device.type == "cuda"
        self.adapted = False
        self._loaded: AdapterWeights | None | bool = False  # False: nothing loaded yet
        self._threads = _Threads(torch.get_num_threads() if self.onednn else 1)
        if self.onednn:
            for g in self._groups():
                g.use_onednn(self._threads)

    def _groups(self) -> list[_Group]:
        groups = [g for x in self.layers for g in (x.qkv, x.o, x.gate_up, x.down)]
        return [*groups, self.head]

    # ----- the adapter ------------------------------------------------------------------

    def load(self, adapter: AdapterWeights | None) -> None:
        """Copy `adapter`'s A and B (B scaled) into their rows and blocks; None: base only."""
        if adapter is self._loaded:
            return
        if adapter is not None:
            with torch.no_grad():
                for spot in self.spots:
                    a = adapter.tensors[spot.a_name]
                    spot.a.copy_(a if spot.columns is None else a.float() * spot.columns)
                    spot.b_t.copy_(adapter.tensors[spot.b_name].t() * spot.scale)
                for g in self._groups():
                    g.loaded()
        self.adapted = adapter is not None and bool(self.spots)
        self._loaded = adapter

    @property
    def variant(self) -> bool:
        """What a captured step depends on beyond its tensors: whether the adapter runs."""
        return self.adapted

    def nbytes(self) -> int:
        """Bytes of the weights one decode step reads (base, and the adapter when loaded)."""
        groups = sum(g.nbytes(self.adapted) for g in self._groups())
        return self.norm_out.nbytes + groups

    # ----- the slot cache -----------------------------------------------------------------

    def allocate(self, cache: SlotCache, rows: int) -> None:
        """Keys and values for `rows` slots of `cache`, and rotations up to its length."""
        cache.allocate_for(
            len(self.layers), self.kv_heads, self.head_dim, self.dtype, self.device, rows
        )
        if self._cos.shape[0] < cache.length:
            positions = torch.arange(cache.length, device=self.device)[None]
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
    ) -> torch.Tensor:
        """Right-padded prompts [rows, width]: their keys and values into `slots` (columns
        0..width-1), and the logits [rows, vocab] at each row's `last` position. Causal
        attention keeps the padding (after each prompt) out of every real position, so `mask`
        is not needed; the padding's cache columns are written over before they are read."""
        rows, width = ids.shape
        positions = torch.arange(width, device=ids.device).repeat(rows)
        rotations = self._rotations(positions)

        def attend(index: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            q = q.view(rows, width, self.heads, self.head_dim).transpose(1, 2)
            k = k.reshape(rows, width, self.kv_heads, self.head_dim).transpose(1, 2)
            v = v.reshape(rows, width, self.kv_heads, self.head_dim).transpose(1, 2)
            cache.keys[index][:, :, :width].index_copy_(0, slots, k)
            cache.values[index][:, :, :width].index_copy_(0, slots, v)
            out = F.scaled_dot_product_attention(
                q, k, v, is_causal=True, scale=self.scaling, enable_gqa=self.heads != self.kv_heads
            )
            return out.transpose(1, 2).reshape(rows * width, self.heads * self.head_dim)

        hidden = self._layers(F.embedding(ids.reshape(-1), self.embedding), rotations, attend)
        picked = hidden.view(rows, width, -1)[torch.arange(rows, device=ids.device), last]
        return self._logits(picked)

    def decode(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
        cache: SlotCache,
    ) -> torch.Tensor:
        """One token per row (`tokens`, `positions`: [rows, 1]; rows = cache.rows) attending
        to the columns `mask` [rows, columns] allows; logits [rows, vocab]."""
        rows, columns = mask.shape
        column = positions[:, 0].clamp(max=cache.length - 1)
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

        rotations = self._rotations(column)
        threads = self._threads
        threads.narrow(rows)
        try:
            hidden = self._layers(F.embedding(tokens[:, 0], self.embedding), rotations, attend)
            return self._logits(hidden)
        finally:
            threads.end()

    def _layers(self, h: torch.Tensor, rotations: tuple[torch.Tensor, ...], attend) -> torch.Tensor:
        """The decoder layers on hidden states [tokens, hidden]; `attend(layer, q, k, v)`
        stores keys and values and returns the attention output [tokens, heads * head_dim]."""
        adapted = self.adapted
        eps, eps_tensor, dim = self.eps, self._eps, self.head_dim
        q_width = self.heads * dim
        kv_width = self.kv_heads * dim
        for index, layer in enumerate(self.layers):
            qkv = layer.qkv(_normalize(h, eps, eps_tensor), adapted)
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
            h = layer.o.add_to(h, out, adapted)
            gate_up = layer.gate_up(_normalize(h, eps, eps_tensor), adapted)
            half = gate_up.shape[1] // 2
            h = layer.down.add_to(h, F.silu(gate_up[:, :half]) * gate_up[:, half:], adapted)
        return h

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        # The final norm's weight stays a multiply: a tied unembedding is also the embedding.
        normed = _normalize(hidden, self.eps, self._eps)
        return self.head(normed * self.norm_out, self.adapted)


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


def _lora_layers(host: ModelHost) -> dict[str, object]:
    """peft's LoRA layers by their name in the base model."""
    if not host.is_lora:
        return {}
    from peft.tuners.lora import LoraLayer

    return {
        name.removeprefix(_PEFT_PREFIX): layer
        for name, layer in host.model.named_modules()
        if isinstance(layer, LoraLayer) and "default" in layer.lora_A
    }
