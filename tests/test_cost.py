"""Cost per run (issue 36): money from a run's totals at the prices in force, hosted Tinker's price
table, the price settings and their refusals, the meter's clocks, and a Tinker API session's cost
read from what its steps record."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from core import lifecycle
from core.cost import TINKER_HOSTED, Spent
from core.db import make_engine, write_session
from core.models import API_SOURCE, TINKER_API, Run, RunStatus
from core.settings import Settings
from runners.train.cost_meter import CostMeter
from server.app import create_app
from server.runs.pricing import SHIPPED_TABLE, PriceTableError, Pricing, TinkerPrices
from tests.support.settings import make_settings

TABLE = """
currency = "USD"
as_of = 2026-10-07
source = "https://example.test/prices"

[models."Qwen/Qwen3-8B"]
prefill = 0.2
sample = 0.6
train = 0.4
"""


def totals(**values: Any) -> SimpleNamespace:
    """A run's cost columns, as a Run or a list's row has them."""
    columns = ("device", "device_s", "cpu_s", "tokens_prefill", "tokens_sampled", "tokens_trained")
    return SimpleNamespace(**{f"cost_{c}": values.get(c) for c in columns})


def pricing(tmp_path: Path, **prices: Any) -> Pricing:
    table = tmp_path / "prices.toml"
    table.write_text(TABLE)
    return Pricing.from_settings(make_settings(tmp_path, tinker_prices=table, **prices))


# Money -----------------------------------------------------------------------------------


def test_money_is_each_priced_quantity_at_its_price(tmp_path: Path) -> None:
    prices = pricing(
        tmp_path,
        price_device_hour=1.8,
        price_per_mtok_prefill=0.5,
        price_per_mtok_sampled=1.0,
        price_per_mtok_trained=3.0,
        price_currency="EUR",
    )
    run = totals(
        device="cuda",
        device_s=7200.0,
        cpu_s=10.0,
        tokens_prefill=2_000_000,
        tokens_sampled=500_000,
        tokens_trained=1_000_000,
    )
    cost = prices.cost(run, "tiny-random")
    assert cost.money_parts is not None
    assert cost.money_parts.model_dump() == {
        "device": 3.6,
        "prefill": 1.0,
        "sampled": 0.5,
        "trained": 3.0,
    }
    assert cost.money == pytest.approx(8.1) and cost.currency == "EUR"
    assert cost.tokens == 3_500_000 and cost.note is None
    assert cost.basis == (
        "RLCS_PRICE_DEVICE_HOUR 1.8 EUR/h, RLCS_PRICE_PER_MTOK_PREFILL 0.5 EUR/Mtok, "
        "RLCS_PRICE_PER_MTOK_SAMPLED 1 EUR/Mtok, RLCS_PRICE_PER_MTOK_TRAINED 3 EUR/Mtok"
    )
    brief = prices.brief(run, "tiny-random")
    assert brief.model_dump() == {
        "device_s": 7200.0,
        "tokens": 3_500_000,
        "money": pytest.approx(8.1),
        "currency": "EUR",
    }


def test_a_price_set_prices_only_its_own_quantity(tmp_path: Path) -> None:
    run = totals(device="cpu", device_s=1800.0, tokens_sampled=10, tokens_trained=10)
    cost = pricing(tmp_path, price_device_hour=2.0).cost(run, "tiny-random")
    assert cost.money == 1.0
    assert cost.money_parts is not None and cost.money_parts.sampled is None


def test_no_price_set_is_no_money_saying_which_settings_give_one(tmp_path: Path) -> None:
    cost = pricing(tmp_path).cost(totals(device="cpu", device_s=5.0), "tiny-random")
    assert cost.money is None and cost.currency is None and cost.money_parts is None
    assert cost.note is not None and "RLCS_PRICE_DEVICE_HOUR" in cost.note
    nothing = pricing(tmp_path, price_device_hour=1.0).cost(totals(), "tiny-random")
    assert nothing.money is None and nothing.note is not None and "nothing spent" in nothing.note


def test_a_hosted_tinker_run_is_priced_by_its_models_row(tmp_path: Path) -> None:
    # The device price is for our own devices: a hosted run's seconds are Tinker's, by token.
    prices = pricing(tmp_path, price_device_hour=100.0, price_per_mtok_sampled=100.0)
    run = totals(
        device=TINKER_HOSTED,
        device_s=3600.0,
        tokens_prefill=1_000_000,
        tokens_sampled=1_000_000,
        tokens_trained=2_000_000,
    )
    cost = prices.cost(run, "Qwen/Qwen3-8B")
    assert cost.money == pytest.approx(0.2 + 0.6 + 0.8) and cost.currency == "USD"
    assert cost.money_parts is not None and cost.money_parts.device is None
    assert cost.basis is not None
    assert "as of 2026-10-07 (https://example.test/prices)" in cost.basis
    assert prices.cost(run, "qwen/qwen3-8b").money == cost.money  # ids in another case
    missing = prices.cost(run, "meta-llama/Llama-3.1-8B")
    assert missing.money is None and missing.note is not None
    assert "no price for meta-llama/Llama-3.1-8B" in missing.note
    assert "RLCS_TINKER_PRICES" in missing.note


# The price table ------------------------------------------------------------------------


def test_the_shipped_table_loads_with_its_date_and_source() -> None:
    table = TinkerPrices.load(SHIPPED_TABLE)
    assert table.currency == "USD" and table.as_of and table.source.startswith("https://")
    assert table.lookup("Qwen/Qwen3-8B") is not None and table.lookup(None) is None


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("currency = ", "is not TOML"),
        (TABLE.replace("train = 0.4", "train = -0.4"), 'models."Qwen/Qwen3-8B"] train must be'),
        (TABLE.replace("train = 0.4", 'train = "cheap"'), "train must be a number"),
        (TABLE.replace("train = 0.4\n", ""), "exactly prefill, sample and train"),
        (TABLE.replace('currency = "USD"', 'currency = "dollars"'), "three-letter code"),
        (TABLE.replace('source = "https://example.test/prices"', ""), "source must be a string"),
        ("prices = 1\n" + TABLE, "unknown key 'prices'"),
    ],
)
def test_a_malformed_table_is_refused_saying_what_to_fix(
    tmp_path: Path, text: str, words: str
) -> None:
    path = tmp_path / "prices.toml"
    path.write_text(text)
    with pytest.raises(PriceTableError, match="RLCS_TINKER_PRICES") as refused:
        TinkerPrices.load(path)
    assert words in str(refused.value)
    with pytest.raises(PriceTableError, match="cannot be read"):
        TinkerPrices.load(tmp_path / "absent.toml")


# Settings -------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["-1", "abc", "nan", "inf"])
def test_a_price_that_is_no_price_is_refused_naming_the_setting(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("RLCS_PRICE_PER_MTOK_TRAINED", value)
    with pytest.raises(ValidationError, match="RLCS_PRICE_PER_MTOK_TRAINED must be a number"):
        Settings()


def test_prices_are_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLCS_PRICE_DEVICE_HOUR", "2.5")
    monkeypatch.setenv("RLCS_PRICE_PER_MTOK_SAMPLED", "")  # set empty: no price
    monkeypatch.setenv("RLCS_PRICE_CURRENCY", "EUR")
    settings = Settings()
    assert settings.price_device_hour == 2.5 and settings.price_per_mtok_sampled is None
    assert settings.price_currency == "EUR"
    monkeypatch.setenv("RLCS_PRICE_CURRENCY", "euro")
    with pytest.raises(ValidationError, match="RLCS_PRICE_CURRENCY must be a three-letter"):
        Settings()


# The meter -------------------------------------------------------------------------------


def test_the_meter_charges_the_seconds_between_two_takes() -> None:
    now = {"wall": 100.0, "cpu": 5.0}
    meter = CostMeter(clock=lambda: now["wall"], cpu_clock=lambda: now["cpu"])
    assert meter.take() is None  # nothing held yet
    meter.wrap(object(), "tinker")
    now["wall"], now["cpu"] = 130.0, 9.0
    meter.add(prefill=7, sampled=3)
    meter.add(trained=10)
    assert meter.take() == Spent(30.0, 4.0, 7, 3, 10, TINKER_HOSTED)
    now["wall"] = 131.5
    assert meter.take() == Spent(1.5, 0.0, 0, 0, 0, TINKER_HOSTED)


# A Tinker API session -------------------------------------------------------------------


def session_row(run_id: str, source: str) -> Run:
    return Run(
        id=run_id,
        environment="tinker-api",
        status=RunStatus.running,
        config_json=json.dumps({"model_name": "tiny-random"}),
        config_hash="h",
        run_dir="/nowhere",
        source=source,
    )


def test_a_tinker_api_sessions_cost_is_the_tokens_its_steps_counted(tmp_path: Path) -> None:
    """What the session's records already hold per optimizer step (tokens trained, tokens
    sampled since the step before) becomes its totals; its device time is not measured."""
    settings = make_settings(tmp_path, price_device_hour=1.0, price_per_mtok_trained=1.0)
    with TestClient(create_app(settings)) as client:
        engine = make_engine(settings.db_url)
        with write_session(engine) as session:
            session.add(session_row("r-00000001", TINKER_API))
            session.add(session_row("r-00000002", API_SOURCE))
        for step, (trained, sampled) in enumerate([(300, 40), (500, 0)], start=1):
            metrics = {"train/loss": 1.0, "train/tokens": trained, "sampler/tokens": sampled}
            recorded = lifecycle.record_step(engine, "r-00000001", step, metrics)
            # Our own runs are charged by their runner, never from these names.
            lifecycle.record_step(engine, "r-00000002", step, metrics)
        assert recorded["cost/tokens_trained"] == 800.0
        cost = client.get("/runs/r-00000001").json()["cost"]
        assert (cost["tokens_trained"], cost["tokens_sampled"], cost["tokens_prefill"]) == (
            800,
            40,
            None,
        )
        assert cost["device_s"] is None and cost["money"] == pytest.approx(800 / 1e6)
        assert cost["money_parts"]["device"] is None and "device seconds" in cost["note"]
        ours = client.get("/runs/r-00000002").json()["cost"]
        assert ours["tokens"] is None and ours["money"] is None
        engine.dispose()
