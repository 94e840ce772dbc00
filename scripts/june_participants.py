"""The JuNE logs' participants mapping the release scripts give `themisto build --participants`:

    python scripts/june_participants.py JUNE_DIR OUT.json

The two logs beside `participants/` are student_7's (the MANIFEST); the logs under `participants/<name>/` are named
by their folder, so they need no entry.
"""

import json
import pathlib
import sys

logs = sorted(pathlib.Path(sys.argv[1]).glob("*.log"))
pathlib.Path(sys.argv[2]).write_text(json.dumps({p.stem: "student_7" for p in logs}), encoding="utf-8")
