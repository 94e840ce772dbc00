"""Stand-in written by Themisto for replay: the JuNE logging extension's `check_logging` helper.

The real helper posted to the organisers' collection server and printed one short line (a 23-byte
`stream` output as the log measures it). This one prints the same line and makes no network call.
"""


def check_logging(url):
    """Print the line the real helper printed on success; `url` is accepted and ignored (no network)."""
    print("Request successful!")
