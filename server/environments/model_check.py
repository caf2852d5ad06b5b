"""Whether the backend that will run a config can serve its model, checked at the request.

Tinker: the hosted service's supported models (`RestClient.get_server_capabilities`), cached.
Local: the offline resolution rules of the local backend (no weights loaded, no torch).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from core.engine_slots import GIB, plan
from core.host_groups import group_backend
from core.model_names import model_available, weight_bytes
from core.settings import Settings
from server.errors import DomainError, InvalidValue

log = logging.getLogger(__name__)

CAPABILITIES_TTL_S = 600.0
CAPABILITIES_TIMEOUT_S = 10.0
LOCAL_TTL_S = 60.0


@dataclass(frozen=True)
class Capabilities:
    """What a backend answered about its models, or why it could not be asked."""

    models: tuple[str, ...] | None  # trainable (or sampleable, for inference) model names
    note: str | None = None  # why `models` is None


class TinkerCapabilities:
    """The hosted service's model list, fetched at most once per TTL, never for long."""

    def __init__(
        self,
        api_key: str,
        base_url: str | None,
        *,
        ttl_s: float = CAPABILITIES_TTL_S,
        timeout_s: float = CAPABILITIES_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api_key = api_key
        self._base_url = base_url
        self._ttl_s = ttl_s
        self._timeout_s = timeout_s
        self._clock = clock
        self._lock = threading.Lock()
        self._cached: tuple[float, dict[str, tuple[bool, bool]]] | None = None

    def models(self, purpose: str) -> Capabilities:
        """Names usable for `purpose` ("train" or "sample"); None with a note if unknown."""
        table, note = self._table()
        if table is None:
            return Capabilities(None, note)
        index = 0 if purpose == "train" else 1
        return Capabilities(tuple(sorted(n for n, flags in table.items() if flags[index])))

    def _table(self) -> tuple[dict[str, tuple[bool, bool]] | None, str | None]:
        with self._lock:
            if self._cached is not None and self._clock() - self._cached[0] < self._ttl_s:
                return self._cached[1], None
            try:
                table = self._fetch()
            except Exception as exc:  # the run itself reports an unusable service clearly
                text = str(exc).replace(self._api_key, "***")
                return None, f"Tinker's model list could not be read ({type(exc).__name__}: {text})"
            self._cached = (self._clock(), table)
            return table, None

    def _fetch(self) -> dict[str, tuple[bool, bool]]:
        import tinker

        rest = tinker.RestClient(base_url=self._base_url, api_key=self._api_key)
        # The SDK retries an unreachable service for minutes in its own thread: wait less.
        answer = rest.get_server_capabilities().result(timeout=self._timeout_s)
        table: dict[str, tuple[bool, bool]] = {}
        for model in answer.supported_models:
            if model.model_name:
                # Unset flags mean "yes": older services did not send them.
                table[model.model_name] = (
                    model.trainable is not False,
                    model.sampleable is not False,
                )
        return table


class ModelCheck:
    """Refuses, with a 422 listing the alternatives, a model its backend cannot serve."""

    def __init__(self, settings: Settings, tinker: TinkerCapabilities | None = None) -> None:
        self._settings = settings
        self._tinker = tinker
        self._local: dict[str, tuple[float, bool, str]] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Settings) -> ModelCheck:
        key = settings.tinker_api_key
        tinker = (
            TinkerCapabilities(key.get_secret_value(), settings.tinker_base_url)
            if key is not None
            else None
        )
        return cls(settings, tinker)

    def backend_for(self, backend: str) -> str:
        return self._settings.default_backend if backend == "auto" else backend

    def check(
        self,
        model: str,
        backend: str,
        field: str,
        purpose: str = "train",
        error: type[DomainError] = InvalidValue,
    ) -> None:
        """Raise `error` naming `field` when the backend cannot train (or sample) `model`."""
        if self.backend_for(backend) == "tinker":
            self._check_tinker(model, field, purpose, error)
        else:
            self._check_local(model, field, error)

    def check_rank(self, rank: int, backend: str) -> None:
        """422 naming `lora_rank` when the local engine would refuse it (RLCS_MAX_LORA_RANK)."""
        limit = self._settings.max_lora_rank
        if self.backend_for(backend) != "tinker" and rank > limit:
            raise InvalidValue(
                f"field 'lora_rank': {rank} is above the largest rank the local engine takes, "
                f"{limit} (RLCS_MAX_LORA_RANK). Use lora_rank <= {limit}, or raise the setting."
            )

    def check_fits(self, model: str, backend: str, engine: str) -> None:
        """422 naming `model_name` when a local run's base is larger than every engine host's
        budget (it would wait for room forever); a size or a budget not known here passes."""
        settings = self._settings
        if self.backend_for(backend) == "tinker":
            return
        if (settings.run_engine if engine == "auto" else engine) != "shared":
            return
        needed = weight_bytes(model, settings.models_dir)
        budgets = [slot.budget_bytes(settings, None) for slot in plan(settings)]
        if needed is None or any(b is None or needed <= b for b in budgets):
            return
        largest = max(b for b in budgets if b is not None)
        raise InvalidValue(
            f"field 'model_name': {model} ({needed / GIB:.2f} GiB of weights) fits no engine "
            f"host: each may hold {largest / GIB:.2f} GiB (RLCS_ENGINE_MEMORY_BUDGET_GB, split "
            "between the hosts of a device). Raise the budget, give a device fewer hosts "
            '(RLCS_ENGINE_HOSTS), train a smaller model, or set engine "private".'
        )

    def check_hosts(
        self, sample_hosts: int | str, num_devices: int, backend: str, engine: str
    ) -> None:
        """422 naming `sample_hosts` or `num_devices` when a run asks for engine hosts it
        would not have: more than this machine's, or any beyond one off the shared engine."""
        if sample_hosts == 1 and num_devices == 1:
            return
        settings = self._settings
        field = "num_devices" if num_devices > 1 else "sample_hosts"
        if self.backend_for(backend) == "tinker":
            raise InvalidValue(
                f"field '{field}': engine hosts are the local backend's; hosted Tinker places "
                f'a run itself. Leave {field} at 1, or set backend "local".'
            )
        if (settings.run_engine if engine == "auto" else engine) != "shared":
            raise InvalidValue(
                f"field '{field}': a run on a private engine holds its one model in its own "
                f'process. Leave {field} at 1, or set engine "shared".'
            )
        slots = plan(settings)
        for name, asked in (("num_devices", num_devices), ("sample_hosts", sample_hosts)):
            if isinstance(asked, int) and asked > len(slots):
                raise InvalidValue(
                    f"field '{name}': {asked} engine hosts asked for; this machine has "
                    f"{len(slots)} ({', '.join(s.device for s in slots)}). Use at most "
                    f"{len(slots)}, or give the server more hosts (RLCS_ENGINE_HOSTS)."
                )
        if num_devices > 1:
            try:
                group_backend(slots, settings.engine_group_backend)
            except ValueError as exc:
                raise InvalidValue(f"field 'num_devices': {exc}.") from None

    def _check_tinker(self, model: str, field: str, purpose: str, error: type[DomainError]) -> None:
        if self._tinker is None:
            return  # no key: the run refuses at once with that reason
        found = self._tinker.models(purpose)
        if found.models is None:
            log.warning("model %s not checked: %s", model, found.note)
            return
        if model not in found.models:
            verb = "train" if purpose == "train" else "sample from"
            raise error(
                f"field '{field}': the tinker backend cannot {verb} {model!r}. Models it "
                f"serves: {', '.join(found.models)}. Set {field} to one of them, or use "
                'backend "local".',
                supported_models=list(found.models),
            )

    def _check_local(self, model: str, field: str, error: type[DomainError]) -> None:
        ok, why = self._local_answer(model)
        if not ok:
            raise error(f"field '{field}': the local backend cannot load it: {why}.")

    def _local_answer(self, model: str) -> tuple[bool, str]:
        now = time.monotonic()
        with self._lock:
            hit = self._local.get(model)
            if hit is not None and now - hit[0] < LOCAL_TTL_S:
                return hit[1], hit[2]
        # A hub id that is neither cached nor answered by the hub in a short probe is refused.
        ok, why = model_available(model, self._settings.models_dir, check_hub=True)
        with self._lock:
            self._local[model] = (now, ok, why)
        return ok, why
