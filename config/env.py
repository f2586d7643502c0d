"""Typed readers for environment variables that fail loudly on bad values.

Every variable the project reads goes through one of these, so a typo such as
``KB_BM25_K1=1,2`` stops start-up with a message naming the variable instead of
surfacing later as a strange ranking.
"""

import math
import os
import zoneinfo
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _raw(name: str) -> str | None:
    value = os.environ.get(name)
    return None if value is None else value.strip()


def env_str(name: str, default: str) -> str:
    value = _raw(name)
    return default if value is None or value == "" else value


def env_optional_str(name: str) -> str | None:
    value = _raw(name)
    return value or None


def env_bool(name: str, default: bool) -> bool:
    value = _raw(name)
    if value is None:
        return default
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={value!r} is not a boolean (use 1/0, true/false, yes/no, on/off)")


def env_int(name: str, default: int, *, minimum: int | None = None, maximum: int | None = None) -> int:
    value = _raw(name)
    if value is None or value == "":
        return default
    try:
        number = int(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={value!r} is not an integer") from None
    _check_range(name, number, minimum, maximum)
    return number


def env_float(name: str, default: float, *, minimum: float | None = None, maximum: float | None = None) -> float:
    value = _raw(name)
    if value is None or value == "":
        return default
    try:
        number = float(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={value!r} is not a number") from None
    if not math.isfinite(number):
        raise ImproperlyConfigured(f"{name}={value!r} is not a finite number")
    _check_range(name, number, minimum, maximum)
    return number


def env_list(name: str, default: Sequence[str] = ()) -> list[str]:
    value = _raw(name)
    if value is None:
        return list(default)
    return [item.strip() for item in value.split(",") if item.strip()]


def env_nonempty_list(name: str, default: Sequence[str]) -> list[str]:
    """A comma-separated list that may be left unset but not set to nothing."""
    values = env_list(name, default)
    if not values:
        raise ImproperlyConfigured(f"{name} is set but names nothing; leave it unset for the default")
    return values


def env_time_zone(name: str, default: str) -> str:
    value = env_str(name, default)
    try:
        zoneinfo.ZoneInfo(value)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ImproperlyConfigured(f"{name}={value!r} is not a time zone (e.g. UTC, Europe/Paris)") from None
    return value


def env_url_scheme(name: str, default: str, schemes: Sequence[str]) -> str:
    """A URL whose scheme is one of ``schemes``."""
    value = env_str(name, default)
    if urlsplit(value).scheme.lower() not in schemes:
        raise ImproperlyConfigured(f"{name}={value!r} must start with one of: {', '.join(s + '://' for s in schemes)}")
    return value


def env_choice(name: str, default: str, choices: Sequence[str], *, upper: bool = False) -> str:
    value = env_str(name, default).upper() if upper else env_str(name, default)
    if value not in choices:
        raise ImproperlyConfigured(f"{name}={value!r} must be one of: {', '.join(choices)}")
    return value


def env_path(name: str, default: Path, *, base: Path) -> Path:
    """A path; relative values are taken relative to ``base`` (the project directory)."""
    return env_optional_path(name, base=base) or (default if default.is_absolute() else base / default)


def env_optional_path(name: str, *, base: Path) -> Path | None:
    value = _raw(name)
    if not value:
        return None
    path = Path(value).expanduser()
    return path if path.is_absolute() else (base / path)


def _check_range(name: str, number: float, minimum: float | None, maximum: float | None) -> None:
    if minimum is not None and number < minimum:
        raise ImproperlyConfigured(f"{name}={number} is below the minimum {minimum}")
    if maximum is not None and number > maximum:
        raise ImproperlyConfigured(f"{name}={number} is above the maximum {maximum}")
