import sys

from zcorch.cli import main

sys.exit(main())
