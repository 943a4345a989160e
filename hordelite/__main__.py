import sys

from hordelite.cli import main

sys.exit(main())
