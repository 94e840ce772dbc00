"""The IPython history readers: a planted `history.sqlite` and planted `%logstart` logs read back exactly;
credentials and personal data never come back out of them; damaged, hostile and oversized files each refused in one
line naming the file, while a good one beside them is read. Every file here is written by the test (sqlite3 into
tmp_path); none comes from the corpus."""

from __future__ import annotations

import random
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from themisto.ingest.ipython_history import (HistoryInput, HistoryRefused, HistorySession, read_history,
                                             read_history_database)
from themisto.ingest.ipython_log import read_logstart, read_logstart_log
from themisto.ingest.limits import HISTORY_DATABASE, IPYTHON_LOG
from themisto.ingest.secrets import redact_secrets

# IPython's own schema (IPython/core/history.py, since 0.11), written out by hand.
SCHEMA = """
CREATE TABLE sessions (session integer primary key autoincrement, start timestamp, end timestamp,
                       num_cmds integer, remark text);
CREATE TABLE history (session integer, line integer, source text, source_raw text, PRIMARY KEY (session, line));
CREATE TABLE output_history (session integer, line integer, output text, PRIMARY KEY (session, line));
"""


def plant(path: Path, sessions: list[tuple], *, schema: str = SCHEMA, extra: str = "") -> Path:
    """A history database: each session (start, end, remark, [(line, source, source_raw, output), ...])."""
    db = sqlite3.connect(path)
    db.executescript("PRAGMA synchronous=OFF; PRAGMA journal_mode=MEMORY;" + schema)  # no fsync: a test's file
    for number, (start, end, remark, rows) in enumerate(sessions, 1):
        db.execute("INSERT INTO sessions VALUES (?, ?, ?, ?, ?)", (number, start, end, len(rows), remark))
        for line, source, raw, output in rows:
            db.execute("INSERT INTO history VALUES (?, ?, ?, ?)", (number, line, source, raw))
            if output is not None:
                db.execute("INSERT INTO output_history VALUES (?, ?, ?)", (number, line, output))
    if extra:
        db.executescript(extra)
    db.commit()
    db.close()
    return path


GOOD = [
    ("2019-03-04 10:11:12.123456", "2019-03-04 11:00:00", None, [
        (1, "import pandas as pd", "import pandas as pd", None),
        (2, "for i in range(3):\n    print(i)", "for i in range(3):\n    print(i)", None),
        (3, "get_ipython().run_line_magic('matplotlib', 'inline')", "%matplotlib inline", None),
        (4, "x = 1", None, None),  # source_raw NULL: source is what is left
        (5, "\n", "   \n", None),  # blank: dropped
        (6, "x + 1", "x + 1", "2"),
    ]),
    ("2019-03-05 09:00:00.5", None, "a remark", [
        (1, "get_ipython().system('ls data')", "!ls data", None),
        (2, "df = pd.DataFrame({'a': [1]})\ndf.head()", "df = pd.DataFrame({'a': [1]})\ndf.head()", "   a\n0  1"),
    ]),
    ("2019-03-06 09:00:00", "2019-03-06 09:01:00", None, [(1, "", "", None)]),  # no input left: not returned
]


def test_a_planted_database_is_read_back_exactly(tmp_path):
    sessions = read_history_database(plant(tmp_path / "history.sqlite", GOOD))
    assert sessions == [
        HistorySession(session=1, start="2019-03-04T10:11:12.123456Z", end="2019-03-04T11:00:00Z", inputs=(
            HistoryInput(1, "import pandas as pd", None, None),
            HistoryInput(2, "for i in range(3):\n    print(i)", None, None),
            HistoryInput(3, "%matplotlib inline", None, None),
            HistoryInput(4, "x = 1", None, None),
            HistoryInput(6, "x + 1", None, "2"),
        )),
        HistorySession(session=2, start="2019-03-05T09:00:00.500000Z", end=None, remark="a remark", inputs=(
            HistoryInput(1, "!ls data", None, None),
            HistoryInput(2, "df = pd.DataFrame({'a': [1]})\ndf.head()", None, "   a\n0  1"),
        )),
    ]


