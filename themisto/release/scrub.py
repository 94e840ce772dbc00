"""The last look before a release: every text of a `trajectories` row passes the personal-data mask and the secret
scanner, and a stored value holding either is left out of `values`.

Readers mask what they read (`themisto.ingest.personal`, `themisto.ingest.secrets`), but a replay makes new text: a
cell prints a file of its repository that holds a key, a variable's repr shows an address read from a table. So the
build scrubs what replay made, the same way for every source, and counts what it replaced. A traceback through a
library also shows where the host keeps the kernel's environment (`/home/<builder>/themisto/.venv-kernel/lib/...`):
that folder becomes `<kernel-env>`, so that no builder's path is published and an output target is the same
wherever the release was built.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

KERNEL_ENV = "<kernel-env>"  # what stands for a kernel environment's folder in a release's texts


def kernel_env_roots() -> list[str]:
    """The folders of the host's kernel environments (virtual environments: the configured interpreter's, and each
    named one beside the package), as given and resolved, longest first."""
    from themisto.settings import KERNEL_ENVIRONMENTS, KERNEL_VENV, settings

    candidates = [Path(settings().kernel_python).parent.parent,
                  *(KERNEL_VENV.parent / folder for folder in KERNEL_ENVIRONMENTS.values())]
    roots = {str(path) for c in candidates if (c / "pyvenv.cfg").is_file() for path in (c.absolute(), c.resolve())}
    return sorted(roots, key=len, reverse=True)

_OWN_HASH = re.compile(r'"hash"\s*:\s*"[0-9a-f]{16,64}"')


@dataclass
class Scrubber:
    """Masks personal data and redacts credentials in texts, counting the credentials by kind."""

    redactions: dict[str, int] = field(default_factory=dict)
    texts_changed: int = 0
    host_paths: int = 0  # texts in which a kernel environment's folder became KERNEL_ENV
    roots: list[str] = field(default_factory=kernel_env_roots)

    def __call__(self, text: str | None) -> str | None:
        from themisto.ingest.personal import mask_personal
        from themisto.ingest.secrets import redact_secrets

        if not text:
            return text
        local = text
        for root in self.roots:
            local = local.replace(root, KERNEL_ENV)
        if local != text:
            self.host_paths += 1
        clean, counts = redact_secrets(mask_personal(local))
        for kind, n in counts.items():
            self.redactions[kind] = self.redactions.get(kind, 0) + n
        if clean != local:
            self.texts_changed += 1
        return clean

    def holds(self, format_name: str, data: bytes) -> bool:
        """Whether a stored value holds personal data or a credential in its text: a JSON value's whole text, the
        strings of a frame (and its column names), of a text array, or of a model's JSON schema. Binary parts are not
        read as text (a Parquet footer's base64 schema would look like a secret to the scanner)."""
        from themisto.ingest.personal import mask_personal
        from themisto.ingest.secrets import redact_secrets

        for text in _value_texts(format_name, data):
            if mask_personal(text) != text or redact_secrets(text)[1]:
                return True
        return False

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


def _value_texts(format_name: str, data: bytes):
    """The texts a stored value holds, per format (`themisto.runtime.agent.formats`); everything readable where the
    format is unknown."""
    import io

    if format_name == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pq.read_table(io.BytesIO(data))
        yield "\n".join(table.column_names)
        for column in table.columns:
            if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
                yield "\n".join(str(v) for v in column.to_pylist() if v is not None)
    elif format_name in ("npy", "npz"):
        import numpy as np

        loaded = np.load(io.BytesIO(data), allow_pickle=False)
        arrays = [loaded] if format_name == "npy" else [loaded[name] for name in loaded.files]
        yield "\n".join(getattr(loaded, "files", []))
        for array in arrays:
            if array.dtype.kind in "US":
                yield "\n".join(str(v) for v in array.ravel().tolist())
    elif format_name == "skops":
        import zipfile

        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            for name in archive.namelist():
                if name.endswith(".json"):
                    yield archive.read(name).decode("utf-8", errors="replace")
    else:
        # A tagged JSON value refers to other values by their content hash, which is ours, not a secret.
        yield _OWN_HASH.sub('"hash":""', data.decode("utf-8", errors="replace"))
