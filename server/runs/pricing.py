"""Money from what a run spent (issue 36), computed when the run is read, at the prices in force:
hosted Tinker's price table for runs trained there, the RLCS_PRICE_* settings for the rest (the
local engine, Tinker API sessions). No price, no money: None, saying why."""

from __future__ import annotations

import math
import re
import tomllib
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

from core.cost import TINKER_HOSTED
from core.settings import Settings
from server.runs.schemas import CostPartsOut, RunCostBriefOut, RunCostOut

SHIPPED_TABLE = Path(__file__).with_name("tinker_prices.toml")
TABLE_SETTING = "RLCS_TINKER_PRICES"
MTOK = 1_000_000


class PriceTableError(ValueError):
    """The price table cannot be used (its words name the file and what to fix)."""


@dataclass(frozen=True)
class Rates:
    """Prices: per device hour and per million tokens of each kind (None: not priced), and
    where they come from, in words."""

    currency: str
    basis: str
    device_hour: float | None = None
    prefill: float | None = None
    sampled: float | None = None
    trained: float | None = None


@dataclass(frozen=True)
class Totals:
    """A run's cost columns (core/cost.py), from a Run or a row of them."""

    device: str | None
    device_s: float | None
    cpu_s: float | None
    tokens_prefill: int | None
    tokens_sampled: int | None
    tokens_trained: int | None

    @property
    def tokens(self) -> int | None:
        """The three kinds together; None when none was counted."""
        counted = [
            t
            for t in (self.tokens_prefill, self.tokens_sampled, self.tokens_trained)
            if t is not None
        ]
        return sum(counted) if counted else None

    @classmethod
    def of(cls, run: Any) -> Totals:
        return cls(
            run.cost_device,
            run.cost_device_s,
            run.cost_cpu_s,
            run.cost_tokens_prefill,
            run.cost_tokens_sampled,
            run.cost_tokens_trained,
        )


class TinkerPrices:
    """Hosted Tinker's per-model prices (a TOML table: currency, as_of, source, and
    [models."<id>"] with prefill, sample and train per million tokens)."""

    def __init__(self, path: Path, currency: str, as_of: str, source: str) -> None:
        self.path = path
        self.currency = currency
        self.as_of = as_of
        self.source = source
        self.models: dict[str, Rates] = {}

    @classmethod
    def load(cls, path: Path) -> TinkerPrices:
        where = f"{TABLE_SETTING}: {path}"
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise PriceTableError(f"{where} cannot be read ({exc.strerror or exc})") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise PriceTableError(f"{where} is not TOML: {exc}") from None
        unknown = sorted(set(data) - {"currency", "as_of", "source", "models"})
        if unknown:
            raise PriceTableError(
                f"{where}: unknown key {unknown[0]!r}; a table has currency, as_of, source "
                'and [models."<model id>"] rows'
            )
        currency, as_of, source = (
            _text(data, key, where) for key in ("currency", "as_of", "source")
        )
        table = cls(path, currency, as_of, source)
        models = data.get("models", {})
        if not isinstance(models, dict):
            raise PriceTableError(f'{where}: models must be rows [models."<model id>"]')
        for model, row in models.items():
            table.models[model] = table._rates(model, row, where)
        return table

    def _rates(self, model: str, row: Any, where: str) -> Rates:
        name = f'{where}: [models."{model}"]'
        if not isinstance(row, dict) or set(row) != {"prefill", "sample", "train"}:
            raise PriceTableError(
                f"{name} must have exactly prefill, sample and train (per million tokens)"
            )
        for key, value in row.items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise PriceTableError(f"{name} {key} must be a number, not {value!r}")
            if not math.isfinite(value) or value < 0:
                raise PriceTableError(f"{name} {key} must be at least 0, not {value!r}")
        basis = (
            f"hosted Tinker's prices for {model} per million tokens (prefill {row['prefill']:g}, "
            f"sample {row['sample']:g}, train {row['train']:g} {self.currency}) as of "
            f"{self.as_of} ({self.source}), from {self.path}"
        )
        return Rates(
            self.currency,
            basis,
            prefill=float(row["prefill"]),
            sampled=float(row["sample"]),
            trained=float(row["train"]),
        )

    def lookup(self, model: str | None) -> Rates | None:
        """The model's prices: its exact id, else the same id in another case."""
        if model is None:
            return None
        if model in self.models:
            return self.models[model]
        folded = {name.casefold(): rates for name, rates in self.models.items()}
        return folded.get(model.casefold())


