"""`python -m benchmarks.hetero`: what `hetflow bench hetero` runs, with the same flags."""

import sys

from benchmarks.hetero import main

sys.exit(main(sys.argv[1:]))
