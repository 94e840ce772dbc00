"""Model runs: takes a release (next_cell / output_prediction rows) and a model behind a backend (transformers,
an OpenAI-compatible endpoint, vLLM, or a model-free baseline); gives a run folder of generations (JSONL, one
line per example, context mode and sample) and its run.json, rendered with and without runtime context."""
