"""CME products alpha knows: parent symbol, root, tick size and the default round-trip cost.

Contract symbols follow CME's raw form `<root><month code><year digit(s)>` (ESH4, 6EM5, ZNU24).

Each product has a plausible price range, so that another product's prices under its name (NQ at 17,500 in a
file whose metadata says ES) are refused by the record checks. Data comes from GLBX.MDP3, whose history starts
in 2010: each range runs from about half the product's lowest price since then to about twice its highest so
far (ES 1,010-6,900, NQ 1,700-25,000, ZN 104-140, 6E 0.96-1.60), so a real price outside it would be a move no
future has made since 2010. The ranges overlap where the products' history does (NQ traded at ES's prices
until about 2021): they catch another product's data where its prices are far apart, as they are now; the tick
grid catches ZN or 6E prices labelled ES or NQ.

Within the range, one file of a symbol's set can still hold wrong prices (doubled, scaled by ten, another
contract's): `max_file_move` bounds the move of the reference price from the end of one file to the start of the
next (`alpha_core.data.checks.check_continuity`). A boundary is a night or a weekend between consecutive files, a
few weeks where a set has a hole; the bound is a factor no such move has come near since 2010 (the largest within
a quarter: ES down 35% and NQ up 51% in 2020, ZN down about 10% in 2022, 6E down about 16% over the turn of 2015),
and it stays under 2, so a file of doubled or halved prices is refused. It is wider than real markets need because
the demo's quarters are drawn independently: at scale `real` (every session, 4M events a quarter) consecutive demo
files of ES jump by up to a factor 1.8 (seed 0), of ZN and 6E by up to 1.5 (seed 7, the default).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from alpha_core.errors import PlanError

MONTH_CODES = "FGHJKMNQUVXZ"  # January .. December
_CONTRACT_RE = re.compile(r"^(?P<root>[A-Z0-9]{1,4}?)(?P<month>[FGHJKMNQUVXZ])(?P<year>\d{1,2})$")


@dataclass(frozen=True)
class Product:
    symbol: str  # Databento parent symbol, e.g. "ES.FUT"
    root: str  # contract root, e.g. "ES"
    tick_size: float  # minimum price increment
    name: str
    price_range: tuple[float, float]  # plausible outright prices (module docstring)
    max_file_move: float  # the largest plausible factor between one file's last price and the next's first
    dataset: str = "GLBX.MDP3"  # the Databento dataset its data must come from (CME Globex MDP 3.0)

    @property
    def default_cost(self) -> float:
        """Round-trip cost in price units: 2 ticks (ES: 2 x 0.25 = 0.5, the original system's default)."""
        return 2.0 * self.tick_size


PRODUCTS: dict[str, Product] = {
    p.symbol: p
    for p in (
        Product("ES.FUT", "ES", 0.25, "E-mini S&P 500", (500.0, 15_000.0), 1.9),
        Product("NQ.FUT", "NQ", 0.25, "E-mini Nasdaq-100", (800.0, 60_000.0), 1.9),
        Product("ZN.FUT", "ZN", 1.0 / 64.0, "10-Year T-Note", (50.0, 300.0), 1.6),
        Product("6E.FUT", "6E", 0.00005, "Euro FX", (0.4, 3.0), 1.6),
    )
}


def product(symbol: str) -> Product:
    """Look up a parent symbol (ES.FUT) or root (ES); unknown symbols are an error listing the known ones."""
    if symbol in PRODUCTS:
        return PRODUCTS[symbol]
    for p in PRODUCTS.values():
        if p.root == symbol:
            return p
    raise PlanError(f"unknown symbol {symbol!r}; known symbols: {', '.join(PRODUCTS)}")


@dataclass(frozen=True)
class Contract:
    raw_symbol: str
    root: str
    month: int  # 1..12
    year_digits: str

    def expiry_key(self, ref_year: int) -> int:
        """Months since year 0 of the expiry, resolving a 1-digit year to the decade nearest `ref_year`."""
        if len(self.year_digits) == 2:
            year = 2000 + int(self.year_digits)
        else:
            digit = int(self.year_digits)
            year = ref_year - ref_year % 10 + digit
            if year < ref_year - 2:  # ESH0 seen in 2029 means 2030
                year += 10
        return year * 12 + self.month - 1


def parse_contract(raw_symbol: str) -> Contract | None:
    """Parse an outright futures symbol; spreads (`ESH4-ESM4`), user-defined and other symbols give None."""
    m = _CONTRACT_RE.match(raw_symbol)
    if m is None:
        return None
    return Contract(raw_symbol, m["root"], MONTH_CODES.index(m["month"]) + 1, m["year"])