def test_a_database_without_output_history_and_an_odd_name_is_read(tmp_path):
    schema = SCHEMA.replace("CREATE TABLE output_history", "CREATE TABLE unrelated")
    path = plant(tmp_path / "odd #name? 100%.sqlite", [GOOD[0][:3] + ([r[:3] + (None,) for r in GOOD[0][3]],)],
                 schema=schema)
    (session,) = read_history_database(path)
    assert [i.code for i in session.inputs][:2] == ["import pandas as pd", "for i in range(3):\n    print(i)"]
    assert all(i.output is None for i in session.inputs)


# ---------------------------------------------------------------------------------------------------------------
# No credential, no person


def _planted_secrets() -> dict[str, str]:
    """Credentials of many kinds, made up here in their vendors' formats (assembled from pieces, so this file
    holds none whole)."""
    return {
        "aws_key_id": "AKIA" + "QX7TZ4MVNB2KRW5E",
        "aws_secret": "wJalrXUtnFEMI/K7MDENG/" + "bPxRfiCYq9Zx2Lk4NmT",
        "github": "ghp_" + "Xk29fLmQ7vR3tB8nW1pZ5cY0hJ6gD4sA2eU9",
        "gitlab": "glpat-" + "Zq8Wm2Rk5Tn9Yp3Vx6Bc",
        "slack_token": "xoxb-" + "2048-4096-" + "k3J9sLq2Wm8Zr5Tn",
        "slack_webhook": "https://hooks.slack.com/services/" + "T0AB12CDE/B0FG34HIJ/" + "Qw3Er5Ty7Ui9Op1As3Df5Gh7",
        "stripe": "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc",
        "openai": "sk-" + "Ab12Cd34Ef56Gh78Ij90" + "T3BlbkFJ" + "Kl12Mn34Op56Qr78St90",
        "password": "Tr0ub4dor&3-horse",
        "jwt": "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9." + "eyJzdWIiOiI0MiIsIm5hbWUiOiJYIn0." +
               "dBjftJeZ4CVPmB92K27uhbUJU1p1r_wW1gFWFOEjXk",
        "url_password": "Sup3rS3cretPw",
        "key_body": "MIIEowIBAAKCAQEAq7BFUAkGA1UEBhMCVVMxEzARBgNVBAgTCkNhbGlmb3JuaWEx",
        "hex_key": "3f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c",
    }


def _planted_people() -> dict[str, str]:
    return {"linux_user": "qzuserlin", "mac_user": "qzusermac", "windows_user": "qzuserwin",
            "email": "qz.someone@example.org", "ip": "192.168.17.42"}


