"""`python -m nodeagent` is the `nodeagent` command."""

import sys

from nodeagent.cli import main

sys.exit(main())
