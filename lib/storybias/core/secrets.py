"""Keys never printed (issue #58 item 5): a key variable whose value cannot be sent as an HTTP header is
refused naming the variable, never the value, and any text about to be raised or logged is scrubbed of
header values (``Bearer sk-...``) and of the keys themselves.

A key holding a newline used to reach ``reports/<run>/04_associations.log`` and the executed notebook inside
httpx's ``Illegal header value b'Bearer sk-...\\nX-Injected: 1'``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

# What an API key may hold: printable ASCII without spaces (a header value may hold no control character,
# and keys are tokens); anything else is refused before a request is built.
_KEY_CHARACTERS = re.compile(r"^[\x21-\x7e]+$")
# An authorization header's value, quoted or not, up to the end of the quoted bytes or of the token.
_HEADER_VALUE = re.compile(r"(?i)\b(authorization:\s*(?:bearer|basic)?|bearer)\s*[^\s'\"]+(?:\\[nrt][^\s'\"]*)*")
SCRUBBED = "[scrubbed]"


def key_problem(variable: str, value: str) -> str | None:
    """Why the value of ``$variable`` cannot be a key (None when it can), naming the variable and the
    position of the first bad character, never the value."""
    if _KEY_CHARACTERS.match(value):
        return None
    position = next(i for i, c in enumerate(value) if not _KEY_CHARACTERS.match(c))
    kind = (
        "a control character (e.g. a newline)"
        if ord(value[position]) < 32 or value[position] == "\x7f"
        else ("a space" if value[position].isspace() else "a character outside printable ASCII")
    )
    return (
        f"${variable} holds {kind} at position {position + 1} of {len(value)}; an API key is printable ASCII "
        f"without spaces: export {variable} again without it"
    )


def scrub(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` without authorization header values and without any of ``secrets`` (each at least 4
    characters; in any of the forms an error prints them: as is, repr-escaped)."""
    for secret in secrets:
        if secret and len(secret) >= 4:
            for form in {secret, repr(secret)[1:-1], repr(secret.encode("utf-8", "replace"))[2:-1]}:
                text = text.replace(form, SCRUBBED)
    return _HEADER_VALUE.sub(lambda m: f"{m.group(1).rstrip()} {SCRUBBED}", text)


def environment_keys(variables: Iterable[str]) -> list[str]:
    """The values of the named environment variables that are set (the secrets to scrub)."""
    return [os.environ[v] for v in variables if os.environ.get(v)]
