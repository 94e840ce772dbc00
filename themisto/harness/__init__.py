"""Themisto in Inspect (inspect_ai): the harness its users already run.

Takes a release (a folder, or a Hub dataset id) and gives Inspect tasks, `themisto/next_cell` and
`themisto/output_prediction`, registered by the package's `inspect_ai` entry point: each sample the exact prompt
`themisto generate` renders, Themisto's scorer (text scores; with `execute`, execution in the exact pre-cell state
through the scorer's one door), the probe mode as an Inspect tool, and Inspect's logs read back as run folders so
`themisto score LOG.eval` re-scores them as every submission is. It sits above generation and scoring, uses their
public doors, and nothing else imports it; inspect_ai is imported only here, inside the functions that use it.
"""
