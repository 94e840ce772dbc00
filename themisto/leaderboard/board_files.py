"""Write a board's files into BOARD/: leaderboard.md, .csv, .json, leaderboard.png and the Space in BOARD/space/.

Each file is written whole (temp file, then rename); scores cached in BOARD/cache/ are never touched here.
"""

from __future__ import annotations

from pathlib import Path

from themisto.leaderboard.board import Board
from themisto.leaderboard.plot import plot_png
from themisto.leaderboard.space import index_html, space_readme
from themisto.leaderboard.tables import build_tables, to_csv, to_json, to_markdown
from themisto.resume import write_text_atomic

SPACE_DIR = "space"
PLOT_FILE = "leaderboard.png"


def write_board(board: Board, out: str | Path) -> dict[str, Path]:
    """Render every file of the board; returns {name: path}."""
    out = Path(out)
    tables = build_tables(board)
    png = plot_png(tables) if tables else None
    files = {"leaderboard.md": to_markdown(board, tables), "leaderboard.csv": to_csv(tables),
             "leaderboard.json": to_json(board, tables), f"{SPACE_DIR}/index.html": index_html(board, tables, png),
             f"{SPACE_DIR}/README.md": space_readme(board)}
    if png is not None:
        files[PLOT_FILE] = png
    written = {}
    for name, content in files.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(out / name, content)
        written[name] = out / name
    return written
