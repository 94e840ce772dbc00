"""Training data from a release: takes a release folder's `train` (or any) split and gives supervised fine-tuning
examples in TRL's conversational prompt/completion format, rendered by the evaluation prompts, with only the targets
the replay reproduced, and a manifest of what was kept, dropped and why."""