class Pricing:
    """What a run's totals cost, by where it ran."""

    def __init__(self, settings_rates: Rates | None, tinker: TinkerPrices) -> None:
        self._settings_rates = settings_rates
        self.tinker = tinker

    @classmethod
    def from_settings(cls, settings: Settings) -> Pricing:
        """The prices in force; PriceTableError when the Tinker table cannot be used."""
        return cls(
            settings_rates(settings), TinkerPrices.load(settings.tinker_prices or SHIPPED_TABLE)
        )

    def cost(self, run: Any, model_name: str | None) -> RunCostOut:
        """`run`: a Run or a row with its cost columns; `model_name`: the model it trains."""
        totals = Totals.of(run)
        priced = self._price(totals, model_name)
        return RunCostOut(
            device_s=_round(totals.device_s, 3),
            tokens=totals.tokens,
            money=priced.money,
            currency=priced.currency,
            device=totals.device,
            cpu_s=_round(totals.cpu_s, 3),
            tokens_prefill=totals.tokens_prefill,
            tokens_sampled=totals.tokens_sampled,
            tokens_trained=totals.tokens_trained,
            money_parts=CostPartsOut(**priced.parts) if priced.parts is not None else None,
            basis=priced.basis,
            note=priced.note,
        )

    def brief(self, run: Any, model_name: str | None) -> RunCostBriefOut:
        """The cost as lists show it (built without validation: a list has many)."""
        totals = Totals.of(run)
        priced = self._price(totals, model_name)
        return RunCostBriefOut.model_construct(
            device_s=_round(totals.device_s, 3),
            tokens=totals.tokens,
            money=priced.money,
            currency=priced.currency,
        )

    def _price(self, totals: Totals, model_name: str | None) -> Priced:
        if totals.device_s is None and totals.tokens is None:
            return Priced(note="nothing spent yet: a run's totals grow with each step it records")
        if totals.device == TINKER_HOSTED:
            rates = self.tinker.lookup(model_name)
            if rates is None:
                return Priced(
                    note=f"no price for {model_name} in hosted Tinker's price table "
                    f"({self.tinker.path}); add its row, or point {TABLE_SETTING} at a table "
                    "that has it (docs/runs.md)"
                )
            return _priced(totals, rates)
        if self._settings_rates is None:
            return Priced(
                note="no price set: set RLCS_PRICE_DEVICE_HOUR and/or "
                "RLCS_PRICE_PER_MTOK_PREFILL, _SAMPLED, _TRAINED (docs/settings.md)"
            )
        return _priced(totals, self._settings_rates)


@dataclass(frozen=True)
class Priced:
    """The money of some totals (None: no price applies), its parts, the prices used, and
    why there is no money or what it leaves out."""

    money: float | None = None
    currency: str | None = None
    parts: dict[str, float | None] | None = None
    basis: str | None = None
    note: str | None = None


def settings_rates(settings: Settings) -> Rates | None:
    """The RLCS_PRICE_* settings as rates; None when none is set."""
    prices = {
        "device_hour": (settings.price_device_hour, "RLCS_PRICE_DEVICE_HOUR", "/h"),
        "prefill": (settings.price_per_mtok_prefill, "RLCS_PRICE_PER_MTOK_PREFILL", "/Mtok"),
        "sampled": (settings.price_per_mtok_sampled, "RLCS_PRICE_PER_MTOK_SAMPLED", "/Mtok"),
        "trained": (settings.price_per_mtok_trained, "RLCS_PRICE_PER_MTOK_TRAINED", "/Mtok"),
    }
    currency = settings.price_currency
    set_ = {key: value for key, (value, _, _) in prices.items() if value is not None}
    if not set_:
        return None
    basis = ", ".join(
        f"{name} {value:g} {currency}{unit}"
        for value, name, unit in prices.values()
        if value is not None
    )
    return Rates(currency, basis, **set_)


def _priced(totals: Totals, rates: Rates) -> Priced:
    """Each priced quantity's money; a priced quantity not measured is said in the note."""
    quantities = {
        "device": (rates.device_hour, totals.device_s, 3600.0, "device seconds"),
        "prefill": (rates.prefill, totals.tokens_prefill, MTOK, "prefill tokens"),
        "sampled": (rates.sampled, totals.tokens_sampled, MTOK, "sampled tokens"),
        "trained": (rates.trained, totals.tokens_trained, MTOK, "trained tokens"),
    }
    parts: dict[str, float | None] = {}
    unmeasured = []
    for key, (price, amount, per, words) in quantities.items():
        if price is not None and amount is None:
            unmeasured.append(words)
        parts[key] = None if price is None or amount is None else round(price * amount / per, 6)
    note = None
    if unmeasured:
        note = (
            f"{' and '.join(unmeasured)} not measured for this run (a Tinker API session's "
            "device time and prompts are not counted): not in the money"
        )
    priced = [value for value in parts.values() if value is not None]
    if not priced:
        return Priced(note=note)
    return Priced(round(sum(priced), 6), rates.currency, parts, rates.basis, note)


def _text(data: dict[str, Any], key: str, where: str) -> str:
    value = data.get(key)
    if isinstance(value, date):  # as_of = 2026-10-07, unquoted, is a TOML date
        return value.isoformat()
    if not isinstance(value, str) or not value.strip():
        raise PriceTableError(f'{where}: {key} must be a string, e.g. {key} = "{EXAMPLE[key]}"')
    if key == "currency" and not re.fullmatch(r"[A-Z]{3}", value):
        raise PriceTableError(f"{where}: currency must be a three-letter code (USD), not {value!r}")
    return value


EXAMPLE = {"currency": "USD", "as_of": "2026-10-07", "source": "https://..."}


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)
