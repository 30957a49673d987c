import sys

from compbench.cli import main

sys.exit(main())
