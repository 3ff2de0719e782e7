"""The reproducibility signature of a score: :class:`Signature`, which prints and parses (as sacrebleu's)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

# Printed keys in order, and the field each one fills.
_KEYS = {
    "bertscore-loss": "version",
    "model": "model",
    "layer": "layer",
    "idf": "idf",
    "rescale": "rescale",
    "multi-ref": "multi_ref",
    "long": "long_inputs",
    "dtype": "dtype",
    "transformers": "transformers",
    "torch": "torch",
}


def _escape(value: str) -> str:
    """A field value as printed: ``\\`` and ``|`` escaped with a backslash, so any folder name round-trips."""
    return value.replace("\\", "\\\\").replace("|", "\\|")


def _split(text: str) -> list[str]:
    """The fields of a printed signature: split at unescaped ``|``, escapes removed."""
    parts, cur, i = [], [], 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):
            cur.append(text[i + 1])
            i += 2
            continue
        if c == "|":
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(c)
        i += 1
    parts.append("".join(cur))
    return parts


@dataclass(frozen=True)
class Signature:
    """Everything that determines a BERTScore value, e.g.
    ``bertscore-loss:0.1.0|model:<name or folder>|layer:4|idf:no|rescale:no|multi-ref:max|dtype:float32|...``.

    ``str(signature)`` prints it; :meth:`parse` reads it back (``Signature.parse(str(s)) == s``); two
    scores are comparable when their signatures are equal (:meth:`differences` names what differs).
    ``long_inputs`` is None for truncation (the default, then not printed) or ``"window(stride=N)"``.
    """

    version: str
    model: str
    layer: int
    idf: str = "no"
    rescale: str = "no"
    multi_ref: str = "max"
    long_inputs: str | None = None
    dtype: str = "float32"
    transformers: str = ""
    torch: str = ""

    def __str__(self) -> str:
        parts = []
        for key, name in _KEYS.items():
            value = getattr(self, name)
            if value is None:
                continue
            parts.append(f"{key}:{_escape(str(value))}")
        return "|".join(parts)

    @classmethod
    def parse(cls, text: str) -> Signature:
        """The signature printed in ``text``; ValueError naming an unknown, repeated or missing key."""
        if not isinstance(text, str):
            raise TypeError(f"a signature is a str, got {type(text).__name__}")
        values: dict[str, object] = {}
        for part in _split(text.strip()):
            key, sep, value = part.partition(":")
            if not sep or key not in _KEYS:
                raise ValueError(f"not a bertscore-loss signature field: {part!r} (known: {', '.join(_KEYS)})")
            name = _KEYS[key]
            if name in values:
                raise ValueError(f"the signature names {key!r} twice")
            values[name] = value
        missing = [k for k, n in _KEYS.items() if n not in values and n in ("version", "model", "layer")]
        if missing:
            raise ValueError(f"the signature lacks {', '.join(missing)}: {text!r}")
        layer = str(values["layer"])
        if not (layer.isascii() and layer.isdigit()):
            raise ValueError(f"layer must be a non-negative int (ASCII digits) in a signature, got {layer!r}")
        values["layer"] = int(layer)
        return cls(**values)  # type: ignore[arg-type]

    def differences(self, other: Signature | str) -> dict[str, tuple[object, object]]:
        """``{field: (this value, other value)}`` of the fields that differ (empty: comparable scores)."""
        other = Signature.parse(other) if isinstance(other, str) else other
        return {
            f.name: (getattr(self, f.name), getattr(other, f.name))
            for f in dataclasses.fields(self)
            if getattr(self, f.name) != getattr(other, f.name)
        }
