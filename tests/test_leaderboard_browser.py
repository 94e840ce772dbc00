"""The leaderboard Space in a real browser: BOARD/space served on 127.0.0.1 and opened in headless Chromium (Debian's
`chromium` driven by Playwright). Every model row renders with its scores, a header click reorders the rows, a hostile
model name stays text, and the page logs no console error. The test saves a screenshot beside its files."""

import functools
import http.server
import json
import shutil
import threading

import pytest

from _leaderboard import HOSTILE_MODEL, board_submissions
from themisto.leaderboard.board import build_board
from themisto.leaderboard.board_files import write_board
from themisto.release.folder import open_release
from themisto.leaderboard.tables import fmt


@pytest.fixture(scope="module")
def space(tmp_path_factory, small_release):
    root = tmp_path_factory.mktemp("browser")
    board_submissions(root / "submissions", small_release)
    board = build_board([root / "submissions"], open_release(small_release))
    write_board(board, root / "board")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root / "board" / "space"))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/", json.loads((root / "board" / "leaderboard.json")
                                                                       .read_text()), root
    server.shutdown()
    server.server_close()


def _models(table):
    return table.locator("tbody tr td:nth-child(2)").all_inner_texts()


def test_the_space_renders_sorts_and_logs_no_error(space):
    from playwright.sync_api import sync_playwright

    url, data, root = space
    chromium = shutil.which("chromium")
    assert chromium, "the Debian package `chromium` is needed (scripts/install.sh installs it)"
    errors, dialogs = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        page.goto(url, wait_until="load")
        assert page.locator("#release-hash").inner_text() == data["release"]["content_hash"]
        assert page.locator("img.plot").evaluate("img => img.complete && img.naturalWidth > 0")
        for expected in data["tables"]:
            table = page.locator(f'table[data-task="{expected["task"]}"][data-context="{expected["context"]}"]')
            assert _models(table) == [r["model"] for r in expected["rows"]]  # the hostile name reads as text
            for number, row in enumerate(expected["rows"], start=1):
                cells = table.locator(f"tbody tr:nth-child({number}) td").all_inner_texts()
                shown = [fmt(row["values"].get(c)) for c in expected["columns"]]
                assert [c.replace("\n", " ") for c in cells[3:3 + len(shown)]] == shown
        table = page.locator('table[data-task="next_cell"][data-context="variables"]')
        before = _models(table)
        table.locator("thead th", has_text="model").click()
        ascending = _models(table)
        assert ascending == sorted(before)
        assert ascending != before
        table.locator("thead th", has_text="model").click()
        assert _models(table) == ascending[::-1]
        table.locator("thead th", has_text="rouge_l (hard)").click()
        column = 4 + [t for t in data["tables"] if (t["task"], t["context"]) == ("next_cell", "variables")][0][
            "columns"].index("rouge_l/hard")
        values = [float(v) for v in table.locator(f"tbody tr td:nth-child({column})").evaluate_all(
            "cells => cells.map(c => c.dataset.v)")]
        assert values == sorted(values, reverse=True)
        page.screenshot(path=str(root / "leaderboard-page.png"), full_page=True)
        browser.close()
    assert HOSTILE_MODEL in before and dialogs == []
    assert errors == []
    assert (root / "leaderboard-page.png").stat().st_size > 10_000
