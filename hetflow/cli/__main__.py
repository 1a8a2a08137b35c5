"""`python -m hetflow.cli ...`: the `hetflow` command."""

import sys

from hetflow.cli import main

sys.exit(main())
