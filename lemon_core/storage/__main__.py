import sys

from lemon_core.storage.cli import main

sys.exit(main())
