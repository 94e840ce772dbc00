"""Release: replayed steps in, a Hugging Face dataset release out.

`tasks` turns steps into task rows under the paper's sampling rules; `paper_rows` maps the paper's own release rows
into ours; `parquet` writes the Parquet release with its card, checks it and pushes it to the Hub.
"""
