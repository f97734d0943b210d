"""StayHub's deterministic hotel catalogue and guest directory (no state, no I/O)."""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from functools import cache

CITIES: tuple[str, ...] = (
    "Lisbon",
    "Porto",
    "Madrid",
    "Paris",
    "Berlin",
    "Rome",
    "Vienna",
    "Prague",
)
CURRENCY = "EUR"
CATALOG_SEED = 2024

_ADJECTIVES = ("Grand", "Royal", "Old Town", "Riverside", "Garden", "Central", "Blue", "Golden")
_NOUNS = ("Hotel", "Suites", "Inn", "Palace", "Residence", "Lodge", "House")
_FIRST = ("Ana", "Bruno", "Clara", "David", "Eva", "Felix", "Greta", "Hugo", "Ines", "Jonas")
_LAST = ("Silva", "Moreau", "Rossi", "Novak", "Weber", "Garcia", "Costa", "Bauer", "Fischer")
GUEST_ID_RE = re.compile(r"^g-[A-Za-z0-9_-]+$")
GUEST_EMAIL_DOMAIN = "guests.stayhub.example"


@dataclass(frozen=True)
class Hotel:
    """One hotel: its price per night (cents) and its room count per night."""

    hotel_id: str
    name: str
    city: str
    price_per_night: int
    rooms: int

    def to_json(self) -> dict[str, object]:
        """The hotel as returned by ``GET /hotels``."""
        return {
            "hotel_id": self.hotel_id,
            "name": self.name,
            "city": self.city,
            "price_per_night": money(self.price_per_night),
        }


def money(amount: int, currency: str = CURRENCY) -> dict[str, object]:
    """A money object: integer cents and an ISO currency code."""
    return {"amount": amount, "currency": currency}


@cache
def catalogue(seed: int = CATALOG_SEED) -> dict[str, Hotel]:
    """All hotels by id: 3-5 per city, generated from ``seed``."""
    hotels: dict[str, Hotel] = {}
    for city in CITIES:
        rng = random.Random(f"{seed}:{city}")
        names = [f"{a} {n}" for a in _ADJECTIVES for n in _NOUNS]
        for number, name in enumerate(rng.sample(names, rng.randint(3, 5)), start=1):
            hotel_id = f"h-{city[:3].lower()}-{number}"
            hotels[hotel_id] = Hotel(
                hotel_id=hotel_id,
                name=f"{name} {city}",
                city=city,
                price_per_night=rng.randrange(6_000, 30_001, 500),
                rooms=rng.randint(2, 6),
            )
    return hotels


def hotels_in(city: str) -> list[Hotel]:
    """Hotels in ``city`` (case-insensitive); empty for an unknown city."""
    wanted = city.strip().casefold()
    return [h for h in catalogue().values() if h.city.casefold() == wanted]


def hotel(hotel_id: str) -> Hotel | None:
    """The hotel with this id, or ``None``."""
    return catalogue().get(hotel_id)


def guest(guest_id: str) -> dict[str, str] | None:
    """The guest's profile with their verified email, or ``None`` if no such guest."""
    if not GUEST_ID_RE.match(guest_id):
        return None
    rng = random.Random(f"guest:{guest_id}")
    return {
        "guest_id": guest_id,
        "name": f"{rng.choice(_FIRST)} {rng.choice(_LAST)}",
        "email": f"{guest_id}@{GUEST_EMAIL_DOMAIN}",
    }
