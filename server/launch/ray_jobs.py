"""Ray's job server as the supervisor needs it: submit a run as a job, read its state, stop
it, read its logs, and say why a pending job waits. The `ray` package is imported on first
use, so a server on the local launcher never loads it."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from core.settings import Settings

if TYPE_CHECKING:
    from ray.job_submission import JobSubmissionClient

log = logging.getLogger(__name__)

REACHABLE_CACHE_S = 2.0
FINAL_STATES = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})


class RayUnreachable(Exception):
    """The job server did not answer (or is not a Ray job server)."""


@dataclass(frozen=True)
class JobState:
    status: str  # PENDING, RUNNING, STOPPED, SUCCEEDED or FAILED
    message: str
    exit_code: int | None


@dataclass(frozen=True)
class Resources:
    num_cpus: float
    num_gpus: float


class RayJobs:
    def __init__(self, settings: Settings) -> None:
        self.address = settings.ray_address.rstrip("/")
        self._timeout = settings.ray_timeout_s
        self._client: JobSubmissionClient | None = None
        self._lock = threading.Lock()
        self.last_error: str | None = None  # why the last call failed, for /health
        self._reachable_at: tuple[float, bool] | None = None

    # Jobs ----------------------------------------------------------------------------------

    def submit(
        self,
        job_id: str,
        entrypoint: str,
        env_vars: dict[str, str],
        resources: Resources,
        metadata: dict[str, str],
    ) -> None:
        """Submit once: a job with this id that exists already counts as submitted."""
        client = self._connected()
        try:
            self._call(
                client.submit_job,
                entrypoint=entrypoint,
                submission_id=job_id,
                runtime_env={"env_vars": env_vars},
                entrypoint_num_cpus=resources.num_cpus,
                entrypoint_num_gpus=resources.num_gpus,
                metadata=metadata,
            )
        except RuntimeError as exc:
            if "already exists" not in str(exc):
                raise
            log.info("Ray job %s exists already (an earlier submit): not submitted again", job_id)

    def state(self, job_id: str) -> JobState | None:
        """The job's state, or None when Ray has no such job."""
        client = self._connected()
        try:
            info = self._call(client.get_job_info, job_id)
        except RuntimeError as exc:
            if "status code 404" in str(exc):
                return None
            raise
        return JobState(str(info.status.value), info.message or "", info.driver_exit_code)

    def stop(self, job_id: str) -> None:
        client = self._connected()
        try:
            self._call(client.stop_job, job_id)
        except RuntimeError as exc:
            if "status code 404" not in str(exc):
                raise

    def logs(self, job_id: str) -> str:
        return str(self._call(self._connected().get_job_logs, job_id))

    # The cluster ---------------------------------------------------------------------------

    def capacity(self) -> dict[str, tuple[float, float]]:
        """Each resource's (used, total) over the cluster, e.g. {"GPU": (0.0, 0.0)}; {} when
        the dashboard does not say."""
        client = self._connected()
        response = self._call(client._do_request, "GET", "/api/cluster_status")
        try:
            report = response.json()["data"]["clusterStatus"]["loadMetricsReport"]
            usage = report["usage"]
            return {name: (float(pair[0]), float(pair[1])) for name, pair in usage.items()}
        except (ValueError, KeyError, TypeError, IndexError):
            return {}

    def reachable(self) -> bool:
        """Does the job server answer now? Asked at most every REACHABLE_CACHE_S."""
        now = time.monotonic()
        if self._reachable_at is not None and now - self._reachable_at[0] < REACHABLE_CACHE_S:
            return self._reachable_at[1]
        try:
            self._call(self._connected()._do_request, "GET", "/api/version")
            answer = True
        except RayUnreachable:
            answer = False
        self._reachable_at = (now, answer)
        return answer

    # Plumbing ------------------------------------------------------------------------------

    def _connected(self) -> JobSubmissionClient:
        with self._lock:
            if self._client is None:
                self._client = self._connect()
            return self._client

    def _connect(self) -> JobSubmissionClient:
        try:
            from ray.job_submission import JobSubmissionClient
        except ImportError:
            self.last_error = "the ray package is not installed (pip install '.[ray]')"
            raise RayUnreachable(self.last_error) from None
        timeout = self._timeout

        class _BoundedClient(JobSubmissionClient):
            # The SDK forwards extra keywords to requests: each call gets a deadline, so a
            # hung job server cannot hold the supervisor's tick.
            def _do_request(self, method: str, endpoint: str, **kwargs: Any) -> Any:
                kwargs.setdefault("timeout", timeout)
                return super()._do_request(method, endpoint, **kwargs)

        try:
            client = _BoundedClient(self.address)
        except Exception as exc:  # ConnectionError, a 404 version check, a bad address
            self.last_error = f"cannot reach the Ray job server at {self.address}: {exc}"
            raise RayUnreachable(self.last_error) from None
        self.last_error = None
        return client

    def _call(self, method: Any, *args: Any, **kwargs: Any) -> Any:
        import requests

        started = time.monotonic()
        try:
            result = method(*args, **kwargs)
        except (requests.ConnectionError, requests.Timeout, ConnectionError) as exc:
            with self._lock:
                self._client = None  # connect again (and check the version) next time
            self.last_error = (
                f"the Ray job server at {self.address} did not answer "
                f"({type(exc).__name__} after {time.monotonic() - started:.1f} s)"
            )
            raise RayUnreachable(self.last_error) from None
        self.last_error = None
        return result
