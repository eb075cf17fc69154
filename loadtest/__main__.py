"""python -m loadtest: see loadtest/run.py."""

import sys

from loadtest.run import main

sys.exit(main())
