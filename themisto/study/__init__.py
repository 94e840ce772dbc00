"""The runtime-augmented fine-tuning study: does runtime context help a model that can write the cells?

Takes a release and a base model; gives, per context mode and seed, a model fine-tuned on the train split's rows
(the same rows, steps and completions for every mode: only the prompt differs), its generations on the test split in
its own mode and in `none`, and their scores beside the base model and the baselines, with paired effects whose
bootstrap resamples trajectories (or participants) and seeds. It composes `themisto.training` (export,
fine-tuning), `themisto.generation` and `themisto.scoring` through their public functions; nothing below imports it.

`settings` (what a study is, its presets), `rows` (the rows every mode trains on), `effects` (seed-aware intervals),
`report` (results.json, results.md, the plot) and `run` (the folder, its units, resume).
"""
