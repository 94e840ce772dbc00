"""Release: replayed steps in, a Hugging Face dataset release out.

`tasks` turns steps into task rows under the paper's sampling rules; `paper_rows` maps the paper's own release rows
into ours; `parquet` writes the Parquet release, `card` its README card, `check` checks it, `push` uploads it to
the Hub, and `eval_yaml` declares its tasks the Hub's way. `folder` owns the folder they write: every later stage
opens a release through `folder.open_release`.
"""
