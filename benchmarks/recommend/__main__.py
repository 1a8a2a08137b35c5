"""`python -m benchmarks.recommend`: what `hetflow bench recommend` runs, with the same flags."""

import sys

from benchmarks.recommend import main

sys.exit(main(sys.argv[1:]))
