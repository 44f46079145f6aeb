import sys

from snapops.cli import main

sys.exit(main())
