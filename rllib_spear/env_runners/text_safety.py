"""Text sanitation before tokenization.

Model text and tool output can hold code points that a tokenizer cannot encode: a Python ``str``
may carry lone UTF-16 surrogates (``"\\ud800"``), which have no UTF-8 form, and fast tokenizers
then raise ``TypeError``/``UnicodeEncodeError``. ``safe_text`` returns a string that always
encodes as UTF-8: a valid surrogate pair is joined into its character, every lone surrogate
becomes U+FFFD. Non-``str`` values (bytes, None, numbers) are converted first.
"""
from __future__ import annotations

from typing import Any

__all__ = ["REPLACEMENT_CHAR", "safe_text"]

REPLACEMENT_CHAR = "\ufffd"


def safe_text(value: Any) -> str:
    """``value`` as a ``str`` that encodes as UTF-8 (unencodable code points -> U+FFFD)."""
    if value is None:
        return ""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", errors="replace")
    text = value if isinstance(value, str) else str(value)
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    # Only surrogates (U+D800..U+DFFF) fail UTF-8 encoding; the UTF-16 round trip joins
    # well-formed pairs and replaces each lone one with U+FFFD.
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
