"""`python -m quorumgate ...` is the `quorumgate` command."""

import sys

from quorumgate.ops.cli import main

sys.exit(main())
