"""Benchmark names in the scheme of bench/targets.h:
<family>/<group>.../<series>/bytes:<N>[/real_time|/manual_time|/process_time]."""

from __future__ import annotations

import re
from typing import NamedTuple

TIME_SUFFIXES = ("real_time", "manual_time", "process_time")


class ParsedName(NamedTuple):
    """A name's group (family and the folders after it), series and bytes
    (None for a benchmark without a size)."""

    group: str
    series: str
    size: int | None


def parse_name(name: str) -> ParsedName:
    """The group, series and bytes of `name`; the time suffix is dropped."""
    parts = [p for p in name.split("/") if p not in TIME_SUFFIXES]
    size = None
    if parts and parts[-1].startswith("bytes:"):
        size = int(parts.pop()[len("bytes:"):])
    series = parts.pop() if len(parts) > 1 else (parts[0] if parts else name)
    return ParsedName("/".join(parts), series, size)


def sort_key(name: str) -> tuple[str, str, int, str]:
    """Orders names by group, series, then size (numerically)."""
    group, series, size = parse_name(name)
    return (group, series, size or 0, name)


def matches_filter(pattern: str, name: str) -> bool:
    """Whether --benchmark_filter=pattern selects name (a regex searched in
    the name; a leading '-' negates it)."""
    if pattern.startswith("-"):
        return not re.search(pattern[1:], name)
    return re.search(pattern, name) is not None


def family_of(name: str) -> str:
    """The benchmark family of a name for the report: its group
    (e.g. BM_FileCopy/cpu/warm, BM_Replace/all_cores)."""
    group = parse_name(name).group
    return group or name
