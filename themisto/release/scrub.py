"""The last look before a release: every text of a `trajectories` row passes the personal-data mask and the secret
scanner, and a stored value holding either is left out of `values`.

Readers mask what they read (`themisto.ingest.personal`, `themisto.ingest.secrets`), but a replay makes new text: a
cell prints a file of its repository that holds a key, a variable's repr shows an address read from a table. So the
build scrubs what replay made, the same way for every source, and counts what it replaced.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Scrubber:
    """Masks personal data and redacts credentials in texts, counting the credentials by kind."""

    redactions: dict[str, int] = field(default_factory=dict)
    texts_changed: int = 0

    def __call__(self, text: str | None) -> str | None:
        from themisto.ingest.personal import mask_personal
        from themisto.ingest.secrets import redact_secrets

        if not text:
            return text
        clean, counts = redact_secrets(mask_personal(text))
        for kind, n in counts.items():
            self.redactions[kind] = self.redactions.get(kind, 0) + n
        if clean != text:
            self.texts_changed += 1
        return clean

    def holds(self, data: bytes) -> bool:
        """Whether a stored value's bytes (read as text) hold personal data or a credential."""
        from themisto.ingest.personal import mask_personal
        from themisto.ingest.secrets import redact_secrets

        text = data.decode("utf-8", errors="ignore")
        return mask_personal(text) != text or bool(redact_secrets(text)[1])

    def row(self, row: dict) -> dict:
        """A `trajectories` row with every text in it scrubbed (a new dict; `row` is not changed)."""
        out = dict(row)
        for key in ("notebook", "code", "replayed_code", "evalue", "output", "logged_evalue"):
            out[key] = self(row.get(key))
        out["variables"] = [{**v, "name": self(v.get("name")), "repr": self(v.get("repr")),
                             "type": self(v.get("type")), "repr_error": self(v.get("repr_error")),
                             "columns": None if v.get("columns") is None else [self(c) for c in v["columns"]]}
                            for v in row.get("variables") or []]
        out["snapshot_failures"] = [{"name": self(f["name"]), "reason": self(f["reason"])}
                                    for f in row.get("snapshot_failures") or []]
        stored = row.get("stored_values")
        if stored is not None:
            out["stored_values"] = {
                "unstored": [{"name": self(u["name"]), "reason": self(u["reason"])} for u in stored["unstored"]],
                "modules": [{"name": self(m["name"]), "module": m["module"]} for m in stored["modules"]],
                "aliases": [[self(n) for n in group] for group in stored["aliases"]]}
        return out
