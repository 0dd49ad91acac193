"""Feng et al.'s cue deletion (*Beyond Surface Cues*, App. D.4): the protagonist's name, its reusable
components and the language's prespecified direct gender terms (``params/cues/<lang>.yaml``) are
deleted from a story without placeholders, before it is re-embedded and re-probed."""

from __future__ import annotations

import re
import sys
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Any

import pandas as pd

from storybias.core import paths
from storybias.core.io import read_yaml_strict

# Cue deletion (App. D.4): a name's reusable components are its parts split on whitespace, hyphens
# and middle dots (玛丽·居里, マリー・キュリー), at least two characters long.
NAME_SEPARATORS = re.compile(r"[\s\-\u2010-\u2015\u00b7\u30fb\u2027\u2022\uff65]+")


MIN_NAME_COMPONENT = 2


NOT_A_NAME = frozenset({"unknown", "none", "null", "n/a", "na", "unnamed", "no name"})


# Arabic cue terms are matched on undiacritised text: harakat, superscript alef and tatweel may sit
# between any two letters of a term without blocking the match.
ARABIC_OPTIONAL = "\u0610-\u061a\u0640\u064b-\u065f\u0670\u06d6-\u06ed"


@dataclass(frozen=True)
class CueList:
    """The direct gender terms of one language (params/cues/<lang>.yaml), NFC, longest first."""

    language: str
    match: str  # "word" (whole words, case-insensitive) or "substring" (zh, ja, ko)
    terms: tuple[str, ...]


def _nfc(text: str) -> str:
    return unicodedata.normalize("NFC", text)


def _longest_first(terms: Sequence[str]) -> tuple[str, ...]:
    return tuple(sorted(set(terms), key=lambda t: (-len(t), t)))


@cache
def load_cues(language: str) -> CueList:
    """Read params/cues/<language>.yaml: the prespecified deletion list (female + male terms)."""
    path = paths.params_dir() / "cues" / f"{language}.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"no direct gender cues for language {language!r}: {path} is missing")
    spec = read_yaml_strict(path)
    if spec.get("match") not in ("word", "substring"):
        raise ValueError(f"{path}: `match` must be 'word' or 'substring'")
    terms = [_nfc(str(t)).strip() for key in ("female", "male") for t in spec.get(key) or []]
    return CueList(language=language, match=spec["match"], terms=_longest_first([t for t in terms if t]))


@lru_cache(maxsize=1)
def _combining_marks() -> str:
    """Body of a regex character class holding every Unicode combining mark (Mn, Mc, Me).

    Python's ``\\w`` does not include them, so a plain word boundary would split Devanagari words at
    their vowel signs; word matching treats letters, digits, ``_`` and marks as word characters."""
    ranges: list[tuple[int, int]] = []
    for cp in range(sys.maxunicode + 1):
        if unicodedata.category(chr(cp))[0] == "M":
            if ranges and ranges[-1][1] == cp - 1:
                ranges[-1] = (ranges[-1][0], cp)
            else:
                ranges.append((cp, cp))
    return "".join(f"\\U{a:08x}-\\U{b:08x}" for a, b in ranges)


def _term_regex(term: str, language: str) -> str:
    if language == "ar":
        return "".join(re.escape(ch) + f"[{ARABIC_OPTIONAL}]*" for ch in term)
    return re.escape(term)


@lru_cache(maxsize=256)
def _pattern(terms: tuple[str, ...], language: str, match: str, ignore_case: bool) -> re.Pattern[str] | None:
    """One alternation of ``terms``, longest first (so 外甥女 wins over 外甥 at the same position)."""
    if not terms:
        return None
    body = "|".join(_term_regex(t, language) for t in _longest_first(terms))
    if match == "word":
        word_char = rf"[\w{_combining_marks()}]"
        body = rf"(?<!{word_char})(?:{body})(?!{word_char})"
    return re.compile(body, re.IGNORECASE if ignore_case else 0)


def name_terms(name: Any) -> tuple[str, ...]:
    """The extracted protagonist name and its reusable components (App. D.4), longest first.

    Components are the parts split on whitespace, hyphens and middle dots, at least
    ``MIN_NAME_COMPONENT`` characters long; in cased scripts a part starting with a lowercase letter is
    a particle (de, van, bin) and is kept, since deleting it everywhere would cut ordinary words."""
    if name is None or (not isinstance(name, str) and pd.isna(name)):
        return ()
    name = _nfc(str(name)).strip()
    if not name or name.casefold() in NOT_A_NAME:
        return ()
    found = [name]
    for part in NAME_SEPARATORS.split(name):
        part = part.strip(".,;:'\"’()[]")
        if len(part) < MIN_NAME_COMPONENT:
            continue
        if part[0].lower() != part[0].upper() and part[0].islower():
            continue
        found.append(part)
    return _longest_first(found)


def tidy_spaces(text: str) -> str:
    """Collapse the runs of spaces a deletion leaves (no placeholder is inserted); keep line breaks."""
    text = re.sub(r"[^\S\n]{2,}", " ", text)
    text = re.sub(r"[^\S\n]+\n", "\n", text)
    text = re.sub(r"\n[^\S\n]+", "\n", text)
    return text.strip()


def delete_cues(text: str, language: str, name: Any = None, cues: CueList | None = None) -> str:
    """Feng et al. App. D.4: delete the protagonist's name, its reusable components and the language's
    direct gender terms, without inserting placeholders.

    Word languages match whole words (cue terms case-insensitively, names as written); zh/ja/ko match
    substrings, longest first. Deletion repeats until nothing matches, since removing a term can join
    its neighbours into another term (女她孩 -> 女孩). The text is compared in NFC (params/cues/hi.yaml)."""
    cues = cues or load_cues(language)
    text = _nfc(text or "")
    patterns = [
        p
        for p in (
            _pattern(name_terms(name), language, cues.match, False),
            _pattern(cues.terms, language, cues.match, True),
        )
        if p is not None
    ]
    for _ in range(1000):
        new = text
        for pattern in patterns:
            new = pattern.sub("", new)
        if new == text:
            break
        text = new
    return tidy_spaces(text)
