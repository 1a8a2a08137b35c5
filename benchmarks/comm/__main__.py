"""`python -m benchmarks.comm`: what `hetflow bench comm` runs, with the same flags."""

import sys

from benchmarks.comm import main

sys.exit(main(sys.argv[1:]))
