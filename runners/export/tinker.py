"""Export a Tinker run's checkpoint: Tinker writes it in Hugging Face format
(save_weights_external), then each file is downloaded from the signed URL it gives."""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any

from runners.export.model_card import model_card

_CHUNK = 1 << 20


def export_external(
    state_path: str, name: str, out: Path, card: dict[str, Any], timeout_s: float
) -> tuple[str, str]:
    """Load the state checkpoint `state_path` into a training client, save it as external
    weights called `name`, download every file into `out`; (base model, external path)."""
    import httpx
    import tinker

    service = tinker.ServiceClient()
    try:
        training = service.create_training_client_from_state(state_path).result(timeout=timeout_s)
        base_model = training.get_info().model_data.model_name or "unknown"
        saved = training.save_weights_external(name).result(timeout=timeout_s)
        urls = tinker.RestClient().get_external_weights_urls(saved.path).result(timeout=timeout_s)
        with httpx.Client(timeout=timeout_s, follow_redirects=True) as http:
            for relative, url in sorted(urls.urls.items()):
                _download(http, url, out / _safe_relative(relative))
    finally:
        service.close("success").result(timeout=timeout_s)
    if not (out / "README.md").exists():
        (out / "README.md").write_text(model_card(card, base_model, merged=False))
    return base_model, saved.path


def _safe_relative(relative: str) -> Path:
    """A file name from the service stays inside the export folder."""
    parts = PurePosixPath(relative).parts
    if not parts or PurePosixPath(relative).is_absolute() or ".." in parts or "\\" in relative:
        raise ValueError(f"Tinker named an export file {relative!r}, which is not a plain path")
    return Path(*parts)


def _download(http: Any, url: str, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with http.stream("GET", url) as response:
        response.raise_for_status()
        with target.open("wb") as fh:
            for chunk in response.iter_bytes(_CHUNK):
                fh.write(chunk)
