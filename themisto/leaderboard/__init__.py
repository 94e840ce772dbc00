"""Leaderboard: takes submissions (run folders of predictions, never scores) and a release; gives validated,
re-scored entries, the board files (Markdown, CSV, JSON, a PNG plot), a static Hugging Face Space, and Hub pull
requests for submissions and for a model's `.eval_results/themisto.yaml`."""
