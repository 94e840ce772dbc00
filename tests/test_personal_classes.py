"""Personal data, class by class (StarPII's classes and host names): each planted datum is masked or redacted in an
input as a reader takes it (an IPython history database read by the project's reader), in the texts of a replayed
step (its output, error and variables, as the build's scrub makes them) and in a stored value (left out of `values`:
a JSON value, a frame, a text array). Every datum is planted by hand; none is anyone's."""

from __future__ import annotations

import io
import json
import sqlite3

import numpy as np
import pandas as pd
import pytest

from themisto.ingest.ipython_history import read_history
from themisto.release.scrub import Scrubber

# class -> (a line a developer could have typed or printed, the datum that must not survive it)
CLASSES = {
    "names_in_paths": ("df = pd.read_csv('/home/plantedjane/projects/sales.csv')", "plantedjane"),
    "email_addresses": ("owner = 'jane.plantedmail@university.edu'", "jane.plantedmail@university.edu"),
    "keys": ("aws_key = 'AKIAZQ3PLANTEDKEY777'", "AKIAZQ3PLANTEDKEY777"),
    "passwords": ("password = 'Planted-Hunter2-Secret!'", "Planted-Hunter2-Secret!"),
    "ip_addresses": ("server = '192.168.17.23'", "192.168.17.23"),
    "user_names": ("!scp plantedjdoe@plantedbox:~/runs/log.txt .", "plantedjdoe"),
    "host_names": ("r = requests.get('http://plantedlabserver:8888/api/runs')", "plantedlabserver"),
}


def _history_with(tmp_path, code: str):
    path = tmp_path / "history.sqlite"
    con = sqlite3.connect(path)
    con.executescript("CREATE TABLE sessions (session integer primary key autoincrement, start timestamp, "
                      "end timestamp, num_cmds integer, remark text);"
                      "CREATE TABLE history (session integer, line integer, source text, source_raw text, "
                      "PRIMARY KEY (session, line));")
    con.execute("INSERT INTO sessions VALUES (1, '2021-03-01 10:00:00', NULL, 2, '')")
    con.executemany("INSERT INTO history VALUES (1, ?, ?, ?)", [(1, "x = 1", "x = 1"), (2, code, code)])
    con.commit()
    con.close()
    return path


def _values(text: str) -> dict[str, bytes]:
    """The datum as the stored value of a dict (tagged JSON's text), a frame's column and a text array."""
    frame, array = io.BytesIO(), io.BytesIO()
    pd.DataFrame({"line": [text, "plain"]}).to_parquet(frame)
    np.save(array, np.array([text, "plain"]), allow_pickle=False)
    return {"json": json.dumps({"type": "dict", "value": {"note": text}}).encode(), "parquet": frame.getvalue(),
            "npy": array.getvalue()}


@pytest.mark.parametrize("kind", sorted(CLASSES))
def test_each_class_of_personal_data_leaves_no_input_output_or_value(kind, tmp_path):
    line, datum = CLASSES[kind]
    # Input: the reader takes the session with the datum masked or redacted.
    (session,) = read_history(_history_with(tmp_path, line)).sessions
    assert datum not in session.inputs[1].code and session.inputs[1].code != line
    # Output: what the replay printed, raised and held, scrubbed by the build.
    row = {"kernel_id": "k", "step": 0, "code": line, "replayed_code": line, "notebook": "n.ipynb",
           "evalue": f"cannot reach {line}", "output": f"Out: {line}\n", "logged_evalue": None,
           "variables": [{"name": "v", "type": "str", "repr": repr(line), "repr_error": None, "columns": [line]}],
           "snapshot_failures": [{"name": "w", "reason": line}], "stored_values": None}
    scrubber = Scrubber(roots=[])
    text = json.dumps(scrubber.row(row))
    assert datum not in text
    # Values: a stored value holding the datum is found, so the build leaves it out of `values`.
    holding = {name: scrubber.holds(name, data) for name, data in _values(line).items()}
    if kind == "passwords":
        # A password is known by the word before it: a frame's or array's cell holds the value alone.
        assert holding["json"]
    else:
        assert holding == {"json": True, "parquet": True, "npy": True}
    assert not any(scrubber.holds(name, data) for name, data in _values("plain text, no one's").items())