def test_credentials_and_personal_data_never_come_back(tmp_path):
    s, p = _planted_secrets(), _planted_people()
    key_block = (f"-----BEGIN RSA PRIVATE KEY-----\n{s['key_body']}\n{s['key_body'][::-1]}\n"
                 "-----END RSA PRIVATE KEY-----")
    codes = [
        f"import boto3\ns3 = boto3.client('s3', aws_access_key_id='{s['aws_key_id']}',\n"
        f"                  aws_secret_access_key='{s['aws_secret']}')",
        f"from github import Github\ng = Github('{s['github']}')\nlab = '{s['gitlab']}'",
        f"requests.post('{s['slack_webhook']}', json={{'text': 'done'}})\n"
        f"slack = WebClient(token='{s['slack_token']}')",
        f"stripe.api_key = '{s['stripe']}'\nopenai.api_key = \"{s['openai']}\"",
        f"conn = psycopg2.connect(host='db', password='{s['password']}')",
        f"headers = {{'Authorization': 'Bearer {s['jwt']}'}}",
        f"engine = create_engine('postgresql://analyst:{s['url_password']}@{p['ip']}:5432/sales')",
        f'key = """{key_block}"""',
        f"weather = requests.get(url, params={{'appid': '{s['hex_key']}'}})",
        f"df = pd.read_csv('/home/{p['linux_user']}/data/x.csv')\n"
        f"df2 = pd.read_csv(\"/Users/{p['mac_user']}/Downloads/y.csv\")\n"
        f"df3 = pd.read_csv(r'C:\\Users\\{p['windows_user']}\\Desktop\\z.csv')",
        f"send_report(to='{p['email']}')  # ask {p['email']}\nold = base  #/home/{p['linux_user']}/old",
        "password = '<redacted:password_literal>'",  # the corpus's own marker: kept as it is
    ]
    outputs = {2: f"<Github token={s['github']}>", 10: f"FileNotFoundError: '/home/{p['linux_user']}/data/x.csv'"}
    rows = [(i, c, c, outputs.get(i)) for i, c in enumerate(codes, 1)]
    path = plant(tmp_path / "history.sqlite", [("2020-01-01 00:00:00", None, f"mail {p['email']}", rows)])
    read = read_history(path)
    everything = repr(read.sessions)
    leaked = sorted(name for name, value in {**s, **p}.items() if value in everything)
    assert leaked == [], f"planted values came back: {leaked}"
    codes_read = [i.code for i in read.sessions[0].inputs]
    assert codes_read[-1] == "password = '<redacted:password_literal>'"
    assert "pd.read_csv('/home/<user>/data/x.csv')" in codes_read[9] and "<email>" in codes_read[10]
    assert "postgresql://<redacted:credential_url>@<ip>:5432/sales" in codes_read[6]
    assert codes_read[7] == 'key = """<redacted:private_key>"""'
    for kind in ("aws_access_key", "github_token", "gitlab_token", "slack_webhook", "slack_token", "stripe_key",
                 "openai_key", "secret_literal", "jwt", "credential_url", "private_key", "high_entropy_hex"):
        assert read.redactions.get(kind, 0) >= 1, kind


def test_redaction_leaves_ordinary_code_alone_and_is_idempotent():
    ordinary = ("df = pd.read_csv('data/train.csv', index_col=0)\ncolors = ['#1f77b4', '#ff7f0e']\n"
                "run_id = '123e4567-e89b-12d3-a456-426614174000'\napi_key = os.environ['API_KEY']\n"
                "plt.savefig('/tmp/figures/histogram_of_ages.png')\nfor password in passwords:\n    check(password)")
    assert redact_secrets(ordinary) == (ordinary, {})
    text, counts = redact_secrets(f"token = '{_planted_secrets()['github']}'\nprint(token)")
    assert counts == {"github_token": 1} and redact_secrets(text) == (text, {})


# ---------------------------------------------------------------------------------------------------------------
# Refused, each in one line, each costing only itself


