"""``python -m engine.bench``: the same as ``bexmatch bench``."""

import sys

from engine.bench.cli import main

sys.exit(main())
