"""`python -m quorumgate ...` is the `quorumgate` command."""

import sys

from quorumgate.cli import main

sys.exit(main())
