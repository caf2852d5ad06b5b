"""Discovery, selection and config through the HTTP API (foundation)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from server.app import create_app
from server.environments.catalog import COUNT_TTL_S, Catalog
from tests.support.settings import make_settings

EXTRA_ENVS = {
    "broken_syntax.py": "class Oops(BaseEnv:\n    pass\n",
    "fails_import.py": """
        '''An environment whose module raises on import.'''
        from environments.base import SingleTurnEnv
        raise RuntimeError("boom at import")

        class FailsImport(SingleTurnEnv):
            '''Never importable.'''
    """,
    "layered.py": """
        from environments.base import BaseEnv, SingleTurnEnv

        class _Hidden(SingleTurnEnv):
            pass

        class Intermediate(SingleTurnEnv):
            abstract = True

        class Leaf(Intermediate):
            '''A leaf found through an intermediate class.
            Second line is not part of the description.'''
            name = "leaf_env"

            def get_task(self, seed, split="train"):
                from environments.base import Task
                return Task(prompt="say hi", answer="hi")

            def score(self, prompt, response, task=None):
                return float("hi" in response)

        class NotAnEnv:
            pass
    """,
    # A helper module in a subfolder: never listed, whatever it holds.
    "helpers/private.py": "from environments.base import SingleTurnEnv\n"
    "class P(SingleTurnEnv): ...\n",
    "runs_code.py": "open('/tmp/rlcs-listing-must-not-run-this', 'w').write('x')\n",
}


@pytest.fixture
def extra_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "extra_envs"
    folder.mkdir()
    for name, text in EXTRA_ENVS.items():
        (folder / name).parent.mkdir(exist_ok=True)
        (folder / name).write_text(textwrap.dedent(text))
    return folder


@pytest.fixture
def xclient(tmp_path: Path, extra_dir: Path):
    with TestClient(create_app(make_settings(tmp_path, env_dirs=[extra_dir]))) as c:
        yield c


def by_name(client: TestClient) -> dict[str, dict]:
    resp = client.get("/environments")
    assert resp.status_code == 200
    return {e["name"]: e for e in resp.json()}


def test_lists_builtins_with_descriptions(client: TestClient) -> None:
    envs = by_name(client)
    assert envs["guess_number"]["class_name"] == "GuessNumberEnv"
    assert envs["guess_number"]["file_path"] == "environments/guess_number.py"
    assert envs["arithmetic"]["description"].startswith("Integer arithmetic")
    assert "base" not in envs and "BaseEnv" not in {e["class_name"] for e in envs.values()}


def test_discovery_reads_source_without_running_it(xclient: TestClient) -> None:
    marker = Path("/tmp/rlcs-listing-must-not-run-this")
    marker.unlink(missing_ok=True)
    envs = by_name(xclient)
    assert not marker.exists()
    assert envs["leaf_env"]["class_name"] == "Leaf"
    assert envs["leaf_env"]["description"] == "A leaf found through an intermediate class."
    assert "intermediate" not in envs and "_hidden" not in envs
    assert "p" not in envs and "private" not in envs
    assert envs["broken_syntax"]["importable"] is False
    assert "SyntaxError" in envs["broken_syntax"]["error"]
    # Not yet imported: unknown, not claimed importable.
    assert envs["fails_import"]["importable"] is None


def test_import_failure_is_reported_not_raised(xclient: TestClient) -> None:
    resp = xclient.post("/environments/fails_import/select")
    assert resp.status_code == 409
    body = resp.json()
    assert body["importable"] is False and "boom at import" in body["error"]
    assert "boom at import" in body["detail"]
    assert by_name(xclient)["fails_import"]["importable"] is False
    # Selecting a file with a syntax error is refused the same way.
    assert xclient.post("/environments/broken_syntax/select").status_code == 409
    assert xclient.get("/config").status_code == 400  # nothing got selected


def test_select_then_config(client: TestClient) -> None:
    resp = client.post("/environments/guess_number/select")
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["selected"] == "guess_number"
    assert body["file_path"] == "environments/guess_number.py"
    assert body["config"]["max_turns"] == 4
    config = client.get("/config").json()
    assert config["environment"] == "guess_number"
    assert "tokenizer_name" in config["locked_fields"]
    assert "tokenizer_name" not in config["configurable_fields"]
    assert config["configurable_fields"]["group_size"] == 4
    assert "max_turns" in config["schema"]["properties"]


def test_edit_persists_and_is_versioned(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    with TestClient(create_app(settings)) as c:
        c.post("/environments/arithmetic/select")
        resp = c.post("/config", json={"field": "group_size", "value": 8})
        assert resp.status_code == 200, resp.text
        assert resp.json()["configurable_fields"]["group_size"] == 8
        assert resp.json()["version"] == 1
        resp = c.post("/config", json={"field": "model_name", "value": "tiny-random"})
        assert resp.json()["locked_fields"]["tokenizer_name"] == "tiny-random"
        assert resp.json()["version"] == 2
    with TestClient(create_app(settings)) as c:  # a restart keeps selection and edits
        config = c.get("/config").json()
        assert config["environment"] == "arithmetic"
        assert config["configurable_fields"]["group_size"] == 8
        assert config["version"] == 2


def test_per_environment_config_without_selection(client: TestClient) -> None:
    resp = client.put(
        "/environments/guess_number/config", json={"values": {"max_turns": 6, "seed": 3}}
    )
    assert resp.status_code == 200, resp.text
    got = client.get("/environments/guess_number/config").json()
    assert got["configurable_fields"]["max_turns"] == 6
    assert client.get("/config").status_code == 400


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        ({"field": "no_such_field", "value": 1}, 400, "no_such_field"),
        ({"field": "tokenizer_name", "value": "x"}, 400, "locked"),
        ({"field": "group_size", "value": "eight"}, 422, "group_size"),
        ({"field": "group_size", "value": "8"}, 422, "group_size"),
        ({"field": "group_size", "value": 0}, 422, "group_size"),
        ({"field": "learning_rate", "value": -1.0}, 422, "learning_rate"),
        ({"field": "loss_fn", "value": "magic"}, 422, "loss_fn"),
        ({"field": "max_number", "value": 0}, 422, "max_number"),
        ({"field": "group_size", "value": 8, "extra": 1}, 422, "extra"),
        ({"value": 8}, 422, "field"),
    ],
)
def test_bad_edits_are_refused_and_change_nothing(
    client: TestClient, body: dict, status: int, needle: str
) -> None:
    client.post("/environments/guess_number/select")
    before = client.get("/config").json()
    resp = client.post("/config", json=body)
    assert resp.status_code == status, resp.text
    assert isinstance(resp.json()["detail"], str) and needle in resp.json()["detail"]
    assert client.get("/config").json() == before


def test_malformed_json_is_a_4xx(client: TestClient) -> None:
    client.post("/environments/guess_number/select")
    resp = client.post(
        "/config", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert resp.status_code == 422
    assert "JSON" in resp.json()["detail"]


def test_unknown_environment_suggests_close_names(client: TestClient) -> None:
    resp = client.post("/environments/guess_numbr/select")
    assert resp.status_code == 404
    assert "guess_number" in resp.json()["detail"]
    assert resp.json()["close_matches"] == ["guess_number"]


@pytest.mark.parametrize("name", ["..", "a..b", "%2E%2E", "bad name", "x;rm"])
def test_names_with_path_characters_are_refused(client: TestClient, name: str) -> None:
    resp = client.post(f"/environments/{name}/select")
    assert 400 <= resp.status_code < 500
    assert client.get("/config").status_code == 400


def test_config_before_selection_says_what_to_do(client: TestClient) -> None:
    resp = client.get("/config")
    assert resp.status_code == 400
    assert "select" in resp.json()["detail"]


def test_auth_on(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, api_token="s3cret-token")
    with TestClient(create_app(settings)) as c:
        assert c.get("/health").status_code == 200
        assert c.get("/environments").status_code == 401
        assert c.get("/environments", headers={"Authorization": "Bearer nope"}).status_code == 401
        ok = c.get("/environments", headers={"Authorization": "Bearer s3cret-token"})
        assert ok.status_code == 200
        assert "s3cret-token" not in c.get("/environments").text


def test_refuses_public_bind_without_token(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="RLCS_API_TOKEN"):
        make_settings(tmp_path, host="0.0.0.0").check_bind()
    make_settings(tmp_path, host="0.0.0.0", api_token="t").check_bind()
    make_settings(tmp_path, host="127.0.0.1").check_bind()


def test_health(client: TestClient) -> None:
    body = client.get("/health").json()
    assert body["status"] == "ok" and body["backend"] == "local"
    assert body["environments"] >= 2 and body["active_runs"] == 0


def test_health_counts_environments_without_a_scan_per_call(tmp_path: Path) -> None:
    folder = tmp_path / "envs"
    folder.mkdir()
    (folder / "leaf.py").write_text(textwrap.dedent(EXTRA_ENVS["layered.py"]))
    now = [0.0]
    catalog = Catalog([folder], tmp_path, clock=lambda: now[0])
    assert catalog.count() == 1
    (folder / "second.py").write_text(
        textwrap.dedent(EXTRA_ENVS["layered.py"]).replace("leaf_env", "second_env")
    )
    assert catalog.count() == 1  # cached: /health does not scan the folders every call
    now[0] += COUNT_TTL_S + 1
    assert catalog.count() == 2
    assert len(catalog.list()) == 2


def test_dashboard_is_served_and_holds_no_data(tmp_path: Path) -> None:
    with TestClient(create_app(make_settings(tmp_path, api_token="t0k"))) as c:
        page = c.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "/static/js/app.js" in page.text and "t0k" not in page.text
        script = c.get("/static/js/api.js")  # the page's data comes through the API
        assert script.status_code == 200 and "fetch(" in script.text and "t0k" not in script.text