def _raw(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _truncated(path: Path) -> Path:
    rows = [(i, f"x_{i} = {i} * 2  # " + "pad " * 40, None, None) for i in range(1, 600)]
    plant(path, [("2020-01-01 00:00:00", None, None, rows)])
    data = path.read_bytes()
    return _raw(path, data[: len(data) // 2])


def _many_rows(path: Path) -> Path:
    extra = ("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 1000000) "
             "INSERT INTO history SELECT 1, x, 'x', 'x' FROM c;")
    return plant(path, [("2020-01-01 00:00:00", None, None, [])], extra=extra)


_HISTORY_ALIKE = ("CREATE TABLE sessions (session integer, start timestamp, end timestamp, num_cmds integer, "
                  "remark text);")
HOSTILE = {
    "random-bytes.sqlite": (lambda p: _raw(p, random.Random(0).randbytes(8192)), "not an SQLite database"),
    "empty.sqlite": (lambda p: _raw(p, b""), "not an SQLite database"),
    "encrypted.sqlite": (lambda p: _raw(p, random.Random(1).randbytes(4096 * 4)), "or encrypted"),
    # SQLCipher can leave the header in plain text (cipher_plaintext_header_size): the pages behind it are noise.
    "encrypted-pages.sqlite": (lambda p: _raw(p, b"SQLite format 3\x00" + random.Random(3).randbytes(16368)),
                               "unreadable as SQLite (file is not a database)"),
    "truncated.sqlite": (_truncated, "corrupt"),
    "other-tables.sqlite": (lambda p: plant(p, [], schema="CREATE TABLE songs (title text, artist text);"
                                                          "CREATE TABLE sessions (session integer);"),
                            "not an IPython history database (table sessions has no column start)"),
    "no-history.sqlite": (lambda p: plant(p, [], schema=_HISTORY_ALIKE), "(no table history)"),
    "history-view.sqlite": (lambda p: plant(p, [], schema=_HISTORY_ALIKE + "CREATE TABLE h (a, b, c, d);"
                                            "CREATE VIEW history (session, line, source, source_raw) AS "
                                            "SELECT * FROM h;"), "holds a view"),
    "trigger.sqlite": (lambda p: plant(p, GOOD, extra="CREATE TRIGGER t AFTER INSERT ON history BEGIN "
                                                      "DELETE FROM sessions; END;"), "holds a trigger"),
    "virtual.sqlite": (lambda p: plant(p, [], schema=_HISTORY_ALIKE + "CREATE VIRTUAL TABLE history USING "
                                                                      "fts5(session, line, source, source_raw);"),
                       "not a plain table"),
    "generated.sqlite": (lambda p: plant(p, [], schema=_HISTORY_ALIKE + "CREATE TABLE history (session integer, "
                                         "line integer, source text, source_raw text GENERATED ALWAYS AS "
                                         "(printf('%.*c', 100000000, 'x')) VIRTUAL);"), "generated"),
    "huge-row.sqlite": (lambda p: plant(p, [("2020-01-01", None, None, [(1, "x", "y" * (2 << 20), None)])]),
                        "(bound: text_bytes)"),
    "million-rows.sqlite": (_many_rows, "1,000,000 rows in history, more than 500,000 (bound: rows)"),
    "text-session.sqlite": (lambda p: plant(p, [], extra="INSERT INTO history VALUES ('one', 1, 'x', 'x');"),
                            "an input's session is not an integer"),
    "not-utf8.sqlite": (lambda p: plant(p, [], extra="INSERT INTO sessions VALUES (1, NULL, NULL, 1, NULL); INSERT "
                                                     "INTO history VALUES (1, 1, 'x', CAST(X'FFFE41' AS TEXT));"),
                        "session 1 line 1 is not UTF-8 text"),
    "many-tables.sqlite": (lambda p: plant(p, GOOD, extra="".join(f"CREATE TABLE t{i} (a);" for i in range(70))),
                           "schema entries"),
}


def test_damaged_and_hostile_databases_are_refused_in_one_line_and_the_good_one_is_read(tmp_path):
    good = plant(tmp_path / "good.sqlite", GOOD)
    expected = {}
    for name, (make, reason) in HOSTILE.items():
        expected[make(tmp_path / name)] = reason
    (tmp_path / "a-folder.sqlite").mkdir()
    expected[tmp_path / "a-folder.sqlite"] = "not a regular file"
    read, refused = {}, {}
    for path in sorted(tmp_path.iterdir()):
        try:
            read[path] = read_history_database(path)
        except HistoryRefused as exc:
            refused[path] = str(exc)
    assert list(read) == [good] and len(read[good]) == 2
    assert set(refused) == set(expected)
    for path, message in refused.items():
        assert "\n" not in message and message.startswith(f"{path}: "), message
        assert expected[path] in message, message


def test_the_size_session_and_time_bounds_refuse(tmp_path):
    good = plant(tmp_path / "good.sqlite", GOOD)
    with pytest.raises(HistoryRefused, match=r"more than 1,000 \(bound: file_bytes\)"):
        read_history(good, replace(HISTORY_DATABASE, file_bytes=1000))
    with pytest.raises(HistoryRefused, match=r"3 rows in sessions, more than 2 \(bound: sessions\)"):
        read_history(good, replace(HISTORY_DATABASE, sessions=2))
    rows = [(i, f"x = {i}", None, None) for i in range(1, 3000)]
    slow = plant(tmp_path / "slow.sqlite", [("2020-01-01", None, None, rows)])
    # A deadline already past: the progress handler stops the first query long enough to reach it.
    with pytest.raises(HistoryRefused, match=r"took more than 0 s to read \(bound: seconds\)"):
        read_history(slow, replace(HISTORY_DATABASE, seconds=0))
    assert len(read_history(slow).sessions[0].inputs) == 2999


# ---------------------------------------------------------------------------------------------------------------
# %logstart logs


def test_a_log_with_timestamps_and_outputs_is_read_back_exactly(tmp_path):
    log = tmp_path / "ipython_log.py"
    log.write_text(
        "# IPython log file\n\n"
        "# Mon, 01 Jan 2024 10:00:00\nimport numpy as np\n"
        "# Mon, 01 Jan 2024 10:00:05\nfor i in range(2):\n    print(i)\n"
        "# Mon, 01 Jan 2024 10:00:09\nnp.arange(3)\n#[Out]# array([0, 1, 2])\n"
        "# Mon, 01 Jan 2024 10:00:12\nget_ipython().run_line_magic('matplotlib', 'inline')\n"
        # A notebook's input has no final newline: the next timestamp and the output are glued to it.
        "# Mon, 01 Jan 2024 10:01:00\nd = {'a': 1,\n     'b': 2}# Mon, 01 Jan 2024 10:01:30\nd#[Out]# {'a': 1,\n"
        "#[Out]#  'b': 2}\n", encoding="utf-8")
    assert read_logstart_log(log) == [HistorySession(
        session=1, start="2024-01-01T10:00:00Z", end="2024-01-01T10:01:30Z", inputs=(
            HistoryInput(1, "import numpy as np", "2024-01-01T10:00:00Z", None),
            HistoryInput(2, "for i in range(2):\n    print(i)", "2024-01-01T10:00:05Z", None),
            HistoryInput(3, "np.arange(3)", "2024-01-01T10:00:09Z", "array([0, 1, 2])"),
            HistoryInput(4, "get_ipython().run_line_magic('matplotlib', 'inline')", "2024-01-01T10:00:12Z", None),
            HistoryInput(5, "d = {'a': 1,\n     'b': 2}", "2024-01-01T10:01:00Z", None),
            HistoryInput(6, "d", "2024-01-01T10:01:30Z", "{'a': 1,\n 'b': 2}"),
        ))]


def test_a_log_without_timestamps_is_split_into_statements(tmp_path):
    log = tmp_path / "ipython_log.py"
    log.write_text(
        "# IPython log file\n\n"
        "import os\n# a comment on what follows\n@decorate\ndef f(x):\n    return x\n\na = 1; b = 2\n"
        "get_ipython().run_line_magic('logstart', '')\n"  # the end of the history %logstart wrote: same session
        "%matplotlib inline\nx = f(a)\nx\n#[Out]# 1\n"
        "%%bash\necho hi\nls\n", encoding="utf-8")
    (session,) = read_logstart_log(log)
    assert [(i.code, i.output) for i in session.inputs] == [
        ("import os", None), ("# a comment on what follows\n@decorate\ndef f(x):\n    return x", None),
        ("a = 1; b = 2", None), ("%matplotlib inline", None), ("x = f(a)", None), ("x", "1"),
        ("%%bash\necho hi\nls", None)]
    assert [i.line for i in session.inputs] == list(range(1, 8)) and session.start is None


def test_a_python_2_log_is_split_at_column_0(tmp_path):
    log = tmp_path / "ipython_log.py"
    log.write_text("# IPython log file\n\nprint 'a'\nfor i in x:\n    print i\nelse:\n    pass\n"
                   "f(1,\n2)\n", encoding="utf-8")
    (session,) = read_logstart_log(log)
    assert [i.code for i in session.inputs] == [
        "print 'a'", "for i in x:\n    print i\nelse:\n    pass", "f(1,\n2)"]


def test_an_appended_log_holds_a_session_per_kernel_and_skips_the_history_dumped_again(tmp_path):
    start = "%logstop\n%logstart -rtq ~/.logs/w.py append\nimport seaborn as sns\nsns.set()"
    log = tmp_path / "w.py"
    log.write_text(
        # Kernel 1: its first cell started logging, so only the history %logstart wrote shows it.
        f"{start}\n# Wed, 17 Nov 2021 05:21:15\nx = 1# Wed, 17 Nov 2021 05:21:16\n"
        # The same kernel runs that cell again: logged as typed, then the whole history again (skipped).
        f"{start}{start}\nx = 1\n{start}\n# Wed, 17 Nov 2021 05:21:20\ny = x + 1"
        # Kernel 2: its history so far glued to kernel 1's last input.
        f"{start}\n# Thu, 18 Nov 2021 09:00:00\nz = 3\n", encoding="utf-8")
    first, second = read_logstart_log(log)
    assert [(i.code, i.time) for i in first.inputs] == [
        ("import seaborn as sns", None), ("sns.set()", None), ("x = 1", "2021-11-17T05:21:15Z"),
        (start, "2021-11-17T05:21:16Z"), ("y = x + 1", "2021-11-17T05:21:20Z")]
    assert (first.session, first.start, first.end) == (1, "2021-11-17T05:21:15Z", "2021-11-17T05:21:20Z")
    assert [(i.code, i.time) for i in second.inputs] == [
        ("import seaborn as sns", None), ("sns.set()", None), ("z = 3", "2021-11-18T09:00:00Z")]
    assert second.session == 2


def test_logs_are_scrubbed(tmp_path):
    s, p = _planted_secrets(), _planted_people()
    log = tmp_path / "ipython_log.py"
    log.write_text(f"# IPython log file\n\ntoken = '{s['github']}'\nopen('/home/{p['linux_user']}/x')\n"
                   f"token\n#[Out]# '{s['github']}'\n", encoding="utf-8")
    read = read_logstart(log)
    assert s["github"] not in repr(read.sessions) and p["linux_user"] not in repr(read.sessions)
    assert read.redactions == {"github_token": 2}


def test_binary_and_oversized_logs_are_refused_and_the_good_one_is_read(tmp_path):
    good = tmp_path / "good.py"
    good.write_text("# IPython log file\n\nx = 1\n", encoding="utf-8")
    garbage = _raw(tmp_path / "garbage.py", random.Random(2).randbytes(4096))
    nuls = _raw(tmp_path / "nuls.py", b"# IPython log file\n\nx = 1\n\x00\x00\x00\n")
    for path, reason in ((garbage, "not UTF-8"), (nuls, "binary, not a log (control character U+0000)")):
        with pytest.raises(HistoryRefused) as refused:
            read_logstart_log(path)
        message = str(refused.value)
        assert "\n" not in message and message.startswith(f"{path}:") and reason in message, message
    assert str(pytest.raises(HistoryRefused, read_logstart, nuls).value).startswith(f"{nuls}:4: ")
    with pytest.raises(HistoryRefused, match=r"good.py:1: longer than 16 bytes \(bound: line_bytes\)"):
        read_logstart(good, replace(IPYTHON_LOG, line_bytes=16))
    with pytest.raises(HistoryRefused, match=r"\(bound: lines\)"):
        read_logstart(good, replace(IPYTHON_LOG, lines=2))
    assert [i.code for i in read_logstart_log(good)[0].inputs] == ["x = 1"]
