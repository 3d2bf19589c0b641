"""`python -m bridge` runs the demo in `bridge._src.demo`."""

import sys

from bridge._src.demo import main

sys.exit(main())
