"""A run's metrics read from W&B by its recorded path: cached, time-bounded, backed off.

W&B is only asked from one background thread per run; a caller waits at most `wait_s` and
otherwise gets the cached value or a plain-words note (DESIGN §9). `wandb` is imported lazily.
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from core.settings import Settings

DEFAULT_BASE_URL = "https://api.wandb.ai"
BACKOFF_START_S = 5.0
BACKOFF_MAX_S = 300.0
RETRY_AFTER_MAX_S = 3600.0  # a Retry-After beyond this is treated as a mistake
DEFAULT_SAMPLES = 500
_UNUSED_ENTITY = "rlcs-default-entity"

# Cache items: the run (summary, state, url), or one history series ("history", keys, samples).
_SUMMARY: tuple[Any, ...] = ("summary",)

# Failures after which W&B is left alone for a while; "rate_limited" pauses every run.
_TRANSIENT = frozenset({"rate_limited", "server", "timeout", "unreachable", "auth"})

_HTTP_STATUS_RE = re.compile(r"\bHTTP (\d{3})\b")
_RETRY_AFTER_RE = re.compile(r"retry[- ]after\D{0,3}(\d+(?:\.\d+)?)", re.IGNORECASE)
_UNREACHABLE_HINTS = ("connection refused", "no such host", "dial tcp", "connection reset")

# wandb.Settings are process-wide; setting them and building a client happen under this lock.
_WANDB_SETUP_LOCK = threading.Lock()


@dataclass(frozen=True)
class WandbResult:
    """What W&B said about a run, or why it could not be used (`ok` False, `note` says why)."""

    ok: bool
    source: str = "none"  # "wandb" when the values come from W&B (possibly cached)
    summary: dict[str, Any] | None = None  # the run's summary metrics, `_step` included
    history: list[dict[str, Any]] | None = None  # rows, from `history()` only
    state: str | None = None  # W&B's run state: running, finished, crashed, failed...
    url: str | None = None
    note: str | None = None
    age_s: float | None = None  # how old the values are (0 for a fresh answer)


@dataclass
class _Failure:
    kind: str  # rate_limited | server | timeout | unreachable | auth | not_found | error
    text: str  # plain words, without the "next try" part
    retry_after_s: float | None = None

    @property
    def transient(self) -> bool:
        return self.kind in _TRANSIENT


def _finished_event() -> threading.Event:
    event = threading.Event()
    event.set()
    return event


@dataclass
class _Entry:
    value: Any = None  # {"summary", "state", "url"} or a list of history rows
    fetched_at: float | None = None  # monotonic time of the last successful fetch
    checked_at: float | None = None  # monotonic time of the last finished attempt
    failure: _Failure | None = None  # the last attempt's failure; None after a success
    attempts: int = 0  # finished attempts: tells a waiter whether its own fetch has ended
    done: threading.Event = field(default_factory=_finished_event)  # set: nothing pending


@dataclass
class _RunState:
    path: str
    entries: dict[tuple[Any, ...], _Entry] = field(default_factory=dict)
    pending: list[tuple[Any, ...]] = field(default_factory=list)
    worker: threading.Thread | None = None
    backoff_s: float = 0.0
    backoff_until: float = 0.0
    backoff_failure: _Failure | None = None


class _DeadlinePassed(TimeoutError):
    pass


class WandbReader:
    """Reads runs from W&B for the API server; one instance per app, safe across threads."""

    def __init__(
        self,
        api_key: str | None,
        base_url: str | None,
        cache_s: float,
        timeout_s: float,
        wait_s: float = 1.0,
        *,
        backoff_start_s: float = BACKOFF_START_S,
        backoff_max_s: float = BACKOFF_MAX_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api_key = api_key or None
        self._base_url = (base_url or DEFAULT_BASE_URL).rstrip("/")
        self._cache_s = max(0.0, cache_s)
        self._timeout_s = max(0.1, timeout_s)
        self._wait_s = max(0.0, wait_s)
        self._backoff_start_s = backoff_start_s
        self._backoff_max_s = backoff_max_s
        # Ages, cache windows and backoffs run on this clock (tests pass their own); the
        # bound on a W&B call is real time, as wandb's own timeout is.
        self._clock = clock
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)  # notified when a fetch thread ends
        self._runs: dict[str, _RunState] = {}
        self._wandb_runs: dict[str, Any] = {}  # path -> wandb Run object, reloaded on refresh
        self._api: Any = None
        self._client_lock = threading.Lock()
        self._global_backoff_s = 0.0
        self._global_until = 0.0
        self._global_failure: _Failure | None = None
        self._closed = False

    @classmethod
    def from_settings(cls, settings: Settings, wait_s: float = 1.0) -> WandbReader:
        key = settings.wandb_api_key
        return cls(
            api_key=key.get_secret_value() if key is not None else None,
            base_url=settings.wandb_base_url,
            cache_s=settings.wandb_cache_s,
            timeout_s=settings.wandb_timeout_s,
            wait_s=wait_s,
        )

    def __repr__(self) -> str:  # never the key
        key = "set" if self._api_key else "unset"
        return f"WandbReader(base_url={self._base_url!r}, api_key={key})"

    @property
    def configured(self) -> bool:
        return self._api_key is not None

    def warm_up(self) -> threading.Thread | None:
        """Import wandb, start wandb-core and log in from a background thread (about 1-2 s
        cold), so the first read needn't spend its `wait_s` on that. Failures are left to the
        first read to report. Returns the thread, for whoever wants to wait on it."""
        if self._api_key is None or self._closed:
            return None
        thread = threading.Thread(target=self._warm, name="wandb-warm-up", daemon=True)
        thread.start()
        return thread

    def _warm(self) -> None:
        try:
            self._client()
        except Exception:
            pass  # the first read tries again and says why in its note

    def close(self) -> None:
        """No new fetches; threads in flight finish their current call and exit."""
        with self._lock:
            self._closed = True

    def wait_idle(self, timeout_s: float) -> bool:
        """Block until no fetch is in flight (True), or `timeout_s` passed (False)."""
        with self._idle:
            return self._idle.wait_for(
                lambda: all(state.worker is None for state in self._runs.values()), timeout_s
            )

    # Public reads ------------------------------------------------------------------------

    def read(self, run_key: str, wandb_path: str) -> WandbResult:
        """The run's summary metrics, state and URL, by its recorded entity/project/run_id."""
        return self._get(run_key, wandb_path, _SUMMARY)

    def history(
        self,
        run_key: str,
        wandb_path: str,
        keys: list[str] | None = None,
        samples: int = DEFAULT_SAMPLES,
    ) -> WandbResult:
        """Sampled history rows (W&B returns the rows holding every key asked for)."""
        item = ("history", tuple(keys) if keys else None, max(1, int(samples)))
        return self._get(run_key, wandb_path, item)

    # The guard: cache, backoff, one fetch per run, bounded wait --------------------------

    def _get(self, run_key: str, wandb_path: str, item: tuple[Any, ...]) -> WandbResult:
        refusal = self._refusal(wandb_path)
        if refusal is not None:
            return WandbResult(ok=False, note=refusal)
        path = wandb_path.strip()
        with self._lock:
            state = self._state_for(run_key, path)
            entry = state.entries.setdefault(item, _Entry())
            now = self._clock()
            if entry.fetched_at is not None and now - entry.fetched_at < self._cache_s:
                return self._answer(entry, item, now)
            blocked = self._blocked(state, now)
            if blocked is not None:
                return self._answer(entry, item, now, self._retry_note(*blocked, now))
            recent_failure = entry.checked_at is not None and now - entry.checked_at < self._cache_s
            if entry.failure is not None and recent_failure:
                # A fresh "run not found" is as good as a cached value: don't ask again yet.
                return self._answer(entry, item, now, entry.failure.text)
            if item in state.pending and entry.fetched_at is not None:
                # Someone already waits on this fetch; later callers get the last values now
                # rather than each holding a worker thread for `wait_s`.
                return self._answer(entry, item, now, "W&B is refreshing these values")
            if item not in state.pending:
                state.pending.append(item)
                entry.done = threading.Event()
                self._ensure_worker(run_key, state)
            done = entry.done
            attempts_before = entry.attempts
        done.wait(self._wait_s)
        with self._lock:
            now = self._clock()
            answered = entry.attempts > attempts_before
            if answered and entry.failure is None:
                return self._answer(entry, item, now)
            failed_now = answered and entry.failure is not None
            blocked = self._blocked(state, now)
            if blocked is not None:
                return self._answer(entry, item, now, self._retry_note(*blocked, now))
            if failed_now and entry.failure is not None:
                return self._answer(entry, item, now, entry.failure.text)
            return self._answer(
                entry,
                item,
                now,
                f"W&B did not answer within {self._wait_s:g} s (still fetching in the background)",
            )

    def _refusal(self, wandb_path: str) -> str | None:
        if self._api_key is None:
            return "no WANDB_API_KEY set, so W&B is not read"
        if self._closed:
            return "the W&B reader is shut down"
        parts = (wandb_path or "").strip().split("/")
        if len(parts) != 3 or not all(part.strip() for part in parts):
            return f"W&B path {wandb_path!r} is not entity/project/run_id"
        return None

    def _state_for(self, run_key: str, path: str) -> _RunState:
        state = self._runs.get(run_key)
        if state is None or state.path != path:
            # A new path means another W&B run: nothing cached for the old one applies.
            state = _RunState(path=path)
            self._runs[run_key] = state
        return state

    def _blocked(self, state: _RunState, now: float) -> tuple[_Failure, float] | None:
        if self._global_failure is not None and now < self._global_until:
            return self._global_failure, self._global_until
        if state.backoff_failure is not None and now < state.backoff_until:
            return state.backoff_failure, state.backoff_until
        return None

    @staticmethod
    def _retry_note(failure: _Failure, until: float, now: float) -> str:
        return f"{failure.text} — retrying after {math.ceil(until - now)} s"

    @staticmethod
    def _answer(
        entry: _Entry, item: tuple[Any, ...], now: float, note: str | None = None
    ) -> WandbResult:
        if entry.value is None or entry.fetched_at is None:
            return WandbResult(ok=False, note=note or "no value from W&B yet")
        age = now - entry.fetched_at
        if note is not None:
            note = f"{note}; showing W&B values from {age:.0f} s ago"
        if item == _SUMMARY:
            value = entry.value
            return WandbResult(
                ok=True,
                source="wandb",
                summary=dict(value["summary"]),
                state=value["state"],
                url=value["url"],
                note=note,
                age_s=round(age, 3),
            )
        return WandbResult(
            ok=True,
            source="wandb",
            history=[dict(row) for row in entry.value],
            note=note,
            age_s=round(age, 3),
        )

    # The background fetch -----------------------------------------------------------------

    def _ensure_worker(self, run_key: str, state: _RunState) -> None:
        if state.worker is not None:
            return  # the run's one thread picks the new item up before it exits
        worker = threading.Thread(
            target=self._work, args=(state,), name=f"wandb-read-{run_key}", daemon=True
        )
        state.worker = worker
        worker.start()

    def _work(self, state: _RunState) -> None:
        while True:
            with self._lock:
                blocked = self._blocked(state, self._clock())
                if not state.pending or blocked is not None or self._closed:
                    # Items left behind a backoff are dropped; their callers get the note.
                    for item in state.pending:
                        state.entries[item].done.set()
                    state.pending.clear()
                    state.worker = None
                    self._idle.notify_all()
                    return
                item = state.pending[0]
                path = state.path
            value: Any = None
            failure: _Failure | None = None
            try:
                value = self._fetch(path, item, time.monotonic() + self._timeout_s)
            except Exception as exc:  # every failure becomes a note, never a crash
                failure = self._classify(exc, path)
            with self._lock:
                now = self._clock()
                entry = state.entries[item]
                entry.checked_at = now
                entry.attempts += 1
                if failure is None:
                    entry.value, entry.fetched_at, entry.failure = value, now, None
                    state.backoff_s, state.backoff_until, state.backoff_failure = 0.0, 0.0, None
                    self._global_backoff_s = 0.0  # W&B answered: the next 429 starts over
                else:
                    entry.failure = failure
                    if failure.transient:
                        self._back_off(state, failure, now)
                state.pending.remove(item)
                entry.done.set()

    def _back_off(self, state: _RunState, failure: _Failure, now: float) -> None:
        if failure.kind == "rate_limited":
            # A 429 is about our key, not this run: every run waits.
            self._global_backoff_s = self._next_backoff(self._global_backoff_s, failure)
            self._global_until = now + self._global_backoff_s
            self._global_failure = failure
        else:
            state.backoff_s = self._next_backoff(state.backoff_s, failure)
            state.backoff_until = now + state.backoff_s
            state.backoff_failure = failure

    def _next_backoff(self, previous: float, failure: _Failure) -> float:
        step = self._backoff_start_s if previous <= 0 else previous * 2
        step = min(step, self._backoff_max_s)
        if failure.retry_after_s:
            step = max(step, min(failure.retry_after_s, RETRY_AFTER_MAX_S))
        return step

    def _fetch(self, path: str, item: tuple[Any, ...], deadline: float) -> Any:
        """One item from W&B; no call starts past `deadline` (= start + timeout_s).

        wandb waits `timeout_s` for each call, then cancels it inside wandb-core (measured: no
        attempt reaches W&B after that). A fetch is one call, plus the login on a reader's first
        fetch and a Run load before a run's first history, so a fetch thread ends within
        timeout_s (within 2-3 x timeout_s in those two cases); it never lingers in retries.
        """
        api = self._client()
        self._check(deadline)
        if item == _SUMMARY:
            run = self._wandb_run(api, path, deadline, refresh=True)
            return {"summary": dict(run.summary_metrics), "state": run.state, "url": run.url}
        _, keys, samples = item
        run = self._wandb_run(api, path, deadline, refresh=False)
        self._check(deadline)
        rows = run.history(samples=samples, keys=list(keys) if keys else None, pandas=False)
        return [dict(row) for row in rows]

    def _wandb_run(self, api: Any, path: str, deadline: float, refresh: bool) -> Any:
        with self._lock:
            known = self._wandb_runs.get(path)
        if known is None:
            # wandb.Api.run loads the run (one Run query) and keeps the object in its own cache,
            # so later refreshes go through Run.load(force=True) on the object we hold.
            run = api.run(path)
            with self._lock:
                self._wandb_runs[path] = run
            return run
        if refresh:
            self._check(deadline)
            known.load(force=True)
        return known

    def _check(self, deadline: float) -> None:
        # Never start another W&B call past the fetch's deadline.
        if time.monotonic() >= deadline:
            raise _DeadlinePassed("deadline passed")

    def _client(self) -> Any:
        with self._client_lock:
            if self._api is None:
                with _WANDB_SETUP_LOCK:
                    import wandb

                    _bound_wandb_retries(wandb, self._timeout_s)
                    self._api = wandb.Api(
                        # Any default entity spares the GetDefaultEntity round-trip wandb makes
                        # to parse a path; it is never used, as every path names its entity.
                        overrides={"base_url": self._base_url, "entity": _UNUSED_ENTITY},
                        api_key=self._api_key,
                        # wandb waits this long per call, then cancels the call in wandb-core
                        # (annotated int, used as a float number of seconds).
                        timeout=self._timeout_s,  # type: ignore[arg-type]
                    )
            return self._api

    # Errors in plain words ---------------------------------------------------------------

    def _classify(self, exc: BaseException, path: str) -> _Failure:
        chain = _chain(exc)
        status: int | None = None
        for error in chain:
            # WandbApiFailedError carries wandb-core's ApiErrorResponse (http_status 0: unknown).
            http_status = getattr(getattr(error, "response", None), "http_status", 0) or 0
            if http_status:
                status = int(http_status)
                break
        texts = [str(error) for error in chain]
        text = self._scrub(" | ".join(t for t in texts if t))
        if status is None and (match := _HTTP_STATUS_RE.search(text)):
            status = int(match.group(1))
        retry_after = None
        if match := _RETRY_AFTER_RE.search(text):
            retry_after = float(match.group(1))
        names = {type(error).__name__ for error in chain}
        if isinstance(exc, _DeadlinePassed) or "did not respond in time" in text:
            return _Failure("timeout", f"W&B timed out after {self._timeout_s:g} s")
        if "RunNotFoundError" in names or "Could not find run" in text:
            return _Failure("not_found", f"W&B has no run {path} (run not found)")
        if status == 429:
            return _Failure("rate_limited", "W&B rate-limited (429)", retry_after)
        if status is not None and status >= 500:
            return _Failure("server", f"W&B error {status}", retry_after)
        if status in (401, 403):
            return _Failure("auth", f"W&B rejected the API key (HTTP {status})")
        if any(hint in text.lower() for hint in _UNREACHABLE_HINTS):
            return _Failure("unreachable", f"W&B unreachable at {self._base_url}")
        first_line = text.splitlines()[0] if text else type(exc).__name__
        if status is not None:
            return _Failure("error", f"W&B error {status}: {first_line[:200]}")
        return _Failure("error", f"W&B error: {first_line[:200]}")

    def _scrub(self, text: str) -> str:
        # wandb's messages don't carry the key, but a note must never be the place it leaks.
        if self._api_key:
            text = text.replace(self._api_key, "***")
        return text


def _chain(exc: BaseException) -> list[BaseException]:
    """The exception and what it wraps: wandb's CommError keeps the cause in `.exc`."""
    out: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in out:
        out.append(current)
        nested = getattr(current, "exc", None)
        current = nested if isinstance(nested, BaseException) else current.__cause__
    return out


def _bound_wandb_retries(wandb: Any, timeout_s: float) -> None:
    """Cap the retries wandb-core makes for GraphQL before it reports an error.

    wandb 0.31 sends wandb.Api's GraphQL through wandb-core, which by default retries 429, 5xx
    and connection errors 20 times (waits 2 s doubling to 60 s, honouring Retry-After): many
    minutes, during which the error (and its status) never reaches us. One retry after 1 s is
    the least it accepts (0 means "default"). The settings are process-wide; the server process
    makes no W&B runs, so only this reader depends on them. Whole seconds: wandb-core truncates.
    """
    wandb.setup(
        settings=wandb.Settings(
            x_graphql_retry_max=1,
            x_graphql_retry_wait_min_seconds=1,
            x_graphql_retry_wait_max_seconds=1,
            x_graphql_timeout_seconds=max(1, math.ceil(timeout_s)),
        )
    )
