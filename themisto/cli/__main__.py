"""`python -m themisto.cli`: the same door as the `themisto` command."""

import sys

from themisto.cli import main

sys.exit(main())
